//! The public representation of a payment and of its final answers.
//!
//! A payment's final answer is produced wherever it settles (the request, a retry that took it
//! over, the reconciler), stored on the payment's row and replayed for its key, so every path
//! renders it here, from the payment as it is after the change.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{GAVE_UP_CODE, Payment, PaymentStatus};
use crate::error::ApiError;
use crate::idempotency::StoredResponse;
use crate::ids::{OrderId, PaymentId};
use crate::money::Amount;

#[derive(Serialize)]
struct PaymentResource<'a> {
    id: PaymentId,
    object: &'static str,
    order_id: OrderId,
    status: PaymentStatus,
    amount: Amount,
    currency: &'static str,
    payment_method: &'a str,
    provider_charge_id: Option<&'a str>,
    failure_code: Option<&'a str>,
    failure_message: Option<&'a str>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The payment as JSON.
pub fn payment_json(payment: &Payment) -> Vec<u8> {
    let resource = PaymentResource {
        id: payment.id,
        object: "payment",
        order_id: payment.order_id,
        status: payment.status,
        amount: payment.amount,
        currency: payment.amount.currency().code(),
        payment_method: &payment.payment_method,
        provider_charge_id: payment.provider_charge_id.as_deref(),
        failure_code: payment.failure_code.as_deref(),
        failure_message: payment.failure_message.as_deref(),
        created_at: payment.created_at,
        updated_at: payment.updated_at,
    };
    // Serialising our own plain struct cannot fail.
    serde_json::to_vec(&resource).unwrap_or_default()
}

pub fn location(payment: &Payment) -> String {
    format!("/payments/{}", payment.id)
}

/// The answer for a payment whose outcome is known: 201 with the payment when it succeeded,
/// 402 problem+json when it failed. Stored on the payment and replayed for its key.
pub fn final_response(payment: &Payment) -> StoredResponse {
    match payment.status {
        PaymentStatus::Succeeded | PaymentStatus::Processing => {
            StoredResponse::json(201, payment_json(payment)).with_header("location", location(payment))
        }
        PaymentStatus::Failed => failure(payment).to_stored_response(),
    }
}

/// A stored answer (status and body, as kept on the payment's row) with the headers that go
/// with it: the same bytes [`final_response`] produced.
pub fn stored_answer(payment: &Payment, status: u16, body: Vec<u8>) -> StoredResponse {
    if (200..300).contains(&status) {
        StoredResponse::json(status, body).with_header("location", location(payment))
    } else {
        StoredResponse { status, headers: vec![problem_content_type()], body }
    }
}

fn problem_content_type() -> (String, String) {
    ("content-type".to_owned(), crate::error::PROBLEM_JSON.to_owned())
}

/// The problem a failed payment answers with.
pub fn failure(payment: &Payment) -> ApiError {
    let code = payment.failure_code.clone().unwrap_or_else(|| "failed".to_owned());
    let message = payment.failure_message.clone().unwrap_or_else(|| "the payment failed".to_owned());
    if code == GAVE_UP_CODE {
        ApiError::PaymentFailed { payment_id: payment.id.as_uuid(), reason: message }
    } else {
        ApiError::PaymentDeclined { payment_id: payment.id.as_uuid(), code, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_answers_get_back_the_headers_they_were_rendered_with() {
        let usd = crate::money::Currency::parse("USD").unwrap();
        let mut payment = Payment {
            id: PaymentId::generate(),
            account_id: crate::ids::AccountId::generate(),
            order_id: OrderId::generate(),
            status: PaymentStatus::Succeeded,
            amount: Amount::parse("10.00", usd).unwrap(),
            payment_method: "pm_card_ok".into(),
            provider_charge_id: Some("ch_1".into()),
            failure_code: None,
            failure_message: None,
            idempotency_key: Some("k".into()),
            attempts: 0,
            next_check_at: None,
            last_error: None,
            lease: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        };
        let succeeded = final_response(&payment);
        assert_eq!(stored_answer(&payment, succeeded.status, succeeded.body.clone()), succeeded);
        payment.status = PaymentStatus::Failed;
        payment.failure_code = Some("insufficient_funds".into());
        let failed = final_response(&payment);
        assert_eq!(stored_answer(&payment, failed.status, failed.body.clone()), failed);
    }
}
