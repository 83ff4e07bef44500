//! Payment persistence: the only code that knows the `payments` and `payment_events` tables.
//!
//! One writer per change of a payment row:
//! - [`start`] (`start_payment.sql`): phase 1, claiming the key and inserting the payment;
//! - the lease, send mark and release every operation row has (`operations::leases`);
//! - [`settle`] (`settle_payment.sql`): the charge's or authorization's final outcome with the
//!   final answer, the order, and the audit row, guarded by the charge being in flight so that of
//!   two settlers exactly one applies;
//! - the capture and void statements of `authorization` move an authorized payment on; a refund
//!   reserves and settles its amount (`refunds::repository`);
//! - the reconciler's watches on authorizations and on late charges, and the end of an
//!   authorization the provider let go, are in [`super::watches`]; what an operator reads is in
//!   [`super::inspect`].

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use super::{CaptureMethod, Payment, PaymentStatus};
use crate::db::schema::{events, payments};
use crate::idempotency::store::ClaimParameters;
use crate::ids::{AccountId, LeaseId, OrderId, PaymentId};
use crate::money::{Amount, Currency};
use crate::operations::leases::Lease;
use crate::orders::OrderStatus;

#[derive(Queryable, Selectable)]
#[diesel(table_name = payments)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub(crate) struct PaymentRow {
    account_id: AccountId,
    id: PaymentId,
    order_id: OrderId,
    status: PaymentStatus,
    amount: Decimal,
    currency: Currency,
    capture_method: CaptureMethod,
    amount_captured: Decimal,
    amount_refunded: Decimal,
    amount_disputed: Decimal,
    authorization_expires_at: Option<DateTime<Utc>>,
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
    last_send_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The SQL type of a [`PaymentRow`]: the statements that return payments name its columns in
/// its order.
pub(crate) type PaymentRowSql = diesel::dsl::SqlTypeOf<diesel::dsl::AsSelect<PaymentRow, diesel::pg::Pg>>;

pub(crate) fn corrupt(what: impl Into<String>) -> DbError {
    DbError::DeserializationError(what.into().into())
}

impl PaymentRow {
    pub(crate) fn into_payment(self) -> QueryResult<Payment> {
        let currency = self.currency;
        let lease = match (self.lease_id, self.lease_until) {
            (Some(id), Some(until)) => Some(Lease { id, until }),
            _ => None,
        };
        let amount = |value: Decimal| {
            Amount::from_decimal(value, currency).map_err(|e| corrupt(format!("payment amount: {e}")))
        };
        Ok(Payment {
            id: self.id,
            account_id: self.account_id,
            order_id: self.order_id,
            status: self.status,
            amount: amount(self.amount)?,
            capture_method: self.capture_method,
            amount_captured: amount(self.amount_captured)?,
            amount_refunded: amount(self.amount_refunded)?,
            amount_disputed: amount(self.amount_disputed)?,
            authorization_expires_at: self.authorization_expires_at,
            payment_method: self.payment_method,
            provider_charge_id: self.provider_charge_id,
            failure_code: self.failure_code,
            failure_message: self.failure_message,
            idempotency_key: self.idempotency_key,
            attempts: self.attempts,
            next_check_at: self.next_check_at,
            last_error: self.last_error,
            lease,
            last_send_at: self.last_send_at,
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
    let found: Option<PaymentRow> = payments::table
        .find((account_id, id))
        .select(PaymentRow::as_select())
        .first(conn)
        .await
        .optional()?;
    found.map(PaymentRow::into_payment).transpose()
}

/// A payment's row, its answer's status, the body on the row and the data of the event it names.
type AnsweredRow = (PaymentRow, Option<i16>, Option<Vec<u8>>, Option<Vec<u8>>);

/// The payment and its stored answer: the body on its row, or the data of the event the row
/// names (one statement: the event by its primary key).
pub async fn find_answered(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
) -> QueryResult<Option<Answered>> {
    let answering_event = events::table.on(events::account_id
        .eq(payments::account_id)
        .and(events::id.nullable().eq(payments::answer_event_id)));
    let found: Option<AnsweredRow> = payments::table
        .left_join(answering_event)
        .filter(payments::account_id.eq(account_id))
        .filter(payments::id.eq(id))
        .select((
            PaymentRow::as_select(),
            payments::answer_status,
            payments::answer_body,
            events::data.nullable(),
        ))
        .first(conn)
        .await
        .optional()?;
    found
        .map(|(row, status, body, event_data)| {
            let answer = match (status.and_then(|status| u16::try_from(status).ok()), body.or(event_data)) {
                (Some(status), Some(body)) => Some((status, body)),
                _ => None,
            };
            Ok(Answered { payment: row.into_payment()?, answer })
        })
        .transpose()
}

/// The account a payment belongs to, found by its id alone (`payments_by_id`): a provider's
/// webhook names the payment by the downstream key, which carries only the id.
pub async fn account_of(conn: &mut AsyncPgConnection, id: PaymentId) -> QueryResult<Option<AccountId>> {
    payments::table.filter(payments::id.eq(id)).select(payments::account_id).first(conn).await.optional()
}

/// A page of the account's payments (of one order, in one status, when given), newest first
/// (ids are UUIDv7), strictly older than `starting_after` when given; and whether more follow.
pub async fn list(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    order_id: Option<OrderId>,
    status: Option<PaymentStatus>,
    limit: i64,
    starting_after: Option<PaymentId>,
) -> QueryResult<(Vec<Payment>, bool)> {
    let mut query = payments::table.filter(payments::account_id.eq(account_id)).into_boxed();
    if let Some(order_id) = order_id {
        query = query.filter(payments::order_id.eq(order_id));
    }
    if let Some(status) = status {
        query = query.filter(payments::status.eq(status));
    }
    if let Some(cursor) = starting_after {
        query = query.filter(payments::id.lt(cursor));
    }
    let rows: Vec<PaymentRow> =
        query.order(payments::id.desc()).limit(limit + 1).select(PaymentRow::as_select()).load(conn).await?;
    let (rows, has_more) = crate::db::page_of(rows, limit);
    let payments = rows.into_iter().map(PaymentRow::into_payment).collect::<QueryResult<Vec<_>>>()?;
    Ok((payments, has_more))
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
        /// The order's total is zero: no charge of zero ever reaches the provider.
        NothingToPay = "nothing_to_pay",
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
        18 => capture_method: CaptureMethod as Text,
    }
}

/// The currency of a payment; `None` when the account has no such payment.
pub async fn currency_of(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    payment_id: PaymentId,
) -> QueryResult<Option<Currency>> {
    payments::table.find((account_id, payment_id)).select(payments::currency).first(conn).await.optional()
}

/// What phase 1's statement found and did.
#[derive(Debug)]
pub struct Started {
    pub outcome: StartOutcome,
    /// The order's status, total and currency, when the key was claimed and the order exists.
    pub order: Option<(OrderStatus, Decimal, Currency)>,
    /// The order's payment in flight, for [`StartOutcome::PaymentInProgress`].
    pub in_flight: Option<PaymentId>,
}

/// Runs phase 1's statement. A second payment in flight that committed after the statement
/// began violates `payments_one_active_per_order`: see [`is_second_active_payment`].
pub async fn start(conn: &mut AsyncPgConnection, start: StartPayment<'_>) -> QueryResult<Started> {
    type Row = (StartOutcome, Option<OrderStatus>, Option<Decimal>, Option<Currency>, Option<PaymentId>);
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

crate::prepared_statement! {
    /// A payment's charge or authorization settled (`settle_payment.sql`).
    pub struct SettlePayment<'a>("settle_payment.sql") -> (BigInt, BigInt) {
        group announce: crate::events::Announce<'a>,
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
        13 => amount_captured: Decimal as Numeric,
        14 => authorization_expires_at: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        15 => next_check_at: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        16 => order_status: Option<crate::orders::OrderStatus> as Nullable<Text>,
        17 => quiet_since: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        18 => late_watch_until: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        19 => quiet_lease: Option<LeaseId> as Nullable<Uuid>,
    }
}

/// Runs a settle statement. Returns (payments settled, orders moved).
pub async fn settle(conn: &mut AsyncPgConnection, settle: SettlePayment<'_>) -> QueryResult<(i64, i64)> {
    settle.get_result(conn).await
}

/// A payment's money as read under its row lock, for a transaction that decides from it.
#[derive(Debug, Clone, Copy)]
pub struct LockedAmounts {
    pub status: PaymentStatus,
    pub amount_captured: Decimal,
    pub amount_refunded: Decimal,
    pub amount_refunding: Decimal,
    /// Withdrawn by disputes and not reinstated: not refundable.
    pub amount_disputed: Decimal,
    /// A charge that landed after the payment failed (refunded by the system).
    pub late_charge_amount: Option<Decimal>,
}

/// Locks a payment (`FOR UPDATE`: after its order, in the lock order) and reads its money.
pub async fn lock_amounts(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
) -> QueryResult<Option<LockedAmounts>> {
    type Row = (PaymentStatus, Decimal, Decimal, Decimal, Decimal, Option<Decimal>);
    let row: Option<Row> = payments::table
        .find((account_id, id))
        .select((
            payments::status,
            payments::amount_captured,
            payments::amount_refunded,
            payments::amount_refunding,
            payments::amount_disputed,
            payments::late_charge_amount,
        ))
        .for_update()
        .first(conn)
        .await
        .optional()?;
    Ok(row.map(
        |(
            status,
            amount_captured,
            amount_refunded,
            amount_refunding,
            amount_disputed,
            late_charge_amount,
        )| {
            LockedAmounts {
                status,
                amount_captured,
                amount_refunded,
                amount_refunding,
                amount_disputed,
                late_charge_amount,
            }
        },
    ))
}
