//! The HTTP surface: the only module that knows actix-web. Routes, extractors (authentication,
//! `Idempotency-Key`, JSON bodies), request DTOs and response representations. Handlers turn
//! requests into domain calls and domain results into responses; they never build SQL.

pub mod auth;
pub mod balance_transactions;
pub mod body;
pub mod disputes;
pub mod docs;
pub mod events;
pub mod health;
pub mod idempotency;
pub mod observe;
pub mod orders;
pub mod payments;
pub mod refunds;
pub mod webhook_endpoints;
pub mod webhooks;

use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::{ErrorHandlerResponse, Next};
use actix_web::{HttpRequest, HttpResponse, Resource, web};
use serde_json::json;

use crate::accounts::AccountCache;
use crate::config::ApiSettings;
use crate::db::Pool;
use crate::error::{ApiError, PROBLEM_JSON};
use crate::idempotency::IdempotencyKey;
use crate::idempotency::Keys;
use crate::merchant_webhooks::WebhookSettings;
use crate::operations::Engine;
use crate::rate_limit::RateLimiter;
use crate::telemetry::Observability;

/// Per-worker state handed to every handler.
pub struct AppState {
    /// This worker's database pool (built on the worker's thread).
    pub pool: Pool,
    /// The provider-operations engine, on the same pool.
    pub engine: Engine,
    /// Key retention and the in-memory copies of final answers, shared by all workers.
    pub keys: Keys,
    pub settings: Arc<ApiSettings>,
    pub observability: Arc<Observability>,
    pub accounts: Arc<AccountCache>,
    pub rate_limiter: Arc<RateLimiter>,
}

/// Registers every route. Each resource answers an unsupported method with 405 and `Allow`.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(resource("/orders", "GET, POST").post(orders::create).get(orders::list))
        .service(resource("/orders/{id}", "GET").get(orders::get))
        .service(resource("/orders/{id}/cancel", "POST").post(orders::cancel))
        .service(resource("/payments", "GET, POST").post(payments::create).get(payments::list))
        .service(resource("/payments/{id}", "GET").get(payments::get))
        .service(resource("/payments/{id}/capture", "POST").post(payments::capture))
        .service(resource("/payments/{id}/void", "POST").post(payments::void))
        .service(resource("/refunds", "GET, POST").post(refunds::create).get(refunds::list))
        .service(resource("/refunds/{id}", "GET").get(refunds::get))
        .service(resource("/balance_transactions", "GET").get(balance_transactions::list))
        .service(resource("/disputes", "GET").get(disputes::list))
        .service(resource("/disputes/{id}", "GET").get(disputes::get))
        .service(resource("/disputes/{id}/evidence", "POST").post(disputes::evidence))
        .service(resource("/disputes/{id}/accept", "POST").post(disputes::accept))
        .service(resource("/events", "GET").get(events::list))
        .service(resource("/events/{id}", "GET").get(events::get))
        .service(resource("/healthz", "GET").get(health::healthz))
        .service(resource("/readyz", "GET").get(health::readyz))
        .service(resource("/openapi.yaml", "GET").get(health::openapi))
        .service(resource("/docs", "GET").get(docs::page))
        .service(resource("/docs/{asset}", "GET").get(docs::asset));
}

/// `GET /metrics`, on the API's address unless `ORDERPAY_METRICS_LISTEN` gives it one of its
/// own (then the path is no route here: 404 `route-not-found`). The handler finds its
/// [`health::MetricsSource`] in the app data.
pub fn metrics_routes(config: &mut web::ServiceConfig, source: web::Data<health::MetricsSource>) {
    config.app_data(source).service(resource("/metrics", "GET").get(health::metrics));
}

/// `POST /provider/webhooks`, registered only when provider webhook secrets are configured:
/// otherwise the path is no route at all (404 `route-not-found`). No API key: the signature is
/// the authentication.
pub fn provider_webhook_routes(config: &mut web::ServiceConfig) {
    config.service(resource("/provider/webhooks", "POST").post(webhooks::receive));
}

/// `/webhook_endpoints`, registered only when merchant webhooks are on (`ORDERPAY_ENCRYPTION_KEY`):
/// otherwise the paths are no routes at all (404 `route-not-found`). The handlers find the
/// settings in the app data.
pub fn webhook_endpoint_routes(config: &mut web::ServiceConfig, settings: web::Data<WebhookSettings>) {
    config
        .app_data(settings)
        .service(
            resource("/webhook_endpoints", "GET, POST")
                .post(webhook_endpoints::create)
                .get(webhook_endpoints::list),
        )
        .service(
            resource("/webhook_endpoints/{id}", "GET, DELETE")
                .get(webhook_endpoints::get)
                .delete(webhook_endpoints::delete),
        )
        .service(
            resource("/webhook_endpoints/{id}/rotate_secret", "POST").post(webhook_endpoints::rotate_secret),
        );
}

/// A resource whose unsupported methods answer 405 `method-not-allowed` with `Allow: allowed`.
fn resource(path: &str, allowed: &'static str) -> Resource {
    web::resource(path).default_service(web::to(move || async move {
        Err::<HttpResponse, _>(ApiError::MethodNotAllowed { allowed })
    }))
}

/// A resource id from the path. A malformed id names no resource: the same 404 as an unknown one.
pub fn parse_id<Id>(
    resource: &'static str,
    raw: &str,
    parse: fn(&str) -> Option<Id>,
) -> Result<Id, ApiError> {
    parse(raw).ok_or_else(|| ApiError::NotFound { resource, id: raw.to_owned() })
}

/// A page size from the `limit` query parameter: 1 to 100, 10 when absent.
pub fn page_limit(text: Option<&str>) -> Result<i64, ApiError> {
    match text {
        None => Ok(10),
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|limit| (1..=100).contains(limit))
            .ok_or_else(|| ApiError::InvalidParameter("limit must be an integer from 1 to 100".into())),
    }
}

/// A list page: `{object: "list", data, has_more}`.
pub fn page<T: serde::Serialize>(data: Vec<T>, has_more: bool) -> HttpResponse {
    #[derive(serde::Serialize)]
    struct Page<T> {
        object: &'static str,
        data: Vec<T>,
        has_more: bool,
    }
    HttpResponse::Ok().json(Page { object: "list", data, has_more })
}

/// The `starting_after` cursor of a list: the id of the `resource` the page starts after.
pub fn page_cursor<Id>(
    text: Option<&str>,
    resource: &str,
    parse: fn(&str) -> Option<Id>,
) -> Result<Option<Id>, ApiError> {
    parameter(text, parse, || format!("starting_after must be {resource} id"))
}

/// A list's query string, or 400 `invalid-parameter` (an unknown or repeated parameter too).
pub fn list_query<Query: serde::de::DeserializeOwned>(request: &HttpRequest) -> Result<Query, ApiError> {
    web::Query::<Query>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|error| ApiError::InvalidParameter(format!("invalid query string: {error}")))
}

/// An optional query parameter read by `parse`, or 400 `invalid-parameter` saying `expected`.
pub fn parameter<T>(
    text: Option<&str>,
    parse: impl Fn(&str) -> Option<T>,
    expected: impl FnOnce() -> String,
) -> Result<Option<T>, ApiError> {
    text.map(|text| parse(text).ok_or_else(|| ApiError::InvalidParameter(expected()))).transpose()
}

/// The app's default service: no route matched.
pub async fn route_not_found(request: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::RouteNotFound { path: request.path().to_owned() })
}

/// Echoes the request's `Idempotency-Key`, as sent, on every response to a request that carried
/// a valid one, whether it succeeded, was replayed or failed. A malformed key (or two keys) is
/// not echoed: whatever bytes a client sent must not be reflected into a response header.
pub async fn echo_idempotency_key(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let mut values = request.headers().get_all(idempotency::IDEMPOTENCY_KEY);
    let key = match (values.next(), values.next()) {
        (Some(value), None) if IdempotencyKey::parse(value.as_bytes()).is_ok() => Some(value.clone()),
        _ => None,
    };
    let mut response = next.call(request).await?;
    idempotency::count_refusal(&response);
    if let Some(key) = key {
        response.headers_mut().insert(idempotency::IDEMPOTENCY_KEY, key);
    }
    Ok(response)
}

/// Turns any error response that is not already problem+json (actix's own: a failed extractor,
/// a timeout) into one, so that every error a client sees has the same shape.
pub fn problem_for_foreign_errors<B>(
    response: ServiceResponse<B>,
) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes() == PROBLEM_JSON.as_bytes());
    if is_problem {
        return Ok(ErrorHandlerResponse::Response(response.map_into_left_body()));
    }
    let status = response.status();
    if let Some(error) = response.response().error()
        && status.is_server_error()
    {
        tracing::error!(error = %error, %status, "unhandled error");
    }
    let (request, old) = response.into_parts();
    let mut problem = HttpResponse::build(status);
    for (name, value) in old.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            problem.append_header((name.clone(), value.clone()));
        }
    }
    let body = foreign_problem_body(status);
    problem.insert_header((header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)));
    let response = ServiceResponse::new(request, problem.body(body)).map_into_right_body::<B>();
    Ok(ErrorHandlerResponse::Response(response))
}

fn foreign_problem_body(status: StatusCode) -> Vec<u8> {
    let problem_type = match status {
        StatusCode::BAD_REQUEST => "bad-request",
        StatusCode::NOT_FOUND => "route-not-found",
        StatusCode::METHOD_NOT_ALLOWED => "method-not-allowed",
        StatusCode::REQUEST_TIMEOUT => "request-timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "payload-too-large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
        status if status.is_server_error() => "internal-error",
        _ => "about:blank",
    };
    let title = status.canonical_reason().unwrap_or("Error");
    let detail = if status.is_server_error() {
        "the server failed to handle the request".to_owned()
    } else {
        format!("the request could not be handled: {title}")
    };
    serde_json::to_vec(&json!({
        "type": problem_type,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    }))
    .unwrap_or_default()
}
