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
//! - [`watch`] and [`end_authorization`] (`end_authorization.sql`): the reconciler's watch on
//!   authorizations, which the provider lets go after a while.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use super::authorization::{Action, ActionStatus};
use super::{CaptureMethod, Payment, PaymentStatus};
use crate::db::schema::payments;
use crate::idempotency::store::ClaimParameters;
use crate::ids::{AccountId, LeaseId, OperationId, OrderId, PaymentId};
use crate::money::{Amount, Currency};
use crate::operations::Actor;
use crate::operations::leases::Lease;

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
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The SQL type of a [`PaymentRow`]: the statements that return payments name its columns in
/// its order.
type PaymentRowSql = diesel::dsl::SqlTypeOf<diesel::dsl::AsSelect<PaymentRow, diesel::pg::Pg>>;

pub(crate) fn corrupt(what: impl Into<String>) -> DbError {
    DbError::DeserializationError(what.into().into())
}

impl PaymentRow {
    fn into_payment(self) -> QueryResult<Payment> {
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

/// Which payments an operator looks at (`orderpay payments list` and `show`, through
/// `operations::operator`); every filter is optional.
#[derive(Debug, Clone, Copy)]
pub struct Inspect {
    pub payment: Option<PaymentId>,
    pub account: Option<AccountId>,
    pub status: Option<PaymentStatus>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only payments that need a person: `processing` ones whose operation in flight (the charge
    /// or authorization, or a capture or void) has had at least this many checks, and failed ones
    /// whose late charge is left unrefunded ([`late_charge_unrefunded`]).
    pub stuck_after: Option<i32>,
    pub limit: i64,
}

/// A charge that landed after its payment failed, as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LateCharge {
    pub amount: Decimal,
    /// Given back by the system's refunds, and still reserved by one in flight.
    pub refunded: Decimal,
    pub refunding: Decimal,
    /// Not refunded, and nothing will try again: a person must decide (see
    /// [`late_charge_unrefunded`]).
    pub needs_person: bool,
}

/// A payment with what is in flight on it, as an operator sees it.
#[derive(Debug, Clone)]
pub struct Inspected {
    pub payment: Payment,
    /// Its own charge or authorization is in flight: `processing` with no answer yet.
    pub charge_in_flight: bool,
    /// The capture or void in flight on it, if any (at most one).
    pub action: Option<ActionInFlight>,
    /// A charge that landed after it failed, if one did.
    pub late_charge: Option<LateCharge>,
}

diesel::alias!(crate::db::schema::refunds as system_refund: SystemRefund);

/// A failed payment whose late charge is not refunded and that nothing will try again: no system
/// refund reserves it, none given up on is still watched, and the follow-up has no look
/// scheduled (it ran out of attempts, or could not start a refund). Such money is ours only by
/// mistake: `orderpay payments list --stuck` lists it and `orderpay_late_charges_unrefunded`
/// counts it.
#[diesel::dsl::auto_type]
pub fn late_charge_unrefunded() -> _ {
    let failed: PaymentStatus = PaymentStatus::Failed;
    let nothing: Decimal = Decimal::ZERO;
    let watched = system_refund
        .filter(system_refund.field(crate::db::schema::refunds::account_id).eq(payments::account_id))
        .filter(system_refund.field(crate::db::schema::refunds::payment_id).eq(payments::id))
        .filter(system_refund.field(crate::db::schema::refunds::idempotency_key).is_null())
        .filter(system_refund.field(crate::db::schema::refunds::next_check_at).is_not_null());
    payments::status
        .eq(failed)
        .and(payments::late_charge_amount.is_not_null())
        .and(payments::amount_refunded.nullable().lt(payments::late_charge_amount))
        .and(payments::amount_refunding.eq(nothing))
        .and(payments::next_check_at.is_null())
        .and(diesel::dsl::not(diesel::dsl::exists(watched)))
}

/// How many failed payments hold a late charge that waits for a person (the
/// `orderpay_late_charges_unrefunded` gauge).
pub async fn count_late_charges_unrefunded(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
    payments::table.filter(late_charge_unrefunded()).count().get_result(conn).await
}

/// A capture or void in flight, as the reconciler sees it.
#[derive(Debug, Clone, Queryable)]
pub struct ActionInFlight {
    pub id: OperationId,
    pub kind: Action,
    pub attempts: i32,
    pub next_check_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
}

/// Payments matching `filter` with their capture or void in flight, newest first (ids are
/// UUIDv7). For operators: no index serves the filters but the id's, and none needs to.
pub async fn inspect(conn: &mut AsyncPgConnection, filter: &Inspect) -> QueryResult<Vec<Inspected>> {
    use crate::db::schema::payment_operations as actions;
    let in_flight = actions::account_id
        .eq(payments::account_id)
        .and(actions::payment_id.eq(payments::id))
        .and(actions::status.eq(ActionStatus::Processing));
    let mut query = payments::table
        .left_join(actions::table.on(in_flight))
        .select((
            PaymentRow::as_select(),
            (payments::late_charge_amount, payments::amount_refunding, late_charge_unrefunded()),
            payments::answer_status.is_null(),
            (
                actions::id,
                actions::kind,
                actions::attempts,
                actions::next_check_at,
                actions::last_error,
                actions::lease_until,
            )
                .nullable(),
        ))
        .into_boxed();
    if let Some(id) = filter.payment {
        query = query.filter(payments::id.eq(id));
    }
    if let Some(account) = filter.account {
        query = query.filter(payments::account_id.eq(account));
    }
    if let Some(status) = filter.status {
        query = query.filter(payments::status.eq(status));
    }
    if let Some(before) = filter.created_before {
        query = query.filter(payments::created_at.lt(before));
    }
    if let Some(attempts) = filter.stuck_after {
        let charge = payments::answer_status.is_null().and(payments::attempts.ge(attempts));
        let action = actions::attempts.nullable().ge(attempts);
        let in_flight_too_long = payments::status.eq(PaymentStatus::Processing).and(charge.or(action));
        query = query.filter(in_flight_too_long.nullable().or(late_charge_unrefunded().nullable()));
    }
    type Row = (PaymentRow, (Option<Decimal>, Decimal, Option<bool>), bool, Option<ActionInFlight>);
    let rows: Vec<Row> = query.order(payments::id.desc()).limit(filter.limit).load(conn).await?;
    rows.into_iter()
        .map(|(row, (late_charge, refunding, needs_person), unanswered, action)| {
            let payment = row.into_payment()?;
            let charge_in_flight = unanswered && payment.status == PaymentStatus::Processing;
            let late_charge = late_charge.map(|amount| LateCharge {
                amount,
                refunded: payment.amount_refunded.value(),
                refunding,
                needs_person: needs_person.unwrap_or(false),
            });
            Ok(Inspected { payment, charge_in_flight, action, late_charge })
        })
        .collect()
}

/// One row of a payment's audit trail: a transition of the payment, or of one of its captures,
/// voids or refunds (`subject`), and who applied it.
#[derive(Debug, Clone, Queryable, Selectable, serde::Serialize)]
#[diesel(table_name = crate::db::schema::payment_events)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Transition {
    pub subject: String,
    pub subject_id: uuid::Uuid,
    #[serde(rename = "from")]
    pub from_status: String,
    #[serde(rename = "to")]
    pub to_status: String,
    pub actor: Actor,
    pub detail: Option<String>,
    pub at: DateTime<Utc>,
}

/// A payment's audit trail, oldest first.
pub async fn transitions(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
) -> QueryResult<Vec<Transition>> {
    use crate::db::schema::payment_events;
    payment_events::table
        .filter(payment_events::account_id.eq(account_id))
        .filter(payment_events::payment_id.eq(id))
        .order(payment_events::id)
        .select(Transition::as_select())
        .load(conn)
        .await
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

/// What phase 1's statement found and did.
#[derive(Debug)]
pub struct Started {
    pub outcome: StartOutcome,
    /// The order's status, total and currency, when the key was claimed and the order exists.
    pub order: Option<(String, Decimal, Currency)>,
    /// The order's payment in flight, for [`StartOutcome::PaymentInProgress`].
    pub in_flight: Option<PaymentId>,
}

/// Runs phase 1's statement. A second payment in flight that committed after the statement
/// began violates `payments_one_active_per_order`: see [`is_second_active_payment`].
pub async fn start(conn: &mut AsyncPgConnection, start: StartPayment<'_>) -> QueryResult<Started> {
    type Row = (StartOutcome, Option<String>, Option<Decimal>, Option<Currency>, Option<PaymentId>);
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

/// The reconciler's watch on authorizations: up to `limit` `requires_capture` payments due for
/// a look, skipping rows another reconciler is claiming, hidden from the others until
/// `claimed_until`. Each row is read on its own: one this version cannot make sense of is an
/// error for that payment, not for the batch.
pub async fn watch(
    conn: &mut AsyncPgConnection,
    now: DateTime<Utc>,
    limit: i64,
    claimed_until: DateTime<Utc>,
) -> QueryResult<Vec<QueryResult<Payment>>> {
    let rows: Vec<PaymentRow> = WatchAuthorizations { now: &now, limit, claimed_until }.load(conn).await?;
    Ok(rows.into_iter().map(PaymentRow::into_payment).collect())
}

crate::prepared_statement! {
    /// The reconciler's claim of authorizations due for a look (`watch_authorizations.sql`).
    pub(crate) struct WatchAuthorizations<'a>("watch_authorizations.sql") -> PaymentRowSql {
        1 => now: &'a DateTime<Utc> as Timestamptz,
        2 => limit: i64 as BigInt,
        3 => claimed_until: DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    /// The late-charge watch's claim (`watch_late_charges.sql`).
    pub(crate) struct WatchLateCharges<'a>("watch_late_charges.sql") -> (PaymentRowSql, Timestamptz, Nullable<Numeric>) {
        1 => now: &'a DateTime<Utc> as Timestamptz,
        2 => limit: i64 as BigInt,
        3 => claimed_until: DateTime<Utc> as Timestamptz,
    }
}

/// Schedules the next look at an authorization that is still waiting for a capture (`None`: no
/// more looks).
pub async fn watch_again(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    next_check_at: Option<DateTime<Utc>>,
) -> QueryResult<()> {
    diesel::update(payments::table)
        .filter(payments::account_id.eq(payment.account_id))
        .filter(payments::id.eq(payment.id))
        .filter(payments::status.eq(PaymentStatus::RequiresCapture))
        .set(payments::next_check_at.eq(next_check_at))
        .execute(conn)
        .await?;
    Ok(())
}

/// A payment given up on, due for a look by the late-charge watch: the payment, until when it
/// is watched, and the late charge recorded on it (then the look is the refund's follow-up).
pub type WatchedLate = (Payment, DateTime<Utc>, Option<Decimal>);

/// The reconciler's watch on payments it gave up on: up to `limit` due for a look for a charge
/// that landed late (or, once one is recorded, for the follow-up of its refund), skipping rows
/// another reconciler is claiming, hidden from the others until `claimed_until`. Each look counts
/// an attempt (the watch's backoff). Each row is read on its own.
pub async fn watch_late(
    conn: &mut AsyncPgConnection,
    now: DateTime<Utc>,
    limit: i64,
    claimed_until: DateTime<Utc>,
) -> QueryResult<Vec<QueryResult<WatchedLate>>> {
    let rows: Vec<(PaymentRow, DateTime<Utc>, Option<Decimal>)> =
        WatchLateCharges { now: &now, limit, claimed_until }.load(conn).await?;
    Ok(rows
        .into_iter()
        .map(|(row, watch_until, late_charge)| Ok((row.into_payment()?, watch_until, late_charge)))
        .collect())
}

/// Brings the late-charge watch of a failed payment forward to `now`, when the provider's
/// webhook says it holds a charge for it: the watch's lookup (never the webhook) then records and
/// refunds it on the reconciler's next pass. A payment that failed by a decline is not watched
/// yet: the watch starts now, for `watch`. Once a late charge is recorded the watch never starts
/// again (its refund has a follow-up of its own). Returns whether the payment is watched.
pub async fn watch_late_now(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
    now: DateTime<Utc>,
    watch: std::time::Duration,
) -> QueryResult<bool> {
    let failed_without_late_charge = payments::account_id
        .eq(account_id)
        .and(payments::id.eq(id))
        .and(payments::status.eq(PaymentStatus::Failed))
        .and(payments::late_charge_amount.is_null());
    diesel::update(payments::table)
        .filter(failed_without_late_charge)
        .filter(payments::late_watch_until.is_null())
        .set(payments::late_watch_until.eq(Some(crate::clock::after(now, watch))))
        .execute(conn)
        .await?;
    let moved = diesel::update(payments::table)
        .filter(failed_without_late_charge)
        .set(payments::next_check_at.eq(now))
        .execute(conn)
        .await?;
    Ok(moved == 1)
}

/// Schedules the next look for a late charge, or (`None`) ends the watch.
pub async fn watch_late_again(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    next_check_at: Option<DateTime<Utc>>,
) -> QueryResult<()> {
    diesel::update(payments::table)
        .filter(payments::account_id.eq(payment.account_id))
        .filter(payments::id.eq(payment.id))
        .filter(payments::status.eq(PaymentStatus::Failed))
        .set(payments::next_check_at.eq(next_check_at))
        .execute(conn)
        .await?;
    Ok(())
}

/// Records a charge the provider holds for a failed payment (one that landed after the give-up,
/// or that an operator failed the payment over): its amount (now what the payment captured, so
/// that a refund can give it back), its id, the end of the watch, and an audit row saying
/// `detail`. The payment stays `failed`. Returns false when it was recorded before.
pub async fn record_late_charge(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    charge_id: &str,
    amount: Decimal,
    detail: &str,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    use crate::db::schema::payment_events;
    let recorded = diesel::update(payments::table)
        .filter(payments::account_id.eq(payment.account_id))
        .filter(payments::id.eq(payment.id))
        .filter(payments::status.eq(PaymentStatus::Failed))
        .filter(payments::late_charge_amount.is_null())
        .set((
            payments::late_charge_amount.eq(Some(amount)),
            payments::amount_captured.eq(amount),
            payments::provider_charge_id.eq(Some(charge_id)),
            payments::next_check_at.eq(None::<DateTime<Utc>>),
            payments::updated_at.eq(now),
        ))
        .execute(conn)
        .await?;
    if recorded == 0 {
        return Ok(false);
    }
    diesel::insert_into(payment_events::table)
        .values((
            payment_events::account_id.eq(payment.account_id),
            payment_events::payment_id.eq(payment.id),
            payment_events::subject.eq("payment"),
            payment_events::subject_id.eq(payment.id.as_uuid()),
            payment_events::from_status.eq(PaymentStatus::Failed),
            payment_events::to_status.eq(PaymentStatus::Failed),
            payment_events::actor.eq(Actor::System),
            payment_events::detail.eq(Some(detail)),
            payment_events::at.eq(now),
        ))
        .execute(conn)
        .await?;
    Ok(true)
}

crate::prepared_statement! {
    /// An authorization the provider let go or captured while nothing of ours was in flight
    /// (`end_authorization.sql`).
    pub struct EndAuthorization<'a>("end_authorization.sql") -> (BigInt, BigInt) {
        group announce: crate::events::Announce<'a>,
        1 => account_id: AccountId as Uuid,
        2 => payment_id: PaymentId as Uuid,
        3 => order_id: OrderId as Uuid,
        4 => status: PaymentStatus as Text,
        5 => amount_captured: Decimal as Numeric,
        6 => failure_code: Option<&'a str> as Nullable<Text>,
        7 => failure_message: Option<&'a str> as Nullable<Text>,
        8 => now: DateTime<Utc> as Timestamptz,
        9 => actor: &'a str as Text,
        10 => order_status: crate::orders::OrderStatus as Text,
    }
}

/// Runs `end_authorization.sql`. Returns (payments moved, orders moved).
pub async fn end_authorization(
    conn: &mut AsyncPgConnection,
    end: EndAuthorization<'_>,
) -> QueryResult<(i64, i64)> {
    end.get_result(conn).await
}

/// A payment's money as read under its row lock, for a transaction that decides from it.
#[derive(Debug, Clone, Copy)]
pub struct LockedAmounts {
    pub status: PaymentStatus,
    pub amount_captured: Decimal,
    pub amount_refunded: Decimal,
    pub amount_refunding: Decimal,
    /// A charge that landed after the payment failed (refunded by the system).
    pub late_charge_amount: Option<Decimal>,
}

/// Locks a payment (`FOR UPDATE`: after its order, in the lock order) and reads its money.
pub async fn lock_amounts(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
) -> QueryResult<Option<LockedAmounts>> {
    let row: Option<(PaymentStatus, Decimal, Decimal, Decimal, Option<Decimal>)> = payments::table
        .find((account_id, id))
        .select((
            payments::status,
            payments::amount_captured,
            payments::amount_refunded,
            payments::amount_refunding,
            payments::late_charge_amount,
        ))
        .for_update()
        .first(conn)
        .await
        .optional()?;
    Ok(row.map(|(status, amount_captured, amount_refunded, amount_refunding, late_charge_amount)| {
        LockedAmounts { status, amount_captured, amount_refunded, amount_refunding, late_charge_amount }
    }))
}

/// Brings the look at a failed payment's late charge forward to `at` (its system refund failed
/// for certain, or was found absent or reversed: the follow-up may start another).
pub async fn follow_up_late_charge(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: PaymentId,
    at: DateTime<Utc>,
) -> QueryResult<()> {
    diesel::update(payments::table)
        .filter(payments::account_id.eq(account_id))
        .filter(payments::id.eq(id))
        .filter(payments::status.eq(PaymentStatus::Failed))
        .filter(payments::late_charge_amount.is_not_null())
        .filter(payments::late_watch_until.is_not_null())
        .set(payments::next_check_at.eq(Some(at)))
        .execute(conn)
        .await?;
    Ok(())
}
