//! The charge behind a payment: sending it, looking it up, and what the provider's answer means.

use super::{DriveMode, Engine, Outcome};
use crate::ids::LeaseId;
use crate::payments::{Payment, repository};
use crate::provider::{Charge, ChargeRequest, ChargeStatus, ProviderError};

/// The charge request for `payment`: the same downstream key on every send.
pub fn charge_request(payment: &Payment, request_id: Option<&str>) -> ChargeRequest {
    ChargeRequest {
        downstream_key: payment.downstream_key(),
        amount: payment.amount,
        payment_method: payment.payment_method.clone(),
        reference: payment.id.as_uuid(),
        capture: true,
        request_id: request_id.map(str::to_owned),
    }
}

/// Maps a provider answer to an outcome. Exhaustive on purpose: a new provider error does not
/// compile until someone decides what it means for money.
pub fn outcome_of(answer: Result<Charge, ProviderError>) -> Outcome {
    match answer {
        Ok(Charge { id, status: ChargeStatus::Succeeded, .. }) => Outcome::Succeeded { charge_id: id },
        Ok(Charge { status: ChargeStatus::Declined { code, message }, .. }) => {
            Outcome::Declined { code, message }
        }
        Ok(Charge { id, status: ChargeStatus::Pending, .. }) => {
            Outcome::Unknown { reason: format!("charge {id} is pending at the provider") }
        }
        // Payments charge with `capture: true`, so neither can answer a payment; should one, it is
        // left to the reconciler rather than guessed at.
        Ok(Charge { id, status: ChargeStatus::RequiresCapture, .. }) => {
            Outcome::Unknown { reason: format!("charge {id} is only authorized at the provider") }
        }
        Ok(Charge { id, status: ChargeStatus::Canceled { reason }, .. }) => {
            Outcome::Unknown { reason: format!("charge {id} is canceled at the provider ({reason})") }
        }
        Err(error @ ProviderError::Timeout) => Outcome::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::Connection(_)) => Outcome::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::ServerError(_)) => Outcome::Unknown { reason: error.to_string() },
        // A refusal that is not a decline (a malformed request, a key conflict) is our bug or
        // theirs, not an answer about the card: it is retried and eventually given up on.
        Err(error @ ProviderError::Rejected { .. }) => Outcome::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::Malformed(_)) => Outcome::Unknown { reason: error.to_string() },
        // Refusals answer captures, cancels and refunds, never a charge request.
        Err(error @ ProviderError::Refused { .. }) => Outcome::Unknown { reason: error.to_string() },
    }
}

/// Asks the provider about `payment`'s charge, as the holder of `lease`. Returns the outcome
/// and whether a charge was (re)sent.
///
/// A re-send is noted on the payment under the lease first ([`repository::mark_sending`]), so
/// that the reconciler's give-up, ordered against it by the database, can tell that a send may
/// still be in flight; a driver whose lease was taken over sends nothing.
pub async fn drive(
    engine: &Engine,
    payment: &Payment,
    lease: LeaseId,
    mode: DriveMode,
    request_id: Option<&str>,
) -> (Outcome, bool) {
    let provider = engine.provider.as_ref();
    let request = charge_request(payment, request_id);
    if mode == DriveMode::FirstCall {
        // Phase 1 marked the send in the statement that started the payment.
        return (outcome_of(provider.create_charge(&request).await), true);
    }
    match provider.find_charge(&request.downstream_key, request_id).await {
        Ok(Some(charge)) => (outcome_of(Ok(charge)), false),
        Ok(None) if mode == DriveMode::LookupOnly => (Outcome::NotReceived, false),
        // The provider never received it (W1): send it now, with the same key.
        Ok(None) => match mark_sending(engine, payment, lease).await {
            Ok(true) => (outcome_of(provider.create_charge(&request).await), true),
            Ok(false) => (Outcome::Unknown { reason: "another driver holds the payment".into() }, false),
            Err(reason) => (Outcome::Unknown { reason }, false),
        },
        Err(error) => (outcome_of(Err(error)), false),
    }
}

async fn mark_sending(engine: &Engine, payment: &Payment, lease: LeaseId) -> Result<bool, String> {
    let mut conn = engine.pool.get().await.map_err(|error| format!("database pool: {error}"))?;
    repository::mark_sending(&mut conn, payment, lease).await.map_err(|error| format!("database: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_definite_decline_is_final_failure() {
        let charge = |status| {
            Ok(Charge {
                id: "ch_1".into(),
                status,
                amount: rust_decimal::Decimal::TEN,
                amount_captured: rust_decimal::Decimal::TEN,
                amount_refunded: rust_decimal::Decimal::ZERO,
                authorization_expires_at: None,
            })
        };
        assert_eq!(
            outcome_of(charge(ChargeStatus::Succeeded)),
            Outcome::Succeeded { charge_id: "ch_1".into() }
        );
        assert!(matches!(
            outcome_of(charge(ChargeStatus::Declined { code: "c".into(), message: "m".into() })),
            Outcome::Declined { .. }
        ));
        for unknown in [
            charge(ChargeStatus::Pending),
            Err(ProviderError::Timeout),
            Err(ProviderError::Connection("reset".into())),
            Err(ProviderError::ServerError(503)),
            Err(ProviderError::Rejected { status: 400, message: "bad".into() }),
            Err(ProviderError::Malformed("?".into())),
        ] {
            assert!(matches!(outcome_of(unknown), Outcome::Unknown { .. }));
        }
    }
}
