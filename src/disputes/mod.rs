//! Disputes: a customer's bank takes a captured payment's money back (a chargeback), or asks
//! about it first (an inquiry, `warning_*`), and the card network decides. orderpay records each
//! dispute as the provider reports it, never on its own word: from a provider webhook verified by
//! a lookup (`operations::webhooks`) and from the reconciler, which lists the provider's disputes
//! created since its last listing (once a minute) and looks again at every open one ([`record`]).
//!
//! A dispute's row follows the provider's, guarded (`record_dispute.sql`): `won`, `lost` and
//! `warning_closed` never change, `under_review` moves only to `won` or `lost`, nothing moves
//! backwards, and the money withdrawn and reinstated only grows. What moved the money is the
//! ledger's (a trigger writes `dispute_withdrawal` and `dispute_reinstatement`), and the payment's
//! `amount_disputed` (withdrawn less reinstated) is no longer refundable.

pub mod record;
pub mod repository;
pub mod representation;
pub mod responses;
pub mod service;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::db::schema::disputes;
use crate::ids::{AccountId, OrderId, PaymentId};
use crate::money::Currency;

crate::text_enum! {
    /// A dispute's status, Stripe's: the `warning_*` ones are an inquiry (no money moves), the
    /// others a chargeback (the funds are withdrawn when it opens). `won`, `lost` and
    /// `warning_closed` are final.
    pub enum DisputeStatus {
        WarningNeedsResponse = "warning_needs_response",
        WarningUnderReview = "warning_under_review",
        WarningClosed = "warning_closed",
        NeedsResponse = "needs_response",
        UnderReview = "under_review",
        Won = "won",
        Lost = "lost",
    }
}

impl DisputeStatus {
    /// Whether it never changes again.
    pub fn is_final(self) -> bool {
        matches!(self, DisputeStatus::Won | DisputeStatus::Lost | DisputeStatus::WarningClosed)
    }
}

crate::text_enum! {
    /// Why a dispute closed.
    pub enum ClosedReason {
        /// The merchant accepted it.
        Accepted = "accepted",
        /// Lost without evidence submitted before it was due.
        EvidenceNotSubmitted = "evidence_not_submitted",
        /// The card network decided it, on the evidence submitted.
        Decided = "decided",
    }
}

/// A dispute as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = disputes)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Dispute {
    pub account_id: AccountId,
    pub id: Uuid,
    pub payment_id: PaymentId,
    pub order_id: OrderId,
    pub provider_dispute_id: String,
    pub amount: Decimal,
    pub currency: Currency,
    pub reason: String,
    pub status: DisputeStatus,
    pub closed_reason: Option<ClosedReason>,
    pub evidence_due_by: Option<DateTime<Utc>>,
    pub amount_withdrawn: Decimal,
    pub amount_reinstated: Decimal,
    pub provider_created_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}
