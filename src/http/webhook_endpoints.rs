//! `/webhook_endpoints`: request DTOs, their validation, and the handlers. Registered only when
//! merchant webhooks are on (`ORDERPAY_ENCRYPTION_KEY`); the endpoint's representation lives
//! with the domain (`merchant_webhooks::representation`).

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::auth::Authenticated;
use super::body::{self, JsonBody, OptionalJsonBody};
use super::idempotency::{IdempotencyHeader, respond};
use crate::error::{ApiError, FieldError};
use crate::ids::EndpointId;
use crate::merchant_webhooks::representation::{self, EndpointResource};
use crate::merchant_webhooks::service::{self, NewEndpoint};
use crate::merchant_webhooks::{EnabledEvents, EndpointUrl, WebhookSettings};

/// Longest description, in characters.
const DESCRIPTION_CHARS: usize = 500;

/// `POST /webhook_endpoints` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpointRequest {
    url: String,
    enabled_events: Vec<String>,
    #[serde(default)]
    description: Option<String>,
}

/// `POST /webhook_endpoints/{id}/rotate_secret` body: nothing, or an empty object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateSecretRequest {}

/// `GET /webhook_endpoints` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListEndpointsQuery {
    limit: Option<String>,
    starting_after: Option<String>,
}

/// Parses a `POST /webhook_endpoints` body, reporting every invalid field at once.
fn parse_new_endpoint(body: Value) -> Result<NewEndpoint, ApiError> {
    let request: CreateEndpointRequest = body::deserialize(body)?;
    let mut errors = Vec::new();
    let url = EndpointUrl::parse(&request.url).map_err(|error| errors.push(FieldError::new("url", error)));
    let enabled_events = EnabledEvents::parse(&request.enabled_events).map_err(|problems| {
        for (index, problem) in problems {
            let field = index.map_or_else(|| "enabled_events".to_owned(), |i| format!("enabled_events[{i}]"));
            errors.push(FieldError::new(field, problem));
        }
    });
    if let Some(description) = &request.description {
        if description.chars().count() > DESCRIPTION_CHARS {
            errors.push(FieldError::new("description", "must be at most 500 characters"));
        } else if description.chars().any(char::is_control) {
            errors.push(FieldError::new("description", "must not contain control characters"));
        }
    }
    match (url, enabled_events) {
        (Ok(url), Ok(enabled_events)) if errors.is_empty() => {
            Ok(NewEndpoint { url, enabled_events, description: request.description })
        }
        _ => Err(ApiError::Validation(errors)),
    }
}

fn endpoint_id(raw: &str) -> Result<EndpointId, ApiError> {
    super::parse_id("webhook_endpoint", raw, EndpointId::parse)
}

/// `POST /webhook_endpoints`
pub async fn create(
    state: web::Data<AppState>,
    webhooks: web::Data<WebhookSettings>,
    Authenticated(account): Authenticated,
    key: IdempotencyHeader,
    request: HttpRequest,
    JsonBody(body): JsonBody,
) -> Result<HttpResponse, ApiError> {
    let required = state.settings.require_idempotency_key;
    let keyed = key.bind(account.id, &request, "/webhook_endpoints", Some(&body), required)?;
    let new = parse_new_endpoint(body)?;
    let execution =
        service::create(&state.pool, &state.keys, &webhooks, account.id, new, keyed.as_ref()).await?;
    Ok(respond(execution, keyed.is_some()))
}

/// `POST /webhook_endpoints/{id}/rotate_secret`
pub async fn rotate_secret(
    state: web::Data<AppState>,
    webhooks: web::Data<WebhookSettings>,
    Authenticated(account): Authenticated,
    key: IdempotencyHeader,
    request: HttpRequest,
    id: web::Path<String>,
    OptionalJsonBody(body): OptionalJsonBody,
) -> Result<HttpResponse, ApiError> {
    let id = endpoint_id(&id)?;
    let route = format!("/webhook_endpoints/{id}/rotate_secret");
    let required = state.settings.require_idempotency_key;
    let keyed = key.bind(account.id, &request, &route, body.as_ref(), required)?;
    if let Some(body) = body {
        let RotateSecretRequest {} = body::deserialize(body)?;
    }
    let execution =
        service::rotate_secret(&state.pool, &state.keys, &webhooks, account.id, id, keyed.as_ref()).await?;
    Ok(respond(execution, keyed.is_some()))
}

/// `GET /webhook_endpoints/{id}`
pub async fn get(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let endpoint = service::get(&state.pool, account.id, endpoint_id(&id)?).await?;
    Ok(HttpResponse::Ok().json(EndpointResource::from(&endpoint)))
}

/// `DELETE /webhook_endpoints/{id}`
pub async fn delete(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = endpoint_id(&id)?;
    service::delete(&state.pool, account.id, id).await?;
    Ok(HttpResponse::Ok().json(representation::deleted(id)))
}

/// `GET /webhook_endpoints?limit=&starting_after=`
pub async fn list(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = web::Query::<ListEndpointsQuery>::from_query(request.query_string())
        .map_err(|error| ApiError::InvalidParameter(format!("invalid query string: {error}")))?
        .into_inner();
    let limit = super::page_limit(query.limit.as_deref())?;
    let starting_after =
        super::page_cursor(query.starting_after.as_deref(), "a webhook endpoint", EndpointId::parse)?;
    let (endpoints, has_more) = service::list(&state.pool, account.id, limit, starting_after).await?;
    Ok(super::page(endpoints.iter().map(EndpointResource::from).collect(), has_more))
}
