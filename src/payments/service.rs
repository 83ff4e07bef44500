//! The two-phase payment of IDEMPOTENCY.md and PAYMENTS.md.
//!
//! Phase 1 (one transaction): claim the key in progress with a lease, lock the order, insert the
//! payment `processing`. Then the provider call, outside any transaction, with the payment's
//! downstream key. Phase 2 (one transaction): the payment's outcome, the order's status and the
//! stored answer for the key, together. An unknown outcome leaves the payment `processing` and the
//! key in progress with its lease released, and answers 202; a retry (taking the key over) or the
//! reconciler finishes it, re-driving the same charge.
//!
//! Whoever drives a payment holds its key's lease (a request, a retry that took over, or the
//! reconciler): the lease is the lock, with an owner id, so two drivers never overlap unless a
//! lease runs out mid-call, and even then the provider's idempotency and the guarded status
//! updates keep it to one charge and one transition.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use rust_decimal::Decimal;
use tracing::Instrument;
use uuid::Uuid;

use super::representation::final_response;
use super::{
    Actor, IllegalTransition, Outcome, Payment, PaymentMethod, PaymentStatus, Settlement, outcome_of,
    repository,
};
use crate::clock::after;
use crate::db::Pool;
use crate::error::{ApiError, FieldError};
use crate::idempotency::cache::ReplayCache;
use crate::idempotency::store::{self, Claim, ClaimAs, Existing, KeyRecord};
use crate::idempotency::{Execution, KeyedRequest, StoredResponse};
use crate::money::{Amount, Currency};
use crate::orders::{self, OrderStatus};
use crate::provider::PaymentProvider;

/// The failure code of a payment the reconciler gave up on.
pub const GAVE_UP_CODE: &str = "reconciliation_gave_up";

/// The recovery point of a payment's key once phase 1 committed: the payment exists, and
/// resuming means asking the provider about its downstream key.
const PAYMENT_CREATED: &str = "payment_created";

#[derive(Debug, Clone, Copy)]
pub struct PaymentSettings {
    /// How long a request owns a key while it calls the provider. Longer than the provider
    /// timeout, so a live request is never taken over.
    pub lease: Duration,
    /// How long idempotency keys are kept.
    pub retention: Duration,
    /// When an unknown outcome is first checked again.
    pub recheck_after: Duration,
}

/// What a payment use case needs: the database, the provider, the settings, and the
/// in-memory copies of completed answers.
#[derive(Clone)]
pub struct PaymentContext {
    pub pool: Pool,
    pub provider: Arc<dyn PaymentProvider>,
    pub settings: PaymentSettings,
    pub replays: Arc<ReplayCache>,
}

/// A parsed, valid `POST /payments`.
#[derive(Debug, Clone)]
pub struct PayCommand {
    pub order_id: Uuid,
    pub payment_method: PaymentMethod,
    /// If given, must equal the order's total.
    pub amount: Option<Decimal>,
}

/// How a payment request ends.
#[derive(Debug)]
pub enum PayResult {
    /// A final answer: executed now (and stored with the key) or replayed.
    Answered(Execution),
    /// The outcome is not known yet (202); not stored, the key stays in progress.
    Processing(Box<Payment>),
}

/// How much the provider may already know about a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveMode {
    /// Straight after phase 1: the provider has certainly never seen it; create the charge.
    FirstCall,
    /// A takeover or the reconciler: look the charge up by its downstream key first, and re-send
    /// it (same key) only if the provider never received it.
    Redrive,
    /// Look only; never send. The reconciler's last check before giving up.
    LookupOnly,
}

/// A payment to drive and the lease on its key that this driver owns.
#[derive(Debug)]
struct Driving {
    payment: Box<Payment>,
    lease_id: Option<Uuid>,
    mode: DriveMode,
}

enum Start {
    Answered(Execution),
    Drive(Driving),
}

/// `POST /payments`.
pub async fn pay(
    context: &PaymentContext,
    account_id: Uuid,
    keyed: &KeyedRequest,
    command: &PayCommand,
    request_id: &str,
) -> Result<PayResult, ApiError> {
    if let Some(stored) = context.replays.replay(keyed, Utc::now()) {
        return Ok(PayResult::Answered(Execution::Replayed(stored)));
    }
    let driving = match phase_one(context, account_id, keyed, command).await? {
        Start::Answered(execution) => {
            remember(context, keyed, &execution);
            return Ok(PayResult::Answered(execution));
        }
        Start::Drive(driving) => driving,
    };
    // The provider call and phase 2 run in a task of their own: if the client goes away, actix
    // drops this request's future, but the outcome must still be recorded (STACK_NOTES pitfall 7).
    let task_context = context.clone();
    let request_id = request_id.to_owned();
    let task = async move {
        let provider = task_context.provider.as_ref();
        let (outcome, _) = ask_provider(provider, &driving.payment, driving.mode, Some(&request_id)).await;
        record(&task_context, &driving, outcome).await
    };
    let result = tokio::spawn(task.in_current_span())
        .await
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("payment task failed: {error}")))??;
    if let PayResult::Answered(execution) = &result {
        remember(context, keyed, execution);
    }
    Ok(result)
}

/// Keeps a final answer for replays from memory.
fn remember(context: &PaymentContext, keyed: &KeyedRequest, execution: &Execution) {
    let expires_at = after(Utc::now(), context.settings.retention);
    context.replays.remember(keyed, execution.response(), expires_at);
}

/// Phase 1. The common cases take one statement (`start_payment.sql`): a new key on a payable
/// order (the payment starts), a replay, a refusal. The rest (a key another request is still
/// committing, an abandoned payment to take over) go through [`phase_one_in_transaction`].
async fn phase_one(
    context: &PaymentContext,
    account_id: Uuid,
    keyed: &KeyedRequest,
    command: &PayCommand,
) -> Result<Start, ApiError> {
    let settings = context.settings;
    let mut conn = context.pool.get().await?;
    let now = Utc::now().trunc_subsecs(6);
    let (payment_id, lease_id, order_id) = (Uuid::now_v7(), Uuid::now_v7(), command.order_id);
    let key = keyed.key.as_str();
    let start = repository::StartPayment {
        account_id,
        key,
        method: &keyed.method,
        route: &keyed.route,
        fingerprint: keyed.fingerprint.as_bytes(),
        now,
        key_expires_at: after(now, settings.retention),
        lease_until: after(now, settings.lease),
        lease_id,
        payment_id,
        order_id,
        payment_method: command.payment_method.as_str(),
        // The reconciler looks only once the lease could have run out.
        first_check_at: after(now, settings.lease),
        amount: command.amount,
    };
    let started = match repository::start(&mut conn, &start).await {
        Ok(started) => started,
        Err(error) if is_second_active_payment(&error) => {
            // Nothing was written. Name the payment in flight if it still is.
            let in_flight = repository::processing_for_order(&mut conn, account_id, order_id).await?;
            return Err(match in_flight {
                Some(payment_id) => ApiError::PaymentInProgress { order_id, payment_id },
                None => ApiError::IdempotencyKeyInUse { retry_after_secs: 1, resource_id: None },
            });
        }
        Err(error) => return Err(error.into()),
    };
    if started.claimed {
        let Some((status, total, currency)) = started.order else {
            store::abandon(&mut conn, account_id, key, payment_id).await?;
            return Err(ApiError::NotFound { resource: "order", id: order_id.to_string() });
        };
        let currency = Currency::parse(&currency)
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("order currency: {e}")))?;
        let total = Amount::from_decimal(total, currency)
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("order total: {e}")))?;
        if status != OrderStatus::PendingPayment.as_str() {
            let response = not_payable(order_id, status);
            store::complete(&mut conn, account_id, key, payment_id, &response).await?;
            return Ok(Start::Answered(Execution::Executed(response)));
        }
        if !started.started {
            store::abandon(&mut conn, account_id, key, payment_id).await?;
            return Err(amount_mismatch(&total));
        }
        let payment = new_payment(payment_id, account_id, keyed, command, total, now, start.first_check_at);
        return Ok(Start::Drive(Driving {
            payment: Box::new(payment),
            lease_id: Some(lease_id),
            mode: DriveMode::FirstCall,
        }));
    }
    match started.existing {
        Some(record) => match record.resolve(keyed, now)? {
            Existing::Replay(response) => Ok(Start::Answered(Execution::Replayed(response))),
            Existing::InUse { retry_after, resource_id } => {
                Err(ApiError::key_in_use(retry_after, resource_id))
            }
            // Taking over needs a transaction: the general path.
            Existing::Abandoned { .. } => phase_one_in_transaction(context, account_id, keyed, command).await,
        },
        None => phase_one_in_transaction(context, account_id, keyed, command).await,
    }
}

/// The final answer for an order that is not `pending_payment`: stored with the key, no provider
/// call.
fn not_payable(order_id: Uuid, current: String) -> StoredResponse {
    ApiError::InvalidState { resource: "order", id: order_id, current, action: "paid" }.to_stored_response()
}

/// The client's `amount` guard did not match the order's total (not stored: fixable).
fn amount_mismatch(total: &Amount) -> ApiError {
    ApiError::Validation(vec![FieldError::new(
        "amount",
        format!("must equal the order's total_amount, {total}"),
    )])
}

/// A payment as phase 1 starts it: `processing`, for the order's total, first checked by the
/// reconciler at `first_check_at`.
fn new_payment(
    id: Uuid,
    account_id: Uuid,
    keyed: &KeyedRequest,
    command: &PayCommand,
    amount: Amount,
    now: DateTime<Utc>,
    first_check_at: DateTime<Utc>,
) -> Payment {
    Payment {
        id,
        account_id,
        order_id: command.order_id,
        status: PaymentStatus::Processing,
        amount,
        payment_method: command.payment_method.as_str().to_owned(),
        provider_charge_id: None,
        failure_code: None,
        failure_message: None,
        idempotency_key: Some(keyed.key.as_str().to_owned()),
        attempts: 0,
        next_check_at: Some(first_check_at),
        last_error: None,
        created_at: now,
        updated_at: now,
    }
}

/// Whether `error` is the partial unique index refusing a second active payment for an order.
fn is_second_active_payment(error: &diesel::result::Error) -> bool {
    matches!(
        error,
        diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, info)
            if info.constraint_name() == Some("payments_one_active_per_order")
    )
}

/// Phase 1 in an explicit transaction, for the cases the one statement leaves: a key another
/// request has not committed yet (waited for here), or an abandoned payment to take over.
async fn phase_one_in_transaction(
    context: &PaymentContext,
    account_id: Uuid,
    keyed: &KeyedRequest,
    command: &PayCommand,
) -> Result<Start, ApiError> {
    let settings = context.settings;
    let mut conn = context.pool.get().await?;
    conn.transaction(async |conn| {
        let now = Utc::now().trunc_subsecs(6);
        let payment_id = Uuid::now_v7();
        let claim_as = ClaimAs::InProgress {
            lease: Some(settings.lease),
            resource_id: Some(payment_id),
            recovery_point: PAYMENT_CREATED,
        };
        let lease_id = match store::claim(conn, keyed, claim_as, settings.retention, now).await? {
            Claim::Acquired(lease_id) => lease_id,
            Claim::Existing(record) => return resume(conn, keyed, &record, settings.lease, now).await,
        };
        let order_id = command.order_id;
        let order = orders::repository::lock(conn, account_id, order_id)
            .await?
            .ok_or_else(|| ApiError::NotFound { resource: "order", id: order_id.to_string() })?;
        if order.status != OrderStatus::PendingPayment {
            let response = not_payable(order_id, order.status.to_string());
            store::complete(conn, account_id, keyed.key.as_str(), payment_id, &response).await?;
            return Ok(Start::Answered(Execution::Executed(response)));
        }
        if command.amount.is_some_and(|amount| amount != order.total_amount.value()) {
            return Err(amount_mismatch(&order.total_amount));
        }
        if let Some(in_flight) = repository::processing_for_order(conn, account_id, order_id).await? {
            return Err(ApiError::PaymentInProgress { order_id, payment_id: in_flight });
        }
        // The reconciler looks only once the lease could have run out.
        let first_check_at = after(now, settings.lease);
        let payment =
            new_payment(payment_id, account_id, keyed, command, order.total_amount, now, first_check_at);
        repository::insert(conn, &payment).await?;
        Ok(Start::Drive(Driving { payment: Box::new(payment), lease_id, mode: DriveMode::FirstCall }))
    })
    .await
}

/// A key seen before: replay it, refuse it, or take over a payment whose driver is gone.
async fn resume(
    conn: &mut AsyncPgConnection,
    keyed: &KeyedRequest,
    record: &KeyRecord,
    lease: Duration,
    now: DateTime<Utc>,
) -> Result<Start, ApiError> {
    let (recovery_point, resource_id) = match record.resolve(keyed, now)? {
        Existing::Replay(response) => return Ok(Start::Answered(Execution::Replayed(response))),
        Existing::InUse { retry_after, resource_id } => {
            return Err(ApiError::key_in_use(retry_after, resource_id));
        }
        Existing::Abandoned { recovery_point, resource_id } => (recovery_point, resource_id),
    };
    let corrupt =
        || ApiError::Internal(anyhow::anyhow!("key in progress at {recovery_point} without a payment"));
    let payment_id = resource_id.ok_or_else(corrupt)?;
    let Some(lease_id) =
        store::take_over(conn, keyed.account_id, keyed.key.as_str(), payment_id, lease, now).await?
    else {
        return Err(ApiError::IdempotencyKeyInUse { retry_after_secs: 1, resource_id });
    };
    let Some(payment) = repository::find(conn, keyed.account_id, payment_id).await? else {
        // Phase 1 claimed the key but stopped before the payment (the process died between
        // its statement and the clean-up of a refusal): nothing reached the provider. Clear the
        // key; the retry starts afresh.
        tracing::info!(%payment_id, %recovery_point, "clearing a key whose payment was never created");
        store::abandon(conn, keyed.account_id, keyed.key.as_str(), payment_id).await?;
        return Err(ApiError::IdempotencyKeyInUse { retry_after_secs: 1, resource_id: None });
    };
    if payment.status == PaymentStatus::Processing {
        tracing::info!(payment_id = %payment.id, %recovery_point, "taking over an abandoned payment");
        crate::telemetry::metrics::idempotency_outcome("takeover");
        return Ok(Start::Drive(Driving {
            payment: Box::new(payment),
            lease_id: Some(lease_id),
            mode: DriveMode::Redrive,
        }));
    }
    // Settled meanwhile (by the reconciler) without its answer stored for this key.
    let response = final_response(&payment);
    store::complete(conn, keyed.account_id, keyed.key.as_str(), payment.id, &response).await?;
    Ok(Start::Answered(Execution::Executed(response)))
}

/// Asks the provider about `payment`. Returns the outcome and whether a charge was (re)sent.
pub async fn ask_provider(
    provider: &dyn PaymentProvider,
    payment: &Payment,
    mode: DriveMode,
    request_id: Option<&str>,
) -> (Outcome, bool) {
    let request = payment.charge_request(request_id);
    if mode == DriveMode::FirstCall {
        return (outcome_of(provider.create_charge(&request).await), true);
    }
    match provider.find_charge(&request.downstream_key, request_id).await {
        Ok(Some(charge)) => (outcome_of(Ok(charge)), false),
        Ok(None) if mode == DriveMode::LookupOnly => (Outcome::NotReceived, false),
        // The provider never received it (W1): send it now, with the same key.
        Ok(None) => (outcome_of(provider.create_charge(&request).await), true),
        Err(error) => (outcome_of(Err(error)), false),
    }
}

/// Phase 2 for a request: a known outcome is settled and answered; an unknown one leaves the
/// payment for a retry or the reconciler and answers 202. If the database fails here, the
/// charge may still have happened: the answer is 202 too, never a 5xx that invites a new
/// payment, and the lease runs out for a retry or the reconciler to finish.
async fn record(
    context: &PaymentContext,
    driving: &Driving,
    outcome: Outcome,
) -> Result<PayResult, ApiError> {
    let payment = &driving.payment;
    let settlement = match outcome {
        Outcome::Succeeded { charge_id } => Settlement::Succeeded { charge_id },
        Outcome::Declined { code, message } => Settlement::Failed { code, message },
        Outcome::Unknown { reason } => return Ok(leave_processing(context, driving, &reason).await),
        Outcome::NotReceived => {
            return Ok(leave_processing(context, driving, "the provider has not received the charge").await);
        }
    };
    match settle(&context.pool, payment, &settlement, Actor::Request).await {
        Ok(settled) => Ok(PayResult::Answered(Execution::Executed(settled.response))),
        Err(error) => {
            tracing::error!(payment_id = %payment.id, error = %error, "could not record a payment outcome; left processing");
            Ok(PayResult::Processing(payment.clone()))
        }
    }
}

async fn leave_processing(context: &PaymentContext, driving: &Driving, reason: &str) -> PayResult {
    let payment = &driving.payment;
    tracing::warn!(payment_id = %payment.id, %reason, "payment outcome unknown; left processing");
    let next_check = after(Utc::now(), context.settings.recheck_after);
    match release(&context.pool, payment, driving.lease_id, next_check, reason).await {
        // Someone else settled it meanwhile: their answer is the answer.
        Ok(current) if current.status != PaymentStatus::Processing => {
            PayResult::Answered(Execution::Executed(final_response(&current)))
        }
        Ok(current) => PayResult::Processing(Box::new(current)),
        Err(error) => {
            tracing::error!(payment_id = %payment.id, error = %error, "could not release a payment's lease");
            PayResult::Processing(payment.clone())
        }
    }
}

/// A settled payment, its final answer, and whether this call applied the transition.
#[derive(Debug)]
pub struct Settled {
    pub payment: Payment,
    pub response: StoredResponse,
    pub applied: bool,
}

/// Phase 2: moves the payment to its terminal state, marks the order paid when it succeeded, and
/// stores the final answer for the payment's key, in one statement (`settle_payment.sql`). The
/// answer is rendered first from the payment as it will be. Idempotent: if someone settled the
/// payment first, nothing changes and their result is returned.
pub async fn settle(
    pool: &Pool,
    payment: &Payment,
    settlement: &Settlement,
    actor: Actor,
) -> Result<Settled, ApiError> {
    let now = Utc::now().trunc_subsecs(6);
    let (charge_id, failure_code, failure_message) = match settlement {
        Settlement::Succeeded { charge_id } => (Some(charge_id.clone()), None, None),
        Settlement::Failed { code, message } => (None, Some(code.clone()), Some(message.clone())),
    };
    let settled = Payment {
        status: settlement.status(),
        provider_charge_id: charge_id,
        failure_code,
        failure_message,
        next_check_at: None,
        updated_at: now,
        ..payment.clone()
    };
    let response = final_response(&settled);
    let mut conn = pool.get().await?;
    let statement = repository::SettlePayment {
        account_id: payment.account_id,
        payment_id: payment.id,
        status: settled.status.as_str(),
        provider_charge_id: settled.provider_charge_id.as_deref(),
        failure_code: settled.failure_code.as_deref(),
        failure_message: settled.failure_message.as_deref(),
        now,
        actor: actor.as_str(),
        detail: settled.failure_message.as_deref().or(settled.provider_charge_id.as_deref()),
        response_status: response.status as i16,
        response_headers: store::headers_json(&response),
        response_body: &response.body,
    };
    let (applied, paid) = repository::settle(&mut conn, &statement).await?;
    if applied == 1 {
        if settled.status == PaymentStatus::Succeeded && paid == 0 {
            // Cannot happen while cancels refuse orders with a payment in flight and an order has
            // at most one active payment; if it does, money was taken for an order that is not
            // payable, and a person must refund it.
            tracing::error!(payment_id = %settled.id, order_id = %settled.order_id,
                "payment succeeded for an order that was not pending_payment");
        }
        tracing::info!(payment_id = %settled.id, status = %settled.status, actor = actor.as_str(), "payment settled");
        crate::telemetry::metrics::payment_settled(settled.status.as_str());
        return Ok(Settled { payment: settled, response, applied: true });
    }
    // Someone settled it first: theirs is the answer (and, if they could not store it for the
    // key, it is stored now).
    conn.transaction(async |conn| {
        let id = payment.id;
        let current = repository::find(conn, payment.account_id, id)
            .await?
            .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("payment {id} vanished")))?;
        if current.status != settlement.status() {
            // Terminal states are absorbing: the first settlement stands. Two different answers
            // for one charge need a person.
            let error =
                IllegalTransition { payment_id: id, current: current.status, wanted: settlement.status() };
            tracing::error!(error = %error, "conflicting settlements for one payment");
        }
        let response = final_response(&current);
        if let Some(key) = &current.idempotency_key {
            store::complete(conn, current.account_id, key, id, &response).await?;
        }
        Ok::<_, ApiError>(Settled { payment: current, response, applied: false })
    })
    .await
}

/// Leaves a `processing` payment for a check at `next_check`, and releases the caller's lease on
/// its key (if it still holds it) so that a retry may take it over at once. Returns the payment
/// as it now is: someone else may have settled it meanwhile.
pub async fn release(
    pool: &Pool,
    payment: &Payment,
    lease_id: Option<Uuid>,
    next_check: DateTime<Utc>,
    reason: &str,
) -> Result<Payment, ApiError> {
    let mut conn = pool.get().await?;
    conn.transaction(async |conn| {
        let (account_id, id) = (payment.account_id, payment.id);
        repository::reschedule(conn, account_id, id, next_check, reason, Utc::now()).await?;
        if let (Some(key), Some(lease_id)) = (&payment.idempotency_key, lease_id) {
            store::release_lease(conn, account_id, key, lease_id).await?;
        }
        repository::find(conn, account_id, id)
            .await?
            .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("payment {id} vanished")))
    })
    .await
}

/// `GET /payments/{id}`
pub async fn get(pool: &Pool, account_id: Uuid, payment_id: Uuid) -> Result<Payment, ApiError> {
    let mut conn = pool.get().await?;
    repository::find(&mut conn, account_id, payment_id)
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "payment", id: payment_id.to_string() })
}
