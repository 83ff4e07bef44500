//! `GET /disputes` and `GET /disputes/{id}`: the account's disputes as the provider reported
//! them (`disputes`), newest first; `POST /disputes/{id}/evidence` and `/accept`: the merchant's
//! answer, each a provider operation (`disputes::service`).

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::AppState;
use super::auth::Authenticated;
use super::body::{self, JsonBody, OptionalJsonBody};
use super::idempotency::{KeyedWrite, respond_answer};
use crate::disputes::DisputeStatus;
use crate::disputes::repository::{self, Filter};
use crate::disputes::representation::DisputeResource;
use crate::disputes::responses::ResponseKind;
use crate::disputes::service::{self, RespondCommand};
use crate::error::{ApiError, FieldError};
use crate::ids::PaymentId;
use serde_json::Value;

/// `GET /disputes` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    payment_id: Option<String>,
    due_before: Option<String>,
    limit: Option<String>,
    starting_after: Option<String>,
}

/// `GET /disputes?status=&payment_id=&due_before=&limit=&starting_after=`
pub async fn list(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = super::list_query(&request)?;
    let limit = super::page_limit(query.limit.as_deref())?;
    let filter = Filter {
        status: super::parameter(query.status.as_deref(), DisputeStatus::parse, || {
            format!("unknown dispute status {:?}", query.status.as_deref().unwrap_or_default())
        })?,
        payment_id: super::parameter(query.payment_id.as_deref(), PaymentId::parse, || {
            "payment_id must be a payment id".to_owned()
        })?,
        due_before: super::parameter(
            query.due_before.as_deref(),
            |text| DateTime::parse_from_rfc3339(text).ok().map(|at| at.with_timezone(&Utc)),
            || "due_before must be an RFC 3339 time".to_owned(),
        )?,
    };
    let starting_after =
        super::page_cursor(query.starting_after.as_deref(), "a dispute", |text| Uuid::try_parse(text).ok())?;
    let mut conn = state.pool.get().await?;
    let (disputes, has_more) =
        repository::list(&mut conn, Some(account.id), filter, limit, starting_after).await?;
    let data = disputes.iter().map(DisputeResource::of).collect::<Result<Vec<_>, _>>()?;
    Ok(super::page(data, has_more))
}

/// `GET /disputes/{id}`
pub async fn get(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let dispute_id = super::parse_id("dispute", &id, |text| Uuid::try_parse(text).ok())?;
    let mut conn = state.pool.get().await?;
    let dispute = repository::find(&mut conn, account.id, dispute_id)
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "dispute", id: id.to_string() })?;
    Ok(HttpResponse::Ok().json(DisputeResource::of(&dispute)?))
}

/// The longest evidence text taken, in characters (the column's CHECK says the same).
const EVIDENCE_MAX_CHARS: usize = 20_000;

/// `POST /disputes/{id}/evidence` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceRequest {
    /// What the merchant tells the card network (tracking numbers, correspondence, ...).
    evidence: String,
}

/// `POST /disputes/{id}/accept` body: nothing, or `{}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptRequest {}

/// `POST /disputes/{id}/evidence`: `Idempotency-Key` required. Submits text evidence to the
/// provider, once, before the dispute's `evidence_due_by`.
pub async fn evidence(
    write: KeyedWrite,
    id: web::Path<String>,
    JsonBody(body): JsonBody,
) -> Result<HttpResponse, ApiError> {
    answer(&write, &id, ResponseKind::Evidence, Some(body), |body| {
        let EvidenceRequest { evidence } = body::deserialize(body.unwrap_or_default())?;
        if evidence.trim().is_empty() || evidence.chars().count() > EVIDENCE_MAX_CHARS {
            let message = format!("must be text of 1 to {EVIDENCE_MAX_CHARS} characters");
            return Err(ApiError::Validation(vec![FieldError::new("evidence", message)]));
        }
        Ok(Some(evidence))
    })
    .await
}

/// `POST /disputes/{id}/accept`: `Idempotency-Key` required. Closes the dispute without contest.
pub async fn accept(
    write: KeyedWrite,
    id: web::Path<String>,
    OptionalJsonBody(body): OptionalJsonBody,
) -> Result<HttpResponse, ApiError> {
    answer(&write, &id, ResponseKind::Accept, body, |body| {
        let AcceptRequest {} = body.map(body::deserialize).transpose()?.unwrap_or_default();
        Ok(None)
    })
    .await
}

/// What both answers to a dispute share: the id parsed, the key bound to the route and body,
/// the body read (`evidence_of`: the evidence, if any), and the engine's request flow.
async fn answer(
    write: &KeyedWrite,
    id: &str,
    kind: ResponseKind,
    body: Option<Value>,
    evidence_of: impl FnOnce(Option<Value>) -> Result<Option<String>, ApiError>,
) -> Result<HttpResponse, ApiError> {
    let dispute_id = super::parse_id("dispute", id, |text| Uuid::try_parse(text).ok())?;
    let route = format!("/disputes/{dispute_id}/{kind}");
    let keyed = write.bind(&route, body.as_ref())?;
    let command = RespondCommand { dispute_id, kind, evidence: evidence_of(body)? };
    let state = &write.state;
    let answer = service::respond(&state.engine, &state.keys, &keyed, &command, &write.request_id.0).await?;
    Ok(respond_answer(answer))
}
