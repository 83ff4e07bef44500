//! The request flows of payments (docs/payments.md): `POST /payments` (phase 1, the provider
//! call, phase 2), and the capture and void of an authorization.
//!
//! Each starts its operation in one statement (claiming the key with it) and hands the rest to
//! the provider-operations engine (`operations::request`): the provider call outside any
//! transaction with the operation's downstream key, then its settle in one statement, or, when
//! the outcome is unknown, 202 and a retry (taking the operation over) or the reconciler
//! finishes it.

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use rust_decimal::Decimal;

use super::authorization::{self, Action, ActionStatus, PaymentOperation, StartAction};
use super::repository::{self, StartOutcome, StartPayment};
use super::representation::AUTHORIZATION_EXPIRED;
use super::{CaptureMethod, Payment, PaymentMethod, PaymentStatus};
use crate::error::{ApiError, FieldError};
use crate::idempotency::{KeyedRequest, Keys, StoredResponse};
use crate::ids::{AccountId, OperationId, OrderId, PaymentId};
use crate::money::Amount;
use crate::operations::authorization::{Actions, Held};
use crate::operations::charge::Charges;
use crate::operations::leases::Lease;
use crate::operations::request::{self, Answer, Round, Start, StartError, Started};
use crate::operations::{Engine, Kind};

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
    request::run(engine, keys, keyed, &PayStart { keyed, command }, request_id).await
}

/// Phase 1 of a payment: `start_payment.sql`, claiming the key with it.
struct PayStart<'a> {
    keyed: &'a KeyedRequest,
    command: &'a PayCommand,
}

impl Start for PayStart<'_> {
    type Kind = Charges;

    async fn run(
        &self,
        conn: &mut AsyncPgConnection,
        round: Round<'_>,
    ) -> Result<Started<Charges>, StartError> {
        let (keyed, command) = (self.keyed, self.command);
        let payment_id = PaymentId::from_uuid(round.id);
        let statement = StartPayment {
            claim: round.claim,
            order_id: command.order_id,
            amount: command.amount,
            payment_method: command.payment_method.as_str(),
            lease_until: round.lease.until,
            lease_id: round.lease.id,
            capture_method: command.capture_method,
        };
        let started = match repository::start(conn, statement).await {
            Ok(started) => started,
            // A payment committed while the statement waited for the order's lock; nothing was
            // written. The next round sees it.
            Err(error) if repository::is_second_active_payment(&error) => return Ok(Started::Again),
            Err(error) => return Err(error.into()),
        };
        Ok(match started.outcome {
            StartOutcome::Started => {
                let total = order_total(&started)?;
                Started::Drive(new_payment(payment_id, keyed, command, total, round.now, round.lease))
            }
            StartOutcome::OrderNotPayable => {
                let current = started.order.map_or_else(String::new, |(status, _, _)| status.to_string());
                Started::Answer(not_payable(command.order_id, current))
            }
            StartOutcome::OrderNotFound => {
                Started::Refuse(ApiError::NotFound { resource: "order", id: command.order_id.to_string() })
            }
            StartOutcome::PaymentInProgress => match started.in_flight {
                Some(payment_id) => {
                    Started::Refuse(ApiError::PaymentInProgress { order_id: command.order_id, payment_id })
                }
                None => Started::Again,
            },
            StartOutcome::AmountMismatch => Started::Refuse(amount_mismatch(&order_total(&started)?)),
            StartOutcome::NothingToPay => {
                let total = order_total(&started)?;
                let message = format!("the order's total_amount is {total}: there is nothing to pay");
                Started::Refuse(ApiError::Validation(vec![FieldError::new("order_id", message)]))
            }
            StartOutcome::KeyExists => Started::ExistingKey,
        })
    }
}

/// The order's total as phase 1 read it.
fn order_total(started: &repository::Started) -> Result<Amount, ApiError> {
    let (_, total, currency) = started
        .order
        .as_ref()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("phase 1 returned no order")))?;
    Amount::from_decimal(*total, *currency)
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
        amount_disputed: Amount::zero(amount.currency()),
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
        // The statement noted the send at the database's clock, a moment after `now`.
        last_send_at: Some(now),
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
    request::run(engine, keys, keyed, &ActStart { keyed, command }, request_id).await
}

/// The start of a capture or void: `start_capture_or_void.sql`, claiming the key with it.
struct ActStart<'a> {
    keyed: &'a KeyedRequest,
    command: &'a ActionCommand,
}

impl Start for ActStart<'_> {
    type Kind = Actions;

    async fn run(
        &self,
        conn: &mut AsyncPgConnection,
        round: Round<'_>,
    ) -> Result<Started<Actions>, StartError> {
        let (keyed, command) = (self.keyed, self.command);
        let account_id = keyed.account_id;
        let id = OperationId::from_uuid(round.id);
        let statement = StartAction {
            claim: round.claim,
            payment_id: command.payment_id,
            kind: command.action,
            amount: command.amount,
            lease_until: round.lease.until,
            lease_id: round.lease.id,
        };
        let (outcome, status, authorized, failure_code) = match authorization::start(conn, statement).await {
            Ok(started) => started,
            // Another capture or void of this payment committed meanwhile: the next round sees it.
            Err(error) if is_second_action(&error) => return Ok(Started::Again),
            Err(error) => return Err(error.into()),
        };
        Ok(match outcome {
            authorization::StartOutcome::Started => {
                let Some(payment) = repository::find(conn, account_id, command.payment_id).await? else {
                    let error = anyhow::anyhow!("a started {} lost its payment", command.action);
                    return Err(ApiError::Internal(error).into());
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
                    idempotency_key: Some(keyed.key.as_str().to_owned()),
                    attempts: 0,
                    lease_until: Some(round.lease.until),
                    lease_id: Some(round.lease.id),
                    created_at: round.now,
                };
                Started::Drive(Held { operation, payment })
            }
            authorization::StartOutcome::PaymentNotFound => Started::Refuse(ApiError::NotFound {
                resource: "payment",
                id: command.payment_id.to_string(),
            }),
            // An authorization that expired answers the same whoever noticed first: the reconciler
            // (the payment is `canceled` already) or this capture's own provider call.
            authorization::StartOutcome::InvalidState
                if status == Some(PaymentStatus::Canceled)
                    && failure_code.as_deref() == Some(AUTHORIZATION_EXPIRED) =>
            {
                let expired = ApiError::AuthorizationExpired { payment_id: command.payment_id };
                Started::Answer(expired.to_stored_response())
            }
            authorization::StartOutcome::InvalidState => {
                // A final answer about the payment's state, stored with the key.
                let current = status.map(|status| status.to_string()).unwrap_or_default();
                let action = match command.action {
                    Action::Capture => "captured",
                    Action::Void => "voided",
                };
                let id = command.payment_id.as_uuid();
                Started::Answer(
                    ApiError::InvalidState { resource: "payment", id, current, action }.to_stored_response(),
                )
            }
            authorization::StartOutcome::ExceedsCapturable => {
                let payment = repository::find(conn, account_id, command.payment_id).await?;
                let capturable_amount = match (payment, authorized) {
                    (Some(payment), Some(amount)) => Amount::from_decimal(amount, payment.currency())
                        .map_err(|e| ApiError::Internal(anyhow::anyhow!("authorized amount: {e}")))?,
                    _ => {
                        let error = anyhow::anyhow!("a capture without its payment");
                        return Err(ApiError::Internal(error).into());
                    }
                };
                Started::Refuse(ApiError::CaptureExceedsCapturable { capturable_amount })
            }
            authorization::StartOutcome::Changed => Started::Again,
            authorization::StartOutcome::KeyExists => Started::ExistingKey,
        })
    }
}

/// Whether `error` is the unique index refusing a second capture or void in flight for a payment.
fn is_second_action(error: &diesel::result::Error) -> bool {
    matches!(
        error,
        diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, info)
            if info.constraint_name() == Some("payment_operations_one_in_flight")
    )
}

/// An amount of a payment's money (a partial capture's, a refund's), checked before anything
/// is written (`http::payments::written_amount` has refused zero): no finer than the payment's
/// currency's minor unit, and one the provider can take (Stripe: a whole number of its minor
/// units; else the operation could only end in the reconciler's give-up). 422 `validation-failed` on `amount` otherwise, nothing
/// stored, no call. An unknown payment passes: its start statement answers 404.
pub async fn check_amount(
    engine: &Engine,
    account_id: AccountId,
    payment_id: PaymentId,
    amount: Decimal,
) -> Result<(), ApiError> {
    let mut conn = engine.pool.get().await?;
    let Some(currency) = repository::currency_of(&mut conn, account_id, payment_id).await? else {
        return Ok(());
    };
    let invalid = |message: String| ApiError::Validation(vec![FieldError::new("amount", message)]);
    let amount = Amount::from_decimal(amount, currency).map_err(|error| invalid(error.to_string()))?;
    match engine.provider.amount_refusal(&amount) {
        Some(refusal) => Err(invalid(refusal)),
        None => Ok(()),
    }
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
