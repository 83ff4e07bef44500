//! What `orderpay payments list` and `payments show` read: a payment as the API renders it, with
//! what an operator needs beside it, its refunds and actions, and the provider's live view.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::{InFlight, LateChargeView, Lookup, Operating, inspect_one, look_up};
use crate::ids::{AccountId, OperationId, PaymentId};
use crate::money::Amount;
use crate::operations::reconciler::ReconcilerConfig;
use crate::operations::{Engine, EngineError};
use crate::orders::OrderStatus;
use crate::payments::authorization::{self, Action, ActionStatus, PaymentOperation};
use crate::payments::inspect::{self, Inspect, Inspected, Transition};
use crate::payments::representation::PaymentResource;
use crate::payments::{CaptureMethod, Payment, PaymentStatus};
use crate::provider::ChargeStatus;
use crate::refunds::Refund;
use crate::refunds::representation::RefundResource;

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
    pub(super) fn new(inspected: Inspected, max_attempts: i32, now: DateTime<Utc>) -> Self {
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
        // Out of checks, or held for a person with none scheduled (a key the provider holds
        // with other parameters; a lease always schedules the next check, so none means none).
        let held_for_person = operating.next_check_at.is_none();
        operating.stuck = (operating.in_flight.is_some()
            && (operating.attempts >= max_attempts || held_for_person))
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
    let found = inspect::inspect(conn, &inspect).await?;
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
    pub(super) fn new(payment: &Payment, lookup: &Lookup) -> Self {
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
    let transitions = inspect::transitions(&mut conn, account, id).await?;
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
