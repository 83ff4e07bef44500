//! The mock payment provider: a real HTTP server implementing the Stripe-like provider contract
//! of docs/payments.md, with its state in memory. Run it with `orderpay mock-provider`.
//!
//! Behaviour by payment method is deterministic so that every failure window can be driven on
//! purpose. Charges: `pm_card_ok` succeeds; `pm_card_declined` is declined; `pm_provider_down`
//! answers 503 without charging; `pm_provider_timeout` charges and then holds the answer (longer
//! than a client waits); `pm_provider_pending` charges as `pending` and settles later;
//! `pm_capture_declined` authorizes but every capture is declined; any other `pm_...` is
//! declined as an invalid payment method. Refunds, by the charge's payment method:
//! `pm_refund_declined` refunds fail, `pm_refund_pending` refunds settle later,
//! `pm_refund_timeout` refunds succeed and hold the answer, every other captured charge refunds
//! at once. `pm_card_disputed` charges succeed, and `MOCK_PROVIDER_SETTLE_MS` after their capture
//! the customer's bank disputes them (`POST /_admin/disputes` opens a dispute on any captured
//! charge, `POST /_admin/disputes/{id}/decide` decides it). `capture: false` authorizes only; an authorization expires after
//! `MOCK_PROVIDER_AUTH_TTL_MS`.
//!
//! `POST /_admin/faults` adds random latency, held answers and 503s to every later write, and
//! misbehaving webhooks; `POST /_admin/script` says what each next write does, in order (act now,
//! act and hold the answer, act after N ms, never act, 503, act when the test says: [`Scripted`]). The modules: [`ledger`] (the books and their state machine, a file per job),
//! [`handlers`] (HTTP of the mock's own contract), [`stripe`] (the same ledger behind Stripe's
//! API, `--wire stripe`), [`script`] (when a write acts), [`webhooks`] (signed event delivery).

mod handlers;
mod ledger;
mod script;
mod stripe;
mod webhooks;

pub use webhooks::MAX_ATTEMPTS as WEBHOOK_ATTEMPTS;

use std::fmt;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::body::{BoxBody, EitherBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::{Next, from_fn};
use actix_web::{App, HttpResponse, HttpServer, web};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::sync::{Notify, mpsc};

use self::ledger::{Ledger, Reply, Timing};
use self::script::Script;
pub use self::script::Scripted;
use self::webhooks::{Delivery, Signer, Webhooks};
use crate::provider::stripe::WebhookSecret;
use crate::webhook_signature::Secret;

/// The API the mock speaks: its own contract (docs/payments.md) or the subset of Stripe's the
/// Stripe adapter calls (docs/providers.md), over the same ledger, faults and script.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Wire {
    #[default]
    Mock,
    Stripe,
}

#[derive(Clone)]
pub struct MockSettings {
    pub listen: String,
    /// The API served under `/v1`.
    pub wire: Wire,
    /// On the Stripe wire, how long a PaymentIntent stays out of `GET /v1/payment_intents/search`
    /// after it was created, as Stripe's search index lags (its listings never do).
    pub search_lag: Duration,
    /// How long a `pm_provider_timeout` charge, a `pm_refund_timeout` refund (or a timeout
    /// fault) holds its answer.
    pub timeout_hold: Duration,
    /// How long a `pm_provider_pending` charge or a `pm_refund_pending` refund stays `pending`.
    pub settle_after: Duration,
    /// When set, `/v1/*` requires `Authorization: Bearer <api_key>`.
    pub api_key: Option<String>,
    /// How long an uncaptured authorization lasts.
    pub auth_ttl: Duration,
    /// Where webhook events are POSTed; none are sent when unset.
    pub webhook_url: Option<String>,
    /// `whsec_...`, required with `webhook_url`.
    pub webhook_secret: Option<String>,
    /// The first wait before a failed delivery is retried; doubles per attempt.
    pub webhook_retry_base: Duration,
    /// Webhook events are logged but never sent on their own: a test delivers each one itself
    /// (`POST /_admin/webhooks/{id}/deliver`), in the order and as often as it means to.
    pub webhooks_by_hand: bool,
}

/// The defaults of `orderpay mock-provider`.
impl Default for MockSettings {
    fn default() -> Self {
        MockSettings {
            listen: "127.0.0.1:8081".to_owned(),
            wire: Wire::Mock,
            search_lag: Duration::from_secs(60),
            timeout_hold: Duration::from_secs(30),
            settle_after: Duration::from_secs(3),
            api_key: None,
            auth_ttl: Duration::from_secs(7 * 24 * 3600),
            webhook_url: None,
            webhook_secret: None,
            webhook_retry_base: Duration::from_millis(500),
            webhooks_by_hand: false,
        }
    }
}

/// Written by hand so that the API key and the webhook secret never reach a log line.
impl fmt::Debug for MockSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |value: &Option<String>| value.as_ref().map(|_| "<redacted>");
        f.debug_struct("MockSettings")
            .field("listen", &self.listen)
            .field("wire", &self.wire)
            .field("search_lag", &self.search_lag)
            .field("timeout_hold", &self.timeout_hold)
            .field("settle_after", &self.settle_after)
            .field("api_key", &redacted(&self.api_key))
            .field("auth_ttl", &self.auth_ttl)
            .field("webhook_url", &self.webhook_url)
            .field("webhook_secret", &redacted(&self.webhook_secret))
            .field("webhook_retry_base", &self.webhook_retry_base)
            .field("webhooks_by_hand", &self.webhooks_by_hand)
            .finish()
    }
}

/// Random faults (`POST /_admin/faults`): the first three apply to every write (charges,
/// captures, cancels, refunds), the `webhook_*` ones to every event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Added before the request is handled.
    #[serde(default)]
    pub latency_ms: u64,
    /// Fraction (0 to 1) of writes that are made and then held like `pm_provider_timeout`.
    #[serde(default)]
    pub timeout_rate: f64,
    /// Fraction (0 to 1) of writes answered 503 without acting.
    #[serde(default)]
    pub error_rate: f64,
    /// Fraction (0 to 1) of events delivered twice (the same `webhook-id` both times).
    #[serde(default)]
    pub webhook_duplicate_rate: f64,
    /// Fraction (0 to 1) of events never sent.
    #[serde(default)]
    pub webhook_drop_rate: f64,
    /// How long each event waits before its first attempt.
    #[serde(default)]
    pub webhook_delay_ms: u64,
    /// How long every lookup's answer (`GET /v1/*`) is held after the ledger was read: a slow
    /// answer, which says what was true when it was read.
    #[serde(default)]
    pub lookup_latency_ms: u64,
    /// Every `/v1/*` call, lookups included, answers 401 `authentication_error` without acting,
    /// as while our API key is revoked or rotated away.
    #[serde(default)]
    pub credentials_revoked: bool,
}

impl Faults {
    fn validate(&self) -> Result<(), &'static str> {
        let rates = [self.timeout_rate, self.error_rate, self.webhook_duplicate_rate, self.webhook_drop_rate];
        if !rates.iter().all(|rate| (0.0..=1.0).contains(rate)) {
            return Err("rates are between 0 and 1");
        }
        if [self.latency_ms, self.webhook_delay_ms, self.lookup_latency_ms].iter().any(|ms| *ms > 60_000) {
            return Err("latency_ms, webhook_delay_ms and lookup_latency_ms are at most 60000");
        }
        Ok(())
    }
}

pub(super) struct MockState {
    settings: MockSettings,
    ledger: Mutex<Ledger>,
    /// What the next writes do, when a test scripted them (`POST /_admin/script`).
    script: Mutex<Script>,
    /// Requests received on `/v1/*`: writes (POST) and lookups (GET), for `GET /_admin/requests`.
    writes: AtomicU64,
    lookups: AtomicU64,
    /// Wakes the task that settles things on time when something new is scheduled.
    scheduled: Notify,
    webhooks: Option<Arc<Webhooks>>,
}

impl MockState {
    /// Runs `operation` on the ledger, then, still holding the lock (so that events leave in the
    /// order they happened), hands the events it emitted to the webhooks.
    fn with_ledger<T>(&self, operation: impl FnOnce(&mut Ledger) -> T) -> T {
        // A panic while holding the lock cannot leave the ledger half-written in a way that
        // matters to a mock, so a poisoned lock is still usable.
        let mut ledger = self.ledger.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = operation(&mut ledger);
        let events = ledger.take_events();
        if let Some(webhooks) = &self.webhooks {
            for event in events {
                webhooks.emit(event, &ledger.faults);
            }
        }
        if std::mem::take(&mut ledger.scheduled) {
            self.scheduled.notify_one();
        }
        result
    }
}

impl MockState {
    fn with_script<T>(&self, operation: impl FnOnce(&mut Script) -> T) -> T {
        // Every change is one assignment or one pop: a poisoned lock is still consistent.
        operation(&mut self.script.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }
}

/// A bound mock provider, serving once [`MockProvider::run_until_stopped`] is awaited.
pub struct MockProvider {
    port: u16,
    server: actix_web::dev::Server,
    state: web::Data<MockState>,
    deliveries: Option<mpsc::UnboundedReceiver<Delivery>>,
}

impl MockProvider {
    pub fn build(settings: MockSettings) -> anyhow::Result<MockProvider> {
        let (webhooks, deliveries) = match (&settings.webhook_url, &settings.webhook_secret) {
            (Some(url), Some(secret)) => {
                url::Url::parse(url)
                    .map_err(|error| anyhow::anyhow!("MOCK_PROVIDER_WEBHOOK_URL {url:?}: {error}"))?;
                let signer = match settings.wire {
                    Wire::Mock => Signer::Standard(
                        Secret::parse(secret)
                            .map_err(|error| anyhow::anyhow!("MOCK_PROVIDER_WEBHOOK_SECRET: {error}"))?,
                    ),
                    Wire::Stripe => Signer::Stripe(
                        WebhookSecret::parse(secret)
                            .map_err(|error| anyhow::anyhow!("MOCK_PROVIDER_WEBHOOK_SECRET: {error}"))?,
                    ),
                };
                let (webhooks, deliveries) = Webhooks::new(
                    url.clone(),
                    signer,
                    settings.webhook_retry_base,
                    settings.webhooks_by_hand,
                );
                (Some(webhooks), Some(deliveries))
            }
            (Some(_), None) => {
                anyhow::bail!("MOCK_PROVIDER_WEBHOOK_SECRET is required with MOCK_PROVIDER_WEBHOOK_URL")
            }
            (None, _) => (None, None),
        };
        let listener = TcpListener::bind(&settings.listen)?;
        let port = listener.local_addr()?.port();
        let timing = Timing { settle_after: settings.settle_after, auth_ttl: settings.auth_ttl };
        let state = web::Data::new(MockState {
            settings,
            ledger: Mutex::new(Ledger::new(timing)),
            script: Mutex::new(Script::default()),
            writes: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            scheduled: Notify::new(),
            webhooks,
        });
        let app_state = state.clone();
        let wire = state.settings.wire;
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .app_data(web::JsonConfig::default().error_handler(|error, _| {
                    let response = bad_request(&error.to_string());
                    actix_web::error::InternalError::from_response(error, response).into()
                }))
                .app_data(web::QueryConfig::default().error_handler(|error, _| {
                    let response = bad_request(&error.to_string());
                    actix_web::error::InternalError::from_response(error, response).into()
                }))
                .service(
                    web::scope("/v1").wrap(from_fn(count_requests)).wrap(from_fn(authenticate)).configure(
                        match wire {
                            Wire::Mock => handlers::routes,
                            Wire::Stripe => stripe::routes,
                        },
                    ),
                )
                // Outside /v1: no key, not counted; what `orderpay provider check` asks.
                .route(
                    "/health",
                    web::get().to(|| async { HttpResponse::Ok().json(serde_json::json!({"status": "ok"})) }),
                )
                .route("/_admin/charges", web::get().to(handlers::list_charges))
                .route("/_admin/refunds", web::get().to(handlers::list_refunds))
                .route("/_admin/disputes", web::get().to(handlers::list_all_disputes))
                .route("/_admin/disputes", web::post().to(handlers::open_dispute))
                .route("/_admin/disputes/{id}", web::get().to(handlers::get_dispute))
                .route("/_admin/disputes/{id}/decide", web::post().to(handlers::decide_dispute))
                .route("/_admin/balance_transactions", web::post().to(handlers::inject_balance_transaction))
                .route(
                    "/_admin/balance_transactions/generate",
                    web::post().to(handlers::generate_balance_transactions),
                )
                .route(
                    "/_admin/balance_transactions/{id}",
                    web::delete().to(handlers::hide_balance_transaction),
                )
                .route("/_admin/webhooks", web::get().to(handlers::list_webhooks))
                .route("/_admin/webhooks/{id}/deliver", web::post().to(handlers::deliver_webhook))
                .route("/_admin/faults", web::get().to(handlers::get_faults))
                .route("/_admin/faults", web::post().to(handlers::set_faults))
                .route("/_admin/script", web::get().to(handlers::get_script))
                .route("/_admin/script", web::post().to(handlers::set_script))
                .route("/_admin/parked", web::get().to(handlers::list_parked))
                .route("/_admin/parked/{key}/{what}", web::post().to(handlers::unpark))
                .route("/_admin/due/{key}/{what}", web::post().to(handlers::by_hand))
                .route("/_admin/requests", web::get().to(handlers::count_requests))
                .default_service(web::to(|| async {
                    respond(Reply::error(StatusCode::NOT_FOUND, "not_found", None, "no such endpoint"))
                }))
        })
        .workers(2)
        .listen(listener)?
        .run();
        Ok(MockProvider { port, server, state, deliveries })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped, with the two tasks of its own: settling things on
    /// time and delivering webhooks. Both end with the server.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let settler = tokio::spawn(settle_on_time(self.state.clone()));
        let deliveries = match (&self.state.webhooks, self.deliveries) {
            (Some(webhooks), Some(deliveries)) => Some(tokio::spawn(webhooks.clone().run(deliveries))),
            _ => None,
        };
        let result = self.server.await;
        settler.abort();
        if let Some(deliveries) = deliveries {
            deliveries.abort();
        }
        result
    }
}

/// Settles pending charges and refunds and expires authorizations when they are due, so that
/// their webhooks leave on time even when nobody reads them. Sleeps until the next due instant,
/// or until something new is scheduled.
async fn settle_on_time(state: web::Data<MockState>) {
    loop {
        // Created before looking, so that a notification sent meanwhile is not missed.
        let scheduled = state.scheduled.notified();
        let next = state.with_ledger(|ledger| ledger.advance_due(Utc::now()));
        match next {
            Some(at) => {
                let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = scheduled => {}
                }
            }
            None => scheduled.await,
        }
    }
}

/// Counts `/v1/*` requests, writes (POST) and lookups (GET), and holds each lookup's answer by the
/// `lookup_latency_ms` fault once the ledger has been read.
async fn count_requests(
    request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(state) = request.app_data::<web::Data<MockState>>().cloned() else {
        return next.call(request).await;
    };
    let lookup = request.method() == actix_web::http::Method::GET;
    let counter = if lookup { &state.lookups } else { &state.writes };
    counter.fetch_add(1, Ordering::SeqCst);
    let response = next.call(request).await?;
    let latency = if lookup { state.with_ledger(|ledger| ledger.faults.lookup_latency_ms) } else { 0 };
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    Ok(response)
}

impl MockState {
    /// `(writes, lookups)` received on `/v1/*`.
    pub(super) fn requests(&self) -> (u64, u64) {
        (self.writes.load(Ordering::SeqCst), self.lookups.load(Ordering::SeqCst))
    }
}

/// Refuses `/v1/*` calls without the configured credential, as a real provider would.
async fn authenticate(
    request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<EitherBody<BoxBody>>, actix_web::Error> {
    let state = request.app_data::<web::Data<MockState>>();
    let revoked = state.is_some_and(|state| {
        state.ledger.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).faults.credentials_revoked
    });
    if revoked {
        let refused = "faults: the API key was revoked";
        let refused = respond(Reply::error(StatusCode::UNAUTHORIZED, "authentication_error", None, refused));
        return Ok(request.into_response(refused).map_into_right_body());
    }
    let expected = state.and_then(|state| state.settings.api_key.clone());
    if let Some(expected) = expected {
        let presented = request
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(presented.as_bytes().ct_eq(expected.as_bytes())) {
            let refused = respond(Reply::error(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                None,
                "a valid API key is required: Authorization: Bearer <key>",
            ));
            return Ok(request.into_response(refused).map_into_right_body());
        }
    }
    Ok(next.call(request).await?.map_into_left_body())
}

fn respond(reply: Reply) -> HttpResponse {
    HttpResponse::build(reply.status).json(reply.body)
}

fn bad_request(message: &str) -> HttpResponse {
    respond(Reply::error(StatusCode::BAD_REQUEST, "invalid_request", None, message))
}

/// A uniform draw in [0, 1) from the OS's randomness (fault injection only, never money).
pub(super) fn chance(rate: f64) -> bool {
    if rate <= 0.0 {
        return false;
    }
    let Ok(random) = crate::crypto::random_u64() else {
        return false;
    };
    let draw = (random >> 11) as f64 / (1_u64 << 53) as f64;
    draw < rate
}
