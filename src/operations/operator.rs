//! An operator's hand on payments (`orderpay payments list | show | resolve`): what those
//! commands read, and the one change they make, so that the CLI is only flags and printing and a
//! resolution goes through the engine like every other driver's outcome.
//!
//! - [`list`] and [`show`] render a payment as `GET /payments/{id}` does, with what an operator
//!   needs beside it ([`Operating`]): its account, what is in flight on it, the reconciler's
//!   attempts and last error, a live lease, and whether it is [stuck](Operating::stuck). `show`
//!   adds its refunds, captures and voids, the audit trail, and the provider's view from a live
//!   lookup by the downstream key.
//! - [`resolve`] settles by hand a payment whose charge (or authorization) is in flight, after
//!   the provider's live view agrees (or `--force`), under a lease, through the charge's own
//!   settle statement with actor `operator`. A forced failure over money the provider holds takes
//!   the money back as the late-charge path does ([`late_charge::take_back`]).
//!
//! **Stuck** is the reconciler's own notion: an operation in flight (a payment's charge or
//! authorization, or a capture or void on it) that has had `ORDERPAY_RECONCILE_MAX_ATTEMPTS`
//! checks or more. Its last check found the outcome still unknown (one final or never received
//! would have settled it or been given up on), so every later check only looks, at the backoff
//! cap, and counts it as `stuck` in `orderpay_reconciler_payments_total`: it stays `processing`
//! until the provider settles it or an operator resolves it. A failed payment is stuck too when
//! a charge landed for it and the system's refunds of it ran out (`late_charge.needs_person`):
//! the customer holds a charge for a payment we told them failed, and only a person can act.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::charge::{ChargeOutcome, Charges, Resolution, ResolvedTo};
use super::late_charge::{self, TakenBack};
use super::leases::{self, Lease, LeaseTarget};
use super::reconciler::ReconcilerConfig;
use super::{Actor, Engine, EngineError, Kind, SendQuiet};
use crate::clock::after;
use crate::ids::{AccountId, LeaseId, OperationId, PaymentId};
use crate::money::Amount;
use crate::orders::OrderStatus;
use crate::payments::authorization::{self, Action, ActionStatus, PaymentOperation};
use crate::payments::repository::{self as payments, Inspect, Inspected, Transition};
use crate::payments::representation::PaymentResource;
use crate::payments::{CaptureMethod, Payment, PaymentStatus};
use crate::provider::{Charge, ChargeStatus, ProviderError};
use crate::refunds::Refund;
use crate::refunds::representation::RefundResource;

/// What is in flight on a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    Charge,
    Authorization,
    Capture,
    Void,
}

impl InFlight {
    pub fn as_str(self) -> &'static str {
        match self {
            InFlight::Charge => "charge",
            InFlight::Authorization => "authorization",
            InFlight::Capture => "capture",
            InFlight::Void => "void",
        }
    }
}

/// What an operator needs beside the payment as the API renders it.
#[derive(Debug, Clone, Serialize)]
pub struct Operating {
    pub account_id: AccountId,
    /// The client's key that created the payment (for `orderpay keys show`).
    pub idempotency_key: Option<String>,
    /// What is in flight on it; `None` when nothing is.
    pub in_flight: Option<InFlight>,
    /// Checks the reconciler made of what is in flight (else of the charge, when it was in
    /// flight).
    pub attempts: i32,
    /// When the reconciler looks next.
    pub next_check_at: Option<DateTime<Utc>>,
    /// What the last check saw.
    pub last_error: Option<String>,
    /// Until when a live driver (a request, a retry, the reconciler) holds it.
    pub lease_until: Option<DateTime<Utc>>,
    /// Past the reconciler's last attempt with the outcome still unknown, or a late charge left
    /// unrefunded (see the module doc).
    pub stuck: bool,
    /// A charge that landed after the payment failed, and how far its refund got.
    pub late_charge: Option<LateChargeView>,
}

/// A late charge as an operator sees it, in the payment's currency.
#[derive(Debug, Clone, Serialize)]
pub struct LateChargeView {
    pub amount: String,
    pub refunded: String,
    /// Reserved by a system refund in flight.
    pub refunding: String,
    /// What the customer still paid for a payment we told them failed.
    pub unrefunded: String,
    /// Nothing will try again: the system's refunds ran out (or could not start). A person
    /// refunds it at the provider, or decides otherwise.
    pub needs_person: bool,
}

impl LateChargeView {
    fn new(payment: &Payment, late: &payments::LateCharge) -> Self {
        let money = |value: rust_decimal::Decimal| {
            Amount::from_decimal(value, payment.currency())
                .map_or_else(|_| value.to_string(), |a| a.to_string())
        };
        LateChargeView {
            amount: money(late.amount),
            refunded: money(late.refunded),
            refunding: money(late.refunding),
            unrefunded: money(late.amount - late.refunded),
            needs_person: late.needs_person,
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        if self.unrefunded.parse::<rust_decimal::Decimal>().is_ok_and(|left| left.is_zero()) {
            return format!("{} landed after the payment failed; refunded by the system", self.amount);
        }
        let state = if self.needs_person {
            "the system's refunds ran out: it needs a person (refund it at the provider)"
        } else {
            "the system is refunding it"
        };
        format!("{} landed after the payment failed; {} not refunded: {state}", self.amount, self.unrefunded)
    }
}

/// A resource as the API renders it and what an operator needs beside it, in one JSON object.
#[derive(Serialize)]
struct Beside<'a, R: Serialize, O: Serialize> {
    #[serde(flatten)]
    resource: R,
    #[serde(flatten)]
    operating: &'a O,
}

/// A payment as an operator sees it.
#[derive(Debug, Clone)]
pub struct PaymentView {
    pub payment: Payment,
    pub operating: Operating,
}

impl Serialize for PaymentView {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Beside { resource: PaymentResource::from(&self.payment), operating: &self.operating }
            .serialize(serializer)
    }
}

impl PaymentView {
    fn new(inspected: Inspected, max_attempts: i32, now: DateTime<Utc>) -> Self {
        let Inspected { payment, charge_in_flight, action, late_charge } = inspected;
        let held = |until: Option<DateTime<Utc>>| until.filter(|until| *until > now);
        let mut operating = Operating {
            account_id: payment.account_id,
            idempotency_key: payment.idempotency_key.clone(),
            in_flight: None,
            attempts: payment.attempts,
            next_check_at: None,
            last_error: None,
            lease_until: None,
            stuck: false,
            late_charge: late_charge.as_ref().map(|late| LateChargeView::new(&payment, late)),
        };
        if charge_in_flight {
            operating.in_flight = Some(match payment.capture_method {
                CaptureMethod::Automatic => InFlight::Charge,
                CaptureMethod::Manual => InFlight::Authorization,
            });
            operating.next_check_at = payment.next_check_at;
            operating.last_error = payment.last_error.clone();
            operating.lease_until = held(payment.lease.map(|lease| lease.until));
        } else if let Some(action) = action {
            operating.in_flight = Some(match action.kind {
                Action::Capture => InFlight::Capture,
                Action::Void => InFlight::Void,
            });
            operating.attempts = action.attempts;
            operating.next_check_at = action.next_check_at;
            operating.last_error = action.last_error;
            operating.lease_until = held(action.lease_until);
        }
        operating.stuck = (operating.in_flight.is_some() && operating.attempts >= max_attempts)
            || late_charge.is_some_and(|late| late.needs_person);
        PaymentView { payment, operating }
    }
}

/// Which payments `orderpay payments list` shows.
#[derive(Debug, Clone, Copy)]
pub struct ListFilter {
    pub status: Option<PaymentStatus>,
    /// Only stuck ones (see the module doc).
    pub stuck: bool,
    /// Only those created longer ago than this.
    pub older_than: Option<Duration>,
    pub account: Option<AccountId>,
    pub limit: i64,
}

/// Payments matching `filter`, newest first; `max_attempts` is the reconciler's
/// (`ORDERPAY_RECONCILE_MAX_ATTEMPTS`), which says what is stuck.
pub async fn list(
    conn: &mut AsyncPgConnection,
    filter: &ListFilter,
    max_attempts: i32,
) -> diesel::QueryResult<Vec<PaymentView>> {
    let now = Utc::now();
    let inspect = Inspect {
        payment: None,
        account: filter.account,
        status: filter.status,
        created_before: filter.older_than.map(|age| crate::clock::before(now, age)),
        stuck_after: filter.stuck.then_some(max_attempts),
        limit: filter.limit,
    };
    let found = payments::inspect(conn, &inspect).await?;
    Ok(found.into_iter().map(|inspected| PaymentView::new(inspected, max_attempts, now)).collect())
}

/// The provider's view of a payment's charge, from a live lookup by its downstream key.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "lookup", rename_all = "snake_case")]
pub enum ProviderView {
    /// The provider holds a charge with the payment's downstream key.
    Found { charge: ChargeView },
    /// It never received the payment's charge.
    NotReceived,
    /// It could not be asked.
    Unavailable { error: String },
}

/// A charge as the provider sees it, its amounts in the payment's currency.
#[derive(Debug, Clone, Serialize)]
pub struct ChargeView {
    pub id: String,
    pub status: &'static str,
    pub amount: String,
    pub amount_captured: String,
    pub amount_refunded: String,
    pub authorization_expires_at: Option<DateTime<Utc>>,
    /// Why it was declined or canceled, as the provider says.
    pub reason: Option<String>,
}

impl ProviderView {
    fn new(payment: &Payment, lookup: &Lookup) -> Self {
        // An amount as the API prints it; the provider's own text should it not fit.
        let money = |value| {
            Amount::from_decimal(value, payment.currency())
                .map_or_else(|_| value.to_string(), |a| a.to_string())
        };
        match lookup {
            Ok(Some(charge)) => ProviderView::Found {
                charge: ChargeView {
                    id: charge.id.clone(),
                    status: charge.status.as_str(),
                    amount: money(charge.amount),
                    amount_captured: money(charge.amount_captured),
                    amount_refunded: money(charge.amount_refunded),
                    authorization_expires_at: charge.authorization_expires_at,
                    reason: match &charge.status {
                        ChargeStatus::Declined { code, message } => Some(format!("{code}: {message}")),
                        ChargeStatus::Canceled { reason } => Some(reason.clone()),
                        _ => None,
                    },
                },
            },
            Ok(None) => ProviderView::NotReceived,
            Err(error) => ProviderView::Unavailable { error: error.to_string() },
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            ProviderView::Found { charge } => {
                let mut line = format!(
                    "charge {} {}: amount {}, captured {}, refunded {}",
                    charge.id, charge.status, charge.amount, charge.amount_captured, charge.amount_refunded
                );
                if let Some(reason) = &charge.reason {
                    line.push_str(&format!(" ({reason})"));
                }
                line
            }
            ProviderView::NotReceived => {
                "no charge: the provider never received this payment's charge".into()
            }
            ProviderView::Unavailable { error } => format!("cannot be asked: {error}"),
        }
    }
}

/// A refund of the payment, as the API renders it, with what an operator needs beside it.
#[derive(Debug, Clone)]
pub struct RefundView {
    pub refund: Refund,
    pub operating: RefundOperating,
}

#[derive(Debug, Clone, Serialize)]
pub struct RefundOperating {
    /// Started by the system (a charge held against a failed payment), not by a client.
    pub system: bool,
    pub attempts: i32,
    pub lease_until: Option<DateTime<Utc>>,
}

impl Serialize for RefundView {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Beside { resource: RefundResource::from(&self.refund), operating: &self.operating }
            .serialize(serializer)
    }
}

/// A capture or a void of the payment.
#[derive(Debug, Clone, Serialize)]
pub struct ActionView {
    pub id: OperationId,
    pub kind: Action,
    pub status: ActionStatus,
    /// A capture's amount.
    pub amount: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

impl ActionView {
    fn new(payment: &Payment, action: PaymentOperation) -> Self {
        ActionView {
            id: action.id,
            kind: action.kind,
            status: action.status,
            amount: action.amount.map(|value| {
                Amount::from_decimal(value, payment.currency())
                    .map_or_else(|_| value.to_string(), |a| a.to_string())
            }),
            failure_code: action.failure_code,
            failure_message: action.failure_message,
            attempts: action.attempts,
            created_at: action.created_at,
        }
    }
}

/// Everything about one payment (`orderpay payments show`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub payment: PaymentView,
    pub order_status: Option<OrderStatus>,
    pub refunds: Vec<RefundView>,
    pub captures_and_voids: Vec<ActionView>,
    /// The audit trail, oldest first: every transition with its actor and detail.
    pub transitions: Vec<Transition>,
    pub provider: ProviderView,
}

/// Refunds a report shows at most (a payment has a handful).
const REFUNDS_SHOWN: i64 = 1000;

/// Everything about payment `id`; `None` when there is no such payment.
pub async fn show(
    engine: &Engine,
    config: &ReconcilerConfig,
    id: PaymentId,
) -> Result<Option<Report>, EngineError> {
    let mut conn = engine.pool.get().await?;
    let Some(found) = inspect_one(&mut conn, id).await? else {
        return Ok(None);
    };
    let account = found.payment.account_id;
    let order = crate::orders::repository::find(&mut conn, account, found.payment.order_id).await?;
    let (refunds, _) =
        crate::refunds::repository::list(&mut conn, account, Some(id), REFUNDS_SHOWN, None).await?;
    let actions = authorization::for_payment(&mut conn, account, id).await?;
    let transitions = payments::transitions(&mut conn, account, id).await?;
    drop(conn);
    let payment = PaymentView::new(found, config.max_attempts, Utc::now());
    let provider = ProviderView::new(&payment.payment, &look_up(engine, &payment.payment).await);
    let now = Utc::now();
    let refunds = refunds
        .into_iter()
        .rev()
        .map(|refund| RefundView {
            operating: RefundOperating {
                system: refund.idempotency_key.is_none(),
                attempts: refund.attempts,
                lease_until: refund.lease.map(|lease| lease.until).filter(|until| *until > now),
            },
            refund,
        })
        .collect();
    let captures_and_voids =
        actions.into_iter().map(|action| ActionView::new(&payment.payment, action)).collect();
    Ok(Some(Report {
        order_status: order.map(|order| order.status),
        refunds,
        captures_and_voids,
        transitions,
        provider,
        payment,
    }))
}

/// Payment `id` with what is in flight on it, found by its id alone.
async fn inspect_one(conn: &mut AsyncPgConnection, id: PaymentId) -> diesel::QueryResult<Option<Inspected>> {
    let Some(account) = payments::account_of(conn, id).await? else {
        return Ok(None);
    };
    let inspect = Inspect {
        payment: Some(id),
        account: Some(account),
        status: None,
        created_before: None,
        stuck_after: None,
        limit: 1,
    };
    Ok(payments::inspect(conn, &inspect).await?.pop())
}

/// What the provider answered to a lookup of a payment's charge by its downstream key.
type Lookup = Result<Option<Charge>, ProviderError>;

async fn look_up(engine: &Engine, payment: &Payment) -> Lookup {
    engine.provider.find_charge(&payment.downstream_key(), None).await
}

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
        (Target::Succeeded, Ok(Some(charge))) => match super::charge::outcome_of(payment, Ok(charge.clone()))
        {
            super::Finding::Final(ChargeOutcome::Captured { .. }) => {}
            super::Finding::Final(ChargeOutcome::Authorized { expires_at, .. }) => {
                judged.to = ResolvedTo::Authorized { expires_at }
            }
            _ => judged.objection = Some(said(charge)),
        },
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
    use super::*;
    use crate::payments::in_flight_for_tests as payment;

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
