//! The payment provider: what orderpay needs from it ([`PaymentProvider`]), the HTTP client for
//! the Stripe-like provider contract of PAYMENTS.md ([`client::HttpProvider`]), and the mock
//! provider server that implements that contract for development, tests and demos ([`mock`]).
//!
//! The domain sees only the trait and these types, never HTTP.

pub mod client;
pub mod mock;
pub mod wire;

use std::future::Future;
use std::pin::Pin;

use uuid::Uuid;

use crate::money::Amount;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A charge to create. `downstream_key` is derived from our payment id, so every call for one
/// payment, however often re-driven, names the same charge at the provider.
#[derive(Debug, Clone)]
pub struct ChargeRequest {
    pub downstream_key: String,
    pub amount: Amount,
    pub payment_method: String,
    pub reference: Uuid,
    /// The request that drives the call (`X-Request-Id`), for tracing across both systems.
    pub request_id: Option<String>,
}

/// The provider's view of a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub id: String,
    pub status: ChargeStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeStatus {
    Succeeded,
    /// A definite refusal (insufficient funds, invalid card): nothing was charged.
    Declined {
        code: String,
        message: String,
    },
    /// Accepted, settling asynchronously.
    Pending,
}

/// Why a provider call told us nothing definite. None of these means "not charged".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("the provider did not answer in time")]
    Timeout,
    #[error("could not talk to the provider: {0}")]
    Connection(String),
    #[error("the provider failed with HTTP {0}")]
    ServerError(u16),
    #[error("the provider refused the request with HTTP {status}: {message}")]
    Rejected { status: u16, message: String },
    #[error("the provider's answer was not understood: {0}")]
    Malformed(String),
}

/// What orderpay needs from a payment provider.
pub trait PaymentProvider: Send + Sync + 'static {
    /// Creates (or, for a known `downstream_key`, returns) a charge.
    fn create_charge<'a>(
        &'a self,
        request: &'a ChargeRequest,
    ) -> BoxFuture<'a, Result<Charge, ProviderError>>;

    /// Finds the charge made for `downstream_key`; `None` when the provider never received it.
    fn find_charge<'a>(
        &'a self,
        downstream_key: &'a str,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Charge>, ProviderError>>;
}
