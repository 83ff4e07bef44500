//! Settlement reconciliation's settings: how long a window is, how long after its end it runs,
//! and how many movements a page holds.

use std::time::Duration;

use clap::Args;

use crate::settlement::job::SettlementConfig;

#[derive(Debug, Clone, Args)]
pub struct SettlementArgs {
    /// The length of a settlement window (milliseconds): each window of the provider's money
    /// movements is compared with the ledger once (windows are aligned to the epoch, so daily
    /// ones start at midnight UTC). 0 turns the job off (`orderpay settlement run` still works).
    #[arg(long, env = "ORDERPAY_SETTLEMENT_INTERVAL_MS", default_value_t = 86_400_000)]
    pub settlement_interval_ms: u64,

    /// How long after a window ends it is compared (milliseconds), so that movements either side
    /// records late (a charge settled by the reconciler, a late refund) are in. Longer than the
    /// reconciler takes to give up on an operation.
    #[arg(long, env = "ORDERPAY_SETTLEMENT_LAG_MS", default_value_t = 3 * 3_600_000)]
    pub settlement_lag_ms: u64,

    /// Provider movements per page (as at Stripe, at most 100) and ledger movements per batch.
    #[arg(long, env = "ORDERPAY_SETTLEMENT_PAGE_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub settlement_page_size: u32,
}

impl SettlementArgs {
    /// The job's settings; `None` when it is off.
    pub fn config(&self) -> Option<SettlementConfig> {
        (self.settlement_interval_ms > 0).then(|| SettlementConfig {
            interval: Duration::from_millis(self.settlement_interval_ms),
            lag: Duration::from_millis(self.settlement_lag_ms),
            page_size: self.settlement_page_size,
        })
    }
}
