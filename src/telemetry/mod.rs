//! Logs and metrics.
//!
//! Logs: tracing to stderr, human-readable (`ORDERPAY_LOG_FORMAT=pretty`, the default) or one
//! JSON object per line (`json`), filtered by `RUST_LOG` (default `info`). Every line logged while
//! serving a request carries that request's `request_id` (see `http::observe`). API keys and
//! payment method tokens are never logged; tokio-postgres logs statement parameters at debug
//! level, so it is held at info unless `RUST_LOG` names it explicitly. What a client sends wrong
//! (bytes that are no HTTP, a head too large, a connection cut mid-request) is answered by
//! actix-http and logged at debug ([`ClientInput`]), never at error: a client must not be able
//! to page an operator.

pub mod metrics;

use std::sync::Mutex;

use metrics_exporter_prometheus::PrometheusHandle;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::db::Pool;

/// What `GET /metrics` reads: the recorder's handle and every pool of the process.
pub struct Observability {
    pub metrics: PrometheusHandle,
    pools: Mutex<Vec<Pool>>,
}

impl Observability {
    /// Installs the metrics recorder (once per process).
    pub fn new() -> Self {
        Observability { metrics: metrics::install(), pools: Mutex::default() }
    }

    pub fn register(&self, pool: &Pool) {
        self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(pool.clone());
    }

    /// Connections in use and idle, over every pool.
    pub fn pool_connections(&self) -> (u32, u32) {
        let pools = self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        pools.iter().map(|pool| pool.state()).fold((0, 0), |(in_use, idle), state| {
            (in_use + state.connections - state.idle_connections, idle + state.idle_connections)
        })
    }
}

impl Default for Observability {
    fn default() -> Self {
        Self::new()
    }
}

pub fn init() {
    let configured = std::env::var("RUST_LOG").unwrap_or_default();
    let mut filter = EnvFilter::try_new(if configured.is_empty() { "info" } else { &configured })
        .unwrap_or_else(|_| EnvFilter::new("info"));
    if !configured.contains("tokio_postgres") {
        filter = filter.add_directive("tokio_postgres=info".parse().expect("a valid directive"));
    }
    let json = std::env::var("ORDERPAY_LOG_FORMAT").is_ok_and(|format| format.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests build several apps in one process) is harmless: the first one stays.
    let _ = if json {
        builder.json().with_current_span(true).with_span_list(false).finish().with(ClientInput).try_init()
    } else {
        builder.finish().with(ClientInput).try_init()
    };
}

/// Where what a client sent wrong is logged, at debug.
pub const CLIENT_INPUT_TARGET: &str = "orderpay::http::client_input";

/// Takes what actix-http's HTTP/1 dispatcher logs at error about a client's input (`stream
/// error: Parse error ...` for bytes that are no HTTP, a head too large or a connection reset
/// mid-request, `Internal server error: unexpected ...` for a body framed wrongly, `write zero`
/// for a client gone) and says it again at debug under [`CLIENT_INPUT_TARGET`]: actix-http has
/// answered the client already (400, 431 or nothing), and any client can send such bytes, so at
/// error they would page an operator for nothing. Its other errors (a response body of ours
/// failing) stay errors.
pub struct ClientInput;

impl ClientInput {
    const DISPATCHER: &'static str = "actix_http::h1::dispatcher";
    const CLIENT_CAUSED: [&'static str; 3] =
        ["stream error", "Internal server error: unexpected", "write zero"];

    /// The message of an event of the dispatcher that tells of a client's input, if it is one.
    fn client_input(event: &Event<'_>) -> Option<String> {
        let metadata = event.metadata();
        if *metadata.level() != Level::ERROR || !metadata.target().starts_with(Self::DISPATCHER) {
            return None;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        Self::CLIENT_CAUSED.iter().any(|prefix| message.0.starts_with(prefix)).then_some(message.0)
    }
}

impl<S: Subscriber> Layer<S> for ClientInput {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let Some(message) = Self::client_input(event) else { return true };
        tracing::debug!(target: CLIENT_INPUT_TARGET, "client input refused by actix-http: {message}");
        false
    }
}

/// An event's `message` field, as text.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_owned();
        }
    }
}
