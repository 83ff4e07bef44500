//! `orderpay settlement ...`: compare a window of the provider's money movements with the
//! ledger (`run`), list the exceptions nobody settled (`exceptions`), acknowledge one
//! (`resolve`). docs/books.md says what each category means and what to do about it.

use chrono::{DateTime, Utc};
use clap::Subcommand;

use orderpay::app;
use orderpay::config::{DatabaseArgs, ProviderArgs, SettlementArgs};
use orderpay::settlement::job::STALE_CLAIM;
use orderpay::settlement::repository::{self, Exception};
use orderpay::settlement::{self, Report, RunOptions, Window};

use super::{Output, connect, maybe_time, print_list, table, uuid};

#[derive(Subcommand)]
pub enum SettlementCommand {
    /// Compare the provider's money movements made in [--from, --to) with the ledger: every
    /// movement on either side lands in one category (matched or an exception). Running a
    /// window again adds nothing; an exception whose other side turned up since is matched.
    /// Exits 1 when the window has open exceptions.
    Run {
        /// The window's start (RFC 3339, e.g. 2030-01-01T00:00:00Z).
        #[arg(long, value_parser = rfc3339)]
        from: DateTime<Utc>,
        /// The window's end (RFC 3339), after its start.
        #[arg(long, value_parser = rfc3339)]
        to: DateTime<Utc>,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        provider: ProviderArgs,
        #[command(flatten)]
        settlement: SettlementArgs,
    },
    /// The exceptions nobody settled yet, oldest first, with both sides.
    Exceptions {
        /// The most to list.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Acknowledge an exception (after correcting what caused it, or deciding it needs nothing).
    Resolve {
        /// The exception's id, as `settlement exceptions` shows it.
        #[arg(value_name = "EXCEPTION_ID", value_parser = uuid)]
        id: uuid::Uuid,
        /// What was found and done, kept with the exception.
        #[arg(long)]
        note: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

fn rfc3339(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|at| at.with_timezone(&Utc))
        .map_err(|error| format!("{text:?} is not an RFC 3339 time ({error})"))
}

pub async fn run(command: SettlementCommand) -> anyhow::Result<()> {
    match command {
        SettlementCommand::Run { from, to, output, database, provider, settlement } => {
            anyhow::ensure!(to > from, "--to must be after --from");
            let provider = app::provider(&provider.config()?)?;
            let mut conn = connect(&database).await?;
            let options = RunOptions {
                page_size: settlement.settlement_page_size,
                scheduled: false,
                stale_claim: STALE_CLAIM,
            };
            let report =
                settlement::run(&mut conn, provider.as_ref(), Window { start: from, end: to }, options)
                    .await?;
            print_report(&report, output)?;
            if report.exceptions() > 0 {
                std::process::exit(1);
            }
        }
        SettlementCommand::Exceptions { limit, output, database } => {
            let mut conn = connect(&database).await?;
            let exceptions = repository::open_exceptions(&mut conn, limit).await?;
            let columns = ["ID", "CATEGORY", "CLASS", "OBJECT", "PROVIDER", "OURS", "WHEN"];
            print_list(&exceptions, output, &columns, exception_row)?;
        }
        SettlementCommand::Resolve { id, note, database } => {
            anyhow::ensure!(!note.trim().is_empty(), "--note must say what was found and done");
            let mut conn = connect(&database).await?;
            if !repository::resolve_exception(&mut conn, id, note.trim(), Utc::now()).await? {
                anyhow::bail!("no open exception {id} (`orderpay settlement exceptions` lists them)");
            }
            eprintln!("exception {id} resolved");
        }
    }
    Ok(())
}

fn exception_row(exception: &Exception) -> Vec<String> {
    let provider = exception.provider.as_ref().map_or_else(
        || "-".to_owned(),
        |side| {
            let amount = side.amount.map_or_else(|| "-".to_owned(), |amount| amount.to_string());
            format!(
                "{} {amount} {}",
                side.category.as_deref().unwrap_or("-"),
                side.currency.as_deref().unwrap_or("")
            )
        },
    );
    let ours = exception.ours.as_ref().map_or_else(
        || "-".to_owned(),
        |side| match (&side.movement_type, side.amount, &side.status) {
            (Some(kind), Some(amount), _) => {
                format!("{kind} {amount} {}", side.currency.as_deref().unwrap_or(""))
            }
            (_, _, Some(status)) => format!("recorded {status}"),
            _ => "-".to_owned(),
        },
    );
    let when = exception
        .provider
        .as_ref()
        .and_then(|side| side.created)
        .or(exception.ours.as_ref().and_then(|side| side.created));
    vec![
        exception.id.to_string(),
        exception.category.to_string(),
        exception.movement_class.to_string(),
        exception.object_id.map_or_else(|| "-".to_owned(), |id| id.to_string()),
        provider,
        ours,
        maybe_time(when),
    ]
}

fn print_report(report: &Report, output: Output) -> anyhow::Result<()> {
    if output.json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    let totals = |sums: &std::collections::BTreeMap<String, rust_decimal::Decimal>| {
        let parts: Vec<String> = sums.iter().map(|(currency, sum)| format!("{sum} {currency}")).collect();
        if parts.is_empty() { "-".to_owned() } else { parts.join(", ") }
    };
    println!(
        "window {} .. {}: {} provider movements read, {} items written, {} open exceptions",
        report.window.start.to_rfc3339(),
        report.window.end.to_rfc3339(),
        report.provider_read,
        report.items_written,
        report.exceptions()
    );
    let rows: Vec<Vec<String>> = report
        .categories
        .iter()
        .map(|(category, bucket)| {
            vec![
                category.to_string(),
                bucket.count.to_string(),
                totals(&bucket.provider),
                totals(&bucket.ours),
            ]
        })
        .collect();
    print!("{}", table(&["CATEGORY", "COUNT", "PROVIDER", "OURS"], &rows));
    println!("total: provider {}, ours {}", totals(&report.provider_total), totals(&report.ours_total));
    Ok(())
}
