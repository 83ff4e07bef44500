//! The payment provider: what orderpay needs from it ([`PaymentProvider`]), the HTTP client for
//! the Stripe-like provider contract of docs/payments.md ([`client::HttpProvider`]), the JSON of that
//! contract ([`wire`]), and the mock provider server that implements it for development, tests
//! and demos ([`mock`]); [`delegate::Delegating`] for test doubles that change one call of another
//! provider; the Stripe adapter ([`stripe`]); and a webhook event as the engine reads it from
//! either wire ([`event`]).
//!
//! The domain sees only the trait and these types, never HTTP. Every write names a downstream
//! idempotency key, so a re-driven call is the same operation at the provider, never a second one.

/// Makes `$provider` a [`PaymentProvider`] whose calls are its own async methods of the same
/// arguments: `create`, `find`, `get`, `capture`, `cancel`, `refund`, `find_refund_by_key`,
/// `dispute`, `disputes`, `balance_transactions` and `respond`, and `refusal_of` for
/// [`PaymentProvider::amount_refusal`]. Each wire's client (the mock's, Stripe's) writes those;
/// the boxing of their futures is written once, here.
macro_rules! payment_provider_by_methods {
    ($provider:ty) => {
        impl $crate::provider::PaymentProvider for $provider {
            fn create_charge<'a>(
                &'a self,
                request: &'a $crate::provider::ChargeRequest,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<$crate::provider::Charge, $crate::provider::ProviderError>,
            > {
                Box::pin(self.create(request))
            }

            fn find_charge<'a>(
                &'a self,
                lookup: &'a $crate::provider::ChargeLookup,
                request_id: Option<&'a str>,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<Option<$crate::provider::Charge>, $crate::provider::ProviderError>,
            > {
                Box::pin(self.find(lookup, request_id))
            }

            fn get_charge<'a>(
                &'a self,
                charge_id: &'a str,
                request_id: Option<&'a str>,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<Option<$crate::provider::Charge>, $crate::provider::ProviderError>,
            > {
                Box::pin(self.get(charge_id, request_id))
            }

            fn capture_charge<'a>(
                &'a self,
                request: &'a $crate::provider::CaptureRequest,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<$crate::provider::Charge, $crate::provider::ProviderError>,
            > {
                Box::pin(self.capture(request))
            }

            fn cancel_charge<'a>(
                &'a self,
                request: &'a $crate::provider::CancelRequest,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<$crate::provider::Charge, $crate::provider::ProviderError>,
            > {
                Box::pin(self.cancel(request))
            }

            fn create_refund<'a>(
                &'a self,
                request: &'a $crate::provider::RefundRequest,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<$crate::provider::Refund, $crate::provider::ProviderError>,
            > {
                Box::pin(self.refund(request))
            }

            fn find_refund<'a>(
                &'a self,
                downstream_key: &'a str,
                charge_id: Option<&'a str>,
                request_id: Option<&'a str>,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<Option<$crate::provider::Refund>, $crate::provider::ProviderError>,
            > {
                Box::pin(self.find_refund_by_key(downstream_key, charge_id, request_id))
            }

            fn get_dispute<'a>(
                &'a self,
                dispute_id: &'a str,
                request_id: Option<&'a str>,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<Option<$crate::provider::Dispute>, $crate::provider::ProviderError>,
            > {
                Box::pin(self.dispute(dispute_id, request_id))
            }

            fn list_disputes<'a>(
                &'a self,
                created_gte: chrono::DateTime<chrono::Utc>,
                starting_after: Option<&'a str>,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<$crate::provider::DisputePage, $crate::provider::ProviderError>,
            > {
                Box::pin(self.disputes(created_gte, starting_after))
            }

            fn list_balance_transactions<'a>(
                &'a self,
                query: &'a $crate::provider::BalanceQuery,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<$crate::provider::BalancePage, $crate::provider::ProviderError>,
            > {
                Box::pin(self.balance_transactions(query))
            }

            fn respond_to_dispute<'a>(
                &'a self,
                request: &'a $crate::provider::DisputeResponseRequest,
            ) -> $crate::provider::BoxFuture<
                'a,
                Result<$crate::provider::Dispute, $crate::provider::ProviderError>,
            > {
                Box::pin(self.respond(request))
            }

            fn amount_refusal(&self, amount: &$crate::money::Amount) -> Option<String> {
                self.refusal_of(amount)
            }
        }
    };
}
pub(crate) use payment_provider_by_methods;

pub mod client;
pub mod coalesce;
pub mod delegate;
pub mod event;
pub mod mock;
pub mod stripe;
pub mod wire;

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::disputes::{ClosedReason, DisputeStatus};
use crate::money::Amount;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a lookup of a charge by our key knows: the key, and when we last sent it (noted under
/// the lease before every send, so no charge for the key can have been made later than that,
/// give or take the clocks). A provider without a lookup by key (Stripe) bounds its listing by
/// it; `last_send_at` is `None` for a lookup of a charge however late the provider made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeLookup {
    pub downstream_key: String,
    pub last_send_at: Option<DateTime<Utc>>,
}

impl ChargeLookup {
    /// A lookup by `downstream_key` alone, with no send time to bound it.
    pub fn by_key(downstream_key: impl Into<String>) -> Self {
        ChargeLookup { downstream_key: downstream_key.into(), last_send_at: None }
    }
}

/// A charge to create. `downstream_key` is derived from our payment id, so every call for one
/// payment, however often re-driven, names the same charge at the provider.
#[derive(Debug, Clone)]
pub struct ChargeRequest {
    pub downstream_key: String,
    pub amount: Amount,
    pub payment_method: String,
    pub reference: Uuid,
    /// `true` charges at once; `false` only authorizes (the charge then `RequiresCapture` until
    /// captured, cancelled, or its authorization expires).
    pub capture: bool,
    /// The request that drives the call (`X-Request-Id`), for tracing across both systems.
    pub request_id: Option<String>,
}

/// Captures an authorized charge, all of it (`amount: None`) or part of it (the rest is
/// released).
#[derive(Debug, Clone)]
pub struct CaptureRequest {
    pub charge_id: String,
    pub downstream_key: String,
    pub amount: Option<Amount>,
    pub request_id: Option<String>,
}

/// Voids an authorization: nothing is charged.
#[derive(Debug, Clone)]
pub struct CancelRequest {
    pub charge_id: String,
    pub downstream_key: String,
    pub request_id: Option<String>,
}

/// Refunds part or all of a captured charge.
#[derive(Debug, Clone)]
pub struct RefundRequest {
    pub charge_id: String,
    pub downstream_key: String,
    pub amount: Amount,
    /// Our id for the refund, recorded by the provider.
    pub reference: Uuid,
    pub request_id: Option<String>,
}

/// The provider's view of a charge. Amounts are in the charge's currency, major units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub id: String,
    pub status: ChargeStatus,
    /// The charge's currency, as the provider spells it (ISO 4217).
    pub currency: String,
    /// The amount charged or authorized.
    pub amount: Decimal,
    /// How much of it was captured (zero until captured).
    pub amount_captured: Decimal,
    /// Refunded so far, counting refunds still pending (so it never allows an over-refund).
    pub amount_refunded: Decimal,
    /// When an uncaptured authorization lapses (only while it `RequiresCapture`, and after).
    pub authorization_expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeStatus {
    /// Captured: the money moved.
    Succeeded,
    /// Authorized, not captured: capture or cancel it before `authorization_expires_at`.
    RequiresCapture,
    /// Accepted, settling asynchronously.
    Pending,
    /// A definite refusal (insufficient funds, invalid card): nothing was charged.
    Declined { code: String, message: String },
    /// An authorization that ended without a capture: `requested` (voided) or
    /// `authorization_expired`. Nothing was charged.
    Canceled { reason: String },
}

impl ChargeStatus {
    /// As the provider spells it.
    pub fn as_str(&self) -> &'static str {
        use wire::charge_status;
        match self {
            ChargeStatus::Succeeded => charge_status::SUCCEEDED,
            ChargeStatus::RequiresCapture => charge_status::REQUIRES_CAPTURE,
            ChargeStatus::Pending => charge_status::PENDING,
            ChargeStatus::Declined { .. } => charge_status::DECLINED,
            ChargeStatus::Canceled { .. } => charge_status::CANCELED,
        }
    }
}

/// A charge of 10 for unit tests, captured in full, as `ch_1`.
#[cfg(test)]
pub(crate) fn charge_for_tests(status: ChargeStatus) -> Charge {
    Charge {
        id: "ch_1".into(),
        status,
        currency: "USD".into(),
        amount: Decimal::TEN,
        amount_captured: Decimal::TEN,
        amount_refunded: Decimal::ZERO,
        authorization_expires_at: None,
    }
}

/// The provider's view of a refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    pub id: String,
    pub charge_id: String,
    pub status: RefundStatus,
    /// The refund's currency (its charge's), as the provider spells it.
    pub currency: String,
    pub amount: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundStatus {
    /// The money went back.
    Succeeded,
    /// Accepted, settling asynchronously; counts against the refundable amount meanwhile.
    Pending,
    /// The provider tried and could not refund: nothing moved.
    Failed { code: String, message: String },
}

/// The merchant's answer to a dispute: evidence submitted (the dispute goes under review), or the
/// dispute accepted (lost, or an inquiry closed). Re-sending the same `downstream_key` returns
/// the same result.
#[derive(Debug, Clone)]
pub struct DisputeResponseRequest {
    pub dispute_id: String,
    pub downstream_key: String,
    pub answer: DisputeAnswer,
    pub request_id: Option<String>,
}

/// What a [`DisputeResponseRequest`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisputeAnswer {
    /// Text evidence, submitted.
    Evidence(String),
    /// No contest.
    Accept,
}

/// The provider's view of a dispute: a customer's bank taking a captured charge's money back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispute {
    pub id: String,
    pub charge_id: String,
    pub amount: Decimal,
    /// As the provider spells it (ISO 4217).
    pub currency: String,
    pub reason: String,
    pub status: DisputeStatus,
    pub closed_reason: Option<ClosedReason>,
    /// Whether `closed_reason` is our inference rather than the provider's word. Stripe does not
    /// say why a dispute closed: one lost without evidence may have been accepted by us or let
    /// lapse, which only the answer to our own close (replayed for its key) tells.
    pub closed_reason_inferred: bool,
    pub evidence_due_by: Option<DateTime<Utc>>,
    /// The evidence the merchant gave so far, and how often it was submitted: what tells a
    /// lookup whether our evidence reached the provider.
    pub evidence: Option<String>,
    pub submission_count: u32,
    /// What left the merchant's balance for it.
    pub amount_withdrawn: Decimal,
    /// What came back (a won dispute).
    pub amount_reinstated: Decimal,
    pub created_at: DateTime<Utc>,
}

/// A page of the provider's disputes, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisputePage {
    pub disputes: Vec<Dispute>,
    pub has_more: bool,
}

/// A movement of the merchant's money at the provider, as its settlement reports list them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceTransaction {
    pub id: String,
    /// What moved it (`charge`, `refund`, `refund_failure`, `dispute`, `dispute_reversal`, or a
    /// category orderpay does not know).
    pub category: String,
    /// Signed: negative when money left the merchant's balance.
    pub amount: Decimal,
    /// As the provider spells it.
    pub currency: String,
    /// The provider's id of the charge, refund or dispute.
    pub source: String,
    /// The idempotency key its charge or refund was created with: names our payment or refund.
    pub source_key: Option<String>,
    pub created: DateTime<Utc>,
}

/// Which movements to list: those created in `[created_gte, created_lt)`, newest first, up to
/// `limit`, after the movement `starting_after` of the previous page.
#[derive(Debug, Clone)]
pub struct BalanceQuery {
    pub created_gte: DateTime<Utc>,
    pub created_lt: DateTime<Utc>,
    pub limit: u32,
    pub starting_after: Option<String>,
}

/// One page of movements, and whether more follow.
#[derive(Debug, Clone, Default)]
pub struct BalancePage {
    pub transactions: Vec<BalanceTransaction>,
    pub has_more: bool,
}

/// Why a provider call did not give us the object we asked for. Only [`ProviderError::Refused`]
/// is a definite answer about money; none of the others means "nothing happened".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("the provider did not answer in time")]
    Timeout,
    #[error("could not talk to the provider: {0}")]
    Connection(String),
    #[error("the provider failed with HTTP {0}")]
    ServerError(u16),
    /// A malformed request, a key reused with other parameters, a missing credential, an unknown
    /// 4xx: our bug (or theirs), not an answer about the money.
    #[error("the provider refused the request with HTTP {status}: {message}")]
    Rejected { status: u16, message: String },
    /// The provider holds our downstream key with other parameters (`idempotency_error`): it
    /// did not act on this call, and sending it again cannot help. One key always carries one
    /// request, so this is a bug (ours, or whoever else used the key): the operation is held
    /// for a person, never failed on it.
    #[error("the provider holds this key with other parameters (HTTP {status}): {message}")]
    KeyReused { status: u16, message: String },
    /// The provider refused our credentials (401, 403: an API key wrong, revoked or lacking a
    /// permission). It did not act on the call; nothing succeeds until an operator fixes the
    /// settings, and no answer about the money is to be read from it.
    #[error("the provider refused our credentials (HTTP {status}): {message}")]
    Unauthorized { status: u16, message: String },
    /// A definite business refusal of a capture, cancel or refund (`authorization_expired`,
    /// `capture_declined`, `amount_too_large`, `charge_already_captured`, ...): nothing moved.
    #[error("the provider refused: {code}: {message}")]
    Refused { code: String, message: String },
    #[error("the provider's answer was not understood: {0}")]
    Malformed(String),
}

/// What orderpay needs from a payment provider.
pub trait PaymentProvider: Send + Sync + 'static {
    /// Creates (or, for a known `downstream_key`, returns) a charge or an authorization.
    fn create_charge<'a>(
        &'a self,
        request: &'a ChargeRequest,
    ) -> BoxFuture<'a, Result<Charge, ProviderError>>;

    /// Finds the charge made for the lookup's downstream key; `None` when the provider never
    /// received it.
    fn find_charge<'a>(
        &'a self,
        lookup: &'a ChargeLookup,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Charge>, ProviderError>>;

    /// Reads a charge by the provider's id; `None` when there is no such charge.
    fn get_charge<'a>(
        &'a self,
        charge_id: &'a str,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Charge>, ProviderError>>;

    /// Captures an authorization. Re-sending the same `downstream_key` returns the same result.
    fn capture_charge<'a>(
        &'a self,
        request: &'a CaptureRequest,
    ) -> BoxFuture<'a, Result<Charge, ProviderError>>;

    /// Voids an authorization. Re-sending the same `downstream_key` returns the same result.
    fn cancel_charge<'a>(
        &'a self,
        request: &'a CancelRequest,
    ) -> BoxFuture<'a, Result<Charge, ProviderError>>;

    /// Creates (or, for a known `downstream_key`, returns) a refund.
    fn create_refund<'a>(
        &'a self,
        request: &'a RefundRequest,
    ) -> BoxFuture<'a, Result<Refund, ProviderError>>;

    /// Finds the refund made for `downstream_key`, a refund of the charge `charge_id` when we
    /// hold it (Stripe's adapter then lists that PaymentIntent's refunds only); `None` when the
    /// provider made none for it (it never received the key, or refused the refund).
    fn find_refund<'a>(
        &'a self,
        downstream_key: &'a str,
        charge_id: Option<&'a str>,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Refund>, ProviderError>>;

    /// Reads a dispute by the provider's id; `None` when there is no such dispute.
    fn get_dispute<'a>(
        &'a self,
        dispute_id: &'a str,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Dispute>, ProviderError>>;

    /// A page of the disputes created at or after `created_gte`, newest first, after the dispute
    /// `starting_after`.
    fn list_disputes<'a>(
        &'a self,
        created_gte: DateTime<Utc>,
        starting_after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<DisputePage, ProviderError>>;

    /// A page of the provider's movements of money (its settlement records), newest first.
    fn list_balance_transactions<'a>(
        &'a self,
        query: &'a BalanceQuery,
    ) -> BoxFuture<'a, Result<BalancePage, ProviderError>>;

    /// Submits evidence for a dispute, or accepts it; the dispute as it is after.
    fn respond_to_dispute<'a>(
        &'a self,
        request: &'a DisputeResponseRequest,
    ) -> BoxFuture<'a, Result<Dispute, ProviderError>>;

    /// Why this provider cannot take `amount` as it is (Stripe's integer minor units cannot hold
    /// every amount a currency allows here: KWD 5.124); `None` when it can. Asked before anything
    /// is stored, so that such an amount is a 422 on the request, never a call that cannot succeed.
    fn amount_refusal(&self, amount: &Amount) -> Option<String>;
}
