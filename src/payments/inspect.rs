//! What an operator reads of payments (`orderpay payments list | show`, through
//! `operations::operator`): payments with what is in flight on them, their late charges, and
//! their audit trail. Reads only.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use super::authorization::{Action, ActionStatus};
use super::repository::PaymentRow;
use super::{Payment, PaymentStatus};
use crate::db::schema::payments;
use crate::ids::{AccountId, OperationId, PaymentId};
use crate::operations::Actor;

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
        // Out of checks, or held for a person with no check scheduled (a key conflict).
        let out_of_checks = payments::attempts.ge(attempts).or(payments::next_check_at.is_null());
        let charge = payments::answer_status.is_null().and(out_of_checks);
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
