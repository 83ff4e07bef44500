//! Payment persistence: the only code that knows the `payments` and `payment_events` tables.
//!
//! Every status change is a guarded UPDATE (`WHERE status = 'processing'`) that records its
//! transition in `payment_events` in the same transaction: of two workers racing on one payment,
//! exactly one applies the transition and the other sees the result.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::{Actor, Payment, PaymentStatus, Settlement};
use crate::db::schema::{idempotency_keys, payment_events, payments};
use crate::money::{Amount, Currency};

#[derive(Queryable, QueryableByName, Selectable, Insertable)]
#[diesel(table_name = payments)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct PaymentRow {
    account_id: Uuid,
    id: Uuid,
    order_id: Uuid,
    status: String,
    amount: Decimal,
    currency: String,
    payment_method: String,
    provider_charge_id: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    idempotency_key: Option<String>,
    attempts: i32,
    next_check_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn corrupt(what: impl Into<String>) -> DbError {
    DbError::DeserializationError(what.into().into())
}

impl PaymentRow {
    fn into_payment(self) -> QueryResult<Payment> {
        let currency =
            Currency::parse(&self.currency).map_err(|e| corrupt(format!("payment currency: {e}")))?;
        Ok(Payment {
            id: self.id,
            account_id: self.account_id,
            order_id: self.order_id,
            status: PaymentStatus::parse(&self.status).ok_or_else(|| corrupt("payment status"))?,
            amount: Amount::from_decimal(self.amount, currency)
                .map_err(|e| corrupt(format!("payment amount: {e}")))?,
            payment_method: self.payment_method,
            provider_charge_id: self.provider_charge_id,
            failure_code: self.failure_code,
            failure_message: self.failure_message,
            idempotency_key: self.idempotency_key,
            attempts: self.attempts,
            next_check_at: self.next_check_at,
            last_error: self.last_error,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    fn of(payment: &Payment) -> PaymentRow {
        PaymentRow {
            account_id: payment.account_id,
            id: payment.id,
            order_id: payment.order_id,
            status: payment.status.as_str().to_owned(),
            amount: payment.amount.value(),
            currency: payment.amount.currency().code().to_owned(),
            payment_method: payment.payment_method.clone(),
            provider_charge_id: payment.provider_charge_id.clone(),
            failure_code: payment.failure_code.clone(),
            failure_message: payment.failure_message.clone(),
            idempotency_key: payment.idempotency_key.clone(),
            attempts: payment.attempts,
            next_check_at: payment.next_check_at,
            last_error: payment.last_error.clone(),
            created_at: payment.created_at,
            updated_at: payment.updated_at,
        }
    }
}

pub async fn insert(conn: &mut AsyncPgConnection, payment: &Payment) -> QueryResult<()> {
    diesel::insert_into(payments::table).values(PaymentRow::of(payment)).execute(conn).await?;
    Ok(())
}

pub async fn find(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<Payment>> {
    payments::table
        .find((account_id, id))
        .select(PaymentRow::as_select())
        .first(conn)
        .await
        .optional()?
        .map(PaymentRow::into_payment)
        .transpose()
}

/// The order's payment whose outcome is still unknown, if any (at most one: a unique index).
pub async fn processing_for_order(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    order_id: Uuid,
) -> QueryResult<Option<Uuid>> {
    payments::table
        .filter(payments::account_id.eq(account_id))
        .filter(payments::order_id.eq(order_id))
        .filter(payments::status.eq(PaymentStatus::Processing.as_str()))
        .select(payments::id)
        .first(conn)
        .await
        .optional()
}

/// Moves a `processing` payment to its terminal state and records the transition. Returns the
/// updated payment, or `None` when the payment was no longer `processing` (someone else settled
/// it first; nothing was changed).
pub async fn finish(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    id: Uuid,
    settlement: &Settlement,
    actor: Actor,
    now: DateTime<Utc>,
) -> QueryResult<Option<Payment>> {
    let (charge_id, failure_code, failure_message) = match settlement {
        Settlement::Succeeded { charge_id } => (Some(charge_id.as_str()), None, None),
        Settlement::Failed { code, message } => (None, Some(code.as_str()), Some(message.as_str())),
    };
    let updated: Option<PaymentRow> = diesel::update(payments::table)
        .filter(payments::account_id.eq(account_id))
        .filter(payments::id.eq(id))
        .filter(payments::status.eq(PaymentStatus::Processing.as_str()))
        .set((
            payments::status.eq(settlement.status().as_str()),
            payments::provider_charge_id.eq(charge_id),
            payments::failure_code.eq(failure_code),
            payments::failure_message.eq(failure_message),
            payments::next_check_at.eq(None::<DateTime<Utc>>),
            payments::updated_at.eq(now),
        ))
        .returning(PaymentRow::as_returning())
        .get_result(conn)
        .await
        .optional()?;
    let Some(row) = updated else { return Ok(None) };
    diesel::insert_into(payment_events::table)
        .values((
            payment_events::account_id.eq(account_id),
            payment_events::payment_id.eq(id),
            payment_events::from_status.eq(PaymentStatus::Processing.as_str()),
            payment_events::to_status.eq(settlement.status().as_str()),
            payment_events::actor.eq(actor.as_str()),
            payment_events::detail.eq(failure_message.or(charge_id)),
            payment_events::at.eq(now),
        ))
        .execute(conn)
        .await?;
    row.into_payment().map(Some)
}

/// Leaves a `processing` payment for a later check at `next_check_at`, noting why.
pub async fn reschedule(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    id: Uuid,
    next_check_at: DateTime<Utc>,
    last_error: &str,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    let updated = diesel::update(payments::table)
        .filter(payments::account_id.eq(account_id))
        .filter(payments::id.eq(id))
        .filter(payments::status.eq(PaymentStatus::Processing.as_str()))
        .set((
            payments::next_check_at.eq(Some(next_check_at)),
            payments::last_error.eq(Some(last_error)),
            payments::updated_at.eq(now),
        ))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// The reconciler's claim: up to `limit` `processing` payments that are due and whose
/// idempotency key is not leased by a live request, skipping rows another reconciler holds
/// (`FOR UPDATE SKIP LOCKED`). Each claimed payment counts an attempt and is hidden from other
/// reconcilers until `claimed_until`; its key is leased until then too, so a client retry meanwhile
/// gets 409 `idempotency-key-in-use` instead of racing the reconciler.
pub async fn claim_due(
    conn: &mut AsyncPgConnection,
    now: DateTime<Utc>,
    limit: i64,
    claimed_until: DateTime<Utc>,
) -> QueryResult<Vec<Payment>> {
    let rows: Vec<PaymentRow> = diesel::sql_query(
        "WITH due AS ( \
             SELECT p.account_id, p.id FROM payments p \
             WHERE p.status = 'processing' AND p.next_check_at <= $1 \
               AND NOT EXISTS ( \
                   SELECT 1 FROM idempotency_keys k \
                   WHERE k.account_id = p.account_id AND k.key = p.idempotency_key \
                     AND k.locked_until > $1) \
             ORDER BY p.next_check_at \
             LIMIT $2 \
             FOR UPDATE OF p SKIP LOCKED) \
         UPDATE payments p SET next_check_at = $3, attempts = p.attempts + 1 \
         FROM due WHERE p.account_id = due.account_id AND p.id = due.id \
         RETURNING p.*",
    )
    .bind::<diesel::sql_types::Timestamptz, _>(now)
    .bind::<diesel::sql_types::BigInt, _>(limit)
    .bind::<diesel::sql_types::Timestamptz, _>(claimed_until)
    .load(conn)
    .await?;
    let payments = rows.into_iter().map(PaymentRow::into_payment).collect::<QueryResult<Vec<_>>>()?;
    for payment in &payments {
        if let Some(key) = &payment.idempotency_key {
            diesel::update(idempotency_keys::table)
                .filter(idempotency_keys::account_id.eq(payment.account_id))
                .filter(idempotency_keys::key.eq(key))
                .filter(idempotency_keys::state.eq("in_progress"))
                .filter(idempotency_keys::locked_until.is_null().or(idempotency_keys::locked_until.le(now)))
                .set(idempotency_keys::locked_until.eq(Some(claimed_until)))
                .execute(conn)
                .await?;
        }
    }
    Ok(payments)
}
