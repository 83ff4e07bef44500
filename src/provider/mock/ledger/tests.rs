//! The ledger's state machine, without HTTP: settling, expiring, refund bounds, exact amounts.

use std::time::Duration;

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};

use super::{ByHand, Decision, Forced, Ledger, OpenDispute, Timing};
use crate::provider::wire::{CaptureChargeBody, CreateChargeBody, CreateRefundBody, UpdateDisputeBody};

fn ledger() -> Ledger {
    Ledger::new(Timing { settle_after: Duration::from_secs(3), auth_ttl: Duration::from_secs(60) })
}

/// The id of a charge of 10.00 made under `key` with `payment_method`.
fn charge_id(
    ledger: &mut Ledger,
    key: &str,
    payment_method: &str,
    capture: bool,
    now: DateTime<Utc>,
) -> String {
    let made = ledger.create_charge(key, charge(payment_method, capture), None, now, false);
    made.body["id"].as_str().unwrap().to_owned()
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
    let id = charge_id(&mut ledger, "c", "pm_refund_pending", false, now);
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

    let declined = charge_id(&mut ledger, "d", "pm_refund_declined", true, now);
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

fn open(charge: &str, amount: Option<&str>) -> OpenDispute {
    OpenDispute {
        charge: charge.to_owned(),
        reason: "fraudulent".to_owned(),
        amount: amount.map(str::to_owned),
        inquiry: false,
        evidence_due_in_secs: None,
    }
}

fn decide(outcome: &str) -> Decision {
    Decision { outcome: outcome.to_owned() }
}

#[test]
fn a_disputed_card_is_disputed_on_time_and_its_funds_leave_then_come_back_when_won() {
    let mut ledger = ledger();
    let t0 = Utc::now();
    let id = charge_id(&mut ledger, "d", "pm_card_disputed", true, t0);
    assert_eq!(kinds(&mut ledger), ["charge.succeeded"]);
    assert_eq!(ledger.advance_due(t0), Some(t0 + chrono::Duration::seconds(3)));
    ledger.advance_due(t0 + chrono::Duration::seconds(3));
    assert_eq!(kinds(&mut ledger), ["charge.dispute.created", "charge.dispute.funds_withdrawn"]);
    let listed = ledger.list_disputes(None, 10, None);
    let dispute = &listed.body["data"][0];
    assert_eq!(
        (dispute["charge"].as_str(), dispute["status"].as_str()),
        (Some(id.as_str()), Some("needs_response"))
    );
    assert_eq!(
        (dispute["amount"].as_str(), dispute["amount_withdrawn"].as_str()),
        (Some("10.00"), Some("10.00"))
    );
    // The withdrawn funds are no longer refundable.
    let refused = ledger.create_refund("r", refund(&id, "1.00"), None, t0, false);
    assert_eq!(refused.body["error"]["code"], "charge_already_refunded");

    let dispute_id = dispute["id"].as_str().unwrap().to_owned();
    let won = ledger.decide_dispute(&dispute_id, &decide("won"), t0 + chrono::Duration::seconds(4));
    assert_eq!(
        (won.body["status"].as_str(), won.body["amount_reinstated"].as_str()),
        (Some("won"), Some("10.00"))
    );
    assert_eq!(kinds(&mut ledger), ["charge.dispute.funds_reinstated", "charge.dispute.closed"]);
    assert_eq!(ledger.decide_dispute(&dispute_id, &decide("lost"), t0).status, StatusCode::CONFLICT);
    let refunded = ledger.create_refund("r2", refund(&id, "1.00"), None, t0, false);
    assert_eq!(refunded.status, StatusCode::CREATED, "reinstated funds are refundable again");
    // Both moves of the money are settlement records, named by the charge's key.
    let query =
        super::BalanceListQuery { created_gte: None, created_lt: None, limit: None, starting_after: None };
    let feed = ledger.balance_transactions(&query, t0).unwrap();
    let disputes: Vec<(String, String, Option<String>)> = feed
        .data
        .into_iter()
        .filter(|txn| txn.reporting_category.starts_with("dispute"))
        .map(|txn| (txn.reporting_category, txn.amount, txn.source_idempotency_key))
        .collect();
    assert_eq!(
        disputes,
        [
            ("dispute_reversal".into(), "10.00".into(), Some("d".into())),
            ("dispute".into(), "-10.00".into(), Some("d".into()))
        ]
    );
}

#[test]
fn disputes_are_bounded_by_what_remains_and_answered_once_per_key() {
    let mut ledger = ledger();
    let now = Utc::now();
    let id = charge_id(&mut ledger, "c", "pm_card_ok", true, now);
    ledger.create_refund("r", refund(&id, "4.00"), None, now, false);
    assert_eq!(ledger.open_dispute(open(&id, Some("6.01")), now).status, StatusCode::BAD_REQUEST);
    let opened = ledger.open_dispute(open(&id, Some("6.00")), now);
    assert_eq!(opened.status, StatusCode::CREATED);
    assert_eq!(ledger.open_dispute(open(&id, None), now).status, StatusCode::CONFLICT, "nothing left");
    let dispute_id = opened.body["id"].as_str().unwrap().to_owned();
    ledger.take_events();

    let draft = UpdateDisputeBody { evidence: Some("receipt".to_owned()), submit: false };
    let kept = ledger.update_dispute(&dispute_id, "e1", draft.clone(), now, false);
    assert_eq!(
        (kept.body["status"].as_str(), kept.body["evidence"].as_str()),
        (Some("needs_response"), Some("receipt"))
    );
    let submit = UpdateDisputeBody { evidence: None, submit: true };
    let submitted = ledger.update_dispute(&dispute_id, "e2", submit.clone(), now, false);
    assert_eq!(submitted.body["status"], "under_review");
    // A replay answers the dispute as it is now; the key with another request is a 422.
    assert_eq!(ledger.update_dispute(&dispute_id, "e2", submit, now, false).body["status"], "under_review");
    assert_eq!(
        ledger.update_dispute(&dispute_id, "e2", draft, now, false).status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(kinds(&mut ledger), ["charge.dispute.updated", "charge.dispute.updated"]);
    // Under review, it can no longer be accepted; the refusal is the key's answer for ever.
    let refused = ledger.close_dispute(&dispute_id, "a1", now, false);
    assert_eq!(refused.body["error"]["code"], "dispute_not_closable");
    let lost = ledger.decide_dispute(&dispute_id, &decide("lost"), now);
    assert_eq!(
        (lost.body["status"].as_str(), lost.body["closed_reason"].as_str()),
        (Some("lost"), Some("decided"))
    );
    assert_eq!(ledger.close_dispute(&dispute_id, "a1", now, false).body, refused.body);
}

#[test]
fn an_accepted_dispute_is_lost_and_an_inquiry_moves_no_money() {
    let mut ledger = ledger();
    let now = Utc::now();
    let mut ids = Vec::new();
    for key in ["a", "b", "c"] {
        let body = ledger.create_charge(key, charge("pm_card_ok", true), None, now, false).body;
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    let accepted = ledger.open_dispute(open(&ids[0], None), now).body["id"].as_str().unwrap().to_owned();
    let closed = ledger.close_dispute(&accepted, "k", now, false);
    assert_eq!(
        (closed.body["status"].as_str(), closed.body["closed_reason"].as_str()),
        (Some("lost"), Some("accepted"))
    );
    assert_eq!(closed.body["amount_reinstated"], "0.00");
    let mut inquiry = open(&ids[1], None);
    inquiry.inquiry = true;
    let inquiry = ledger.open_dispute(inquiry, now);
    assert_eq!(
        (inquiry.body["status"].as_str(), inquiry.body["amount_withdrawn"].as_str()),
        (Some("warning_needs_response"), Some("0.00"))
    );
    ledger.take_events();
    let decided = ledger.decide_dispute(inquiry.body["id"].as_str().unwrap(), &decide("lost"), now);
    assert_eq!(decided.body["status"], "warning_closed");
    assert_eq!(kinds(&mut ledger), ["charge.dispute.closed"]);
    ledger.open_dispute(open(&ids[2], None), now);

    // Newest first, in pages.
    let first = ledger.list_disputes(None, 2, None);
    assert_eq!(
        (first.body["data"].as_array().unwrap().len(), &first.body["has_more"]),
        (2, &serde_json::json!(true))
    );
    let last_id = first.body["data"][1]["id"].as_str().unwrap().to_owned();
    let rest = ledger.list_disputes(None, 2, Some(&last_id));
    assert_eq!(rest.body["data"][0]["id"].as_str(), Some(accepted.as_str()));
    assert_eq!(rest.body["has_more"], false);
    let later = ledger.list_disputes(Some(now.timestamp() + 1), 10, None);
    assert!(later.body["data"].as_array().unwrap().is_empty());
}

#[test]
fn a_scripted_decline_declines_a_good_card_and_fails_its_refund_once() {
    let mut ledger = ledger();
    let now = Utc::now();
    let declined = ledger.forcing(Forced::Decline, |ledger| {
        ledger.create_charge("c1", charge("pm_card_ok", true), None, now, false)
    });
    assert_eq!(declined.body["status"], "declined");
    assert_eq!(declined.body["decline_code"], "card_declined");
    let ok = charge_id(&mut ledger, "c2", "pm_card_ok", true, now);
    let failed = ledger
        .forcing(Forced::Decline, |ledger| ledger.create_refund("r1", refund(&ok, "4.00"), None, now, false));
    assert_eq!(failed.body["status"], "failed");
    assert_eq!(ledger.charge_by_id(&ok, now).unwrap().amount_refunded, "0.00");
    // Only the write carried out declining is declined; its replay answers as it was.
    assert_eq!(ledger.create_refund("r2", refund(&ok, "4.00"), None, now, false).body["status"], "succeeded");
    assert_eq!(ledger.create_refund("r1", refund(&ok, "4.00"), None, now, false).body, failed.body);
}

#[test]
fn a_scripted_decline_refuses_a_capture_leaves_the_authorization_and_replays_without_holding() {
    let mut ledger = ledger();
    let now = Utc::now();
    let id = charge_id(&mut ledger, "a1", "pm_card_ok", false, now);
    let all = || CaptureChargeBody { amount: None, currency: None };
    let refused = ledger.forcing(Forced::Decline, |ledger| ledger.capture(&id, "cap1", all(), now, true));
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(refused.body["error"]["code"], "capture_declined");
    assert!(refused.hold, "decline_and_hold loses the answer");
    assert_eq!(ledger.charge_by_id(&id, now).unwrap().status, "requires_capture");
    let replay = ledger.capture(&id, "cap1", all(), now, false);
    assert_eq!((replay.status, &replay.body, replay.hold), (refused.status, &refused.body, false));
    assert_eq!(ledger.capture(&id, "cap2", all(), now, false).body["status"], "succeeded");
}

#[test]
fn a_scripted_pend_leaves_a_good_card_pending_until_settled_by_hand() {
    let mut ledger = ledger();
    let now = Utc::now();
    let pending = ledger.forcing(Forced::Pend, |ledger| {
        ledger.create_charge("c1", charge("pm_card_ok", true), None, now, false)
    });
    assert_eq!(pending.body["status"], "pending");
    let id = pending.body["id"].as_str().unwrap().to_owned();
    // No clock settles it: long past the mock's own settle time, it is still pending.
    let later = now + chrono::Duration::hours(1);
    ledger.advance_due(later);
    assert_eq!(ledger.charge_by_id(&id, later).unwrap().status, "pending");
    assert_eq!(ledger.by_hand("c1", ByHand::Settle, later), Some(()));
    let settled = ledger.charge_by_id(&id, later).unwrap();
    assert_eq!((settled.status.as_str(), settled.amount_captured.as_str()), ("succeeded", "10.00"));
    assert_eq!(ledger.by_hand("c1", ByHand::Settle, later), None, "settled once");

    let refund = ledger
        .forcing(Forced::Pend, |ledger| ledger.create_refund("r1", refund(&id, "4.00"), None, later, false));
    assert_eq!(refund.body["status"], "pending");
    ledger.advance_due(later + chrono::Duration::hours(1));
    assert_eq!(ledger.refund_by_key("r1", later).unwrap().status, "pending");
    assert_eq!(ledger.by_hand("r1", ByHand::SettleRefund, later), Some(()));
    assert_eq!(ledger.refund_by_key("r1", later).unwrap().status, "succeeded");
    assert_eq!(ledger.by_hand("nobody", ByHand::SettleRefund, later), None);
    // Then reversed by hand: failed, the money back on the charge.
    assert_eq!(ledger.by_hand("r1", ByHand::Reverse, later), Some(()));
    let reversed = ledger.refund_by_key("r1", later).unwrap();
    assert_eq!(
        (reversed.status.as_str(), reversed.failure_code.as_deref()),
        ("failed", Some("refund_reversed"))
    );
    assert_eq!(ledger.charge_by_id(&id, later).unwrap().amount_refunded, "0.00");
}

#[test]
fn an_authorization_expires_by_hand() {
    let mut ledger = ledger();
    let now = Utc::now();
    let id = charge_id(&mut ledger, "a1", "pm_card_ok", false, now);
    assert_eq!(ledger.by_hand("a1", ByHand::Settle, now), None, "not pending");
    assert_eq!(ledger.by_hand("a1", ByHand::Expire, now), Some(()));
    let expired = ledger.charge_by_id(&id, now).unwrap();
    assert_eq!(
        (expired.status.as_str(), expired.cancellation_reason.as_deref()),
        ("canceled", Some("authorization_expired"))
    );
}
