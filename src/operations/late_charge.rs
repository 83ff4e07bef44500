//! Charges that land after their payment was given up on are never kept.
//!
//! A give-up waits until the payment's last send has been quiet for the provider timeout and a
//! margin, and every send is ordered against it by the database; still, a provider can act
//! later than any timeout. So the reconciler keeps looking a given-up payment's downstream key up
//! (with backoff, for `ORDERPAY_LATE_CHARGE_WATCH_SECS`; a provider webhook reporting the charge
//! brings the next look forward). A charge it finds is recorded on the
//! failed payment (which stays failed, its stored 402 answer standing) and refunded by the
//! system through the refund engine: a refund with no client key, that leaves the order alone.
//! A late authorization is voided. The customer ends charged once: by the payment that
//! succeeded, or not at all.
//!
//! A payment an operator failed by hand (`orderpay payments resolve --as failed`) is watched the
//! same way, and a charge the provider holds for it is taken back through the same
//! [`take_back`], at once when the operator forced the failure over it.

use chrono::{SubsecRound, Utc};

use super::leases::Lease;
use super::reconciler::{PassReport, ReconcilerConfig};
use super::refund::{Held, Refunds};
use super::{Actor, DriveMode, Engine, EngineError, Finding, Kind, drive, leases};
use crate::clock::after;
use crate::idempotency::store::{ClaimParameters, ResourceKind};
use crate::ids::{LeaseId, RefundId};
use crate::payments::repository as payments;
use crate::payments::{Payment, PaymentStatus};
use crate::provider::{CancelRequest, Charge, ChargeStatus};
use crate::refunds::RefundStatus;
use crate::refunds::repository::{self as refunds, StartOutcome, StartRefund};

/// Looks for late charges of the given-up payments that are due.
pub async fn watch_due(engine: &Engine, config: &ReconcilerConfig) -> Result<PassReport, EngineError> {
    let now = Utc::now();
    let due = {
        let mut conn = engine.pool.get().await?;
        payments::watch_late(&mut conn, now, config.batch_size, after(now, config.claim_for)).await?
    };
    let mut report = PassReport { claimed: due.len(), ..PassReport::default() };
    for (payment, watch_until) in due {
        match look(engine, config, &payment, watch_until).await {
            Ok(true) => report.settled += 1,
            Ok(false) => report.rescheduled += 1,
            Err(error) => {
                report.errors += 1;
                tracing::warn!(payment_id = %payment.id, error = %error, "looking for a late charge failed");
            }
        }
    }
    Ok(report)
}

/// One look for a late charge of `payment`. Returns whether it found one and dealt with it.
async fn look(
    engine: &Engine,
    config: &ReconcilerConfig,
    payment: &Payment,
    watch_until: chrono::DateTime<Utc>,
) -> Result<bool, EngineError> {
    let found = engine.provider.find_charge(&payment.downstream_key(), None).await;
    let taken = match found {
        Ok(Some(charge)) => take_back(engine, config, payment, &charge, LANDED_LATE).await?,
        // Nothing (yet): keep looking until the watch ends.
        Ok(None) => TakenBack::Left { reason: "no charge at the provider".to_owned() },
        Err(error) => TakenBack::Left { reason: error.to_string() },
    };
    if let TakenBack::Left { .. } = taken {
        schedule(engine, config, payment, watch_until).await?;
        return Ok(false);
    }
    Ok(true)
}

/// Why a charge of a failed payment is taken back, as the audit trail says it: the reconciler
/// found it landing after the give-up.
const LANDED_LATE: &str = "a charge landed late";

/// What became of a charge the provider holds for a failed payment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum TakenBack {
    /// Recorded on the payment and refunded by the system: the refund and its status now
    /// (`processing`: the outcome is unknown, and the reconciler's refund pass finishes it).
    Refunded { refund_id: RefundId, status: RefundStatus },
    /// An authorization, voided.
    Voided { charge_id: String },
    /// Recorded before, and its refund started then, by whoever recorded it.
    AlreadyRecorded,
    /// Recorded, but its refund could not start (`reason`): it needs a person.
    Refused { reason: String },
    /// Not now: it holds no money (yet), or the provider could not be asked; `reason` says
    /// which. The watch looks again.
    Left { reason: String },
}

/// Takes back a charge the provider holds for `payment`, which has failed: a captured charge is
/// recorded on the payment and refunded by the system through the refund engine, an
/// authorization is voided; anything else is left for the watch. `why` opens the audit row.
/// The reconciler's watch and an operator's forced failure (`operations::operator`) both come
/// here, and racing each other still take back once: the recording is guarded, the void
/// idempotent on its key.
pub async fn take_back(
    engine: &Engine,
    config: &ReconcilerConfig,
    payment: &Payment,
    charge: &Charge,
    why: &str,
) -> Result<TakenBack, EngineError> {
    match charge.status {
        ChargeStatus::Succeeded => refund_late_charge(engine, config, payment, charge, why).await,
        ChargeStatus::RequiresCapture => {
            let request = CancelRequest {
                charge_id: charge.id.clone(),
                downstream_key: format!("orderpay_late_void_{}", payment.id),
                request_id: None,
            };
            match engine.provider.cancel_charge(&request).await {
                Ok(_) => {
                    tracing::warn!(payment_id = %payment.id, charge_id = %charge.id, "voided an authorization held for a failed payment");
                    crate::telemetry::metrics::late_charge("voided");
                    let mut conn = engine.pool.get().await?;
                    payments::watch_late_again(&mut conn, payment, None).await?;
                    Ok(TakenBack::Voided { charge_id: charge.id.clone() })
                }
                Err(error) => {
                    tracing::warn!(payment_id = %payment.id, error = %error, "could not void an authorization held for a failed payment");
                    Ok(TakenBack::Left { reason: format!("the void failed: {error}") })
                }
            }
        }
        ref status => {
            Ok(TakenBack::Left { reason: format!("the charge is {} and holds no money", status.as_str()) })
        }
    }
}

async fn schedule(
    engine: &Engine,
    config: &ReconcilerConfig,
    payment: &Payment,
    watch_until: chrono::DateTime<Utc>,
) -> Result<(), EngineError> {
    let next = after(Utc::now(), config.backoff(payment.attempts));
    let mut conn = engine.pool.get().await?;
    payments::watch_late_again(&mut conn, payment, (next <= watch_until).then_some(next)).await?;
    Ok(())
}

/// Records the charge on the failed payment and starts the system's refund of it, in one
/// transaction; then drives the refund (a crash after the commit leaves it to the reconciler's
/// refund pass).
async fn refund_late_charge(
    engine: &Engine,
    config: &ReconcilerConfig,
    payment: &Payment,
    charge: &Charge,
    why: &str,
) -> Result<TakenBack, EngineError> {
    use diesel_async::AsyncConnection;
    let now = Utc::now().trunc_subsecs(6);
    let refund_id = RefundId::generate();
    let lease = Lease { id: LeaseId::generate(), until: after(now, config.claim_for) };
    let mut conn = engine.pool.get().await?;
    let started = conn
        .transaction::<_, EngineError, _>(async |conn| {
            let detail = format!("{why} ({}, {}); refunding it", charge.id, charge.amount_captured);
            if !payments::record_late_charge(conn, payment, &charge.id, charge.amount_captured, &detail, now)
                .await?
            {
                return Ok(None);
            }
            let statement = StartRefund {
                claim: ClaimParameters::new(
                    payment.account_id,
                    None,
                    (ResourceKind::Refund, refund_id.as_uuid()),
                    None,
                    now,
                    std::time::Duration::ZERO,
                ),
                payment_id: payment.id,
                amount: None,
                reason: None,
                lease_until: lease.until,
                lease_id: lease.id,
                payment_must_be: PaymentStatus::Failed,
            };
            Ok(Some(refunds::start(conn, statement).await?))
        })
        .await?;
    let Some(started) = started else { return Ok(TakenBack::AlreadyRecorded) };
    if started.outcome != StartOutcome::Started {
        tracing::error!(payment_id = %payment.id, outcome = %started.outcome,
            "a late charge could not be refunded; it needs a person");
        let reason = format!("the refund could not start ({}); it needs a person", started.outcome);
        return Ok(TakenBack::Refused { reason });
    }
    tracing::warn!(payment_id = %payment.id, charge_id = %charge.id, amount = %charge.amount_captured,
        why, "refunding a charge the provider holds for a failed payment");
    crate::telemetry::metrics::late_charge("refunded");
    let Some(held) = <Refunds as Kind>::load(&mut conn, (payment.account_id, refund_id.as_uuid())).await?
    else {
        return Err(EngineError::Vanished(format!("refund {refund_id}")));
    };
    drop(conn);
    let (finding, _) = drive::<Refunds>(engine, &held, lease.id, DriveMode::FirstCall, None).await;
    match finding {
        Finding::Final(outcome) => {
            Refunds::settle(&engine.pool, &held, outcome, Actor::System).await?;
        }
        Finding::Unknown { reason } => leave(engine, &held, lease.id, &reason).await?,
        Finding::NotReceived => {
            leave(engine, &held, lease.id, "the provider has not received the refund").await?
        }
    }
    let mut conn = engine.pool.get().await?;
    let status = refunds::find(&mut conn, payment.account_id, refund_id)
        .await?
        .map_or(RefundStatus::Processing, |refund| refund.status);
    Ok(TakenBack::Refunded { refund_id, status })
}

/// Leaves the system's refund for the reconciler's refund pass.
async fn leave(engine: &Engine, held: &Held, lease: LeaseId, reason: &str) -> Result<(), EngineError> {
    let mut conn = engine.pool.get().await?;
    let next_check = after(Utc::now(), engine.timing.recheck_after);
    leases::release(&mut conn, Refunds::TABLE, Refunds::id(held), lease, next_check, reason, Utc::now())
        .await?;
    Ok(())
}
