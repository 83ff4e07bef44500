//! The events the ledger emits as things reach a state worth a webhook, kept until the caller
//! takes them (with the ledger still locked, so they leave in the order they happened).

use super::Ledger;
use crate::provider::wire::EventObject;

/// An event to send: its type and the object as its `GET` returns it at this moment.
#[derive(Debug, Clone)]
pub(in crate::provider::mock) struct Emitted {
    pub kind: &'static str,
    pub object: EventObject,
}

impl Ledger {
    /// Events of the changes made since the last call, in the order they happened.
    pub fn take_events(&mut self) -> Vec<Emitted> {
        std::mem::take(&mut self.events)
    }

    pub(super) fn emit_charge(&mut self, kind: &'static str, index: usize) {
        let object = EventObject::Charge(self.charges[index].body());
        self.events.push(Emitted { kind, object });
    }

    pub(super) fn emit_dispute(&mut self, kind: &'static str, index: usize) {
        let object = EventObject::Dispute(self.dispute_body(index));
        self.events.push(Emitted { kind, object });
    }

    pub(super) fn emit_refund(&mut self, kind: &'static str, index: usize) {
        let object = EventObject::Refund(self.refund_body(index));
        self.events.push(Emitted { kind, object });
    }
}
