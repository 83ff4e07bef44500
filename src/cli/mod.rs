//! Operator commands: `accounts ...`, `keys show`, `payments ...`, `disputes list`, `ledger check`,
//! `settlement ...`, `provider check` (the one that needs no database),
//! `events redeliver`, `webhooks failing` and `secrets reseal`. Each connects with `DATABASE_URL`, refuses a database
//! whose schema is not this binary's (`schema.rs`: only `serve` and `migrate` migrate), prints a
//! table for people by default and, with `--json`, JSON for scripts: a listing is a JSON array of
//! objects, a single thing one object. Secrets go to stdout alone, everything said around them
//! to stderr, so `KEY=$(orderpay ...)` captures just the secret.

pub mod accounts;
pub mod disputes;
pub mod events;
pub mod keys;
pub mod ledger;
pub mod payments;
pub mod provider;
pub mod schema;
pub mod secrets;
pub mod settlement;
pub mod webhooks;

use anyhow::Context;
use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;
use diesel_async::AsyncPgConnection;
use serde::Serialize;

use std::time::Duration;

use orderpay::app;
use orderpay::config::{DatabaseArgs, ProviderArgs, ReconcileArgs};
use orderpay::db;
use orderpay::ids::AccountId;
use orderpay::operations::reconciler::ReconcilerConfig;
use orderpay::operations::{Engine, Timing};

/// `--json`, for every command that prints something other than a secret.
#[derive(Debug, Clone, Copy, Args)]
pub struct Output {
    /// Print JSON (an array of objects for listings) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A connection for one command, to a database whose schema is this binary's (else refused).
pub async fn connect(database: &DatabaseArgs) -> anyhow::Result<AsyncPgConnection> {
    let config = database.config()?;
    let mut conn = db::establish(&config.url, config.connect_timeout)
        .await
        .context("cannot connect to DATABASE_URL (`orderpay migrate` creates a missing database)")?;
    schema::require_current(&mut conn).await?;
    Ok(conn)
}

/// What a command that drives provider operations reads (`reconcile`, `payments ...`): the
/// database, the provider and the reconciler's settings, as `serve` reads them.
#[derive(Args)]
pub struct EngineArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub provider: ProviderArgs,
    #[command(flatten)]
    pub reconcile: ReconcileArgs,
}

impl EngineArgs {
    /// The engine and the reconciler's settings, on a database whose schema is this binary's.
    pub async fn engine(&self) -> anyhow::Result<(Engine, ReconcilerConfig)> {
        // The provider's settings first: a wire that cannot be called is refused before any
        // connection is tried.
        let provider_config = self.provider.config()?;
        drop(connect(&self.database).await?);
        let database = self.database.config()?;
        let config = self.reconcile.config(&provider_config);
        // Outside requests no lease is handed to a request: only the recheck matters.
        let timing = Timing { lease: config.claim_for, recheck_after: config.backoff_base };
        let engine = Engine {
            pool: db::background_pool(&database, 2),
            provider: app::provider(&provider_config)?,
            timing,
            reconciler: config,
        };
        Ok((engine, config))
    }
}

/// Parses a human duration: a number and a unit (`s`, `m`, `h`, `d`), or a sum of them
/// (`1h30m`).
pub fn duration(text: &str) -> Result<Duration, String> {
    let wrong = || format!("{text:?} is not a duration such as 90s, 30m, 2h, 1d or 1h30m");
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(wrong());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(wrong)?;
        let number: u64 = rest[..digits].parse().map_err(|_| wrong())?;
        let unit = match rest[digits..].chars().next() {
            Some('s') => 1,
            Some('m') => 60,
            Some('h') => 3600,
            Some('d') => 86_400,
            _ => return Err(wrong()),
        };
        let seconds = number.checked_mul(unit).ok_or_else(wrong)?;
        total = total.checked_add(Duration::from_secs(seconds)).ok_or_else(wrong)?;
        rest = &rest[digits + 1..];
    }
    Ok(total)
}

/// Parses an account id as `accounts list` shows it.
pub fn account_id(text: &str) -> Result<AccountId, String> {
    AccountId::parse(text.trim())
        .ok_or_else(|| format!("{text:?} is not an account id (a UUID, as `orderpay accounts list` shows)"))
}

/// Parses a UUID (a key id as `accounts keys list` shows it).
pub fn uuid(text: &str) -> Result<uuid::Uuid, String> {
    uuid::Uuid::try_parse(text.trim()).map_err(|_| format!("{text:?} is not an id (a UUID)"))
}

/// A timestamp as the tables show it: RFC 3339 to the second, in UTC.
pub fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// An optional timestamp; `-` for none.
pub fn maybe_time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), time)
}

/// Prints a listing: a JSON array of `items`, or a table of `columns` with one row per item.
pub fn print_list<T: Serialize>(
    items: &[T],
    output: Output,
    columns: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if output.json {
        println!("{}", serde_json::to_string_pretty(items)?);
    } else {
        let rows: Vec<Vec<String>> = items.iter().map(row).collect();
        print!("{}", table(columns, &rows));
    }
    Ok(())
}

/// Left-aligned columns two spaces apart, a header line first: what `kubectl get` and `ps`
/// print. Small enough to write here rather than pull in a table crate and its dependencies.
pub fn table(columns: &[&str], rows: &[Vec<String>]) -> String {
    let width = |text: &str| text.chars().count();
    let mut widths: Vec<usize> = columns.iter().map(|column| width(column)).collect();
    for row in rows {
        for (cell, column_width) in row.iter().zip(widths.iter_mut()) {
            *column_width = (*column_width).max(width(cell));
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (index, (cell, column_width)) in cells.zip(&widths).enumerate() {
            if index + 1 == widths.len() {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(column_width - width(cell) + 2));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut columns.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// Prints one thing: a JSON object, or `field: value` lines with the values aligned.
pub fn print_one<T: Serialize>(item: &T, output: Output, fields: &[(&str, String)]) -> anyhow::Result<()> {
    if output.json {
        println!("{}", serde_json::to_string_pretty(item)?);
    } else {
        let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        for (name, value) in fields {
            println!("{name:<width$}  {value}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_numbers_with_units() {
        assert_eq!(duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        for wrong in ["", "30", "m", "30x", "1.5h", "-1h", "h30", "99999999999999999999d"] {
            assert!(duration(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn tables_align_columns_on_their_widest_cell() {
        let rows = vec![vec!["a".to_owned(), "longer value".to_owned(), "x".to_owned()]];
        assert_eq!(table(&["ID", "NAME", "KEYS"], &rows), "ID  NAME          KEYS\na   longer value  x\n");
        assert_eq!(table(&["ID"], &[]), "ID\n");
    }
}
