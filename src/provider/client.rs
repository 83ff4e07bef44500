//! The reqwest client for the provider contract. Every call carries the payment's downstream key
//! and is bounded by `ORDERPAY_PROVIDER_TIMEOUT_MS`.

use std::time::Duration;

use reqwest::StatusCode;

use super::wire::{ChargeBody, CreateChargeBody, ErrorBody};
use super::{BoxFuture, Charge, ChargeRequest, ChargeStatus, PaymentProvider, ProviderError};

#[derive(Debug, Clone)]
pub struct HttpProvider {
    base_url: String,
    http: reqwest::Client,
}

impl HttpProvider {
    pub fn new(base_url: &str, timeout: Duration) -> anyhow::Result<Self> {
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(HttpProvider { base_url: base_url.trim_end_matches('/').to_owned(), http })
    }

    async fn create(&self, request: &ChargeRequest) -> Result<Charge, ProviderError> {
        let body = CreateChargeBody {
            amount: request.amount.to_string(),
            currency: request.amount.currency().code().to_owned(),
            payment_method: request.payment_method.clone(),
            reference: request.reference.to_string(),
        };
        let mut post = self
            .http
            .post(format!("{}/v1/charges", self.base_url))
            .header("Idempotency-Key", &request.downstream_key)
            .json(&body);
        if let Some(request_id) = &request.request_id {
            post = post.header("X-Request-Id", request_id);
        }
        let response = post.send().await.map_err(transport_error)?;
        match response.status() {
            StatusCode::OK | StatusCode::CREATED => charge_of(response).await,
            status => Err(status_error(status, response).await),
        }
    }

    async fn find(
        &self,
        downstream_key: &str,
        request_id: Option<&str>,
    ) -> Result<Option<Charge>, ProviderError> {
        let url = url::Url::parse_with_params(
            &format!("{}/v1/charges", self.base_url),
            [("idempotency_key", downstream_key)],
        )
        .map_err(|error| ProviderError::Connection(format!("bad provider URL: {error}")))?;
        let mut get = self.http.get(url);
        if let Some(request_id) = request_id {
            get = get.header("X-Request-Id", request_id);
        }
        let response = get.send().await.map_err(transport_error)?;
        match response.status() {
            StatusCode::OK => charge_of(response).await.map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            status => Err(status_error(status, response).await),
        }
    }
}

impl PaymentProvider for HttpProvider {
    fn create_charge<'a>(
        &'a self,
        request: &'a ChargeRequest,
    ) -> BoxFuture<'a, Result<Charge, ProviderError>> {
        Box::pin(self.create(request))
    }

    fn find_charge<'a>(
        &'a self,
        downstream_key: &'a str,
        request_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Charge>, ProviderError>> {
        Box::pin(self.find(downstream_key, request_id))
    }
}

/// reqwest is built without a default TLS crypto provider (ring builds far faster than aws-lc);
/// it must be installed once before the first client is built.
pub fn install_crypto_provider() {
    // Err means one is installed already, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn transport_error(error: reqwest::Error) -> ProviderError {
    if error.is_timeout() {
        ProviderError::Timeout
    } else {
        // Connection refused or reset, a broken body: the request may or may not have arrived.
        ProviderError::Connection(error.without_url().to_string())
    }
}

async fn charge_of(response: reqwest::Response) -> Result<Charge, ProviderError> {
    let bytes = response.bytes().await.map_err(transport_error)?;
    let body: ChargeBody =
        serde_json::from_slice(&bytes).map_err(|error| ProviderError::Malformed(error.to_string()))?;
    let status = match body.status.as_str() {
        "succeeded" => ChargeStatus::Succeeded,
        "pending" => ChargeStatus::Pending,
        "declined" => ChargeStatus::Declined {
            code: body.decline_code.unwrap_or_else(|| "declined".to_owned()),
            message: body.failure_message.unwrap_or_else(|| "the payment was declined".to_owned()),
        },
        other => return Err(ProviderError::Malformed(format!("unknown charge status {other:?}"))),
    };
    Ok(Charge { id: body.id, status })
}

async fn status_error(status: StatusCode, response: reqwest::Response) -> ProviderError {
    if status.is_server_error() {
        return ProviderError::ServerError(status.as_u16());
    }
    let message = match response.bytes().await {
        Ok(bytes) => serde_json::from_slice::<ErrorBody>(&bytes)
            .map(|body| body.error.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).chars().take(200).collect()),
        Err(error) => error.to_string(),
    };
    ProviderError::Rejected { status: status.as_u16(), message }
}
