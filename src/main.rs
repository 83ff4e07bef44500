//! The `orderpay` command line: `serve`, `migrate`, `accounts create`.

use clap::{Parser, Subcommand};
use diesel_async::{AsyncConnection, AsyncPgConnection};

use orderpay::app::Application;
use orderpay::config::{DatabaseArgs, ServeArgs};
use orderpay::{accounts, db, telemetry};

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
    Serve(ServeArgs),
    /// Apply pending database migrations and exit.
    Migrate(DatabaseArgs),
    /// Manage accounts.
    Accounts {
        #[command(subcommand)]
        command: AccountsCommand,
    },
}

#[derive(Subcommand)]
enum AccountsCommand {
    /// Create an account and print its secret API key (shown this once only) on stdout.
    Create {
        /// A name for the account.
        name: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init();
    match cli.command {
        Command::Serve(args) => Application::build(args.settings()?).await?.run_until_stopped().await,
        Command::Migrate(database) => {
            db::prepare(&database.database_url).await?;
            eprintln!("database is up to date");
            Ok(())
        }
        Command::Accounts { command: AccountsCommand::Create { name, database } } => {
            db::prepare(&database.database_url).await?;
            let mut conn = AsyncPgConnection::establish(&database.database_url).await?;
            let (account, key) = accounts::create(&mut conn, &name).await?;
            eprintln!(
                "created account {:?} ({}); its API key follows, shown only this once:",
                account.name, account.id
            );
            println!("{}", key.reveal());
            Ok(())
        }
    }
}
