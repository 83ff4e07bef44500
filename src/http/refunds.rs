//! `/refunds`: the request DTO, its validation, and the handlers. The refund representation
//! lives in `refunds::representation`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AppState;
use super::auth::Authenticated;
use super::body::{self, JsonBody};
use super::idempotency::{KeyedWrite, respond_answer};
use crate::error::{ApiError, FieldError};
use crate::ids::{PaymentId, RefundId};
use crate::refunds::RefundReason;
use crate::refunds::representation::RefundResource;
use crate::refunds::service::{self, RefundCommand};

/// `POST /refunds` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRefundRequest {
    payment_id: String,
    /// What to give back; all that is still refundable when left out. Read as written, before
    /// deserialising (see `payments::written_amount`); declared for its shape.
    #[serde(rename = "amount")]
    _amount: Option<Value>,
    reason: Option<String>,
}

/// `GET /refunds` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRefundsQuery {
    payment_id: Option<String>,
    limit: Option<String>,
    starting_after: Option<String>,
}

fn parse_refund_command(body: Value) -> Result<RefundCommand, ApiError> {
    let amount = super::payments::written_amount(Some(&body), "amount");
    let request: CreateRefundRequest = body::deserialize(body)?;
    let mut errors = Vec::new();
    let payment_id = PaymentId::parse(&request.payment_id)
        .ok_or_else(|| errors.push(FieldError::new("payment_id", "must be a payment id (a UUID)")))
        .ok();
    let amount = match amount {
        Ok(amount) => amount,
        Err(ApiError::Validation(mut more)) => {
            errors.append(&mut more);
            None
        }
        Err(other) => return Err(other),
    };
    let reason = match request.reason.as_deref() {
        None => None,
        Some(text) => RefundReason::parse(text).map(Some).unwrap_or_else(|| {
            errors.push(FieldError::new(
                "reason",
                "must be one of \"requested_by_customer\", \"duplicate\", \"fraudulent\"",
            ));
            None
        }),
    };
    match payment_id {
        Some(payment_id) if errors.is_empty() => Ok(RefundCommand { payment_id, amount, reason }),
        _ => Err(ApiError::Validation(errors)),
    }
}

/// `POST /refunds`: `Idempotency-Key` required.
pub async fn create(write: KeyedWrite, JsonBody(body): JsonBody) -> Result<HttpResponse, ApiError> {
    let keyed = write.bind("/refunds", Some(&body))?;
    let command = parse_refund_command(body)?;
    let answer =
        service::create(&write.state.engine, &write.state.keys, &keyed, &command, &write.request_id.0)
            .await?;
    Ok(respond_answer(answer))
}

/// `GET /refunds/{id}`
pub async fn get(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let refund =
        service::get(&state.engine, account.id, super::parse_id("refund", &id, RefundId::parse)?).await?;
    Ok(HttpResponse::Ok().json(RefundResource::from(&refund)))
}

/// `GET /refunds?payment_id=&limit=&starting_after=`
pub async fn list(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = web::Query::<ListRefundsQuery>::from_query(request.query_string())
        .map_err(|error| ApiError::InvalidParameter(format!("invalid query string: {error}")))?
        .into_inner();
    let limit = super::page_limit(query.limit.as_deref())?;
    let payment_id = query
        .payment_id
        .as_deref()
        .map(|text| {
            PaymentId::parse(text)
                .ok_or_else(|| ApiError::InvalidParameter("payment_id must be a payment id".into()))
        })
        .transpose()?;
    let starting_after = query
        .starting_after
        .as_deref()
        .map(|text| {
            RefundId::parse(text)
                .ok_or_else(|| ApiError::InvalidParameter("starting_after must be a refund id".into()))
        })
        .transpose()?;
    let (refunds, has_more) =
        service::list(&state.engine, account.id, payment_id, limit, starting_after).await?;
    #[derive(Serialize)]
    struct Page<'a> {
        object: &'static str,
        data: Vec<RefundResource<'a>>,
        has_more: bool,
    }
    let page = Page { object: "list", data: refunds.iter().map(RefundResource::from).collect(), has_more };
    Ok(HttpResponse::Ok().json(page))
}
