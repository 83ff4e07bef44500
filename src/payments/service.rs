//! The request flows of payments (docs/payments.md): `POST /payments` (phase 1, the provider
//! call, phase 2), and the capture and void of an authorization.
//!
//! Each starts its operation in one statement (claiming the key with it) and hands the rest to
//! the provider-operations engine (`operations::request`): the provider call outside any
//! transaction with the operation's downstream key, then its settle in one statement, or, when
//! the outcome is unknown, 202 and a retry (taking the operation over) or the reconciler
//! finishes it.

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::AsyncPgConnection;
use rust_decimal::Decimal;

use super::authorization::{self, Action, ActionStatus, PaymentOperation, StartAction};
use super::repository::{self, StartOutcome, StartPayment, Started};
use super::{CaptureMethod, Payment, PaymentMethod, PaymentStatus};
use crate::clock::after;
use crate::error::{ApiError, FieldError};
use crate::idempotency::store::{self, ClaimParameters, ResourceKind};
use crate::idempotency::{Execution, KeyedRequest, Keys, StoredResponse};
use crate::ids::{AccountId, LeaseId, OperationId, OrderId, PaymentId};
use crate::money::{Amount, Currency};
use crate::operations::authorization::{Actions, Held};
use crate::operations::charge::Charges;
use crate::operations::leases::Lease;
use crate::operations::request::{self, Answer, Begin};
use crate::operations::{DriveMode, Engine, Kind};

/// How often a start statement runs again when what it met changed under it (a key swept or
/// expired, a payment committed while it waited); more means the database is misbehaving.
const START_ROUNDS: usize = 3;

/// A parsed, valid `POST /payments`.
#[derive(Debug, Clone)]
pub struct PayCommand {
    pub order_id: OrderId,
    pub payment_method: PaymentMethod,
    /// If given, must equal the order's total.
    pub amount: Option<Decimal>,
    pub capture_method: CaptureMethod,
}

/// A parsed, valid capture (`amount: None`: all that is capturable) or void.
#[derive(Debug, Clone)]
pub struct ActionCommand {
    pub payment_id: PaymentId,
    pub action: Action,
    pub amount: Option<Decimal>,
}

/// `POST /payments`.
pub async fn pay(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &PayCommand,
    request_id: &str,
) -> Result<Answer, ApiError> {
    if let Some(replay) = keys.replay(keyed) {
        return Ok(Answer::Final(replay));
    }
    let begin = {
        let mut conn = engine.pool.get().await?;
        start_payment(engine, &mut conn, keys, keyed, command).await?
    };
    request::finish::<Charges>(engine, keys, keyed, begin, request_id).await
}

/// Phase 1: the one statement, run again when what it met changed under it.
async fn start_payment(
    engine: &Engine,
    conn: &mut AsyncPgConnection,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &PayCommand,
) -> Result<Begin<Charges>, ApiError> {
    let account_id = keyed.account_id;
    let key = keyed.key.as_str();
    for _ in 0..START_ROUNDS {
        let now = Utc::now().trunc_subsecs(6);
        let payment_id = PaymentId::generate();
        let lease = Lease { id: LeaseId::generate(), until: after(now, engine.timing.lease) };
        let resource = (ResourceKind::Payment, payment_id.as_uuid());
        let statement = StartPayment {
            claim: ClaimParameters::new(account_id, Some(keyed), resource, None, now, keys.retention),
            order_id: command.order_id,
            amount: command.amount,
            payment_method: command.payment_method.as_str(),
            lease_until: lease.until,
            lease_id: lease.id,
            capture_method: command.capture_method,
        };
        let started = match repository::start(conn, statement).await {
            Ok(started) => started,
            // A payment committed while the statement waited for the order's lock; nothing was
            // written. The next round sees it.
            Err(error) if repository::is_second_active_payment(&error) => continue,
            Err(error) => return Err(error.into()),
        };
        let refuse = async |conn: &mut AsyncPgConnection, error: ApiError| {
            store::abandon(conn, account_id, key, payment_id.as_uuid()).await?;
            Err::<Begin<Charges>, ApiError>(error)
        };
        match started.outcome {
            StartOutcome::Started => {
                let total = order_total(&started)?;
                let payment = new_payment(payment_id, keyed, command, total, now, lease);
                return Ok(Begin::Drive { op: payment, lease: lease.id, mode: DriveMode::FirstCall });
            }
            StartOutcome::OrderNotPayable => {
                let current = started.order.map(|(status, _, _)| status).unwrap_or_default();
                let answer = not_payable(command.order_id, current);
                store::complete(conn, account_id, key, payment_id.as_uuid(), &answer).await?;
                return Ok(Begin::Answered(Execution::Executed(answer)));
            }
            StartOutcome::OrderNotFound => {
                let order_id = command.order_id.to_string();
                return refuse(conn, ApiError::NotFound { resource: "order", id: order_id }).await;
            }
            StartOutcome::PaymentInProgress => {
                let Some(payment_id) = started.in_flight else { continue };
                let error = ApiError::PaymentInProgress { order_id: command.order_id, payment_id };
                return refuse(conn, error).await;
            }
            StartOutcome::AmountMismatch => {
                let total = order_total(&started)?;
                return refuse(conn, amount_mismatch(&total)).await;
            }
            StartOutcome::NothingToPay => {
                let total = order_total(&started)?;
                let message = format!("the order's total_amount is {total}: there is nothing to pay");
                return refuse(conn, ApiError::Validation(vec![FieldError::new("order_id", message)])).await;
            }
            StartOutcome::KeyExists => {
                if let Some(begin) = request::existing_key::<Charges>(engine, conn, keyed).await? {
                    return Ok(begin);
                }
            }
        }
    }
    Err(kept_changing())
}

fn kept_changing() -> ApiError {
    ApiError::Unavailable(anyhow::anyhow!("starting an operation kept meeting changes"))
}

/// The order's total as phase 1 read it.
fn order_total(started: &Started) -> Result<Amount, ApiError> {
    let (_, total, currency) = started
        .order
        .as_ref()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("phase 1 returned no order")))?;
    let currency =
        Currency::parse(currency).map_err(|e| ApiError::Internal(anyhow::anyhow!("order currency: {e}")))?;
    Amount::from_decimal(*total, currency)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("order total: {e}")))
}

/// The final answer for an order that is not `pending_payment`: stored with the key, no provider
/// call.
fn not_payable(order_id: OrderId, current: String) -> StoredResponse {
    ApiError::InvalidState { resource: "order", id: order_id.as_uuid(), current, action: "paid" }
        .to_stored_response()
}

/// The client's `amount` guard did not match the order's total (not stored: fixable).
fn amount_mismatch(total: &Amount) -> ApiError {
    ApiError::Validation(vec![FieldError::new(
        "amount",
        format!("must equal the order's total_amount, {total}"),
    )])
}

/// The payment as phase 1 inserted it.
fn new_payment(
    id: PaymentId,
    keyed: &KeyedRequest,
    command: &PayCommand,
    amount: Amount,
    now: DateTime<Utc>,
    lease: Lease,
) -> Payment {
    Payment {
        id,
        account_id: keyed.account_id,
        order_id: command.order_id,
        status: PaymentStatus::Processing,
        amount,
        capture_method: command.capture_method,
        amount_captured: Amount::zero(amount.currency()),
        amount_refunded: Amount::zero(amount.currency()),
        authorization_expires_at: None,
        payment_method: command.payment_method.as_str().to_owned(),
        provider_charge_id: None,
        failure_code: None,
        failure_message: None,
        idempotency_key: Some(keyed.key.as_str().to_owned()),
        attempts: 0,
        next_check_at: Some(lease.until),
        last_error: None,
        lease: Some(lease),
        created_at: now,
        updated_at: now,
    }
}

/// `POST /payments/{id}/capture` and `POST /payments/{id}/void`.
pub async fn act(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &ActionCommand,
    request_id: &str,
) -> Result<Answer, ApiError> {
    if let Some(replay) = keys.replay(keyed) {
        return Ok(Answer::Final(replay));
    }
    let begin = {
        let mut conn = engine.pool.get().await?;
        start_action(engine, &mut conn, keys, keyed, command).await?
    };
    request::finish::<Actions>(engine, keys, keyed, begin, request_id).await
}

/// Starts a capture or void in one statement, run again when what it met changed under it.
async fn start_action(
    engine: &Engine,
    conn: &mut AsyncPgConnection,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &ActionCommand,
) -> Result<Begin<Actions>, ApiError> {
    let account_id = keyed.account_id;
    let key = keyed.key.as_str();
    for _ in 0..START_ROUNDS {
        let now = Utc::now().trunc_subsecs(6);
        let id = OperationId::generate();
        let lease = Lease { id: LeaseId::generate(), until: after(now, engine.timing.lease) };
        let resource = (ResourceKind::PaymentOperation, id.as_uuid());
        let statement = StartAction {
            claim: ClaimParameters::new(account_id, Some(keyed), resource, None, now, keys.retention),
            payment_id: command.payment_id,
            kind: command.action,
            amount: command.amount,
            lease_until: lease.until,
            lease_id: lease.id,
        };
        let (outcome, status, authorized) = match authorization::start(conn, statement).await {
            Ok(started) => started,
            // Another capture or void of this payment committed meanwhile: the next round sees it.
            Err(error) if is_second_action(&error) => continue,
            Err(error) => return Err(error.into()),
        };
        let refuse = async |conn: &mut AsyncPgConnection, error: ApiError| {
            store::abandon(conn, account_id, key, id.as_uuid()).await?;
            Err::<Begin<Actions>, ApiError>(error)
        };
        match outcome {
            authorization::StartOutcome::Started => {
                let Some(payment) = repository::find(conn, account_id, command.payment_id).await? else {
                    return Err(ApiError::Internal(anyhow::anyhow!(
                        "a started {} lost its payment",
                        command.action
                    )));
                };
                let operation = PaymentOperation {
                    account_id,
                    id,
                    payment_id: command.payment_id,
                    kind: command.action,
                    status: ActionStatus::Processing,
                    amount: match command.action {
                        Action::Capture => Some(command.amount.unwrap_or(payment.amount.value())),
                        Action::Void => None,
                    },
                    failure_code: None,
                    failure_message: None,
                    idempotency_key: Some(key.to_owned()),
                    attempts: 0,
                    lease_until: Some(lease.until),
                    lease_id: Some(lease.id),
                    created_at: now,
                };
                let held = Held { operation, payment };
                return Ok(Begin::Drive { op: held, lease: lease.id, mode: DriveMode::FirstCall });
            }
            authorization::StartOutcome::PaymentNotFound => {
                let id = command.payment_id.to_string();
                return refuse(conn, ApiError::NotFound { resource: "payment", id }).await;
            }
            authorization::StartOutcome::InvalidState => {
                // A final answer about the payment's state, stored with the key.
                let current = status.map(|status| status.to_string()).unwrap_or_default();
                let action = match command.action {
                    Action::Capture => "captured",
                    Action::Void => "voided",
                };
                let answer = ApiError::InvalidState {
                    resource: "payment",
                    id: command.payment_id.as_uuid(),
                    current,
                    action,
                }
                .to_stored_response();
                store::complete(conn, account_id, key, id.as_uuid(), &answer).await?;
                return Ok(Begin::Answered(Execution::Executed(answer)));
            }
            authorization::StartOutcome::ExceedsCapturable => {
                let payment = repository::find(conn, account_id, command.payment_id).await?;
                let capturable_amount = match (payment, authorized) {
                    (Some(payment), Some(amount)) => Amount::from_decimal(amount, payment.currency())
                        .map_err(|e| ApiError::Internal(anyhow::anyhow!("authorized amount: {e}")))?,
                    _ => return Err(ApiError::Internal(anyhow::anyhow!("a capture without its payment"))),
                };
                return refuse(conn, ApiError::CaptureExceedsCapturable { capturable_amount }).await;
            }
            authorization::StartOutcome::KeyExists => {
                if let Some(begin) = request::existing_key::<Actions>(engine, conn, keyed).await? {
                    return Ok(begin);
                }
            }
        }
    }
    Err(kept_changing())
}

/// Whether `error` is the unique index refusing a second capture or void in flight for a payment.
fn is_second_action(error: &diesel::result::Error) -> bool {
    matches!(
        error,
        diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, info)
            if info.constraint_name() == Some("payment_operations_one_in_flight")
    )
}

/// The currency of a payment, to check an amount against before anything is written.
pub async fn currency_of(
    engine: &Engine,
    account_id: AccountId,
    payment_id: PaymentId,
) -> Result<Option<Currency>, ApiError> {
    let mut conn = engine.pool.get().await?;
    let Some(payment) = repository::find(&mut conn, account_id, payment_id).await? else {
        return Ok(None);
    };
    Ok(Some(payment.currency()))
}

/// `GET /payments?order_id=&status=&limit=&starting_after=`: a page of the account's payments,
/// newest first.
pub async fn list(
    engine: &Engine,
    account_id: AccountId,
    order_id: Option<OrderId>,
    status: Option<PaymentStatus>,
    limit: i64,
    starting_after: Option<PaymentId>,
) -> Result<(Vec<Payment>, bool), ApiError> {
    let mut conn = engine.pool.get().await?;
    Ok(repository::list(&mut conn, account_id, order_id, status, limit, starting_after).await?)
}

/// `GET /payments/{id}`
pub async fn get(engine: &Engine, account_id: AccountId, payment_id: PaymentId) -> Result<Payment, ApiError> {
    let mut conn = engine.pool.get().await?;
    <Charges as Kind>::load(&mut conn, (account_id, payment_id.as_uuid()))
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "payment", id: payment_id.to_string() })
}
