//! orderpay: orders and payments over HTTP where every write is safe to retry.
//!
//! See docs/api.md for the API and docs/architecture.md for the design this crate implements.

pub mod accounts;
pub mod app;
pub mod background;
pub mod clock;
pub mod config;
pub mod crypto;
pub mod db;
pub mod disputes;
pub mod encryption;
pub mod error;
pub mod events;
pub mod hooks;
pub mod http;
pub mod idempotency;
pub mod ids;
pub mod ledger;
pub mod merchant_webhooks;
pub mod money;
pub mod operations;
pub mod orders;
pub mod payments;
pub mod provider;
pub mod rate_limit;
pub mod refunds;
pub mod settlement;
pub mod telemetry;
pub mod webhook_signature;
