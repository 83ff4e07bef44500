//! Per-request observability: the request id, the request's tracing span, the access log line
//! and the HTTP metrics.
//!
//! Every request gets an `X-Request-Id`: the client's, when it sent a sane one, or a new UUIDv7.
//! It is echoed on the response, carried by every log line of the request (they are all inside
//! its span, including the payment task it spawns), and forwarded to the payment provider.

use std::future::{Ready, ready};
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use tracing::Instrument;
use uuid::Uuid;

use crate::error::ApiError;
use crate::telemetry::metrics;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// This request's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

impl RequestId {
    /// The client's id if it is 1 to 128 visible ASCII characters, else a new one.
    fn for_request(headers: &HeaderMap) -> RequestId {
        headers
            .get(X_REQUEST_ID)
            .and_then(|value| value.to_str().ok())
            .filter(|id| (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic()))
            .map(|id| RequestId(id.to_owned()))
            .unwrap_or_else(|| RequestId(Uuid::now_v7().to_string()))
    }
}

impl FromRequest for RequestId {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let id = request.extensions().get::<RequestId>().cloned();
        ready(Ok(id.unwrap_or_else(|| RequestId(Uuid::now_v7().to_string()))))
    }
}

/// The outermost middleware: it sees every request and the final response.
pub async fn observe(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = RequestId::for_request(request.headers());
    request.extensions_mut().insert(request_id.clone());
    let method = request.method().clone();
    let span =
        tracing::info_span!("request", request_id = %request_id.0, method = %method, path = %request.path());
    let mut response = next.call(request).instrument(span.clone()).await?;
    let status = response.status().as_u16();
    // The route pattern (`/orders/{id}`), known once routing ran, keeps label cardinality bounded.
    let route = response.request().match_pattern().unwrap_or_else(|| "unmatched".to_owned());
    let elapsed = started.elapsed();
    metrics::http_request(method.as_str(), &route, status, elapsed.as_secs_f64());
    span.in_scope(|| {
        tracing::info!(status, route = %route, latency_ms = elapsed.as_secs_f64() * 1000.0, "request served");
    });
    if let Ok(value) = HeaderValue::from_str(&request_id.0) {
        response.headers_mut().insert(X_REQUEST_ID, value);
    }
    Ok(response)
}
