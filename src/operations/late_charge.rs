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
//! [`take_back`], at once when the operator forced the failure over it. So is a payment that
//! failed by a decline when the provider's webhook reports a charge for it anyway: the watch's
//! lookup, not the webhook, is what records it.
//!
//! Once the charge is recorded, the watch stops looking for it; what is left is to see it
//! refunded ([`follow_up`]): a system refund that fails for certain (declined), or that was given
//! up on and then found absent by the late-refund watch (`operations::late_refund`, which runs
//! first), brings the payment back here, and another system refund starts, with the reconciler's
//! backoff between them and at most `ORDERPAY_RECONCILE_MAX_ATTEMPTS` of them. Two system
//! refunds are never both alive: one starts only while the payment reserves no refund and the
//! previous one is known not carried out. A late charge left unrefunded after that waits for a
//! person (`orderpay payments list --stuck`, the `orderpay_late_charges_unrefunded` gauge).

use chrono::{SubsecRound, Utc};

use super::leases::Lease;
use super::reconciler::{PassReport, ReconcilerConfig};
use super::refund::{Held, Refunds};
use super::{Actor, DriveMode, Engine, EngineError, Finding, Kind, drive, leases};
use crate::clock::after;
use crate::idempotency::store::{ClaimParameters, ResourceKind};
use crate::ids::{LeaseId, RefundId};
use crate::orders::repository as orders;
use crate::payments::repository as payments;
use crate::payments::watches;
use crate::payments::{GAVE_UP_CODE, Payment, PaymentStatus};
use crate::provider::{CancelRequest, Charge, ChargeStatus, ProviderError};
use crate::refunds::RefundStatus;
use crate::refunds::repository::{self as refunds, StartOutcome, StartRefund};

/// Looks for late charges of the given-up payments that are due.
pub async fn watch_due(engine: &Engine, config: &ReconcilerConfig) -> Result<PassReport, EngineError> {
    let now = Utc::now();
    let due = {
        let mut conn = engine.pool.get().await?;
        watches::watch_late(&mut conn, now, config.batch_size, after(now, config.claim_for)).await?
    };
    let mut report = PassReport { claimed: due.len(), ..PassReport::default() };
    for watched in due {
        let (payment, watch_until, late_charge) = match watched {
            Ok(watched) => watched,
            Err(error) => {
                report.errors += 1;
                tracing::error!(error = %error, "a watched payment cannot be read; left for a later pass");
                continue;
            }
        };
        let looked = match late_charge {
            // The charge is recorded: see it refunded, never look for it again.
            Some(late_charge) => follow_up(engine, config, &payment, late_charge).await,
            None => look(engine, config, &payment, watch_until).await,
        };
        match looked {
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
    let found = engine.provider.find_charge(&payment.charge_lookup(), None).await;
    // An authorization still holds the customer's money until its void is confirmed: a void
    // whose answer was lost is looked at again, past the watch's end if need be.
    let holding = matches!(&found, Ok(Some(charge)) if charge.status == ChargeStatus::RequiresCapture);
    let taken = match found {
        Ok(Some(charge)) => take_back(engine, config, payment, &charge, LANDED_LATE).await?,
        // Nothing (yet): keep looking until the watch ends.
        Ok(None) => TakenBack::Left { reason: "no charge at the provider".to_owned() },
        // The provider refused our credentials: it said nothing, so the watch is not over
        // when its time is; it goes on, past its end if need be, until the provider answers.
        Err(ProviderError::Unauthorized { .. }) => {
            let next = after(Utc::now(), config.backoff_cap);
            let mut conn = engine.pool.get().await?;
            watches::watch_late_again(&mut conn, payment, Some(next)).await?;
            return Ok(false);
        }
        Err(error) => TakenBack::Left { reason: error.to_string() },
    };
    if let TakenBack::Left { .. } = taken {
        schedule(engine, config, payment, (!holding).then_some(watch_until)).await?;
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
                    watches::watch_late_again(&mut conn, payment, None).await?;
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

/// The watch's next look, after the backoff: none once it would fall past `watch_until` (no end:
/// the watch goes on).
async fn schedule(
    engine: &Engine,
    config: &ReconcilerConfig,
    payment: &Payment,
    watch_until: Option<chrono::DateTime<Utc>>,
) -> Result<(), EngineError> {
    let next = after(Utc::now(), config.backoff(payment.attempts));
    let mut conn = engine.pool.get().await?;
    let within = watch_until.is_none_or(|until| next <= until);
    watches::watch_late_again(&mut conn, payment, within.then_some(next)).await?;
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
    let lease = Lease { id: LeaseId::generate(), until: after(now, config.claim_for) };
    let mut conn = engine.pool.get().await?;
    let started = conn
        .transaction::<_, EngineError, _>(async |conn| {
            let detail = format!("{why} ({}, {}); refunding it", charge.id, charge.amount_captured);
            if !watches::record_late_charge(conn, payment, &charge.id, charge.amount_captured, &detail, now)
                .await?
            {
                return Ok(None);
            }
            Ok(Some(start_system_refund(conn, payment, lease, now).await?))
        })
        .await?;
    drop(conn);
    let Some(started) = started else { return Ok(TakenBack::AlreadyRecorded) };
    tracing::warn!(payment_id = %payment.id, charge_id = %charge.id, amount = %charge.amount_captured,
        why, "refunding a charge the provider holds for a failed payment");
    drive_system_refund(engine, payment, started, lease).await
}

/// Starts a system refund of all that is left of a failed payment's late charge (`start_refund.sql`
/// with no key), inside the caller's transaction. `Err(reason)` when it could not start.
async fn start_system_refund(
    conn: &mut diesel_async::AsyncPgConnection,
    payment: &Payment,
    lease: Lease,
    now: chrono::DateTime<Utc>,
) -> Result<Result<RefundId, String>, EngineError> {
    let refund_id = RefundId::generate();
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
    let started = refunds::start(conn, statement).await?;
    if started.outcome != StartOutcome::Started {
        return Ok(Err(format!("the refund could not start ({}); it needs a person", started.outcome)));
    }
    Ok(Ok(refund_id))
}

/// Sends a system refund that just started and records what the provider said (or leaves it for
/// the reconciler's refund pass).
async fn drive_system_refund(
    engine: &Engine,
    payment: &Payment,
    started: Result<RefundId, String>,
    lease: Lease,
) -> Result<TakenBack, EngineError> {
    let refund_id = match started {
        Ok(refund_id) => refund_id,
        Err(reason) => {
            tracing::error!(payment_id = %payment.id, %reason, "a late charge could not be refunded");
            return Ok(TakenBack::Refused { reason });
        }
    };
    let mut conn = engine.pool.get().await?;
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
        // A key conflict is held for a person by the reconciler's next look at it.
        Finding::Unknown { reason } | Finding::Unsent { reason } | Finding::KeyConflict { reason } => {
            leave(engine, &held, lease.id, &reason).await?
        }
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

/// What the follow-up of a recorded late charge decided, under the payment's lock.
enum Next {
    /// Nothing left to refund: the watch is over.
    Done,
    /// Not now; looked at again at this time, or (`None`) when a system refund settles or the
    /// late-refund watch concludes on one.
    Wait(Option<chrono::DateTime<Utc>>, &'static str),
    /// The system refunds ran out: a person decides.
    NeedsPerson(i64),
    /// Another system refund started.
    Started(Result<RefundId, String>),
}

/// Sees a recorded late charge refunded: starts another system refund when the previous one is
/// certainly not carried out, with backoff and up to the attempt limit (see the module doc).
/// Returns whether it started one.
async fn follow_up(
    engine: &Engine,
    config: &ReconcilerConfig,
    payment: &Payment,
    late_charge: rust_decimal::Decimal,
) -> Result<bool, EngineError> {
    use diesel_async::AsyncConnection;
    let now = Utc::now().trunc_subsecs(6);
    let lease = Lease { id: LeaseId::generate(), until: after(now, config.claim_for) };
    let mut conn = engine.pool.get().await?;
    let next = conn
        .transaction::<_, EngineError, _>(async |conn| {
            let vanished = || EngineError::Vanished(format!("payment {}", payment.id));
            orders::lock(conn, payment.account_id, payment.order_id).await?.ok_or_else(vanished)?;
            let money =
                payments::lock_amounts(conn, payment.account_id, payment.id).await?.ok_or_else(vanished)?;
            let next = if money.amount_refunding > rust_decimal::Decimal::ZERO {
                Next::Wait(None, "a system refund is in flight")
            } else if late_charge - money.amount_refunded <= rust_decimal::Decimal::ZERO {
                Next::Done
            } else {
                let system = refunds::system_refunds(conn, payment.account_id, payment.id).await?;
                let latest = system.latest.as_ref();
                let unconfirmed = latest.is_some_and(|latest| {
                    latest.status == RefundStatus::Failed
                        && latest.failure_code.as_deref() == Some(GAVE_UP_CODE)
                        && latest.absent_since.is_none()
                });
                let due = latest.map(|latest| after(latest.updated_at, config.backoff(system.count as i32)));
                if unconfirmed {
                    Next::Wait(None, "the last system refund was given up on and may still be carried out")
                } else if system.count >= i64::from(config.max_attempts) {
                    Next::NeedsPerson(system.count)
                } else if let Some(due) = due.filter(|due| *due > now) {
                    Next::Wait(Some(due), "backing off between system refunds")
                } else {
                    Next::Started(start_system_refund(conn, payment, lease, now).await?)
                }
            };
            let next_check = match next {
                Next::Wait(at, _) => at,
                _ => None,
            };
            watches::watch_late_again(conn, payment, next_check).await?;
            Ok(next)
        })
        .await?;
    drop(conn);
    match next {
        Next::Done => Ok(false),
        Next::Wait(_, why) => {
            tracing::info!(payment_id = %payment.id, why, "a late charge's refund waits");
            Ok(false)
        }
        Next::NeedsPerson(refunds) => {
            tracing::error!(payment_id = %payment.id, refunds,
                "a late charge is still not refunded after the system's last refund; it needs a person");
            Ok(false)
        }
        Next::Started(started) => {
            tracing::warn!(payment_id = %payment.id, "refunding a late charge again: the last refund was not carried out");
            drive_system_refund(engine, payment, started, lease).await?;
            Ok(true)
        }
    }
}

/// Leaves the system's refund for the reconciler's refund pass.
async fn leave(engine: &Engine, held: &Held, lease: LeaseId, reason: &str) -> Result<(), EngineError> {
    let mut conn = engine.pool.get().await?;
    let next_check = after(Utc::now(), engine.timing.recheck_after);
    leases::release(&mut conn, Refunds::TABLE, Refunds::id(held), lease, next_check, reason, Utc::now())
        .await?;
    Ok(())
}
