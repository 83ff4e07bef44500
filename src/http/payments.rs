//! `/payments`: the request DTO, its validation, and the handlers. The payment representation
//! lives in `payments::representation` (every driver of a payment renders its final answer).

use actix_web::{HttpRequest, HttpResponse, web};
use rust_decimal::Decimal;
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::auth::Authenticated;
use super::body::{self, JsonBody, OptionalJsonBody};
use super::idempotency::{KeyedWrite, respond_answer};
use crate::error::{ApiError, FieldError};
use crate::ids::{OrderId, PaymentId};
use crate::payments::authorization::Action;
use crate::payments::representation::PaymentResource;
use crate::payments::representation::payment_json;
use crate::payments::service::{self, ActionCommand, PayCommand};
use crate::payments::{CaptureMethod, PaymentMethod, PaymentStatus};

/// `POST /payments` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePaymentRequest {
    order_id: String,
    payment_method: String,
    /// Optional; when given it must equal the order's total (a guard against paying a stale
    /// amount). A decimal string or a JSON number, taken as its exact text.
    amount: Option<Value>,
    /// `automatic` (the default) or `manual` (authorize now, capture later).
    capture_method: Option<String>,
}

/// `POST /payments/{id}/capture` body: nothing, or `{amount?}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    /// Read as written, before deserialising (see `written_amount`); declared for its shape.
    #[serde(rename = "amount")]
    _amount: Option<Value>,
}

/// `GET /payments` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListPaymentsQuery {
    order_id: Option<String>,
    status: Option<String>,
    limit: Option<String>,
    starting_after: Option<String>,
}

/// `POST /payments/{id}/void` body: nothing, or an empty object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoidRequest {}

fn parse_pay_command(body: Value) -> Result<PayCommand, ApiError> {
    // The amount as written (see `orders::decimal_text`); the struct checks the shape.
    let written_amount = body.get("amount").cloned();
    let request: CreatePaymentRequest = body::deserialize(body)?;
    let mut errors = Vec::new();
    let order_id = OrderId::parse(&request.order_id)
        .ok_or_else(|| errors.push(FieldError::new("order_id", "must be an order id (a UUID)")))
        .ok();
    let payment_method = PaymentMethod::parse(&request.payment_method)
        .map_err(|message| errors.push(FieldError::new("payment_method", message)))
        .ok();
    // The same grammar and limits as an order's prices; the precision for the order's currency
    // is checked by the comparison with its total.
    let amount = match request.amount.and(written_amount) {
        None | Some(Value::Null) => None,
        Some(value) => super::orders::decimal_text(&value)
            .ok_or(crate::money::AmountError::Malformed)
            .and_then(|text| crate::money::parse_value(&text))
            .map_err(|error| errors.push(FieldError::new("amount", error)))
            .ok(),
    };
    let capture_method = match request.capture_method.as_deref() {
        None => Some(CaptureMethod::Automatic),
        Some(text) => CaptureMethod::parse(text)
            .ok_or_else(|| {
                errors.push(FieldError::new("capture_method", "must be \"automatic\" or \"manual\""))
            })
            .ok(),
    };
    match (order_id, payment_method, capture_method) {
        (Some(order_id), Some(payment_method), Some(capture_method)) if errors.is_empty() => {
            Ok(PayCommand { order_id, payment_method, amount, capture_method })
        }
        _ => Err(ApiError::Validation(errors)),
    }
}

/// An optional positive amount, read from `body` as written (a decimal string, or a JSON number
/// taken as its exact text, in the grammar of every amount), or a 422 naming the field. Read
/// before the body is deserialised: serde would turn a number into a float on the way.
pub(super) fn written_amount(body: Option<&Value>, field: &str) -> Result<Option<Decimal>, ApiError> {
    let Some(value) = body.and_then(|body| body.get(field)).filter(|value| !value.is_null()) else {
        return Ok(None);
    };
    let invalid = |message: String| ApiError::Validation(vec![FieldError::new(field, message)]);
    let amount = super::orders::decimal_text(value)
        .ok_or(crate::money::AmountError::Malformed)
        .and_then(|text| crate::money::parse_value(&text))
        .map_err(|error| invalid(error.to_string()))?;
    if amount.is_zero() {
        return Err(invalid("must be more than zero".to_owned()));
    }
    Ok(Some(amount))
}

/// `POST /payments`: `Idempotency-Key` required.
pub async fn create(write: KeyedWrite, JsonBody(body): JsonBody) -> Result<HttpResponse, ApiError> {
    let keyed = write.bind("/payments", Some(&body))?;
    let command = parse_pay_command(body)?;
    let answer =
        service::pay(&write.state.engine, &write.state.keys, &keyed, &command, &write.request_id.0).await?;
    Ok(respond_answer(answer))
}

/// `POST /payments/{id}/capture`: `Idempotency-Key` required.
pub async fn capture(
    write: KeyedWrite,
    id: web::Path<String>,
    OptionalJsonBody(body): OptionalJsonBody,
) -> Result<HttpResponse, ApiError> {
    let payment_id = super::parse_id("payment", &id, PaymentId::parse)?;
    let route = format!("/payments/{payment_id}/capture");
    let keyed = write.bind(&route, body.as_ref())?;
    let amount = written_amount(body.as_ref(), "amount")?;
    let CaptureRequest { .. } = body.map(body::deserialize).transpose()?.unwrap_or_default();
    if let Some(amount) = amount {
        service::check_amount(&write.state.engine, write.account.id, payment_id, amount).await?;
    }
    let command = ActionCommand { payment_id, action: Action::Capture, amount };
    let answer =
        service::act(&write.state.engine, &write.state.keys, &keyed, &command, &write.request_id.0).await?;
    Ok(respond_answer(answer))
}

/// `POST /payments/{id}/void`: `Idempotency-Key` required.
pub async fn void(
    write: KeyedWrite,
    id: web::Path<String>,
    OptionalJsonBody(body): OptionalJsonBody,
) -> Result<HttpResponse, ApiError> {
    let payment_id = super::parse_id("payment", &id, PaymentId::parse)?;
    let route = format!("/payments/{payment_id}/void");
    let keyed = write.bind(&route, body.as_ref())?;
    if let Some(body) = body {
        let VoidRequest {} = body::deserialize(body)?;
    }
    let command = ActionCommand { payment_id, action: Action::Void, amount: None };
    let answer =
        service::act(&write.state.engine, &write.state.keys, &keyed, &command, &write.request_id.0).await?;
    Ok(respond_answer(answer))
}

/// `GET /payments/{id}`
pub async fn get(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let payment_id = super::parse_id("payment", &id, PaymentId::parse)?;
    let payment = service::get(&state.engine, account.id, payment_id).await?;
    Ok(HttpResponse::Ok().content_type("application/json").body(payment_json(&payment)))
}

/// `GET /payments?order_id=&status=&limit=&starting_after=`
pub async fn list(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListPaymentsQuery = super::list_query(&request)?;
    let limit = super::page_limit(query.limit.as_deref())?;
    let order_id = super::parameter(query.order_id.as_deref(), OrderId::parse, || {
        "order_id must be an order id".to_owned()
    })?;
    let status = super::parameter(query.status.as_deref(), PaymentStatus::parse, || {
        "status must be processing, requires_capture, succeeded, failed or canceled".to_owned()
    })?;
    let starting_after = super::page_cursor(query.starting_after.as_deref(), "a payment", PaymentId::parse)?;
    let (payments, has_more) =
        service::list(&state.engine, account.id, order_id, status, limit, starting_after).await?;
    Ok(super::page(payments.iter().map(PaymentResource::from).collect(), has_more))
}
