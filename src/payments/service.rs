//! The request flow of `POST /payments` (docs/payments.md): phase 1, the provider call, phase 2.
//!
//! Phase 1 is one statement (`start_payment.sql`): claim the key, lock the order, decide, and
//! insert the payment `processing`, leased to this request. Then the provider call, outside any
//! transaction, with the payment's downstream key, and phase 2 through the engine's settle: the
//! payment's outcome, its final answer and the order's status, together. An unknown outcome
//! releases the lease and answers 202; a retry (taking the payment over) or the reconciler
//! finishes it, re-driving the same charge.
//!
//! Whoever drives a payment holds its lease (a request, a retry that took it over, or the
//! reconciler): two drivers never overlap unless a lease runs out mid-call, and even then the
//! provider's idempotency and the guarded status updates keep it to one charge and one
//! transition.

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::AsyncPgConnection;
use rust_decimal::Decimal;
use tracing::Instrument;

use super::repository::{self, StartOutcome, StartPayment, Started};
use super::representation::final_response;
use super::{Lease, Payment, PaymentMethod, PaymentStatus};
use crate::clock::after;
use crate::error::{ApiError, FieldError};
use crate::idempotency::store::{self, ClaimParameters, ResourceKind};
use crate::idempotency::{Execution, KeyConflict, KeyedRequest, Keys, Resolved, StoredResponse};
use crate::ids::{LeaseId, OrderId, PaymentId};
use crate::money::{Amount, Currency};
use crate::operations::settle::{self, answer_of};
use crate::operations::{Actor, DriveMode, Engine, Outcome, Settlement, charge};

/// How often phase 1 runs again when what it met changed under it (a key swept or expired, a
/// payment committed while it waited); more means the database is misbehaving.
const START_ROUNDS: usize = 3;

/// A parsed, valid `POST /payments`.
#[derive(Debug, Clone)]
pub struct PayCommand {
    pub order_id: OrderId,
    pub payment_method: PaymentMethod,
    /// If given, must equal the order's total.
    pub amount: Option<Decimal>,
}

/// How a payment request ends.
#[derive(Debug)]
pub enum PayResult {
    /// A final answer: executed now (and stored with the key) or replayed.
    Answered(Execution),
    /// The outcome is not known yet (202); nothing final is stored, a retry resumes it.
    Processing(Box<Payment>),
}

/// A payment this request drives, under its lease.
#[derive(Debug)]
struct Driving {
    payment: Box<Payment>,
    lease: LeaseId,
    mode: DriveMode,
}

enum Start {
    Answered(Execution),
    Drive(Driving),
}

/// `POST /payments`.
pub async fn pay(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &PayCommand,
    request_id: &str,
) -> Result<PayResult, ApiError> {
    if let Some(replay) = keys.replay(keyed) {
        return Ok(PayResult::Answered(replay));
    }
    let driving = match start(engine, keys, keyed, command).await? {
        Start::Answered(execution) => {
            keys.remember(keyed, execution.response());
            return Ok(PayResult::Answered(execution));
        }
        Start::Drive(driving) => driving,
    };
    // The provider call and phase 2 run in a task of their own: if the client goes away, actix
    // drops this request's future, but the outcome must still be recorded.
    let task_engine = engine.clone();
    let request_id = request_id.to_owned();
    let task = async move {
        let (outcome, _) =
            charge::drive(&task_engine, &driving.payment, driving.lease, driving.mode, Some(&request_id))
                .await;
        record(&task_engine, &driving, outcome).await
    };
    let result = tokio::spawn(task.in_current_span())
        .await
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("payment task failed: {error}")))?;
    if let PayResult::Answered(execution) = &result {
        keys.remember(keyed, execution.response());
    }
    Ok(result)
}

/// Phase 1: the one statement, run again when what it met changed under it.
async fn start(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &PayCommand,
) -> Result<Start, ApiError> {
    let account_id = keyed.account_id;
    let mut conn = engine.pool.get().await?;
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
        };
        let started = match repository::start(&mut conn, statement).await {
            Ok(started) => started,
            // A payment committed while the statement waited for the order's lock; nothing was
            // written. The next round sees it.
            Err(error) if repository::is_second_active_payment(&error) => continue,
            Err(error) => return Err(error.into()),
        };
        let key = keyed.key.as_str();
        let refuse = async |conn: &mut _, error: ApiError| {
            store::abandon(conn, account_id, key, payment_id.as_uuid()).await?;
            Err::<Start, ApiError>(error)
        };
        match started.outcome {
            StartOutcome::Started => {
                let total = order_total(&started)?;
                let payment = new_payment(payment_id, keyed, command, total, now, lease);
                let driving =
                    Driving { payment: Box::new(payment), lease: lease.id, mode: DriveMode::FirstCall };
                return Ok(Start::Drive(driving));
            }
            StartOutcome::OrderNotPayable => {
                let current = started.order.map(|(status, _, _)| status).unwrap_or_default();
                let answer = not_payable(command.order_id, current);
                store::complete(&mut conn, account_id, key, payment_id.as_uuid(), &answer).await?;
                return Ok(Start::Answered(Execution::Executed(answer)));
            }
            StartOutcome::OrderNotFound => {
                let order_id = command.order_id.to_string();
                return refuse(&mut conn, ApiError::NotFound { resource: "order", id: order_id }).await;
            }
            StartOutcome::PaymentInProgress => {
                let Some(payment_id) = started.in_flight else { continue };
                let error = ApiError::PaymentInProgress { order_id: command.order_id, payment_id };
                return refuse(&mut conn, error).await;
            }
            StartOutcome::AmountMismatch => {
                let total = order_total(&started)?;
                return refuse(&mut conn, amount_mismatch(&total)).await;
            }
            StartOutcome::KeyExists => {
                let Some(record) = store::find(&mut conn, account_id, key).await? else {
                    continue; // swept meanwhile: the key is free again
                };
                match record.resolve(keyed, now)? {
                    Some(Resolved::Answer(answer)) => {
                        return Ok(Start::Answered(Execution::Replayed(answer)));
                    }
                    Some(Resolved::Operation { resource_id, .. }) => {
                        let payment_id = PaymentId::from_uuid(resource_id);
                        if let Some(start) = resume(engine, &mut conn, keyed, payment_id).await? {
                            return Ok(start);
                        }
                    }
                    None => store::expire(&mut conn, account_id, key, now).await?,
                }
            }
        }
    }
    Err(ApiError::Unavailable(anyhow::anyhow!("phase 1 of a payment kept meeting changes")))
}

/// A key that started a payment before: replay its answer, tell the client to wait while its
/// driver holds it, or take it over when its driver is gone. `None` when the key names no
/// payment (its phase 1 refused and died before it could clear the key): the key is cleared
/// and the caller starts afresh.
async fn resume(
    engine: &Engine,
    conn: &mut AsyncPgConnection,
    keyed: &KeyedRequest,
    payment_id: PaymentId,
) -> Result<Option<Start>, ApiError> {
    let account_id = keyed.account_id;
    let Some(found) = repository::find_answered(conn, account_id, payment_id).await? else {
        tracing::info!(%payment_id, "clearing a key whose payment was never created");
        store::abandon(conn, account_id, keyed.key.as_str(), payment_id.as_uuid()).await?;
        return Ok(None);
    };
    let payment = found.payment;
    if payment.is_settled() {
        return Ok(Some(Start::Answered(Execution::Replayed(answer_of(payment, found.answer)))));
    }
    let now = Utc::now();
    if let Some(lease) = payment.lease.filter(|lease| lease.until > now) {
        let wait = (lease.until - now).to_std().unwrap_or_default();
        return Err(KeyConflict::InUse { retry_after: wait, resource_id: Some(payment_id.as_uuid()) }.into());
    }
    match settle::take_over(conn, account_id, payment_id, engine.timing.lease).await? {
        Some(taken) => {
            tracing::info!(%payment_id, "taking over an abandoned payment");
            crate::telemetry::metrics::idempotency_outcome("takeover");
            let lease = taken.lease.map(|lease| lease.id).unwrap_or_else(LeaseId::generate);
            Ok(Some(Start::Drive(Driving { payment: Box::new(taken), lease, mode: DriveMode::Redrive })))
        }
        // Another driver took it between the read and the compare-and-set.
        None => Err(KeyConflict::InUse {
            retry_after: std::time::Duration::from_secs(1),
            resource_id: Some(payment_id.as_uuid()),
        }
        .into()),
    }
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

/// Phase 2 for a request: a final outcome is settled and answered; an unknown one releases the
/// payment for a retry or the reconciler and answers 202. If the database fails here, the
/// charge may still have happened: the answer is 202 too, never a 5xx that invites a new
/// payment, and the lease runs out for a retry or the reconciler to finish.
async fn record(engine: &Engine, driving: &Driving, outcome: Outcome) -> PayResult {
    let payment = &driving.payment;
    let settlement = match outcome {
        Outcome::Succeeded { charge_id } => Settlement::Succeeded { charge_id },
        Outcome::Declined { code, message } => Settlement::Failed { code, message },
        Outcome::Unknown { reason } => return leave_processing(engine, driving, &reason).await,
        Outcome::NotReceived => {
            return leave_processing(engine, driving, "the provider has not received the charge").await;
        }
    };
    match settle::settle(&engine.pool, payment, &settlement, Actor::Request).await {
        Ok(settled) => PayResult::Answered(Execution::Executed(settled.answer)),
        Err(error) => {
            tracing::error!(payment_id = %payment.id, error = %error, "could not record a payment outcome; left processing");
            PayResult::Processing(payment.clone())
        }
    }
}

async fn leave_processing(engine: &Engine, driving: &Driving, reason: &str) -> PayResult {
    let payment = &driving.payment;
    tracing::warn!(payment_id = %payment.id, %reason, "payment outcome unknown; left processing");
    let next_check = after(Utc::now(), engine.timing.recheck_after);
    match settle::release(&engine.pool, payment, driving.lease, next_check, reason).await {
        // Someone else settled it meanwhile: their answer is the answer.
        Ok(current) if current.is_settled() => {
            PayResult::Answered(Execution::Executed(final_response(&current)))
        }
        Ok(current) => PayResult::Processing(Box::new(current)),
        Err(error) => {
            tracing::error!(payment_id = %payment.id, error = %error, "could not release a payment's lease");
            PayResult::Processing(payment.clone())
        }
    }
}

/// `GET /payments/{id}`
pub async fn get(
    engine: &Engine,
    account_id: crate::ids::AccountId,
    payment_id: PaymentId,
) -> Result<Payment, ApiError> {
    let mut conn = engine.pool.get().await?;
    repository::find(&mut conn, account_id, payment_id)
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "payment", id: payment_id.to_string() })
}
