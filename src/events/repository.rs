//! Event persistence: the only code that reads the `events` and `relay_cursors` tables (the
//! statements that change state write their own events, in the same statement).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::{Event, EventType};
use crate::db::schema::events;
use crate::ids::{AccountId, EventId};

/// An event to write, in the transaction of its change.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: EventId,
    pub event_type: EventType,
    pub data: Vec<u8>,
}

impl NewEvent {
    pub fn new(event_type: EventType, data: Vec<u8>) -> Self {
        NewEvent { id: EventId::generate(), event_type, data }
    }
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = events)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub(crate) struct EventRow {
    account_id: AccountId,
    id: EventId,
    #[diesel(column_name = type_)]
    event_type: EventType,
    data: Vec<u8>,
    created_at: DateTime<Utc>,
}

impl From<EventRow> for Event {
    fn from(row: EventRow) -> Self {
        Event {
            account_id: row.account_id,
            id: row.id,
            event_type: row.event_type,
            data: row.data,
            created_at: row.created_at,
        }
    }
}

/// Writes events inside the caller's transaction (for changes that are not one statement).
pub async fn insert(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    new: &[NewEvent],
    now: DateTime<Utc>,
) -> QueryResult<()> {
    let rows: Vec<_> = new
        .iter()
        .map(|event| {
            (
                events::account_id.eq(account_id),
                events::id.eq(event.id),
                events::type_.eq(event.event_type),
                events::data.eq(&event.data),
                events::created_at.eq(now),
            )
        })
        .collect();
    diesel::insert_into(events::table).values(&rows).execute(conn).await?;
    crate::telemetry::metrics::events_written(new.iter().map(|event| event.event_type.as_str()));
    Ok(())
}

pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EventId,
) -> QueryResult<Option<Event>> {
    events::table
        .find((account_id, id))
        .select(EventRow::as_select())
        .first(conn)
        .await
        .optional()
        .map(|row| row.map(Event::from))
}

/// An event by its id alone, whatever its account (for operators, who name events by id). No
/// index leads with the id: this reads the whole table, which only an operator command may do.
pub async fn find_in_any_account(conn: &mut AsyncPgConnection, id: EventId) -> QueryResult<Option<Event>> {
    events::table
        .filter(events::id.eq(id))
        .select(EventRow::as_select())
        .first(conn)
        .await
        .optional()
        .map(|row| row.map(Event::from))
}

/// A page of the account's events (of one type, when given), newest first, strictly older than
/// `starting_after` when given. Returns the page and whether more follow.
pub async fn list(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    event_type: Option<EventType>,
    limit: i64,
    starting_after: Option<EventId>,
) -> QueryResult<(Vec<Event>, bool)> {
    let mut query = events::table.filter(events::account_id.eq(account_id)).into_boxed();
    if let Some(event_type) = event_type {
        query = query.filter(events::type_.eq(event_type));
    }
    if let Some(cursor) = starting_after {
        query = query.filter(events::id.lt(cursor));
    }
    let mut rows: Vec<EventRow> =
        query.order(events::id.desc()).limit(limit + 1).select(EventRow::as_select()).load(conn).await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    Ok((rows.into_iter().map(Event::from).collect(), has_more))
}

/// Where a relay stands: the last event it handed on, in transaction order.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct Cursor {
    /// The writing transaction's id, as text (PostgreSQL's `xid8`).
    pub txid: String,
    pub seq: i64,
}

/// A relay taken for the caller's transaction, with where its cursor stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub cursor: Cursor,
    /// The cursor was written in another cluster (the database was restored from a logical
    /// dump, or moved): it was put back before the oldest event, so that the relay starts over.
    pub started_over: bool,
}

/// Takes `relay` for the caller's transaction and reads its cursor, or `None` when another
/// instance holds it (that instance is handing the next batch on).
///
/// A transaction-scoped advisory lock, not `FOR UPDATE` on the cursor's row: a row lock would
/// give the round a transaction id from its first statement, and every relay reads only events
/// of transactions older than every running one (`read_after`), so a round holding a
/// transaction id while it waits on its destination would hold back every other relay. With the
/// advisory lock the round gets its id only when it writes (the cursor's move, just before
/// commit).
///
/// The lock is taken by a statement of its own, and the cursor read by the next one: in
/// PostgreSQL's read committed a statement reads the snapshot taken when it started, so a read
/// in the statement that takes the lock could see the cursor as it was before the previous
/// holder's commit (the lock freed by that commit, taken a moment later by a statement that
/// began before it) and hand that holder's batch on a second time.
///
/// A cursor written in another cluster (its `system_identifier` is not this cluster's) says
/// nothing about this cluster's transaction ids: it is put back before the oldest event, in
/// this transaction. Events already handed on are handed on again: at least once, as always.
pub async fn lock_cursor(conn: &mut AsyncPgConnection, relay: &str) -> QueryResult<Option<Taken>> {
    let taken: bool = TakeRelay { relay }.get_result(conn).await?;
    if !taken {
        return Ok(None);
    }
    let stored: Option<(Cursor, bool)> = ReadCursor { relay }.get_result(conn).await.optional()?;
    let Some((cursor, same_cluster)) = stored else { return Ok(None) };
    if same_cluster {
        return Ok(Some(Taken { cursor, started_over: false }));
    }
    RestartCursor { relay }.execute(conn).await?;
    Ok(Some(Taken { cursor: Cursor { txid: "0".to_owned(), seq: 0 }, started_over: true }))
}

/// Up to `limit` events after `cursor` in transaction order, of transactions older than every one
/// still running (so that none committed later can appear before them). Returns them with the
/// cursor that follows the last one. The ORDER BY names the table's columns: a bare `txid` there
/// would be the text output column, and "1000" sorts before "999".
pub async fn read_after(
    conn: &mut AsyncPgConnection,
    cursor: &Cursor,
    limit: i64,
) -> QueryResult<(Vec<Event>, Option<Cursor>)> {
    let rows: Vec<(EventRow, String, i64)> =
        ReadAfter { txid: &cursor.txid, seq: cursor.seq, limit }.load(conn).await?;
    let next = <[_]>::last(&rows).map(|(_, txid, seq)| Cursor { txid: txid.clone(), seq: *seq });
    Ok((rows.into_iter().map(|(event, _, _)| Event::from(event)).collect(), next))
}

/// Moves `relay`'s cursor (locked by the caller's transaction).
pub async fn advance_cursor(conn: &mut AsyncPgConnection, relay: &str, to: &Cursor) -> QueryResult<()> {
    AdvanceCursor { relay, txid: &to.txid, seq: to.seq }.execute(conn).await?;
    Ok(())
}

/// How old the oldest event `relay` has not handed on is (zero when none waits).
pub async fn lag(
    conn: &mut AsyncPgConnection,
    relay: &str,
    now: DateTime<Utc>,
) -> QueryResult<std::time::Duration> {
    let oldest: Option<DateTime<Utc>> = Lag { relay }.get_result(conn).await?;
    Ok(oldest.and_then(|oldest| (now - oldest).to_std().ok()).unwrap_or_default())
}

/// Deletes up to `batch_size` of the oldest events created before `before`. Returns how many.
/// The scan is bounded by the batch (the oldest events in commit order, then those of them past
/// the retention); only those are locked, so a sweep that finds nothing due writes nothing.
pub async fn sweep(
    conn: &mut AsyncPgConnection,
    before: DateTime<Utc>,
    batch_size: i64,
) -> QueryResult<usize> {
    Sweep { before: &before, batch_size }.execute(conn).await
}

crate::prepared_statement! {
    /// A relay taken for the caller's transaction (`sql/take_relay.sql`).
    pub(crate) struct TakeRelay<'a>("sql/take_relay.sql") -> Bool {
        1 => relay: &'a str as Text,
    }
}

crate::prepared_statement! {
    /// A relay's cursor and whether this cluster wrote it (`sql/read_cursor.sql`).
    pub(crate) struct ReadCursor<'a>("sql/read_cursor.sql") -> ((Text, BigInt), Bool) {
        1 => relay: &'a str as Text,
    }
}

crate::prepared_statement! {
    /// A cursor from another cluster put back before the oldest event (`sql/restart_cursor.sql`).
    pub(crate) struct RestartCursor<'a>("sql/restart_cursor.sql") -> () {
        1 => relay: &'a str as Text,
    }
}

crate::prepared_statement! {
    /// The events after a cursor, in transaction order (`sql/read_after.sql`).
    pub(crate) struct ReadAfter<'a>("sql/read_after.sql")
        -> (diesel::dsl::SqlTypeOf<diesel::dsl::AsSelect<EventRow, diesel::pg::Pg>>, Text, BigInt)
    {
        1 => txid: &'a str as Text,
        2 => seq: i64 as BigInt,
        3 => limit: i64 as BigInt,
    }
}

crate::prepared_statement! {
    /// A relay's cursor moved (`sql/advance_cursor.sql`).
    pub(crate) struct AdvanceCursor<'a>("sql/advance_cursor.sql") -> () {
        1 => relay: &'a str as Text,
        2 => txid: &'a str as Text,
        3 => seq: i64 as BigInt,
    }
}

crate::prepared_statement! {
    /// When the oldest event a relay has not handed on was written (`sql/lag.sql`).
    pub(crate) struct Lag<'a>("sql/lag.sql") -> Nullable<Timestamptz> {
        1 => relay: &'a str as Text,
    }
}

crate::prepared_statement! {
    /// A batch of events past their retention deleted (`sql/sweep.sql`).
    pub(crate) struct Sweep<'a>("sql/sweep.sql") -> () {
        1 => before: &'a DateTime<Utc> as Timestamptz,
        2 => batch_size: i64 as BigInt,
    }
}
