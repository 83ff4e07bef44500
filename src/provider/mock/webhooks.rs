//! The mock provider's webhooks: every event the ledger emits is signed (Standard Webhooks, see
//! [`crate::webhook_signature`]; on the Stripe wire, Stripe's event with `Stripe-Signature`) and POSTed to `MOCK_PROVIDER_WEBHOOK_URL`, retried with
//! exponential backoff until a 2xx answer or the last attempt, and logged with every attempt for
//! `GET /_admin/webhooks`.
//!
//! The webhook faults misbehave like real providers do: an event sent twice (same `webhook-id`),
//! never sent, or held back so that a later event overtakes it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::ledger::Emitted;
use super::{Faults, chance};
use crate::provider::stripe::WebhookSecret;
use crate::provider::wire::{EventBody, EventData, EventObject};
use crate::webhook_signature::{Secret, sign};

/// How events are written and signed: the mock's contract with Standard Webhooks headers, or
/// Stripe's events with `Stripe-Signature`.
pub(super) enum Signer {
    Standard(Secret),
    Stripe(WebhookSecret),
}

/// Attempts per delivery: the first and four retries (500 ms, 1 s, 2 s, 4 s at the default base).
pub const MAX_ATTEMPTS: u32 = 5;

/// The spec's advice is 15-30 s for a receiver to answer; a mock need not wait as long.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) struct Webhooks {
    url: String,
    signer: Signer,
    retry_base: Duration,
    /// Events are logged but not sent: a test delivers each itself
    /// (`POST /_admin/webhooks/{id}/deliver`).
    by_hand: bool,
    log: Mutex<Vec<EventRecord>>,
    queue: mpsc::UnboundedSender<Delivery>,
}

/// One event as `GET /_admin/webhooks` lists it.
#[derive(Debug, Clone, Serialize)]
struct EventRecord {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    object_id: String,
    /// The object as it was when the event happened (what every delivery carries), so that a
    /// test can tell which of two events about one object it holds.
    object: serde_json::Value,
    created_at: DateTime<Utc>,
    /// Deliveries planned: 2 under the duplicate fault, 0 when dropped.
    copies: u8,
    delay_ms: u64,
    attempts: Vec<Attempt>,
    delivered: bool,
    /// What every attempt sends (and signs).
    #[serde(skip)]
    body: Vec<u8>,
}

#[derive(Debug, Clone, Serialize)]
struct Attempt {
    at: DateTime<Utc>,
    /// The receiver's HTTP status; `None` when there was no answer.
    status: Option<u16>,
    error: Option<String>,
}

/// What the delivery task needs to send an event: the body is serialised once, so every attempt
/// and copy sends (and signs) the very same bytes.
pub(super) struct Delivery {
    index: usize,
    id: String,
    body: Vec<u8>,
    copies: u8,
    delay: Duration,
}

impl Webhooks {
    /// Webhooks to `url`, and the queue that [`Webhooks::run`] delivers from.
    pub fn new(
        url: String,
        signer: Signer,
        retry_base: Duration,
        by_hand: bool,
    ) -> (Arc<Webhooks>, mpsc::UnboundedReceiver<Delivery>) {
        let (queue, deliveries) = mpsc::unbounded_channel();
        let webhooks = Webhooks { url, signer, retry_base, by_hand, log: Mutex::new(Vec::new()), queue };
        (Arc::new(webhooks), deliveries)
    }

    fn log(&self) -> MutexGuard<'_, Vec<EventRecord>> {
        // Every update is one push or one field: a poisoned log is still consistent.
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Logs an event and queues its delivery, applying the webhook faults. Called with the
    /// ledger locked, so events are logged and queued in the order they happened.
    pub fn emit(&self, emitted: Emitted, faults: &Faults) {
        let id = format!("evt_{}", Uuid::now_v7().simple());
        let object_id = match &emitted.object {
            EventObject::Charge(charge) => charge.id.clone(),
            EventObject::Refund(refund) => refund.id.clone(),
            EventObject::Dispute(dispute) => dispute.id.clone(),
        };
        let now = Utc::now();
        let event = EventBody {
            id: id.clone(),
            kind: emitted.kind.to_owned(),
            created: now.timestamp(),
            data: EventData { object: emitted.object },
        };
        let object = serde_json::to_value(&event.data.object).unwrap_or_default();
        let sent = match &self.signer {
            Signer::Standard(_) => serde_json::to_vec(&event),
            Signer::Stripe(_) => serde_json::to_vec(&super::stripe::event(&event)),
        };
        let body = match sent {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(%error, "a webhook event could not be serialised");
                return;
            }
        };
        let copies = if self.by_hand || chance(faults.webhook_drop_rate) {
            0
        } else if chance(faults.webhook_duplicate_rate) {
            2
        } else {
            1
        };
        let mut log = self.log();
        let index = log.len();
        log.push(EventRecord {
            id: id.clone(),
            kind: emitted.kind,
            object_id,
            object,
            created_at: now,
            copies,
            delay_ms: faults.webhook_delay_ms,
            attempts: Vec::new(),
            delivered: false,
            body: body.clone(),
        });
        if copies > 0 {
            let delay = Duration::from_millis(faults.webhook_delay_ms);
            // Fails only once the delivery task is gone, i.e. the server is stopping.
            let _ = self.queue.send(Delivery { index, id, body, copies, delay });
        }
    }

    /// Sends event `id` once, now, and logs the attempt: the receiver's status, or `None` when
    /// there was no answer; `Err` when there is no such event.
    pub async fn deliver_now(&self, id: &str) -> Result<Option<u16>, &'static str> {
        let found = self.log().iter().position(|record| record.id == id);
        let Some(index) = found else {
            return Err("no such event");
        };
        let body = self.log()[index].body.clone();
        let client =
            reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).build().map_err(|_| "no HTTP client")?;
        self.attempt(&client, index, id, &body).await;
        Ok(self.log()[index].attempts.last().and_then(|attempt| attempt.status))
    }

    /// One signed POST of event `id` (at `index` in the log), logged; whether it was delivered.
    async fn attempt(&self, client: &reqwest::Client, index: usize, id: &str, body: &[u8]) -> bool {
        let at = Utc::now();
        // Each attempt is signed with its own timestamp, so a receiver's tolerance window
        // applies to the attempt, not to the event's age.
        let timestamp = at.timestamp();
        let post = client.post(&self.url).header("content-type", "application/json");
        let post = match &self.signer {
            Signer::Standard(secret) => post
                .header("webhook-id", id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", sign(secret, id, timestamp, body)),
            Signer::Stripe(secret) => post.header("stripe-signature", secret.header(timestamp, body)),
        };
        let sent = post.body(body.to_vec()).send().await;
        let (status, error) = match sent {
            Ok(response) => (Some(response.status().as_u16()), None),
            Err(error) => (None, Some(error.without_url().to_string())),
        };
        let delivered = status.is_some_and(|status| (200..300).contains(&status));
        let mut log = self.log();
        let record = &mut log[index];
        record.attempts.push(Attempt { at, status, error });
        record.delivered |= delivered;
        delivered
    }

    /// `GET /_admin/webhooks`
    pub fn list(&self) -> serde_json::Value {
        serde_json::json!({ "data": *self.log() })
    }

    /// Delivers queued events until aborted, each in a task of its own so that a slow receiver
    /// or a delayed event holds up no other. Aborting this task aborts every delivery.
    pub async fn run(self: Arc<Self>, mut deliveries: mpsc::UnboundedReceiver<Delivery>) {
        crate::provider::client::install_crypto_provider();
        let client = match reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).build() {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "no HTTP client for webhooks: none will be sent");
                return;
            }
        };
        let mut in_flight = JoinSet::new();
        loop {
            tokio::select! {
                delivery = deliveries.recv() => match delivery {
                    Some(delivery) => {
                        in_flight.spawn(self.clone().deliver(client.clone(), delivery));
                    }
                    None => break,
                },
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            }
        }
        while in_flight.join_next().await.is_some() {}
    }

    async fn deliver(self: Arc<Self>, client: reqwest::Client, delivery: Delivery) {
        if !delivery.delay.is_zero() {
            tokio::time::sleep(delivery.delay).await;
        }
        for _ in 0..delivery.copies {
            for attempt in 1..=MAX_ATTEMPTS {
                let delivered = self.attempt(&client, delivery.index, &delivery.id, &delivery.body).await;
                if delivered {
                    break;
                }
                if attempt < MAX_ATTEMPTS {
                    tokio::time::sleep(self.retry_base.saturating_mul(1 << (attempt - 1))).await;
                }
            }
        }
    }
}
