//! The check every command but `serve` and `migrate` makes before it touches the database: the
//! schema is exactly the one of this binary's migrations. A command that migrated as a side
//! effect would let a newer binary upgrade production from a read (`accounts list`); one that ran
//! on an older schema would fail half-way through, and on a newer one write rows it no longer
//! understands. So both are refused, with what to do, and nothing is changed.

use std::collections::BTreeSet;

use anyhow::Context;
use diesel::QueryDsl;
use diesel::migration::MigrationSource;
use diesel::pg::Pg;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use orderpay::db;

diesel::table! {
    /// diesel_migrations' own record of the migrations run on a database (one row per version).
    __diesel_schema_migrations (version) {
        version -> VarChar,
    }
}

/// Refuses a database whose applied migrations are not exactly this binary's.
pub async fn require_current(conn: &mut AsyncPgConnection) -> anyhow::Result<()> {
    let known: BTreeSet<String> = MigrationSource::<Pg>::migrations(&db::MIGRATIONS)
        .map_err(|error| anyhow::anyhow!("the embedded migrations: {error}"))?
        .iter()
        .map(|migration| migration.name().version().to_string())
        .collect();
    let applied = applied(conn).await?;
    let ahead: Vec<&String> = applied.difference(&known).collect();
    if !ahead.is_empty() {
        anyhow::bail!(
            "the database is ahead of this orderpay: it has migrations this binary does not know \
             ({}); run this command with the orderpay that migrated it",
            list(&ahead)
        );
    }
    let behind: Vec<&String> = known.difference(&applied).collect();
    if !behind.is_empty() {
        anyhow::bail!(
            "the database is behind this orderpay: {} migration(s) not applied ({}); run \
             `orderpay migrate` first (only `serve` and `migrate` change the schema)",
            behind.len(),
            list(&behind)
        );
    }
    Ok(())
}

/// The versions recorded on the database; none when no migration ever ran there (the table is
/// made by the first one).
async fn applied(conn: &mut AsyncPgConnection) -> anyhow::Result<BTreeSet<String>> {
    use __diesel_schema_migrations::dsl::{__diesel_schema_migrations as migrations, version};
    match migrations.select(version).load::<String>(conn).await {
        Ok(versions) => Ok(versions.into_iter().collect()),
        Err(diesel::result::Error::DatabaseError(_, info))
            if info.message().contains("__diesel_schema_migrations")
                && info.message().contains("does not exist") =>
        {
            Ok(BTreeSet::new())
        }
        Err(error) => Err(error).context("cannot read the database's migrations"),
    }
}

fn list(versions: &[&String]) -> String {
    versions.iter().map(|version| version.as_str()).collect::<Vec<_>>().join(", ")
}
