//! One lookup in flight per operation: [`Coalescing`] wraps a provider so that concurrent
//! lookups of the same thing (a charge by its downstream key or id, a refund by its key) share
//! one call. A flood of provider webhooks that each ask the provider to verify the same
//! operation, and the reconciler checking it at the same moment, make one request, not a
//! thousand. Writes pass through untouched.
//!
//! A lookup is shared only while it runs: whoever asks after it answered asks again, so an
//! answer is never older than the question.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

use super::delegate::Delegating;
use super::{BoxFuture, Charge, ChargeLookup, Dispute, PaymentProvider, ProviderError, Refund};

type Lookup<T> = Result<Option<T>, ProviderError>;

/// The lookups in flight, by what they ask.
struct Flights<T> {
    running: Mutex<HashMap<String, Arc<OnceCell<Lookup<T>>>>>,
}

impl<T: Clone> Flights<T> {
    fn new() -> Self {
        Flights { running: Mutex::new(HashMap::new()) }
    }

    /// `fetch`'s answer, or the answer of the same lookup already running.
    async fn run(&self, key: &str, fetch: impl Future<Output = Lookup<T>>) -> Lookup<T> {
        let cell = {
            let mut running = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            running.entry(key.to_owned()).or_default().clone()
        };
        // If the caller running the lookup goes away, the next waiter runs its own.
        let answer = cell.get_or_init(|| fetch).await.clone();
        let mut running = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if running.get(key).is_some_and(|current| Arc::ptr_eq(current, &cell)) {
            running.remove(key);
        }
        answer
    }
}

/// A provider whose lookups are shared while they run.
pub struct Coalescing<P> {
    inner: P,
    charges_by_key: Flights<Charge>,
    charges_by_id: Flights<Charge>,
    refunds_by_key: Flights<Refund>,
    disputes_by_id: Flights<Dispute>,
}

impl<P: PaymentProvider> Coalescing<P> {
    pub fn new(inner: P) -> Self {
        Coalescing {
            inner,
            charges_by_key: Flights::new(),
            charges_by_id: Flights::new(),
            refunds_by_key: Flights::new(),
            disputes_by_id: Flights::new(),
        }
    }
}

/// Only the lookups are shared; every other call goes to the inner provider as it is.
impl<P: PaymentProvider> Delegating for Coalescing<P> {
    fn inner(&self) -> &dyn PaymentProvider {
        &self.inner
    }

    /// Shared only by lookups that bound their search alike: one that knows of a later send
    /// never takes the answer of a narrower one.
    fn find_charge<'a>(
        &'a self,
        lookup: &'a ChargeLookup,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Lookup<Charge>> {
        let flight = match lookup.last_send_at {
            Some(sent) => format!("{} sent {}", lookup.downstream_key, sent.timestamp_micros()),
            None => lookup.downstream_key.clone(),
        };
        let fetch = self.inner.find_charge(lookup, request_id);
        Box::pin(async move { self.charges_by_key.run(&flight, fetch).await })
    }

    fn get_charge<'a>(
        &'a self,
        charge_id: &'a str,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Lookup<Charge>> {
        Box::pin(self.charges_by_id.run(charge_id, self.inner.get_charge(charge_id, request_id)))
    }

    fn find_refund<'a>(
        &'a self,
        downstream_key: &'a str,
        charge_id: Option<&'a str>,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Lookup<Refund>> {
        let lookup = self.inner.find_refund(downstream_key, charge_id, request_id);
        Box::pin(self.refunds_by_key.run(downstream_key, lookup))
    }

    fn get_dispute<'a>(
        &'a self,
        dispute_id: &'a str,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Lookup<Dispute>> {
        Box::pin(self.disputes_by_id.run(dispute_id, self.inner.get_dispute(dispute_id, request_id)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn concurrent_lookups_of_one_key_share_one_call_and_later_ones_ask_again() {
        let flights = Flights::<Charge>::new();
        let calls = AtomicUsize::new(0);
        let lookup = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(None)
        };
        let together = futures::future::join_all((0..20).map(|_| flights.run("k", lookup()))).await;
        assert!(together.iter().all(|answer| *answer == Ok(None)));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "twenty at once, one call");
        flights.run("other", lookup()).await.unwrap();
        flights.run("k", lookup()).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3, "another key, and the same key later, ask again");
    }
}
