//! The request flows of refunds: `POST /refunds` (start, the provider call, settle, through the
//! provider-operations engine), and reading them.

use diesel_async::AsyncPgConnection;
use rust_decimal::Decimal;

use super::repository::{self, StartOutcome, StartRefund};
use super::{Refund, RefundReason, RefundStatus};
use crate::error::ApiError;
use crate::idempotency::{KeyedRequest, Keys};
use crate::ids::{AccountId, PaymentId, RefundId};
use crate::money::Amount;
use crate::operations::refund::{Held, Refunds};
use crate::operations::request::{self, Answer, Round, Start, StartError, Started};
use crate::operations::{Engine, Kind};
use crate::payments::PaymentStatus;

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
    if let Some(amount) = command.amount {
        crate::payments::service::check_amount(engine, keyed.account_id, command.payment_id, amount).await?;
    }
    request::run(engine, keys, keyed, &RefundStart { keyed, command }, request_id).await
}

/// The start of a refund: `start_refund.sql`, claiming the key and reserving the amount.
struct RefundStart<'a> {
    keyed: &'a KeyedRequest,
    command: &'a RefundCommand,
}

impl Start for RefundStart<'_> {
    type Kind = Refunds;

    async fn run(
        &self,
        conn: &mut AsyncPgConnection,
        round: Round<'_>,
    ) -> Result<Started<Refunds>, StartError> {
        let (keyed, command) = (self.keyed, self.command);
        let account_id = keyed.account_id;
        let id = RefundId::from_uuid(round.id);
        let statement = StartRefund {
            claim: round.claim,
            payment_id: command.payment_id,
            amount: command.amount,
            reason: command.reason,
            lease_until: round.lease.until,
            lease_id: round.lease.id,
            payment_must_be: PaymentStatus::Succeeded,
        };
        let started = repository::start(conn, statement).await?;
        let currency = started.currency;
        let money = |value: Option<Decimal>| -> Result<Amount, ApiError> {
            let (value, currency) = value
                .zip(currency)
                .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no payment amounts")))?;
            // What is refundable is never negative (a CHECK constraint); clamp for the answer.
            Amount::from_decimal(value.max(Decimal::ZERO), currency)
                .map_err(|e| ApiError::Internal(anyhow::anyhow!("{e}")))
        };
        Ok(match started.outcome {
            StartOutcome::Started => {
                let order_id =
                    started.order_id.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no order")))?;
                let refund = Refund {
                    id,
                    account_id,
                    payment_id: command.payment_id,
                    order_id,
                    status: RefundStatus::Processing,
                    amount: money(started.amount)?,
                    reason: command.reason,
                    provider_refund_id: None,
                    failure_code: None,
                    failure_message: None,
                    idempotency_key: Some(keyed.key.as_str().to_owned()),
                    attempts: 0,
                    lease: Some(round.lease),
                    created_at: round.now,
                    updated_at: round.now,
                };
                let Some(held) = <Refunds as Kind>::load(conn, (account_id, round.id)).await? else {
                    return Err(ApiError::Internal(anyhow::anyhow!("a started refund vanished")).into());
                };
                Started::Drive(Held { refund, ..held })
            }
            StartOutcome::PaymentNotFound => Started::Refuse(ApiError::NotFound {
                resource: "payment",
                id: command.payment_id.to_string(),
            }),
            StartOutcome::InvalidState => {
                // A final answer about the payment's state, stored with the key.
                let current = started.payment_status.map(|status| status.to_string()).unwrap_or_default();
                let id = command.payment_id.as_uuid();
                Started::Answer(
                    ApiError::InvalidState { resource: "payment", id, current, action: "refunded" }
                        .to_stored_response(),
                )
            }
            StartOutcome::ExceedsRefundable => {
                let refundable_amount = money(started.refundable)?;
                Started::Refuse(ApiError::RefundExceedsRefundable { refundable_amount })
            }
            StartOutcome::Disputed => {
                let refundable_amount = money(started.refundable)?;
                Started::Refuse(ApiError::ChargeDisputed { refundable_amount })
            }
            StartOutcome::ExistingRefund => match started.earlier {
                Some(earlier) => Started::Resume(earlier.as_uuid()),
                None => Started::Again,
            },
            StartOutcome::Changed => Started::Again,
            StartOutcome::KeyExists => Started::ExistingKey,
        })
    }
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
