//! The `Idempotency-Key` request header and how keyed answers go back to the client.

use std::future::{Future, Ready, ready};
use std::pin::Pin;

use actix_web::dev::{Payload, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::HeaderName;
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use serde_json::Value;

use super::AppState;
use super::auth::Authenticated;
use super::observe::RequestId;
use crate::accounts::Account;
use crate::error::ApiError;
use crate::idempotency::{Execution, Fingerprint, IdempotencyKey, KeyError, KeyedRequest};
use crate::ids::AccountId;
use crate::telemetry::metrics;

pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The parsed `Idempotency-Key` header, if the request carried one. A malformed key is refused
/// (400) before anything runs or is stored.
#[derive(Debug, Clone)]
pub struct IdempotencyHeader(pub Option<IdempotencyKey>);

impl FromRequest for IdempotencyHeader {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let mut values = request.headers().get_all(IDEMPOTENCY_KEY);
        let result = match (values.next(), values.next()) {
            (None, _) => Ok(IdempotencyHeader(None)),
            (Some(_), Some(_)) => {
                Err(ApiError::InvalidIdempotencyKey("send one Idempotency-Key header, not several"))
            }
            (Some(value), None) => IdempotencyKey::parse(value.as_bytes())
                .map(|key| IdempotencyHeader(Some(key)))
                .map_err(|error| ApiError::InvalidIdempotencyKey(key_error_message(error))),
        };
        ready(result)
    }
}

fn key_error_message(error: KeyError) -> &'static str {
    match error {
        KeyError::Empty => "the Idempotency-Key header is empty",
        KeyError::TooLong => "the Idempotency-Key header is longer than 255 characters",
        KeyError::InvalidCharacter => {
            "the Idempotency-Key header may only contain printable ASCII characters (0x21-0x7E)"
        }
        KeyError::MalformedQuotedString => "the Idempotency-Key header is a malformed quoted string",
    }
}

impl IdempotencyHeader {
    /// Binds the key (if any) to this request: account, method, route and body fingerprint.
    /// `route` is the canonical path (ids as parsed, not as typed), so `/orders/{ID}/cancel` in
    /// upper case is the same route as in lower case. `required` refuses a request without a key
    /// (400 `idempotency-key-missing`).
    pub fn bind(
        &self,
        account_id: AccountId,
        request: &HttpRequest,
        route: &str,
        body: Option<&Value>,
        required: bool,
    ) -> Result<Option<KeyedRequest>, ApiError> {
        let Some(key) = &self.0 else {
            return if required { Err(ApiError::IdempotencyKeyMissing) } else { Ok(None) };
        };
        let method = request.method().as_str();
        Ok(Some(KeyedRequest {
            account_id,
            key: key.clone(),
            method: method.to_owned(),
            route: route.to_owned(),
            fingerprint: Fingerprint::of_request(method, route, body),
        }))
    }

    /// [`bind`](Self::bind) for a route that always requires a key (every provider operation).
    pub fn require(
        &self,
        account_id: AccountId,
        request: &HttpRequest,
        route: &str,
        body: Option<&Value>,
    ) -> Result<KeyedRequest, ApiError> {
        self.bind(account_id, request, route, body, true)?.ok_or(ApiError::IdempotencyKeyMissing)
    }
}

/// What the handler of every provider operation (a payment, its capture or void, a refund, a
/// dispute response) extracts before its path and body, in this order: the state, the
/// authenticated account, the `Idempotency-Key` (which these routes require) and the request id.
pub struct KeyedWrite {
    pub state: web::Data<AppState>,
    pub account: Account,
    key: IdempotencyHeader,
    request: HttpRequest,
    pub request_id: RequestId,
}

impl KeyedWrite {
    /// The key bound to this request at `route` (canonical) with `body`; 400 without a key.
    pub fn bind(&self, route: &str, body: Option<&Value>) -> Result<KeyedRequest, ApiError> {
        self.key.require(self.account.id, &self.request, route, body)
    }
}

impl FromRequest for KeyedWrite {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, actix_web::Error>>>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        // The very extractors, polled together as a handler's own arguments are: which refusal
        // wins (a malformed key while an unknown API key is still being looked up, say) is as
        // on every other route.
        let parts =
            <(web::Data<AppState>, Authenticated, IdempotencyHeader, HttpRequest, RequestId)>::from_request(
                request, payload,
            );
        Box::pin(async move {
            let (state, Authenticated(account), key, request, request_id) = parts.await?;
            Ok(KeyedWrite { state, account, key, request, request_id })
        })
    }
}

/// The HTTP answer for an executed or replayed operation: the stored status, headers and body,
/// plus `Idempotent-Replayed: true` and `Orderpay-Should-Retry: false` on a replay (the answer
/// was decided; sending it again replays it again). (The key itself is echoed by middleware.)
/// `keyed` says whether the request carried a key, for the idempotency metrics.
pub fn respond(execution: Execution, keyed: bool) -> HttpResponse {
    let replayed = execution.is_replay();
    if keyed {
        metrics::idempotency_outcome(if replayed { "replayed" } else { "executed" });
    }
    let stored = match execution {
        Execution::Executed(response) | Execution::Replayed(response) => response,
    };
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    for (name, value) in &stored.headers {
        response.insert_header((name.as_str(), value.as_str()));
    }
    if replayed {
        response.insert_header((IDEMPOTENT_REPLAYED, "true"));
        response.insert_header((crate::error::SHOULD_RETRY, "false"));
    }
    response.body(stored.body)
}

/// The HTTP answer of a request for a provider operation: its final answer (stored for the
/// key), or 202 with the operation as it is while its outcome is unknown (not stored: a retry
/// with the same key resumes it), with `Retry-After`.
pub fn respond_answer(answer: crate::operations::request::Answer) -> HttpResponse {
    match answer {
        crate::operations::request::Answer::Final(execution) => respond(execution, true),
        crate::operations::request::Answer::Pending(pending) => {
            let mut response = respond(Execution::Executed(pending), false);
            response.headers_mut().insert(
                actix_web::http::header::RETRY_AFTER,
                actix_web::http::header::HeaderValue::from_static("2"),
            );
            response
        }
    }
}

/// Counts a keyed request that was refused because of its key (422 reused, 409 in use, 400
/// missing): the idempotency outcomes that end in an error rather than in [`respond`].
pub fn count_refusal<B>(response: &ServiceResponse<B>) {
    let outcome = match response.response().error().and_then(|error| error.as_error::<ApiError>()) {
        Some(ApiError::IdempotencyKeyReused(_)) => "reused",
        Some(ApiError::IdempotencyKeyInUse { .. }) => "in_use",
        Some(ApiError::IdempotencyKeyMissing) => "missing",
        _ => return,
    };
    metrics::idempotency_outcome(outcome);
}
