//! `POST /provider/webhooks`: the payment provider's signed events. The route exists only when
//! `ORDERPAY_PROVIDER_WEBHOOK_SECRET` is set; how a message is signed follows the provider's
//! wire: Standard Webhooks for the mock (`webhook_signature`), `Stripe-Signature` for Stripe
//! (`provider::stripe::signature`).
//!
//! The signature is the authentication (no API key): the headers (and, for Standard Webhooks,
//! the timestamp) are checked before the body is read, the MAC over the body's raw bytes before
//! they are parsed, and a message that fails any check is refused with 400
//! `webhook-signature-invalid`, having changed nothing. The provider's wire reads a verified
//! event into the engine's `Event`, which `operations::webhooks` applies; the answer is 2xx only
//! once its effect committed, and 503 with `Retry-After` when the database failed, so that the
//! provider retries.

use std::time::Duration;

use actix_web::http::header::HeaderName;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde_json::{Value, json};

use super::AppState;
use super::body::UnreadBody;
use crate::config::ProviderWebhookSecrets;
use crate::error::{ApiError, FieldError};
use crate::operations::webhooks::{self, Event};
use crate::provider::stripe::{WebhookSecret, events as stripe_events, signature as stripe_signature};
use crate::provider::wire;
use crate::telemetry::metrics;
use crate::webhook_signature::{self, Secret, SignatureError};

/// How far a message's timestamp may be from our clock: the scheme's advice, and what bounds a
/// replay of a captured message.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const STRIPE_SIGNATURE: HeaderName = HeaderName::from_static("stripe-signature");

/// The longest event id kept (the dedup row's key).
const MAX_ID: usize = 255;

/// `POST /provider/webhooks`
pub async fn receive(
    state: web::Data<AppState>,
    request: HttpRequest,
    body: UnreadBody,
) -> Result<HttpResponse, ApiError> {
    let verified = match &state.settings.provider_webhooks {
        ProviderWebhookSecrets::Stripe(secrets) => verified_stripe_event(secrets, &request, body).await,
        other => verified_event(other.standard(), &request, body).await,
    };
    let event = match verified {
        Ok(event) => event,
        Err(refused) => {
            metrics::provider_webhook("rejected");
            tracing::warn!(problem = refused.problem_type(), detail = %refused, "provider webhook refused");
            return Err(refused);
        }
    };
    let received = webhooks::receive(&state.engine, &event).await.map_err(|error| {
        // Whatever failed, nothing was committed: the provider retries on anything but a 2xx,
        // and 503 with Retry-After says so.
        match ApiError::from(error) {
            ApiError::Internal(cause) => {
                tracing::error!(error = ?cause, event_id = %event.id, "a provider webhook could not be applied");
                ApiError::Unavailable(cause)
            }
            other => other,
        }
    })?;
    Ok(HttpResponse::Ok().json(json!({ "result": received.as_str() })))
}

/// A Standard Webhooks event (the mock's), once its headers, timestamp and signature are
/// checked (in that order, the body read only after the first two), and its body read.
async fn verified_event(
    secrets: &[Secret],
    request: &HttpRequest,
    body: UnreadBody,
) -> Result<Event, ApiError> {
    let invalid = |error: SignatureError| ApiError::WebhookSignatureInvalid(error.to_string());
    let id = header(request, &WEBHOOK_ID)?;
    let timestamp = header(request, &WEBHOOK_TIMESTAMP)?;
    let signature = header(request, &WEBHOOK_SIGNATURE)?;
    if id.len() > MAX_ID {
        return Err(ApiError::WebhookSignatureInvalid(format!("webhook-id is longer than {MAX_ID} bytes")));
    }
    let now = Utc::now();
    webhook_signature::check_timestamp(timestamp, now, TOLERANCE).map_err(invalid)?;
    let bytes = body.read().await?;
    webhook_signature::verify(secrets, id, timestamp, signature, &bytes, now, TOLERANCE).map_err(invalid)?;
    let value: Value = super::body::parse_json(&bytes)?;
    wire::read_event(id.to_owned(), value).map_err(unreadable)
}

/// A Stripe event, once its `Stripe-Signature` is checked over the body's raw bytes (timestamp
/// within the tolerance, one `v1` matching one of our endpoint secrets), then read. The event's
/// id is in its body (`evt_...`): the same on every delivery of it.
async fn verified_stripe_event(
    secrets: &[WebhookSecret],
    request: &HttpRequest,
    body: UnreadBody,
) -> Result<Event, ApiError> {
    let signature = header(request, &STRIPE_SIGNATURE)?;
    let bytes = body.read().await?;
    stripe_signature::verify(secrets, Some(signature), &bytes, Utc::now(), TOLERANCE)
        .map_err(|error| ApiError::WebhookSignatureInvalid(error.to_string()))?;
    let value: Value = super::body::parse_json(&bytes)?;
    stripe_events::read_event(value).map_err(unreadable)
}

/// A verified event the wire cannot read: 422, so that a person looks (its retries change nothing).
fn unreadable(message: String) -> ApiError {
    ApiError::Validation(vec![FieldError::new("body", message)])
}

/// A signature header, present once, as text.
fn header<'r>(request: &'r HttpRequest, name: &HeaderName) -> Result<&'r str, ApiError> {
    let mut values = request.headers().get_all(name);
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok().filter(|value| !value.is_empty()).ok_or_else(|| {
            ApiError::WebhookSignatureInvalid(format!("the {name} header is not visible ASCII"))
        }),
        (Some(_), Some(_)) => Err(ApiError::WebhookSignatureInvalid(format!("more than one {name} header"))),
        (None, _) => Err(ApiError::WebhookSignatureInvalid(format!("the {name} header is missing"))),
    }
}
