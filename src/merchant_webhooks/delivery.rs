//! The delivery worker, one in every instance: it leases due deliveries in batches (`FOR UPDATE
//! SKIP LOCKED`, so any number of instances share them with no leader), sends them at once and
//! concurrently (bounded), and writes each outcome under its lease.
//!
//! A send is `POST <endpoint url>` with the event exactly as `GET /events/{id}` renders it, signed
//! in the Standard Webhooks scheme (`webhook-id` is the event's id on every attempt and every
//! endpoint, so receivers deduplicate on it; while a rotated-out secret lasts the signature header
//! carries a signature with each secret, the new one first). One HTTP client for every send
//! (connections kept alive), no redirects followed, no proxy, and only public addresses unless
//! allowed ([`super::address`]).
//!
//! A 2xx within the timeout delivers; anything else fails the attempt, which is retried with
//! backoff until the last attempt fails it for good. Every attempt is recorded. A worker that
//! dies mid-send loses nothing: its lease runs out and the delivery is sent again (at least
//! once). A worker whose lease ran out while its send was slow writes nothing but its attempt:
//! the outcome belongs to whoever holds the delivery now.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use super::repository::{self, Attempt, Claimed, Outcome};
use super::{DeliveryConfig, WebhookSettings, address, secret_context};
use crate::background::Shutdown;
use crate::db::Pool;
use crate::encryption::EncryptionKey;
use crate::events::repository as events;
use crate::ids::{AccountId, EndpointId, EventId, LeaseId};
use crate::operations::leases::Lease;
use crate::webhook_signature::{self, Secret};

pub const USER_AGENT: &str = concat!("orderpay-webhooks/", env!("CARGO_PKG_VERSION"));

/// Error texts are kept this long in the attempts table.
const ERROR_CHARS: usize = 500;

/// The response body is read (and dropped) up to this much, so the connection can be reused.
const BODY_READ_LIMIT: usize = 64 << 10;

/// The delivery client: bounded by the timeout, no redirects, no proxy, and (unless private
/// addresses are allowed) connecting to public addresses only.
pub fn client(settings: &WebhookSettings) -> reqwest::Result<reqwest::Client> {
    crate::provider::client::install_crypto_provider();
    let builder = reqwest::Client::builder()
        .timeout(settings.delivery.timeout)
        .connect_timeout(settings.delivery.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(USER_AGENT)
        .pool_idle_timeout(std::time::Duration::from_secs(60));
    if settings.allow_private { builder.build() } else { builder.dns_resolver(address::PublicOnly).build() }
}

pub struct Worker {
    pool: Pool,
    config: DeliveryConfig,
    key: EncryptionKey,
    allow_private: bool,
    http: reqwest::Client,
    /// Rung by the relay once it committed new deliveries.
    wake: Arc<Notify>,
}

impl Worker {
    pub fn new(pool: Pool, settings: &WebhookSettings, wake: Arc<Notify>) -> anyhow::Result<Worker> {
        Ok(Worker {
            pool,
            config: settings.delivery,
            key: settings.encryption_key.clone(),
            allow_private: settings.allow_private,
            http: client(settings)?,
            wake,
        })
    }
}

/// One delivery ready to go, or why it cannot.
struct Send {
    account_id: AccountId,
    delivery: crate::ids::DeliveryId,
    lease: LeaseId,
    attempt: i32,
    prepared: Result<Prepared, Refusal>,
}

struct Prepared {
    url: url::Url,
    event_id: EventId,
    body: Arc<Vec<u8>>,
    timestamp: i64,
    signature: Arc<String>,
}

/// A delivery that cannot be sent: nothing goes out; the attempt fails (for good with
/// `give_up`: retrying cannot help).
struct Refusal {
    error: String,
    give_up: bool,
}

/// Runs the worker until `shutdown`: every `poll` (or when woken), it claims as many due
/// deliveries as it has free sending slots and sends them. On shutdown it claims no more and
/// lets the sends in flight finish and record their outcomes.
pub async fn run(worker: Worker, mut shutdown: Shutdown) {
    let worker = Arc::new(worker);
    let slots = Arc::new(Semaphore::new(worker.config.concurrency));
    let mut sending = JoinSet::new();
    loop {
        while sending.try_join_next().is_some() {}
        if *shutdown.borrow() {
            break;
        }
        loop {
            let free = slots.available_permits();
            if free == 0 {
                break;
            }
            let batch = match worker.claim(free as i64).await {
                Ok(batch) => batch,
                Err(error) => {
                    tracing::warn!(error = ?error, "webhook delivery claim failed; tried again later");
                    break;
                }
            };
            let claimed = batch.len();
            for send in batch {
                let Ok(permit) = slots.clone().try_acquire_owned() else { break };
                let worker = worker.clone();
                sending.spawn(async move {
                    worker.deliver(send).await;
                    drop(permit);
                });
            }
            if claimed < free {
                break;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(worker.config.poll) => {}
            _ = worker.wake.notified() => {}
            // With every slot busy, look again as soon as one frees.
            Some(_) = sending.join_next(), if slots.available_permits() == 0 => {}
            changed = shutdown.changed() => if changed.is_err() { break },
        }
    }
    while sending.join_next().await.is_some() {}
}

impl Worker {
    /// Leases up to `limit` due deliveries and prepares them: each event's body rendered once,
    /// each endpoint's secrets opened once, each (event, endpoint) signed once.
    async fn claim(&self, limit: i64) -> anyhow::Result<Vec<Send>> {
        let now = Utc::now();
        let lease = Lease { id: LeaseId::generate(), until: crate::clock::after(now, self.config.lease) };
        let mut conn = self.pool.get().await?;
        let claimed = repository::claim_due(&mut conn, limit, lease, now).await?;
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<(AccountId, EventId)> =
            claimed.iter().map(|delivery| (delivery.account_id, delivery.event_id)).collect();
        let bodies: HashMap<EventId, Arc<Vec<u8>>> = events::find_many(&mut conn, &wanted)
            .await?
            .into_iter()
            .map(|event| (event.id, Arc::new(event.to_json())))
            .collect();
        drop(conn);
        let timestamp = now.timestamp();
        let mut secrets: HashMap<EndpointId, Result<Vec<Secret>, String>> = HashMap::new();
        let mut signatures: HashMap<(EventId, EndpointId), Arc<String>> = HashMap::new();
        let sends = claimed
            .into_iter()
            .map(|delivery| {
                let secrets = secrets.entry(delivery.endpoint_id).or_insert_with(|| self.open(&delivery));
                let prepared =
                    prepare(&delivery, bodies.get(&delivery.event_id), secrets, timestamp, &mut signatures);
                Send {
                    account_id: delivery.account_id,
                    delivery: delivery.id,
                    lease: lease.id,
                    attempt: delivery.attempt,
                    prepared,
                }
            })
            .collect();
        Ok(sends)
    }

    /// The endpoint's secrets, the current one first.
    fn open(&self, delivery: &Claimed) -> Result<Vec<Secret>, String> {
        let Some(current) = &delivery.secret else {
            return Err("the endpoint was deleted".to_owned());
        };
        let context = secret_context(delivery.account_id, delivery.endpoint_id);
        std::iter::once(current)
            .chain(&delivery.previous_secret)
            .map(|sealed| {
                let text = self.key.open(sealed, &context).map_err(|error| {
                    tracing::error!(endpoint = %delivery.endpoint_id, "webhook secret does not open: {error}");
                    error.to_string()
                })?;
                Secret::parse(&String::from_utf8_lossy(&text)).map_err(|error| error.to_string())
            })
            .collect()
    }

    /// Sends one delivery and records its attempt and outcome.
    async fn deliver(&self, send: Send) {
        let started_at = Utc::now();
        let clock = Instant::now();
        let (http_status, error, give_up) = match &send.prepared {
            Err(refusal) => (None, Some(refusal.error.clone()), refusal.give_up),
            Ok(prepared) => {
                let (status, error) = self.post(prepared).await;
                (status, error, false)
            }
        };
        let attempt = Attempt {
            number: send.attempt,
            started_at,
            http_status,
            latency_ms: i32::try_from(clock.elapsed().as_millis()).unwrap_or(i32::MAX),
            error: error.map(|error| truncate(&error)),
        };
        let outcome = match &attempt.error {
            None => Outcome::Delivered,
            Some(_) if give_up || send.attempt >= self.config.max_attempts => Outcome::GiveUp,
            Some(_) => {
                let random = getrandom::u64().unwrap_or_default();
                let wait = self.config.backoff(send.attempt, random);
                Outcome::Retry(crate::clock::after(Utc::now(), wait))
            }
        };
        match self.record(&send, &attempt, outcome).await {
            Ok(true) => count(outcome),
            Ok(false) => tracing::info!(
                delivery = %send.delivery,
                attempt = send.attempt,
                "webhook delivery taken over or stopped meanwhile; its attempt is recorded, its outcome is not"
            ),
            Err(error) => tracing::warn!(
                delivery = %send.delivery,
                error = ?error,
                "webhook delivery outcome not recorded; it is sent again after its lease"
            ),
        }
    }

    async fn record(&self, send: &Send, attempt: &Attempt, outcome: Outcome) -> anyhow::Result<bool> {
        let mut conn = self.pool.get().await?;
        let key = (send.account_id, send.delivery);
        Ok(repository::record(&mut conn, key, send.lease, attempt, outcome, Utc::now()).await?)
    }

    /// POSTs the event; returns the HTTP status if an answer came, and the error unless it was
    /// a 2xx.
    async fn post(&self, prepared: &Prepared) -> (Option<u16>, Option<String>) {
        if !self.allow_private
            && let Err(refused) = address::check_literal(&prepared.url)
        {
            return (None, Some(refused.0));
        }
        let request = self
            .http
            .post(prepared.url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("webhook-id", prepared.event_id.to_string())
            .header("webhook-timestamp", prepared.timestamp.to_string())
            .header("webhook-signature", prepared.signature.as_str())
            .body(prepared.body.as_ref().clone());
        match request.send().await {
            Ok(mut response) => {
                let status = response.status();
                // Read a little of the body, so that the connection goes back to the pool.
                let mut read = 0;
                while read < BODY_READ_LIMIT
                    && let Ok(Some(chunk)) = response.chunk().await
                {
                    read += chunk.len();
                }
                let error = (!status.is_success()).then(|| format!("HTTP {}", status.as_u16()));
                (Some(status.as_u16()), error)
            }
            Err(error) if error.is_timeout() => {
                (None, Some(format!("no answer within {} ms", self.config.timeout.as_millis())))
            }
            Err(error) => (None, Some(chain(&error))),
        }
    }
}

/// A delivery's body and signature, or why it cannot be sent.
fn prepare(
    delivery: &Claimed,
    body: Option<&Arc<Vec<u8>>>,
    secrets: &Result<Vec<Secret>, String>,
    timestamp: i64,
    signatures: &mut HashMap<(EventId, EndpointId), Arc<String>>,
) -> Result<Prepared, Refusal> {
    let Some(body) = body else {
        let error = "the event is no longer stored (past its retention)".to_owned();
        return Err(Refusal { error, give_up: true });
    };
    let secrets = secrets.as_ref().map_err(|error| Refusal { error: error.clone(), give_up: false })?;
    let url = url::Url::parse(&delivery.url)
        .map_err(|error| Refusal { error: format!("the endpoint's URL: {error}"), give_up: true })?;
    let signature = signatures
        .entry((delivery.event_id, delivery.endpoint_id))
        .or_insert_with(|| {
            let id = delivery.event_id.to_string();
            Arc::new(webhook_signature::signature_header(secrets, &id, timestamp, body))
        })
        .clone();
    Ok(Prepared { url, event_id: delivery.event_id, body: body.clone(), timestamp, signature })
}

/// An error with its causes, `: `-separated (reqwest's own text names only the step that failed).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn truncate(text: &str) -> String {
    text.chars().take(ERROR_CHARS).collect()
}

fn count(outcome: Outcome) {
    crate::telemetry::metrics::webhook_delivery(match outcome {
        Outcome::Delivered => "delivered",
        Outcome::Retry(_) => "failed",
        Outcome::GiveUp => "gave_up",
    });
}
