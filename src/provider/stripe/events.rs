//! Stripe's webhook events read into the engine's [`Event`]: `{id, type, created, data: {object}}`
//! whose object is a PaymentIntent, a Refund or a Dispute, naming our payment or refund by the
//! metadata orderpay put on it (`orderpay_payment_id`, `orderpay_refund_id`).
//!
//! | Stripe event | read as |
//! |---|---|
//! | `payment_intent.succeeded`, `.payment_failed`, `.canceled`, `.amount_capturable_updated`, `.processing` | the payment's charge |
//! | `refund.created`, `refund.updated`, `refund.failed`, `charge.refund.updated` | the refund |
//! | `charge.dispute.created`, `.updated`, `.funds_withdrawn`, `.funds_reinstated`, `.closed` | the dispute |
//! | anything else (`charge.refunded` included) | kept and ignored |
//!
//! A PaymentIntent or Refund without our metadata (another integration on the same account) is
//! kept and ignored whatever its shape or currency, and so is a dispute that cannot be read (the
//! reconciler's listing of disputes reads every one): refusing them would have Stripe retry them
//! for days and could disable the endpoint.
//!
//! `charge.refunded` carries the Charge, not the refund: which of our refunds it is about is told
//! by the refund's own events, which carry our metadata. Every event is only a reason to look:
//! the engine asks Stripe before anything moves.

use serde::Deserialize;
use serde_json::Value;

use super::form::{PAYMENT_ID_METADATA, REFUND_ID_METADATA};
use super::objects::{DisputeObject, PaymentIntentObject, RefundObject};
use crate::ids::{PaymentId, RefundId};
use crate::provider::event::{self, Event, Object};

#[derive(Deserialize)]
struct Envelope {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: EnvelopeData,
}

#[derive(Deserialize)]
struct EnvelopeData {
    object: Value,
}

/// Reads a verified Stripe event. `Err` says what is wrong with it (Stripe's format is not what
/// the pinned API version promises: a person must look; its retries change nothing).
pub fn read_event(body: Value) -> Result<Event, String> {
    let envelope: Envelope =
        serde_json::from_value(body).map_err(|error| format!("not a Stripe event: {error}"))?;
    event::check_text("id", &envelope.id)?;
    event::check_text("type", &envelope.kind)?;
    let object = envelope.data.object;
    let id = object.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
    // Whether orderpay made it, read before anything else: an object of another integration on
    // the same account (another currency, another shape) is kept and ignored, never refused,
    // or Stripe would retry it for days and could disable the endpoint.
    let ours = |metadata_key: &str| object.get("metadata").and_then(|m| m.get(metadata_key)).is_some();
    let object = match envelope.kind.as_str() {
        "payment_intent.succeeded"
        | "payment_intent.payment_failed"
        | "payment_intent.canceled"
        | "payment_intent.amount_capturable_updated"
        | "payment_intent.processing" => match ours(PAYMENT_ID_METADATA) {
            false => Object::Other { id },
            true => {
                let intent: PaymentIntentObject = serde_json::from_value(object)
                    .map_err(|error| format!("data.object is not a PaymentIntent: {error}"))?;
                let charge = intent.to_event_charge().map_err(|error| format!("data.object: {error}"))?;
                let payment = intent.payment_reference().and_then(PaymentId::parse);
                Object::Charge { id: intent.id, payment, charge }
            }
        },
        "refund.created" | "refund.updated" | "refund.failed" | "charge.refund.updated" => {
            match ours(REFUND_ID_METADATA) {
                false => Object::Other { id },
                true => {
                    let refund: RefundObject = serde_json::from_value(object)
                        .map_err(|error| format!("data.object is not a Refund: {error}"))?;
                    let provider_refund =
                        refund.to_refund().map_err(|error| format!("data.object: {error}"))?;
                    let ours = refund.refund_reference().and_then(RefundId::parse);
                    Object::Refund { id: refund.id, refund: ours, provider_refund }
                }
            }
        }
        "charge.dispute.created"
        | "charge.dispute.updated"
        | "charge.dispute.funds_withdrawn"
        | "charge.dispute.funds_reinstated"
        | "charge.dispute.closed" => {
            // A dispute carries nothing of ours: one that cannot be read (another integration's
            // currency) is kept and ignored here; the reconciler's listing of disputes reads
            // every dispute of the account and says loudly what it cannot.
            let read = serde_json::from_value::<DisputeObject>(object).map_err(|error| error.to_string());
            match read.and_then(|dispute| dispute.to_dispute().map_err(|error| error.to_string())) {
                Ok(dispute) => Object::Dispute { dispute: Box::new(dispute) },
                Err(error) => {
                    tracing::warn!(dispute = %id, %error, "a Stripe dispute event could not be read; ignored");
                    Object::Other { id }
                }
            }
        }
        _ => Object::Other { id },
    };
    Ok(Event { id: envelope.id, kind: envelope.kind, object })
}

#[cfg(test)]
mod tests {
    use rust_decimal::Decimal;
    use serde_json::json;

    use super::*;
    use crate::disputes::DisputeStatus;
    use crate::provider::{ChargeStatus, RefundStatus};

    const PAYMENT: &str = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
    const REFUND: &str = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c";

    fn event(kind: &str, object: Value) -> Value {
        json!({ "id": "evt_1", "object": "event", "type": kind, "created": 1_700_000_000,
                "livemode": false, "data": { "object": object } })
    }

    /// As Stripe sends it: the latest charge an id, `amount_received` set.
    fn payment_intent(status: &str, received: i64) -> Value {
        json!({ "id": "pi_1", "object": "payment_intent", "status": status, "amount": 1234,
                "amount_received": received, "currency": "usd", "latest_charge": "ch_1",
                "metadata": { "orderpay_payment_id": PAYMENT }, "created": 1_700_000_000 })
    }

    #[test]
    fn a_payment_intent_event_names_our_payment_and_its_charge_as_far_as_the_event_tells() {
        let read = read_event(event("payment_intent.succeeded", payment_intent("succeeded", 1234))).unwrap();
        assert_eq!(
            (read.id.as_str(), read.kind.as_str(), read.object_id()),
            ("evt_1", "payment_intent.succeeded", "pi_1")
        );
        let Object::Charge { payment: Some(payment), charge, .. } = read.object else { panic!("{read:?}") };
        assert_eq!(payment.to_string(), PAYMENT);
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        assert_eq!((charge.amount, charge.amount_captured), (Decimal::new(1234, 2), Decimal::new(1234, 2)));

        let mut failed = payment_intent("requires_payment_method", 0);
        failed["last_payment_error"] =
            json!({ "code": "card_declined", "decline_code": "insufficient_funds" });
        let read = read_event(event("payment_intent.payment_failed", failed)).unwrap();
        assert!(
            matches!(&read.object, Object::Charge { charge, .. }
                if matches!(&charge.status, ChargeStatus::Declined { code, .. } if code == "insufficient_funds")),
            "{read:?}"
        );

        // Another integration's PaymentIntent, even in a currency orderpay does not take, is
        // kept and ignored rather than refused.
        let mut not_ours = payment_intent("succeeded", 1234);
        not_ours["metadata"] = json!({});
        not_ours["currency"] = json!("xof");
        let read = read_event(event("payment_intent.succeeded", not_ours)).unwrap();
        assert!(matches!(read.object, Object::Other { ref id } if id == "pi_1"), "{read:?}");
    }

    #[test]
    fn a_refund_event_names_our_refund() {
        let refund = json!({ "id": "re_1", "object": "refund", "amount": 500, "currency": "usd",
                             "status": "succeeded", "payment_intent": "pi_1",
                             "metadata": { "orderpay_refund_id": REFUND }, "created": 1_700_000_000 });
        for kind in ["refund.created", "refund.updated", "charge.refund.updated"] {
            let read = read_event(event(kind, refund.clone())).unwrap();
            let Object::Refund { refund: Some(ours), provider_refund, .. } = read.object else {
                panic!("{read:?}")
            };
            assert_eq!(ours.to_string(), REFUND);
            assert_eq!(provider_refund.status, RefundStatus::Succeeded);
            assert_eq!(
                (provider_refund.amount, provider_refund.charge_id.as_str()),
                (Decimal::new(500, 2), "pi_1")
            );
        }
    }

    #[test]
    fn a_dispute_event_is_the_dispute() {
        let dispute = json!({ "id": "dp_1", "object": "dispute", "amount": 1234, "currency": "usd",
                              "charge": "ch_1", "payment_intent": "pi_1", "reason": "fraudulent",
                              "status": "needs_response", "created": 1_700_000_000 });
        let read = read_event(event("charge.dispute.created", dispute)).unwrap();
        let Object::Dispute { dispute } = &read.object else { panic!("{read:?}") };
        assert_eq!((dispute.status, dispute.charge_id.as_str()), (DisputeStatus::NeedsResponse, "pi_1"));
        assert_eq!(read.object_id(), "dp_1");
    }

    #[test]
    fn other_types_are_kept_and_malformed_events_refused() {
        let read = read_event(event("charge.refunded", json!({ "id": "ch_1", "object": "charge" }))).unwrap();
        assert!(matches!(read.object, Object::Other { ref id } if id == "ch_1"));
        // A type we act on whose object, ours by its metadata, is not what the type says.
        let ours = |id: &str, key: &str| json!({ "id": id, "metadata": { key: PAYMENT } });
        assert!(read_event(event("payment_intent.succeeded", ours("re_1", "orderpay_payment_id"))).is_err());
        assert!(read_event(event("refund.updated", ours("pi_1", "orderpay_refund_id"))).is_err());
        // A dispute that cannot be read is ignored: the reconciler's listing reads every dispute.
        let odd =
            read_event(event("charge.dispute.created", json!({ "id": "dp_2", "currency": "usd" }))).unwrap();
        assert!(matches!(odd.object, Object::Other { ref id } if id == "dp_2"), "{odd:?}");
        // Not an event, or one whose id or type cannot be stored.
        assert!(read_event(json!({ "hello": "world" })).is_err());
        let mut no_id = event("customer.created", json!({ "id": "cus_1" }));
        no_id["id"] = json!("");
        assert!(read_event(no_id).is_err());
        assert!(read_event(event("has space", json!({ "id": "cus_1" }))).is_err());
    }
}
