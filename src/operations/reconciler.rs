//! The reconciler: settles operations whose outcome a request did not see (a crash, a timeout, a
//! provider 5xx, a `pending` charge) by asking the provider.
//!
//! Each pass leases a bounded batch of due `processing` payments whose lease is free, in one
//! statement with `FOR UPDATE SKIP LOCKED` (so any number of instances run side by side with no
//! leader, and a payment a live request or retry holds is left alone), looks each one up by its
//! downstream key, settles final ones through the same engine as requests, re-sends a charge the
//! provider never received (same key), and releases the rest for a later check with capped
//! exponential backoff.
//!
//! After `max_attempts` checks the last one only looks: a payment the provider never received is
//! failed (`reconciliation_gave_up`; nothing was charged, and its key is never sent again). One
//! the provider knows but has not settled, or cannot be asked about, is never failed on a guess:
//! it stays `processing`, is checked at the backoff cap, and is reported as stuck.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::{Actor, DriveMode, Engine, EngineError, Outcome, Settlement, charge, settle};
use crate::background::{Shutdown, every};
use crate::clock::after;
use crate::ids::LeaseId;
use crate::payments::repository::{self, LeaseTarget};
use crate::payments::{GAVE_UP_CODE, Lease, Payment};

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
    /// Past the attempt limit but not given up on: the provider knows the charge but has not
    /// settled it, or cannot be asked. Failing those would be a guess; they need a person.
    pub stuck: usize,
    /// Failed after the attempt limit because the provider never received them.
    pub gave_up: usize,
    pub errors: usize,
}

impl PassReport {
    /// What the pass did, by result, as the metrics name them.
    pub fn results(&self) -> [(&'static str, usize); 6] {
        [
            ("settled", self.settled),
            ("redriven", self.redriven),
            ("rescheduled", self.rescheduled),
            ("stuck", self.stuck),
            ("gave_up", self.gave_up),
            ("error", self.errors),
        ]
    }

    fn add(&mut self, other: PassReport) {
        self.settled += other.settled;
        self.redriven += other.redriven;
        self.rescheduled += other.rescheduled;
        self.stuck += other.stuck;
        self.gave_up += other.gave_up;
        self.errors += other.errors;
    }
}

/// Payments of one batch driven at the same time.
const CONCURRENCY: usize = 8;

/// One pass over the due payments.
pub async fn run_pass(engine: &Engine, config: &ReconcilerConfig) -> Result<PassReport, EngineError> {
    let now = Utc::now();
    // The lease covers the whole batch, driven CONCURRENCY at a time.
    let rounds = (config.batch_size.max(1) as u32).div_ceil(CONCURRENCY as u32);
    let lease = Lease { id: LeaseId::generate(), until: after(now, config.claim_for.saturating_mul(rounds)) };
    let claimed = {
        let mut conn = engine.pool.get().await?;
        repository::lease(&mut conn, LeaseTarget::Due { limit: config.batch_size }, lease, now).await?
    };
    let mut report = PassReport { claimed: claimed.len(), ..PassReport::default() };
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = JoinSet::new();
    for payment in claimed {
        let (engine, config, limit) = (engine.clone(), *config, limit.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let mut one = PassReport::default();
            if let Err(error) = reconcile(&engine, &config, &payment, lease.id, &mut one).await {
                one.errors += 1;
                tracing::warn!(payment_id = %payment.id, error = %error, "reconciling a payment failed; retried later");
            }
            one
        });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(one) => report.add(one),
            Err(error) => {
                report.errors += 1;
                tracing::error!(error = %error, "a reconciliation task panicked");
            }
        }
    }
    crate::telemetry::metrics::reconciler_pass(&report.results());
    Ok(report)
}

async fn reconcile(
    engine: &Engine,
    config: &ReconcilerConfig,
    payment: &Payment,
    lease: LeaseId,
    report: &mut PassReport,
) -> Result<(), EngineError> {
    // The last check only looks: a charge sent now could succeed after we gave up on it.
    let last_check = payment.attempts >= config.max_attempts;
    let mode = if last_check { DriveMode::LookupOnly } else { DriveMode::Redrive };
    let request_id = format!("reconcile-{}", Uuid::now_v7());
    let (outcome, sent) = charge::drive(engine, payment, lease, mode, Some(&request_id)).await;
    report.redriven += usize::from(sent);
    let (settlement, giving_up) = match outcome {
        Outcome::Succeeded { charge_id } => (Settlement::Succeeded { charge_id }, false),
        Outcome::Declined { code, message } => (Settlement::Failed { code, message }, false),
        Outcome::NotReceived => {
            tracing::warn!(payment_id = %payment.id, attempts = payment.attempts,
                "giving up on a payment the provider never received");
            let failure = Settlement::Failed {
                code: GAVE_UP_CODE.to_owned(),
                message: format!(
                    "the provider never received the charge after {} attempts; nothing was charged",
                    payment.attempts
                ),
            };
            (failure, true)
        }
        Outcome::Unknown { reason } => {
            let wait = if last_check {
                tracing::error!(payment_id = %payment.id, attempts = payment.attempts, %reason,
                    "payment outcome still unknown after the last attempt; check it at the provider");
                report.stuck += 1;
                config.backoff_cap
            } else {
                report.rescheduled += 1;
                config.backoff(payment.attempts)
            };
            settle::release(&engine.pool, payment, lease, after(Utc::now(), wait), &reason).await?;
            return Ok(());
        }
    };
    let settled = settle::settle(&engine.pool, payment, &settlement, Actor::Reconciler).await?;
    if settled.applied {
        if giving_up {
            report.gave_up += 1;
        } else {
            report.settled += 1;
        }
    }
    Ok(())
}

/// Runs a pass every `interval` until `shutdown`; a full batch is followed at once by another
/// pass. Errors (the database away) are logged and the next round tries again.
pub async fn run(engine: Engine, config: ReconcilerConfig, shutdown: Shutdown) {
    every(config.interval, Duration::ZERO, shutdown, || {
        let engine = engine.clone();
        async move {
            match run_pass(&engine, &config).await {
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
