//! The reconciler: settles payments whose outcome a request did not see (a crash, a timeout, a
//! provider 5xx, a `pending` charge) by asking the provider.
//!
//! Each pass claims a bounded batch of due `processing` payments with `FOR UPDATE SKIP LOCKED`
//! (so any number of instances run side by side with no leader), looks each one up by its
//! downstream key, settles terminal ones (payment, order and the key's stored answer in one
//! transaction), re-sends a charge the provider never received (same key), and reschedules the
//! rest with capped exponential backoff. After `max_attempts` checks it gives up: the payment
//! fails with a reason, loudly. A payment whose key is leased by a live request is not touched.

use std::time::Duration;

use chrono::Utc;
use diesel_async::AsyncConnection;

use crate::background::{Shutdown, every};
use crate::clock::after;
use crate::error::ApiError;
use crate::payments::service::{self, DriveMode, GAVE_UP_CODE, PaymentContext};
use crate::payments::{Actor, Outcome, Payment, Settlement, repository};

#[derive(Debug, Clone, Copy)]
pub struct ReconcilerConfig {
    pub interval: Duration,
    pub batch_size: i64,
    /// Provider checks before a payment is given up on.
    pub max_attempts: i32,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    /// How long a claimed payment stays hidden from other reconcilers (and its key leased):
    /// longer than a lookup plus a re-sent charge can take.
    pub claim_for: Duration,
}

impl ReconcilerConfig {
    /// The wait before check number `attempts + 1`: base, 2 x base, 4 x base, ... up to the cap.
    pub fn backoff(&self, attempts: i32) -> Duration {
        let doublings = attempts.saturating_sub(1).clamp(0, 30) as u32;
        self.backoff_base.saturating_mul(1 << doublings).min(self.backoff_cap)
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    pub claimed: usize,
    /// Transitions this pass applied (succeeded or failed at the provider's word).
    pub settled: usize,
    /// Charges sent again because the provider had never received them.
    pub redriven: usize,
    pub rescheduled: usize,
    pub gave_up: usize,
    pub errors: usize,
}

/// One pass over the due payments.
pub async fn run_pass(context: &PaymentContext, config: &ReconcilerConfig) -> anyhow::Result<PassReport> {
    let now = Utc::now();
    let claimed = {
        let mut conn = context.pool.get().await?;
        conn.transaction(async |conn| {
            repository::claim_due(conn, now, config.batch_size, after(now, config.claim_for)).await
        })
        .await?
    };
    let mut report = PassReport { claimed: claimed.len(), ..PassReport::default() };
    for payment in claimed {
        if let Err(error) = reconcile(context, config, &payment, &mut report).await {
            report.errors += 1;
            tracing::warn!(payment_id = %payment.id, error = %error, "reconciling a payment failed; retried next pass");
        }
    }
    Ok(report)
}

async fn reconcile(
    context: &PaymentContext,
    config: &ReconcilerConfig,
    payment: &Payment,
    report: &mut PassReport,
) -> Result<(), ApiError> {
    let (outcome, sent) = service::ask_provider(context.provider.as_ref(), payment, DriveMode::Redrive).await;
    report.redriven += usize::from(sent);
    let settlement = match outcome {
        Outcome::Succeeded { charge_id } => Settlement::Succeeded { charge_id },
        Outcome::Declined { code, message } => Settlement::Failed { code, message },
        Outcome::Unknown { reason } if payment.attempts >= config.max_attempts => {
            tracing::error!(payment_id = %payment.id, attempts = payment.attempts, %reason,
                "giving up on a payment whose outcome stays unknown; check it at the provider");
            report.gave_up += 1;
            Settlement::Failed {
                code: GAVE_UP_CODE.to_owned(),
                message: format!(
                    "no definite answer from the provider after {} checks: {reason}",
                    payment.attempts
                ),
            }
        }
        Outcome::Unknown { reason } => {
            let next_check = after(Utc::now(), config.backoff(payment.attempts));
            service::release(&context.pool, payment, next_check, &reason).await?;
            report.rescheduled += 1;
            return Ok(());
        }
    };
    let settled = service::settle(&context.pool, payment, &settlement, Actor::Reconciler).await?;
    report.settled += usize::from(settled.applied);
    Ok(())
}

/// Runs a pass every `interval` until `shutdown`; a full batch is followed at once by another
/// pass. Errors (the database away) are logged and the next round tries again.
pub async fn run(context: PaymentContext, config: ReconcilerConfig, shutdown: Shutdown) {
    every(config.interval, shutdown, || {
        let context = context.clone();
        async move {
            match run_pass(&context, &config).await {
                Ok(report) => {
                    if report.claimed > 0 {
                        tracing::info!(?report, "reconciler pass");
                    }
                    report.claimed as i64 == config.batch_size
                }
                Err(error) => {
                    tracing::warn!(error = ?error, "reconciler pass failed");
                    false
                }
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let config = ReconcilerConfig {
            interval: Duration::from_secs(5),
            batch_size: 10,
            max_attempts: 10,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
            claim_for: Duration::from_secs(30),
        };
        let waits: Vec<u64> = (1..=8).map(|attempt| config.backoff(attempt).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(config.backoff(i32::MAX), Duration::from_secs(60));
    }
}
