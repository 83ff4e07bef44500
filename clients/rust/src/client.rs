//! The client: one method per operation, each call sent with its idempotency key and retried by
//! the rules of [`crate::retry`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, ErrorKind, Problem};
use crate::keys::{self, KeyStore, MemoryKeyStore, StoredKey};
use crate::operations;
use crate::retry::{self, Decision, Outcome, Settings, Stop, Transport};
use crate::types::*;

/// Which idempotency key a write is sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// A new key (a UUID) for this call, the same on each of its attempts.
    New,
    /// The caller's own key (1 to 255 visible ASCII characters).
    Given(String),
    /// The key the client's [`KeyStore`] holds for this intent and operation, made and saved
    /// before the first send: a call resumed after a crash or a failure sends the same key.
    Intent(String),
}

impl Key {
    pub fn intent(intent: impl Into<String>) -> Key {
        Key::Intent(intent.into())
    }

    pub fn given(key: impl Into<String>) -> Key {
        Key::Given(key.into())
    }
}

/// A success: the resource, and how it came.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply<T> {
    pub value: T,
    /// 200, 201, or 202 (`processing`: the outcome is not known yet).
    pub status: u16,
    /// The stored answer of an earlier request with the same key (`Idempotent-Replayed`).
    pub replayed: bool,
    pub attempts: u32,
    pub key: Option<String>,
}

impl<T> Reply<T> {
    /// A 202: accepted, its outcome not known yet (send the same call again, or wait for it).
    pub fn processing(&self) -> bool {
        self.status == 202
    }
}

/// What a hook is told about one attempt.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub key: Option<&'a str>,
    /// 1 for the first send.
    pub attempt: u32,
    /// The answer's status (response hooks; `None` when there was no answer).
    pub status: Option<u16>,
    /// Since the attempt was sent (response hooks).
    pub elapsed: Duration,
}

pub type Hook = Arc<dyn Fn(&Attempt<'_>) + Send + Sync>;

/// Builds a [`Client`].
pub struct ClientBuilder {
    base_url: String,
    api_key: String,
    settings: Settings,
    store: Arc<dyn KeyStore>,
    on_request: Option<Hook>,
    on_response: Option<Hook>,
}

impl ClientBuilder {
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.settings.max_retries = max_retries;
        self
    }

    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.settings.deadline = deadline;
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Where the keys of [`Key::Intent`] calls live (in memory by default).
    pub fn key_store(mut self, store: Arc<dyn KeyStore>) -> Self {
        self.store = store;
        self
    }

    /// Called before each attempt.
    pub fn on_request(mut self, hook: impl Fn(&Attempt<'_>) + Send + Sync + 'static) -> Self {
        self.on_request = Some(Arc::new(hook));
        self
    }

    /// Called after each attempt, with its status (or none) and time.
    pub fn on_response(mut self, hook: impl Fn(&Attempt<'_>) + Send + Sync + 'static) -> Self {
        self.on_response = Some(Arc::new(hook));
        self
    }

    pub fn build(self) -> Result<Client, Error> {
        // Err means a provider is installed already, which is all that is needed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut headers = HeaderMap::new();
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", self.api_key)).map_err(|_| {
            failed(ErrorKind::Invalid("the API key has characters a header cannot hold".into()))
        })?;
        authorization.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, authorization);
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("orderpay-client-rust/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| failed(ErrorKind::Transport(error)))?;
        let base_url = reqwest::Url::parse(&self.base_url).map_err(|error| {
            failed(ErrorKind::Invalid(format!("the base URL {}: {error}", self.base_url)))
        })?;
        Ok(Client {
            inner: Arc::new(Inner {
                base_url,
                http,
                settings: self.settings,
                store: self.store,
                on_request: self.on_request,
                on_response: self.on_response,
            }),
        })
    }
}

fn failed(kind: ErrorKind) -> Error {
    Error { kind, key: None, attempts: 0 }
}

struct Inner {
    base_url: reqwest::Url,
    http: reqwest::Client,
    settings: Settings,
    store: Arc<dyn KeyStore>,
    on_request: Option<Hook>,
    on_response: Option<Hook>,
}

/// An orderpay client; cheap to clone (one connection pool).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// One call as sent: its operation, path, query, body and key.
struct Call<'a> {
    operation: &'static str,
    id: Option<&'a str>,
    query: Vec<(&'static str, String)>,
    body: Option<serde_json::Value>,
    key: Option<&'a Key>,
    waiting: bool,
}

impl Client {
    /// `base_url` such as `http://127.0.0.1:8080`; `api_key` the account's secret key.
    pub fn builder(base_url: impl Into<String>, api_key: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            api_key: api_key.into(),
            settings: Settings::default(),
            store: Arc::new(MemoryKeyStore::new()),
            on_request: None,
            on_response: None,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    pub fn key_store(&self) -> &Arc<dyn KeyStore> {
        &self.inner.store
    }

    // Orders

    pub async fn create_order(&self, order: &CreateOrder, key: Key) -> Result<Reply<Order>, Error> {
        self.write("createOrder", None, Some(body(order)?), &key, false).await
    }

    pub async fn list_orders(&self, params: &ListParams) -> Result<Reply<List<Order>>, Error> {
        self.read("listOrders", None, params.query()).await
    }

    pub async fn get_order(&self, id: &str) -> Result<Reply<Order>, Error> {
        self.read("getOrder", Some(id), Vec::new()).await
    }

    pub async fn cancel_order(&self, id: &str, key: Key) -> Result<Reply<Order>, Error> {
        self.write("cancelOrder", Some(id), None, &key, false).await
    }

    // Payments

    /// `POST /payments`: a 202 (`processing`) is a success; see [`Client::pay_and_wait`].
    pub async fn create_payment(&self, payment: &CreatePayment, key: Key) -> Result<Reply<Payment>, Error> {
        self.write("createPayment", None, Some(body(payment)?), &key, false).await
    }

    /// `POST /payments`, re-sent with the same key while it answers 202, until its final answer
    /// (the service replays it) or the deadline.
    pub async fn pay_and_wait(&self, payment: &CreatePayment, key: Key) -> Result<Reply<Payment>, Error> {
        self.write("createPayment", None, Some(body(payment)?), &key, true).await
    }

    pub async fn list_payments(&self, params: &ListParams) -> Result<Reply<List<Payment>>, Error> {
        self.read("listPayments", None, params.query()).await
    }

    pub async fn get_payment(&self, id: &str) -> Result<Reply<Payment>, Error> {
        self.read("getPayment", Some(id), Vec::new()).await
    }

    pub async fn capture_payment(
        &self,
        id: &str,
        capture: &Capture,
        key: Key,
    ) -> Result<Reply<Payment>, Error> {
        self.write("capturePayment", Some(id), Some(body(capture)?), &key, false).await
    }

    /// A capture, re-sent while it answers 202, until its final answer or the deadline.
    pub async fn capture_and_wait(
        &self,
        id: &str,
        capture: &Capture,
        key: Key,
    ) -> Result<Reply<Payment>, Error> {
        self.write("capturePayment", Some(id), Some(body(capture)?), &key, true).await
    }

    pub async fn void_payment(&self, id: &str, key: Key) -> Result<Reply<Payment>, Error> {
        self.write("voidPayment", Some(id), None, &key, false).await
    }

    // Refunds

    pub async fn create_refund(&self, refund: &CreateRefund, key: Key) -> Result<Reply<Refund>, Error> {
        self.write("createRefund", None, Some(body(refund)?), &key, false).await
    }

    /// A refund, re-sent while it answers 202, until its final answer or the deadline.
    pub async fn refund_and_wait(&self, refund: &CreateRefund, key: Key) -> Result<Reply<Refund>, Error> {
        self.write("createRefund", None, Some(body(refund)?), &key, true).await
    }

    pub async fn list_refunds(&self, params: &ListParams) -> Result<Reply<List<Refund>>, Error> {
        self.read("listRefunds", None, params.query()).await
    }

    pub async fn get_refund(&self, id: &str) -> Result<Reply<Refund>, Error> {
        self.read("getRefund", Some(id), Vec::new()).await
    }

    // Books

    /// The account's money movements, newest first (filters: `payment_id`, `order_id`,
    /// `event_type` as the movement's type).
    pub async fn list_balance_transactions(
        &self,
        params: &ListParams,
    ) -> Result<Reply<List<BalanceTransaction>>, Error> {
        self.read("listBalanceTransactions", None, params.query()).await
    }

    // Disputes

    /// The account's disputes, newest first (filters: `status`, `payment_id`).
    pub async fn list_disputes(&self, params: &ListParams) -> Result<Reply<List<Dispute>>, Error> {
        self.read("listDisputes", None, params.query()).await
    }

    /// Submits text evidence for a dispute, once (202 while its outcome is unknown).
    pub async fn submit_dispute_evidence(
        &self,
        id: &str,
        evidence: &DisputeEvidence,
        key: Key,
    ) -> Result<Reply<Dispute>, Error> {
        self.write("submitDisputeEvidence", Some(id), Some(body(evidence)?), &key, false).await
    }

    /// Closes a dispute without contest.
    pub async fn accept_dispute(&self, id: &str, key: Key) -> Result<Reply<Dispute>, Error> {
        self.write("acceptDispute", Some(id), None, &key, false).await
    }

    pub async fn get_dispute(&self, id: &str) -> Result<Reply<Dispute>, Error> {
        self.read("getDispute", Some(id), Vec::new()).await
    }

    // Events

    pub async fn list_events(&self, params: &ListParams) -> Result<Reply<List<Event>>, Error> {
        self.read("listEvents", None, params.query()).await
    }

    pub async fn get_event(&self, id: &str) -> Result<Reply<Event>, Error> {
        self.read("getEvent", Some(id), Vec::new()).await
    }

    // Webhook endpoints

    pub async fn create_webhook_endpoint(
        &self,
        endpoint: &CreateWebhookEndpoint,
        key: Key,
    ) -> Result<Reply<WebhookEndpoint>, Error> {
        self.write("createWebhookEndpoint", None, Some(body(endpoint)?), &key, false).await
    }

    pub async fn list_webhook_endpoints(
        &self,
        params: &ListParams,
    ) -> Result<Reply<List<WebhookEndpoint>>, Error> {
        self.read("listWebhookEndpoints", None, params.query()).await
    }

    pub async fn get_webhook_endpoint(&self, id: &str) -> Result<Reply<WebhookEndpoint>, Error> {
        self.read("getWebhookEndpoint", Some(id), Vec::new()).await
    }

    pub async fn delete_webhook_endpoint(&self, id: &str) -> Result<Reply<DeletedWebhookEndpoint>, Error> {
        let call = Call {
            operation: "deleteWebhookEndpoint",
            id: Some(id),
            query: Vec::new(),
            body: None,
            key: None,
            waiting: false,
        };
        self.send(call).await
    }

    pub async fn rotate_webhook_endpoint_secret(
        &self,
        id: &str,
        key: Key,
    ) -> Result<Reply<WebhookEndpoint>, Error> {
        self.write("rotateWebhookEndpointSecret", Some(id), None, &key, false).await
    }

    async fn read<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        id: Option<&str>,
        query: Vec<(&'static str, String)>,
    ) -> Result<Reply<T>, Error> {
        self.send(Call { operation, id, query, body: None, key: None, waiting: false }).await
    }

    async fn write<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        id: Option<&str>,
        body: Option<serde_json::Value>,
        key: &Key,
        waiting: bool,
    ) -> Result<Reply<T>, Error> {
        self.send(Call { operation, id, query: Vec::new(), body, key: Some(key), waiting }).await
    }

    /// The key a call sends: made, or loaded from the store (and saved with its first send's
    /// time before that send); refused when older than `key_ttl`.
    fn key_for(&self, operation: &str, key: &Key) -> Result<String, Error> {
        let invalid = |text: String| failed(ErrorKind::Invalid(text));
        match key {
            Key::New => Ok(keys::new_key()),
            Key::Given(key) if keys::valid_key(key) => Ok(key.clone()),
            Key::Given(_) => Err(invalid("a key is 1 to 255 visible ASCII characters (0x21-0x7E)".into())),
            Key::Intent(intent) => {
                let store = &self.inner.store;
                let loaded = store.load(intent, operation).map_err(|error| invalid(error.to_string()))?;
                let mut stored = loaded.unwrap_or_else(|| StoredKey::new(keys::new_key()));
                let now = keys::now_ms();
                if stored.expired(self.inner.settings.key_ttl, now) {
                    return Err(Error {
                        kind: ErrorKind::KeyExpired {
                            key: stored.key.clone(),
                            first_sent_at_ms: stored.first_sent_at_ms.unwrap_or_default(),
                        },
                        key: Some(stored.key),
                        attempts: 0,
                    });
                }
                if stored.first_sent_at_ms.is_none() {
                    stored.first_sent_at_ms = Some(now);
                    store.save(intent, operation, &stored).map_err(|error| invalid(error.to_string()))?;
                    // Another send of the intent may have saved its key first: that one is kept.
                    let kept = store.load(intent, operation).map_err(|error| invalid(error.to_string()))?;
                    return Ok(kept.map_or(stored.key, |kept| kept.key));
                }
                Ok(stored.key)
            }
        }
    }

    async fn send<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<Reply<T>, Error> {
        let settings = &self.inner.settings;
        let key = call.key.map(|key| self.key_for(call.operation, key)).transpose()?;
        let (method, path) = operations::route(call.operation, call.id);
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let error = |kind: ErrorKind| Error { kind, key: key.clone(), attempts: attempt };
            let remaining = settings.deadline.saturating_sub(started.elapsed());
            if remaining.is_zero() {
                return Err(error(ErrorKind::Deadline));
            }
            let info = Attempt {
                method,
                path: &path,
                key: key.as_deref(),
                attempt,
                status: None,
                elapsed: Duration::ZERO,
            };
            if let Some(hook) = &self.inner.on_request {
                hook(&info);
            }
            let sent_at = Instant::now();
            let answer =
                self.attempt(method, &path, &call, key.as_deref(), settings.timeout.min(remaining)).await;
            if let Some(hook) = &self.inner.on_response {
                let status = answer.as_ref().ok().map(|answer| answer.status);
                hook(&Attempt { status, elapsed: sent_at.elapsed(), ..info });
            }
            let outcome = match &answer {
                Ok(answer) => answer.outcome(),
                Err(failure) => Outcome::Transport(classify(failure)),
            };
            let remaining = settings.deadline.saturating_sub(started.elapsed());
            match retry::decide(settings, attempt, &outcome, call.waiting, remaining, retry::random()) {
                Decision::Retry(delay) => tokio::time::sleep(delay).await,
                Decision::Done => {
                    let answer = answer.map_err(|failure| error(ErrorKind::Transport(failure)))?;
                    let value = serde_json::from_slice(&answer.body)
                        .map_err(|failure| error(ErrorKind::Decode(failure.to_string())))?;
                    return Ok(Reply {
                        value,
                        status: answer.status,
                        replayed: answer.replayed,
                        attempts: attempt,
                        key,
                    });
                }
                Decision::Stop(stop) => return Err(error(stopped(stop, answer))),
            }
        }
    }

    async fn attempt(
        &self,
        method: &str,
        path: &str,
        call: &Call<'_>,
        key: Option<&str>,
        timeout: Duration,
    ) -> Result<Answer, reqwest::Error> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        let base = &self.inner.base_url;
        let mut url = base.clone();
        url.set_path(&format!("{}{path}", base.path().trim_end_matches('/')));
        if !call.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&call.query);
        }
        let mut request = self.inner.http.request(method, url).timeout(timeout);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(body) = &call.body {
            request = request.json(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
        };
        let retry_after = header("retry-after").and_then(|value| retry::parse_retry_after(&value));
        let should_retry = header("orderpay-should-retry").map(|value| value == "true");
        let replayed = header("idempotent-replayed").is_some_and(|value| value == "true");
        let body = response.bytes().await?.to_vec();
        Ok(Answer { status, retry_after, should_retry, replayed, body })
    }
}

/// A request body as JSON.
fn body(value: &impl Serialize) -> Result<serde_json::Value, Error> {
    serde_json::to_value(value).map_err(|error| failed(ErrorKind::Decode(error.to_string())))
}

/// One attempt's answer, read whole.
struct Answer {
    status: u16,
    retry_after: Option<Duration>,
    should_retry: Option<bool>,
    replayed: bool,
    body: Vec<u8>,
}

impl Answer {
    fn problem(&self) -> Option<Problem> {
        serde_json::from_slice(&self.body).ok()
    }

    fn outcome(&self) -> Outcome {
        Outcome::Answer {
            status: self.status,
            problem_type: self.problem().map(|problem| problem.problem_type),
            retry_after: self.retry_after,
            should_retry: self.should_retry,
        }
    }
}

fn classify(error: &reqwest::Error) -> Transport {
    use std::error::Error as _;
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return Transport::Refused,
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof => return Transport::Reset,
                _ => {}
            }
        }
        if cause.downcast_ref::<rustls::Error>().is_some() {
            return Transport::Tls;
        }
        source = cause.source();
    }
    if error.is_timeout() {
        Transport::Timeout
    } else if error.is_connect() {
        Transport::Refused
    } else if error.is_request() && !error.is_body() && !error.is_decode() {
        // hyper's "connection closed before message completed": the server hung up.
        Transport::Reset
    } else {
        Transport::Other
    }
}

fn stopped(stop: Stop, answer: Result<Answer, reqwest::Error>) -> ErrorKind {
    match (stop, answer) {
        (Stop::Deadline, _) => ErrorKind::Deadline,
        (_, Err(failure)) => ErrorKind::Transport(failure),
        (Stop::InProgress, Ok(answer)) => {
            let problem = answer.problem();
            let resource_id = problem
                .as_ref()
                .and_then(|problem| problem.member("resource_id").or(problem.member("payment_id")))
                .map(str::to_owned)
                .or_else(|| {
                    serde_json::from_slice::<serde_json::Value>(&answer.body)
                        .ok()
                        .and_then(|body| body["id"].as_str().map(str::to_owned))
                });
            ErrorKind::InProgress { status: answer.status, problem: problem.map(Box::new), resource_id }
        }
        (Stop::KeyReused, Ok(answer)) => match answer.problem() {
            Some(problem) => ErrorKind::KeyReused { problem: Box::new(problem) },
            None => ErrorKind::Decode("a 422 without a problem document".into()),
        },
        (_, Ok(answer)) => match answer.problem() {
            Some(problem) => ErrorKind::Api { status: answer.status, problem: Box::new(problem) },
            None => ErrorKind::Api {
                status: answer.status,
                problem: Box::new(Problem {
                    problem_type: "about:blank".into(),
                    title: String::new(),
                    status: answer.status,
                    detail: String::from_utf8_lossy(&answer.body).into_owned(),
                    extra: serde_json::Map::new(),
                }),
            },
        },
    }
}
