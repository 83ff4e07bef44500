//! The mock's Stripe wire (`orderpay mock-provider --wire stripe`): the same ledger, script and
//! faults as the mock's own contract, behind the subset of Stripe's API the Stripe adapter calls
//! (docs/providers.md): form-encoded writes with `Idempotency-Key`, PaymentIntents created and
//! confirmed in one call, their capture and cancel, refunds, disputes and their evidence,
//! balance transactions, and listings newest first with `limit` and `starting_after`.
//!
//! This module only translates. A request's form becomes the mock's request body, the ledger
//! acts exactly as on the mock's wire (so every payment method, fault and script step means the
//! same), and the answer is rendered as Stripe renders it: amounts in minor units, a charge as
//! its PaymentIntent (`pi_` and the charge's own id, `ch_`, share their suffix), a decline as
//! Stripe's 402 `card_error`, a refusal under Stripe's codes and statuses (a state conflict is
//! 400 `payment_intent_unexpected_state`, never 409, which at Stripe means "still running"), a
//! reused key as 400 `idempotency_error`. Unknown form parameters are refused, as Stripe does,
//! so that the adapter cannot drift from what it was proven with.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::handlers::{self, request_id};
use super::ledger::{BalanceListQuery, Ledger, Reply};
use super::{MockState, respond, script};
use crate::money::{Amount, Currency};
use crate::provider::stripe::STRIPE_VERSION;
use crate::provider::stripe::amount::{from_minor_units, to_minor_units};
use crate::provider::stripe::form::{PAYMENT_ID_METADATA, REFUND_ID_METADATA};
use crate::provider::wire::{
    BalanceTransactionBody, CaptureChargeBody, ChargeBody, CreateChargeBody, CreateRefundBody, DisputeBody,
    EventBody, EventObject, RefundBody, UpdateDisputeBody, charge_status, event_type,
};
use crate::{payments, refunds};

/// The routes of the Stripe wire under `/v1`.
pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/balance", web::get().to(balance))
        .route("/payment_intents", web::post().to(create_payment_intent))
        .route("/payment_intents", web::get().to(list_payment_intents))
        .route("/payment_intents/search", web::get().to(search_payment_intents))
        .route("/payment_intents/{id}", web::get().to(get_payment_intent))
        .route("/payment_intents/{id}/capture", web::post().to(capture_payment_intent))
        .route("/payment_intents/{id}/cancel", web::post().to(cancel_payment_intent))
        .route("/refunds", web::post().to(create_refund))
        .route("/refunds", web::get().to(list_refunds))
        .route("/refunds/{id}", web::get().to(get_refund))
        .route("/disputes", web::get().to(list_disputes))
        .route("/disputes/{id}", web::get().to(get_dispute))
        .route("/disputes/{id}", web::post().to(update_dispute))
        .route("/disputes/{id}/close", web::post().to(close_dispute))
        .route("/balance_transactions", web::get().to(list_balance_transactions));
}

/// A form body or a query string: its fields in order (a list's `expand[]` may repeat).
struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(bytes: &[u8]) -> Fields {
        Fields(url::form_urlencoded::parse(bytes).into_owned().collect())
    }

    fn of_query(request: &HttpRequest) -> Fields {
        Fields::parse(request.query_string().as_bytes())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(field, _)| field == name).map(|(_, value)| value.as_str())
    }

    fn expands(&self, path: &str) -> bool {
        self.0.iter().any(|(field, value)| field == "expand[]" && value == path)
    }

    /// Refuses any field not in `known`, as Stripe does (`parameter_unknown`).
    fn only(&self, known: &[&str]) -> Result<(), Reply> {
        match self.0.iter().find(|(field, _)| !known.contains(&field.as_str())) {
            Some((field, _)) => Err(Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_unknown"),
                &format!("Received unknown parameter: {field}"),
            )),
            None => Ok(()),
        }
    }

    fn required(&self, name: &str) -> Result<&str, Reply> {
        self.get(name).ok_or_else(|| {
            Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_missing"),
                &format!("Missing required param: {name}."),
            )
        })
    }
}

fn invalid(message: &str) -> Reply {
    Reply::error(StatusCode::BAD_REQUEST, "invalid_request_error", None, message)
}

fn missing(what: &str) -> Reply {
    let message = format!("No such {what}");
    Reply::error(StatusCode::NOT_FOUND, "invalid_request_error", Some("resource_missing"), &message)
}

/// The idempotency key of a write, as the mock's wire requires it (Stripe makes it optional;
/// the adapter always sends one, and the mock's replay is keyed by it).
fn idempotency_key(request: &HttpRequest) -> Result<String, Reply> {
    handlers::idempotency_key(request).map_err(|refused| render(refused, false))
}

/// The currency of the charge `charge_id`, which Stripe's minor units of a capture or refund
/// are counted in.
fn currency_of_charge(state: &MockState, charge_id: &str) -> Result<Currency, Reply> {
    let currency = state.with_ledger(|ledger| ledger.charge_by_id(charge_id, Utc::now()).map(|c| c.currency));
    currency_of(
        &currency.ok_or_else(|| missing(&format!("payment_intent: '{}'", payment_intent_id(charge_id))))?,
    )
}

/// A PaymentIntent's id for the charge `ch_...`, and back.
fn payment_intent_id(charge_id: &str) -> String {
    charge_id.strip_prefix("ch_").map_or_else(|| charge_id.to_owned(), |rest| format!("pi_{rest}"))
}

fn charge_id(payment_intent_id: &str) -> String {
    payment_intent_id
        .strip_prefix("pi_")
        .map_or_else(|| payment_intent_id.to_owned(), |rest| format!("ch_{rest}"))
}

/// A mock amount (`"12.50"` in `currency`) in Stripe's minor units; 0 when it cannot be read
/// (never: the ledger wrote it).
fn minor(text: &str, currency: &str) -> i64 {
    Currency::parse(currency)
        .ok()
        .and_then(|currency| Amount::parse(text, currency).ok())
        .and_then(|amount| to_minor_units(&amount).ok())
        .unwrap_or(0)
}

/// Stripe's minor units in `currency` as the mock's amount text.
fn major(minor_units: &str, currency: Currency) -> Result<String, Reply> {
    let units: i64 = minor_units.parse().map_err(|_| invalid("amount must be an integer"))?;
    let amount = from_minor_units(units, currency).map_err(|error| invalid(&error.to_string()))?;
    Ok(amount.value().to_string())
}

fn currency_of(text: &str) -> Result<Currency, Reply> {
    Currency::parse(&text.to_ascii_uppercase()).map_err(|error| invalid(&format!("currency: {error}")))
}

fn reference(key: &str, id: &str) -> Value {
    json!({ key: id })
}

/// A charge as its PaymentIntent, the latest charge expanded or not.
fn payment_intent(charge: &ChargeBody, expand_charge: bool) -> Value {
    let currency = charge.currency.as_str();
    let amount = minor(&charge.amount, currency);
    let captured = minor(&charge.amount_captured, currency);
    let (status, charge_status, last_payment_error) = match charge.status.as_str() {
        charge_status::SUCCEEDED => ("succeeded", "succeeded", Value::Null),
        charge_status::REQUIRES_CAPTURE => ("requires_capture", "succeeded", Value::Null),
        charge_status::PENDING => ("processing", "pending", Value::Null),
        charge_status::CANCELED => ("canceled", "succeeded", Value::Null),
        _ => (
            "requires_payment_method",
            "failed",
            json!({
                "type": "card_error",
                "code": "card_declined",
                "decline_code": charge.decline_code,
                "message": charge.failure_message,
            }),
        ),
    };
    let cancellation_reason = match charge.cancellation_reason.as_deref() {
        Some("authorization_expired") => json!("automatic"),
        Some(_) => json!("requested_by_customer"),
        None => Value::Null,
    };
    let latest_charge = if expand_charge {
        json!({
            "id": charge.id,
            "object": "charge",
            "amount": amount,
            "amount_captured": captured,
            "amount_refunded": minor(&charge.amount_refunded, currency),
            "captured": charge.captured,
            "status": charge_status,
            "payment_intent": payment_intent_id(&charge.id),
            "payment_method_details": {
                "type": "card",
                "card": { "capture_before": charge.authorization_expires_at.map(|at| at.timestamp()) },
            },
        })
    } else {
        json!(charge.id)
    };
    json!({
        "id": payment_intent_id(&charge.id),
        "object": "payment_intent",
        "amount": amount,
        "amount_received": captured,
        "currency": currency.to_ascii_lowercase(),
        "status": status,
        "capture_method": if charge.status == charge_status::REQUIRES_CAPTURE { "manual" } else { "automatic" },
        "cancellation_reason": cancellation_reason,
        "latest_charge": latest_charge,
        "last_payment_error": last_payment_error,
        "metadata": reference(PAYMENT_ID_METADATA, &charge.reference),
        "livemode": false,
        "created": charge.created_at.timestamp(),
    })
}

fn refund(refund: &RefundBody) -> Value {
    json!({
        "id": refund.id,
        "object": "refund",
        "amount": minor(&refund.amount, &refund.currency),
        "currency": refund.currency.to_ascii_lowercase(),
        "status": refund.status,
        "payment_intent": payment_intent_id(&refund.charge),
        "charge": refund.charge,
        "failure_reason": refund.failure_code,
        "metadata": reference(REFUND_ID_METADATA, &refund.reference),
        "created": refund.created_at.timestamp(),
    })
}

/// A dispute: the money it moved as Stripe lists it, its balance transactions.
fn dispute(dispute: &DisputeBody) -> Value {
    let currency = dispute.currency.as_str();
    let withdrawn = minor(&dispute.amount_withdrawn, currency);
    let reinstated = minor(&dispute.amount_reinstated, currency);
    let movements: Vec<Value> = [-withdrawn, reinstated]
        .into_iter()
        .filter(|amount| *amount != 0)
        .map(|amount| json!({ "object": "balance_transaction", "amount": amount }))
        .collect();
    json!({
        "id": dispute.id,
        "object": "dispute",
        "amount": minor(&dispute.amount, currency),
        "currency": currency.to_ascii_lowercase(),
        "charge": dispute.charge,
        "payment_intent": payment_intent_id(&dispute.charge),
        "reason": dispute.reason,
        "status": dispute.status,
        "evidence": { "uncategorized_text": dispute.evidence },
        "evidence_details": {
            "due_by": dispute.evidence_due_by.map(|at| at.timestamp()),
            "submission_count": dispute.submission_count,
        },
        "balance_transactions": movements,
        "created": dispute.created_at.timestamp(),
    })
}

/// A balance transaction with its source expanded: the charge (its PaymentIntent and our
/// payment's id), the refund (our refund's id) or the dispute (its PaymentIntent, nothing of ours).
fn balance_transaction(movement: &BalanceTransactionBody, ledger: &mut Ledger, expand_intent: bool) -> Value {
    let key = movement.source_idempotency_key.as_deref().unwrap_or("");
    // The PaymentIntent of a charge or a dispute, expanded when asked (`data.source.payment_intent`).
    let intent = |charge_id: &str| {
        let id = payment_intent_id(charge_id);
        match payments::payment_of_downstream_key(key) {
            Some(payment) if expand_intent => json!({
                "id": id,
                "object": "payment_intent",
                "metadata": reference(PAYMENT_ID_METADATA, &payment.to_string()),
            }),
            _ => json!(id),
        }
    };
    let source = match movement.source.split_once('_').map(|(prefix, _)| prefix) {
        Some("re") => json!({
            "id": movement.source,
            "object": "refund",
            "metadata": refunds::refund_of_downstream_key(key)
                .map_or_else(|| json!({}), |id| reference(REFUND_ID_METADATA, &id.to_string())),
        }),
        Some("dp") => json!({
            "id": movement.source,
            "object": "dispute",
            "payment_intent": ledger.charge_by_key(key, Utc::now()).map(|charge| intent(&charge.id)),
        }),
        _ => json!({
            "id": movement.source,
            "object": "charge",
            "payment_intent": intent(&movement.source),
            "metadata": payments::payment_of_downstream_key(key)
                .map_or_else(|| json!({}), |id| reference(PAYMENT_ID_METADATA, &id.to_string())),
        }),
    };
    let currency = movement.currency.as_str();
    let magnitude = minor(movement.amount.trim_start_matches('-'), currency);
    json!({
        "id": movement.id,
        "object": "balance_transaction",
        "amount": if movement.amount.starts_with('-') { -magnitude } else { magnitude },
        "currency": currency.to_ascii_lowercase(),
        "reporting_category": movement.reporting_category,
        "source": source,
        "created": movement.created.timestamp(),
    })
}

/// A webhook event of the mock's as Stripe sends it: its type in Stripe's words and its object
/// as Stripe's events carry it (a PaymentIntent's latest charge as an id, not expanded).
pub(super) fn event(event: &EventBody) -> Value {
    let (kind, object) = match &event.data.object {
        EventObject::Charge(charge) => {
            let kind = match event.kind.as_str() {
                event_type::CHARGE_FAILED => "payment_intent.payment_failed",
                event_type::CHARGE_CANCELED => "payment_intent.canceled",
                _ if charge.status == charge_status::REQUIRES_CAPTURE => {
                    "payment_intent.amount_capturable_updated"
                }
                _ if charge.status == charge_status::PENDING => "payment_intent.processing",
                _ => "payment_intent.succeeded",
            };
            (kind, payment_intent(charge, false))
        }
        EventObject::Refund(body) => {
            let kind =
                if event.kind == event_type::REFUND_FAILED { "refund.failed" } else { "refund.updated" };
            (kind, refund(body))
        }
        // Stripe's dispute events have the mock's names.
        EventObject::Dispute(body) => (event.kind.as_str(), dispute(body)),
    };
    json!({
        "id": event.id,
        "object": "event",
        "api_version": STRIPE_VERSION,
        "created": event.created,
        "livemode": false,
        "type": kind,
        "data": { "object": object },
    })
}

/// The mock's answer as Stripe gives it: an object rendered, a refusal under Stripe's status and
/// code, a declined PaymentIntent as the 402 Stripe answers its confirmation with.
fn render(reply: Reply, expand_charge: bool) -> Reply {
    let Reply { status, body, hold } = reply;
    let object = body.get("object").and_then(Value::as_str).unwrap_or("");
    let rendered = match object {
        "charge" => serde_json::from_value::<ChargeBody>(body.clone()).ok().map(|charge| {
            let intent = payment_intent(&charge, expand_charge);
            if charge.status == charge_status::DECLINED {
                let error = json!({ "error": {
                    "type": "card_error",
                    "code": "card_declined",
                    "decline_code": charge.decline_code,
                    "message": charge.failure_message,
                    "payment_intent": intent,
                }});
                (StatusCode::PAYMENT_REQUIRED, error)
            } else {
                (status, intent)
            }
        }),
        "refund" => {
            serde_json::from_value::<RefundBody>(body.clone()).ok().map(|body| (status, refund(&body)))
        }
        "dispute" => {
            serde_json::from_value::<DisputeBody>(body.clone()).ok().map(|body| (status, dispute(&body)))
        }
        _ => None,
    };
    match rendered {
        Some((status, body)) => Reply { status, body, hold },
        None if body.get("error").is_some() => Reply { hold, ..render_error(status, &body["error"]) },
        None => Reply { status, body, hold },
    }
}

/// A refusal of the mock's in Stripe's words.
fn render_error(status: StatusCode, error: &Value) -> Reply {
    let kind = error["type"].as_str().unwrap_or("api_error");
    let code = error["code"].as_str();
    let message = error["message"].as_str().unwrap_or("");
    match (kind, code) {
        ("card_error", Some("authorization_expired")) => Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("charge_expired_for_capture"),
            message,
        ),
        ("card_error", code) => Reply {
            status: StatusCode::PAYMENT_REQUIRED,
            body: json!({ "error": {
                "type": "card_error", "code": "card_declined", "decline_code": code, "message": message,
            }}),
            hold: false,
        },
        ("idempotency_error", _) => Reply::error(StatusCode::BAD_REQUEST, "idempotency_error", None, message),
        ("invalid_request", Some("charge_canceled" | "charge_not_capturable" | "charge_not_cancelable")) => {
            Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("payment_intent_unexpected_state"),
                message,
            )
        }
        ("invalid_request", code) => {
            // 404 stays; every other refusal is Stripe's 400 (its 409 means "still running").
            let status = if status == StatusCode::NOT_FOUND { status } else { StatusCode::BAD_REQUEST };
            Reply::error(status, "invalid_request_error", code, message)
        }
        (kind, code) => Reply::error(status, kind, code, message),
    }
}

/// `GET /v1/balance`: what `orderpay provider check` asks to learn the key's mode.
async fn balance() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "object": "balance", "livemode": false, "available": [], "pending": [] }))
}

/// `POST /v1/payment_intents`, created and confirmed at once.
async fn create_payment_intent(
    state: web::Data<MockState>,
    request: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let fields = Fields::parse(&body);
    let parsed = (|| {
        fields.only(&[
            "amount",
            "currency",
            "confirm",
            "payment_method",
            "payment_method_types[]",
            "capture_method",
            "expand[]",
            &format!("metadata[{PAYMENT_ID_METADATA}]"),
        ])?;
        let key = idempotency_key(&request)?;
        if fields.get("confirm") != Some("true") {
            return Err(invalid("the mock confirms at creation only: confirm=true"));
        }
        let currency = currency_of(fields.required("currency")?)?;
        let capture = match fields.get("capture_method").unwrap_or("automatic") {
            "automatic" | "automatic_async" => true,
            "manual" => false,
            other => return Err(invalid(&format!("Invalid capture_method: {other}"))),
        };
        let charge = CreateChargeBody {
            amount: major(fields.required("amount")?, currency)?,
            currency: currency.code().to_owned(),
            payment_method: fields.required("payment_method")?.to_owned(),
            reference: fields.get(&format!("metadata[{PAYMENT_ID_METADATA}]")).unwrap_or("").to_owned(),
            capture,
        };
        Ok((key, charge))
    })();
    let (key, charge) = match parsed {
        Ok(parsed) => parsed,
        Err(reply) => return respond(reply),
    };
    let expand = fields.expands("latest_charge");
    let request_id = request_id(&request);
    script::act_rendering(
        state,
        &key.clone(),
        move |ledger, hold| ledger.create_charge(&key, charge, request_id, Utc::now(), hold),
        move |reply| render(reply, expand),
    )
    .await
}

/// `GET /v1/payment_intents/{id}`
async fn get_payment_intent(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let expand = Fields::of_query(&request).expands("latest_charge");
    match state.with_ledger(|ledger| ledger.charge_by_id(&charge_id(&id), Utc::now())) {
        Some(charge) => HttpResponse::Ok().json(payment_intent(&charge, expand)),
        None => respond(missing(&format!("payment_intent: '{id}'"))),
    }
}

/// `POST /v1/payment_intents/{id}/capture` with `amount_to_capture` (all when absent).
async fn capture_payment_intent(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let fields = Fields::parse(&body);
    let charge = charge_id(&id);
    let parsed = (|| {
        fields.only(&["amount_to_capture", "expand[]"])?;
        let key = idempotency_key(&request)?;
        let currency = currency_of_charge(&state, &charge)?;
        let amount = fields.get("amount_to_capture").map(|units| major(units, currency)).transpose()?;
        Ok((key, CaptureChargeBody { amount, currency: None }))
    })();
    let (key, capture) = match parsed {
        Ok(parsed) => parsed,
        Err(reply) => return respond(reply),
    };
    let expand = fields.expands("latest_charge");
    script::act_rendering(
        state,
        &key.clone(),
        move |ledger, hold| ledger.capture(&charge, &key, capture, Utc::now(), hold),
        move |reply| render(reply, expand),
    )
    .await
}

/// `POST /v1/payment_intents/{id}/cancel`
async fn cancel_payment_intent(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let fields = Fields::parse(&body);
    let key = match fields.only(&["expand[]", "cancellation_reason"]).and_then(|()| idempotency_key(&request))
    {
        Ok(key) => key,
        Err(reply) => return respond(reply),
    };
    let charge = charge_id(&id);
    let expand = fields.expands("latest_charge");
    script::act_rendering(
        state,
        &key.clone(),
        move |ledger, hold| ledger.cancel(&charge, &key, Utc::now(), hold),
        move |reply| render(reply, expand),
    )
    .await
}

/// `POST /v1/refunds` of part or all of a PaymentIntent.
async fn create_refund(state: web::Data<MockState>, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let fields = Fields::parse(&body);
    let parsed = (|| {
        fields.only(&["payment_intent", "amount", &format!("metadata[{REFUND_ID_METADATA}]")])?;
        let key = idempotency_key(&request)?;
        let charge = charge_id(fields.required("payment_intent")?);
        let currency = currency_of_charge(&state, &charge)?;
        let refund = CreateRefundBody {
            amount: major(fields.required("amount")?, currency)?,
            charge,
            currency: None,
            reference: fields.get(&format!("metadata[{REFUND_ID_METADATA}]")).unwrap_or("").to_owned(),
        };
        Ok((key, refund))
    })();
    let (key, refund) = match parsed {
        Ok(parsed) => parsed,
        Err(reply) => return respond(reply),
    };
    let request_id = request_id(&request);
    script::act_rendering(
        state,
        &key.clone(),
        move |ledger, hold| ledger.create_refund(&key, refund, request_id, Utc::now(), hold),
        |reply| render(reply, false),
    )
    .await
}

/// `GET /v1/refunds/{id}`
async fn get_refund(state: web::Data<MockState>, id: web::Path<String>) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.refund_by_id(&id, Utc::now())) {
        Some(body) => HttpResponse::Ok().json(refund(&body)),
        None => respond(missing(&format!("refund: '{id}'"))),
    }
}

/// A page of `items` (newest first) after `starting_after`, at most `limit` (1 to 100, 10 by
/// default), as Stripe pages its listings.
fn page(items: Vec<Value>, fields: &Fields) -> Result<Value, Reply> {
    let limit = match fields.get("limit") {
        None => 10,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|limit| (1..=100).contains(limit))
            .ok_or_else(|| invalid("limit must be an integer from 1 to 100"))?,
    };
    let start = match fields.get("starting_after") {
        None => 0,
        Some(after) => {
            let position = items.iter().position(|item| item["id"] == after);
            position.map(|at| at + 1).ok_or_else(|| missing(&format!("object: '{after}'")))?
        }
    };
    let has_more = items.len() > start + limit;
    let data: Vec<Value> = items.into_iter().skip(start).take(limit).collect();
    Ok(json!({ "object": "list", "data": data, "has_more": has_more }))
}

/// The `created[...]` bound `name` of a listing, in unix seconds, if given.
fn unix_seconds(fields: &Fields, name: &str) -> Result<Option<i64>, Reply> {
    fields
        .get(name)
        .map(|text| text.parse::<i64>().map_err(|_| invalid(&format!("{name} must be unix seconds"))))
        .transpose()
}

/// A listing's window on `created`: `created[gte]` and `created[lte]`, both ends included.
struct CreatedWindow {
    gte: Option<i64>,
    lte: Option<i64>,
}

impl CreatedWindow {
    /// The window of a listing whose query may hold only the window and `others`.
    fn of(fields: &Fields, others: &[&str]) -> Result<Self, Reply> {
        let allowed: Vec<&str> = ["created[gte]", "created[lte]"].iter().chain(others).copied().collect();
        fields.only(&allowed)?;
        Ok(CreatedWindow {
            gte: unix_seconds(fields, "created[gte]")?,
            lte: unix_seconds(fields, "created[lte]")?,
        })
    }

    fn holds(&self, created: DateTime<Utc>) -> bool {
        let created = created.timestamp();
        self.gte.is_none_or(|gte| created >= gte) && self.lte.is_none_or(|lte| created <= lte)
    }
}

fn listing(items: Vec<Value>, fields: &Fields) -> HttpResponse {
    match page(items, fields) {
        Ok(page) => HttpResponse::Ok().json(page),
        Err(reply) => respond(reply),
    }
}

/// `GET /v1/payment_intents?created[gte]=&created[lte]=&limit=&starting_after=&expand[]=data.latest_charge`,
/// newest first.
async fn list_payment_intents(state: web::Data<MockState>, request: HttpRequest) -> HttpResponse {
    let fields = Fields::of_query(&request);
    let window = match CreatedWindow::of(&fields, &["limit", "starting_after", "expand[]"]) {
        Ok(window) => window,
        Err(reply) => return respond(reply),
    };
    let expand = fields.expands("data.latest_charge");
    let charges = state.with_ledger(|ledger| ledger.all_charges(Utc::now()));
    let in_window = charges.iter().rev().filter(|charge| window.holds(charge.created_at));
    listing(in_window.map(|charge| payment_intent(charge, expand)).collect(), &fields)
}

/// `GET /v1/payment_intents/search?query=metadata['orderpay_payment_id']:'<id>'`: Stripe's
/// Search, eventually consistent: a PaymentIntent created less than `search_lag` ago is not in
/// it yet. Only that query is understood (the one a search for our payment would make). The
/// Stripe adapter never searches (its lookups list, which never lags); this is here so that a
/// client that does can be shown what the lag costs.
async fn search_payment_intents(state: web::Data<MockState>, request: HttpRequest) -> HttpResponse {
    let fields = Fields::of_query(&request);
    if let Err(reply) = fields.only(&["query", "limit", "page", "expand[]"]) {
        return respond(reply);
    }
    let prefix = format!("metadata['{PAYMENT_ID_METADATA}']:'");
    let wanted = match fields.get("query").and_then(|query| query.strip_prefix(&prefix)?.strip_suffix('\'')) {
        Some(reference) => reference.to_owned(),
        None => return respond(invalid(&format!("the mock searches only by {prefix}<id>'"))),
    };
    let indexed_before = Utc::now() - state.settings.search_lag;
    let expand = fields.expands("data.latest_charge");
    let charges = state.with_ledger(|ledger| ledger.all_charges(Utc::now()));
    let data: Vec<Value> = charges
        .iter()
        .rev()
        .filter(|charge| charge.reference == wanted && charge.created_at <= indexed_before)
        .map(|charge| payment_intent(charge, expand))
        .collect();
    HttpResponse::Ok().json(json!({
        "object": "search_result",
        "url": "/v1/payment_intents/search",
        "data": data,
        "has_more": false,
        "next_page": null,
    }))
}

/// `GET /v1/refunds?payment_intent=&created[gte]=&created[lte]=&limit=&starting_after=`, newest
/// first.
async fn list_refunds(state: web::Data<MockState>, request: HttpRequest) -> HttpResponse {
    let fields = Fields::of_query(&request);
    let window = match CreatedWindow::of(&fields, &["limit", "starting_after", "payment_intent"]) {
        Ok(window) => window,
        Err(reply) => return respond(reply),
    };
    let of = fields.get("payment_intent").map(charge_id);
    let all = state.with_ledger(|ledger| ledger.all_refunds(Utc::now()));
    let refunds = all.iter().rev().filter(|body| {
        of.as_ref().is_none_or(|charge| &body.charge == charge) && window.holds(body.created_at)
    });
    listing(refunds.map(refund).collect(), &fields)
}

/// `GET /v1/disputes?created[gte]=&limit=&starting_after=`, newest first.
async fn list_disputes(state: web::Data<MockState>, request: HttpRequest) -> HttpResponse {
    let fields = Fields::of_query(&request);
    let since = fields
        .only(&["created[gte]", "limit", "starting_after"])
        .and_then(|()| unix_seconds(&fields, "created[gte]"));
    let since = match since {
        Ok(since) => since,
        Err(reply) => return respond(reply),
    };
    let disputes = state.with_ledger(|ledger| ledger.all_disputes());
    let newest_first = disputes
        .iter()
        .rev()
        .filter(|body| since.is_none_or(|since| body.created_at.timestamp() >= since))
        .map(dispute);
    listing(newest_first.collect(), &fields)
}

/// `GET /v1/disputes/{id}`
async fn get_dispute(state: web::Data<MockState>, id: web::Path<String>) -> HttpResponse {
    match state.with_ledger(|ledger| ledger.dispute_by_id(&id)) {
        Some(body) => HttpResponse::Ok().json(dispute(&body)),
        None => respond(missing(&format!("dispute: '{id}'"))),
    }
}

/// `POST /v1/disputes/{id}` with `evidence[uncategorized_text]` and `submit`.
async fn update_dispute(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let fields = Fields::parse(&body);
    let key = match fields
        .only(&["evidence[uncategorized_text]", "submit"])
        .and_then(|()| idempotency_key(&request))
    {
        Ok(key) => key,
        Err(reply) => return respond(reply),
    };
    let update = UpdateDisputeBody {
        evidence: fields.get("evidence[uncategorized_text]").map(str::to_owned),
        submit: fields.get("submit") == Some("true"),
    };
    let id = id.into_inner();
    script::act_rendering(
        state,
        &key.clone(),
        move |ledger, hold| ledger.update_dispute(&id, &key, update, Utc::now(), hold),
        |reply| render(reply, false),
    )
    .await
}

/// `POST /v1/disputes/{id}/close`: the merchant accepts the dispute.
async fn close_dispute(
    state: web::Data<MockState>,
    request: HttpRequest,
    id: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let fields = Fields::parse(&body);
    let key = match fields.only(&[]).and_then(|()| idempotency_key(&request)) {
        Ok(key) => key,
        Err(reply) => return respond(reply),
    };
    let id = id.into_inner();
    script::act_rendering(
        state,
        &key.clone(),
        move |ledger, hold| ledger.close_dispute(&id, &key, Utc::now(), hold),
        |reply| render(reply, false),
    )
    .await
}

/// `GET /v1/balance_transactions?created[gte]=&created[lt]=&limit=&starting_after=&expand[]=data.source`
async fn list_balance_transactions(state: web::Data<MockState>, request: HttpRequest) -> HttpResponse {
    let fields = Fields::of_query(&request);
    if let Err(reply) = fields.only(&["created[gte]", "created[lt]", "limit", "starting_after", "expand[]"]) {
        return respond(reply);
    }
    let time = |name: &str| -> Result<Option<chrono::DateTime<Utc>>, Reply> {
        fields
            .get(name)
            .map(|text| {
                text.parse::<i64>()
                    .ok()
                    .and_then(|unix| chrono::DateTime::from_timestamp(unix, 0))
                    .ok_or_else(|| invalid(&format!("{name} must be unix seconds")))
            })
            .transpose()
    };
    let limit = fields.get("limit").map(str::parse::<usize>);
    let query = match (time("created[gte]"), time("created[lt]"), limit.transpose()) {
        (Ok(created_gte), Ok(created_lt), Ok(limit)) => BalanceListQuery {
            created_gte,
            created_lt,
            limit,
            starting_after: fields.get("starting_after").map(str::to_owned),
        },
        (Err(reply), _, _) | (_, Err(reply), _) => return respond(reply),
        (_, _, Err(_)) => return respond(invalid("limit must be an integer from 1 to 100")),
    };
    let expand_intent = fields.expands("data.source.payment_intent");
    let page = state.with_ledger(|ledger| {
        let page = ledger.balance_transactions(&query, Utc::now())?;
        let data: Vec<Value> =
            page.data.iter().map(|movement| balance_transaction(movement, ledger, expand_intent)).collect();
        Ok::<_, String>(json!({ "object": "list", "data": data, "has_more": page.has_more }))
    });
    match page {
        Ok(page) => HttpResponse::Ok().json(page),
        Err(message) => respond(invalid(&message)),
    }
}

/// The expanded and unexpanded renderings the adapter reads, by field.
#[cfg(test)]
mod tests {
    use super::*;

    fn charge(status: &str) -> ChargeBody {
        ChargeBody {
            id: "ch_abc".into(),
            object: "charge".into(),
            idempotency_key: "orderpay_pay_x".into(),
            amount: "12.50".into(),
            currency: "USD".into(),
            status: status.into(),
            captured: status == "succeeded",
            amount_captured: if status == "succeeded" { "12.50".into() } else { "0.00".into() },
            amount_refunded: "0.00".into(),
            payment_method: "pm_card_ok".into(),
            reference: "0190-x".into(),
            decline_code: (status == "declined").then(|| "insufficient_funds".into()),
            failure_message: None,
            cancellation_reason: None,
            authorization_expires_at: None,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn a_charge_reads_back_through_the_adapter_as_the_same_charge() {
        use crate::provider::ChargeStatus;
        use crate::provider::stripe::objects::PaymentIntentObject;
        let read = |status: &str| {
            let intent: PaymentIntentObject =
                serde_json::from_value(payment_intent(&charge(status), true)).unwrap();
            intent.to_charge().unwrap()
        };
        let succeeded = read("succeeded");
        assert_eq!((succeeded.id.as_str(), &succeeded.status), ("pi_abc", &ChargeStatus::Succeeded));
        assert_eq!(succeeded.amount_captured, rust_decimal::Decimal::new(1250, 2));
        assert_eq!(read("requires_capture").status, ChargeStatus::RequiresCapture);
        assert_eq!(read("pending").status, ChargeStatus::Pending);
        assert!(
            matches!(read("declined").status, ChargeStatus::Declined { code, .. } if code == "insufficient_funds")
        );
    }

    #[test]
    fn refusals_take_stripe_s_statuses_and_codes() {
        let conflict = json!({"type": "invalid_request", "code": "charge_canceled", "message": "m"});
        let rendered = render_error(StatusCode::CONFLICT, &conflict);
        assert_eq!(rendered.status, StatusCode::BAD_REQUEST, "409 means in progress at Stripe");
        assert_eq!(rendered.body["error"]["code"], "payment_intent_unexpected_state");
        let reused = json!({"type": "idempotency_error", "message": "m"});
        assert_eq!(render_error(StatusCode::UNPROCESSABLE_ENTITY, &reused).status, StatusCode::BAD_REQUEST);
        let expired = json!({"type": "card_error", "code": "authorization_expired", "message": "m"});
        assert_eq!(
            render_error(StatusCode::PAYMENT_REQUIRED, &expired).body["error"]["code"],
            "charge_expired_for_capture"
        );
        let down = json!({"type": "api_error", "message": "m"});
        assert_eq!(
            render_error(StatusCode::SERVICE_UNAVAILABLE, &down).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn a_declined_confirmation_is_a_402_naming_its_payment_intent() {
        let body = serde_json::to_value(charge("declined")).unwrap();
        let reply = Reply { status: StatusCode::CREATED, body, hold: false };
        let rendered = render(reply, true);
        assert_eq!(rendered.status, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(rendered.body["error"]["decline_code"], "insufficient_funds");
        assert_eq!(rendered.body["error"]["payment_intent"]["id"], "pi_abc");
    }
}
