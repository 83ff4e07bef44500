//! The public representation of a webhook endpoint: what `GET /webhook_endpoints/{id}` returns
//! (never a secret), and what creating one and rotating its secret answer: the same with
//! `secret`, the new `whsec_...` in the answer itself, `null` in the copy stored for the
//! `Idempotency-Key` (a replay does not show the secret again).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::Endpoint;
use crate::idempotency::StoredResponse;
use crate::ids::EndpointId;

#[derive(Serialize)]
pub struct EndpointResource<'a> {
    id: EndpointId,
    object: &'static str,
    url: &'a str,
    enabled_events: Vec<&'static str>,
    description: Option<&'a str>,
    /// A plain `http` URL: deliveries cross the network in clear. New ones are refused unless
    /// `ORDERPAY_WEBHOOK_REQUIRE_HTTPS=false`; ones made before keep receiving.
    insecure: bool,
    /// Absent on reads; the new secret, or `null` in a stored answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<Option<&'a str>>,
    previous_secret_expires_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl<'a> From<&'a Endpoint> for EndpointResource<'a> {
    fn from(endpoint: &'a Endpoint) -> Self {
        EndpointResource {
            id: endpoint.id,
            object: "webhook_endpoint",
            url: endpoint.url.as_str(),
            enabled_events: endpoint.enabled_events.names(),
            description: endpoint.description.as_deref(),
            insecure: endpoint.url.is_insecure(),
            secret: None,
            previous_secret_expires_at: endpoint.previous_secret_expires_at,
            created_at: endpoint.created_at,
            updated_at: endpoint.updated_at,
        }
    }
}

fn with_secret(endpoint: &Endpoint, secret: Option<&str>) -> Vec<u8> {
    let resource = EndpointResource { secret: Some(secret), ..EndpointResource::from(endpoint) };
    // Serialising our own plain struct cannot fail.
    serde_json::to_vec(&resource).unwrap_or_default()
}

pub fn location(id: EndpointId) -> String {
    format!("/webhook_endpoints/{id}")
}

/// 201 with the new endpoint and `secret` (`None`: the copy stored for the key).
pub fn created(endpoint: &Endpoint, secret: Option<&str>) -> StoredResponse {
    StoredResponse::json(201, with_secret(endpoint, secret)).with_header("location", location(endpoint.id))
}

/// 200 with the endpoint and its new `secret` (`None`: the copy stored for the key).
pub fn rotated(endpoint: &Endpoint, secret: Option<&str>) -> StoredResponse {
    StoredResponse::json(200, with_secret(endpoint, secret))
}

/// The answer to a deletion.
#[derive(Serialize)]
pub struct Deleted {
    id: EndpointId,
    object: &'static str,
    deleted: bool,
}

pub fn deleted(id: EndpointId) -> Deleted {
    Deleted { id, object: "webhook_endpoint", deleted: true }
}
