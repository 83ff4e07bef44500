//! A provider's webhook event as the engine reads it, whatever the wire: each wire turns its own
//! events into an [`Event`] (the mock's in `wire::read_event`, Stripe's in
//! `stripe::events::read_event`), naming the payment or refund of ours it is about, and
//! `operations::webhooks` applies it.
//!
//! An event is only ever a reason to look: what it says of an operation in flight is applied as
//! the provider's own lookup says, never on the event's word alone.

use crate::ids::{PaymentId, RefundId};

use super::{Charge, Dispute, Refund};

/// The longest text kept in a received event's row (`id`, `event_type`, `object_id`).
pub const MAX_TEXT: usize = 255;

/// A verified event, read.
#[derive(Debug, Clone)]
pub struct Event {
    /// The provider's event id: the same on every delivery of one event (the dedup key).
    pub id: String,
    /// Its type as sent (`charge.succeeded`, `payment_intent.succeeded`, ...).
    pub kind: String,
    pub object: Object,
}

/// What an event is about.
#[derive(Debug, Clone)]
pub enum Object {
    /// A charge (a PaymentIntent on Stripe) at the moment of the event, and the payment of ours
    /// it was made for, when it names one.
    Charge { id: String, payment: Option<PaymentId>, charge: Charge },
    /// A refund at the moment of the event, and the refund of ours it was made for.
    Refund { id: String, refund: Option<RefundId>, provider_refund: Refund },
    /// A dispute at the moment of the event.
    Dispute { dispute: Box<Dispute> },
    /// An event type we do not act on (a receiver must tolerate new ones): its object's id.
    Other { id: String },
}

impl Event {
    /// The provider's id of the object, as kept on the event's row (empty when it is not a
    /// short visible ASCII text, which no id of a provider's is).
    pub fn object_id(&self) -> &str {
        let id = match &self.object {
            Object::Charge { id, .. } | Object::Refund { id, .. } | Object::Other { id } => id.as_str(),
            Object::Dispute { dispute } => dispute.id.as_str(),
        };
        if is_storable(id) { id } else { "" }
    }
}

/// An event's `field` (its `type`, its `id`) as it may be stored: 1 to [`MAX_TEXT`] visible
/// ASCII characters.
pub fn check_text(field: &str, text: &str) -> Result<(), String> {
    match text.is_empty() || !is_storable(text) {
        true => Err(format!("{field} must be 1 to {MAX_TEXT} visible ASCII characters")),
        false => Ok(()),
    }
}

fn is_storable(text: &str) -> bool {
    text.len() <= MAX_TEXT && text.bytes().all(|b| b.is_ascii_graphic())
}
