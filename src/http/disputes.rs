//! `GET /disputes` and `GET /disputes/{id}`: the account's disputes as the provider reported
//! them (`disputes`), newest first.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::AppState;
use super::auth::Authenticated;
use crate::disputes::DisputeStatus;
use crate::disputes::repository::{self, Filter};
use crate::disputes::representation::DisputeResource;
use crate::error::ApiError;
use crate::ids::PaymentId;

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
