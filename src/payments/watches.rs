//! The reconciler's watches over payments that are no longer in flight but may still move at the
//! provider: authorizations (which the provider lets go after a while: [`end_authorization`]),
//! and failed payments a charge may still land on (the late-charge watch: [`watch_late`],
//! [`record_late_charge`], [`follow_up_late_charge`]). Each claim skips rows another reconciler
//! is claiming and hides them until its claim ends.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use super::repository::{PaymentRow, PaymentRowSql};
use super::{Payment, PaymentStatus};
use crate::db::schema::payments;
use crate::ids::{AccountId, OrderId, PaymentId};
use crate::operations::Actor;

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
    next_look(conn, payment, PaymentStatus::RequiresCapture, next_check_at).await
}

/// Schedules a watch's next look at `payment`, guarded by it still being `watched_while`: a
/// payment that moved on meanwhile (captured, voided, refunded by hand) keeps its own schedule.
async fn next_look(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    watched_while: PaymentStatus,
    next_check_at: Option<DateTime<Utc>>,
) -> QueryResult<()> {
    diesel::update(payments::table)
        .filter(payments::account_id.eq(payment.account_id))
        .filter(payments::id.eq(payment.id))
        .filter(payments::status.eq(watched_while))
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
    next_look(conn, payment, PaymentStatus::Failed, next_check_at).await
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
