//! [`Delegating`]: a provider that forwards every call to another unless it says otherwise, so
//! that a test double which changes one call (holds a lookup, fails a capture) writes that one
//! method instead of forwarding all nine by hand. Every [`Delegating`] is a [`PaymentProvider`].

use chrono::{DateTime, Utc};

use crate::money::Amount;

use super::{
    BalancePage, BalanceQuery, BoxFuture, CancelRequest, CaptureRequest, Charge, ChargeLookup, ChargeRequest,
    Dispute, DisputePage, DisputeResponseRequest, PaymentProvider, ProviderError, Refund, RefundRequest,
};

/// Declares [`Delegating`] with a default for each of [`PaymentProvider`]'s calls (the inner
/// provider's), and makes every `Delegating` a `PaymentProvider` that calls its own: the list
/// of calls is written once, so a call added to the trait is added here in one line.
macro_rules! delegating {
    ($(fn $call:ident<$a:lifetime>($($arg:ident: $ty:ty),*) -> $answer:ty;)*) => {
        /// Implement [`Delegating::inner`] and override only the calls that differ; the others
        /// go to the inner provider unchanged. The calls are [`PaymentProvider`]'s.
        pub trait Delegating: Send + Sync + 'static {
            /// The provider every call not overridden goes to.
            fn inner(&self) -> &dyn PaymentProvider;

            $(
                fn $call<$a>(&$a self, $($arg: $ty),*) -> BoxFuture<$a, $answer> {
                    self.inner().$call($($arg),*)
                }
            )*

            fn amount_refusal(&self, amount: &Amount) -> Option<String> {
                self.inner().amount_refusal(amount)
            }
        }

        impl<T: Delegating> PaymentProvider for T {
            $(
                fn $call<$a>(&$a self, $($arg: $ty),*) -> BoxFuture<$a, $answer> {
                    Delegating::$call(self, $($arg),*)
                }
            )*

            fn amount_refusal(&self, amount: &Amount) -> Option<String> {
                Delegating::amount_refusal(self, amount)
            }
        }
    };
}

delegating! {
    fn create_charge<'a>(request: &'a ChargeRequest) -> Result<Charge, ProviderError>;
    fn find_charge<'a>(lookup: &'a ChargeLookup, request_id: Option<&'a str>) -> Result<Option<Charge>, ProviderError>;
    fn get_charge<'a>(charge_id: &'a str, request_id: Option<&'a str>) -> Result<Option<Charge>, ProviderError>;
    fn capture_charge<'a>(request: &'a CaptureRequest) -> Result<Charge, ProviderError>;
    fn cancel_charge<'a>(request: &'a CancelRequest) -> Result<Charge, ProviderError>;
    fn create_refund<'a>(request: &'a RefundRequest) -> Result<Refund, ProviderError>;
    fn find_refund<'a>(downstream_key: &'a str, charge_id: Option<&'a str>, request_id: Option<&'a str>) -> Result<Option<Refund>, ProviderError>;
    fn get_dispute<'a>(dispute_id: &'a str, request_id: Option<&'a str>) -> Result<Option<Dispute>, ProviderError>;
    fn list_disputes<'a>(created_gte: DateTime<Utc>, starting_after: Option<&'a str>) -> Result<DisputePage, ProviderError>;
    fn list_balance_transactions<'a>(query: &'a BalanceQuery) -> Result<BalancePage, ProviderError>;
    fn respond_to_dispute<'a>(request: &'a DisputeResponseRequest) -> Result<Dispute, ProviderError>;
}
