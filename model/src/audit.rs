//! Rules about transitions, checked on every step by comparing the state before and after it:
//! final states are left only by the documented corrections, stored answers are never
//! rewritten, a dispute's row moves only as its guard allows, and the events a step writes are exactly those its transitions call for. A step
//! that breaks one is recorded in the state's ghost (`Ghost::broken`), which the `always`
//! properties read.
//!
//! The events a step should write are derived here from the statuses alone (the table of
//! docs/events.md); the statements in `statements` write theirs separately, so a statement that
//! writes one twice, or forgets one, is caught.

use serde::Serialize;

use crate::state::{Broken, Key, OpStatus, OrderStatus, PaymentStatus, State};

/// What an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Subject {
    Order,
    Payment,
    Refund(u8),
}

/// The event types of the outbox that the protocol writes (`events::EventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum EventType {
    OrderPaid,
    OrderPartiallyRefunded,
    OrderRefunded,
    PaymentSucceeded,
    PaymentFailed,
    PaymentRequiresCapture,
    PaymentCanceled,
    PaymentLateChargeRefunded,
    RefundSucceeded,
    RefundFailed,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::OrderPaid => "order.paid",
            EventType::OrderPartiallyRefunded => "order.partially_refunded",
            EventType::OrderRefunded => "order.refunded",
            EventType::PaymentSucceeded => "payment.succeeded",
            EventType::PaymentFailed => "payment.failed",
            EventType::PaymentRequiresCapture => "payment.requires_capture",
            EventType::PaymentCanceled => "payment.canceled",
            EventType::PaymentLateChargeRefunded => "payment.late_charge_refunded",
            EventType::RefundSucceeded => "refund.succeeded",
            EventType::RefundFailed => "refund.failed",
        }
    }
}

pub type Event = (Subject, EventType);

/// The order's event for a status a refund (or its correction) moved it to.
pub fn order_event(status: OrderStatus) -> Option<EventType> {
    match status {
        OrderStatus::Paid => Some(EventType::OrderPaid),
        OrderStatus::PartiallyRefunded => Some(EventType::OrderPartiallyRefunded),
        OrderStatus::Refunded => Some(EventType::OrderRefunded),
        OrderStatus::PendingPayment | OrderStatus::Authorized => None,
    }
}

/// The events the transitions from `before` to `after` call for.
pub fn expected_events(before: &State, after: &State) -> Vec<Event> {
    let mut events = Vec::new();
    let mut order_moved_by_refund = false;
    for (k, refund) in after.refunds.iter().enumerate() {
        let Some(was) = before.refunds.get(k).map(|r| r.status) else { continue };
        if was == refund.status {
            continue;
        }
        let subject = Subject::Refund(k as u8);
        let succeeded = refund.status == OpStatus::Succeeded;
        events.push((subject, if succeeded { EventType::RefundSucceeded } else { EventType::RefundFailed }));
        if refund.system() {
            if succeeded {
                events.push((Subject::Payment, EventType::PaymentLateChargeRefunded));
            }
        } else if succeeded || was == OpStatus::Succeeded {
            order_moved_by_refund = true;
            events.extend(order_event(after.order).map(|e| (Subject::Order, e)));
        }
    }
    if let (Some(was), Some(now)) = (&before.payment, &after.payment)
        && was.status != now.status
    {
        let charge = was.status == PaymentStatus::Processing && was.row.answer.is_none();
        let event = match (was.status, now.status) {
            (_, PaymentStatus::Succeeded) => Some(EventType::PaymentSucceeded),
            (_, PaymentStatus::Canceled) => Some(EventType::PaymentCanceled),
            (_, PaymentStatus::Failed) => Some(EventType::PaymentFailed),
            (PaymentStatus::Processing, PaymentStatus::RequiresCapture) if charge => {
                Some(EventType::PaymentRequiresCapture)
            }
            _ => None,
        };
        events.extend(event.map(|e| (Subject::Payment, e)));
    }
    if !order_moved_by_refund && before.order != after.order && after.order == OrderStatus::Paid {
        events.push((Subject::Order, EventType::OrderPaid));
    }
    events.sort();
    events
}

/// Whether the order may move from `from` to `to` (a correction may move it among the paid
/// states, to what the amounts say).
fn order_may_move(from: OrderStatus, to: OrderStatus, correction: bool) -> bool {
    use OrderStatus::*;
    let paid = |s| matches!(s, Paid | PartiallyRefunded | Refunded);
    matches!(
        (from, to),
        (PendingPayment, Paid | Authorized)
            | (Authorized, Paid | PendingPayment)
            | (Paid, PartiallyRefunded | Refunded)
            | (PartiallyRefunded, Refunded)
    ) || (correction && paid(from) && paid(to))
}

/// The first rule the step from `before` to `after` breaks, having written `written`;
/// `correction`: the step is a correction on the provider's confirmed word (a lookup).
pub fn check(before: &State, after: &State, written: &[Event], correction: bool) -> Option<Broken> {
    // Final states absorb.
    let payment_left = matches!((&before.payment, &after.payment), (Some(was), Some(now))
        if matches!(was.status, PaymentStatus::Succeeded | PaymentStatus::Failed | PaymentStatus::Canceled)
            && now.status != was.status);
    let actions_left = before
        .actions
        .iter()
        .zip(&after.actions)
        .any(|(was, now)| was.status != OpStatus::Processing && now.status != was.status);
    let refunds_left = before
        .refunds
        .iter()
        .zip(&after.refunds)
        .any(|(was, now)| was.status != OpStatus::Processing && now.status != was.status && !correction);
    let responses_left = before
        .responses
        .iter()
        .zip(&after.responses)
        .any(|(was, now)| was.status != OpStatus::Processing && now.status != was.status);
    let order_moved = before.order != after.order && !order_may_move(before.order, after.order, correction);
    if payment_left || actions_left || refunds_left || responses_left || order_moved {
        return Some(Broken::FinalStateLeft);
    }
    // A stored answer is written once.
    let answer_rewritten = before.ops().any(|op| {
        let was = before.answer(op);
        was.is_some() && after.answer(op) != was
    });
    let key_rewritten =
        before.keys.iter().zip(&after.keys).any(|(was, now)| {
            matches!(was, Key::Stored(_) | Key::Names(_)) && now != was && *now != Key::Free
        });
    if answer_rewritten || key_rewritten {
        return Some(Broken::AnswerChanged);
    }
    if !dispute_moved_by_its_guard(before, after) {
        return Some(Broken::DisputeGuard);
    }
    let mut written = written.to_vec();
    written.sort();
    if written != expected_events(before, after) {
        return Some(Broken::EventsMismatch);
    }
    None
}

/// A dispute's row is never deleted; once `won` or `lost` it never changes; an open one never
/// moves back (`under_review` to `needs_response`); its money withdrawn and reinstated never
/// shrinks; and the payment's `amount_disputed` moves exactly as much as
/// the row's withdrawn less reinstated (one movement per amount moved).
fn dispute_moved_by_its_guard(before: &State, after: &State) -> bool {
    let net = |state: &State| state.dispute.map_or(0, |d| i16::from(d.withdrawn) - i16::from(d.reinstated));
    let disputed = |state: &State| state.payment.as_ref().map_or(0, |p| i16::from(p.disputed));
    let row = match (before.dispute, after.dispute) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(was), Some(now)) => {
            was == now
                || (was.open()
                    && now.status.rank() >= was.status.rank()
                    && now.withdrawn >= was.withdrawn
                    && now.reinstated >= was.reinstated)
        }
    };
    row && disputed(after) - disputed(before) == net(after) - net(before)
}
