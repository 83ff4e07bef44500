//! `/payments`: the request DTO, its validation, and the handlers. The payment representation
//! lives in `payments::representation` (the reconciler renders final answers too).

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::auth::Authenticated;
use super::body::{self, JsonBody};
use super::idempotency::{IdempotencyHeader, respond};
use super::observe::RequestId;
use crate::app::AppState;
use crate::error::{ApiError, FieldError};
use crate::payments::PaymentMethod;
use crate::payments::representation::{location, payment_json};
use crate::payments::service::{self, PayCommand, PayResult};

/// `POST /payments` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePaymentRequest {
    order_id: String,
    payment_method: String,
    /// Optional; when given it must equal the order's total (a guard against paying a stale
    /// amount). A decimal string or a JSON number, taken as its exact text.
    amount: Option<Value>,
}

fn parse_pay_command(body: Value) -> Result<PayCommand, ApiError> {
    // The amount as written (see `orders::decimal_text`); the struct checks the shape.
    let written_amount = body.get("amount").cloned();
    let request: CreatePaymentRequest = body::deserialize(body)?;
    let mut errors = Vec::new();
    let order_id = Uuid::try_parse(&request.order_id)
        .map_err(|_| errors.push(FieldError::new("order_id", "must be an order id (a UUID)")))
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
    match (order_id, payment_method) {
        (Some(order_id), Some(payment_method)) if errors.is_empty() => {
            Ok(PayCommand { order_id, payment_method, amount })
        }
        _ => Err(ApiError::Validation(errors)),
    }
}

/// `POST /payments`: `Idempotency-Key` required.
pub async fn create(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    key: IdempotencyHeader,
    request: HttpRequest,
    request_id: RequestId,
    JsonBody(body): JsonBody,
) -> Result<HttpResponse, ApiError> {
    let keyed = key
        .bind(account.id, &request, "/payments", Some(&body), true)?
        .ok_or(ApiError::IdempotencyKeyMissing)?;
    let command = parse_pay_command(body)?;
    match service::pay(&state.payments, account.id, &keyed, &command, &request_id.0).await? {
        PayResult::Answered(execution) => Ok(respond(execution, true)),
        // Not stored: a retry with the same key resumes the payment and gets its final answer.
        PayResult::Processing(payment) => Ok(HttpResponse::Accepted()
            .content_type("application/json")
            .insert_header((header::LOCATION, location(&payment)))
            .insert_header((header::RETRY_AFTER, "2"))
            .body(payment_json(&payment))),
    }
}

/// `GET /payments/{id}`
pub async fn get(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let payment_id = super::parse_id("payment", &id)?;
    let payment = service::get(&state.pool, account.id, payment_id).await?;
    Ok(HttpResponse::Ok().content_type("application/json").body(payment_json(&payment)))
}
