//! The mock provider's HTTP handlers: read the request, let the script or the faults say when
//! the ledger acts ([`super::script::act`]), answer (holding the answer when the ledger, the
//! script or a fault says so). Bad input of any kind is a 400 JSON error, never a panic.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::ledger::{BalanceListQuery, ByHand, Decision, Generate, InjectedMovement, OpenDispute, Reply};
use super::script::{self, Scripted};
use super::{Faults, MockState, bad_request, respond};
use crate::provider::wire::{
    CancelChargeBody, CaptureChargeBody, CloseDisputeBody, CreateChargeBody, CreateRefundBody,
    UpdateDisputeBody,
};

/// The routes of the mock's own contract under `/v1`.
pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/charges", web::post().to(create_charge))
        .route("/charges", web::get().to(find_charge_by_key))
        .route("/charges/{id}", web::get().to(get_charge))
        .route("/charges/{id}/capture", web::post().to(capture_charge))
        .route("/charges/{id}/cancel", web::post().to(cancel_charge))
        .route("/refunds", web::post().to(create_refund))
        .route("/refunds", web::get().to(find_refund_by_key))
        .route("/refunds/{id}", web::get().to(get_refund))
        .route("/disputes", web::get().to(list_disputes))
        .route("/disputes/{id}", web::get().to(get_dispute))
        .route("/disputes/{id}", web::post().to(update_dispute))
        .route("/disputes/{id}/close", web::post().to(close_dispute))
        .route("/balance_transactions", web::get().to(list_balance_transactions));
}

/// Keys longer than this are refused, as at Stripe.
const MAX_KEY_LENGTH: usize = 255;

fn invalid(message: &str) -> Reply {
    Reply::error(StatusCode::BAD_REQUEST, "invalid_request", None, message)
}

pub(super) fn idempotency_key(request: &HttpRequest) -> Result<String, Reply> {
    match request.headers().get("idempotency-key").map(|value| value.to_str()) {
        Some(Ok(key)) if !key.is_empty() && key.len() <= MAX_KEY_LENGTH => Ok(key.to_owned()),
        Some(_) => Err(invalid("Idempotency-Key must be 1 to 255 visible ASCII characters")),
        None => Err(invalid("Idempotency-Key is required")),
    }
}

pub(super) fn request_id(request: &HttpRequest) -> Option<String> {
    request.headers().get("x-request-id").and_then(|value| value.to_str().ok()).map(str::to_owned)
}

/// A JSON body; an empty one is the type's default (captures and cancels need no body).
fn optional_json<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, Reply> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    json_body(bytes)
}

fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Reply> {
    serde_json::from_slice(bytes).map_err(|error| invalid(&format!("invalid JSON body: {error}")))
}

/// `POST /v1/charges`
pub(super) async fn create_charge(
    state: web::Data<MockState>,
    request: HttpRequest,
    body: web::Json<CreateChargeBody>,
) -> HttpResponse {
    let key = match idempotency_key(&request) {
        Ok(key) => key,
        Err(reply) => return respond(reply),
    };
    let body = body.into_inner();
    let request_id = request_id(&request);
    script::act(state, &key.clone(), move |ledger, hold| {
        ledger.create_charge(&key, body, request_id, Utc::now(), hold)
    })
    .await
}

#[derive(Deserialize)]
pub(super) struct KeyQuery {
    idempotency_key: String,
}

/// `GET /v1/charges?idempotency_key=...`: 404 when the provider never received that key.
pub(super) async fn find_charge_by_key(
    state: web::Data<MockState>,
    query: web::Query<KeyQuery>,
) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.charge_by_key(&query.idempotency_key, Utc::now())) {
        Some(charge) => HttpResponse::Ok().json(charge),
        None => not_found("no charge for this idempotency key"),
    }
}

/// `GET /v1/charges/{id}`
pub(super) async fn get_charge(state: web::Data<MockState>, id: web::Path<String>) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.charge_by_id(&id, Utc::now())) {
        Some(charge) => HttpResponse::Ok().json(charge),
        None => not_found("no such charge"),
    }
}

/// `POST /v1/charges/{id}/capture` with `{amount?, currency?}` (an empty body captures all).
pub(super) async fn capture_charge(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (key, body) = match (idempotency_key(&request), optional_json::<CaptureChargeBody>(&body)) {
        (Ok(key), Ok(body)) => (key, body),
        (Err(reply), _) | (_, Err(reply)) => return respond(reply),
    };
    let id = id.into_inner();
    script::act(state, &key.clone(), move |ledger, hold| ledger.capture(&id, &key, body, Utc::now(), hold))
        .await
}

/// `POST /v1/charges/{id}/cancel` (an empty body, or `{}`)
pub(super) async fn cancel_charge(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let key = match (idempotency_key(&request), optional_json::<CancelChargeBody>(&body)) {
        (Ok(key), Ok(_)) => key,
        (Err(reply), _) | (_, Err(reply)) => return respond(reply),
    };
    let id = id.into_inner();
    script::act(state, &key.clone(), move |ledger, hold| ledger.cancel(&id, &key, Utc::now(), hold)).await
}

/// `POST /v1/refunds` with `{charge, amount, currency?, reference}`
pub(super) async fn create_refund(
    state: web::Data<MockState>,
    request: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let key = match idempotency_key(&request) {
        Ok(key) => key,
        Err(reply) => return respond(reply),
    };
    let body: CreateRefundBody = match json_body(&body) {
        Ok(body) => body,
        Err(reply) => return respond(reply),
    };
    let request_id = request_id(&request);
    script::act(state, &key.clone(), move |ledger, hold| {
        ledger.create_refund(&key, body, request_id, Utc::now(), hold)
    })
    .await
}

/// `GET /v1/refunds?idempotency_key=...`: 404 when no refund was made for that key.
pub(super) async fn find_refund_by_key(
    state: web::Data<MockState>,
    query: web::Query<KeyQuery>,
) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.refund_by_key(&query.idempotency_key, Utc::now())) {
        Some(refund) => HttpResponse::Ok().json(refund),
        None => not_found("no refund for this idempotency key"),
    }
}

/// `GET /v1/refunds/{id}`
pub(super) async fn get_refund(state: web::Data<MockState>, id: web::Path<String>) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.refund_by_id(&id, Utc::now())) {
        Some(refund) => HttpResponse::Ok().json(refund),
        None => not_found("no such refund"),
    }
}

#[derive(Deserialize)]
pub(super) struct DisputeListQuery {
    /// Unix seconds.
    created_gte: Option<i64>,
    limit: Option<usize>,
    starting_after: Option<String>,
}

/// `GET /v1/disputes?created_gte=&limit=&starting_after=`: newest first, `limit` 1 to 100
/// (10 by default), as at Stripe.
pub(super) async fn list_disputes(
    state: web::Data<MockState>,
    query: web::Query<DisputeListQuery>,
) -> HttpResponse {
    let limit = query.limit.unwrap_or(10);
    if !(1..=100).contains(&limit) {
        return bad_request("limit must be 1 to 100");
    }
    respond(state.with_ledger(|ledger| {
        ledger.list_disputes(query.created_gte, limit, query.starting_after.as_deref())
    }))
}

/// `GET /v1/disputes/{id}`, and `GET /_admin/disputes/{id}` (the mock's own view on either wire)
pub(super) async fn get_dispute(state: web::Data<MockState>, id: web::Path<String>) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.dispute_by_id(&id)) {
        Some(dispute) => HttpResponse::Ok().json(dispute),
        None => not_found("no such dispute"),
    }
}

/// `POST /v1/disputes/{id}` with `{evidence?, submit?}`
pub(super) async fn update_dispute(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let (key, body) = match (idempotency_key(&request), optional_json::<UpdateDisputeBody>(&body)) {
        (Ok(key), Ok(body)) => (key, body),
        (Err(reply), _) | (_, Err(reply)) => return respond(reply),
    };
    let id = id.into_inner();
    script::act(state, &key.clone(), move |ledger, hold| {
        ledger.update_dispute(&id, &key, body, Utc::now(), hold)
    })
    .await
}

/// `POST /v1/disputes/{id}/close` (an empty body, or `{}`): the merchant accepts the dispute.
pub(super) async fn close_dispute(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let key = match (idempotency_key(&request), optional_json::<CloseDisputeBody>(&body)) {
        (Ok(key), Ok(_)) => key,
        (Err(reply), _) | (_, Err(reply)) => return respond(reply),
    };
    let id = id.into_inner();
    script::act(state, &key.clone(), move |ledger, hold| ledger.close_dispute(&id, &key, Utc::now(), hold))
        .await
}

/// `POST /_admin/disputes` with `{charge, reason, amount?, inquiry?, evidence_due_in_secs?}`:
/// the customer's bank disputes a captured charge.
pub(super) async fn open_dispute(state: web::Data<MockState>, body: web::Json<OpenDispute>) -> HttpResponse {
    let body = body.into_inner();
    respond(state.with_ledger(|ledger| ledger.open_dispute(body, Utc::now())))
}

/// `POST /_admin/disputes/{id}/decide` with `{"outcome": "won" | "lost"}`
pub(super) async fn decide_dispute(
    state: web::Data<MockState>,
    id: web::Path<String>,
    body: web::Json<Decision>,
) -> HttpResponse {
    respond(state.with_ledger(|ledger| ledger.decide_dispute(&id, &body, Utc::now())))
}

fn not_found(message: &str) -> HttpResponse {
    respond(Reply::error(StatusCode::NOT_FOUND, "invalid_request", Some("resource_missing"), message))
}

/// `GET /_admin/charges`: every charge received, oldest first.
pub(super) async fn list_charges(state: web::Data<MockState>) -> HttpResponse {
    let charges = state.with_ledger(|ledger| ledger.admin_charges(Utc::now()));
    HttpResponse::Ok().json(json!({ "data": charges }))
}

/// `GET /_admin/disputes`: every dispute, oldest first, as the mock's contract shows it.
pub(super) async fn list_all_disputes(state: web::Data<MockState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "data": state.with_ledger(|ledger| ledger.all_disputes()) }))
}

/// `GET /_admin/refunds`: every refund made, oldest first.
pub(super) async fn list_refunds(state: web::Data<MockState>) -> HttpResponse {
    let refunds = state.with_ledger(|ledger| ledger.admin_refunds(Utc::now()));
    HttpResponse::Ok().json(json!({ "data": refunds }))
}

/// `GET /v1/balance_transactions`: the settlement records, newest first.
pub(super) async fn list_balance_transactions(
    state: web::Data<MockState>,
    query: web::Query<BalanceListQuery>,
) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.balance_transactions(&query, Utc::now())) {
        Ok(page) => HttpResponse::Ok().json(page),
        Err(message) => bad_request(&message),
    }
}

/// `POST /_admin/balance_transactions`: the provider reports a movement nothing made.
pub(super) async fn inject_balance_transaction(
    state: web::Data<MockState>,
    body: web::Json<InjectedMovement>,
) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.inject_movement(body.into_inner(), Utc::now())) {
        Ok(movement) => HttpResponse::Created().json(movement),
        Err(message) => bad_request(&message),
    }
}

/// `DELETE /_admin/balance_transactions/{id}`: the provider stops reporting a movement.
pub(super) async fn hide_balance_transaction(
    state: web::Data<MockState>,
    id: web::Path<String>,
) -> HttpResponse {
    if state.with_ledger(|ledger| ledger.hide_movement(&id)) {
        HttpResponse::NoContent().finish()
    } else {
        not_found("no such balance transaction")
    }
}

/// `POST /_admin/balance_transactions/generate`: seeded movements for the benchmark.
pub(super) async fn generate_balance_transactions(
    state: web::Data<MockState>,
    body: web::Json<Generate>,
) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.generate_movements(&body)) {
        Ok(count) => HttpResponse::Created().json(json!({ "generated": count })),
        Err(message) => bad_request(&message),
    }
}

/// `GET /_admin/webhooks`: every event with its delivery attempts, oldest first.
pub(super) async fn list_webhooks(state: web::Data<MockState>) -> HttpResponse {
    match &state.webhooks {
        Some(webhooks) => HttpResponse::Ok().json(webhooks.list()),
        None => HttpResponse::Ok().json(json!({ "data": [] })),
    }
}

/// `POST /_admin/webhooks/{id}/deliver`: sends that event once, now (with `webhooks_by_hand`,
/// the only way an event leaves); answers the receiver's status (`null`: no answer).
pub(super) async fn deliver_webhook(state: web::Data<MockState>, id: web::Path<String>) -> HttpResponse {
    let Some(webhooks) = &state.webhooks else {
        return not_found("webhooks are off");
    };
    match webhooks.deliver_now(&id).await {
        Ok(status) => HttpResponse::Ok().json(json!({ "status": status })),
        Err(message) => not_found(message),
    }
}

/// `GET /_admin/faults`
pub(super) async fn get_faults(state: web::Data<MockState>) -> HttpResponse {
    HttpResponse::Ok().json(state.with_ledger(|ledger| ledger.faults.clone()))
}

/// `POST /_admin/faults` with any of `{latency_ms, timeout_rate, error_rate,
/// webhook_duplicate_rate, webhook_drop_rate, webhook_delay_ms}`; `{}` clears them.
pub(super) async fn set_faults(state: web::Data<MockState>, faults: web::Json<Faults>) -> HttpResponse {
    let faults = faults.into_inner();
    if let Err(message) = faults.validate() {
        return bad_request(message);
    }
    state.with_ledger(|ledger| ledger.faults = faults.clone());
    HttpResponse::Ok().json(faults)
}

/// `GET /_admin/script`: the scripted writes not taken yet.
pub(super) async fn get_script(state: web::Data<MockState>) -> HttpResponse {
    HttpResponse::Ok().json(state.with_script(|script| script.remaining()))
}

/// `POST /_admin/script` with a list of [`Scripted`] steps: what the mock does with each next
/// write, in order, instead of the random faults; `[]` clears it.
pub(super) async fn set_script(state: web::Data<MockState>, steps: web::Json<Vec<Scripted>>) -> HttpResponse {
    let steps = steps.into_inner();
    match state.with_script(|script| script.set(steps.clone())) {
        Ok(()) => HttpResponse::Ok().json(steps),
        Err(message) => bad_request(message),
    }
}

/// `GET /_admin/parked`: the idempotency keys of the writes parked by the script, oldest first.
pub(super) async fn list_parked(state: web::Data<MockState>) -> HttpResponse {
    HttpResponse::Ok().json(state.with_script(|script| script.parked_keys()))
}

/// `POST /_admin/parked/{key}/act`: the provider acts, now, on the oldest write parked under
/// `key` (its sender stopped waiting long ago); `POST /_admin/parked/{key}/drop`: it never will.
/// Answers how many it acted on or dropped (0 or 1).
pub(super) async fn unpark(state: web::Data<MockState>, path: web::Path<(String, String)>) -> HttpResponse {
    let (key, what) = path.into_inner();
    if what != "act" && what != "drop" {
        return not_found("act or drop");
    }
    let parked = state.with_script(|script| script.unpark(&key));
    let count = usize::from(parked.is_some());
    if let Some((_, operation)) = parked.filter(|_| what == "act") {
        state.with_ledger(|ledger| operation(ledger, false));
    }
    HttpResponse::Ok().json(json!({ what: count }))
}

/// `POST /_admin/due/{key}/{what}`: what the clock would do to the charge or refund written
/// under `key` happens now, with its event: `settle` a pending charge (captured, or authorized
/// for a later capture), `settle_refund` a pending refund, `expire` an authorization, `reverse`
/// a succeeded refund. Answers how many it changed (0 or 1).
pub(super) async fn by_hand(state: web::Data<MockState>, path: web::Path<(String, String)>) -> HttpResponse {
    let (key, what) = path.into_inner();
    let Ok(what) = serde_json::from_value::<ByHand>(json!(what)) else {
        return not_found("settle, settle_refund, expire or reverse");
    };
    let changed = state.with_ledger(|ledger| ledger.by_hand(&key, what, Utc::now()));
    HttpResponse::Ok().json(json!({ "changed": usize::from(changed.is_some()) }))
}

/// `GET /_admin/requests`: how many writes (POST) and lookups (GET) `/v1/*` received.
pub(super) async fn count_requests(state: web::Data<MockState>) -> HttpResponse {
    let (writes, lookups) = state.requests();
    HttpResponse::Ok().json(json!({ "writes": writes, "lookups": lookups }))
}
