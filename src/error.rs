//! The one error type of the HTTP API and its single mapping to `application/problem+json`
//! (RFC 9457).
//!
//! Every failure a client can see is an [`ApiError`] variant; each variant's doc names its status
//! and its stable problem `type`. Internal causes (database errors, bugs) are logged here and never
//! sent to the client. The same rendering is used when a final business outcome (such as
//! `invalid-state`) is stored with an idempotency key and replayed later.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::idempotency::{KeyConflict, StoredResponse};
use crate::ids::{OrderId, PaymentId, RefundId};
use crate::money::Amount;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// `Orderpay-Should-Retry: true|false`, where the service knows better than a client's table
/// whether sending the same request again can change the answer: `true` on 409
/// `idempotency-key-in-use` and 503, `false` on 422 and on a replayed stored answer.
pub const SHOULD_RETRY: HeaderName = HeaderName::from_static("orderpay-should-retry");

/// One field that failed validation, named by its JSON path (`items[0].quantity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl ToString) -> Self {
        FieldError { field: field.into(), message: message.to_string() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `malformed-json`: the body is not well-formed JSON. Nothing is stored, so the client
    /// may fix the body and reuse its idempotency key.
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),

    /// 415 `unsupported-media-type`: a body that is not `application/json` in UTF-8.
    #[error("the request body must be application/json in UTF-8 (no charset, or charset=utf-8)")]
    UnsupportedMediaType,

    /// 408 `request-timeout`: the request body did not arrive in time. The connection is closed.
    #[error("the request body did not arrive within {} ms", .0.as_millis())]
    RequestTimeout(std::time::Duration),

    /// 400 `webhook-signature-invalid`: a provider webhook whose `webhook-id`,
    /// `webhook-timestamp` or `webhook-signature` is missing or malformed, whose timestamp is
    /// more than 5 minutes away, or whose signature matches none of our secrets. Nothing was
    /// read from its body.
    #[error("the webhook signature is invalid: {0}")]
    WebhookSignatureInvalid(String),

    /// 400 `bad-request`: the request itself is malformed (such as two `Authorization` headers).
    #[error("{0}")]
    BadRequest(&'static str),

    /// 413 `payload-too-large`: the body is over the limit.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },

    /// 422 `validation-failed`: well-formed JSON that does not describe a valid request; every
    /// failing field is listed in `errors`.
    #[error("the request is invalid")]
    Validation(Vec<FieldError>),

    /// 422 `webhook-url-not-allowed`: a webhook endpoint's URL is, or resolves to, an address
    /// webhooks may not go to (private, loopback, link-local, ...). Nothing is stored.
    #[error("{0}")]
    WebhookUrlNotAllowed(String),

    /// 400 `invalid-parameter`: a query-string parameter is malformed or out of range.
    #[error("{0}")]
    InvalidParameter(String),

    /// 401 `unauthorized`: no API key, or one that matches no account.
    #[error("{0}")]
    Unauthorized(&'static str),

    /// 404 `not-found`: no such resource in the caller's account (another account's resource is
    /// indistinguishable from a missing one).
    #[error("no such {resource}: {id}")]
    NotFound { resource: &'static str, id: String },

    /// 404 `route-not-found`: no endpoint at this path.
    #[error("no endpoint at {path}")]
    RouteNotFound { path: String },

    /// 405 `method-not-allowed`, with the `Allow` header.
    #[error("method not allowed here; allowed: {allowed}")]
    MethodNotAllowed { allowed: &'static str },

    /// 400 `idempotency-key-invalid`: the `Idempotency-Key` header is malformed.
    #[error("{0}")]
    InvalidIdempotencyKey(&'static str),

    /// 400 `idempotency-key-missing`: the endpoint requires an `Idempotency-Key`.
    #[error("this endpoint requires an Idempotency-Key header")]
    IdempotencyKeyMissing,

    /// 422 `idempotency-key-reused`: the key was first used for a different method, route or
    /// body. Nothing was executed.
    #[error("{0}")]
    IdempotencyKeyReused(String),

    /// 409 `idempotency-key-in-use`: the first request with this key is still running; retry
    /// after `Retry-After` seconds.
    #[error("a request with this Idempotency-Key is still being processed")]
    IdempotencyKeyInUse { retry_after_secs: u64, resource_id: Option<Uuid> },

    /// 409 `invalid-state`: the resource's current state does not allow the action.
    #[error("{resource} {id} is {current}; it cannot be {action}")]
    InvalidState { resource: &'static str, id: Uuid, current: String, action: &'static str },

    /// 402 `payment-declined`: the provider declined the payment; nothing was charged. A final
    /// answer, stored with the key. The order can be paid again with a new key.
    #[error("the payment was declined: {message}")]
    PaymentDeclined { payment_id: Uuid, code: String, message: String },

    /// 402 `payment-failed`: the payment's outcome could not be established and orderpay gave up
    /// on it (see the reconciler). A final answer, stored with the key.
    #[error("the payment failed: {reason}")]
    PaymentFailed { payment_id: Uuid, reason: String },

    /// 402 `refund-declined`: the provider refused the refund; nothing moved. A final answer,
    /// stored with the key.
    #[error("the refund was declined: {message}")]
    RefundDeclined { refund_id: RefundId, code: String, message: String },

    /// 402 `capture-declined`: the provider refused the capture for a reason other than the
    /// authorization's end; the payment stays `requires_capture`. Stored with the key.
    #[error("the capture was declined: {message}")]
    CaptureDeclined { payment_id: PaymentId, code: String, message: String },

    /// 402 `authorization-expired`: the provider let the authorization go before the capture;
    /// the payment is `canceled` and the order can be paid again. Stored with the key.
    #[error("the authorization of payment {payment_id} expired; nothing was captured")]
    AuthorizationExpired { payment_id: PaymentId },

    /// 402 `capture-failed`, `void-failed` or `refund-failed`: orderpay gave up on the
    /// operation after its last check (the provider never received it; nothing moved). Stored.
    #[error("the {operation} failed: {reason}")]
    OperationFailed { operation: &'static str, id: Uuid, reason: String },

    /// 422 `refund-exceeds-refundable`: more than is still refundable (captured, less what was
    /// refunded or is being refunded). Not stored: in-flight refunds may yet fail.
    #[error("the amount is more than the {refundable_amount} still refundable")]
    RefundExceedsRefundable { refundable_amount: Amount },

    /// 409 `charge-disputed`: more than is still refundable while a dispute of the payment is
    /// open (its money withdrawn by the customer's bank). Not stored: a won dispute gives it back.
    #[error("the payment is disputed; {refundable_amount} is still refundable")]
    ChargeDisputed { refundable_amount: Amount },

    /// 422 `capture-exceeds-capturable`: more than was authorized. Not stored.
    #[error("the amount is more than the {capturable_amount} authorized")]
    CaptureExceedsCapturable { capturable_amount: Amount },

    /// 409 `payment-in-progress`: another payment of this order has an unknown outcome; retry
    /// after `Retry-After` seconds. Not stored.
    #[error("order {order_id} has a payment in progress ({payment_id}); retry when it is settled")]
    PaymentInProgress { order_id: OrderId, payment_id: PaymentId },

    /// 422 `evidence-past-due`: the dispute's evidence was due before the request. Stored with
    /// the key: time does not go back.
    #[error("evidence for dispute {dispute_id} was due by {due_by}")]
    EvidencePastDue { dispute_id: Uuid, due_by: chrono::DateTime<chrono::Utc> },

    /// 409 `dispute-response-in-progress`: another answer to the dispute is in flight; retry
    /// after `Retry-After` seconds (it may have answered for you). Not stored.
    #[error("dispute {dispute_id} has a response in progress ({response_id}); retry when it is settled")]
    DisputeResponseInProgress { dispute_id: Uuid, response_id: Uuid },

    /// 429 `rate-limited`: the account sends more requests than its limit; retry after
    /// `Retry-After` seconds.
    #[error("too many requests for this account; retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },

    /// 503 `provider-unavailable`: the payment provider refused our credentials before acting
    /// on the operation's first send. The operation is recorded and not yet sent: a retry with
    /// the same key sends it (same downstream key), as does the reconciler once the provider
    /// accepts us. Not stored.
    #[error(
        "the payment provider refused our request before acting on it; {resource_id} is recorded, not yet sent: retry with the same Idempotency-Key"
    )]
    ProviderUnavailable { resource_id: Uuid, retry_after_secs: u64 },

    /// 503 `service-unavailable`: a dependency (the database) is unreachable; retry later.
    #[error("the service is temporarily unavailable")]
    Unavailable(#[source] anyhow::Error),

    /// 500 `internal-error`: a bug or an unexpected failure. The cause is logged, not returned.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// The `Content-Type` header of a stored problem answer.
pub fn problem_content_type() -> (String, String) {
    (header::CONTENT_TYPE.to_string(), PROBLEM_JSON.to_owned())
}

/// Whole seconds to put in `Retry-After` for a wait: rounded up (retrying earlier than the wait
/// is pointless) and at least one.
pub fn retry_after_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

impl ApiError {
    /// 409 `idempotency-key-in-use`, to retry after `wait`.
    pub fn key_in_use(wait: std::time::Duration, resource_id: Option<Uuid>) -> ApiError {
        ApiError::IdempotencyKeyInUse { retry_after_secs: retry_after_secs(wait), resource_id }
    }

    /// The stable problem `type` (a relative URI reference that names the problem; clients match
    /// on it) and its title. Details may change wording; these do not.
    pub fn problem_type(&self) -> &'static str {
        self.kind().0
    }

    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::MalformedJson(_) => ("malformed-json", "Malformed JSON"),
            ApiError::UnsupportedMediaType => ("unsupported-media-type", "Unsupported media type"),
            ApiError::RequestTimeout(_) => ("request-timeout", "Request timeout"),
            ApiError::BadRequest(_) => ("bad-request", "Bad request"),
            ApiError::WebhookSignatureInvalid(_) => {
                ("webhook-signature-invalid", "Invalid webhook signature")
            }
            ApiError::PayloadTooLarge { .. } => ("payload-too-large", "Payload too large"),
            ApiError::Validation(_) => ("validation-failed", "Validation failed"),
            ApiError::WebhookUrlNotAllowed(_) => ("webhook-url-not-allowed", "Webhook URL not allowed"),
            ApiError::InvalidParameter(_) => ("invalid-parameter", "Invalid parameter"),
            ApiError::Unauthorized(_) => ("unauthorized", "Unauthorized"),
            ApiError::NotFound { .. } => ("not-found", "Not found"),
            ApiError::RouteNotFound { .. } => ("route-not-found", "Route not found"),
            ApiError::MethodNotAllowed { .. } => ("method-not-allowed", "Method not allowed"),
            ApiError::InvalidIdempotencyKey(_) => ("idempotency-key-invalid", "Invalid Idempotency-Key"),
            ApiError::IdempotencyKeyMissing => ("idempotency-key-missing", "Idempotency-Key missing"),
            ApiError::IdempotencyKeyReused(_) => ("idempotency-key-reused", "Idempotency-Key reused"),
            ApiError::IdempotencyKeyInUse { .. } => ("idempotency-key-in-use", "Idempotency-Key in use"),
            ApiError::InvalidState { .. } => ("invalid-state", "Invalid state"),
            ApiError::PaymentDeclined { .. } => ("payment-declined", "Payment declined"),
            ApiError::PaymentFailed { .. } => ("payment-failed", "Payment failed"),
            ApiError::PaymentInProgress { .. } => ("payment-in-progress", "Payment in progress"),
            ApiError::RefundDeclined { .. } => ("refund-declined", "Refund declined"),
            ApiError::CaptureDeclined { .. } => ("capture-declined", "Capture declined"),
            ApiError::AuthorizationExpired { .. } => ("authorization-expired", "Authorization expired"),
            ApiError::OperationFailed { operation: "capture", .. } => ("capture-failed", "Capture failed"),
            ApiError::OperationFailed { operation: "void", .. } => ("void-failed", "Void failed"),
            ApiError::OperationFailed { operation: "dispute response", .. } => {
                ("dispute-response-failed", "Dispute response failed")
            }
            ApiError::OperationFailed { .. } => ("refund-failed", "Refund failed"),
            ApiError::RefundExceedsRefundable { .. } => {
                ("refund-exceeds-refundable", "Refund exceeds refundable")
            }
            ApiError::ChargeDisputed { .. } => ("charge-disputed", "Charge disputed"),
            ApiError::EvidencePastDue { .. } => ("evidence-past-due", "Evidence past due"),
            ApiError::DisputeResponseInProgress { .. } => {
                ("dispute-response-in-progress", "Dispute response in progress")
            }
            ApiError::CaptureExceedsCapturable { .. } => {
                ("capture-exceeds-capturable", "Capture exceeds capturable")
            }
            ApiError::RateLimited { .. } => ("rate-limited", "Too many requests"),
            ApiError::ProviderUnavailable { .. } => ("provider-unavailable", "Provider unavailable"),
            ApiError::Unavailable(_) => ("service-unavailable", "Service unavailable"),
            ApiError::Internal(_) => ("internal-error", "Internal error"),
        }
    }

    /// Problem-specific members beside the standard ones.
    fn extensions(&self, members: &mut Map<String, Value>) {
        match self {
            ApiError::Validation(errors) => {
                members.insert("errors".into(), json!(errors));
            }
            ApiError::IdempotencyKeyInUse { resource_id: Some(id), .. }
            | ApiError::ProviderUnavailable { resource_id: id, .. } => {
                members.insert("resource_id".into(), json!(id));
            }
            ApiError::PaymentDeclined { payment_id, code, .. } => {
                members.insert("payment_id".into(), json!(payment_id));
                members.insert("decline_code".into(), json!(code));
            }
            ApiError::PaymentFailed { payment_id, .. } => {
                members.insert("payment_id".into(), json!(payment_id));
            }
            ApiError::PaymentInProgress { payment_id, .. } => {
                members.insert("payment_id".into(), json!(payment_id));
            }
            ApiError::EvidencePastDue { dispute_id, due_by } => {
                members.insert("dispute_id".into(), json!(dispute_id));
                members.insert("evidence_due_by".into(), json!(due_by));
            }
            ApiError::DisputeResponseInProgress { dispute_id, response_id } => {
                members.insert("dispute_id".into(), json!(dispute_id));
                members.insert("response_id".into(), json!(response_id));
            }
            ApiError::RefundDeclined { refund_id, code, .. } => {
                members.insert("refund_id".into(), json!(refund_id));
                members.insert("decline_code".into(), json!(code));
            }
            ApiError::CaptureDeclined { payment_id, code, .. } => {
                members.insert("payment_id".into(), json!(payment_id));
                members.insert("decline_code".into(), json!(code));
            }
            ApiError::AuthorizationExpired { payment_id } => {
                members.insert("payment_id".into(), json!(payment_id));
            }
            ApiError::OperationFailed { id, .. } => {
                members.insert("resource_id".into(), json!(id));
            }
            ApiError::RefundExceedsRefundable { refundable_amount }
            | ApiError::ChargeDisputed { refundable_amount } => {
                members.insert("refundable_amount".into(), json!(refundable_amount));
            }
            ApiError::CaptureExceedsCapturable { capturable_amount } => {
                members.insert("capturable_amount".into(), json!(capturable_amount));
            }
            ApiError::InvalidState { id, current, .. } => {
                members.insert("resource_id".into(), json!(id));
                members.insert("current_state".into(), json!(current));
            }
            _ => {}
        }
    }

    /// Whether the same request sent again can get another answer, where the service knows:
    /// the first request is still running or a dependency is down (yes); the request itself is
    /// wrong, or its key names another request (no). `None` leaves it to the client's rules.
    pub fn should_retry(&self) -> Option<bool> {
        match self {
            ApiError::IdempotencyKeyInUse { .. }
            | ApiError::Unavailable(_)
            | ApiError::ProviderUnavailable { .. }
            | ApiError::DisputeResponseInProgress { .. } => Some(true),
            // Refundable again only once the dispute is won: not a matter of retrying.
            ApiError::ChargeDisputed { .. } => Some(false),
            _ if self.status_code() == StatusCode::UNPROCESSABLE_ENTITY => Some(false),
            _ => None,
        }
    }

    /// The problem document, serialised. Also what the idempotency store keeps for final
    /// business outcomes.
    pub fn problem_body(&self) -> Vec<u8> {
        let status = self.status_code();
        let mut members = Map::new();
        let (problem_type, title) = self.kind();
        members.insert("type".into(), json!(problem_type));
        members.insert("title".into(), json!(title));
        members.insert("status".into(), json!(status.as_u16()));
        members.insert("detail".into(), json!(self.to_string()));
        self.extensions(&mut members);
        serde_json::to_vec(&members).unwrap_or_default()
    }

    /// This error as a response that can be stored with an idempotency key and replayed.
    pub fn to_stored_response(&self) -> StoredResponse {
        StoredResponse {
            status: self.status_code().as_u16(),
            headers: vec![problem_content_type()],
            body: self.problem_body(),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::MalformedJson(_)
            | ApiError::BadRequest(_)
            | ApiError::WebhookSignatureInvalid(_)
            | ApiError::InvalidParameter(_)
            | ApiError::InvalidIdempotencyKey(_)
            | ApiError::IdempotencyKeyMissing => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::NotFound { .. } | ApiError::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::IdempotencyKeyInUse { .. }
            | ApiError::InvalidState { .. }
            | ApiError::ChargeDisputed { .. }
            | ApiError::DisputeResponseInProgress { .. }
            | ApiError::PaymentInProgress { .. } => StatusCode::CONFLICT,
            ApiError::PaymentDeclined { .. }
            | ApiError::PaymentFailed { .. }
            | ApiError::RefundDeclined { .. }
            | ApiError::CaptureDeclined { .. }
            | ApiError::AuthorizationExpired { .. }
            | ApiError::OperationFailed { .. } => StatusCode::PAYMENT_REQUIRED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Validation(_)
            | ApiError::WebhookUrlNotAllowed(_)
            | ApiError::IdempotencyKeyReused(_)
            | ApiError::RefundExceedsRefundable { .. }
            | ApiError::EvidencePastDue { .. }
            | ApiError::CaptureExceedsCapturable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) | ApiError::ProviderUnavailable { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            ApiError::Internal(cause) => tracing::error!(error = ?cause, "internal error"),
            ApiError::Unavailable(cause) => {
                tracing::warn!(error = ?cause, "dependency unavailable")
            }
            _ => {}
        }
        let mut response = HttpResponse::build(self.status_code());
        response.insert_header((header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)));
        if let Some(retry) = self.should_retry() {
            response.insert_header((SHOULD_RETRY, if retry { "true" } else { "false" }));
        }
        match self {
            ApiError::Unauthorized(_) => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            ApiError::MethodNotAllowed { allowed } => {
                response.insert_header((header::ALLOW, *allowed));
            }
            ApiError::IdempotencyKeyInUse { retry_after_secs, .. }
            | ApiError::ProviderUnavailable { retry_after_secs, .. } => {
                response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
            }
            ApiError::Unavailable(_)
            | ApiError::PaymentInProgress { .. }
            | ApiError::DisputeResponseInProgress { .. } => {
                response.insert_header((header::RETRY_AFTER, "1"));
            }
            ApiError::RateLimited { retry_after_secs } => {
                response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
            }
            // The rest of the body may still be on its way: the connection cannot be reused.
            ApiError::RequestTimeout(_) => {
                response.force_close();
            }
            _ => {}
        }
        response.body(self.problem_body())
    }
}

/// Database errors. A connection that is gone answers 503 with `Retry-After` (the client retries
/// with the same key), anything else is unexpected (500).
///
/// "Gone" is, as diesel-async reports it: a closed connection or one that cannot send
/// (`ClosedConnection`, `UnableToSendCommand`: the server or the network closed it, or
/// orderpay's watch on the connection dropped it because an answer was overdue or the server
/// sent a session-ending error: FATAL 57P01/57P02/57P03, class 08, 57014), a read-only
/// transaction (25006: the server was demoted to a standby), and a transaction whose state was
/// lost with its connection. diesel-async keeps no SQLSTATE in its errors; the codes are read
/// where they are still visible, on the wire (`db::wire::ends_session`).
impl From<diesel::result::Error> for ApiError {
    fn from(error: diesel::result::Error) -> Self {
        if connection_gone(&error) {
            ApiError::Unavailable(error.into())
        } else {
            ApiError::Internal(error.into())
        }
    }
}

/// A key that cannot serve the request: reused for another intent (422) or still in use (409).
impl From<KeyConflict> for ApiError {
    fn from(conflict: KeyConflict) -> Self {
        match conflict {
            KeyConflict::Reused(message) => ApiError::IdempotencyKeyReused(message),
            KeyConflict::InUse { retry_after, resource_id } => ApiError::key_in_use(retry_after, resource_id),
        }
    }
}

fn connection_gone(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    match error {
        Error::DatabaseError(
            DatabaseErrorKind::ClosedConnection
            | DatabaseErrorKind::UnableToSendCommand
            | DatabaseErrorKind::ReadOnlyTransaction,
            _,
        ) => true,
        // A BEGIN, COMMIT or ROLLBACK cut short: the connection's state is unknown, and it is
        // discarded on return to the pool.
        Error::BrokenTransactionManager => true,
        Error::RollbackErrorOnCommit { rollback_error, commit_error } => {
            connection_gone(rollback_error) || connection_gone(commit_error)
        }
        _ => false,
    }
}

/// Pool errors: no connection within the acquire timeout, or none could be opened (no host
/// answers, or none is writable).
impl From<crate::db::PoolRunError> for ApiError {
    fn from(error: crate::db::PoolRunError) -> Self {
        ApiError::Unavailable(anyhow::anyhow!("database pool: {error}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_documents_carry_type_title_status_detail() {
        let error = ApiError::InvalidState {
            resource: "order",
            id: Uuid::nil(),
            current: "paid".into(),
            action: "cancelled",
        };
        let body: Value = serde_json::from_slice(&error.problem_body()).unwrap();
        assert_eq!(body["type"], "invalid-state");
        assert_eq!(body["status"], 409);
        assert_eq!(body["current_state"], "paid");
        assert_eq!(body["detail"], format!("order {} is paid; it cannot be cancelled", Uuid::nil()));
    }

    fn unavailable_with_retry_after(error: impl Into<ApiError>) {
        let error: ApiError = error.into();
        let response = error.error_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{error:?}");
        assert_eq!(response.headers().get(header::RETRY_AFTER).map(|v| v.as_bytes()), Some(&b"1"[..]));
        assert_eq!(error.problem_type(), "service-unavailable");
        assert_eq!(response.headers().get(SHOULD_RETRY).map(|v| v.as_bytes()), Some(&b"true"[..]));
    }

    #[test]
    fn the_service_says_whether_a_retry_can_help_where_it_knows() {
        let header = |error: ApiError| {
            error.error_response().headers().get(SHOULD_RETRY).map(|v| v.to_str().unwrap().to_owned())
        };
        let in_use = ApiError::key_in_use(std::time::Duration::from_secs(1), None);
        assert_eq!(header(in_use).as_deref(), Some("true"));
        assert_eq!(header(ApiError::IdempotencyKeyReused("reused".into())).as_deref(), Some("false"));
        assert_eq!(header(ApiError::Validation(Vec::new())).as_deref(), Some("false"));
        let too_much = ApiError::RefundExceedsRefundable {
            refundable_amount: Amount::zero(crate::money::Currency::parse("USD").unwrap()),
        };
        assert_eq!(header(too_much).as_deref(), Some("false"));
        let disputed = ApiError::ChargeDisputed {
            refundable_amount: Amount::zero(crate::money::Currency::parse("USD").unwrap()),
        };
        assert_eq!(header(disputed).as_deref(), Some("false"));
        // Everything else is left to the client's table.
        assert_eq!(header(ApiError::IdempotencyKeyMissing), None);
        assert_eq!(header(ApiError::Internal(anyhow::anyhow!("bug"))), None);
    }

    #[test]
    fn every_lost_connection_is_503_with_retry_after() {
        use diesel::result::{DatabaseErrorKind, Error};
        let db_error = |kind, message: &str| Error::DatabaseError(kind, Box::new(message.to_owned()));
        // What tokio-postgres reports once the connection is closed, whoever closed it (the
        // server after FATAL 57P01/57P02/57P03, the network, or the watch after 57014, 08xxx or
        // an overdue answer): diesel-async turns it into UnableToSendCommand.
        unavailable_with_retry_after(db_error(DatabaseErrorKind::UnableToSendCommand, "connection closed"));
        unavailable_with_retry_after(db_error(DatabaseErrorKind::ClosedConnection, "closed"));
        // 25006, after a demotion.
        unavailable_with_retry_after(db_error(
            DatabaseErrorKind::ReadOnlyTransaction,
            "cannot execute INSERT in a read-only transaction",
        ));
        unavailable_with_retry_after(ApiError::from(Error::BrokenTransactionManager));
        unavailable_with_retry_after(ApiError::from(Error::RollbackErrorOnCommit {
            rollback_error: Box::new(db_error(DatabaseErrorKind::UnableToSendCommand, "connection closed")),
            commit_error: Box::new(db_error(DatabaseErrorKind::UnableToSendCommand, "connection closed")),
        }));
        unavailable_with_retry_after(ApiError::from(crate::db::PoolRunError::TimedOut));
    }

    #[test]
    fn other_database_errors_stay_500() {
        use diesel::result::{DatabaseErrorKind, Error};
        let unique =
            Error::DatabaseError(DatabaseErrorKind::UniqueViolation, Box::new("duplicate".to_owned()));
        assert_eq!(ApiError::from(unique).status_code(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(ApiError::from(Error::NotFound).status_code(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn internal_causes_stay_out_of_the_body() {
        let error = ApiError::Internal(anyhow::anyhow!("password=hunter2 relation does not exist"));
        let body = String::from_utf8(error.problem_body()).unwrap();
        assert!(!body.contains("hunter2"), "{body}");
        assert!(body.contains("internal-error"));
    }
}
