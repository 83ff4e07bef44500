//! The mock provider's books: every charge, authorization, refund and dispute, the idempotency keys of
//! every write, and the state machine that moves them. Pure state, no HTTP and no clock of its
//! own: every operation is given `now`, and what reached a final state is left in
//! [`Ledger::take_events`] for the caller to send as webhooks.
//!
//! Time-driven changes (a pending charge or refund settling, an authorization expiring) happen
//! in [`Ledger::advance_due`] on time, and lazily whenever the object is read, whichever comes
//! first; either way they happen once and emit their event once.
//!
//! One file per job: [`charges`], [`refunds`], [`disputes`], [`keys`] (idempotency of the other
//! writes), [`timers`], [`events`] (what becomes a webhook), [`balance`] (the settlement records:
//! every movement of money), [`admin`] (the admin views), [`reply`] (what the HTTP layer sends).

mod admin;
mod balance;
mod charges;
mod disputes;
mod events;
mod keys;
mod refunds;
mod reply;
mod timers;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

pub(super) use self::balance::{BalanceListQuery, Generate, InjectedMovement};
use self::charges::StoredCharge;
use self::disputes::StoredDispute;
pub(super) use self::disputes::{Decision, OpenDispute};
pub(super) use self::events::Emitted;
use self::keys::Operation;
use self::refunds::StoredRefund;
pub(super) use self::reply::Reply;
pub use self::timers::ByHand;
use self::timers::Due;
use super::Faults;
use crate::money::{Amount, Currency};

/// Timing the ledger needs from the settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub settle_after: Duration,
    pub auth_ttl: Duration,
}

pub(super) struct Ledger {
    timing: Timing,
    charges: Vec<StoredCharge>,
    charge_by_key: HashMap<String, usize>,
    charge_by_id: HashMap<String, usize>,
    refunds: Vec<StoredRefund>,
    refund_by_id: HashMap<String, usize>,
    disputes: Vec<StoredDispute>,
    dispute_by_id: HashMap<String, usize>,
    /// Captures, cancels and refunds share one key space, as at Stripe: reusing a capture's key
    /// for a refund is a 422, not a second operation.
    operations: HashMap<String, Operation>,
    /// Every instant at which something changes by itself, earliest first. An entry whose object
    /// was already moved by a read is a no-op when it comes up.
    due: BinaryHeap<Reverse<(DateTime<Utc>, Due)>>,
    /// Set when `due` gained an entry, so that the task settling things on time looks again.
    pub scheduled: bool,
    events: Vec<Emitted>,
    /// Every movement of money, for the settlement records.
    balance: balance::Feed,
    pub faults: Faults,
    /// What the write being carried out does whatever its payment method (the script's
    /// `decline`, `pend`): set only for the length of [`Ledger::forcing`].
    forced: Option<Forced>,
}

/// An outcome the script imposes on one write, whatever its payment method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    /// A charge is declined (`card_declined`), a capture refused (`capture_declined`, the
    /// authorization left to capture), a refund fails (`refund_declined`).
    Decline,
    /// A charge or a refund is left pending until the test settles it
    /// (`POST /_admin/due/{key}/settle`): no clock settles it.
    Pend,
}

/// `value` printed with exactly the currency's minor units, as everywhere on the wire.
fn money(value: Decimal, currency: Currency) -> String {
    let mut value = value;
    value.rescale(currency.minor_units());
    value.to_string()
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::now_v7().simple())
}

/// Parses a positive amount in `currency` (exact, within its minor units).
fn positive_amount(text: &str, currency: Currency) -> Result<Decimal, Reply> {
    match Amount::parse(text, currency) {
        Ok(amount) if amount.value() > Decimal::ZERO => Ok(amount.value()),
        Ok(_) => Err(Reply::invalid("amount must be positive")),
        Err(error) => Err(Reply::invalid(&format!("amount {text:?}: {error}"))),
    }
}

fn same_currency(given: Option<&str>, currency: Currency) -> Result<(), Reply> {
    match given.map(Currency::parse) {
        None => Ok(()),
        Some(Ok(given)) if given == currency => Ok(()),
        Some(_) => Err(Reply::invalid(&format!("currency must be the charge's, {currency}"))),
    }
}

impl Ledger {
    pub fn new(timing: Timing) -> Ledger {
        Ledger {
            timing,
            charges: Vec::new(),
            charge_by_key: HashMap::new(),
            charge_by_id: HashMap::new(),
            refunds: Vec::new(),
            refund_by_id: HashMap::new(),
            disputes: Vec::new(),
            dispute_by_id: HashMap::new(),
            operations: HashMap::new(),
            due: BinaryHeap::new(),
            scheduled: false,
            events: Vec::new(),
            balance: balance::Feed::default(),
            faults: Faults::default(),
            forced: None,
        }
    }

    /// Carries out `write` with the outcome `forced`, whatever the payment method says.
    /// The flag is cleared by a guard, so that a write that panics (the mock's lock is used on
    /// after a panic) cannot leave every later write forced.
    pub fn forcing(&mut self, forced: Forced, write: impl FnOnce(&mut Ledger) -> Reply) -> Reply {
        struct Cleared<'a>(&'a mut Ledger);
        impl Drop for Cleared<'_> {
            fn drop(&mut self) {
                self.0.forced = None;
            }
        }
        let guard = Cleared(self);
        guard.0.forced = Some(forced);
        write(&mut *guard.0)
    }

    fn declines(&self) -> bool {
        self.forced == Some(Forced::Decline)
    }

    fn pends(&self) -> bool {
        self.forced == Some(Forced::Pend)
    }
}

#[cfg(test)]
mod tests;
