//! The idempotency keys of captures, cancels, refunds and dispute responses (one key space, as
//! at Stripe): what
//! each key asked and what came of it, replayed for the same request and refused (422) for
//! another. Charges keep theirs beside the charge ([`super::charges`]).

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};

use super::Ledger;
use super::reply::Reply;
use crate::provider::wire::{CaptureChargeBody, CreateRefundBody, UpdateDisputeBody};

/// A write other than a charge, by its idempotency key: what was asked (a replay must ask the
/// same) and what came of it.
pub(super) struct Operation {
    pub(super) request: OperationRequest,
    pub(super) outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OperationRequest {
    Capture { charge: String, body: CaptureChargeBody },
    Cancel { charge: String },
    Refund(CreateRefundBody),
    UpdateDispute { dispute: String, body: UpdateDisputeBody },
    CloseDispute { dispute: String },
}

pub(super) enum Outcome {
    /// Replayed as the charge as it is now.
    Charge(usize),
    /// Replayed as the refund as it is now.
    Refund(usize),
    /// Replayed as the dispute as it is now.
    Dispute(usize),
    /// A business refusal, replayed as it was.
    Refused(Reply),
}

impl Ledger {
    /// The answer for a key already used by a capture, cancel or refund: the same outcome for
    /// the same request, 422 for another.
    pub(super) fn replay(
        &mut self,
        key: &str,
        request: &OperationRequest,
        now: DateTime<Utc>,
    ) -> Option<Reply> {
        let operation = self.operations.get(key)?;
        if operation.request != *request {
            return Some(Reply::key_reused());
        }
        // A replay answers at once, whatever the first request did.
        Some(match &operation.outcome {
            Outcome::Charge(index) => {
                let index = *index;
                Reply::new(StatusCode::OK, self.charge_view(index, now), false)
            }
            Outcome::Refund(index) => {
                let index = *index;
                self.refunds[index].requests += 1;
                Reply::new(StatusCode::OK, self.refund_view(index, now), false)
            }
            Outcome::Dispute(index) => Reply::new(StatusCode::OK, self.dispute_body(*index), false),
            Outcome::Refused(reply) => reply.clone(),
        })
    }

    pub(super) fn record(&mut self, key: &str, request: OperationRequest, outcome: Outcome) {
        self.operations.insert(key.to_owned(), Operation { request, outcome });
    }

    /// Stores a refusal under its key (so a retry gets the same answer) and returns it.
    pub(super) fn refuse(&mut self, key: &str, request: OperationRequest, reply: Reply) -> Reply {
        self.record(key, request, Outcome::Refused(reply.clone()));
        reply
    }
}
