//! [`StripeProvider`]: the `PaymentProvider` that speaks Stripe's API over reqwest, built from
//! the pure parts beside it (form bodies, minor units, error sorting, objects). Every call
//! carries `Authorization: Bearer <key>` (a sensitive header, never printed) and the pinned
//! `Stripe-Version`, and is bounded by `ORDERPAY_PROVIDER_TIMEOUT_MS` like the mock's client;
//! every write is a form with our downstream key as its `Idempotency-Key`.
//!
//! Lookups by our key list PaymentIntents or refunds and match our id in their metadata:
//! Stripe has no lookup by idempotency key, and its Search API is eventually consistent. The
//! listing is bounded by a window on `created`: from five minutes before the time in our
//! payment's or refund's UUIDv7 (no first send can be older) to five minutes after our last
//! send of a charge, when the lookup carries it (the drive's do; the late-charge watch's, which
//! looks for a charge made late, do not). The window is sent as
//! `created[gte]`/`created[lte]` (off with `ORDERPAY_STRIPE_CREATED_FILTER=false`, for an
//! emulator that refuses the filter, as localstripe does) and applied here as well, and
//! Stripe's newest-first order lets the listing stop at the first page older than the window.
//! A lookup never creates or changes anything.

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::errors::{StripeFailure, classify};
use super::form::{self, Form, STRIPE_VERSION};
use super::objects::{
    BalanceTransactionObject, DeclineEnvelope, DisputeObject, List, PaymentIntentObject, RefundObject,
};
use super::{ApiKey, amount::MinorUnitsError};
use crate::provider::client::{
    base_url_of, bearer, endpoint, http_client, install_crypto_provider, traced, transport_error,
};
use crate::provider::{
    BalancePage, BalanceQuery, CancelRequest, CaptureRequest, Charge, ChargeLookup, ChargeRequest,
    ChargeStatus, Dispute, DisputeAnswer, DisputePage, DisputeResponseRequest, ProviderError, Refund,
    RefundRequest,
};
use crate::{payments, refunds};

/// How far past our times a lookup's window reaches on each side: the id is taken before the
/// first send, the last send is noted before it leaves, and clocks (ours, Stripe's) disagree
/// a little.
const LOOKUP_SLACK_SECS: i64 = 300;
/// Objects per page of a listing: Stripe's largest.
const PAGE_SIZE: &str = "100";
/// Every PaymentIntent is read with its latest charge, where captured and refunded amounts are.
const LATEST_CHARGE: &str = "latest_charge";

#[derive(Debug, Clone)]
pub struct StripeProvider {
    base_url: url::Url,
    http: reqwest::Client,
    /// Whether listings are sent the lookup's window on `created` (Stripe's API takes it;
    /// localstripe refuses it).
    created_filter: bool,
}

/// An answer as it came: what a 2xx, a 404 or an error means is decided by each call.
struct Reply {
    status: StatusCode,
    should_retry: Option<String>,
    body: Bytes,
}

impl Reply {
    fn failure(&self) -> StripeFailure {
        classify(self.status.as_u16(), self.should_retry.as_deref(), &self.body)
    }

    fn parse<T: DeserializeOwned>(&self) -> Result<T, ProviderError> {
        serde_json::from_slice(&self.body).map_err(|error| ProviderError::Malformed(error.to_string()))
    }

    /// The object of a 2xx, or what the error answer means to the engine.
    fn object<T: DeserializeOwned>(&self) -> Result<T, ProviderError> {
        if self.status.is_success() { self.parse() } else { Err(self.failure().into_provider_error()) }
    }

    /// Like [`Reply::object`], with a 404 as `None`.
    fn found<T: DeserializeOwned>(&self) -> Result<Option<T>, ProviderError> {
        if self.status == StatusCode::NOT_FOUND { Ok(None) } else { self.object().map(Some) }
    }
}

/// An amount Stripe cannot take is refused before any call: nothing was sent.
fn not_sent(error: MinorUnitsError) -> ProviderError {
    ProviderError::Rejected { status: 422, message: format!("not sent to Stripe: {error}") }
}

/// An object a listing can page through and a lookup can bound by time.
trait Listed: DeserializeOwned {
    fn id(&self) -> &str;
    fn created(&self) -> i64;
}

impl Listed for PaymentIntentObject {
    fn id(&self) -> &str {
        &self.id
    }
    fn created(&self) -> i64 {
        self.created
    }
}

impl Listed for RefundObject {
    fn id(&self) -> &str {
        &self.id
    }
    fn created(&self) -> i64 {
        self.created
    }
}

/// The `created` times (unix seconds, both ends included) a Stripe object made for one of our
/// operations can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    since: i64,
    until: Option<i64>,
}

impl Window {
    /// From our UUIDv7 `id`'s time to `last_send_at`, each widened by the slack; `None` for an
    /// id that carries no time (not one of ours).
    fn of(id: Uuid, last_send_at: Option<DateTime<Utc>>) -> Option<Window> {
        let (seconds, _) = id.get_timestamp()?.to_unix();
        let since = i64::try_from(seconds).ok()? - LOOKUP_SLACK_SECS;
        Some(Window { since, until: last_send_at.map(|sent| sent.timestamp() + LOOKUP_SLACK_SECS) })
    }

    fn holds(&self, created: i64) -> bool {
        created >= self.since && self.until.is_none_or(|until| created <= until)
    }

    /// The window as a listing's query.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let since = ("created[gte]", self.since.to_string());
        std::iter::once(since).chain(self.until.map(|until| ("created[lte]", until.to_string()))).collect()
    }
}

impl StripeProvider {
    /// A client for Stripe's API at `base_url` (Stripe's, or a stand-in such as localstripe).
    pub fn new(base_url: &str, timeout: Duration, api_key: &ApiKey) -> anyhow::Result<Self> {
        install_crypto_provider();
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, bearer(api_key.reveal())?);
        headers.insert(HeaderName::from_static("stripe-version"), HeaderValue::from_static(STRIPE_VERSION));
        Ok(StripeProvider {
            base_url: base_url_of(base_url)?,
            http: http_client(timeout, headers)?,
            created_filter: true,
        })
    }

    /// The same client, its lookups' listings sent without the window on `created` (still
    /// applied to what comes back): for a stand-in for Stripe that refuses the filter.
    pub fn without_created_filter(self) -> Self {
        StripeProvider { created_filter: false, ..self }
    }

    /// `GET /v1/balance`, which any working key may read: whether Stripe accepts the key, and
    /// whether Stripe says it is a live one. For `orderpay provider check`; it moves nothing.
    pub async fn check_key(&self) -> Result<bool, ProviderError> {
        #[derive(serde::Deserialize)]
        struct Balance {
            livemode: bool,
        }
        let balance: Balance = self.read(&["v1", "balance"], &[], None).await?.object()?;
        Ok(balance.livemode)
    }

    async fn send(request: RequestBuilder) -> Result<Reply, ProviderError> {
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        let should_retry = response
            .headers()
            .get("stripe-should-retry")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await.map_err(transport_error)?;
        Ok(Reply { status, should_retry, body })
    }

    /// `POST` of `form` to the path `segments`, keyed with `downstream_key`.
    async fn write(
        &self,
        segments: &[&str],
        form: &Form,
        downstream_key: &str,
        request_id: Option<&str>,
    ) -> Result<Reply, ProviderError> {
        let mut post = self
            .http
            .post(endpoint(&self.base_url, segments)?)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form.encode());
        for (name, value) in form::write_headers(downstream_key) {
            post = post.header(name, value);
        }
        Self::send(traced(post, request_id)).await
    }

    /// `GET` of the path `segments` with the query `pairs`.
    async fn read(
        &self,
        segments: &[&str],
        pairs: &[(&str, String)],
        request_id: Option<&str>,
    ) -> Result<Reply, ProviderError> {
        let mut url = endpoint(&self.base_url, segments)?;
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(pairs);
        }
        Self::send(traced(self.http.get(url), request_id)).await
    }

    async fn create(&self, request: &ChargeRequest) -> Result<Charge, ProviderError> {
        let form = form::create_payment_intent(request).map_err(not_sent)?.expand(LATEST_CHARGE);
        let reply = self
            .write(&["v1", "payment_intents"], &form, &request.downstream_key, request.request_id.as_deref())
            .await?;
        if !reply.status.is_success() {
            return match reply.failure() {
                StripeFailure::Declined { code, message } => {
                    Ok(declined_charge(request, &reply, code, message))
                }
                failure => Err(failure.into_provider_error()),
            };
        }
        let intent: PaymentIntentObject = reply.parse()?;
        if intent.needs_the_customer() {
            return self.abandon(intent, request).await;
        }
        intent.to_charge()
    }

    /// Cancels a PaymentIntent whose confirmation needs the customer, whom a server-side charge
    /// does not have: a decline (`authentication_required`). The cancel has a key of its own,
    /// derived from the charge's, so that a re-driven charge cancels the same way.
    async fn abandon(
        &self,
        intent: PaymentIntentObject,
        request: &ChargeRequest,
    ) -> Result<Charge, ProviderError> {
        let key = format!("{}_abandon", request.downstream_key);
        let form = Form::default().expand(LATEST_CHARGE);
        let reply = self
            .write(
                &["v1", "payment_intents", &intent.id, "cancel"],
                &form,
                &key,
                request.request_id.as_deref(),
            )
            .await?;
        match reply.object::<PaymentIntentObject>() {
            Ok(canceled) => canceled.to_charge(),
            Err(error) => {
                // Left waiting for a customer who never comes, it cannot be charged: still a
                // decline, and Stripe cancels it in time.
                tracing::warn!(payment_intent = %intent.id, %error, "could not cancel a PaymentIntent that needs the customer");
                intent.to_charge()
            }
        }
    }

    async fn get(&self, charge_id: &str, request_id: Option<&str>) -> Result<Option<Charge>, ProviderError> {
        let expand = [("expand[]", LATEST_CHARGE.to_owned())];
        let reply = self.read(&["v1", "payment_intents", charge_id], &expand, request_id).await?;
        reply.found::<PaymentIntentObject>()?.map(|intent| intent.to_charge()).transpose()
    }

    async fn capture(&self, request: &CaptureRequest) -> Result<Charge, ProviderError> {
        let form = form::capture_payment_intent(request).map_err(not_sent)?.expand(LATEST_CHARGE);
        let path = ["v1", "payment_intents", &request.charge_id, "capture"];
        let reply = self.write(&path, &form, &request.downstream_key, request.request_id.as_deref()).await?;
        reply.object::<PaymentIntentObject>()?.to_charge()
    }

    async fn cancel(&self, request: &CancelRequest) -> Result<Charge, ProviderError> {
        let form = Form::default().expand(LATEST_CHARGE);
        let path = ["v1", "payment_intents", &request.charge_id, "cancel"];
        let reply = self.write(&path, &form, &request.downstream_key, request.request_id.as_deref()).await?;
        reply.object::<PaymentIntentObject>()?.to_charge()
    }

    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ProviderError> {
        let form = form::create_refund(request).map_err(not_sent)?;
        let reply = self
            .write(&["v1", "refunds"], &form, &request.downstream_key, request.request_id.as_deref())
            .await?;
        reply.object::<RefundObject>()?.to_refund()
    }

    async fn find(
        &self,
        lookup: &ChargeLookup,
        request_id: Option<&str>,
    ) -> Result<Option<Charge>, ProviderError> {
        // A key that is not one of ours was never sent by this adapter.
        let Some(payment) = payments::payment_of_downstream_key(&lookup.downstream_key) else {
            return Ok(None);
        };
        let Some(window) = Window::of(payment.as_uuid(), lookup.last_send_at) else { return Ok(None) };
        let reference = payment.to_string();
        let found = self
            .scan(
                "payment_intents",
                window,
                &[("expand[]", "data.latest_charge")],
                request_id,
                |intent: &PaymentIntentObject| intent.payment_reference() == Some(reference.as_str()),
            )
            .await?;
        found.map(|intent| intent.to_charge()).transpose()
    }

    /// A refund of ours: among its PaymentIntent's refunds (`GET /v1/refunds?payment_intent=`,
    /// a page or two however busy the account), else among every refund back to our refund id's
    /// time, matching `metadata[orderpay_refund_id]`.
    async fn find_refund_by_key(
        &self,
        downstream_key: &str,
        charge_id: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<Option<Refund>, ProviderError> {
        let Some(refund) = refunds::refund_of_downstream_key(downstream_key) else { return Ok(None) };
        let reference = refund.to_string();
        let ours = |refund: &RefundObject| refund.refund_reference() == Some(reference.as_str());
        let of_intent: Vec<_> =
            charge_id.map(|payment_intent| ("payment_intent", payment_intent)).into_iter().collect();
        let Some(window) = Window::of(refund.as_uuid(), None) else { return Ok(None) };
        let found = self.scan("refunds", window, &of_intent, request_id, ours).await?;
        found.map(|refund| refund.to_refund()).transpose()
    }

    /// Pages through `GET /v1/{collection}` for the first object `matches` accepts among those
    /// created within `window`. Stops at the last page, or at a page whose objects are all
    /// older than the window (Stripe lists newest first).
    async fn scan<T: Listed>(
        &self,
        collection: &str,
        window: Window,
        extra: &[(&str, &str)],
        request_id: Option<&str>,
        matches: impl Fn(&T) -> bool,
    ) -> Result<Option<T>, ProviderError> {
        let mut starting_after: Option<String> = None;
        loop {
            let mut pairs = vec![("limit", PAGE_SIZE.to_owned())];
            if self.created_filter {
                pairs.extend(window.pairs());
            }
            pairs.extend(extra.iter().map(|(name, value)| (*name, (*value).to_owned())));
            pairs.extend(starting_after.take().map(|after| ("starting_after", after)));
            let page: List<T> = self.read(&["v1", collection], &pairs, request_id).await?.object()?;
            // Empty, or all older: no later page holds a newer one.
            let all_older = page.data.iter().all(|item| item.created() < window.since);
            let has_more = page.has_more;
            let last = page.data.last().map(|item| item.id().to_owned());
            if let Some(found) =
                page.data.into_iter().find(|item| window.holds(item.created()) && matches(item))
            {
                return Ok(Some(found));
            }
            match last {
                Some(last) if has_more && !all_older => starting_after = Some(last),
                _ => return Ok(None),
            }
        }
    }

    async fn dispute(
        &self,
        dispute_id: &str,
        request_id: Option<&str>,
    ) -> Result<Option<Dispute>, ProviderError> {
        let reply = self.read(&["v1", "disputes", dispute_id], &[], request_id).await?;
        reply.found::<DisputeObject>()?.map(|dispute| dispute.to_dispute()).transpose()
    }

    async fn disputes(
        &self,
        created_gte: DateTime<Utc>,
        starting_after: Option<&str>,
    ) -> Result<DisputePage, ProviderError> {
        let mut pairs =
            vec![("created[gte]", created_gte.timestamp().to_string()), ("limit", PAGE_SIZE.to_owned())];
        pairs.extend(starting_after.map(|after| ("starting_after", after.to_owned())));
        let page: List<DisputeObject> = self.read(&["v1", "disputes"], &pairs, None).await?.object()?;
        let disputes = page.data.iter().map(DisputeObject::to_dispute).collect::<Result<_, _>>()?;
        Ok(DisputePage { disputes, has_more: page.has_more })
    }

    async fn balance_transactions(&self, query: &BalanceQuery) -> Result<BalancePage, ProviderError> {
        let mut pairs = vec![
            ("created[gte]", query.created_gte.timestamp().to_string()),
            ("created[lt]", query.created_lt.timestamp().to_string()),
            ("limit", query.limit.to_string()),
            // The source names the PaymentIntent and carries our metadata; a dispute's carries
            // none, so its PaymentIntent comes expanded too, with ours (one call, not one per
            // dispute).
            ("expand[]", "data.source".to_owned()),
            ("expand[]", "data.source.payment_intent".to_owned()),
        ];
        pairs.extend(query.starting_after.iter().map(|after| ("starting_after", after.clone())));
        let page: List<BalanceTransactionObject> =
            self.read(&["v1", "balance_transactions"], &pairs, None).await?.object()?;
        let transactions = page
            .data
            .iter()
            .map(BalanceTransactionObject::to_balance_transaction)
            .collect::<Result<_, _>>()?;
        Ok(BalancePage { transactions, has_more: page.has_more })
    }

    /// Evidence: `POST /v1/disputes/{id}` with it, submitted. Acceptance:
    /// `POST /v1/disputes/{id}/close`.
    async fn respond(&self, request: &DisputeResponseRequest) -> Result<Dispute, ProviderError> {
        let id = request.dispute_id.as_str();
        let request_id = request.request_id.as_deref();
        match &request.answer {
            DisputeAnswer::Evidence(evidence) => {
                let form = form::submit_evidence(evidence);
                let reply =
                    self.write(&["v1", "disputes", id], &form, &request.downstream_key, request_id).await?;
                reply.object::<DisputeObject>()?.to_dispute()
            }
            DisputeAnswer::Accept => {
                let path = ["v1", "disputes", id, "close"];
                let reply = self.write(&path, &Form::default(), &request.downstream_key, request_id).await?;
                reply.object::<DisputeObject>()?.accepted()
            }
        }
    }
}

/// The charge a 402 decline stands for: nothing charged, in the request's amount, under the id
/// of the PaymentIntent (or, on localstripe, the charge) the decline left behind.
fn declined_charge(request: &ChargeRequest, reply: &Reply, code: String, message: String) -> Charge {
    let id = serde_json::from_slice::<DeclineEnvelope>(&reply.body)
        .ok()
        .and_then(|envelope| envelope.object_id())
        .unwrap_or_default();
    Charge {
        id,
        status: ChargeStatus::Declined { code, message },
        currency: request.amount.currency().code().to_owned(),
        amount: request.amount.value(),
        amount_captured: rust_decimal::Decimal::ZERO,
        amount_refunded: rust_decimal::Decimal::ZERO,
        authorization_expires_at: None,
    }
}

impl StripeProvider {
    /// Stripe's integer minor units, by its own exponent table (`amount`).
    fn refusal_of(&self, amount: &crate::money::Amount) -> Option<String> {
        super::amount::to_minor_units(amount).err().map(|error| error.to_string())
    }
}

crate::provider::payment_provider_by_methods!(StripeProvider);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_looks_from_five_minutes_before_our_id_to_five_minutes_after_our_last_send() {
        let id = Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, 1_750_000_000, 0));
        let unbounded = Window::of(id, None).unwrap();
        assert_eq!(unbounded, Window { since: 1_750_000_000 - 300, until: None });
        assert_eq!(unbounded.pairs(), [("created[gte]", "1749999700".to_owned())]);
        assert!(unbounded.holds(1_749_999_700) && !unbounded.holds(1_749_999_699));
        assert!(unbounded.holds(i64::MAX), "no send time: no end");

        let sent = DateTime::from_timestamp(1_750_000_060, 0);
        let window = Window::of(id, sent).unwrap();
        assert_eq!(window.until, Some(1_750_000_360));
        assert_eq!(
            window.pairs(),
            [("created[gte]", "1749999700".to_owned()), ("created[lte]", "1750000360".to_owned())]
        );
        assert!(window.holds(1_750_000_360) && !window.holds(1_750_000_361));
        assert_eq!(Window::of(Uuid::nil(), sent), None, "an id without a time bounds nothing");
    }

    #[test]
    fn every_call_carries_the_key_as_a_sensitive_header() {
        let key = ApiKey::parse("sk_test_visible_nowhere").unwrap();
        let provider = StripeProvider::new("http://127.0.0.1:1/", Duration::from_secs(1), &key).unwrap();
        assert!(!format!("{provider:?}").contains("visible_nowhere"));
        assert_eq!(
            endpoint(&provider.base_url, &["v1", "payment_intents", "pi_1/../x", "cancel"]).unwrap().as_str(),
            "http://127.0.0.1:1/v1/payment_intents/pi_1%2F..%2Fx/cancel"
        );
    }
}
