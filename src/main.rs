//! The `orderpay` command line: `serve`, `migrate`, `mock-provider`, `reconcile`, and the
//! operator commands of `cli/` (`accounts ...`, `keys show`, `events redeliver`, `webhooks
//! failing`).

mod cli;

use clap::{Parser, Subcommand};

use orderpay::app::{self, Application};
use orderpay::config::{DatabaseArgs, MockProviderArgs, ProviderArgs, ReconcileArgs, ServeArgs};
use orderpay::operations::{Engine, Timing, reconciler};
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
    /// Run the HTTP API (applies pending migrations first).
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations and exit.
    Migrate(DatabaseArgs),
    /// Run the mock payment provider (state in memory; see docs/payments.md for its behaviour).
    MockProvider(MockProviderArgs),
    /// Settle payments whose outcome is unknown by asking the provider (`serve` does this too).
    Reconcile {
        /// One pass, then exit (prints what it did).
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        provider: ProviderArgs,
        #[command(flatten)]
        reconcile: ReconcileArgs,
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
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init();
    match cli.command {
        Command::Serve(args) => Application::build(args.settings()?).await?.run_until_stopped().await,
        Command::Migrate(database) => {
            db::prepare(&database.config()).await?;
            eprintln!("database is up to date");
            Ok(())
        }
        Command::MockProvider(args) => {
            let mock = MockProvider::build(args.settings())?;
            tracing::info!(port = mock.port(), "mock payment provider listening on {}", args.listen);
            Ok(mock.run_until_stopped().await?)
        }
        Command::Reconcile { once, database, provider, reconcile } => {
            db::prepare(&database.config()).await?;
            let provider_config = provider.config();
            let config = reconcile.config(&provider_config)?;
            // Outside requests no lease is handed to a request: only the recheck matters.
            let timing = Timing { lease: config.claim_for, recheck_after: config.backoff_base };
            let engine = Engine {
                pool: db::background_pool(&database.config(), 2),
                provider: app::provider(&provider_config)?,
                timing,
            };
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
        Command::Events { command } => cli::events::run(command).await,
        Command::Webhooks { command } => cli::webhooks::run(command).await,
    }
}
