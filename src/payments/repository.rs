//! Payment persistence: the only code that knows the `payments` and `payment_events` tables.
//!
//! One writer per change of a payment row:
//! - [`start`] (`start_payment.sql`): phase 1, claiming the key and inserting the payment;
//! - [`lease`]: a driver takes a payment whose lease is free (a retry taking it over, or the
//!   reconciler claiming due ones), by compare-and-set;
//! - [`mark_sending`]: a driver about to re-send the charge notes when, under its lease;
//! - [`release`]: the outcome stays unknown; the driver lets go and schedules the next check;
//! - [`settle`] (`settle_payment.sql`): the terminal status, the final answer, the order, and the
//!   audit row, guarded by `status = 'processing'` so that of two settlers exactly one applies.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel::sql_types::{BigInt, Int4, Nullable, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use super::{Lease, Payment, PaymentStatus};
use crate::db::schema::payments;
use crate::idempotency::store::ClaimParameters;
use crate::ids::{AccountId, LeaseId, OrderId, PaymentId};
use crate::money::{Amount, Currency};

#[derive(Queryable, QueryableByName, Selectable)]
#[diesel(table_name = payments)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct PaymentRow {
    account_id: AccountId,
    id: PaymentId,
    order_id: OrderId,
    status: PaymentStatus,
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
    lease_until: Option<DateTime<Utc>>,
    lease_id: Option<LeaseId>,
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
        let lease = match (self.lease_id, self.lease_until) {
            (Some(id), Some(until)) => Some(Lease { id, until }),
            _ => None,
        };
        Ok(Payment {
            id: self.id,
            account_id: self.account_id,
            order_id: self.order_id,
            status: self.status,
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
            lease,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// A payment with the final answer stored for its key, once it has one.
#[derive(Debug, Clone)]
pub struct Answered {
    pub payment: Payment,
    /// `(status, body)`; the headers follow from the payment (see `representation`).
    pub answer: Option<(u16, Vec<u8>)>,
}

pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
) -> QueryResult<Option<Payment>> {
    Ok(find_answered(conn, account_id, id).await?.map(|found| found.payment))
}

/// The payment and its stored answer.
pub async fn find_answered(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
) -> QueryResult<Option<Answered>> {
    let found: Option<(PaymentRow, Option<i16>, Option<Vec<u8>>)> = payments::table
        .find((account_id, id))
        .select((PaymentRow::as_select(), payments::answer_status, payments::answer_body))
        .first(conn)
        .await
        .optional()?;
    found
        .map(|(row, status, body)| {
            let answer = match (status.and_then(|status| u16::try_from(status).ok()), body) {
                (Some(status), Some(body)) => Some((status, body)),
                _ => None,
            };
            Ok(Answered { payment: row.into_payment()?, answer })
        })
        .transpose()
}

/// The order's payment whose outcome is still unknown, if any (at most one: a unique index).
pub async fn processing_for_order(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    order_id: OrderId,
) -> QueryResult<Option<PaymentId>> {
    payments::table
        .filter(payments::account_id.eq(account_id))
        .filter(payments::order_id.eq(order_id))
        .filter(payments::status.eq(PaymentStatus::Processing))
        .select(payments::id)
        .first(conn)
        .await
        .optional()
}

crate::text_enum! {
    /// What phase 1's statement decided. Each refusal says why; nothing is inferred from a
    /// statement that wrote nothing.
    pub enum StartOutcome {
        /// The payment is inserted `processing`, leased to this request.
        Started = "started",
        /// The key existed; nothing was written.
        KeyExists = "key_exists",
        OrderNotFound = "order_not_found",
        /// The order is not `pending_payment` (paid or cancelled): a final answer.
        OrderNotPayable = "order_not_payable",
        /// Another payment of the order has an unknown outcome.
        PaymentInProgress = "payment_in_progress",
        /// The client's `amount` is not the order's total.
        AmountMismatch = "amount_mismatch",
    }
}

crate::prepared_statement! {
    /// Phase 1's one statement: the key claim, then `start_payment.sql`.
    pub struct StartPayment<'a>("../idempotency/claim_key.sql", "start_payment.sql")
        -> (Text, Nullable<Text>, Nullable<Numeric>, Nullable<Text>, Nullable<Uuid>)
    {
        group claim: ClaimParameters<'a>,
        13 => order_id: OrderId as Uuid,
        14 => amount: Option<Decimal> as Nullable<Numeric>,
        15 => payment_method: &'a str as Text,
        16 => lease_until: DateTime<Utc> as Timestamptz,
        17 => lease_id: LeaseId as Uuid,
    }
}

/// What phase 1's statement found and did.
#[derive(Debug)]
pub struct Started {
    pub outcome: StartOutcome,
    /// The order's status, total and currency, when the key was claimed and the order exists.
    pub order: Option<(String, Decimal, String)>,
    /// The order's payment in flight, for [`StartOutcome::PaymentInProgress`].
    pub in_flight: Option<PaymentId>,
}

/// Runs phase 1's statement. A second payment in flight that committed after the statement
/// began violates `payments_one_active_per_order`: see [`is_second_active_payment`].
pub async fn start(conn: &mut AsyncPgConnection, start: StartPayment<'_>) -> QueryResult<Started> {
    type Row = (StartOutcome, Option<String>, Option<Decimal>, Option<String>, Option<PaymentId>);
    let (outcome, status, total, currency, in_flight): Row = start.get_result(conn).await?;
    let order = match (status, total, currency) {
        (Some(status), Some(total), Some(currency)) => Some((status, total, currency)),
        _ => None,
    };
    Ok(Started { outcome, order, in_flight })
}

/// Whether `error` is the partial unique index refusing a second active payment for an order:
/// one committed while phase 1's statement waited for the order's lock, which its snapshot
/// could not see. Nothing was written; the statement runs again and sees it.
pub fn is_second_active_payment(error: &DbError) -> bool {
    matches!(
        error,
        DbError::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, info)
            if info.constraint_name() == Some("payments_one_active_per_order")
    )
}

/// Which payments a driver leases.
#[derive(Debug, Clone, Copy)]
pub enum LeaseTarget {
    /// This one, if nobody holds it (a retry taking an abandoned payment over).
    One(AccountId, PaymentId),
    /// Up to `limit` due ones, skipping rows other reconcilers are claiming; each counts an
    /// attempt (the reconciler's claim).
    Due { limit: i64 },
}

/// Leases `processing` payments whose lease is free (never held, released, or run out) to
/// `lease` by compare-and-set: of two drivers racing for one payment exactly one gets it (a
/// taker waits for a concurrent one's uncommitted lease, then sees it held). The payment is not
/// checked by the reconciler before the lease runs out. Returns the payments now leased.
pub async fn lease(
    conn: &mut AsyncPgConnection,
    target: LeaseTarget,
    lease: Lease,
    now: DateTime<Utc>,
) -> QueryResult<Vec<Payment>> {
    let (account_id, payment_id, limit, attempt) = match target {
        LeaseTarget::One(account_id, payment_id) => (Some(account_id), Some(payment_id), 1, 0),
        LeaseTarget::Due { limit } => (None, None, limit, 1),
    };
    let rows: Vec<PaymentRow> = diesel::sql_query(
        "UPDATE payments SET lease_until = $1, lease_id = $2, next_check_at = $1, \
             attempts = attempts + $3 \
         WHERE (account_id, id) IN ( \
             SELECT account_id, id FROM payments \
             WHERE status = 'processing' AND (lease_until IS NULL OR lease_until <= $4) \
               AND CASE WHEN $5::uuid IS NULL THEN next_check_at <= $4 \
                        ELSE account_id = $5 AND id = $6 END \
             ORDER BY next_check_at LIMIT $7 FOR UPDATE SKIP LOCKED) \
         RETURNING *",
    )
    .bind::<Timestamptz, _>(lease.until)
    .bind::<SqlUuid, _>(lease.id)
    .bind::<Int4, _>(attempt)
    .bind::<Timestamptz, _>(now)
    .bind::<Nullable<SqlUuid>, _>(account_id)
    .bind::<Nullable<SqlUuid>, _>(payment_id)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await?;
    rows.into_iter().map(PaymentRow::into_payment).collect()
}

/// Notes, under `lease`, that the charge is about to be sent again, at the database's clock.
/// Returns false (send nothing) when the payment is settled or its lease was taken over.
pub async fn mark_sending(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    lease: LeaseId,
) -> QueryResult<bool> {
    let updated = diesel::update(payments::table)
        .filter(payments::account_id.eq(payment.account_id))
        .filter(payments::id.eq(payment.id))
        .filter(payments::status.eq(PaymentStatus::Processing))
        .filter(payments::lease_id.eq(lease))
        .set(payments::last_send_at.eq(diesel::dsl::sql::<Nullable<Timestamptz>>("clock_timestamp()")))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// Leaves a `processing` payment for a check at `next_check_at`, noting why, and lets go of
/// `lease` if the caller still holds it (so that a retry may take the payment over at once).
/// Returns the payment as it now is: someone else may have settled it meanwhile.
pub async fn release(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    lease: LeaseId,
    next_check_at: DateTime<Utc>,
    last_error: &str,
    now: DateTime<Utc>,
) -> QueryResult<Option<Payment>> {
    let released: Option<PaymentRow> = diesel::update(payments::table)
        .filter(payments::account_id.eq(payment.account_id))
        .filter(payments::id.eq(payment.id))
        .filter(payments::status.eq(PaymentStatus::Processing))
        .filter(payments::lease_id.eq(lease))
        .set((
            payments::next_check_at.eq(Some(next_check_at)),
            payments::last_error.eq(Some(last_error)),
            payments::lease_until.eq(None::<DateTime<Utc>>),
            payments::lease_id.eq(None::<LeaseId>),
            payments::updated_at.eq(now),
        ))
        .returning(PaymentRow::as_returning())
        .get_result(conn)
        .await
        .optional()?;
    match released {
        Some(row) => row.into_payment().map(Some),
        None => find(conn, payment.account_id, payment.id).await,
    }
}

/// Payments with an unknown outcome that no driver holds: waiting for a retry or the reconciler
/// (the `orderpay_operations_waiting` gauge).
pub async fn count_waiting(conn: &mut AsyncPgConnection, now: DateTime<Utc>) -> QueryResult<i64> {
    payments::table
        .filter(payments::status.eq(PaymentStatus::Processing))
        .filter(payments::lease_until.is_null().or(payments::lease_until.le(now)))
        .count()
        .get_result(conn)
        .await
}

crate::prepared_statement! {
    /// Phase 2's one statement (`settle_payment.sql`).
    pub struct SettlePayment<'a>("settle_payment.sql") -> (BigInt, BigInt) {
        1 => account_id: AccountId as Uuid,
        2 => payment_id: PaymentId as Uuid,
        3 => order_id: OrderId as Uuid,
        4 => status: PaymentStatus as Text,
        5 => provider_charge_id: Option<&'a str> as Nullable<Text>,
        6 => failure_code: Option<&'a str> as Nullable<Text>,
        7 => failure_message: Option<&'a str> as Nullable<Text>,
        8 => now: DateTime<Utc> as Timestamptz,
        9 => actor: &'a str as Text,
        10 => detail: Option<&'a str> as Nullable<Text>,
        11 => answer_status: i16 as Int2,
        12 => answer_body: &'a [u8] as Bytea,
    }
}

/// Runs phase 2's statement. Returns (payments settled, orders marked paid).
pub async fn settle(conn: &mut AsyncPgConnection, settle: SettlePayment<'_>) -> QueryResult<(i64, i64)> {
    settle.get_result(conn).await
}
