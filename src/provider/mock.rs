//! The mock payment provider: a real HTTP server implementing the provider contract of
//! PAYMENTS.md, with its state in memory. Run it with `orderpay mock-provider`.
//!
//! Behaviour by payment method is deterministic so that every failure window can be driven on
//! purpose: `pm_card_ok` succeeds, `pm_card_declined` is declined, `pm_provider_down` answers 503
//! without charging, `pm_provider_timeout` charges and then holds the answer (longer than a
//! client waits), `pm_provider_pending` charges as `pending` and settles to `succeeded` later.
//! Any other `pm_...` is declined as an invalid payment method. `POST /_admin/faults` adds random
//! latency, timeouts and 503s to every later charge, for load and chaos runs.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::wire::{ChargeBody, CreateChargeBody, ErrorBody, ErrorDetail};

#[derive(Debug, Clone)]
pub struct MockSettings {
    pub listen: String,
    /// How long a `pm_provider_timeout` charge (or a timeout fault) holds its answer.
    pub timeout_hold: Duration,
    /// How long a `pm_provider_pending` charge stays `pending`.
    pub settle_after: Duration,
}

/// Random faults applied to every charge request (`POST /_admin/faults`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Added before the charge is handled.
    #[serde(default)]
    pub latency_ms: u64,
    /// Fraction (0 to 1) of charges that are made and then held like `pm_provider_timeout`.
    #[serde(default)]
    pub timeout_rate: f64,
    /// Fraction (0 to 1) of charges answered 503 without charging.
    #[serde(default)]
    pub error_rate: f64,
}

struct StoredCharge {
    charge: ChargeBody,
    request: CreateChargeBody,
    settles_at: Option<DateTime<Utc>>,
    /// The `X-Request-Id` of the request that created it.
    request_id: Option<String>,
    /// `POST /v1/charges` requests received for its key (the first and every replay).
    requests: u32,
}

#[derive(Default)]
struct Ledger {
    charges: Vec<StoredCharge>,
    by_key: HashMap<String, usize>,
    by_id: HashMap<String, usize>,
    faults: Faults,
}

struct MockState {
    settings: MockSettings,
    ledger: Mutex<Ledger>,
}

impl MockState {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock cannot leave the ledger half-written (every update is
        // one push or one field), so a poisoned lock is still usable.
        self.ledger.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Ledger {
    /// Pending charges whose settlement time has come are succeeded from now on.
    fn settle_due(&mut self, index: usize) -> ChargeBody {
        let stored = &mut self.charges[index];
        if stored.settles_at.is_some_and(|at| at <= Utc::now()) {
            stored.charge.status = "succeeded".to_owned();
            stored.settles_at = None;
        }
        stored.charge.clone()
    }
}

/// A bound mock provider, serving once [`MockProvider::run_until_stopped`] is awaited.
pub struct MockProvider {
    port: u16,
    server: actix_web::dev::Server,
}

impl MockProvider {
    pub fn build(settings: MockSettings) -> anyhow::Result<MockProvider> {
        let listener = TcpListener::bind(&settings.listen)?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(MockState { settings, ledger: Mutex::new(Ledger::default()) });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(web::JsonConfig::default().error_handler(|error, _| {
                    let response =
                        error_response(StatusCode::BAD_REQUEST, "invalid_request", &error.to_string());
                    actix_web::error::InternalError::from_response(error, response).into()
                }))
                .route("/v1/charges", web::post().to(create_charge))
                .route("/v1/charges", web::get().to(find_charge_by_key))
                .route("/v1/charges/{id}", web::get().to(get_charge))
                .route("/_admin/charges", web::get().to(list_charges))
                .route("/_admin/faults", web::get().to(get_faults))
                .route("/_admin/faults", web::post().to(set_faults))
                .default_service(web::to(|| async {
                    error_response(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
                }))
        })
        .workers(2)
        .listen(listener)?
        .run();
        Ok(MockProvider { port, server })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> HttpResponse {
    HttpResponse::build(status)
        .json(ErrorBody { error: ErrorDetail { kind: kind.to_owned(), message: message.to_owned() } })
}

/// A uniform draw in [0, 1) from the OS's randomness (fault injection only, never money).
fn chance(rate: f64) -> bool {
    if rate <= 0.0 {
        return false;
    }
    let mut bytes = [0_u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return false;
    }
    let draw = (u64::from_le_bytes(bytes) >> 11) as f64 / (1_u64 << 53) as f64;
    draw < rate
}

/// `POST /v1/charges`
async fn create_charge(
    state: web::Data<MockState>,
    request: HttpRequest,
    body: web::Json<CreateChargeBody>,
) -> HttpResponse {
    let Some(key) = request.headers().get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return error_response(StatusCode::BAD_REQUEST, "invalid_request", "Idempotency-Key is required");
    };
    let key = key.to_owned();
    let request_id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = body.into_inner();
    let faults = state.ledger().faults.clone();
    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    if chance(faults.error_rate) {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "api_error", "injected fault: unavailable");
    }
    let hold_fault = chance(faults.timeout_rate);

    let (status, charge, hold) = {
        let mut ledger = state.ledger();
        if let Some(&index) = ledger.by_key.get(&key) {
            if ledger.charges[index].request != body {
                return error_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_error",
                    "this Idempotency-Key was used with different parameters",
                );
            }
            // A replay answers at once, whatever the first request did.
            ledger.charges[index].requests += 1;
            (StatusCode::OK, ledger.settle_due(index), false)
        } else {
            let (charge_status, decline, settles_at, hold) = match body.payment_method.as_str() {
                "pm_provider_down" => {
                    return error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "api_error",
                        "the provider is down",
                    );
                }
                "pm_card_ok" => ("succeeded", None, None, hold_fault),
                "pm_provider_timeout" => ("succeeded", None, None, true),
                "pm_provider_pending" => {
                    let settle = chrono::Duration::from_std(state.settings.settle_after).unwrap_or_default();
                    ("pending", None, Some(Utc::now() + settle), hold_fault)
                }
                "pm_card_declined" => (
                    "declined",
                    Some(("insufficient_funds", "Your card has insufficient funds.")),
                    None,
                    false,
                ),
                _ => ("declined", Some(("invalid_payment_method", "No such payment method.")), None, false),
            };
            let charge = ChargeBody {
                id: format!("ch_{}", Uuid::now_v7().simple()),
                object: "charge".to_owned(),
                idempotency_key: key.clone(),
                amount: body.amount.clone(),
                currency: body.currency.clone(),
                status: charge_status.to_owned(),
                payment_method: body.payment_method.clone(),
                reference: body.reference.clone(),
                decline_code: decline.map(|(code, _)| code.to_owned()),
                failure_message: decline.map(|(_, message)| message.to_owned()),
                created_at: Utc::now(),
            };
            let index = ledger.charges.len();
            ledger.by_key.insert(key, index);
            ledger.by_id.insert(charge.id.clone(), index);
            ledger.charges.push(StoredCharge {
                charge: charge.clone(),
                request: body,
                settles_at,
                request_id,
                requests: 1,
            });
            (StatusCode::CREATED, charge, hold)
        }
    };
    if hold {
        // The charge is real; its answer arrives too late for the client.
        tokio::time::sleep(state.settings.timeout_hold).await;
    }
    HttpResponse::build(status).json(charge)
}

#[derive(Deserialize)]
struct KeyQuery {
    idempotency_key: String,
}

/// `GET /v1/charges?idempotency_key=...`: 404 when the provider never received that key.
async fn find_charge_by_key(state: web::Data<MockState>, query: web::Query<KeyQuery>) -> HttpResponse {
    let mut ledger = state.ledger();
    match ledger.by_key.get(&query.idempotency_key).copied() {
        Some(index) => HttpResponse::Ok().json(ledger.settle_due(index)),
        None => error_response(StatusCode::NOT_FOUND, "not_found", "no charge for this idempotency key"),
    }
}

/// `GET /v1/charges/{id}`
async fn get_charge(state: web::Data<MockState>, id: web::Path<String>) -> HttpResponse {
    let mut ledger = state.ledger();
    match ledger.by_id.get(id.as_str()).copied() {
        Some(index) => HttpResponse::Ok().json(ledger.settle_due(index)),
        None => error_response(StatusCode::NOT_FOUND, "not_found", "no such charge"),
    }
}

/// `GET /_admin/charges`: every charge received, oldest first.
async fn list_charges(state: web::Data<MockState>) -> HttpResponse {
    let mut ledger = state.ledger();
    let charges: Vec<_> = (0..ledger.charges.len())
        .map(|index| {
            let charge = ledger.settle_due(index);
            let stored = &ledger.charges[index];
            json!({
                "request_id": stored.request_id,
                "requests": stored.requests,
                "id": charge.id,
                "idempotency_key": charge.idempotency_key,
                "amount": charge.amount,
                "currency": charge.currency,
                "status": charge.status,
                "payment_method": charge.payment_method,
                "reference": charge.reference,
                "created_at": charge.created_at,
            })
        })
        .collect();
    HttpResponse::Ok().json(json!({ "data": charges }))
}

/// `GET /_admin/faults`
async fn get_faults(state: web::Data<MockState>) -> HttpResponse {
    HttpResponse::Ok().json(state.ledger().faults.clone())
}

/// `POST /_admin/faults` with `{latency_ms, timeout_rate, error_rate}`; `{}` clears them.
async fn set_faults(state: web::Data<MockState>, faults: web::Json<Faults>) -> HttpResponse {
    let faults = faults.into_inner();
    let rate_ok = |rate: f64| (0.0..=1.0).contains(&rate);
    if !rate_ok(faults.timeout_rate) || !rate_ok(faults.error_rate) || faults.latency_ms > 60_000 {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "rates are between 0 and 1, latency_ms at most 60000",
        );
    }
    state.ledger().faults = faults.clone();
    HttpResponse::Ok().json(faults)
}
