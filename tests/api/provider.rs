//! The provider contract end to end: every operation of `HttpProvider` against the mock provider
//! (a real server on port 0), its refusals and faults, its credential, and its signed webhooks
//! as a real receiver sees them. No database: these tests exercise the provider module alone.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use chrono::Utc;
use orderpay::ids::{PaymentId, RefundId};
use orderpay::money::{Amount, Currency};
use orderpay::provider::client::HttpProvider;
use orderpay::provider::mock::MockSettings;
use orderpay::provider::{
    CancelRequest, CaptureRequest, Charge, ChargeLookup, ChargeRequest, ChargeStatus, PaymentProvider,
    ProviderError, RefundRequest, RefundStatus,
};
use orderpay::webhook_signature::{self, Secret};
use rust_decimal::Decimal;
use serde_json::{Value, json};

use crate::helpers::{
    self, TestProvider, TestWire, http_client, new_key, over_both_wires, spawn_mock_provider,
    test_mock_settings,
};

/// Long enough for any answer the mock gives at once, on a busy machine.
const PATIENT: Duration = Duration::from_secs(5);

async fn mock_with(configure: impl FnOnce(&mut MockSettings)) -> TestProvider {
    let mut settings = test_mock_settings();
    settings.webhook_retry_base = Duration::from_millis(20);
    configure(&mut settings);
    spawn_mock_provider(settings).await
}

async fn mock() -> TestProvider {
    mock_with(|_| {}).await
}

fn client(provider: &TestProvider) -> HttpProvider {
    HttpProvider::new(&provider.address, PATIENT, None).unwrap()
}

/// The trait's client, on either wire.
type Client = Arc<dyn PaymentProvider>;

/// A mock provider on `wire` and what the trait's client on that wire reports of it.
struct Wired {
    mock: TestProvider,
    wire: TestWire,
}

async fn wired(wire: TestWire) -> Wired {
    wired_with(wire, |_| {}).await
}

async fn wired_with(wire: TestWire, configure: impl FnOnce(&mut MockSettings)) -> Wired {
    let mock = mock_with(|settings| {
        wire.configure_mock(settings);
        configure(settings);
    })
    .await;
    Wired { mock, wire }
}

impl Wired {
    fn client(&self) -> Client {
        self.client_timing_out(PATIENT)
    }

    fn client_timing_out(&self, timeout: Duration) -> Client {
        self.wire.client(&self.mock.address, timeout)
    }

    /// The code a refusal the mock's contract calls `code` has through this wire's client:
    /// Stripe has one code for every "not in a state for that" of a PaymentIntent.
    fn code(&self, code: &'static str) -> &'static str {
        match (self.wire, code) {
            (TestWire::Stripe, "charge_canceled" | "charge_not_capturable" | "charge_not_cancelable") => {
                "payment_intent_unexpected_state"
            }
            _ => code,
        }
    }

    /// The HTTP status of a key reused with other parameters: the mock's 422, Stripe's 400
    /// `idempotency_error`.
    fn reused_key_status(&self) -> u16 {
        if self.wire == TestWire::Stripe { 400 } else { 422 }
    }
}

fn usd(text: &str) -> Amount {
    Amount::parse(text, Currency::parse("USD").unwrap()).unwrap()
}

fn decimal(text: &str) -> Decimal {
    text.parse().unwrap()
}

/// A charge for a new payment of ours, keyed as the engine keys it (a lookup on Stripe's wire
/// finds only ours).
fn charge_request(payment_method: &str, capture: bool) -> ChargeRequest {
    let payment = PaymentId::generate();
    ChargeRequest {
        downstream_key: orderpay::payments::downstream_key(payment),
        amount: usd("10.00"),
        payment_method: payment_method.to_owned(),
        reference: payment.as_uuid(),
        capture,
        request_id: None,
    }
}

fn capture_request(charge: &Charge, amount: Option<&str>) -> CaptureRequest {
    CaptureRequest {
        charge_id: charge.id.clone(),
        downstream_key: new_key(),
        amount: amount.map(usd),
        request_id: None,
    }
}

fn cancel_request(charge: &Charge) -> CancelRequest {
    CancelRequest { charge_id: charge.id.clone(), downstream_key: new_key(), request_id: None }
}

fn refund_request(charge: &Charge, amount: &str) -> RefundRequest {
    let refund = RefundId::generate();
    RefundRequest {
        charge_id: charge.id.clone(),
        downstream_key: orderpay::refunds::downstream_key(refund),
        amount: usd(amount),
        reference: refund.as_uuid(),
        request_id: Some("req-refund-1".to_owned()),
    }
}

async fn authorize(provider: &Client, payment_method: &str) -> Charge {
    let charge = provider.create_charge(&charge_request(payment_method, false)).await.unwrap();
    assert_eq!(charge.status, ChargeStatus::RequiresCapture, "{charge:?}");
    charge
}

async fn charge(provider: &Client, payment_method: &str) -> Charge {
    let charge = provider.create_charge(&charge_request(payment_method, true)).await.unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded, "{charge:?}");
    charge
}

async fn get(provider: &Client, charge: &Charge) -> Charge {
    provider.get_charge(&charge.id, None).await.unwrap().expect("the charge exists")
}

fn refused(result: Result<impl std::fmt::Debug, ProviderError>) -> String {
    match result {
        Err(ProviderError::Refused { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Polls `check` until it returns something, for at most `PATIENT`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    check: impl FnMut() -> F,
) -> T {
    helpers::eventually(what, PATIENT, check).await
}

over_both_wires! {
async fn authorize_then_capture_everything_and_a_replayed_capture_captures_once(wire: TestWire) {
    let wired = wired(wire).await;
    let (mock, provider) = (&wired.mock, wired.client());
    let authorized = authorize(&provider, "pm_card_ok").await;
    assert_eq!((authorized.amount, authorized.amount_captured), (decimal("10.00"), Decimal::ZERO));
    let expires_at = authorized.authorization_expires_at.expect("an authorization expires");
    assert!(expires_at > Utc::now() + chrono::Duration::days(6), "7 days by default: {expires_at}");

    let capture = capture_request(&authorized, None);
    let captured = provider.capture_charge(&capture).await.unwrap();
    assert_eq!(captured.status, ChargeStatus::Succeeded);
    assert_eq!(captured.amount_captured, decimal("10.00"));
    // The same key again: the same capture, not a second one.
    assert_eq!(provider.capture_charge(&capture).await.unwrap(), captured);
    // Another key: refused, the charge is captured already.
    assert_eq!(
        refused(provider.capture_charge(&capture_request(&authorized, None)).await),
        "charge_already_captured"
    );
    // The same key with another amount is a malformed reuse, not an answer about money.
    let reused = CaptureRequest { amount: Some(usd("5.00")), ..capture.clone() };
    assert!(matches!(
        provider.capture_charge(&reused).await,
        Err(ProviderError::KeyReused { status, .. }) if status == wired.reused_key_status()
    ));

    let admin = mock.charges().await;
    assert_eq!(admin.len(), 1);
    assert_eq!(
        (
            &admin[0]["status"],
            &admin[0]["captured"],
            &admin[0]["amount_captured"],
            &admin[0]["amount_refunded"]
        ),
        (&json!("succeeded"), &json!(true), &json!("10.00"), &json!("0.00"))
    );
    assert_eq!(get(&provider, &authorized).await, captured);
}
}

over_both_wires! {
async fn a_partial_capture_releases_the_rest_and_bounds_the_refunds(wire: TestWire) {
    let wired = wired(wire).await;
    let provider = wired.client();
    let authorized = authorize(&provider, "pm_card_ok").await;
    let too_much = capture_request(&authorized, Some("10.01"));
    assert_eq!(refused(provider.capture_charge(&too_much).await), "amount_too_large");
    let captured = provider.capture_charge(&capture_request(&authorized, Some("6.50"))).await.unwrap();
    assert_eq!((captured.amount, captured.amount_captured), (decimal("10.00"), decimal("6.50")));

    assert_eq!(refused(provider.create_refund(&refund_request(&captured, "6.51")).await), "amount_too_large");
    let refund = provider.create_refund(&refund_request(&captured, "6.50")).await.unwrap();
    assert_eq!((refund.status, refund.amount), (RefundStatus::Succeeded, decimal("6.50")));
    assert_eq!(get(&provider, &captured).await.amount_refunded, decimal("6.50"));
    assert_eq!(
        refused(provider.create_refund(&refund_request(&captured, "0.01")).await),
        "charge_already_refunded"
    );
}
}

over_both_wires! {
async fn an_expired_authorization_is_canceled_and_refuses_its_capture(wire: TestWire) {
    let wired = wired_with(wire, |settings| settings.auth_ttl = Duration::from_millis(50)).await;
    let provider = wired.client();
    let authorized = authorize(&provider, "pm_card_ok").await;
    let (client, authorization) = (&provider, &authorized);
    let expired = eventually("the authorization to expire", move || async move {
        let charge = get(client, authorization).await;
        (charge.status != ChargeStatus::RequiresCapture).then_some(charge)
    })
    .await;
    assert_eq!(expired.status, ChargeStatus::Canceled { reason: "authorization_expired".into() });
    assert_eq!(expired.amount_captured, Decimal::ZERO);

    let capture = capture_request(&authorized, None);
    let error = provider.capture_charge(&capture).await.unwrap_err();
    assert!(
        matches!(&error, ProviderError::Refused { code, .. } if code == "authorization_expired"),
        "{error:?}"
    );
    // A refusal is the answer for its key: the same again, and nothing moved.
    assert_eq!(provider.capture_charge(&capture).await.unwrap_err(), error);
    assert_eq!(refused(provider.cancel_charge(&cancel_request(&authorized)).await), wired.code("charge_canceled"));
    assert_eq!(get(&provider, &authorized).await, expired);
}
}

over_both_wires! {
async fn capture_declined_authorizes_but_refuses_every_capture(wire: TestWire) {
    let wired = wired(wire).await;
    let provider = wired.client();
    let authorized = authorize(&provider, "pm_capture_declined").await;
    for _ in 0..2 {
        assert_eq!(
            refused(provider.capture_charge(&capture_request(&authorized, None)).await),
            "capture_declined"
        );
    }
    let still = get(&provider, &authorized).await;
    assert_eq!((still.status, still.amount_captured), (ChargeStatus::RequiresCapture, Decimal::ZERO));
    // Charging at once is a capture too.
    let declined = provider.create_charge(&charge_request("pm_capture_declined", true)).await.unwrap();
    assert!(matches!(declined.status, ChargeStatus::Declined { ref code, .. } if code == "capture_declined"));
    // The authorization can still be voided.
    let canceled = provider.cancel_charge(&cancel_request(&authorized)).await.unwrap();
    assert_eq!(canceled.status, ChargeStatus::Canceled { reason: "requested".into() });
}
}

over_both_wires! {
async fn cancel_voids_an_authorization_once_and_only_an_authorization(wire: TestWire) {
    let wired = wired(wire).await;
    let provider = wired.client();
    let authorized = authorize(&provider, "pm_card_ok").await;
    let cancel = cancel_request(&authorized);
    let canceled = provider.cancel_charge(&cancel).await.unwrap();
    assert_eq!(canceled.status, ChargeStatus::Canceled { reason: "requested".into() });
    assert_eq!(provider.cancel_charge(&cancel).await.unwrap(), canceled, "the same key: the same void");
    assert_eq!(refused(provider.cancel_charge(&cancel_request(&authorized)).await), wired.code("charge_canceled"));
    assert_eq!(
        refused(provider.capture_charge(&capture_request(&authorized, None)).await),
        wired.code("charge_canceled")
    );
    assert_eq!(
        refused(provider.create_refund(&refund_request(&authorized, "1.00")).await),
        "charge_not_refundable"
    );

    let captured = charge(&provider, "pm_card_ok").await;
    assert_eq!(refused(provider.cancel_charge(&cancel_request(&captured)).await), "charge_already_captured");
    let declined = provider.create_charge(&charge_request("pm_card_declined", false)).await.unwrap();
    assert_eq!(refused(provider.cancel_charge(&cancel_request(&declined)).await), wired.code("charge_not_cancelable"));
    assert_eq!(
        refused(provider.capture_charge(&capture_request(&declined, None)).await),
        wired.code("charge_not_capturable")
    );

    // An unknown charge is our bug: a 404, not a refusal.
    let ghost = Charge { id: "ch_nope".into(), ..captured.clone() };
    assert!(matches!(
        provider.cancel_charge(&cancel_request(&ghost)).await,
        Err(ProviderError::Rejected { status: 404, .. })
    ));
    assert_eq!(provider.get_charge("ch_nope", None).await, Ok(None));
}
}

over_both_wires! {
async fn a_pending_authorization_becomes_capturable_when_it_settles(wire: TestWire) {
    let wired = wired(wire).await;
    let provider = wired.client();
    let pending = provider.create_charge(&charge_request("pm_provider_pending", false)).await.unwrap();
    assert_eq!(pending.status, ChargeStatus::Pending);
    assert_eq!(
        refused(provider.capture_charge(&capture_request(&pending, None)).await),
        wired.code("charge_not_capturable")
    );
    let (client, pending_ref) = (&provider, &pending);
    let authorized = eventually("the authorization to settle", move || async move {
        let charge = get(client, pending_ref).await;
        (charge.status == ChargeStatus::RequiresCapture).then_some(charge)
    })
    .await;
    assert!(authorized.authorization_expires_at.is_some());
    let captured = provider.capture_charge(&capture_request(&authorized, None)).await.unwrap();
    assert_eq!(captured.amount_captured, decimal("10.00"));
}
}

over_both_wires! {
async fn a_refund_succeeds_once_per_key_and_is_found_by_its_key(wire: TestWire) {
    let wired = wired(wire).await;
    let (mock, provider) = (&wired.mock, wired.client());
    let charged = charge(&provider, "pm_card_ok").await;
    let request = refund_request(&charged, "4.00");
    assert_eq!(provider.find_refund(&request.downstream_key, Some(&request.charge_id), None).await, Ok(None), "never received");

    let refund = provider.create_refund(&request).await.unwrap();
    assert_eq!(
        (refund.status.clone(), refund.amount, refund.charge_id.as_str()),
        (RefundStatus::Succeeded, decimal("4.00"), charged.id.as_str())
    );
    assert_eq!(provider.create_refund(&request).await.unwrap(), refund, "the same key: the same refund");
    assert_eq!(provider.find_refund(&request.downstream_key, Some(&request.charge_id), None).await, Ok(Some(refund.clone())));
    let reused = RefundRequest { amount: usd("3.00"), ..request.clone() };
    assert!(matches!(
        provider.create_refund(&reused).await,
        Err(ProviderError::KeyReused { status, .. }) if status == wired.reused_key_status()
    ));

    let refunds = mock.refunds().await;
    assert_eq!(refunds.len(), 1, "one refund: {refunds:?}");
    assert_eq!(
        (&refunds[0]["id"], &refunds[0]["amount"], &refunds[0]["requests"]),
        (&json!(refund.id), &json!("4.00"), &json!(2))
    );
    assert_eq!(wire.charge_id(refunds[0]["charge"].as_str().unwrap()), charged.id);
    assert_eq!(
        (&refunds[0]["idempotency_key"], &refunds[0]["request_id"]),
        (&json!(request.downstream_key), &json!("req-refund-1"))
    );
    assert_eq!(mock.charges().await[0]["amount_refunded"], "4.00");
    // The rest can be refunded in a second refund.
    let rest = provider.create_refund(&refund_request(&charged, "6.00")).await.unwrap();
    assert_eq!(rest.status, RefundStatus::Succeeded);
    assert_eq!(get(&provider, &charged).await.amount_refunded, decimal("10.00"));
}
}

over_both_wires! {
async fn a_pending_refund_counts_at_once_and_succeeds_after_settling(wire: TestWire) {
    let wired = wired(wire).await;
    let (mock, provider) = (&wired.mock, wired.client());
    let charged = charge(&provider, "pm_refund_pending").await;
    let request = refund_request(&charged, "10.00");
    let refund = provider.create_refund(&request).await.unwrap();
    assert_eq!(refund.status, RefundStatus::Pending);
    // Pending refunds count against the remainder: no over-refund while it settles.
    assert_eq!(get(&provider, &charged).await.amount_refunded, decimal("10.00"));
    assert_eq!(
        refused(provider.create_refund(&refund_request(&charged, "0.01")).await),
        "charge_already_refunded"
    );
    let (client, key) = (&provider, request.downstream_key.as_str());
    let settled = eventually("the refund to settle", move || async move {
        let refund = client.find_refund(key, None, None).await.unwrap().unwrap();
        (refund.status != RefundStatus::Pending).then_some(refund)
    })
    .await;
    assert_eq!(settled.status, RefundStatus::Succeeded);
    assert_eq!(mock.refunds().await[0]["status"], "succeeded");
}
}

over_both_wires! {
async fn a_declined_refund_fails_and_moves_nothing(wire: TestWire) {
    let wired = wired(wire).await;
    let provider = wired.client();
    let charged = charge(&provider, "pm_refund_declined").await;
    let refund = provider.create_refund(&refund_request(&charged, "10.00")).await.unwrap();
    assert!(
        matches!(&refund.status, RefundStatus::Failed { code, .. } if code == "refund_declined"),
        "{refund:?}"
    );
    assert_eq!(get(&provider, &charged).await.amount_refunded, Decimal::ZERO);
}
}

over_both_wires! {
async fn a_refund_answered_too_late_was_made_and_is_found_by_its_key(wire: TestWire) {
    let wired = wired_with(wire, |settings| settings.timeout_hold = Duration::from_millis(1500)).await;
    let mock = &wired.mock;
    let impatient = wired.client_timing_out(Duration::from_millis(500));
    let provider = wired.client();
    let charged = charge(&provider, "pm_refund_timeout").await;
    let request = refund_request(&charged, "2.00");
    assert_eq!(impatient.create_refund(&request).await, Err(ProviderError::Timeout));
    let found =
        provider.find_refund(&request.downstream_key, Some(&request.charge_id), None).await.unwrap().expect("the refund was made");
    assert_eq!(found.status, RefundStatus::Succeeded);
    // Re-sent with the same key, it answers at once with the same refund.
    assert_eq!(impatient.create_refund(&request).await, Ok(found));
    assert_eq!(mock.refunds().await.len(), 1);
}
}

over_both_wires! {
async fn refunds_of_charges_that_were_not_captured_are_refused(wire: TestWire) {
    let wired = wired(wire).await;
    let (mock, provider) = (&wired.mock, wired.client());
    let authorized = authorize(&provider, "pm_card_ok").await;
    assert_eq!(
        refused(provider.create_refund(&refund_request(&authorized, "1.00")).await),
        "charge_not_refundable"
    );
    let declined = provider.create_charge(&charge_request("pm_card_declined", true)).await.unwrap();
    assert_eq!(
        refused(provider.create_refund(&refund_request(&declined, "1.00")).await),
        "charge_not_refundable"
    );
    assert!(mock.refunds().await.is_empty());
    // A refusal made no refund: nothing to find by its key.
    let request = refund_request(&authorized, "1.00");
    refused(provider.create_refund(&request).await);
    assert_eq!(provider.find_refund(&request.downstream_key, Some(&request.charge_id), None).await, Ok(None));
}
}

#[tokio::test]
async fn bad_requests_are_answered_400_json_never_a_crash() {
    let mock = mock().await;
    let provider: Client = Arc::new(client(&mock));
    let charged = charge(&provider, "pm_card_ok").await;
    let http = http_client();
    let post = |path: &str, body: &str, key: Option<&str>| {
        let mut request = http
            .post(format!("{}{path}", mock.address))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send()
    };
    let refunds = "/v1/refunds";
    let capture = format!("/v1/charges/{}/capture", charged.id);
    let valid_refund = json!({"charge": charged.id, "amount": "1.00", "reference": "r"}).to_string();
    let cases = [
        (refunds, valid_refund.as_str(), None),
        (refunds, "{", Some("k1")),
        (refunds, "[]", Some("k2")),
        (refunds, r#"{"charge": "x", "amount": 1.5, "reference": "r"}"#, Some("k3")),
        (
            refunds,
            &json!({"charge": charged.id, "amount": "1.001", "reference": "r"}).to_string(),
            Some("k4"),
        ),
        (
            refunds,
            &json!({"charge": charged.id, "amount": "1.00", "currency": "EUR", "reference": "r"}).to_string(),
            Some("k5"),
        ),
        (
            refunds,
            &json!({"charge": charged.id, "amount": "1.00", "reference": "r", "extra": 1}).to_string(),
            Some("k6"),
        ),
        (capture.as_str(), r#"{"amount": "abc"}"#, Some("k7")),
        (capture.as_str(), "\u{0}", Some("k8")),
        (
            "/v1/charges",
            r#"{"amount": "1.00", "currency": "XXX", "payment_method": "pm_card_ok", "reference": "r"}"#,
            Some("k9"),
        ),
        (
            "/v1/charges",
            r#"{"amount": "-1", "currency": "USD", "payment_method": "pm_card_ok", "reference": "r"}"#,
            Some("k10"),
        ),
    ];
    for (path, body, key) in cases {
        let response = post(path, body, key).await.unwrap();
        assert_eq!(response.status(), 400, "{path} {body}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request", "{error}");
    }
    let lookup = http.get(format!("{}/v1/refunds", mock.address)).send().await.unwrap();
    assert_eq!(lookup.status(), 400);
    assert!(mock.refunds().await.is_empty());
    assert_eq!(mock.charges().await.len(), 1);
}

#[tokio::test]
async fn calls_without_the_right_credential_get_401_and_admin_stays_open() {
    let mock = mock_with(|settings| settings.api_key = Some("sk_mock_right".to_owned())).await;
    let anonymous = client(&mock);
    let wrong = HttpProvider::new(&mock.address, PATIENT, Some("sk_mock_wrong".to_owned())).unwrap();
    let right = HttpProvider::new(&mock.address, PATIENT, Some("sk_mock_right".to_owned())).unwrap();
    let request = charge_request("pm_card_ok", true);
    for refused_client in [&anonymous, &wrong] {
        let error = refused_client.create_charge(&request).await.unwrap_err();
        assert!(matches!(error, ProviderError::Unauthorized { status: 401, .. }), "{error:?}");
        // A lookup refused is not "never received".
        let lookup = refused_client.find_charge(&ChargeLookup::by_key(&request.downstream_key), None).await;
        assert!(matches!(lookup, Err(ProviderError::Unauthorized { status: 401, .. })), "{lookup:?}");
    }
    let raw = http_client().get(format!("{}/v1/charges/ch_1", mock.address)).send().await.unwrap();
    assert_eq!(raw.status(), 401);
    assert_eq!(raw.json::<Value>().await.unwrap()["error"]["type"], "authentication_error");
    assert!(mock.charges().await.is_empty(), "nothing was charged");

    let charged = right.create_charge(&request).await.unwrap();
    assert_eq!(charged.status, ChargeStatus::Succeeded);
    assert_eq!(
        right.find_charge(&ChargeLookup::by_key(&request.downstream_key), None).await,
        Ok(Some(charged))
    );
    assert_eq!(mock.charges().await.len(), 1, "/_admin needs no credential");
}

over_both_wires! {
async fn faults_apply_to_captures_and_refunds_as_to_charges(wire: TestWire) {
    let wired = wired_with(wire, |settings| settings.timeout_hold = Duration::from_millis(1500)).await;
    let (mock, provider) = (&wired.mock, wired.client());
    let impatient = wired.client_timing_out(Duration::from_millis(500));
    let authorized = authorize(&provider, "pm_card_ok").await;
    let charged = charge(&provider, "pm_card_ok").await;

    // 503 without acting.
    mock.set_faults(json!({"error_rate": 1.0})).await;
    let capture = capture_request(&authorized, None);
    assert_eq!(provider.capture_charge(&capture).await, Err(ProviderError::ServerError(503)));
    let refund = refund_request(&charged, "1.00");
    assert_eq!(provider.create_refund(&refund).await, Err(ProviderError::ServerError(503)));
    let cancel = cancel_request(&authorized);
    assert_eq!(provider.cancel_charge(&cancel).await, Err(ProviderError::ServerError(503)));
    mock.set_faults(json!({})).await;
    assert_eq!(get(&provider, &authorized).await.status, ChargeStatus::RequiresCapture);
    assert_eq!(provider.find_refund(&refund.downstream_key, Some(&refund.charge_id), None).await, Ok(None));

    // Acted, then the answer is held past the client's timeout.
    mock.set_faults(json!({"timeout_rate": 1.0})).await;
    assert_eq!(impatient.capture_charge(&capture).await, Err(ProviderError::Timeout));
    assert_eq!(impatient.create_refund(&refund).await, Err(ProviderError::Timeout));
    mock.set_faults(json!({})).await;
    assert_eq!(get(&provider, &authorized).await.status, ChargeStatus::Succeeded);
    let made =
        provider.find_refund(&refund.downstream_key, Some(&refund.charge_id), None).await.unwrap().expect("the refund was made");
    assert_eq!(made.status, RefundStatus::Succeeded);
    // Re-sent with their keys: the same capture and refund, at once.
    assert_eq!(
        impatient.capture_charge(&capture).await.map(|charge| charge.amount_captured),
        Ok(decimal("10.00"))
    );
    assert_eq!(impatient.create_refund(&refund).await, Ok(made));
    assert_eq!(mock.refunds().await.len(), 1);

    let bad = http_client()
        .post(format!("{}/_admin/faults", mock.address))
        .json(&json!({"webhook_drop_rate": 2}))
        .send();
    assert_eq!(bad.await.unwrap().status(), 400);
}
}

over_both_wires! {
async fn a_script_says_what_each_next_write_does_in_order_then_the_faults_apply_again(wire: TestWire) {
    let wired = wired_with(wire, |settings| settings.timeout_hold = Duration::from_millis(1500)).await;
    let mock = &wired.mock;
    let (provider, impatient) =
        (wired.client(), wired.client_timing_out(Duration::from_millis(500)));
    let steps = json!([
        {"act": "unavailable"}, {"act": "hold"}, {"act": "later", "after_ms": 1000}, {"act": "never"}, {"act": "now"}
    ]);
    mock.script(steps.clone()).await;
    assert_eq!(get_json(mock, "/_admin/script").await, steps);
    let found = |request: &ChargeRequest| {
        let key = request.downstream_key.clone();
        let provider = &provider;
        async move { provider.find_charge(&ChargeLookup::by_key(&key), None).await.unwrap().map(|charge| charge.status) }
    };

    let down = charge_request("pm_card_ok", true);
    assert_eq!(provider.create_charge(&down).await, Err(ProviderError::ServerError(503)));
    assert_eq!(found(&down).await, None, "503 without acting");

    let held = charge_request("pm_card_ok", true);
    assert_eq!(impatient.create_charge(&held).await, Err(ProviderError::Timeout));
    assert_eq!(found(&held).await, Some(ChargeStatus::Succeeded), "acted, the answer lost");

    let late = charge_request("pm_card_ok", true);
    assert_eq!(impatient.create_charge(&late).await, Err(ProviderError::Timeout));
    assert_eq!(found(&late).await, None, "not acted on yet when the sender gave up");
    let late = &late;
    eventually("the late charge", move || async move { found(late).await }).await;

    let never = charge_request("pm_card_ok", true);
    assert_eq!(impatient.create_charge(&never).await, Err(ProviderError::Timeout));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(found(&never).await, None, "never acted on, after the hold too");

    let now = charge_request("pm_card_ok", false);
    assert_eq!(
        impatient.create_charge(&now).await.map(|charge| charge.status),
        Ok(ChargeStatus::RequiresCapture)
    );
    assert_eq!(get_json(mock, "/_admin/script").await, json!([]), "every step taken");

    // The script is spent: the faults apply again (none here), to captures and refunds alike.
    mock.script(json!([{"act": "unavailable"}])).await;
    let authorized =
        get(&provider, &provider.find_charge(&ChargeLookup::by_key(&now.downstream_key), None).await.unwrap().unwrap()).await;
    let capture = capture_request(&authorized, None);
    assert_eq!(provider.capture_charge(&capture).await, Err(ProviderError::ServerError(503)));
    assert_eq!(
        provider.capture_charge(&capture).await.map(|charge| charge.status),
        Ok(ChargeStatus::Succeeded)
    );

    let too_late = http_client()
        .post(format!("{}/_admin/script", mock.address))
        .json(&json!([{"act": "later", "after_ms": 60_001}]))
        .send();
    assert_eq!(too_late.await.unwrap().status(), 400);
    let unknown =
        http_client().post(format!("{}/_admin/script", mock.address)).json(&json!([{"act": "twice"}])).send();
    assert_eq!(unknown.await.unwrap().status(), 400);
}
}

over_both_wires! {
async fn a_parked_write_is_acted_on_when_the_test_says_or_never(wire: TestWire) {
    let wired = wired_with(wire, |settings| settings.timeout_hold = Duration::from_millis(600)).await;
    let mock = &wired.mock;
    let (provider, impatient) =
        (wired.client(), wired.client_timing_out(Duration::from_millis(300)));
    mock.script(json!([{"act": "park"}, {"act": "park"}])).await;
    let (late, never) = (charge_request("pm_card_ok", true), charge_request("pm_card_ok", true));
    for request in [&late, &never] {
        assert_eq!(impatient.create_charge(request).await, Err(ProviderError::Timeout));
    }
    assert_eq!(get_json(mock, "/_admin/parked").await, json!([late.downstream_key, never.downstream_key]));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(provider.find_charge(&ChargeLookup::by_key(&late.downstream_key), None).await, Ok(None), "not acted on while parked");

    let address = mock.address.clone();
    let post = |path: String| {
        let url = format!("{address}{path}");
        async move {
            let response = http_client().post(url).send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap())
        }
    };
    let acted = post(format!("/_admin/parked/{}/act", late.downstream_key)).await;
    assert_eq!(acted, (200, json!({"act": 1})));
    let found = provider.find_charge(&ChargeLookup::by_key(&late.downstream_key), None).await.unwrap().map(|charge| charge.status);
    assert_eq!(found, Some(ChargeStatus::Succeeded), "acted on, long after its sender gave up");
    assert_eq!(
        post(format!("/_admin/parked/{}/drop", never.downstream_key)).await,
        (200, json!({"drop": 1}))
    );
    assert_eq!(provider.find_charge(&ChargeLookup::by_key(&never.downstream_key), None).await, Ok(None), "dropped: never acted on");
    assert_eq!(get_json(mock, "/_admin/parked").await, json!([]));
    assert_eq!(post(format!("/_admin/parked/{}/twice", late.downstream_key)).await.0, 404);
}
}

/// A webhook receiver on port 0 that records every request and answers 500 to the first
/// `failures` of them, 200 after.
struct Receiver {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
    server: actix_web::dev::ServerHandle,
}

#[derive(Debug, Clone)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

impl Received {
    fn event(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.server.stop(false));
    }
}

struct ReceiverState {
    received: Arc<Mutex<Vec<Received>>>,
    failures: usize,
    calls: AtomicUsize,
}

async fn receive(state: web::Data<ReceiverState>, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let header = |name: &str| {
        request.headers().get(name).and_then(|value| value.to_str().ok()).unwrap_or_default().to_owned()
    };
    state.received.lock().unwrap().push(Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: body.to_vec(),
    });
    if state.calls.fetch_add(1, Ordering::SeqCst) < state.failures {
        HttpResponse::InternalServerError().finish()
    } else {
        HttpResponse::Ok().finish()
    }
}

impl Receiver {
    async fn start(failures: usize) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}/hooks", listener.local_addr().unwrap().port());
        let received = Arc::new(Mutex::new(Vec::new()));
        let state = web::Data::new(ReceiverState {
            received: received.clone(),
            failures,
            calls: AtomicUsize::new(0),
        });
        let server =
            HttpServer::new(move || App::new().app_data(state.clone()).default_service(web::to(receive)))
                .workers(1)
                .listen(listener)
                .unwrap()
                .run();
        let handle = server.handle();
        tokio::spawn(server);
        Receiver { url, received, server: handle }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until at least `count` requests arrived; returns them all.
    async fn wait_for(&self, count: usize) -> Vec<Received> {
        eventually(&format!("{count} webhook requests"), move || async move {
            let received = self.received();
            (received.len() >= count).then_some(received)
        })
        .await
    }
}

/// A mock sending signed webhooks to a fresh receiver; returns both and the secret.
async fn mock_with_webhooks(
    failures: usize,
    configure: impl FnOnce(&mut MockSettings),
) -> (TestProvider, Receiver, Secret) {
    let receiver = Receiver::start(failures).await;
    let secret = Secret::generate().unwrap();
    let mock = mock_with(|settings| {
        settings.webhook_url = Some(receiver.url.clone());
        settings.webhook_secret = Some(secret.reveal());
        configure(settings);
    })
    .await;
    (mock, receiver, secret)
}

fn assert_signed(received: &Received, secret: &Secret) {
    let verified = webhook_signature::verify(
        std::slice::from_ref(secret),
        &received.id,
        &received.timestamp,
        &received.signature,
        &received.body,
        Utc::now(),
        Duration::from_secs(300),
    );
    assert_eq!(verified, Ok(()), "{received:?}");
    assert!(received.id.starts_with("evt_"));
    assert_eq!(received.event()["id"].as_str(), Some(received.id.as_str()), "webhook-id is the event id");
}

async fn get_json(mock: &TestProvider, path: &str) -> Value {
    http_client().get(format!("{}{path}", mock.address)).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn every_final_state_sends_a_signed_event_with_the_object_as_get_returns_it() {
    let (mock, receiver, secret) = mock_with_webhooks(0, |_| {}).await;
    let provider: Client = Arc::new(client(&mock));
    let charged = charge(&provider, "pm_card_ok").await;
    let first = receiver.wait_for(1).await;
    assert_signed(&first[0], &secret);
    let event = first[0].event();
    assert_eq!(event["type"], "charge.succeeded");
    assert!(event["created"].as_i64().is_some_and(|created| created > 1_700_000_000), "{event}");
    assert_eq!(event["data"]["object"], get_json(&mock, &format!("/v1/charges/{}", charged.id)).await);

    let authorized = authorize(&provider, "pm_card_ok").await;
    provider.capture_charge(&capture_request(&authorized, Some("4.00"))).await.unwrap();
    let voided = authorize(&provider, "pm_card_ok").await;
    provider.cancel_charge(&cancel_request(&voided)).await.unwrap();
    provider.create_charge(&charge_request("pm_card_declined", true)).await.unwrap();
    let refund = provider.create_refund(&refund_request(&charged, "1.00")).await.unwrap();
    let declined_refunds = charge(&provider, "pm_refund_declined").await;
    provider.create_refund(&refund_request(&declined_refunds, "1.00")).await.unwrap();

    let all = receiver.wait_for(9).await;
    let mut seen: Vec<(String, String, String)> = all
        .iter()
        .map(|received| {
            assert_signed(received, &secret);
            let event = received.event();
            let object = &event["data"]["object"];
            let field = |name: &str| object[name].as_str().unwrap_or_default().to_owned();
            (field("id"), event["type"].as_str().unwrap().to_owned(), field("status"))
        })
        .collect();
    // Deliveries run side by side: compare as a set, then check the order of one object's events.
    seen.sort();
    let mut expected = vec![
        (charged.id.clone(), "charge.succeeded".to_owned(), "succeeded".to_owned()),
        (authorized.id.clone(), "charge.succeeded".to_owned(), "requires_capture".to_owned()),
        (authorized.id.clone(), "charge.captured".to_owned(), "succeeded".to_owned()),
        (voided.id.clone(), "charge.succeeded".to_owned(), "requires_capture".to_owned()),
        (voided.id.clone(), "charge.canceled".to_owned(), "canceled".to_owned()),
        (refund.id.clone(), "refund.succeeded".to_owned(), "succeeded".to_owned()),
        (declined_refunds.id.clone(), "charge.succeeded".to_owned(), "succeeded".to_owned()),
    ];
    let failed_charge =
        seen.iter().find(|(_, kind, _)| kind == "charge.failed").cloned().expect("charge.failed");
    assert_eq!(failed_charge.2, "declined");
    let failed_refund =
        seen.iter().find(|(_, kind, _)| kind == "refund.failed").cloned().expect("refund.failed");
    assert_eq!(failed_refund.2, "failed");
    expected.extend([failed_charge, failed_refund]);
    expected.sort();
    assert_eq!(seen, expected);

    let log = mock.webhooks().await;
    assert_eq!(log.len(), 9);
    assert!(
        log.iter()
            .all(|event| event["delivered"] == true && event["attempts"].as_array().unwrap().len() == 1)
    );
    let captured = all.iter().map(Received::event).find(|event| event["type"] == "charge.captured").unwrap();
    assert_eq!(captured["data"]["object"]["amount_captured"], "4.00");
}

#[tokio::test]
async fn a_pending_charge_sends_charge_succeeded_when_it_settles_even_unread() {
    let (mock, receiver, secret) = mock_with_webhooks(0, |_| {}).await;
    let provider: Client = Arc::new(client(&mock));
    let pending = provider.create_charge(&charge_request("pm_provider_pending", true)).await.unwrap();
    assert_eq!(pending.status, ChargeStatus::Pending);
    assert!(receiver.received().is_empty(), "nothing final yet");
    // Nobody reads the charge: the mock settles it on time by itself.
    let received = receiver.wait_for(1).await;
    assert_signed(&received[0], &secret);
    let event = received[0].event();
    assert_eq!(
        (event["type"].as_str(), event["data"]["object"]["id"].as_str()),
        (Some("charge.succeeded"), Some(pending.id.as_str()))
    );
    assert_eq!(event["data"]["object"]["status"], "succeeded");
    assert_eq!(get(&provider, &pending).await.status, ChargeStatus::Succeeded);
    assert_eq!(receiver.received().len(), 1, "settled once, one event");
}

#[tokio::test]
async fn an_authorization_that_expires_unread_sends_charge_canceled() {
    let (mock, receiver, _secret) =
        mock_with_webhooks(0, |settings| settings.auth_ttl = Duration::from_millis(100)).await;
    let provider: Client = Arc::new(client(&mock));
    let authorized = authorize(&provider, "pm_card_ok").await;
    let received = receiver.wait_for(2).await;
    let events: Vec<Value> = received.iter().map(Received::event).collect();
    let kinds: Vec<&str> = events.iter().filter_map(|event| event["type"].as_str()).collect();
    assert_eq!(kinds, ["charge.succeeded", "charge.canceled"]);
    assert_eq!(events[1]["data"]["object"]["id"], authorized.id.as_str());
    assert_eq!(events[1]["data"]["object"]["cancellation_reason"], "authorization_expired");
}

#[tokio::test]
async fn a_pending_refund_sends_refund_succeeded_when_it_settles() {
    let (mock, receiver, _secret) = mock_with_webhooks(0, |_| {}).await;
    let provider: Client = Arc::new(client(&mock));
    let charged = charge(&provider, "pm_refund_pending").await;
    let refund = provider.create_refund(&refund_request(&charged, "3.00")).await.unwrap();
    assert_eq!(refund.status, RefundStatus::Pending);
    let received = receiver.wait_for(2).await;
    let event =
        received.iter().map(Received::event).find(|event| event["type"] == "refund.succeeded").unwrap();
    assert_eq!(event["data"]["object"]["id"], refund.id.as_str());
    assert_eq!(event["data"]["object"]["status"], "succeeded");
    assert_eq!(event["data"]["object"], get_json(&mock, &format!("/v1/refunds/{}", refund.id)).await);
}

#[tokio::test]
async fn the_duplicate_fault_sends_each_event_twice_with_the_same_id() {
    let (mock, receiver, secret) = mock_with_webhooks(0, |_| {}).await;
    mock.set_faults(json!({"webhook_duplicate_rate": 1.0})).await;
    let provider: Client = Arc::new(client(&mock));
    charge(&provider, "pm_card_ok").await;
    let received = receiver.wait_for(2).await;
    assert_eq!(received[0].id, received[1].id, "one event, twice");
    assert_eq!(received[0].body, received[1].body);
    for copy in &received {
        assert_signed(copy, &secret);
    }
    let mock = &mock;
    let log = eventually("both deliveries logged", move || async move {
        let log = mock.webhooks().await;
        (log[0]["attempts"].as_array().unwrap().len() == 2).then_some(log)
    })
    .await;
    assert_eq!((log.len(), &log[0]["copies"], &log[0]["delivered"]), (1, &json!(2), &json!(true)));
}

#[tokio::test]
async fn the_drop_fault_sends_nothing() {
    let (mock, receiver, _secret) = mock_with_webhooks(0, |_| {}).await;
    mock.set_faults(json!({"webhook_drop_rate": 1.0})).await;
    let provider: Client = Arc::new(client(&mock));
    let dropped = charge(&provider, "pm_card_ok").await;
    mock.set_faults(json!({})).await;
    let sent = charge(&provider, "pm_card_ok").await;
    // Once the second event arrived, the first (never queued) cannot be on its way.
    let received = receiver.wait_for(1).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].event()["data"]["object"]["id"], sent.id.as_str());
    let log = mock.webhooks().await;
    assert_eq!(log[0]["object_id"], dropped.id.as_str());
    assert_eq!(
        (&log[0]["copies"], &log[0]["attempts"], &log[0]["delivered"]),
        (&json!(0), &json!([]), &json!(false))
    );
}

#[tokio::test]
async fn a_failing_receiver_gets_retries_until_it_answers_2xx() {
    let (mock, receiver, secret) = mock_with_webhooks(2, |_| {}).await;
    let provider: Client = Arc::new(client(&mock));
    charge(&provider, "pm_card_ok").await;
    let received = receiver.wait_for(3).await;
    assert!(received.iter().all(|attempt| attempt.id == received[0].id && attempt.body == received[0].body));
    for attempt in &received {
        assert_signed(attempt, &secret);
    }
    let mock = &mock;
    let log = eventually("the third attempt logged", move || async move {
        let log = mock.webhooks().await;
        (log[0]["delivered"] == true).then_some(log)
    })
    .await;
    let statuses: Vec<&Value> =
        log[0]["attempts"].as_array().unwrap().iter().map(|attempt| &attempt["status"]).collect();
    assert_eq!(statuses, [&json!(500), &json!(500), &json!(200)]);
    assert_eq!(receiver.received().len(), 3, "no attempt after the 2xx");
}

#[tokio::test]
async fn a_receiver_that_never_answers_2xx_gets_five_attempts() {
    let (mock, receiver, _secret) = mock_with_webhooks(usize::MAX, |_| {}).await;
    let provider: Client = Arc::new(client(&mock));
    charge(&provider, "pm_card_ok").await;
    receiver.wait_for(5).await;
    let mock = &mock;
    let log = eventually("five attempts logged", move || async move {
        let log = mock.webhooks().await;
        (log[0]["attempts"].as_array().unwrap().len() == 5).then_some(log)
    })
    .await;
    assert_eq!(log[0]["delivered"], false);
}

#[tokio::test]
async fn a_delayed_event_is_overtaken_by_a_later_one() {
    let (mock, receiver, _secret) = mock_with_webhooks(0, |_| {}).await;
    let provider: Client = Arc::new(client(&mock));
    mock.set_faults(json!({"webhook_delay_ms": 800})).await;
    let first = charge(&provider, "pm_card_ok").await;
    mock.set_faults(json!({})).await;
    let second = charge(&provider, "pm_card_ok").await;
    let received = receiver.wait_for(2).await;
    let order: Vec<Value> = received.iter().map(|r| r.event()["data"]["object"]["id"].clone()).collect();
    assert_eq!(order, [json!(second.id), json!(first.id)], "the later event arrived first");
    let log = mock.webhooks().await;
    assert_eq!((&log[0]["object_id"], &log[0]["delay_ms"]), (&json!(first.id), &json!(800)));
}

#[tokio::test]
async fn the_mock_refuses_a_webhook_url_without_a_secret() {
    let mut settings = test_mock_settings();
    settings.webhook_url = Some("http://127.0.0.1:9/hooks".to_owned());
    assert!(orderpay::provider::mock::MockProvider::build(settings.clone()).is_err());
    settings.webhook_secret = Some("whsec_tooshort".to_owned());
    assert!(orderpay::provider::mock::MockProvider::build(settings).is_err());
}

#[tokio::test]
async fn webhooks_by_hand_leave_only_when_delivered_and_as_often_as_delivered() {
    let (mock, receiver, secret) = mock_with_webhooks(0, |settings| settings.webhooks_by_hand = true).await;
    let provider: Client = Arc::new(client(&mock));
    charge(&provider, "pm_card_ok").await;
    let log = mock.webhooks().await;
    assert_eq!((log.len(), &log[0]["copies"], &log[0]["type"]), (1, &json!(0), &json!("charge.succeeded")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(receiver.received().is_empty(), "nothing leaves on its own");

    let deliver = |id: String| {
        let url = format!("{}/_admin/webhooks/{id}/deliver", mock.address);
        async move { http_client().post(url).send().await.unwrap() }
    };
    let id = log[0]["id"].as_str().unwrap().to_owned();
    for copy in 1..=2 {
        let answer = deliver(id.clone()).await;
        assert_eq!(answer.status(), 200);
        assert_eq!(helpers::json(answer).await, json!({"status": 200}));
        let received = receiver.received();
        assert_eq!(received.len(), copy, "one copy per delivery");
        assert_signed(&received[copy - 1], &secret);
        assert_eq!(received[copy - 1].id, id);
    }
    assert_eq!(mock.webhooks().await[0]["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(deliver("evt_unknown".to_owned()).await.status(), 404);
}

/// Why the Stripe adapter lists and never searches: on the mock's Stripe wire, as at Stripe, a
/// new PaymentIntent is missing from Search until its index catches up, while the listing the
/// adapter's lookup reads finds it at once. A lookup by Search read as "never received" would
/// give up a charged payment (the model's mutant "a lookup that misses a charge").
#[tokio::test]
async fn stripe_s_search_lags_where_the_adapter_s_listing_does_not() {
    let lag = Duration::from_millis(400);
    let wired = wired_with(TestWire::Stripe, |settings| settings.search_lag = lag).await;
    let provider = wired.client();
    let request = charge_request("pm_card_ok", true);
    let charged = provider.create_charge(&request).await.unwrap();
    let search = || async {
        let query = format!("metadata['orderpay_payment_id']:'{}'", request.reference);
        let url = reqwest::Url::parse_with_params(
            &format!("{}/v1/payment_intents/search", wired.mock.address),
            &[("query", query.as_str())],
        )
        .unwrap();
        let response =
            http_client().get(url).bearer_auth(crate::helpers::STRIPE_TEST_KEY).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let found: Value = response.json().await.unwrap();
        found["data"].as_array().unwrap().iter().map(|intent| intent["id"].clone()).collect::<Vec<_>>()
    };
    assert_eq!(search().await, Vec::<Value>::new(), "not indexed yet");
    let found = provider.find_charge(&ChargeLookup::by_key(&request.downstream_key), None).await.unwrap();
    assert_eq!(found.map(|charge| charge.id), Some(charged.id.clone()), "the listing sees it at once");
    tokio::time::sleep(lag + Duration::from_millis(100)).await;
    assert_eq!(search().await, vec![json!(charged.id)], "indexed after the lag");
}

/// The Stripe adapter's lookup lists only the PaymentIntents created in its window, which ends
/// five minutes after our last send: it sends the window with the listing, and the mock's
/// Stripe wire applies it as Stripe does. A lookup told of a send six minutes before the
/// charge was made does not see it; one told of the real send does, as does one told of none.
#[tokio::test]
async fn a_stripe_lookup_lists_up_to_five_minutes_after_the_last_send() {
    let wired = wired(TestWire::Stripe).await;
    let provider = wired.client();
    let request = charge_request("pm_card_ok", true);
    let sent_at = Utc::now();
    let charged = provider.create_charge(&request).await.unwrap();
    let find = |last_send_at| {
        let lookup = ChargeLookup { downstream_key: request.downstream_key.clone(), last_send_at };
        let provider = provider.clone();
        async move { provider.find_charge(&lookup, None).await.unwrap().map(|charge| charge.id) }
    };
    assert_eq!(find(Some(sent_at)).await, Some(charged.id.clone()));
    assert_eq!(find(None).await, Some(charged.id.clone()), "no send time: no end to the window");
    let long_before = sent_at - chrono::Duration::minutes(6);
    assert_eq!(find(Some(long_before)).await, None, "made after the window's end");

    // The window is applied by the listing itself, not only by the adapter.
    let list = |window: [(&str, i64); 2]| {
        let pairs = window.map(|(name, unix)| (name, unix.to_string()));
        let url =
            reqwest::Url::parse_with_params(&format!("{}/v1/payment_intents", wired.mock.address), &pairs)
                .unwrap();
        async move {
            let response =
                http_client().get(url).bearer_auth(crate::helpers::STRIPE_TEST_KEY).send().await.unwrap();
            assert_eq!(response.status(), 200);
            let page: Value = response.json().await.unwrap();
            page["data"].as_array().unwrap().iter().map(|intent| intent["id"].clone()).collect::<Vec<_>>()
        }
    };
    let (now, minute) = (sent_at.timestamp(), 60);
    assert_eq!(
        list([("created[gte]", now - minute), ("created[lte]", now + minute)]).await,
        vec![json!(charged.id)]
    );
    assert_eq!(
        list([("created[gte]", now - 2 * minute), ("created[lte]", now - minute)]).await,
        Vec::<Value>::new()
    );
}
