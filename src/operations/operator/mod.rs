//! An operator's hand on payments (`orderpay payments list | show | resolve`): what those
//! commands read, and the one change they make, so that the CLI is only flags and printing and a
//! resolution goes through the engine like every other driver's outcome.
//!
//! - [`list`] and [`show`] ([`views`]) render a payment as `GET /payments/{id}` does, with what an operator
//!   needs beside it ([`Operating`]): its account, what is in flight on it, the reconciler's
//!   attempts and last error, a live lease, and whether it is [stuck](Operating::stuck). `show`
//!   adds its refunds, captures and voids, the audit trail, and the provider's view from a live
//!   lookup by the downstream key.
//! - [`resolve`] ([`mod@resolve`]) settles by hand a payment whose charge (or authorization) is in flight, after
//!   the provider's live view agrees (or `--force`), under a lease, through the charge's own
//!   settle statement with actor `operator`. A forced failure over money the provider holds takes
//!   the money back as the late-charge path does ([`late_charge::take_back`]).
//!
//! **Stuck** is the reconciler's own notion: an operation in flight (a payment's charge or
//! authorization, or a capture or void on it) that has had `ORDERPAY_RECONCILE_MAX_ATTEMPTS`
//! checks or more. Its last check found the outcome still unknown (one final or never received
//! would have settled it or been given up on), so every later check only looks, at the backoff
//! cap, and counts it as `stuck` in `orderpay_reconciler_payments_total`: it stays `processing`
//! until the provider settles it or an operator resolves it. A failed payment is stuck too when
//! a charge landed for it and the system's refunds of it ran out (`late_charge.needs_person`):
//! the customer holds a charge for a payment we told them failed, and only a person can act.

mod resolve;
mod views;

pub use resolve::{MAX_REASON_CHARS, Refusal, Resolve, Resolved, Target, resolve};
pub use views::{ListFilter, PaymentView, Report, list, show};

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::ids::{AccountId, PaymentId};
use crate::money::Amount;
use crate::operations::Engine;
use crate::payments::Payment;
use crate::payments::inspect::{self, Inspect, Inspected};
use crate::payments::repository as payments;
use crate::provider::{Charge, ProviderError};

/// What is in flight on a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    Charge,
    Authorization,
    Capture,
    Void,
}

impl InFlight {
    pub fn as_str(self) -> &'static str {
        match self {
            InFlight::Charge => "charge",
            InFlight::Authorization => "authorization",
            InFlight::Capture => "capture",
            InFlight::Void => "void",
        }
    }
}

/// What an operator needs beside the payment as the API renders it.
#[derive(Debug, Clone, Serialize)]
pub struct Operating {
    pub account_id: AccountId,
    /// The client's key that created the payment (for `orderpay keys show`).
    pub idempotency_key: Option<String>,
    /// What is in flight on it; `None` when nothing is.
    pub in_flight: Option<InFlight>,
    /// Checks the reconciler made of what is in flight (else of the charge, when it was in
    /// flight).
    pub attempts: i32,
    /// When the reconciler looks next.
    pub next_check_at: Option<DateTime<Utc>>,
    /// What the last check saw.
    pub last_error: Option<String>,
    /// Until when a live driver (a request, a retry, the reconciler) holds it.
    pub lease_until: Option<DateTime<Utc>>,
    /// Past the reconciler's last attempt with the outcome still unknown, or a late charge left
    /// unrefunded (see the module doc).
    pub stuck: bool,
    /// A charge that landed after the payment failed, and how far its refund got.
    pub late_charge: Option<LateChargeView>,
}

/// A late charge as an operator sees it, in the payment's currency.
#[derive(Debug, Clone, Serialize)]
pub struct LateChargeView {
    pub amount: String,
    pub refunded: String,
    /// Reserved by a system refund in flight.
    pub refunding: String,
    /// What the customer still paid for a payment we told them failed.
    pub unrefunded: String,
    /// Nothing will try again: the system's refunds ran out (or could not start). A person
    /// refunds it at the provider, or decides otherwise.
    pub needs_person: bool,
}

impl LateChargeView {
    fn new(payment: &Payment, late: &inspect::LateCharge) -> Self {
        let money = |value: rust_decimal::Decimal| {
            Amount::from_decimal(value, payment.currency())
                .map_or_else(|_| value.to_string(), |a| a.to_string())
        };
        LateChargeView {
            amount: money(late.amount),
            refunded: money(late.refunded),
            refunding: money(late.refunding),
            unrefunded: money(late.amount - late.refunded),
            needs_person: late.needs_person,
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        if self.unrefunded.parse::<rust_decimal::Decimal>().is_ok_and(|left| left.is_zero()) {
            return format!("{} landed after the payment failed; refunded by the system", self.amount);
        }
        let state = if self.needs_person {
            "the system's refunds ran out: it needs a person (refund it at the provider)"
        } else {
            "the system is refunding it"
        };
        format!("{} landed after the payment failed; {} not refunded: {state}", self.amount, self.unrefunded)
    }
}

/// Payment `id` with what is in flight on it, found by its id alone.
pub(super) async fn inspect_one(
    conn: &mut AsyncPgConnection,
    id: PaymentId,
) -> diesel::QueryResult<Option<Inspected>> {
    let Some(account) = payments::account_of(conn, id).await? else {
        return Ok(None);
    };
    let inspect = Inspect {
        payment: Some(id),
        account: Some(account),
        status: None,
        created_before: None,
        stuck_after: None,
        limit: 1,
    };
    Ok(inspect::inspect(conn, &inspect).await?.pop())
}

/// What the provider answered to a lookup of a payment's charge by its downstream key.
pub(super) type Lookup = Result<Option<Charge>, ProviderError>;

pub(super) async fn look_up(engine: &Engine, payment: &Payment) -> Lookup {
    engine.provider.find_charge(&payment.charge_lookup(), None).await
}
