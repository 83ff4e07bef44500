//! The ledger's clock-driven changes: every instant at which something changes by itself
//! (a pending charge or refund settling, an authorization expiring, a refund reversed), made on
//! time by [`Ledger::advance_due`] (an entry already moved by a read is a no-op).

use std::cmp::Reverse;

use chrono::{DateTime, Utc};

use super::Ledger;

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
}
