//! The request flows of refunds: `POST /refunds` (start, the provider call, settle, through the
//! provider-operations engine), and reading them.

use chrono::{SubsecRound, Utc};
use diesel_async::AsyncPgConnection;
use rust_decimal::Decimal;

use super::repository::{self, StartOutcome, StartRefund};
use super::{Refund, RefundReason, RefundStatus};
use crate::clock::after;
use crate::error::{ApiError, FieldError};
use crate::idempotency::store::{self, ClaimParameters, ResourceKind};
use crate::idempotency::{Execution, KeyedRequest, Keys};
use crate::ids::{AccountId, LeaseId, PaymentId, RefundId};
use crate::money::{Amount, Currency};
use crate::operations::leases::Lease;
use crate::operations::refund::{Held, Refunds};
use crate::operations::request::{self, Answer, Begin};
use crate::operations::{DriveMode, Engine, Kind};
use crate::payments::PaymentStatus;

/// How often the start statement runs again when its key changed under it.
const START_ROUNDS: usize = 3;

/// A parsed `POST /refunds`. The amount is checked against the payment's currency here, once
/// the payment is known.
#[derive(Debug, Clone)]
pub struct RefundCommand {
    pub payment_id: PaymentId,
    /// `None`: all that is still refundable.
    pub amount: Option<Decimal>,
    pub reason: Option<RefundReason>,
}

/// `POST /refunds`.
pub async fn create(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &RefundCommand,
    request_id: &str,
) -> Result<Answer, ApiError> {
    if let Some(replay) = keys.replay(keyed) {
        return Ok(Answer::Final(replay));
    }
    let begin = {
        let mut conn = engine.pool.get().await?;
        if let Some(amount) = command.amount {
            check_amount(&mut conn, keyed.account_id, command.payment_id, amount).await?;
        }
        start(engine, &mut conn, keys, keyed, command).await?
    };
    request::finish::<Refunds>(engine, keys, keyed, begin, request_id).await
}

/// A refund's amount must be positive and no finer than the payment's currency's minor unit
/// (422 `validation-failed`, nothing stored). An unknown payment is left to the start statement.
async fn check_amount(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    payment_id: PaymentId,
    amount: Decimal,
) -> Result<(), ApiError> {
    let Some(currency) = repository::payment_currency(conn, account_id, payment_id).await? else {
        return Ok(());
    };
    let currency = Currency::parse(&currency)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("payment currency: {e}")))?;
    let invalid = |message: String| ApiError::Validation(vec![FieldError::new("amount", message)]);
    let amount = Amount::from_decimal(amount, currency).map_err(|error| invalid(error.to_string()))?;
    if amount.value().is_zero() {
        return Err(invalid("must be more than zero".to_owned()));
    }
    Ok(())
}

async fn start(
    engine: &Engine,
    conn: &mut AsyncPgConnection,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &RefundCommand,
) -> Result<Begin<Refunds>, ApiError> {
    let account_id = keyed.account_id;
    let key = keyed.key.as_str();
    for _ in 0..START_ROUNDS {
        let now = Utc::now().trunc_subsecs(6);
        let id = RefundId::generate();
        let lease = Lease { id: LeaseId::generate(), until: after(now, engine.timing.lease) };
        let statement = StartRefund {
            claim: ClaimParameters::new(
                account_id,
                Some(keyed),
                (ResourceKind::Refund, id.as_uuid()),
                None,
                now,
                keys.retention,
            ),
            payment_id: command.payment_id,
            amount: command.amount,
            reason: command.reason,
            lease_until: lease.until,
            lease_id: lease.id,
            payment_must_be: PaymentStatus::Succeeded,
        };
        let started = repository::start(conn, statement).await?;
        let refuse = async |conn: &mut AsyncPgConnection, error: ApiError| {
            store::abandon(conn, account_id, key, id.as_uuid()).await?;
            Err::<Begin<Refunds>, ApiError>(error)
        };
        let currency = started
            .currency
            .as_deref()
            .map(Currency::parse)
            .transpose()
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("payment currency: {e}")))?;
        let money = |value: Option<Decimal>| -> Result<Amount, ApiError> {
            let (value, currency) = value
                .zip(currency)
                .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no payment amounts")))?;
            // What is refundable is never negative (a CHECK constraint); clamp for the answer.
            Amount::from_decimal(value.max(Decimal::ZERO), currency)
                .map_err(|e| ApiError::Internal(anyhow::anyhow!("{e}")))
        };
        match started.outcome {
            StartOutcome::Started => {
                let refund = Refund {
                    id,
                    account_id,
                    payment_id: command.payment_id,
                    order_id: started
                        .order_id
                        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no order")))?,
                    status: RefundStatus::Processing,
                    amount: money(started.amount)?,
                    reason: command.reason,
                    provider_refund_id: None,
                    failure_code: None,
                    failure_message: None,
                    idempotency_key: Some(key.to_owned()),
                    attempts: 0,
                    lease: Some(lease),
                    created_at: now,
                    updated_at: now,
                };
                let Some(held) = <Refunds as Kind>::load(conn, (account_id, id.as_uuid())).await? else {
                    return Err(ApiError::Internal(anyhow::anyhow!("a started refund vanished")));
                };
                let held = Held { refund, ..held };
                return Ok(Begin::Drive { op: held, lease: lease.id, mode: DriveMode::FirstCall });
            }
            StartOutcome::PaymentNotFound => {
                let id = command.payment_id.to_string();
                return refuse(conn, ApiError::NotFound { resource: "payment", id }).await;
            }
            StartOutcome::InvalidState => {
                // A final answer about the payment's state, stored with the key.
                let current = started.payment_status.map(|status| status.to_string()).unwrap_or_default();
                let answer = ApiError::InvalidState {
                    resource: "payment",
                    id: command.payment_id.as_uuid(),
                    current,
                    action: "refunded",
                }
                .to_stored_response();
                store::complete(conn, account_id, key, id.as_uuid(), &answer).await?;
                return Ok(Begin::Answered(Execution::Executed(answer)));
            }
            StartOutcome::ExceedsRefundable => {
                let refundable_amount = money(started.refundable)?;
                return refuse(conn, ApiError::RefundExceedsRefundable { refundable_amount }).await;
            }
            StartOutcome::KeyExists => {
                if let Some(begin) = request::existing_key::<Refunds>(engine, conn, keyed).await? {
                    return Ok(begin);
                }
            }
        }
    }
    Err(ApiError::Unavailable(anyhow::anyhow!("starting a refund kept meeting changes")))
}

/// `GET /refunds/{id}`
pub async fn get(engine: &Engine, account_id: AccountId, id: RefundId) -> Result<Refund, ApiError> {
    let mut conn = engine.pool.get().await?;
    repository::find(&mut conn, account_id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "refund", id: id.to_string() })
}

/// `GET /refunds?payment_id=&limit=&starting_after=`
pub async fn list(
    engine: &Engine,
    account_id: AccountId,
    payment_id: Option<PaymentId>,
    limit: i64,
    starting_after: Option<RefundId>,
) -> Result<(Vec<Refund>, bool), ApiError> {
    let mut conn = engine.pool.get().await?;
    Ok(repository::list(&mut conn, account_id, payment_id, limit, starting_after).await?)
}
