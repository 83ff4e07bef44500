//! Logs and metrics.
//!
//! Logs: tracing to stderr, human-readable (`ORDERPAY_LOG_FORMAT=pretty`, the default) or one
//! JSON object per line (`json`), filtered by `RUST_LOG` (default `info`). Every line logged while
//! serving a request carries that request's `request_id` (see `http::observe`). API keys and
//! payment method tokens are never logged; tokio-postgres logs statement parameters at debug
//! level, so it is held at info unless `RUST_LOG` names it explicitly.

pub mod metrics;

use std::sync::Mutex;

use metrics_exporter_prometheus::PrometheusHandle;
use tracing_subscriber::EnvFilter;

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
        builder.json().with_current_span(true).with_span_list(false).try_init()
    } else {
        builder.try_init()
    };
}
