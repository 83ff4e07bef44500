//! orderpay's Rust client: every merchant operation of the API, each write sent with an
//! idempotency key and retried by the rules every orderpay client shares
//! (`clients/retry-rules.json`; the rules for people: docs/clients.md).
//!
//! ```no_run
//! # async fn run() -> Result<(), orderpay_client::Error> {
//! use orderpay_client::{Client, CreateOrder, CreatePayment, Key, OrderItemRequest};
//! let client = Client::builder("http://127.0.0.1:8080", "sk_...").build()?;
//! let item = OrderItemRequest { sku: "tee".into(), quantity: 2, unit_price: "19.99".into() };
//! let order = CreateOrder { currency: "USD".into(), items: vec![item], customer_id: None, metadata: None };
//! let order = client.create_order(&order, Key::intent("checkout-42")).await?.value;
//! let pay = CreatePayment { order_id: order.id, payment_method: "pm_card_ok".into(), amount: None, capture_method: None };
//! let payment = client.pay_and_wait(&pay, Key::intent("checkout-42")).await?;
//! println!("{} after {} attempts", payment.value.status, payment.attempts);
//! # Ok(()) }
//! ```

mod client;
mod error;
pub mod keys;
pub mod operations;
pub mod retry;
mod types;
pub mod webhooks;

pub use client::{Attempt, Client, ClientBuilder, Hook, Key, Reply};
pub use error::{Error, ErrorKind, Problem};
pub use keys::{FileKeyStore, KeyStore, MemoryKeyStore, StoredKey};
pub use retry::Settings;
pub use types::*;
pub use webhooks::{Webhook, WebhookError};
