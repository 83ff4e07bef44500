//! The disputes' statements: recording one as the provider reports it (`record_dispute.sql`,
//! guarded), the payment a dispute's charge belongs to, the reads of the API and the CLI, and
//! where the reconciler's listing starts.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::{ClosedReason, Dispute, DisputeStatus};
use crate::db::schema::{dispute_listing, disputes, payments};
use crate::ids::{AccountId, OrderId, PaymentId};
use crate::money::Currency;

crate::text_enum! {
    /// What `record_dispute.sql` did.
    pub enum RecordOutcome {
        /// A dispute we lacked, recorded.
        Created = "created",
        /// Moved to what the provider reports.
        Updated = "updated",
        /// Already as the provider reports it.
        Unchanged = "unchanged",
        /// What the provider reports breaks the guard (a final status changed, a move backwards,
        /// money withdrawn or reinstated shrinking): nothing written.
        Refused = "refused",
        /// Its money does not fit the payment beside a refund still in flight: nothing written;
        /// a later look records it.
        DoesNotFit = "does_not_fit",
        /// Inserted by another transaction meanwhile (the payment's lock should prevent it).
        Changed = "changed",
    }
}

crate::prepared_statement! {
    /// A dispute recorded as the provider reports it (`record_dispute.sql`).
    pub struct RecordDispute<'a>("record_dispute.sql") -> (Text, Nullable<Uuid>) {
        1 => account_id: AccountId as Uuid,
        2 => id: Uuid as Uuid,
        3 => payment_id: PaymentId as Uuid,
        4 => order_id: OrderId as Uuid,
        5 => provider_dispute_id: &'a str as Text,
        6 => amount: Decimal as Numeric,
        7 => currency: Currency as Text,
        8 => reason: &'a str as Text,
        9 => status: DisputeStatus as Text,
        10 => closed_reason: Option<ClosedReason> as Nullable<Text>,
        11 => evidence_due_by: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        12 => amount_withdrawn: Decimal as Numeric,
        13 => amount_reinstated: Decimal as Numeric,
        14 => provider_created_at: DateTime<Utc> as Timestamptz,
        15 => now: DateTime<Utc> as Timestamptz,
    }
}

pub async fn record(
    conn: &mut AsyncPgConnection,
    statement: RecordDispute<'_>,
) -> QueryResult<(RecordOutcome, Option<Uuid>)> {
    statement.get_result(conn).await
}

/// The payment a provider charge belongs to, locked (`FOR UPDATE`): a dispute is recorded under
/// its payment's lock (docs/architecture.md, step 3).
#[derive(Debug, Clone, Queryable)]
pub struct PaymentOfCharge {
    pub account_id: AccountId,
    pub id: PaymentId,
    pub order_id: OrderId,
    pub currency: Currency,
    pub amount_captured: Decimal,
}

pub async fn lock_payment_of_charge(
    conn: &mut AsyncPgConnection,
    charge_id: &str,
) -> QueryResult<Option<PaymentOfCharge>> {
    payments::table
        .filter(payments::provider_charge_id.eq(charge_id))
        .select((
            payments::account_id,
            payments::id,
            payments::order_id,
            payments::currency,
            payments::amount_captured,
        ))
        .for_update()
        .first(conn)
        .await
        .optional()
}

pub async fn find_by_provider_id(
    conn: &mut AsyncPgConnection,
    provider_id: &str,
) -> QueryResult<Option<Dispute>> {
    disputes::table
        .filter(disputes::provider_dispute_id.eq(provider_id))
        .select(Dispute::as_select())
        .first(conn)
        .await
        .optional()
}

pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: Uuid,
) -> QueryResult<Option<Dispute>> {
    disputes::table.find((account_id, id)).select(Dispute::as_select()).first(conn).await.optional()
}

/// The provider ids of up to `limit` disputes not final yet, any account, least recently
/// changed first: the reconciler looks at each again.
pub async fn open(conn: &mut AsyncPgConnection, limit: i64) -> QueryResult<Vec<String>> {
    let finals = DisputeStatus::ALL.iter().copied().filter(|status| status.is_final());
    disputes::table
        .filter(disputes::status.ne_all(finals.collect::<Vec<_>>()))
        .order(disputes::updated_at.asc())
        .limit(limit)
        .select(disputes::provider_dispute_id)
        .load(conn)
        .await
}

/// Disputes of every account that still need a response with evidence due before `before`.
pub async fn count_due_before(conn: &mut AsyncPgConnection, before: DateTime<Utc>) -> QueryResult<i64> {
    let open = [DisputeStatus::NeedsResponse, DisputeStatus::WarningNeedsResponse];
    disputes::table
        .filter(disputes::evidence_due_by.lt(before))
        .filter(disputes::status.eq_any(open))
        .count()
        .get_result(conn)
        .await
}

/// Which disputes to list; every filter is optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter {
    pub status: Option<DisputeStatus>,
    pub payment_id: Option<PaymentId>,
    /// Open disputes whose evidence is due before then.
    pub due_before: Option<DateTime<Utc>>,
}

/// Up to `limit` of the account's disputes (every account's with `None`), newest first (ids are
/// time-ordered), after the cursor `starting_after`; with whether there are more.
pub async fn list(
    conn: &mut AsyncPgConnection,
    account_id: Option<AccountId>,
    filter: Filter,
    limit: i64,
    starting_after: Option<Uuid>,
) -> QueryResult<(Vec<Dispute>, bool)> {
    let mut query = disputes::table.into_boxed();
    if let Some(account_id) = account_id {
        query = query.filter(disputes::account_id.eq(account_id));
    }
    if let Some(status) = filter.status {
        query = query.filter(disputes::status.eq(status));
    }
    if let Some(payment_id) = filter.payment_id {
        query = query.filter(disputes::payment_id.eq(payment_id));
    }
    if let Some(due_before) = filter.due_before {
        let open = [DisputeStatus::NeedsResponse, DisputeStatus::WarningNeedsResponse];
        query = query.filter(disputes::evidence_due_by.lt(due_before)).filter(disputes::status.eq_any(open));
    }
    if let Some(cursor) = starting_after {
        query = query.filter(disputes::id.lt(cursor));
    }
    let mut rows: Vec<Dispute> =
        query.order(disputes::id.desc()).limit(limit + 1).select(Dispute::as_select()).load(conn).await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    Ok((rows, has_more))
}

/// Claims the listing of the provider's disputes for this pass, unless an instance claimed it
/// since `since` (compare-and-set: one instance lists per period); where it starts (their
/// creation time) when claimed.
pub async fn claim_listing(
    conn: &mut AsyncPgConnection,
    now: DateTime<Utc>,
    since: DateTime<Utc>,
) -> QueryResult<Option<DateTime<Utc>>> {
    let free = dispute_listing::listed_at.is_null().or(dispute_listing::listed_at.le(since));
    diesel::update(dispute_listing::table.filter(free))
        .set(dispute_listing::listed_at.eq(now))
        .returning(dispute_listing::created_from)
        .get_result(conn)
        .await
        .optional()
}

/// Moves where the next listing starts.
pub async fn move_listing(conn: &mut AsyncPgConnection, from: DateTime<Utc>) -> QueryResult<()> {
    diesel::update(dispute_listing::table).set(dispute_listing::created_from.eq(from)).execute(conn).await?;
    Ok(())
}
