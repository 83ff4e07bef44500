//! The reconciler: settles provider operations whose outcome a request did not see (a crash, a
//! timeout, a provider 5xx, a `pending` charge or refund) by asking the provider, with one
//! engine for every kind (charges and authorizations, captures and voids, refunds).
//!
//! Each pass, for each kind, leases a bounded batch of due in-flight operations whose lease is
//! free, in one statement with `FOR UPDATE SKIP LOCKED` (so any number of instances run side by
//! side with no leader, and an operation a live request or retry holds is left alone), looks each
//! one up by its downstream key, settles final ones through the same engine as requests,
//! re-sends what the provider never received (same key), and releases the rest for a later check
//! with capped exponential backoff. It also looks at authorizations that are due (at their
//! expiry), and records those the provider let go.
//!
//! After `max_attempts` checks the last one only looks: an operation the provider never
//! received is given up on (`reconciliation_gave_up`; nothing moved, and its key is never sent
//! again; a capture or void given up on leaves the authorization waiting). One the provider
//! knows but has not settled, or cannot be asked about, is never failed on a guess: it stays
//! `processing`, is checked at the backoff cap, and is reported as stuck.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::authorization::{self, Watched};
use super::leases::{self, Lease, LeaseTarget};
use super::{
    Actor, DriveMode, Engine, EngineError, Finding, GiveUp, Kind, SendQuiet, drive, late_charge, late_refund,
};
use crate::background::{Shutdown, every};
use crate::clock::after;
use crate::ids::LeaseId;
use crate::payments::watches;

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
    /// How long the last send must have been quiet before an operation the provider never
    /// received is given up on: the provider timeout and a margin.
    pub quiet_before_give_up: Duration,
    /// How long a payment given up on is watched for a charge that lands late.
    pub late_charge_watch: Duration,
    /// How long a refund given up on is watched for the provider carrying it out late.
    pub late_refund_watch: Duration,
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
    /// Transitions this pass applied (at the provider's word).
    pub settled: usize,
    /// Requests sent again because the provider had never received them.
    pub redriven: usize,
    pub rescheduled: usize,
    /// Past the attempt limit but not given up on: the provider knows the charge but has not
    /// settled it, or cannot be asked. Failing those would be a guess; they need a person.
    pub stuck: usize,
    /// Given up on after the attempt limit because the provider never received them.
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
        self.claimed += other.claimed;
        self.settled += other.settled;
        self.redriven += other.redriven;
        self.rescheduled += other.rescheduled;
        self.stuck += other.stuck;
        self.gave_up += other.gave_up;
        self.errors += other.errors;
    }
}

/// Operations of one batch driven at the same time.
const CONCURRENCY: usize = 8;

/// One pass over the due operations of every kind, and the due authorizations. Each part runs
/// whatever another met: a database error ends one operation's check (or, for a claim, that
/// part's batch), counted in `errors`, never the pass.
pub async fn run_pass(engine: &Engine, config: &ReconcilerConfig) -> Result<PassReport, EngineError> {
    let mut report = pass_every_kind(engine, config).await;
    report.add(part("authorizations", watch_authorizations(engine, config).await));
    // The late-refund watch first: a late charge's refund given up on is found carried out, or
    // known absent, before the late-charge watch decides whether to start another.
    report.add(part("late refunds", late_refund::watch_due(engine, config).await));
    report.add(part("late charges", late_charge::watch_due(engine, config).await));
    let disputes = crate::disputes::record::pass(engine).await;
    report.add(part(
        "disputes",
        disputes.map(|pass| PassReport {
            settled: pass.applied,
            errors: pass.errors,
            ..PassReport::default()
        }),
    ));
    crate::telemetry::metrics::reconciler_pass(&report.results());
    Ok(report)
}

/// Declares `pass_every_kind`: one [`pass_over`] of each kind of [`super::every_kind!`].
macro_rules! passes {
    ($( $kind:path => $variant:ident($table:literal, $label:literal, $resource:ident = $spelling:literal) ),* $(,)?) => {
        /// The due operations of every kind, one kind after the other.
        async fn pass_every_kind(engine: &Engine, config: &ReconcilerConfig) -> PassReport {
            let mut report = PassReport::default();
            $( report.add(part($label, pass_over::<$kind>(engine, config).await)); )*
            report
        }
    };
}

super::every_kind!(passes);

/// What one part of a pass did; a part that failed as a whole (its claim) counts one error.
fn part(what: &str, done: Result<PassReport, EngineError>) -> PassReport {
    done.unwrap_or_else(|error| {
        tracing::warn!(part = what, error = %error, "a reconciler part failed; the pass goes on");
        PassReport { errors: 1, ..PassReport::default() }
    })
}

/// Leases the due operations of one kind and drives them, `CONCURRENCY` at a time.
async fn pass_over<K: Kind>(engine: &Engine, config: &ReconcilerConfig) -> Result<PassReport, EngineError> {
    let now = Utc::now();
    // The lease covers the whole batch, driven CONCURRENCY at a time.
    let rounds = (config.batch_size.max(1) as u32).div_ceil(CONCURRENCY as u32);
    let lease = Lease { id: LeaseId::generate(), until: after(now, config.claim_for.saturating_mul(rounds)) };
    let mut claimed = Vec::new();
    let mut unreadable = 0;
    {
        let mut conn = engine.pool.get().await?;
        for leased in
            leases::lease(&mut conn, K::TABLE, LeaseTarget::Due { limit: config.batch_size }, lease, now)
                .await?
        {
            // An operation that cannot be read (a row this version cannot make sense of) waits
            // for its lease to run out and a person; the rest of the batch goes on.
            match K::load(&mut conn, (leased.account_id, leased.id)).await {
                Ok(Some(op)) => claimed.push((op, leased.attempts, leased.leased_at)),
                Ok(None) => {
                    tracing::error!(id = %leased.id, kind = K::TABLE.label(), "a leased operation vanished")
                }
                Err(error) => {
                    unreadable += 1;
                    tracing::error!(id = %leased.id, kind = K::TABLE.label(), error = %error,
                        "a leased operation cannot be read; left for a later pass");
                }
            }
        }
    }
    let mut report =
        PassReport { claimed: claimed.len() + unreadable, errors: unreadable, ..PassReport::default() };
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = JoinSet::new();
    for (op, attempts, leased_at) in claimed {
        let (engine, config, limit) = (engine.clone(), *config, limit.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let mut one = PassReport::default();
            let claim = Claim { lease: lease.id, attempts, leased_at };
            if let Err(error) = reconcile::<K>(&engine, &config, &op, claim, &mut one).await {
                one.errors += 1;
                let (_, id) = K::id(&op);
                tracing::warn!(%id, kind = K::TABLE.label(), error = %error, "reconciling an operation failed; retried later");
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
    Ok(report)
}

/// The reconciler's hold on one operation: its lease, the checks made, and when (the database's
/// clock) it was taken.
#[derive(Debug, Clone, Copy)]
struct Claim {
    lease: LeaseId,
    attempts: i32,
    leased_at: chrono::DateTime<Utc>,
}

async fn reconcile<K: Kind>(
    engine: &Engine,
    config: &ReconcilerConfig,
    op: &K::Op,
    Claim { lease, attempts, leased_at }: Claim,
    report: &mut PassReport,
) -> Result<(), EngineError> {
    let (_, id) = K::id(op);
    // The last check only looks: a request sent now could land after we gave up on it.
    let last_check = attempts >= config.max_attempts;
    let mode = if last_check { DriveMode::LookupOnly } else { DriveMode::Redrive };
    let request_id = format!("reconcile-{}", Uuid::now_v7());
    let (finding, sent) = drive::<K>(engine, op, lease, mode, Some(&request_id)).await;
    crate::hooks::point("reconciler.before_record").await;
    report.redriven += usize::from(sent);
    let (outcome, giving_up) = match finding {
        Finding::Final(outcome) => (outcome, false),
        Finding::NotReceived => {
            tracing::warn!(%id, kind = K::TABLE.label(), attempts, "giving up on an operation the provider never received");
            let give_up = GiveUp {
                attempts,
                quiet_for: config.quiet_before_give_up,
                late_watch: K::late_watch(config),
                quiet: SendQuiet::new(leased_at, config.quiet_before_give_up, lease),
            };
            (K::gave_up(op, give_up), true)
        }
        Finding::Unsent { reason } => {
            tracing::error!(%id, kind = K::TABLE.label(), %reason,
                "the provider refused our credentials; the check is not counted");
            report.rescheduled += 1;
            let mut conn = engine.pool.get().await?;
            // The check is not counted, so its backoff would not grow: wait the longest, not
            // the shortest, between calls the provider refuses until an operator acts.
            let next_check = after(Utc::now(), config.backoff_cap);
            leases::release_unsent(&mut conn, K::TABLE, K::id(op), lease, next_check, &reason, Utc::now())
                .await?;
            return Ok(());
        }
        Finding::KeyConflict { reason } => {
            tracing::error!(%id, kind = K::TABLE.label(), %reason,
                "the provider holds the operation's key with other parameters; held for a person");
            report.stuck += 1;
            let mut conn = engine.pool.get().await?;
            leases::hold(&mut conn, K::TABLE, K::id(op), lease, &reason, Utc::now()).await?;
            return Ok(());
        }
        Finding::Unknown { reason } => {
            let wait = if last_check {
                tracing::error!(%id, kind = K::TABLE.label(), attempts, %reason,
                    "outcome still unknown after the last attempt; check it at the provider");
                report.stuck += 1;
                config.backoff_cap
            } else {
                report.rescheduled += 1;
                config.backoff(attempts)
            };
            let mut conn = engine.pool.get().await?;
            leases::release(
                &mut conn,
                K::TABLE,
                K::id(op),
                lease,
                after(Utc::now(), wait),
                &reason,
                Utc::now(),
            )
            .await?;
            return Ok(());
        }
    };
    if giving_up {
        crate::hooks::point("reconciler.before_give_up").await;
    }
    let Some(recorded) = K::settle(&engine.pool, op, outcome, Actor::Reconciler).await? else {
        // A send may still be in flight: the give-up waits until it has been quiet long enough.
        tracing::warn!(%id, kind = K::TABLE.label(), "a give-up held back: a send may still be in flight");
        report.rescheduled += 1;
        let mut conn = engine.pool.get().await?;
        let next_check = after(Utc::now(), config.quiet_before_give_up);
        let reason = "waiting for the last send to be quiet before giving up";
        leases::release(&mut conn, K::TABLE, K::id(op), lease, next_check, reason, Utc::now()).await?;
        return Ok(());
    };
    if recorded.applied {
        if giving_up {
            report.gave_up += 1;
        } else {
            report.settled += 1;
        }
    }
    Ok(())
}

/// Looks at the authorizations that are due (waiting for a capture, at their expiry or soon
/// after a capture or void was given up on).
async fn watch_authorizations(engine: &Engine, config: &ReconcilerConfig) -> Result<PassReport, EngineError> {
    let now = Utc::now();
    let due = {
        let mut conn = engine.pool.get().await?;
        watches::watch(&mut conn, now, config.batch_size, after(now, config.claim_for)).await?
    };
    let mut report = PassReport { claimed: due.len(), ..PassReport::default() };
    for payment in due {
        let payment = match payment {
            Ok(payment) => payment,
            Err(error) => {
                report.errors += 1;
                tracing::error!(error = %error, "a watched authorization cannot be read; left for a later pass");
                continue;
            }
        };
        match authorization::watch(engine, &payment, config.backoff_cap).await {
            Ok(Watched::Ended) => report.settled += 1,
            Ok(Watched::StillAuthorized) => report.rescheduled += 1,
            Ok(Watched::Unknown) => report.stuck += 1,
            Err(error) => {
                report.errors += 1;
                tracing::warn!(payment_id = %payment.id, error = %error, "watching an authorization failed");
            }
        }
    }
    Ok(report)
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
            quiet_before_give_up: Duration::from_secs(10),
            late_charge_watch: Duration::from_secs(86_400),
            late_refund_watch: Duration::from_secs(86_400),
        };
        let waits: Vec<u64> = (1..=8).map(|attempt| config.backoff(attempt).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(config.backoff(i32::MAX), Duration::from_secs(60));
    }
}
