//! `orderpay payments resolve`: an operator settles by hand a charge or authorization in flight,
//! after the provider's live view agrees (or `--force`), under a lease, through the charge's own
//! settle statement.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::views::{PaymentView, ProviderView};
use super::{Lookup, inspect_one, look_up};
use crate::clock::after;
use crate::ids::{LeaseId, OperationId, PaymentId};
use crate::operations::charge::{ChargeOutcome, Charges, Resolution, ResolvedTo};
use crate::operations::late_charge::{self, TakenBack};
use crate::operations::leases::{self, Lease, LeaseTarget};
use crate::operations::reconciler::ReconcilerConfig;
use crate::operations::{Actor, Engine, EngineError, Kind, SendQuiet};
use crate::orders::OrderStatus;
use crate::payments::authorization::Action;
use crate::payments::inspect::Inspected;
use crate::payments::{CaptureMethod, Payment, PaymentStatus};
use crate::provider::{Charge, ChargeStatus};

/// What an operator settles a payment as (`--as`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Charged: `succeeded`, or `requires_capture` for a manual-capture payment the provider
    /// holds an authorization for.
    Succeeded,
    /// Not charged: `failed`; money the provider holds for it is taken back.
    Failed,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Succeeded => "succeeded",
            Target::Failed => "failed",
        }
    }
}

/// A resolution asked for (`orderpay payments resolve`).
#[derive(Debug, Clone)]
pub struct Resolve {
    pub payment_id: PaymentId,
    pub to: Target,
    /// Why, for the audit trail.
    pub reason: String,
    /// Apply it even though the provider's view does not agree.
    pub force: bool,
}

/// The longest reason the audit trail takes.
pub const MAX_REASON_CHARS: usize = 500;

/// Why a resolution was not applied. Nothing changed in any of these cases but `Engine` (the
/// database failed midway), where the resolution's lease may stay until it runs out.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the reason must be 1 to {MAX_REASON_CHARS} characters (it goes to the audit trail)")]
    Reason,
    #[error("no payment {0}")]
    NotFound(PaymentId),
    #[error("payment {id} is {status}: its outcome is known, there is nothing to resolve")]
    NotInFlight { id: PaymentId, status: PaymentStatus },
    #[error(
        "payment {id} is processing because its {kind} {operation} is in flight, not its charge; \
         resolve settles only a charge or an authorization in flight"
    )]
    ActionInFlight { id: PaymentId, kind: Action, operation: OperationId },
    #[error(
        "payment {id} is being driven (by a request, a retry or the reconciler) until {until}; \
         try again after that"
    )]
    Held { id: PaymentId, until: DateTime<Utc> },
    #[error(
        "the provider does not agree with --as {to}: {objection}. Nothing changed. Check with the \
         provider; --force applies it anyway{consequence}"
    )]
    Disagrees { to: &'static str, objection: String, consequence: &'static str },
    #[error("payment {id} was settled meanwhile (as {status}); nothing changed")]
    SettledMeanwhile { id: PaymentId, status: PaymentStatus },
    #[error(
        "payment {0}'s last send to the provider could still land (it is not yet quiet for the \
         provider timeout and the give-up margin); nothing changed. Try again later, or --force"
    )]
    SendMayLand(PaymentId),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<diesel::result::Error> for Refusal {
    fn from(error: diesel::result::Error) -> Self {
        Refusal::Engine(error.into())
    }
}

impl From<crate::db::PoolRunError> for Refusal {
    fn from(error: crate::db::PoolRunError) -> Self {
        Refusal::Engine(error.into())
    }
}

/// What a resolution did.
#[derive(Debug, Clone, Serialize)]
pub struct Resolved {
    /// The payment after it.
    pub payment: PaymentView,
    pub order_status: Option<OrderStatus>,
    /// The provider's view the resolution was judged on (taken under the lease).
    pub provider: ProviderView,
    /// What the provider said that `--force` overrode.
    pub forced_over: Option<String>,
    /// What became of money the provider holds for a payment forced to `failed`.
    pub taken_back: Option<TakenBack>,
}

/// The provider's view judged against a resolution.
struct Judged {
    to: ResolvedTo,
    charge_id: Option<String>,
    /// Why the view does not agree, if it does not.
    objection: Option<String>,
    /// Money the provider holds that a failed payment must give back.
    take_back: Option<Charge>,
}

/// How the provider's view bears on settling `payment` as `to`. `succeeded` needs a captured
/// charge (or, for a manual-capture payment, an authorization); `failed` needs a view in which
/// the provider holds no money: no charge, or a declined or canceled one. Anything else (money
/// held against `failed`, a pending charge, no answer) is an objection `--force` overrides.
fn judge(payment: &Payment, lookup: &Lookup, to: Target, config: &ReconcilerConfig) -> Judged {
    let charge = lookup.as_ref().ok().and_then(Option::as_ref);
    let mut judged = Judged {
        to: ResolvedTo::Captured,
        charge_id: charge.map(|charge| charge.id.clone()),
        objection: None,
        take_back: None,
    };
    let said = |charge: &Charge| format!("its charge {} is {}", charge.id, charge.status.as_str());
    match (to, lookup) {
        (_, Err(error)) => judged.objection = Some(format!("the provider cannot be asked ({error})")),
        (Target::Succeeded, Ok(None)) => {
            judged.objection = Some("the provider has no charge for this payment".to_owned())
        }
        (Target::Succeeded, Ok(Some(charge))) => {
            match crate::operations::charge::outcome_of(payment, Ok(charge.clone())) {
                crate::operations::Finding::Final(ChargeOutcome::Captured { .. }) => {}
                crate::operations::Finding::Final(ChargeOutcome::Authorized { expires_at, .. }) => {
                    judged.to = ResolvedTo::Authorized { expires_at }
                }
                _ => judged.objection = Some(said(charge)),
            }
        }
        (Target::Failed, Ok(None)) => {}
        (Target::Failed, Ok(Some(charge))) => match charge.status {
            ChargeStatus::Declined { .. } | ChargeStatus::Canceled { .. } => {}
            ChargeStatus::Succeeded | ChargeStatus::RequiresCapture => {
                judged.objection = Some(format!("{} and holds {}", said(charge), charge.amount));
                judged.take_back = Some(charge.clone());
            }
            ChargeStatus::Pending => {
                judged.objection = Some(format!("{} and may still take money", said(charge)))
            }
        },
    }
    if to == Target::Failed {
        // As after a give-up, a charge landing later is refunded by the late-charge watch.
        judged.to = ResolvedTo::Failed {
            first_look: config.claim_for,
            late_watch: config.late_charge_watch,
            quiet: None,
        };
    } else if judged.objection.is_some() && payment.capture_method == CaptureMethod::Manual {
        judged.to =
            ResolvedTo::Authorized { expires_at: charge.and_then(|charge| charge.authorization_expires_at) };
    }
    judged
}

/// Why the audit trail says a charge is taken back after an operator's forced failure.
const FORCED_FAILED: &str = "an operator failed the payment over a charge the provider holds";

/// Settles payment `request.payment_id`, whose charge or authorization is in flight, as
/// `request.to` by hand.
///
/// The provider's view is judged first, without a lease, so that a refusal writes nothing. Then
/// the payment is leased (compare-and-set, as a retry takes one over: refused while a live
/// driver holds it), so that no retry or reconciler drives it meanwhile; the view is taken and
/// judged again under the lease, and the outcome applied through the charge's settle statement
/// with actor `operator` and the reason as the audit row's detail, which moves the key's stored
/// answer, the order and the events with it. A webhook takes no lease: if one settles the payment
/// first, the guarded settle applies nothing and this says so. A forced failure over money the
/// provider holds takes it back at once (a system refund, or a void); a failed payment is watched
/// for a charge landing later, as after a give-up.
pub async fn resolve(
    engine: &Engine,
    config: &ReconcilerConfig,
    request: &Resolve,
) -> Result<Resolved, Refusal> {
    let reason = request.reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        return Err(Refusal::Reason);
    }
    let before = charge_in_flight(engine, request.payment_id).await?;
    let first = judge(&before, &look_up(engine, &before).await, request.to, config);
    refuse_unless_forced(request, &first)?;

    let lease = Lease { id: LeaseId::generate(), until: after(Utc::now(), config.claim_for) };
    let (payment, leased_at) = take_lease(engine, &before, lease).await?;
    let lookup = look_up(engine, &payment).await;
    let mut judged = judge(&payment, &lookup, request.to, config);
    if let ResolvedTo::Failed { quiet, .. } = &mut judged.to
        && !request.force
    {
        // A send that could still land holds the failure back, as it holds a give-up back.
        *quiet = Some(SendQuiet::new(leased_at, config.quiet_before_give_up, lease.id));
    }
    if let Err(refusal) = refuse_unless_forced(request, &judged) {
        release(engine, &before, lease.id).await?;
        return Err(refusal);
    }
    let outcome = ChargeOutcome::Resolved(Resolution {
        to: judged.to,
        charge_id: judged.charge_id.clone(),
        reason: reason.to_owned(),
    });
    let recorded = Charges::settle(&engine.pool, &payment, outcome, Actor::Operator).await?;
    let mut conn = engine.pool.get().await?;
    let settled = inspect_one(&mut conn, request.payment_id)
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("payment {}", request.payment_id)))?;
    drop(conn);
    match recorded {
        Some(recorded) if recorded.applied => {}
        // A webhook settled it first (it takes no lease): the guarded settle applied nothing.
        Some(_) => {
            return Err(Refusal::SettledMeanwhile { id: request.payment_id, status: settled.payment.status });
        }
        // Held back: a send may still land at the provider (only a failure without --force is
        // guarded, as a give-up is). Nothing changed.
        None => {
            release(engine, &before, lease.id).await?;
            return Err(Refusal::SendMayLand(request.payment_id));
        }
    }
    tracing::warn!(payment_id = %request.payment_id, status = %settled.payment.status, reason,
        forced = judged.objection.is_some(), "an operator resolved a payment");
    let taken_back = match &judged.take_back {
        Some(charge) => Some(
            late_charge::take_back(engine, config, &settled.payment, charge, FORCED_FAILED)
                .await
                .unwrap_or_else(|error| TakenBack::Left { reason: error.to_string() }),
        ),
        None => None,
    };
    let mut conn = engine.pool.get().await?;
    let settled = inspect_one(&mut conn, request.payment_id).await?.unwrap_or(settled);
    let order =
        crate::orders::repository::find(&mut conn, settled.payment.account_id, settled.payment.order_id)
            .await?;
    Ok(Resolved {
        payment: PaymentView::new(settled, config.max_attempts, Utc::now()),
        order_status: order.map(|order| order.status),
        provider: ProviderView::new(&payment, &lookup),
        forced_over: judged.objection,
        taken_back,
    })
}

/// Lets go of a resolution's lease on a payment left in flight, for the next check the
/// reconciler had planned.
async fn release(engine: &Engine, before: &Payment, lease: LeaseId) -> Result<(), Refusal> {
    let mut conn = engine.pool.get().await?;
    let next_check = before.next_check_at.unwrap_or_else(Utc::now);
    let last_error = before.last_error.as_deref().unwrap_or_default();
    leases::release(
        &mut conn,
        Charges::TABLE,
        Charges::id(before),
        lease,
        next_check,
        last_error,
        Utc::now(),
    )
    .await?;
    Ok(())
}

fn refuse_unless_forced(request: &Resolve, judged: &Judged) -> Result<(), Refusal> {
    match &judged.objection {
        Some(objection) if !request.force => Err(Refusal::Disagrees {
            to: request.to.as_str(),
            objection: objection.clone(),
            consequence: if judged.take_back.is_some() { " and takes that money back" } else { "" },
        }),
        _ => Ok(()),
    }
}

/// Payment `id`, if its own charge or authorization is in flight; else why not.
async fn charge_in_flight(engine: &Engine, id: PaymentId) -> Result<Payment, Refusal> {
    let mut conn = engine.pool.get().await?;
    let Some(found) = inspect_one(&mut conn, id).await? else {
        return Err(Refusal::NotFound(id));
    };
    match found {
        Inspected { payment, charge_in_flight: true, .. } => Ok(payment),
        Inspected { action: Some(action), .. } => {
            Err(Refusal::ActionInFlight { id, kind: action.kind, operation: action.id })
        }
        Inspected { payment, .. } => Err(Refusal::NotInFlight { id, status: payment.status }),
    }
}

/// Leases `payment` to the resolution, as a retry takes an abandoned operation over; returns it
/// as it is now.
/// Takes `payment`'s lease: the payment as it is now, and when (the database's clock) the lease
/// was taken.
async fn take_lease(
    engine: &Engine,
    payment: &Payment,
    lease: Lease,
) -> Result<(Payment, DateTime<Utc>), Refusal> {
    let mut conn = engine.pool.get().await?;
    let (account_id, id) = Charges::id(payment);
    let taken =
        leases::lease(&mut conn, Charges::TABLE, LeaseTarget::One(account_id, id), lease, Utc::now()).await?;
    let current = Charges::load(&mut conn, (account_id, id)).await?.ok_or(Refusal::NotFound(payment.id))?;
    if taken.is_empty() {
        drop(conn);
        // Settled meanwhile, or held by a live driver.
        charge_in_flight(engine, payment.id).await.map_err(|refusal| match refusal {
            Refusal::NotInFlight { id, status } => Refusal::SettledMeanwhile { id, status },
            other => other,
        })?;
        let until = current.lease.map_or_else(Utc::now, |lease| lease.until);
        return Err(Refusal::Held { id: payment.id, until });
    }
    let leased_at = taken.first().map_or_else(Utc::now, |leased| leased.leased_at);
    Ok((current, leased_at))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::payments::in_flight_for_tests as payment;
    use crate::provider::ProviderError;

    fn config() -> ReconcilerConfig {
        ReconcilerConfig {
            interval: Duration::from_secs(5),
            batch_size: 10,
            max_attempts: 3,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
            claim_for: Duration::from_secs(15),
            quiet_before_give_up: Duration::from_secs(10),
            late_charge_watch: Duration::from_secs(86_400),
            late_refund_watch: Duration::from_secs(86_400),
        }
    }

    fn charge(status: ChargeStatus) -> Lookup {
        Ok(Some(crate::provider::charge_for_tests(status)))
    }

    fn declined() -> ChargeStatus {
        ChargeStatus::Declined { code: "insufficient_funds".into(), message: "no".into() }
    }

    #[test]
    fn succeeded_needs_the_provider_to_hold_the_money() {
        let (automatic, manual) = (payment(CaptureMethod::Automatic), payment(CaptureMethod::Manual));
        let judged = judge(&automatic, &charge(ChargeStatus::Succeeded), Target::Succeeded, &config());
        assert_eq!(
            (judged.to, judged.objection, judged.charge_id.as_deref()),
            (ResolvedTo::Captured, None, Some("ch_1"))
        );
        let judged = judge(&manual, &charge(ChargeStatus::RequiresCapture), Target::Succeeded, &config());
        assert_eq!((judged.to, judged.objection), (ResolvedTo::Authorized { expires_at: None }, None));
        for lookup in
            [Ok(None), charge(declined()), charge(ChargeStatus::Pending), Err(ProviderError::Timeout)]
        {
            let judged = judge(&automatic, &lookup, Target::Succeeded, &config());
            assert!(judged.objection.is_some(), "{lookup:?}");
            assert_eq!(judged.to, ResolvedTo::Captured, "forced, an automatic payment is captured");
            assert!(judged.take_back.is_none());
            let judged = judge(&manual, &lookup, Target::Succeeded, &config());
            assert_eq!(
                judged.to,
                ResolvedTo::Authorized { expires_at: None },
                "forced, a manual one is authorized"
            );
        }
    }

    #[test]
    fn failed_needs_the_provider_to_hold_no_money_and_forced_takes_it_back() {
        let automatic = payment(CaptureMethod::Automatic);
        let watched = ResolvedTo::Failed {
            first_look: config().claim_for,
            late_watch: config().late_charge_watch,
            quiet: None,
        };
        for lookup in
            [Ok(None), charge(declined()), charge(ChargeStatus::Canceled { reason: "requested".into() })]
        {
            let judged = judge(&automatic, &lookup, Target::Failed, &config());
            assert_eq!((judged.to, judged.objection), (watched, None), "{lookup:?}");
        }
        for held in [ChargeStatus::Succeeded, ChargeStatus::RequiresCapture] {
            let judged = judge(&automatic, &charge(held.clone()), Target::Failed, &config());
            assert!(judged.objection.is_some_and(|objection| objection.contains("holds 10")), "{held:?}");
            assert_eq!(judged.take_back.map(|charge| charge.status), Some(held));
        }
        for unsure in [charge(ChargeStatus::Pending), Err(ProviderError::ServerError(503))] {
            let judged = judge(&automatic, &unsure, Target::Failed, &config());
            assert!(judged.objection.is_some() && judged.take_back.is_none(), "{unsure:?}");
            assert_eq!(judged.to, watched, "the late-charge watch looks for it later");
        }
    }
}
