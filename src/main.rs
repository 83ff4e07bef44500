//! The `orderpay` command line: `serve`, `migrate`, `mock-provider`, `reconcile`, and the
//! operator commands of `cli/` (`accounts ...`, `keys show`, `payments ...`, `events
//! redeliver`, `webhooks failing`, `secrets reseal`).

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use orderpay::app::Application;
use orderpay::config::{DatabaseArgs, MockProviderArgs, ServeArgs};
use orderpay::operations::reconciler;
use orderpay::provider::mock::MockProvider;
use orderpay::{db, telemetry};

#[derive(Parser)]
#[command(
    name = "orderpay",
    version,
    about = "Orders and payments over HTTP where every write is safe to retry"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP API (creates the database when missing and applies pending migrations first).
    // Boxed: every setting of the service makes it by far the largest command.
    Serve(Box<ServeArgs>),
    /// Create the database when missing, apply pending migrations and exit. Every command but
    /// `serve` and `migrate` refuses a database that is behind or ahead of this binary.
    Migrate(DatabaseArgs),
    /// Run the mock payment provider (state in memory; see docs/payments.md for its behaviour).
    MockProvider(MockProviderArgs),
    /// Settle payments whose outcome is unknown by asking the provider (`serve` does this too).
    Reconcile {
        /// One pass, then exit (prints what it did).
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        settings: cli::EngineArgs,
    },
    /// Manage accounts and their API keys.
    Accounts {
        #[command(subcommand)]
        command: cli::accounts::AccountsCommand,
    },
    /// Inspect idempotency keys (live, or expired and kept in the audit).
    Keys {
        #[command(subcommand)]
        command: cli::keys::KeysCommand,
    },
    /// Inspect payments (stuck ones first of all) and settle one whose outcome is unknown by hand.
    Payments {
        #[command(subcommand)]
        command: cli::payments::PaymentsCommand,
    },
    /// List disputes, those whose evidence is due soon first of all.
    Disputes {
        #[command(subcommand)]
        command: cli::disputes::DisputesCommand,
    },
    /// Check the books: the ledger's invariants.
    Ledger {
        #[command(subcommand)]
        command: cli::ledger::LedgerCommand,
    },

    /// Check the payment provider's settings (and, for the mock, that it answers).
    Provider {
        #[command(subcommand)]
        command: cli::provider::ProviderCommand,
    },
    /// Compare the provider's records of money movements with the ledger.
    Settlement {
        #[command(subcommand)]
        command: cli::settlement::SettlementCommand,
    },
    /// Act on events: send one again to merchant webhook endpoints.
    Events {
        #[command(subcommand)]
        command: cli::events::EventsCommand,
    },
    /// Inspect merchant webhook deliveries.
    Webhooks {
        #[command(subcommand)]
        command: cli::webhooks::WebhooksCommand,
    },
    /// Seal merchant webhook secrets again under the first key of ORDERPAY_ENCRYPTION_KEY.
    Secrets {
        #[command(subcommand)]
        command: cli::secrets::SecretsCommand,
    },
}

/// mimalloc rather than the system's allocator: the service allocates per request (bodies, JSON,
/// rows) from many threads at once.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An error is printed as its chain of causes on one line, never with a backtrace: every error
/// that reaches here is one the command expected to refuse with (a database not migrated, a bad
/// id, a payment that cannot be resolved), whatever `RUST_BACKTRACE` says. Panics still print
/// theirs.
#[actix_web::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    telemetry::init();
    match cli.command {
        Command::Serve(args) => Application::build(args.settings()?).await?.run_until_stopped().await,
        Command::Migrate(database) => {
            db::prepare(&database.config()?).await?;
            eprintln!("database is up to date");
            Ok(())
        }
        Command::MockProvider(args) => {
            let mock = MockProvider::build(args.settings())?;
            tracing::info!(port = mock.port(), "mock payment provider listening on {}", args.listen);
            Ok(mock.run_until_stopped().await?)
        }
        Command::Reconcile { once, settings } => {
            let (engine, config) = settings.engine().await?;
            if once {
                let report = reconciler::run_pass(&engine, &config).await?;
                println!(
                    "claimed={} settled={} redriven={} rescheduled={} stuck={} gave_up={} errors={}",
                    report.claimed,
                    report.settled,
                    report.redriven,
                    report.rescheduled,
                    report.stuck,
                    report.gave_up,
                    report.errors
                );
                return Ok(());
            }
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(reconciler::run(engine, config, stopped));
            tokio::signal::ctrl_c().await?;
            let _ = stop.send(true);
            Ok(task.await?)
        }
        Command::Accounts { command } => cli::accounts::run(command).await,
        Command::Keys { command } => cli::keys::run(command).await,
        Command::Payments { command } => cli::payments::run(command).await,
        Command::Disputes { command } => cli::disputes::run(command).await,
        Command::Ledger { command } => cli::ledger::run(command).await,
        Command::Provider { command } => cli::provider::run(command).await,
        Command::Settlement { command } => cli::settlement::run(command).await,
        Command::Events { command } => cli::events::run(command).await,
        Command::Webhooks { command } => cli::webhooks::run(command).await,
        Command::Secrets { command } => cli::secrets::run(command).await,
    }
}
