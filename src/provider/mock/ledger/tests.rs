//! The ledger's state machine, without HTTP: settling, expiring, refund bounds, exact amounts.

use std::time::Duration;

use actix_web::http::StatusCode;
use chrono::Utc;

use super::{Ledger, Timing};
use crate::provider::wire::{CaptureChargeBody, CreateChargeBody, CreateRefundBody};

fn ledger() -> Ledger {
    Ledger::new(Timing { settle_after: Duration::from_secs(3), auth_ttl: Duration::from_secs(60) })
}

fn charge(payment_method: &str, capture: bool) -> CreateChargeBody {
    CreateChargeBody {
        amount: "10.00".to_owned(),
        currency: "USD".to_owned(),
        payment_method: payment_method.to_owned(),
        reference: "ref".to_owned(),
        capture,
    }
}

fn refund(charge: &str, amount: &str) -> CreateRefundBody {
    CreateRefundBody {
        charge: charge.to_owned(),
        amount: amount.to_owned(),
        currency: None,
        reference: "ref".to_owned(),
    }
}

fn kinds(ledger: &mut Ledger) -> Vec<&'static str> {
    ledger.take_events().iter().map(|event| event.kind).collect()
}

#[test]
fn a_pending_authorization_nobody_looked_at_settles_then_expires_with_both_events_in_order() {
    let mut ledger = ledger();
    let t0 = Utc::now();
    let reply = ledger.create_charge("k", charge("pm_provider_pending", false), None, t0, false);
    let id = reply.body["id"].as_str().unwrap().to_owned();
    assert_eq!(reply.body["status"], "pending");
    assert!(kinds(&mut ledger).is_empty());
    assert!(std::mem::take(&mut ledger.scheduled));

    // Read long after both the settlement (3 s) and the expiry (60 s after settling).
    let late = t0 + chrono::Duration::seconds(120);
    let body = ledger.charge_by_id(&id, late).unwrap();
    assert_eq!(
        (body.status.as_str(), body.cancellation_reason.as_deref()),
        ("canceled", Some("authorization_expired"))
    );
    // The expiry runs from the authorization, not from the read.
    assert_eq!(body.authorization_expires_at, Some(t0 + chrono::Duration::seconds(63)));
    assert_eq!(kinds(&mut ledger), ["charge.succeeded", "charge.canceled"]);
    // Already moved by the read: the scheduled entries are no-ops.
    assert_eq!(ledger.advance_due(late), None);
    assert!(kinds(&mut ledger).is_empty());
}

#[test]
fn advance_due_moves_things_on_time_and_says_when_next() {
    let mut ledger = ledger();
    let t0 = Utc::now();
    ledger.create_charge("a", charge("pm_card_ok", false), None, t0, false);
    ledger.create_charge("p", charge("pm_provider_pending", true), None, t0, false);
    assert_eq!(kinds(&mut ledger), ["charge.succeeded"], "the authorization, at once");
    assert_eq!(ledger.advance_due(t0), Some(t0 + chrono::Duration::seconds(3)));
    let next = ledger.advance_due(t0 + chrono::Duration::seconds(3));
    assert_eq!(kinds(&mut ledger), ["charge.succeeded"], "the pending charge");
    assert_eq!(next, Some(t0 + chrono::Duration::seconds(60)));
    assert_eq!(ledger.advance_due(t0 + chrono::Duration::seconds(60)), None);
    assert_eq!(kinds(&mut ledger), ["charge.canceled"], "the authorization expired");
}

#[test]
fn refunds_never_exceed_the_captured_amount_and_failed_ones_do_not_count() {
    let mut ledger = ledger();
    let now = Utc::now();
    let id = ledger.create_charge("c", charge("pm_refund_pending", false), None, now, false).body["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let partial = CaptureChargeBody { amount: Some("6.00".to_owned()), currency: None };
    assert_eq!(ledger.capture(&id, "cap", partial, now, false).body["amount_captured"], "6.00");
    let first = ledger.create_refund("r1", refund(&id, "4.00"), None, now, false);
    assert_eq!((first.status, first.body["status"].as_str()), (StatusCode::CREATED, Some("pending")));
    // 2.00 remain: the pending refund counts.
    let over = ledger.create_refund("r2", refund(&id, "2.01"), None, now, false);
    assert_eq!(
        (over.status, over.body["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("amount_too_large"))
    );
    assert_eq!(ledger.create_refund("r3", refund(&id, "2.00"), None, now, false).status, StatusCode::CREATED);
    let none_left = ledger.create_refund("r4", refund(&id, "0.01"), None, now, false);
    assert_eq!(none_left.body["error"]["code"], "charge_already_refunded");
    assert_eq!(ledger.charge_by_id(&id, now).unwrap().amount_refunded, "6.00");

    let declined = ledger.create_charge("d", charge("pm_refund_declined", true), None, now, false).body["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = ledger.create_refund("f1", refund(&declined, "10.00"), None, now, false);
    assert_eq!(failed.body["status"], "failed");
    assert_eq!(ledger.charge_by_id(&declined, now).unwrap().amount_refunded, "0.00");
    // The refusal and the failure are both answers for their keys, replayed as they were.
    assert_eq!(ledger.create_refund("r2", refund(&id, "2.01"), None, now, false).body, over.body);
    assert_eq!(ledger.create_refund("f1", refund(&declined, "10.00"), None, now, false).body, failed.body);
    assert!(ledger.refund_by_key("r2", now).is_none());
}

#[test]
fn amounts_are_exact_and_in_the_currency_of_the_charge() {
    let mut ledger = ledger();
    let now = Utc::now();
    let mut yen = charge("pm_card_ok", true);
    (yen.amount, yen.currency) = ("1200".to_owned(), "JPY".to_owned());
    let id = ledger.create_charge("y", yen, None, now, false).body["id"].as_str().unwrap().to_owned();
    let fractional = ledger.create_refund("r1", refund(&id, "0.5"), None, now, false);
    assert_eq!(fractional.status, StatusCode::BAD_REQUEST);
    let mut wrong_currency = refund(&id, "100");
    wrong_currency.currency = Some("USD".to_owned());
    assert_eq!(ledger.create_refund("r2", wrong_currency, None, now, false).status, StatusCode::BAD_REQUEST);
    for bad in ["0", "-1", "1e400", "NaN", ""] {
        assert_eq!(
            ledger.create_refund("r3", refund(&id, bad), None, now, false).status,
            StatusCode::BAD_REQUEST
        );
    }
    let ok = ledger.create_refund("r4", refund(&id, "1199"), None, now, false);
    assert_eq!((ok.body["amount"].as_str(), ok.body["currency"].as_str()), (Some("1199"), Some("JPY")));
    let mut bad_charge = charge("pm_card_ok", true);
    bad_charge.amount = "1.001".to_owned();
    assert_eq!(ledger.create_charge("b", bad_charge, None, now, false).status, StatusCode::BAD_REQUEST);
}
