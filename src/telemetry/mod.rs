//! Logs and metrics.
//!
//! Logs: tracing to stderr, human-readable (`ORDERPAY_LOG_FORMAT=pretty`, the default) or one
//! JSON object per line (`json`), filtered by `RUST_LOG` (default `info`). Every line logged while
//! serving a request carries that request's `request_id` (see `http::observe`). API keys and
//! payment method tokens are never logged; tokio-postgres logs statement parameters at debug
//! level, so it is held at info unless `RUST_LOG` names it explicitly.

pub mod metrics;

use tracing_subscriber::EnvFilter;

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
