//! The ledger's clock-driven changes: every instant at which something changes by itself
//! (a pending charge or refund settling, an authorization expiring, a refund reversed), made on
//! time by [`Ledger::advance_due`] (an entry already moved by a read is a no-op).

use std::cmp::Reverse;

use chrono::{DateTime, Utc};

use super::Ledger;
use super::charges::ChargeState;
use super::keys::Outcome;
use super::refunds::RefundState;

/// What a test makes happen now that the ledger's clock would make happen later (or, for what
/// the script left pending, never): `POST /_admin/due/{key}/{what}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ByHand {
    /// A pending charge settles (captured, or authorized for a later capture).
    Settle,
    /// A pending refund settles (succeeded).
    SettleRefund,
    /// An authorization expires (canceled, `authorization_expired`).
    Expire,
    /// A succeeded refund is reversed (failed, `refund_reversed`: the money is back).
    Reverse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Due {
    Charge(usize),
    Refund(usize),
}

impl Ledger {
    pub(super) fn schedule(&mut self, at: DateTime<Utc>, due: Due) {
        self.due.push(Reverse((at, due)));
        self.scheduled = true;
    }

    /// Makes every change due by `now`; returns when the next one is due.
    pub fn advance_due(&mut self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        while let Some(Reverse((at, due))) = self.due.peek().copied() {
            if at > now {
                return Some(at);
            }
            self.due.pop();
            match due {
                Due::Charge(index) => self.advance_charge(index, now),
                Due::Refund(index) => self.advance_refund(index, now),
            }
        }
        None
    }

    /// Makes `what` happen now to the charge or refund written under idempotency key `key`, as
    /// its clock would (one the script left pending settles only so); `None` when that object
    /// is not in the state `what` needs.
    pub fn by_hand(&mut self, key: &str, what: ByHand, now: DateTime<Utc>) -> Option<()> {
        match what {
            ByHand::Settle | ByHand::Expire => {
                let index = *self.charge_by_key.get(key)?;
                let charge = &mut self.charges[index];
                match (what, &charge.state) {
                    (ByHand::Settle, ChargeState::Pending) => charge.settles_at = Some(now),
                    (ByHand::Expire, ChargeState::RequiresCapture) => {
                        charge.authorization_expires_at = Some(now)
                    }
                    _ => return None,
                }
                self.advance_charge(index, now);
            }
            ByHand::SettleRefund | ByHand::Reverse => {
                let Outcome::Refund(index) = self.operations.get(key)?.outcome else { return None };
                let refund = &mut self.refunds[index];
                match (what, &refund.state) {
                    (ByHand::SettleRefund, RefundState::Pending) => refund.settles_at = Some(now),
                    (ByHand::Reverse, RefundState::Succeeded) => refund.reverses_at = Some(now),
                    _ => return None,
                }
                self.advance_refund(index, now);
            }
        }
        Some(())
    }
}
