//! The reqwest client for the provider contract. Every call is bounded by
//! `ORDERPAY_PROVIDER_TIMEOUT_MS`, carries the request id (`X-Request-Id`) of the request that
//! drives it and, when configured, the provider credential (`Authorization: Bearer`); every write
//! carries its downstream `Idempotency-Key`.
//!
//! Answers are sorted here, once: a 5xx is `ServerError`, a 402 (or a 400/409 with a known
//! refusal code) is `Refused`, a 401 or 403 is `Unauthorized` (our credentials: the provider did
//! not act), any other 4xx is `Rejected`, a 404 on a lookup is `None`.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;

use super::wire::{
    BalanceTransactionBody, CancelChargeBody, CaptureChargeBody, ChargeBody, CloseDisputeBody,
    CreateChargeBody, CreateRefundBody, DisputeBody, ErrorBody, ListBody, REFUSAL_CODES, RefundBody,
    UpdateDisputeBody,
};
use super::{
    BalancePage, BalanceQuery, CancelRequest, CaptureRequest, Charge, ChargeLookup, ChargeRequest, Dispute,
    DisputeAnswer, DisputePage, DisputeResponseRequest, ProviderError, Refund, RefundRequest,
};

#[derive(Debug, Clone)]
pub struct HttpProvider {
    base_url: url::Url,
    http: reqwest::Client,
}

impl HttpProvider {
    /// A client for the provider at `base_url`. With `api_key`, every call sends
    /// `Authorization: Bearer <api_key>` (marked sensitive, so it is never printed).
    pub fn new(base_url: &str, timeout: Duration, api_key: Option<String>) -> anyhow::Result<Self> {
        install_crypto_provider();
        let mut headers = HeaderMap::new();
        if let Some(api_key) = api_key {
            headers.insert(AUTHORIZATION, bearer(&api_key)?);
        }
        Ok(HttpProvider { base_url: base_url_of(base_url)?, http: http_client(timeout, headers)? })
    }

    fn url(&self, segments: &[&str]) -> Result<url::Url, ProviderError> {
        endpoint(&self.base_url, segments)
    }

    fn lookup_url(&self, collection: &str, downstream_key: &str) -> Result<url::Url, ProviderError> {
        let mut url = self.url(&["v1", collection])?;
        url.query_pairs_mut().append_pair("idempotency_key", downstream_key);
        Ok(url)
    }

    async fn create(&self, request: &ChargeRequest) -> Result<Charge, ProviderError> {
        let body = CreateChargeBody {
            amount: request.amount.to_string(),
            currency: request.amount.currency().code().to_owned(),
            payment_method: request.payment_method.clone(),
            reference: request.reference.to_string(),
            capture: request.capture,
        };
        let post = self.http.post(self.url(&["v1", "charges"])?).json(&body);
        let post = keyed(post, &request.downstream_key, request.request_id.as_deref());
        let charge: ChargeBody = answer(post, &[StatusCode::OK, StatusCode::CREATED]).await?;
        charge.to_charge()
    }

    async fn find(
        &self,
        charge: &ChargeLookup,
        request_id: Option<&str>,
    ) -> Result<Option<Charge>, ProviderError> {
        // The mock looks up by key: the send time bounds nothing.
        let get = traced(self.http.get(self.lookup_url("charges", &charge.downstream_key)?), request_id);
        let charge: Option<ChargeBody> = lookup(get).await?;
        charge.map(|charge| charge.to_charge()).transpose()
    }

    async fn get(&self, charge_id: &str, request_id: Option<&str>) -> Result<Option<Charge>, ProviderError> {
        let get = traced(self.http.get(self.url(&["v1", "charges", charge_id])?), request_id);
        let charge: Option<ChargeBody> = lookup(get).await?;
        charge.map(|charge| charge.to_charge()).transpose()
    }

    async fn capture(&self, request: &CaptureRequest) -> Result<Charge, ProviderError> {
        let body = CaptureChargeBody {
            amount: request.amount.map(|amount| amount.to_string()),
            currency: request.amount.map(|amount| amount.currency().code().to_owned()),
        };
        let post = self.http.post(self.url(&["v1", "charges", &request.charge_id, "capture"])?).json(&body);
        let post = keyed(post, &request.downstream_key, request.request_id.as_deref());
        let charge: ChargeBody = answer(post, &[StatusCode::OK]).await?;
        charge.to_charge()
    }

    async fn cancel(&self, request: &CancelRequest) -> Result<Charge, ProviderError> {
        let post = self
            .http
            .post(self.url(&["v1", "charges", &request.charge_id, "cancel"])?)
            .json(&CancelChargeBody::default());
        let post = keyed(post, &request.downstream_key, request.request_id.as_deref());
        let charge: ChargeBody = answer(post, &[StatusCode::OK]).await?;
        charge.to_charge()
    }

    async fn refund(&self, request: &RefundRequest) -> Result<Refund, ProviderError> {
        let body = CreateRefundBody {
            charge: request.charge_id.clone(),
            amount: request.amount.to_string(),
            currency: Some(request.amount.currency().code().to_owned()),
            reference: request.reference.to_string(),
        };
        let post = self.http.post(self.url(&["v1", "refunds"])?).json(&body);
        let post = keyed(post, &request.downstream_key, request.request_id.as_deref());
        let refund: RefundBody = answer(post, &[StatusCode::OK, StatusCode::CREATED]).await?;
        refund.to_refund()
    }

    /// The mock's contract looks a refund up by its key itself; the charge is not needed.
    async fn find_refund_by_key(
        &self,
        downstream_key: &str,
        _charge_id: Option<&str>,
        request_id: Option<&str>,
    ) -> Result<Option<Refund>, ProviderError> {
        let get = traced(self.http.get(self.lookup_url("refunds", downstream_key)?), request_id);
        let refund: Option<RefundBody> = lookup(get).await?;
        refund.map(|refund| refund.to_refund()).transpose()
    }

    async fn balance_transactions(&self, query: &BalanceQuery) -> Result<BalancePage, ProviderError> {
        let mut pairs = vec![
            ("created_gte", query.created_gte.to_rfc3339()),
            ("created_lt", query.created_lt.to_rfc3339()),
            ("limit", query.limit.to_string()),
        ];
        pairs.extend(query.starting_after.iter().map(|after| ("starting_after", after.clone())));
        let (transactions, has_more) =
            self.list("balance_transactions", &pairs, BalanceTransactionBody::to_balance_transaction).await?;
        Ok(BalancePage { transactions, has_more })
    }

    /// `GET /v1/{collection}?{pairs}`: a page of the provider's list, each item translated.
    async fn list<Body: DeserializeOwned, Item>(
        &self,
        collection: &str,
        pairs: &[(&str, String)],
        translate: impl Fn(&Body) -> Result<Item, ProviderError>,
    ) -> Result<(Vec<Item>, bool), ProviderError> {
        let mut url = self.url(&["v1", collection])?;
        url.query_pairs_mut().extend_pairs(pairs);
        let page: ListBody<Body> = answer(self.http.get(url), &[StatusCode::OK]).await?;
        let items = page.data.iter().map(translate).collect::<Result<_, _>>()?;
        Ok((items, page.has_more))
    }
}

impl HttpProvider {
    async fn dispute(
        &self,
        dispute_id: &str,
        request_id: Option<&str>,
    ) -> Result<Option<Dispute>, ProviderError> {
        let get = traced(self.http.get(self.url(&["v1", "disputes", dispute_id])?), request_id);
        let dispute: Option<DisputeBody> = lookup(get).await?;
        dispute.map(|dispute| dispute.to_dispute()).transpose()
    }

    /// `POST /v1/disputes/{id}` with the evidence, submitted; or `POST /v1/disputes/{id}/close`.
    async fn respond(&self, request: &DisputeResponseRequest) -> Result<Dispute, ProviderError> {
        let id = request.dispute_id.as_str();
        let post = match &request.answer {
            DisputeAnswer::Evidence(evidence) => {
                let body = UpdateDisputeBody { evidence: Some(evidence.clone()), submit: true };
                self.http.post(self.url(&["v1", "disputes", id])?).json(&body)
            }
            DisputeAnswer::Accept => {
                self.http.post(self.url(&["v1", "disputes", id, "close"])?).json(&CloseDisputeBody {})
            }
        };
        let post = keyed(post, &request.downstream_key, request.request_id.as_deref());
        let dispute: DisputeBody = answer(post, &[StatusCode::OK]).await?;
        dispute.to_dispute()
    }

    async fn disputes(
        &self,
        created_gte: chrono::DateTime<chrono::Utc>,
        starting_after: Option<&str>,
    ) -> Result<DisputePage, ProviderError> {
        let mut pairs =
            vec![("created_gte", created_gte.timestamp().to_string()), ("limit", "100".to_owned())];
        pairs.extend(starting_after.map(|after| ("starting_after", after.to_owned())));
        let (disputes, has_more) = self.list("disputes", &pairs, DisputeBody::to_dispute).await?;
        Ok(DisputePage { disputes, has_more })
    }
}

impl HttpProvider {
    /// The mock's contract carries amounts as decimal strings: any amount orderpay holds.
    fn refusal_of(&self, _amount: &crate::money::Amount) -> Option<String> {
        None
    }
}

crate::provider::payment_provider_by_methods!(HttpProvider);

/// `Bearer <api_key>`, marked sensitive so that no debug output or log line shows it.
pub(crate) fn bearer(api_key: &str) -> anyhow::Result<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {api_key}"))
        .map_err(|_| anyhow::anyhow!("the provider API key has characters a header cannot hold"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// The HTTP client of a provider wire: every call bounded by `timeout` (connecting by 2 s at
/// most), `headers` on every call.
pub(crate) fn http_client(timeout: Duration, headers: HeaderMap) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(2)))
        .pool_idle_timeout(Duration::from_secs(30))
        .default_headers(headers)
        .build()?)
}

/// The provider's base URL, with a trailing slash so that [`endpoint`] keeps its path
/// (`http://host/prefix/`).
pub(crate) fn base_url_of(text: &str) -> anyhow::Result<url::Url> {
    Ok(url::Url::parse(&format!("{}/", text.trim_end_matches('/')))?)
}

/// `base_url` + the path segments, each percent-encoded (ids come from the provider).
pub(crate) fn endpoint(base_url: &url::Url, segments: &[&str]) -> Result<url::Url, ProviderError> {
    let mut url = base_url.clone();
    url.path_segments_mut()
        .map_err(|()| ProviderError::Connection("the provider URL cannot have a path".to_owned()))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// reqwest is built without a default TLS crypto provider (ring builds far faster than aws-lc);
/// it must be installed once before the first client is built.
pub fn install_crypto_provider() {
    // Err means one is installed already, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(crate) fn traced(request: RequestBuilder, request_id: Option<&str>) -> RequestBuilder {
    match request_id {
        Some(request_id) => request.header("X-Request-Id", request_id),
        None => request,
    }
}

fn keyed(request: RequestBuilder, downstream_key: &str, request_id: Option<&str>) -> RequestBuilder {
    traced(request.header("Idempotency-Key", downstream_key), request_id)
}

/// Sends a write; one of `expected` gives its object, anything else an error.
async fn answer<T: DeserializeOwned>(
    request: RequestBuilder,
    expected: &[StatusCode],
) -> Result<T, ProviderError> {
    let response = request.send().await.map_err(transport_error)?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(transport_error)?;
    if expected.contains(&status) {
        serde_json::from_slice(&bytes).map_err(|error| ProviderError::Malformed(error.to_string()))
    } else {
        Err(status_error(status, &bytes))
    }
}

/// Sends a lookup: 200 gives the object, 404 gives `None`.
async fn lookup<T: DeserializeOwned>(request: RequestBuilder) -> Result<Option<T>, ProviderError> {
    let response = request.send().await.map_err(transport_error)?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(transport_error)?;
    match status {
        StatusCode::OK => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|error| ProviderError::Malformed(error.to_string())),
        StatusCode::NOT_FOUND => Ok(None),
        status => Err(status_error(status, &bytes)),
    }
}

pub(crate) fn transport_error(error: reqwest::Error) -> ProviderError {
    if error.is_timeout() {
        ProviderError::Timeout
    } else {
        // Connection refused or reset, a broken body: the request may or may not have arrived.
        ProviderError::Connection(error.without_url().to_string())
    }
}

fn status_error(status: StatusCode, bytes: &[u8]) -> ProviderError {
    if status.is_server_error() {
        return ProviderError::ServerError(status.as_u16());
    }
    let (kind, code, message) = match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(body) => (Some(body.error.kind), body.error.code, body.error.message),
        Err(_) => (None, None, String::from_utf8_lossy(bytes).chars().take(200).collect()),
    };
    let known_refusal = code.as_deref().is_some_and(|code| REFUSAL_CODES.contains(&code));
    if kind.as_deref() == Some("idempotency_error") {
        crate::telemetry::metrics::provider_error("idempotency");
        return ProviderError::KeyReused { status: status.as_u16(), message };
    }
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            crate::telemetry::metrics::provider_error("auth");
            ProviderError::Unauthorized { status: status.as_u16(), message }
        }
        StatusCode::PAYMENT_REQUIRED => {
            ProviderError::Refused { code: code.unwrap_or_else(|| "refused".to_owned()), message }
        }
        StatusCode::BAD_REQUEST | StatusCode::CONFLICT if known_refusal => {
            ProviderError::Refused { code: code.unwrap_or_default(), message }
        }
        status => {
            let message = match code {
                Some(code) => format!("{code}: {message}"),
                None => message,
            };
            ProviderError::Rejected { status: status.as_u16(), message }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(status: u16, body: &str) -> ProviderError {
        status_error(StatusCode::from_u16(status).unwrap(), body.as_bytes())
    }

    #[test]
    fn answers_are_sorted_into_refusals_rejections_and_server_errors() {
        let refusal = r#"{"error":{"type":"card_error","code":"authorization_expired","message":"gone"}}"#;
        assert_eq!(
            error(402, refusal),
            ProviderError::Refused { code: "authorization_expired".into(), message: "gone".into() }
        );
        // A 402 is a refusal even without a code we know.
        assert!(matches!(error(402, "nope"), ProviderError::Refused { code, .. } if code == "refused"));
        let too_large = r#"{"error":{"type":"invalid_request","code":"amount_too_large","message":"m"}}"#;
        assert!(matches!(error(400, too_large), ProviderError::Refused { .. }));
        let captured =
            r#"{"error":{"type":"invalid_request","code":"charge_already_captured","message":"m"}}"#;
        assert!(matches!(error(409, captured), ProviderError::Refused { .. }));
        // A malformed request, an unknown code, a key conflict, a missing credential: our bug.
        let malformed = r#"{"error":{"type":"invalid_request","message":"bad amount"}}"#;
        assert!(matches!(error(400, malformed), ProviderError::Rejected { status: 400, .. }));
        let unknown = r#"{"error":{"type":"invalid_request","code":"in_progress","message":"m"}}"#;
        assert!(matches!(error(409, unknown), ProviderError::Rejected { status: 409, .. }));
        assert!(matches!(error(422, too_large), ProviderError::Rejected { status: 422, .. }));
        // A key the provider holds with other parameters: a conflict for a person, not a guess.
        let reused = r#"{"error":{"type":"idempotency_error","message":"m"}}"#;
        assert!(matches!(error(422, reused), ProviderError::KeyReused { status: 422, .. }));
        assert!(matches!(error(401, "{}"), ProviderError::Unauthorized { status: 401, .. }));
        assert!(matches!(error(403, "{}"), ProviderError::Unauthorized { status: 403, .. }));
        assert_eq!(error(503, refusal), ProviderError::ServerError(503));
    }

    #[test]
    fn ids_are_percent_encoded_into_paths() {
        let provider = HttpProvider::new("http://127.0.0.1:1/prefix/", Duration::from_secs(1), None).unwrap();
        let url = provider.url(&["v1", "charges", "ch_1/../x?y", "capture"]).unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:1/prefix/v1/charges/ch_1%2F..%2Fx%3Fy/capture");
        let lookup = provider.lookup_url("refunds", "a key&b=c").unwrap();
        assert_eq!(lookup.as_str(), "http://127.0.0.1:1/prefix/v1/refunds?idempotency_key=a+key%26b%3Dc");
        assert!(
            HttpProvider::new("http://127.0.0.1:1", Duration::from_secs(1), Some("bad\nkey".into())).is_err()
        );
    }
}
