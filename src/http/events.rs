//! `/events`: the account's events, newest first, and one event. The representation lives with
//! the events (`events::Event::to_json`).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::AppState;
use super::auth::Authenticated;
use crate::error::ApiError;
use crate::events::{EventType, repository};
use crate::ids::EventId;

/// `GET /events` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListEventsQuery {
    #[serde(rename = "type")]
    event_type: Option<String>,
    limit: Option<String>,
    starting_after: Option<String>,
}

/// `GET /events?type=&limit=&starting_after=`
pub async fn list(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListEventsQuery = super::list_query(&request)?;
    let limit = super::page_limit(query.limit.as_deref())?;
    let event_type = super::parameter(query.event_type.as_deref(), EventType::parse, || {
        format!("unknown event type {:?}", query.event_type.as_deref().unwrap_or_default())
    })?;
    let starting_after = super::page_cursor(query.starting_after.as_deref(), "an event", EventId::parse)?;
    let mut conn = state.pool.get().await?;
    let (events, has_more) =
        repository::list(&mut conn, account.id, event_type, limit, starting_after).await?;
    // The page is assembled from each event's JSON as stored (see `Event::to_json`).
    let mut body = b"{\"object\":\"list\",\"data\":[".to_vec();
    for (index, event) in events.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&event.to_json());
    }
    body.extend_from_slice(format!("],\"has_more\":{has_more}}}").as_bytes());
    Ok(HttpResponse::Ok().content_type("application/json").body(body))
}

/// `GET /events/{id}`
pub async fn get(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let event_id = super::parse_id("event", &id, EventId::parse)?;
    let mut conn = state.pool.get().await?;
    let event = repository::find(&mut conn, account.id, event_id)
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "event", id: event_id.to_string() })?;
    Ok(HttpResponse::Ok().content_type("application/json").body(event.to_json()))
}
