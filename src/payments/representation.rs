//! The public representation of a payment and of its final answers.
//!
//! A payment's final answer is produced wherever it settles (the request, a retry that took it
//! over, the reconciler), stored on the payment's row and replayed for its key, so every path
//! renders it here, from the payment as it is after the change.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{CaptureMethod, GAVE_UP_CODE, Payment, PaymentStatus, RESOLVED_FAILED_CODE};
use crate::error::ApiError;
use crate::idempotency::StoredResponse;
use crate::ids::{OrderId, PaymentId};
use crate::money::Amount;

/// The failure code of an authorization the provider let go before a capture.
pub const AUTHORIZATION_EXPIRED: &str = "authorization_expired";

/// A payment as `GET /payments/{id}` renders it: the API's field names, which every other view of
/// a payment (events, the operator commands) keeps.
#[derive(Serialize)]
pub struct PaymentResource<'a> {
    id: PaymentId,
    object: &'static str,
    order_id: OrderId,
    status: PaymentStatus,
    amount: Amount,
    currency: &'static str,
    capture_method: CaptureMethod,
    amount_capturable: Amount,
    amount_captured: Amount,
    amount_refunded: Amount,
    /// Withdrawn by disputes and not reinstated (open or lost): no longer refundable.
    amount_disputed: Amount,
    payment_method: &'a str,
    provider_charge_id: Option<&'a str>,
    failure_code: Option<&'a str>,
    failure_message: Option<&'a str>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl<'a> From<&'a Payment> for PaymentResource<'a> {
    fn from(payment: &'a Payment) -> Self {
        PaymentResource {
            id: payment.id,
            object: "payment",
            order_id: payment.order_id,
            status: payment.status,
            amount: payment.amount,
            currency: payment.amount.currency().code(),
            capture_method: payment.capture_method,
            amount_capturable: payment.amount_capturable(),
            amount_captured: payment.amount_captured,
            amount_refunded: payment.amount_refunded,
            amount_disputed: payment.amount_disputed,
            payment_method: &payment.payment_method,
            provider_charge_id: payment.provider_charge_id.as_deref(),
            failure_code: payment.failure_code.as_deref(),
            failure_message: payment.failure_message.as_deref(),
            created_at: payment.created_at,
            updated_at: payment.updated_at,
        }
    }
}

/// The payment as JSON.
pub fn payment_json(payment: &Payment) -> Vec<u8> {
    // Serialising our own plain struct cannot fail.
    serde_json::to_vec(&PaymentResource::from(payment)).unwrap_or_default()
}

pub fn location(id: Uuid) -> String {
    format!("/payments/{id}")
}

/// The answer of `POST /payments` once the charge (or authorization) is settled: 201 with the
/// payment when it succeeded or is authorized, 402 problem+json when it failed. Stored on the
/// payment and replayed for its key.
pub fn final_response(payment: &Payment) -> StoredResponse {
    match payment.status {
        PaymentStatus::Succeeded | PaymentStatus::RequiresCapture | PaymentStatus::Processing => {
            StoredResponse::json(201, payment_json(payment))
                .with_header("location", location(payment.id.as_uuid()))
        }
        PaymentStatus::Failed | PaymentStatus::Canceled => failure(payment).to_stored_response(),
    }
}

/// 202 with the payment while its outcome is unknown (not stored).
pub fn pending_response(payment: &Payment) -> StoredResponse {
    StoredResponse::json(202, payment_json(payment)).with_header("location", location(payment.id.as_uuid()))
}

/// A stored answer (status and body, as kept on the payment's row) with the headers that go
/// with it: the same bytes [`final_response`] produced.
pub fn stored_answer(id: Uuid, status: u16, body: Vec<u8>) -> StoredResponse {
    if (200..300).contains(&status) {
        StoredResponse::json(status, body).with_header("location", location(id))
    } else {
        StoredResponse { status, headers: vec![crate::error::problem_content_type()], body }
    }
}

/// The problem a failed (or, before it was ever authorized, expired) payment answers with.
pub fn failure(payment: &Payment) -> ApiError {
    let code = payment.failure_code.clone().unwrap_or_else(|| "failed".to_owned());
    let message = payment.failure_message.clone().unwrap_or_else(|| "the payment failed".to_owned());
    // Neither was a decline: orderpay (or an operator, by hand) could not establish a charge.
    if code == GAVE_UP_CODE || code == RESOLVED_FAILED_CODE {
        ApiError::PaymentFailed { payment_id: payment.id.as_uuid(), reason: message }
    } else if payment.status == PaymentStatus::Canceled {
        ApiError::AuthorizationExpired { payment_id: payment.id }
    } else {
        ApiError::PaymentDeclined { payment_id: payment.id.as_uuid(), code, message }
    }
}

/// The answer of a capture or a void once it is settled: 200 with the payment as it is after,
/// or the problem that says why not. Stored on the operation's row and replayed for its key.
pub fn action_response(payment: &Payment, refusal: Option<ApiError>) -> StoredResponse {
    match refusal {
        None => StoredResponse::json(200, payment_json(payment)),
        Some(problem) => problem.to_stored_response(),
    }
}

/// A capture's or void's stored answer with its headers.
pub fn stored_action_answer(status: u16, body: Vec<u8>) -> StoredResponse {
    if (200..300).contains(&status) {
        StoredResponse::json(status, body)
    } else {
        StoredResponse { status, headers: vec![crate::error::problem_content_type()], body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_answers_get_back_the_headers_they_were_rendered_with() {
        let in_flight = crate::payments::in_flight_for_tests(CaptureMethod::Automatic);
        let mut payment = Payment {
            status: PaymentStatus::Succeeded,
            amount_captured: in_flight.amount,
            provider_charge_id: Some("ch_1".into()),
            idempotency_key: Some("k".into()),
            ..in_flight
        };
        let succeeded = final_response(&payment);
        assert_eq!(stored_answer(payment.id.as_uuid(), succeeded.status, succeeded.body.clone()), succeeded);
        payment.status = PaymentStatus::Failed;
        payment.failure_code = Some("insufficient_funds".into());
        let failed = final_response(&payment);
        assert_eq!(stored_answer(payment.id.as_uuid(), failed.status, failed.body.clone()), failed);
    }
}
