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
//!
//! Outcomes are recorded in batches, not one transaction per send: a commit per delivery was the
//! ceiling of the whole path (a few hundred a second, however many sends were in flight). A
//! finished send hands its attempt to the worker's recorder (a task fed by a bounded channel)
//! and frees its sending slot; the recorder writes whatever has queued up while it wrote the
//! batch before, up to [`RECORD_BATCH`], in one statement ([`queue::record_finished`]),
//! each outcome still under its own lease. Under light load that is a batch of one, written at
//! once (no window to wait out); under heavy load batches grow by themselves. The channel's
//! bound stops the sends when the recorder falls behind, so the deliveries sent but not yet
//! recorded stay few and far inside their leases. A batch whose write fails is written again
//! (every `ORDERPAY_WEBHOOK_POLL_MS`) until it is, so no attempt's row is lost to a passing
//! database error. On shutdown the worker claims no more, lets the sends in flight finish, and
//! the recorder writes everything handed to it before it ends; an outcome lost anyway (a killed
//! process) is a delivery sent again after its lease, as with any worker that dies.
//!
//! A claim is one statement that also reads what the sends need (endpoint, secrets, event): a
//! claim that fails changes nothing, so no attempt number is used up by a send that never
//! happened.
//!
//! Claims come in batches too: once every slot is busy, the worker claims again when half of
//! them are free, not at each freed slot, which would be a claim (and a commit) per delivery.
//!
//! The worker's pool needs two connections: one for claims, one for the recorder, which never
//! holds more than one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinSet;

use super::queue::{self, Attempt, Claimed, Finished, Outcome};
use super::{DeliveryConfig, WebhookSettings, address, secrets};
use crate::background::Shutdown;
use crate::db::Pool;
use crate::encryption::Keyring;
use crate::ids::{AccountId, DeliveryId, EndpointId, EventId, LeaseId};
use crate::operations::leases::Lease;
use crate::webhook_signature::{self, Secret};

pub const USER_AGENT: &str = concat!("orderpay-webhooks/", env!("CARGO_PKG_VERSION"));

/// Error texts are kept this long in the attempts table.
const ERROR_CHARS: usize = 500;

/// The response body is read (and dropped) up to this much, so the connection can be reused.
const BODY_READ_LIMIT: usize = 64 << 10;

/// The most finished attempts recorded in one statement, and the recorder channel's bound. Far
/// more than a worker sends between two writes at its default concurrency; the bound only
/// matters when the database stalls, and then it holds the sends back.
pub const RECORD_BATCH: usize = 512;

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
    keys: Keyring,
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
            keys: settings.encryption_keys.clone(),
            allow_private: settings.allow_private,
            http: client(settings)?,
            wake,
        })
    }
}

/// One delivery ready to go, or why it cannot.
struct Send {
    account_id: AccountId,
    delivery: DeliveryId,
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
/// deliveries as it has free sending slots and sends them; while there is more due than slots,
/// it claims again each time half of its slots are free. On shutdown it claims no more, lets the
/// sends in flight finish, and returns once the recorder wrote every outcome they handed it.
pub async fn run(worker: Worker, mut shutdown: Shutdown) {
    let worker = Arc::new(worker);
    let slots = Arc::new(Semaphore::new(worker.config.concurrency));
    let refill = worker.config.concurrency.div_ceil(2);
    let (outcomes, finished) = mpsc::channel(RECORD_BATCH);
    let recorder = tokio::spawn(record(worker.pool.clone(), finished, worker.config.poll));
    let mut sending = JoinSet::new();
    // The last claim filled every free slot: more may be due, so freed slots are claimed again.
    let mut more_due = false;
    loop {
        while sending.try_join_next().is_some() {}
        if *shutdown.borrow() {
            break;
        }
        if !more_due || slots.available_permits() >= refill {
            more_due = false;
            loop {
                let free = slots.available_permits();
                if free == 0 {
                    more_due = true;
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
                    let (worker, outcomes) = (worker.clone(), outcomes.clone());
                    sending.spawn(async move {
                        let finished = worker.deliver(send).await;
                        // The slot is free once the send is; the recorder's bound holds it while
                        // the recorder is behind.
                        let _ = outcomes.send(finished).await;
                        drop(permit);
                    });
                }
                if claimed < free {
                    break;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(worker.config.poll) => more_due = false,
            _ = worker.wake.notified() => more_due = false,
            // With more due than slots, look again as sends finish (claiming once `refill` are free).
            Some(_) = sending.join_next(), if more_due => {}
            changed = shutdown.changed() => if changed.is_err() { break },
        }
    }
    while sending.join_next().await.is_some() {}
    // The last sender goes: the recorder writes what it holds, then ends.
    drop(outcomes);
    if let Err(error) = recorder.await {
        tracing::error!(error = ?error, "the webhook outcome recorder failed");
    }
}

/// The recorder: writes finished attempts in batches of whatever queued up while it wrote the
/// batch before (at most [`RECORD_BATCH`]), until every sender is gone and the channel is empty.
///
/// A batch whose write fails (the database away, a statement timeout) is written again every
/// `retry` until it is: every attempt's row is kept, and an outcome written late is still
/// written under its own lease (a delivery taken over meanwhile keeps its new holder's). The
/// channel fills meanwhile and holds the sends back.
async fn record(pool: Pool, mut finished: mpsc::Receiver<Finished>, retry: std::time::Duration) {
    let mut batch = Vec::with_capacity(RECORD_BATCH);
    while finished.recv_many(&mut batch, RECORD_BATCH).await > 0 {
        let mut failures = 0_u32;
        let applied = loop {
            match record_batch(&pool, &batch).await {
                Ok(applied) => break applied,
                Err(error) => {
                    failures += 1;
                    if failures == 1 {
                        tracing::warn!(
                            deliveries = batch.len(),
                            error = ?error,
                            retry_ms = retry.as_millis(),
                            "webhook delivery outcomes not recorded; written again until they are"
                        );
                    }
                    tokio::time::sleep(retry).await;
                }
            }
        };
        if failures > 0 {
            tracing::info!(deliveries = batch.len(), failures, "webhook delivery outcomes recorded");
        }
        for one in &batch {
            if applied.contains(&(one.delivery, one.lease)) {
                count(one.outcome);
            } else {
                tracing::info!(
                    delivery = %one.delivery,
                    attempt = one.attempt.number,
                    "webhook delivery taken over or stopped meanwhile; its attempt is recorded, its outcome is not"
                );
            }
        }
        batch.clear();
    }
}

async fn record_batch(pool: &Pool, batch: &[Finished]) -> anyhow::Result<HashSet<(DeliveryId, LeaseId)>> {
    let mut conn = pool.get().await?;
    Ok(queue::record_finished(&mut conn, batch, Utc::now()).await?)
}

impl Worker {
    /// Leases up to `limit` due deliveries and prepares them: each event's body rendered once,
    /// each endpoint's secrets opened once, each (event, endpoint) signed once.
    async fn claim(&self, limit: i64) -> anyhow::Result<Vec<Send>> {
        let now = Utc::now();
        let lease = Lease { id: LeaseId::generate(), until: crate::clock::after(now, self.config.lease) };
        let claimed = {
            let mut conn = self.pool.get().await?;
            queue::claim_due(&mut conn, limit, lease, now).await?
        };
        let mut bodies: HashMap<EventId, Arc<Vec<u8>>> = HashMap::new();
        for delivery in &claimed {
            if !bodies.contains_key(&delivery.event_id)
                && let Some(event) = delivery.event()
            {
                bodies.insert(event.id, Arc::new(event.to_json()));
            }
        }
        let timestamp = now.timestamp();
        let mut secrets: HashMap<EndpointId, Result<Vec<Secret>, String>> = HashMap::new();
        let mut signatures: HashMap<(EventId, EndpointId), Arc<String>> = HashMap::new();
        let sends = claimed
            .into_iter()
            .map(|delivery| {
                let secrets = secrets.entry(delivery.endpoint_id).or_insert_with(|| self.open(&delivery));
                if secrets.is_err() && delivery.secret.is_some() {
                    crate::telemetry::metrics::webhook_secret_error();
                }
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

    /// The endpoint's secrets, the current one first. A current secret that opens under no key
    /// fails the delivery's attempt, with [`secrets::UNREADABLE`] as its error (logged here,
    /// counted per delivery); a previous one that does not open only loses its signature.
    fn open(&self, delivery: &Claimed) -> Result<Vec<Secret>, String> {
        let (account_id, endpoint_id) = (delivery.account_id, delivery.endpoint_id);
        let Some(current) = &delivery.secret else {
            return Err("the endpoint was deleted".to_owned());
        };
        let current = secrets::signing(&self.keys, account_id, endpoint_id, current).map_err(|error| {
            tracing::error!(account = %account_id, endpoint = %endpoint_id, "{error}");
            error.to_string()
        })?;
        let mut signing = vec![current];
        if let Some(previous) = &delivery.previous_secret {
            match secrets::signing(&self.keys, account_id, endpoint_id, previous) {
                Ok(previous) => signing.push(previous),
                Err(error) => tracing::warn!(
                    account = %account_id,
                    endpoint = %endpoint_id,
                    "the secret before the last rotation does not sign: {error}; its deliveries carry the \
                     current secret's signature alone"
                ),
            }
        }
        Ok(signing)
    }

    /// Sends one delivery; returns its attempt and where the delivery goes next, for the
    /// recorder.
    async fn deliver(&self, send: Send) -> Finished {
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
                let random = crate::crypto::random_u64().unwrap_or_default();
                let wait = self.config.backoff(send.attempt, random);
                Outcome::Retry(crate::clock::after(Utc::now(), wait))
            }
        };
        Finished { account_id: send.account_id, delivery: send.delivery, lease: send.lease, attempt, outcome }
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
