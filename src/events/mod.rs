//! Events: what happened to the merchant's resources, written in the same transaction as the
//! change (the transactional outbox), read back by the Events API, and handed on by relays
//! (signed merchant webhooks, NATS JetStream) at least once, each with its id for consumers to
//! deduplicate on.
//!
//! An event is `{id, object: "event", type, created_at, data: {object: <the resource as GET
//! returns it after the change>}}`. Events carry no ordering guarantee between them; each carries
//! its resource as it was, with its `updated_at`.
//!
//! The writers: the statements that change state insert their events themselves (new_order.sql,
//! the settle statements), and a transaction that is not one statement calls [`repository::insert`].

pub mod nats;
pub mod relay;
pub mod repository;
pub mod sweeper;

use repository::NewEvent;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::ids::{AccountId, EventId};

crate::text_enum! {
    /// What happened.
    pub enum EventType {
        OrderCreated = "order.created",
        OrderCancelled = "order.cancelled",
        OrderPaid = "order.paid",
        OrderRefunded = "order.refunded",
        OrderPartiallyRefunded = "order.partially_refunded",
        PaymentSucceeded = "payment.succeeded",
        PaymentFailed = "payment.failed",
        PaymentRequiresCapture = "payment.requires_capture",
        PaymentCanceled = "payment.canceled",
        /// A charge that landed after its payment was given up on was refunded by the system.
        PaymentLateChargeRefunded = "payment.late_charge_refunded",
        RefundSucceeded = "refund.succeeded",
        RefundFailed = "refund.failed",
        /// A customer's bank disputed a payment (or asked about it: an inquiry).
        DisputeCreated = "dispute.created",
        /// A dispute moved (evidence submitted, an inquiry turned into a chargeback).
        DisputeUpdated = "dispute.updated",
        /// The provider withdrew a dispute's funds from the balance.
        DisputeFundsWithdrawn = "dispute.funds_withdrawn",
        /// A won dispute's funds came back.
        DisputeFundsReinstated = "dispute.funds_reinstated",
        /// A dispute reached its final status (`won`, `lost`, `warning_closed`).
        DisputeClosed = "dispute.closed",
    }
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub account_id: AccountId,
    pub id: EventId,
    pub event_type: EventType,
    /// The resource's JSON, as GET returns it after the change.
    pub data: Vec<u8>,
    pub created_at: DateTime<Utc>,
}

/// The event's own members; `data` is appended as the stored bytes.
#[derive(Serialize)]
struct EventHead {
    id: EventId,
    object: &'static str,
    #[serde(rename = "type")]
    event_type: EventType,
    created_at: DateTime<Utc>,
}

impl Event {
    /// The event as the Events API, webhooks and NATS carry it. The resource's JSON goes in as
    /// stored, byte for byte (our own renderers wrote it).
    pub fn to_json(&self) -> Vec<u8> {
        let head = EventHead {
            id: self.id,
            object: "event",
            event_type: self.event_type,
            created_at: self.created_at,
        };
        // Serialising our own plain struct cannot fail; it ends with its closing brace.
        let mut out = serde_json::to_vec(&head).unwrap_or_default();
        out.pop();
        out.extend_from_slice(b",\"data\":{\"object\":");
        out.extend_from_slice(&self.data);
        out.extend_from_slice(b"}}");
        out
    }
}

/// The events a settle statement writes with its change (parameters `$91` to `$96`): the
/// operation's own event (`$91` id, `$92` type, `$93` data), written when the statement applies
/// its transition, and a second one (`$94` to `$96`, NULL when there is none), usually the
/// order's, written when the order moves. The SQL decides whether they are written; Rust
/// renders them beforehand.
pub struct Announce<'a> {
    event_id: Option<EventId>,
    event_type: Option<EventType>,
    event_data: Option<&'a [u8]>,
    order_event_id: Option<EventId>,
    order_event_type: Option<EventType>,
    order_event_data: Option<&'a [u8]>,
}

impl<'a> Announce<'a> {
    pub fn new(event: Option<&'a NewEvent>, order_event: Option<&'a NewEvent>) -> Self {
        Announce {
            event_id: event.map(|event| event.id),
            event_type: event.map(|event| event.event_type),
            event_data: event.map(|event| event.data.as_slice()),
            order_event_id: order_event.map(|event| event.id),
            order_event_type: order_event.map(|event| event.event_type),
            order_event_data: order_event.map(|event| event.data.as_slice()),
        }
    }

    /// The types of the events actually written, for the metrics: the operation's when
    /// `applied`, the order's when it `moved`.
    pub fn count_written(&self, applied: bool, moved: bool) {
        let event = self.event_type.filter(|_| applied);
        let order_event = self.order_event_type.filter(|_| moved);
        crate::telemetry::metrics::events_written(
            event.into_iter().chain(order_event).map(|event| event.as_str()),
        );
    }
}

crate::parameter_group! {
    Announce {
        91 => event_id as Nullable<Uuid>,
        92 => event_type as Nullable<Text>,
        93 => event_data as Nullable<Bytea>,
        94 => order_event_id as Nullable<Uuid>,
        95 => order_event_type as Nullable<Text>,
        96 => order_event_data as Nullable<Bytea>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_carries_its_resource_as_stored() {
        let event = Event {
            account_id: AccountId::generate(),
            id: EventId::generate(),
            event_type: EventType::OrderPaid,
            data: br#"{"id":"o","status":"paid","total_amount":"1.50"}"#.to_vec(),
            created_at: Utc::now(),
        };
        let json: serde_json::Value = serde_json::from_slice(&event.to_json()).unwrap();
        assert_eq!(json["object"], "event");
        assert_eq!(json["type"], "order.paid");
        assert_eq!(json["id"], event.id.to_string());
        assert_eq!(json["data"]["object"]["total_amount"], "1.50");
    }
}
