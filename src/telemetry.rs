//! Logging: tracing to stderr, human-readable (`ORDERPAY_LOG_FORMAT=pretty`, the default) or one
//! JSON object per line (`json`). The level filter is `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("ORDERPAY_LOG_FORMAT").is_ok_and(|format| format.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests build several apps in one process) is harmless: the first one stays.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
