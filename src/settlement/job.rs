//! The settlement job: every window of `ORDERPAY_SETTLEMENT_INTERVAL_MS` (windows aligned to the
//! epoch: daily ones start at midnight UTC) is run once, `ORDERPAY_SETTLEMENT_LAG_MS` after it
//! ends, so that movements recorded late on either side are in. Each instance runs the job; the
//! run's claim (a unique row per window) makes one of them run each window. An instance that
//! was down catches up the windows it missed, up to [`CATCH_UP`] of them.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::{RunError, RunOptions, Window};
use crate::background::{self, Shutdown};
use crate::db::Pool;
use crate::provider::PaymentProvider;

/// How many closed windows back an instance looks for one nobody ran.
pub const CATCH_UP: i32 = 3;

#[derive(Debug, Clone, Copy)]
pub struct SettlementConfig {
    /// The length of a window.
    pub interval: Duration,
    /// How long after a window ends it is run.
    pub lag: Duration,
    /// Provider movements per page; ledger movements per batch.
    pub page_size: u32,
}

impl SettlementConfig {
    /// How often an instance looks for a window to run: often enough that a window runs soon
    /// after it closes, never more than once a minute.
    pub fn poll(&self) -> Duration {
        (self.interval / 4).clamp(Duration::from_millis(10), Duration::from_secs(60))
    }
}

/// A claim older than this, unfinished, was made by an instance that died mid-run (a run that
/// fails releases its claim at once). A run of a million movements takes minutes.
pub const STALE_CLAIM: Duration = Duration::from_secs(900);

/// The newest `CATCH_UP` windows that are closed at `now` (ended at least `lag` ago), oldest
/// first.
pub fn closed_windows(now: DateTime<Utc>, config: &SettlementConfig) -> Vec<Window> {
    let interval =
        TimeDelta::from_std(config.interval).unwrap_or(TimeDelta::days(1)).max(TimeDelta::milliseconds(1));
    let lag = TimeDelta::from_std(config.lag).unwrap_or_default();
    let horizon = (now - lag).timestamp_millis();
    let step = interval.num_milliseconds();
    let newest_end = horizon.div_euclid(step) * step;
    (0..CATCH_UP)
        .rev()
        .filter_map(|back| {
            let end = DateTime::from_timestamp_millis(newest_end - i64::from(back) * step)?;
            Some(Window { start: end - interval, end })
        })
        .collect()
}

/// Runs the job until shutdown.
pub async fn run(
    pool: Pool,
    provider: Arc<dyn PaymentProvider>,
    config: SettlementConfig,
    shutdown: Shutdown,
) {
    let options = RunOptions { page_size: config.page_size, scheduled: true, stale_claim: STALE_CLAIM };
    background::every(config.poll(), Duration::ZERO, shutdown, move || {
        let (pool, provider) = (pool.clone(), provider.clone());
        async move {
            let mut conn = match pool.get().await {
                Ok(conn) => conn,
                Err(error) => {
                    tracing::warn!(%error, "settlement: no database connection");
                    return false;
                }
            };
            for window in closed_windows(Utc::now(), &config) {
                match super::run(&mut conn, provider.as_ref(), window, options).await {
                    Ok(report) => {
                        crate::telemetry::metrics::settlement_run(Some(&report));
                        tracing::info!(
                            from = %window.start,
                            to = %window.end,
                            provider_movements = report.provider_read,
                            exceptions = report.exceptions(),
                            "settlement: window reconciled"
                        );
                    }
                    Err(RunError::AlreadyClaimed) => {}
                    Err(error) => {
                        // The claim was released: the next poll tries the window again.
                        crate::telemetry::metrics::settlement_run(None);
                        tracing::error!(%error, from = %window.start, to = %window.end, "settlement: run failed");
                        return false;
                    }
                }
            }
            false
        }
    })
    .await;
}
