//! Create an order and pay it, retried safely: `ORDERPAY_URL`, `ORDERPAY_KEY` and
//! `ORDERPAY_PAYMENT_METHOD` (default `pm_card_ok`). Prints one JSON line:
//! `{"order_id", "payment_id", "status", "attempts", "replayed"}` (the payment call's attempts).
//!
//!     cargo run -p orderpay-client --example checkout

use orderpay_client::{Client, CreateOrder, CreatePayment, Key, OrderItemRequest};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("ORDERPAY_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let api_key =
        std::env::var("ORDERPAY_KEY").map_err(|_| "set ORDERPAY_KEY to the account's secret key")?;
    let method = std::env::var("ORDERPAY_PAYMENT_METHOD").unwrap_or_else(|_| "pm_card_ok".into());
    let client = Client::builder(url, api_key).build()?;
    // One intent, two keys (one per operation), kept by the client's key store.
    let intent = Key::intent(orderpay_client::keys::new_key());
    let item = OrderItemRequest { sku: "tee".into(), quantity: 2, unit_price: "19.99".into() };
    let order = CreateOrder { currency: "USD".into(), items: vec![item], customer_id: None, metadata: None };
    let order = client.create_order(&order, intent.clone()).await?.value;
    let payment = CreatePayment {
        order_id: order.id.clone(),
        payment_method: method,
        amount: None,
        capture_method: None,
    };
    let line = match client.pay_and_wait(&payment, intent).await {
        Ok(paid) => json!({
            "order_id": order.id, "payment_id": paid.value.id, "status": paid.value.status,
            "attempts": paid.attempts, "replayed": paid.replayed,
        }),
        // A final refusal (a decline) names the payment it failed.
        Err(error) => json!({
            "order_id": order.id,
            "payment_id": error.problem().and_then(|problem| problem.member("payment_id")),
            "status": "failed", "attempts": error.attempts, "replayed": false,
            "error": error.to_string(),
        }),
    };
    println!("{line}");
    Ok(())
}
