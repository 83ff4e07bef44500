//! The Stripe adapter against localstripe, a local stand-in for Stripe's API: `StripeProvider`
//! driven through the `PaymentProvider` trait, and one payment through a real `orderpay serve`
//! with `ORDERPAY_PROVIDER=stripe`. `make test-stripe` starts localstripe and sets
//! `LOCALSTRIPE_URL`; `make test` leaves this module out. localstripe ignores Idempotency-Key
//! and has no disputes, search or webhooks for refunds and captures: docs/providers.md says what
//! these tests cannot prove.

use std::time::Duration;

use orderpay::ids::{PaymentId, RefundId};
use orderpay::money::{Amount, Currency};
use orderpay::provider::stripe::{ApiKey, StripeProvider};
use orderpay::provider::{
    CancelRequest, CaptureRequest, Charge, ChargeLookup, ChargeRequest, ChargeStatus, PaymentProvider,
    ProviderError, RefundRequest, RefundStatus,
};
use rust_decimal::Decimal;
use serde_json::json;

use orderpay_fault_proxy::{FaultProxy, Faults};

use crate::helpers::{assert_problem, json, new_key, spawn_app};
use crate::process::ServiceProcess;

/// localstripe accepts any secret test key.
const API_KEY: &str = "sk_test_orderpay_localstripe";

fn localstripe_url() -> String {
    match std::env::var("LOCALSTRIPE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            panic!("LOCALSTRIPE_URL is not set: these tests run against localstripe; run `make test-stripe`")
        }
    }
}

fn stripe() -> StripeProvider {
    let key = ApiKey::parse(API_KEY).unwrap();
    // localstripe refuses a `created` filter on its listings.
    StripeProvider::new(&localstripe_url(), Duration::from_secs(5), &key).unwrap().without_created_filter()
}

fn amount(text: &str, code: &str) -> Amount {
    Amount::parse(text, Currency::parse(code).unwrap()).unwrap()
}

fn decimal(text: &str) -> Decimal {
    text.parse().unwrap()
}

/// A charge for a new payment of ours, keyed and referenced as the engine does.
fn charge_request(value: &str, payment_method: &str, capture: bool) -> ChargeRequest {
    let payment = PaymentId::generate();
    ChargeRequest {
        downstream_key: orderpay::payments::downstream_key(payment),
        amount: amount(value, "USD"),
        payment_method: payment_method.to_owned(),
        reference: payment.as_uuid(),
        capture,
        request_id: None,
    }
}

fn refund_request(charge: &Charge, value: &str) -> (RefundRequest, String) {
    let refund = RefundId::generate();
    let key = orderpay::refunds::downstream_key(refund);
    let request = RefundRequest {
        charge_id: charge.id.clone(),
        downstream_key: key.clone(),
        amount: amount(value, "USD"),
        reference: refund.as_uuid(),
        request_id: None,
    };
    (request, key)
}

async fn authorize(stripe: &StripeProvider, value: &str) -> Charge {
    let authorization = stripe.create_charge(&charge_request(value, "pm_card_visa", false)).await.unwrap();
    assert_eq!(authorization.status, ChargeStatus::RequiresCapture, "{authorization:?}");
    assert_eq!((authorization.amount, authorization.amount_captured), (decimal(value), Decimal::ZERO));
    authorization
}

async fn capture(stripe: &StripeProvider, authorization: &Charge, amount: Option<Amount>) -> Charge {
    let request = CaptureRequest {
        charge_id: authorization.id.clone(),
        downstream_key: new_key(),
        amount,
        request_id: None,
    };
    stripe.capture_charge(&request).await.unwrap()
}

#[tokio::test]
async fn a_card_charge_succeeds_and_reads_back_the_same() {
    let stripe = stripe();
    let charge = stripe.create_charge(&charge_request("12.34", "pm_card_visa", true)).await.unwrap();
    assert_eq!(charge.status, ChargeStatus::Succeeded, "{charge:?}");
    assert!(charge.id.starts_with("pi_"), "{charge:?}");
    assert_eq!(charge.currency, "USD");
    assert_eq!(
        (charge.amount, charge.amount_captured, charge.amount_refunded),
        (decimal("12.34"), decimal("12.34"), Decimal::ZERO)
    );
    assert_eq!(stripe.get_charge(&charge.id, None).await.unwrap(), Some(charge));
}

#[tokio::test]
async fn a_declined_card_is_a_declined_charge_and_its_lookup_says_so_too() {
    let stripe = stripe();
    let request = charge_request("20", "pm_card_chargeCustomerFail", true);
    let declined = stripe.create_charge(&request).await.unwrap();
    assert!(
        matches!(&declined.status, ChargeStatus::Declined { code, .. } if code == "card_declined"),
        "{declined:?}"
    );
    assert_eq!((declined.amount, declined.amount_captured), (decimal("20"), Decimal::ZERO));
    let found = stripe
        .find_charge(&ChargeLookup::by_key(&request.downstream_key), None)
        .await
        .unwrap()
        .expect("the declined intent");
    assert!(
        matches!(&found.status, ChargeStatus::Declined { code, .. } if code == "card_declined"),
        "{found:?}"
    );
    assert_eq!(found.amount_captured, Decimal::ZERO);
}

#[tokio::test]
async fn an_authorization_is_captured_in_full_or_in_part_or_voided() {
    let stripe = stripe();
    let full = authorize(&stripe, "10").await;
    let captured = capture(&stripe, &full, None).await;
    assert_eq!(captured.status, ChargeStatus::Succeeded);
    assert_eq!(captured.amount_captured, decimal("10"));

    let part = authorize(&stripe, "10").await;
    let captured = capture(&stripe, &part, Some(amount("4.50", "USD"))).await;
    assert_eq!(captured.status, ChargeStatus::Succeeded);
    // localstripe captures all and refunds the rest (Stripe reports amount_received 4.50 and no
    // refund): either way, 4.50 stays with the merchant.
    assert_eq!(captured.amount_captured - captured.amount_refunded, decimal("4.50"), "{captured:?}");

    let void = authorize(&stripe, "10").await;
    let canceled = stripe
        .cancel_charge(&CancelRequest {
            charge_id: void.id.clone(),
            downstream_key: new_key(),
            request_id: None,
        })
        .await
        .unwrap();
    assert_eq!(canceled.status, ChargeStatus::Canceled { reason: "requested".into() });
    assert_eq!(canceled.amount_captured, Decimal::ZERO);
    // localstripe would capture a voided PaymentIntent still (Stripe refuses), so only the read
    // back is checked here.
    assert_eq!(stripe.get_charge(&void.id, None).await.unwrap(), Some(canceled));
}

#[tokio::test]
async fn refunds_in_part_then_in_full_are_found_by_our_key() {
    let stripe = stripe();
    let charge = stripe.create_charge(&charge_request("20", "pm_card_visa", true)).await.unwrap();
    let (part, part_key) = refund_request(&charge, "5");
    let refund = stripe.create_refund(&part).await.unwrap();
    assert_eq!(refund.status, RefundStatus::Succeeded);
    assert_eq!(
        (refund.charge_id.as_str(), refund.amount, refund.currency.as_str()),
        (charge.id.as_str(), decimal("5"), "USD")
    );
    assert_eq!(stripe.get_charge(&charge.id, None).await.unwrap().unwrap().amount_refunded, decimal("5"));

    let (rest, _) = refund_request(&charge, "15");
    stripe.create_refund(&rest).await.unwrap();
    let refunded = stripe.get_charge(&charge.id, None).await.unwrap().unwrap();
    assert_eq!((refunded.amount_captured, refunded.amount_refunded), (decimal("20"), decimal("20")));

    // Among the PaymentIntent's refunds, and among every refund when its id is not at hand.
    assert_eq!(stripe.find_refund(&part_key, Some(&charge.id), None).await.unwrap(), Some(refund.clone()));
    assert_eq!(stripe.find_refund(&part_key, None, None).await.unwrap(), Some(refund));
    let never_sent = orderpay::refunds::downstream_key(RefundId::generate());
    assert_eq!(stripe.find_refund(&never_sent, Some(&charge.id), None).await.unwrap(), None);
    assert_eq!(stripe.find_refund(&never_sent, None, None).await.unwrap(), None);
}

#[tokio::test]
async fn a_charge_is_found_by_our_key_and_unknown_keys_and_ids_are_none() {
    let stripe = stripe();
    let request = charge_request("7.77", "pm_card_visa", true);
    let charge = stripe.create_charge(&request).await.unwrap();
    assert_eq!(
        stripe.find_charge(&ChargeLookup::by_key(&request.downstream_key), None).await.unwrap(),
        Some(charge)
    );
    let never_sent = charge_request("7.77", "pm_card_visa", true);
    assert_eq!(
        stripe.find_charge(&ChargeLookup::by_key(&never_sent.downstream_key), None).await.unwrap(),
        None
    );
    assert_eq!(stripe.get_charge("pi_orderpay_never_created", None).await.unwrap(), None);
}

#[tokio::test]
async fn an_amount_stripe_cannot_take_is_refused_before_any_call() {
    let stripe = stripe();
    let mut request = charge_request("1", "pm_card_visa", true);
    request.amount = amount("5.124", "KWD");
    let refused = stripe.create_charge(&request).await.unwrap_err();
    assert!(
        matches!(&refused, ProviderError::Rejected { status: 422, message } if message.contains("not sent")),
        "{refused:?}"
    );
    assert_eq!(
        stripe.find_charge(&ChargeLookup::by_key(&request.downstream_key), None).await.unwrap(),
        None,
        "nothing reached Stripe"
    );
}

#[tokio::test]
async fn a_payment_through_the_service_on_stripe_succeeds() {
    let url = localstripe_url();
    let app = spawn_app().await;
    let env = [
        ("ORDERPAY_PROVIDER", "stripe"),
        ("ORDERPAY_PROVIDER_API_KEY", API_KEY),
        ("ORDERPAY_STRIPE_CREATED_FILTER", "false"),
        ("ORDERPAY_PROVIDER_WEBHOOK_SECRET", "whsec_orderpay_localstripe"),
    ];
    let service = ServiceProcess::start(&app.database_url, &url, &env).await;
    let order = app.create_order().await;
    let response = app
        .client
        .post(format!("{}/payments", service.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", new_key())
        .json(&json!({ "order_id": order["id"], "payment_method": "pm_card_visa" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let payment = json(response).await;
    assert_eq!(payment["status"], "succeeded", "{payment}");
    let charge_id = payment["provider_charge_id"].as_str().unwrap_or_default().to_owned();
    let charge =
        stripe().get_charge(&charge_id, None).await.unwrap().expect("the PaymentIntent at localstripe");
    assert_eq!((charge.status, charge.amount_captured), (ChargeStatus::Succeeded, decimal("48.48")));
    // An order Stripe could never charge (KWD in steps of 0.010) is refused when it is placed,
    // with nothing stored and no call; one it can is placed.
    let orders_before = app.count("SELECT count(*) AS count FROM orders").await;
    let place = |unit_price: &'static str| {
        let body = json!({
            "currency": "KWD",
            "items": [{ "sku": "dates", "quantity": 1, "unit_price": unit_price }],
        });
        app.client
            .post(format!("{}/orders", service.address))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", new_key())
            .json(&body)
            .send()
    };
    let problem = assert_problem(place("5.124").await.unwrap(), 422, "validation-failed").await;
    assert!(problem.to_string().contains("multiple of 0.01"), "{problem}");
    assert_eq!(app.count("SELECT count(*) AS count FROM orders").await, orders_before, "nothing stored");
    let kwd_order = |placed: reqwest::Response| async move { json(placed).await["id"].clone() };
    let paid_order = kwd_order(place("5.120").await.unwrap()).await;
    let held_order = kwd_order(place("5.120").await.unwrap()).await;
    // So are a refund and a capture of an amount it could not take, before any call.
    let post = |path: String, body: serde_json::Value| {
        app.client
            .post(format!("{}{path}", service.address))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", new_key())
            .json(&body)
            .send()
    };
    let paid = json(
        post("/payments".into(), json!({ "order_id": paid_order, "payment_method": "pm_card_visa" }))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    let refund = json!({ "payment_id": paid["id"], "amount": "0.005" });
    let problem =
        assert_problem(post("/refunds".into(), refund).await.unwrap(), 422, "validation-failed").await;
    assert!(problem.to_string().contains("multiple of 0.01"), "{problem}");
    let held =
        json!({ "order_id": held_order, "payment_method": "pm_card_visa", "capture_method": "manual" });
    let held = json(post("/payments".into(), held).await.unwrap()).await;
    assert_eq!(held["status"], "requires_capture", "{held}");
    let capture =
        post(format!("/payments/{}/capture", held["id"].as_str().unwrap()), json!({ "amount": "1.005" }));
    let problem = assert_problem(capture.await.unwrap(), 422, "validation-failed").await;
    assert!(problem.to_string().contains("multiple of 0.01"), "{problem}");
    let operations =
        "SELECT (SELECT count(*) FROM refunds) + (SELECT count(*) FROM payment_operations) AS count";
    assert_eq!(app.count(operations).await, 0, "no refund or capture stored");
    // `provider check` reads the balance with the key: accepted, in test mode.
    let with_url: Vec<(&str, &str)> =
        env.iter().copied().chain([("ORDERPAY_PROVIDER_URL", url.as_str())]).collect();
    let check = app.cli_with(&["provider", "check"], &with_url).await;
    let printed = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{printed}{}", String::from_utf8_lossy(&check.stderr));
    assert!(printed.contains("ok (GET /v1/balance: test mode)"), "{printed}");
    // The webhook route verifies Stripe-Signature: unsigned, forged or stale, nothing is applied.
    let webhooks = format!("{}/provider/webhooks", service.address);
    let send = |signature: Option<String>| {
        let request = app.client.post(&webhooks).body(r#"{"id":"evt_1","type":"payment_intent.succeeded"}"#);
        match signature {
            Some(signature) => request.header("Stripe-Signature", signature),
            None => request,
        }
        .send()
    };
    let now = chrono::Utc::now().timestamp();
    for signature in [None, Some(format!("t={now},v1=00ff"))] {
        assert_problem(send(signature).await.unwrap(), 400, "webhook-signature-invalid").await;
    }
    // Signed with the right secret an hour ago: refused for its age alone.
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"whsec_orderpay_localstripe");
    let then = now - 3600;
    let signed = format!("{then}.{}", r#"{"id":"evt_1","type":"payment_intent.succeeded"}"#);
    let mac = ring::hmac::sign(&key, signed.as_bytes());
    let stale = Some(format!("t={then},v1={}", hex::encode(mac.as_ref())));
    let problem = assert_problem(send(stale).await.unwrap(), 400, "webhook-signature-invalid").await;
    assert!(problem.to_string().contains("tolerance"), "{problem}");
    assert_eq!(app.count("SELECT count(*) AS count FROM provider_webhooks").await, 0);
}

/// A service on Stripe whose calls go through a fault proxy in front of localstripe, holding the
/// answers to `POST /v1/payment_intents` (a PaymentIntent created and confirmed whose answer has
/// not come back), with localstripe's signed webhooks of payment intents sent to the service.
async fn service_whose_charge_answers_are_held() -> (crate::helpers::TestApp, ServiceProcess, FaultProxy) {
    let url = localstripe_url();
    let upstream = url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let hold = Faults { hold: Some("POST /v1/payment_intents".to_owned()), ..Faults::default() };
    let proxy = FaultProxy::start("127.0.0.1:0", &upstream, hold).await.expect("the fault proxy");
    let app = spawn_app().await;
    // localstripe signs with the secret as written, like Stripe: one per test, so that each
    // service verifies only the deliveries meant for it.
    let secret = format!("whsec_{}", new_key().replace('-', ""));
    let env = [
        ("ORDERPAY_PROVIDER", "stripe"),
        ("ORDERPAY_PROVIDER_API_KEY", API_KEY),
        ("ORDERPAY_STRIPE_CREATED_FILTER", "false"),
        ("ORDERPAY_PROVIDER_WEBHOOK_SECRET", secret.as_str()),
        // Longer than the webhook takes (localstripe sends it a second after the charge).
        ("ORDERPAY_PROVIDER_TIMEOUT_MS", "30000"),
        ("ORDERPAY_PAYMENT_LEASE_MS", "35000"),
    ];
    let service = ServiceProcess::start(&app.database_url, &proxy.address(), &env).await;
    // localstripe sends each event to every endpoint registered with it, each under its own id.
    let endpoint = json!({
        "url": format!("{}/provider/webhooks", service.address),
        "secret": secret,
        "events": ["payment_intent.succeeded", "payment_intent.payment_failed"],
    });
    let registered = app
        .client
        .post(format!("{url}/_config/webhooks/{}", new_key()))
        .json(&endpoint)
        .send()
        .await
        .expect("localstripe's webhook configuration");
    assert!(registered.status().is_success(), "{registered:?}");
    (app, service, proxy)
}

/// `POST /payments` on the service, with the time it may take.
async fn pay(
    app: &crate::helpers::TestApp,
    service: &ServiceProcess,
    payment_method: &str,
) -> reqwest::Response {
    let order = app.create_order().await;
    app.client
        .post(format!("{}/payments", service.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", new_key())
        .json(&json!({ "order_id": order["id"], "payment_method": payment_method }))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("answered while the provider's answer is still held")
}

/// The provider_webhooks rows of `event_type` that did `result`.
async fn webhooks_that(app: &crate::helpers::TestApp, event_type: &str, result: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) AS count FROM provider_webhooks WHERE event_type = '{event_type}' AND result = '{result}'"
    ))
    .await
}

#[tokio::test]
async fn a_stripe_webhook_settles_a_payment_whose_answer_is_held() {
    let (app, service, proxy) = service_whose_charge_answers_are_held().await;
    let paid = pay(&app, &service, "pm_card_visa").await;
    assert_eq!(paid.status(), 201);
    let payment = json(paid).await;
    assert_eq!(payment["status"], "succeeded", "{payment}");
    assert_eq!(proxy.stats().held, 1, "Stripe's answer to the charge never reached the service");
    // Settled by localstripe's payment_intent.succeeded, on the word of our own lookup.
    assert_eq!(webhooks_that(&app, "payment_intent.succeeded", "applied").await, 1);
    let by_webhook = format!(
        "SELECT count(*) AS count FROM payment_events WHERE subject_id = '{}' AND actor = 'webhook' \
         AND to_status = 'succeeded'",
        payment["id"].as_str().unwrap()
    );
    assert_eq!(app.count(&by_webhook).await, 1);
    let charge_id = payment["provider_charge_id"].as_str().unwrap_or_default().to_owned();
    let charge = stripe().get_charge(&charge_id, None).await.unwrap().expect("the PaymentIntent");
    assert_eq!((charge.status, charge.amount_captured), (ChargeStatus::Succeeded, decimal("48.48")));
    proxy.release();
}

#[tokio::test]
async fn a_stripe_webhook_settles_a_decline_whose_answer_is_held() {
    let (app, service, proxy) = service_whose_charge_answers_are_held().await;
    let declined = pay(&app, &service, "pm_card_chargeCustomerFail").await;
    let problem = assert_problem(declined, 402, "payment-declined").await;
    assert!(problem.to_string().contains("card_declined"), "{problem}");
    assert_eq!(proxy.stats().held, 1);
    assert_eq!(webhooks_that(&app, "payment_intent.payment_failed", "applied").await, 1);
    proxy.release();
}
