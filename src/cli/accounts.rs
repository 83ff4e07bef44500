//! `orderpay accounts create | list | keys create | keys list | keys revoke`.

use clap::Subcommand;
use uuid::Uuid;

use orderpay::accounts::{self, keys};
use orderpay::config::DatabaseArgs;
use orderpay::ids::AccountId;

use super::{Output, connect, maybe_time, print_list, time};

#[derive(Subcommand)]
pub enum AccountsCommand {
    /// Create an account and print its secret API key (shown this once only) on stdout.
    Create {
        /// A name for the account.
        name: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// List the accounts: id, name, number of live (not revoked) keys.
    List {
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Manage an account's API keys (several per account, so that a key can be rotated).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create another API key for ACCOUNT and print its secret (shown this once only) on stdout.
    Create {
        /// The account's id, as `orderpay accounts list` shows it.
        #[arg(value_parser = super::account_id)]
        account: AccountId,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// List ACCOUNT's keys: id, prefix, created, last used (to the minute), revoked. Never the
    /// secret.
    List {
        /// The account's id, as `orderpay accounts list` shows it.
        #[arg(value_parser = super::account_id)]
        account: AccountId,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Revoke a key: every running instance refuses it (401) within a second.
    Revoke {
        /// The key's id, as `orderpay accounts keys list` shows it.
        #[arg(value_parser = super::uuid)]
        key_id: Uuid,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(command: AccountsCommand) -> anyhow::Result<()> {
    match command {
        AccountsCommand::Create { name, database } => {
            let mut conn = connect(&database).await?;
            let (account, key) = accounts::create(&mut conn, &name).await?;
            eprintln!(
                "created account {:?} ({}); its API key follows, shown only this once:",
                account.name, account.id
            );
            println!("{}", key.reveal());
        }
        AccountsCommand::List { output, database } => {
            let mut conn = connect(&database).await?;
            let list = accounts::list(&mut conn).await?;
            print_list(&list, output, &["ID", "NAME", "LIVE KEYS", "CREATED"], |account| {
                vec![
                    account.id.to_string(),
                    account.name.clone(),
                    account.live_keys.to_string(),
                    time(account.created_at),
                ]
            })?;
        }
        AccountsCommand::Keys { command } => run_keys(command).await?,
    }
    Ok(())
}

async fn run_keys(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create { account, database } => {
            let mut conn = connect(&database).await?;
            let Some((account, info, key)) = keys::create(&mut conn, account).await? else {
                anyhow::bail!("no account {account}");
            };
            eprintln!(
                "created key {} ({}) for account {:?} ({}); its secret follows, shown only this once:",
                info.id,
                info.prefix.as_deref().unwrap_or("-"),
                account.name,
                account.id
            );
            println!("{}", key.reveal());
        }
        KeysCommand::List { account, output, database } => {
            let mut conn = connect(&database).await?;
            if accounts::find(&mut conn, account).await?.is_none() {
                anyhow::bail!("no account {account}");
            }
            let list = keys::list(&mut conn, account).await?;
            print_list(&list, output, &["ID", "PREFIX", "CREATED", "LAST USED", "REVOKED"], |key| {
                vec![
                    key.id.to_string(),
                    key.prefix.clone().unwrap_or_else(|| "-".to_owned()),
                    time(key.created_at),
                    maybe_time(key.last_used_at),
                    maybe_time(key.revoked_at),
                ]
            })?;
        }
        KeysCommand::Revoke { key_id, database } => {
            let mut conn = connect(&database).await?;
            match keys::revoke(&mut conn, key_id).await? {
                None => anyhow::bail!("no API key {key_id}"),
                Some(keys::Revocation::AlreadyRevoked(key)) => {
                    eprintln!("key {key_id} was already revoked at {}", maybe_time(key.revoked_at));
                }
                Some(keys::Revocation::Revoked(key)) => {
                    eprintln!(
                        "revoked key {key_id} ({}) of account {}; running instances refuse it within a second",
                        key.prefix.as_deref().unwrap_or("-"),
                        key.account_id
                    );
                    let live = keys::list(&mut conn, key.account_id).await?;
                    if live.iter().all(|key| key.revoked_at.is_some()) {
                        eprintln!(
                            "warning: account {} has no live key left; `orderpay accounts keys create {}` makes one",
                            key.account_id, key.account_id
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
