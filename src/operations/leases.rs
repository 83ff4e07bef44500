//! What every provider operation's row has in common, written once for all of them: who drives
//! it (the lease), when it last sent a request, when it is checked next, and its final answer.
//!
//! An operation is *in flight* while its status is `processing` and it has no answer yet (a
//! payment whose capture is in flight is `processing` too, but its own charge has its answer).
//! The writers here, one each, for every operation table:
//! - [`lease`]: a driver takes in-flight operations whose lease is free (a retry taking one over,
//!   or the reconciler claiming due ones), by compare-and-set;
//! - [`mark_sending`]: a driver about to re-send notes when, under its lease, at the database's
//!   clock;
//! - [`release`]: the outcome stays unknown; the driver lets go and schedules the next check.
//!
//! Each is one `.sql` template under `leases/`, its `operation_table` replaced by each operation
//! table's name when the crate compiles: a prepared statement per table, declared once for every
//! kind of [`super::every_kind!`] (never SQL built at run time).

use chrono::{DateTime, Utc};
use diesel::Queryable;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::idempotency::store::ResourceKind;
use crate::ids::{AccountId, LeaseId};

/// Declares [`Table`] and the lease statements of every operation table, from the kinds' list.
macro_rules! operation_tables {
    ($( $kind:path => $variant:ident($table:literal, $label:literal, $resource:ident = $spelling:literal) ),* $(,)?) => {
        /// The tables that hold provider operations: one per kind of [`super::every_kind!`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Table {
            $( $variant, )*
        }

        impl Table {
            pub const ALL: &'static [Table] = &[$( Table::$variant ),*];

            /// The label of its operations in metrics and logs.
            pub const fn label(self) -> &'static str {
                match self {
                    $( Table::$variant => $label, )*
                }
            }

            /// What a key that starts one of its operations names.
            pub const fn resource(self) -> ResourceKind {
                match self {
                    $( Table::$variant => ResourceKind::$resource, )*
                }
            }

            /// The table of the operations a key naming `resource` starts; `None` for a
            /// resource whose answer is stored with its key (orders, webhook endpoints).
            pub fn of(resource: ResourceKind) -> Option<Table> {
                Table::ALL.iter().copied().find(|table| table.resource() == resource)
            }
        }

        /// The prepared statements of each operation table.
        #[allow(non_snake_case)]
        mod statements {
            $(
                pub mod $variant {
                    use chrono::{DateTime, Utc};

                    use crate::ids::{AccountId, LeaseId};

                    crate::prepared_statement! {
                        pub struct Lease<'a>(template "leases/lease.sql", "operation_table" => $table)
                            -> (Uuid, Uuid, Int4, Timestamptz)
                        {
                            1 => until: DateTime<Utc> as Timestamptz,
                            2 => lease_id: &'a LeaseId as Uuid,
                            3 => attempts_added: i32 as Int4,
                            4 => now: DateTime<Utc> as Timestamptz,
                            5 => account_id: Option<AccountId> as Nullable<Uuid>,
                            6 => id: Option<uuid::Uuid> as Nullable<Uuid>,
                            7 => limit: i64 as BigInt,
                        }
                    }

                    crate::prepared_statement! {
                        pub struct MarkSending<'a>(template "leases/mark_sending.sql", "operation_table" => $table)
                            -> ()
                        {
                            1 => account_id: &'a AccountId as Uuid,
                            2 => id: uuid::Uuid as Uuid,
                            3 => lease_id: LeaseId as Uuid,
                        }
                    }

                    crate::prepared_statement! {
                        pub struct Release<'a>(template "leases/release.sql", "operation_table" => $table) -> () {
                            1 => account_id: AccountId as Uuid,
                            2 => id: uuid::Uuid as Uuid,
                            3 => lease_id: LeaseId as Uuid,
                            4 => next_check_at: Option<DateTime<Utc>> as Nullable<Timestamptz>,
                            5 => last_error: &'a str as Text,
                            6 => now: DateTime<Utc> as Timestamptz,
                            7 => checks_returned: i32 as Int4,
                        }
                    }

                    crate::prepared_statement! {
                        pub struct Standing<'a>(template "leases/standing.sql", "operation_table" => $table)
                            -> (Nullable<Int2>, Nullable<Bytea>, Nullable<Timestamptz>, Nullable<Uuid>, Text, Bool)
                        {
                            1 => account_id: &'a AccountId as Uuid,
                            2 => id: uuid::Uuid as Uuid,
                        }
                    }

                    crate::prepared_statement! {
                        pub struct CountWaiting<'a>(template "leases/count_waiting.sql", "operation_table" => $table)
                            -> BigInt
                        {
                            1 => now: &'a DateTime<Utc> as Timestamptz,
                        }
                    }
                }
            )*
        }

        /// Every statement above, for the checks of `db::statement`'s tests and the integration tests' plans.
        #[cfg(any(test, feature = "test-hooks"))]
        pub(crate) fn declared_statements() -> Vec<crate::db::statement::Declared> {
            use crate::db::statement::declared;
            vec![$(
                declared::<statements::$variant::Lease<'static>>(),
                declared::<statements::$variant::MarkSending<'static>>(),
                declared::<statements::$variant::Release<'static>>(),
                declared::<statements::$variant::Standing<'static>>(),
                declared::<statements::$variant::CountWaiting<'static>>(),
            )*]
        }

        /// Evaluates `$body` with `$module` naming the statements of `$on`'s table.
        macro_rules! on_table {
            ($on:expr, |$module:ident| $body:expr) => {
                match $on {
                    $( Table::$variant => { use statements::$variant as $module; $body } )*
                }
            };
        }
    };
}

super::every_kind!(operation_tables);

/// A driver's hold on an operation in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub until: DateTime<Utc>,
}

/// Which operations a driver leases.
#[derive(Debug, Clone, Copy)]
pub enum LeaseTarget {
    /// This one, if nobody holds it (a retry taking an abandoned operation over).
    One(AccountId, Uuid),
    /// Up to `limit` due ones, skipping rows other reconcilers are claiming; each counts an
    /// attempt (the reconciler's claim).
    Due { limit: i64 },
}

/// An operation a driver now holds.
#[derive(Debug, Clone, Copy, Queryable)]
pub struct Leased {
    pub account_id: AccountId,
    pub id: Uuid,
    /// Checks made, this one included when the reconciler claimed it.
    pub attempts: i32,
    /// The database's clock when the lease was taken (before any lookup under it).
    pub leased_at: DateTime<Utc>,
}

/// Leases in-flight operations of `table` whose lease is free (never held, released, or run
/// out) to `lease` by compare-and-set: of two drivers racing for one operation exactly one gets
/// it (a taker waits for a concurrent one's uncommitted lease, then sees it held). The reconciler
/// does not check a leased operation before its lease runs out.
pub async fn lease(
    conn: &mut AsyncPgConnection,
    table: Table,
    target: LeaseTarget,
    lease: Lease,
    now: DateTime<Utc>,
) -> diesel::QueryResult<Vec<Leased>> {
    let (account_id, id, limit, attempts_added) = match target {
        LeaseTarget::One(account_id, id) => (Some(account_id), Some(id), 1, 0),
        LeaseTarget::Due { limit } => (None, None, limit, 1),
    };
    on_table!(table, |statements| {
        let statement = statements::Lease {
            until: lease.until,
            lease_id: &lease.id,
            attempts_added,
            now,
            account_id,
            id,
            limit,
        };
        statement.load(conn).await
    })
}

/// Notes, under `lease`, that the operation's request is about to be sent again, at the
/// database's clock. Returns false (send nothing) when it is settled or its lease was taken over.
pub async fn mark_sending(
    conn: &mut AsyncPgConnection,
    table: Table,
    (account_id, id): (AccountId, Uuid),
    lease: LeaseId,
) -> diesel::QueryResult<bool> {
    let updated = on_table!(table, |statements| {
        statements::MarkSending { account_id: &account_id, id, lease_id: lease }.execute(conn).await
    })?;
    Ok(updated == 1)
}

/// Leaves an in-flight operation for a check at `next_check_at`, noting why, and lets go of
/// `lease` if the caller still holds it (so that a retry may take it over at once). Returns
/// whether it did: false when someone settled it or took it over meanwhile.
pub async fn release(
    conn: &mut AsyncPgConnection,
    table: Table,
    id: (AccountId, Uuid),
    lease: LeaseId,
    next_check_at: DateTime<Utc>,
    last_error: &str,
    now: DateTime<Utc>,
) -> diesel::QueryResult<bool> {
    let_go(
        conn,
        table,
        id,
        lease,
        LetGo { next_check_at: Some(next_check_at), last_error, now, checks_returned: 0 },
    )
    .await
}

/// [`release`] after a call the provider refused unacted (our credentials) under the
/// reconciler's claim: the check the claim counted is given back, so that a misconfiguration
/// lasting longer than the reconciler's attempts never brings an operation to its last,
/// look-only check (nor, the provider never having been asked, a give-up).
pub async fn release_unsent(
    conn: &mut AsyncPgConnection,
    table: Table,
    id: (AccountId, Uuid),
    lease: LeaseId,
    next_check_at: DateTime<Utc>,
    reason: &str,
    now: DateTime<Utc>,
) -> diesel::QueryResult<bool> {
    let checks_returned = 1;
    let_go(
        conn,
        table,
        id,
        lease,
        LetGo { next_check_at: Some(next_check_at), last_error: reason, now, checks_returned },
    )
    .await
}

/// Holds an in-flight operation for a person (the provider holds its key with other
/// parameters: [`super::Finding::KeyConflict`]): no check scheduled, so the reconciler leaves it
/// alone and never gives it up; the lease let go; `reason` noted. Returns whether it did.
pub async fn hold(
    conn: &mut AsyncPgConnection,
    table: Table,
    id: (AccountId, Uuid),
    lease: LeaseId,
    reason: &str,
    now: DateTime<Utc>,
) -> diesel::QueryResult<bool> {
    let_go(conn, table, id, lease, LetGo { next_check_at: None, last_error: reason, now, checks_returned: 0 })
        .await
}

/// What `release.sql` writes besides the lease it lets go.
struct LetGo<'a> {
    /// `None`: no check scheduled (held for a person).
    next_check_at: Option<DateTime<Utc>>,
    last_error: &'a str,
    now: DateTime<Utc>,
    checks_returned: i32,
}

async fn let_go(
    conn: &mut AsyncPgConnection,
    table: Table,
    (account_id, id): (AccountId, Uuid),
    lease: LeaseId,
    LetGo { next_check_at, last_error, now, checks_returned }: LetGo<'_>,
) -> diesel::QueryResult<bool> {
    let updated = on_table!(table, |statements| {
        statements::Release {
            account_id,
            id,
            lease_id: lease,
            next_check_at,
            last_error,
            now,
            checks_returned,
        }
        .execute(conn)
        .await
    })?;
    Ok(updated == 1)
}

/// Where an operation stands, as a retry of the key that started it needs to know.
#[derive(Debug, Clone, Queryable)]
pub struct Standing {
    answer_status: Option<i16>,
    answer_body: Option<Vec<u8>>,
    lease_until: Option<DateTime<Utc>>,
    /// The owner of the lease: the id a request, a retry or a reconciler claimed it with.
    pub lease_id: Option<LeaseId>,
    /// The operation's status, as its table spells it.
    pub status: String,
    /// Whether that status is `processing` (the provider's outcome not settled yet).
    pub processing: bool,
}

impl Standing {
    /// Its final answer, once it has one: `(status, body)`. A body read from the settle's event
    /// is there for as long as any key that started the operation lives (events outlive keys);
    /// whether the operation is settled at all is [`Standing::answer_status`]'s to tell.
    pub fn answer(&self) -> Option<(u16, Vec<u8>)> {
        let status = u16::try_from(self.answer_status?).ok()?;
        Some((status, self.answer_body.clone()?))
    }

    /// The status of its final answer, once it has one.
    pub fn answer_status(&self) -> Option<i16> {
        self.answer_status
    }

    /// When the lease of a live driver ends, if one holds it at `now`.
    pub fn held_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.lease_until.filter(|until| *until > now)
    }
}

/// Reads where an operation stands; `None` when it does not exist.
pub async fn standing(
    conn: &mut AsyncPgConnection,
    table: Table,
    (account_id, id): (AccountId, Uuid),
) -> diesel::QueryResult<Option<Standing>> {
    use diesel::OptionalExtension;
    on_table!(table, |statements| {
        statements::Standing { account_id: &account_id, id }.get_result(conn).await.optional()
    })
}

/// In-flight operations of `table` that no driver holds: waiting for a retry or the reconciler
/// (the `orderpay_operations_waiting` gauge).
pub async fn count_waiting(
    conn: &mut AsyncPgConnection,
    table: Table,
    now: DateTime<Utc>,
) -> diesel::QueryResult<i64> {
    on_table!(table, |statements| statements::CountWaiting { now: &now }.get_result(conn).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind names its own resource: two kinds naming one would make `Table::of` find only
    /// the first, and the other's keys would look for their answers in the wrong table.
    #[test]
    fn every_operation_table_names_a_resource_of_its_own() {
        for table in Table::ALL {
            assert_eq!(Table::of(table.resource()), Some(*table), "{table:?}");
        }
    }
}
