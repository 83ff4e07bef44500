//! Refund persistence: the only code that knows the `refunds` table.
//!
//! One writer per change of a refund row: [`start`] (`start_refund.sql`: the key claim, the
//! reservation on the payment, the refund), the lease, send mark and release every operation
//! row has (`operations::leases`), and [`settle`] (`settle_refund.sql`: the outcome with its
//! final answer, the payment's amounts, the order, the audit row).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use super::{Refund, RefundReason, RefundStatus};
use crate::db::schema::{payments, refunds};
use crate::idempotency::store::ClaimParameters;
use crate::ids::{AccountId, EventId, LeaseId, OrderId, PaymentId, RefundId};
use crate::money::{Amount, Currency};
use crate::operations::leases::Lease;
use crate::orders::OrderStatus;
use crate::payments::PaymentStatus;

#[derive(Queryable, Selectable)]
#[diesel(table_name = refunds)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub(crate) struct RefundRow {
    account_id: AccountId,
    id: RefundId,
    payment_id: PaymentId,
    order_id: OrderId,
    status: RefundStatus,
    amount: Decimal,
    currency: Currency,
    reason: Option<RefundReason>,
    provider_refund_id: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    idempotency_key: Option<String>,
    attempts: i32,
    lease_until: Option<DateTime<Utc>>,
    lease_id: Option<LeaseId>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn corrupt(what: impl Into<String>) -> DbError {
    DbError::DeserializationError(what.into().into())
}

impl RefundRow {
    fn into_refund(self) -> QueryResult<Refund> {
        let currency = self.currency;
        let lease = match (self.lease_id, self.lease_until) {
            (Some(id), Some(until)) => Some(Lease { id, until }),
            _ => None,
        };
        Ok(Refund {
            id: self.id,
            account_id: self.account_id,
            payment_id: self.payment_id,
            order_id: self.order_id,
            status: self.status,
            amount: Amount::from_decimal(self.amount, currency)
                .map_err(|e| corrupt(format!("refund amount: {e}")))?,
            reason: self.reason,
            provider_refund_id: self.provider_refund_id,
            failure_code: self.failure_code,
            failure_message: self.failure_message,
            idempotency_key: self.idempotency_key,
            attempts: self.attempts,
            lease,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: RefundId,
) -> QueryResult<Option<Refund>> {
    refunds::table
        .find((account_id, id))
        .select(RefundRow::as_select())
        .first(conn)
        .await
        .optional()?
        .map(RefundRow::into_refund)
        .transpose()
}

/// The account a refund belongs to, found by its id alone (`refunds_by_id`): a provider's
/// webhook names the refund by the downstream key, which carries only the id.
pub async fn account_of(conn: &mut AsyncPgConnection, id: RefundId) -> QueryResult<Option<AccountId>> {
    refunds::table.filter(refunds::id.eq(id)).select(refunds::account_id).first(conn).await.optional()
}

/// A refund with the provider's id of the charge it gives money back on: two primary-key
/// lookups. As one join, the prepared statement's generic plan (the account a parameter, and
/// one account holding every payment) could hash-join a scan of the account's payments; the
/// bench saw 160 buffers read per call.
pub async fn find_with_charge(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: RefundId,
) -> QueryResult<Option<(Refund, Option<String>)>> {
    let Some(refund) = find(conn, account_id, id).await? else {
        return Ok(None);
    };
    let charge_id: Option<String> = payments::table
        .find((account_id, refund.payment_id))
        .select(payments::provider_charge_id)
        .first(conn)
        .await?;
    Ok(Some((refund, charge_id)))
}

/// A page of the account's refunds (of one payment, when given), newest first, strictly older
/// than `starting_after` when given. Returns the page and whether more follow.
pub async fn list(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    payment_id: Option<PaymentId>,
    limit: i64,
    starting_after: Option<RefundId>,
) -> QueryResult<(Vec<Refund>, bool)> {
    let mut query = refunds::table.filter(refunds::account_id.eq(account_id)).into_boxed();
    if let Some(payment_id) = payment_id {
        query = query.filter(refunds::payment_id.eq(payment_id));
    }
    if let Some(cursor) = starting_after {
        query = query.filter(refunds::id.lt(cursor));
    }
    let mut rows: Vec<RefundRow> =
        query.order(refunds::id.desc()).limit(limit + 1).select(RefundRow::as_select()).load(conn).await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let refunds = rows.into_iter().map(RefundRow::into_refund).collect::<QueryResult<Vec<_>>>()?;
    Ok((refunds, has_more))
}

crate::text_enum! {
    /// What the statement that starts a refund decided.
    pub enum StartOutcome {
        Started = "started",
        KeyExists = "key_exists",
        PaymentNotFound = "payment_not_found",
        /// The payment has not succeeded (still processing, failed, authorized only...).
        InvalidState = "invalid_state",
        /// The amount is more than what is still refundable (or nothing is).
        ExceedsRefundable = "exceeds_refundable",
        /// As `ExceedsRefundable`, while a dispute of the payment is open (its money withdrawn,
        /// or perhaps about to be).
        Disputed = "disputed",
        /// The key started a refund of this payment before (it has since expired): that refund
        /// is the answer; nothing was started.
        ExistingRefund = "existing_refund",
        /// The payment changed while the statement waited for its lock: nothing of the refund
        /// was written; run the statement again.
        Changed = "changed",
    }
}

crate::prepared_statement! {
    /// A refund started (`start_refund.sql` after the key claim).
    pub struct StartRefund<'a>("../idempotency/claim_key.sql", "start_refund.sql")
        -> (Text, Nullable<Text>, Nullable<Numeric>, Nullable<Numeric>, Nullable<Text>, Nullable<Uuid>,
            Nullable<Uuid>)
    {
        group claim: ClaimParameters<'a>,
        13 => payment_id: PaymentId as Uuid,
        14 => amount: Option<Decimal> as Nullable<Numeric>,
        15 => reason: Option<RefundReason> as Nullable<Text>,
        16 => lease_until: DateTime<Utc> as Timestamptz,
        17 => lease_id: LeaseId as Uuid,
        18 => payment_must_be: PaymentStatus as Text,
    }
}

/// What the start statement decided.
#[derive(Debug)]
pub struct Started {
    pub outcome: StartOutcome,
    pub payment_status: Option<PaymentStatus>,
    pub refundable: Option<Decimal>,
    pub amount: Option<Decimal>,
    pub currency: Option<Currency>,
    pub order_id: Option<OrderId>,
    /// For [`StartOutcome::ExistingRefund`]: the refund the key started before.
    pub earlier: Option<RefundId>,
}

pub async fn start(conn: &mut AsyncPgConnection, start: StartRefund<'_>) -> QueryResult<Started> {
    type Row = (
        StartOutcome,
        Option<PaymentStatus>,
        Option<Decimal>,
        Option<Decimal>,
        Option<Currency>,
        Option<OrderId>,
        Option<RefundId>,
    );
    let (outcome, payment_status, refundable, amount, currency, order_id, earlier): Row =
        start.get_result(conn).await?;
    Ok(Started { outcome, payment_status, refundable, amount, currency, order_id, earlier })
}

crate::prepared_statement! {
    /// A refund settled (`settle_refund.sql`).
    pub struct SettleRefund<'a>("settle_refund.sql") -> (BigInt, Nullable<Text>) {
        group announce: crate::events::Announce<'a>,
        1 => account_id: AccountId as Uuid,
        2 => refund_id: RefundId as Uuid,
        3 => order_id: OrderId as Uuid,
        4 => payment_id: PaymentId as Uuid,
        5 => status: RefundStatus as Text,
        6 => provider_refund_id: Option<&'a str> as Nullable<Text>,
        7 => failure_code: Option<&'a str> as Nullable<Text>,
        8 => failure_message: Option<&'a str> as Nullable<Text>,
        9 => now: DateTime<Utc> as Timestamptz,
        10 => actor: &'a str as Text,
        11 => detail: Option<&'a str> as Nullable<Text>,
        12 => answer_status: i16 as Int2,
        13 => answer_body: &'a [u8] as Bytea,
        14 => moves_order: bool as Bool,
        15 => quiet_since: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        16 => order_event_id: EventId as Uuid,
        17 => order_partially_refunded: Option<&'a [u8]> as Nullable<Bytea>,
        18 => order_refunded: Option<&'a [u8]> as Nullable<Bytea>,
        19 => late_watch_until: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        20 => next_check_at: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        21 => follow_up_at: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        22 => quiet_lease: Option<LeaseId> as Nullable<Uuid>,
    }
}

/// Runs the settle statement. Returns (refunds settled, the order's new status if it moved).
pub async fn settle(
    conn: &mut AsyncPgConnection,
    settle: SettleRefund<'_>,
) -> QueryResult<(i64, Option<OrderStatus>)> {
    settle.get_result(conn).await
}

/// A refund given up on, due for a look by the late-refund watch.
#[derive(Debug, Clone)]
pub struct Watched {
    pub refund: Refund,
    /// Until when it is watched.
    pub watch_until: DateTime<Utc>,
    /// Looks made, this one included (the watch's backoff).
    pub attempts: i32,
}

/// The late-refund watch's claim: up to `limit` refunds given up on that are due for a look,
/// skipping rows another reconciler is claiming, hidden from the others until `claimed_until`.
/// Each look counts an attempt. Each row is read on its own: one this version cannot make
/// sense of is an error for that refund, not for the batch.
pub async fn watch_late(
    conn: &mut AsyncPgConnection,
    now: DateTime<Utc>,
    limit: i64,
    claimed_until: DateTime<Utc>,
) -> QueryResult<Vec<QueryResult<Watched>>> {
    let rows: Vec<(RefundRow, DateTime<Utc>)> =
        WatchLateRefunds { now: &now, limit, claimed_until }.load(conn).await?;
    Ok(rows
        .into_iter()
        .map(|(row, watch_until)| {
            let attempts = row.attempts;
            Ok(Watched { refund: row.into_refund()?, watch_until, attempts })
        })
        .collect())
}

crate::prepared_statement! {
    /// The late-refund watch's claim (`watch_late_refunds.sql`).
    pub(crate) struct WatchLateRefunds<'a>("watch_late_refunds.sql")
        -> (diesel::dsl::SqlTypeOf<diesel::dsl::AsSelect<RefundRow, diesel::pg::Pg>>, Timestamptz)
    {
        1 => now: &'a DateTime<Utc> as Timestamptz,
        2 => limit: i64 as BigInt,
        3 => claimed_until: DateTime<Utc> as Timestamptz,
    }
}

/// Schedules the late-refund watch's next look at a refund given up on (`None`: the watch
/// ends). Guarded by the refund still being failed.
pub async fn watch_late_again(
    conn: &mut AsyncPgConnection,
    refund: &Refund,
    next_check_at: Option<DateTime<Utc>>,
) -> QueryResult<()> {
    diesel::update(refunds::table)
        .filter(refunds::account_id.eq(refund.account_id))
        .filter(refunds::id.eq(refund.id))
        .filter(refunds::status.eq(RefundStatus::Failed))
        .set(refunds::next_check_at.eq(next_check_at))
        .execute(conn)
        .await?;
    Ok(())
}

/// Brings the late-refund watch's next look at a refund given up on forward to `now` (a provider
/// webhook reports it failed: a lookup on its way may be stale). Returns whether it is watched.
/// A watch that has ended (no next look) stays ended: no lookup of it is on its way, and the
/// webhook agrees with what we hold.
pub async fn look_again(
    conn: &mut AsyncPgConnection,
    refund: &Refund,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    let moved = diesel::update(refunds::table)
        .filter(refunds::account_id.eq(refund.account_id))
        .filter(refunds::id.eq(refund.id))
        .filter(refunds::status.eq(RefundStatus::Failed))
        .filter(refunds::late_watch_until.is_not_null())
        .filter(refunds::next_check_at.is_not_null())
        .set(refunds::next_check_at.eq(Some(now)))
        .execute(conn)
        .await?;
    Ok(moved == 1)
}

/// Notes that the late-refund watch found the provider holding no refund for a refund given up
/// on (or a failed one): it is known not carried out so far. Returns whether this is the first
/// time (then the system may start another refund of a late charge).
pub async fn note_absent(
    conn: &mut AsyncPgConnection,
    refund: &Refund,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    let noted = diesel::update(refunds::table)
        .filter(refunds::account_id.eq(refund.account_id))
        .filter(refunds::id.eq(refund.id))
        .filter(refunds::status.eq(RefundStatus::Failed))
        .filter(refunds::absent_since.is_null())
        .set(refunds::absent_since.eq(Some(now)))
        .execute(conn)
        .await?;
    Ok(noted == 1)
}

/// What the system's refunds of a failed payment's late charge say about starting another:
/// how many there were, and the latest one.
#[derive(Debug, Clone, Default)]
pub struct SystemRefunds {
    pub count: i64,
    pub latest: Option<LatestSystemRefund>,
}

#[derive(Debug, Clone)]
pub struct LatestSystemRefund {
    pub id: RefundId,
    pub status: RefundStatus,
    pub failure_code: Option<String>,
    /// Still watched for the provider carrying it out late.
    pub watched: bool,
    /// When the late-refund watch found the provider holding no refund for it.
    pub absent_since: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// The system's refunds (no client key) of a payment.
pub async fn system_refunds(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    payment_id: PaymentId,
) -> QueryResult<SystemRefunds> {
    type Row =
        (RefundId, RefundStatus, Option<String>, Option<DateTime<Utc>>, Option<DateTime<Utc>>, DateTime<Utc>);
    let rows: Vec<Row> = refunds::table
        .filter(refunds::account_id.eq(account_id))
        .filter(refunds::payment_id.eq(payment_id))
        .filter(refunds::idempotency_key.is_null())
        .order(refunds::id.desc())
        .select((
            refunds::id,
            refunds::status,
            refunds::failure_code,
            refunds::next_check_at,
            refunds::absent_since,
            refunds::updated_at,
        ))
        .load(conn)
        .await?;
    let latest =
        <[_]>::first(&rows).map(|(id, status, failure_code, next_check_at, absent_since, updated_at)| {
            LatestSystemRefund {
                id: *id,
                status: *status,
                failure_code: failure_code.clone(),
                watched: *status == RefundStatus::Failed && next_check_at.is_some(),
                absent_since: *absent_since,
                updated_at: *updated_at,
            }
        });
    Ok(SystemRefunds { count: rows.len() as i64, latest })
}

crate::prepared_statement! {
    /// A settled refund corrected to what the provider confirmed (`correct_refund.sql`).
    pub struct CorrectRefund<'a>("correct_refund.sql") -> BigInt {
        group announce: crate::events::Announce<'a>,
        1 => account_id: AccountId as Uuid,
        2 => refund_id: RefundId as Uuid,
        3 => payment_id: PaymentId as Uuid,
        4 => order_id: OrderId as Uuid,
        5 => from: RefundStatus as Text,
        6 => to: RefundStatus as Text,
        7 => provider_refund_id: Option<&'a str> as Nullable<Text>,
        8 => failure_code: Option<&'a str> as Nullable<Text>,
        9 => failure_message: Option<&'a str> as Nullable<Text>,
        10 => now: DateTime<Utc> as Timestamptz,
        11 => actor: &'a str as Text,
        12 => detail: &'a str as Text,
        13 => refunded_by: Decimal as Numeric,
        14 => order_status: Option<OrderStatus> as Nullable<Text>,
        15 => follow_up_at: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        16 => watched_until: Option<DateTime<Utc>> as Nullable<Timestamptz>,
    }
}

/// Runs the correction (inside the transaction that locked the order and the payment). Returns
/// whether it applied.
pub async fn correct(conn: &mut AsyncPgConnection, correct: CorrectRefund<'_>) -> QueryResult<bool> {
    Ok(correct.get_result::<i64>(conn).await? == 1)
}
