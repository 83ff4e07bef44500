//! `orderpay secrets reseal`: every merchant webhook endpoint's signing secret sealed again under
//! the first key of `ORDERPAY_ENCRYPTION_KEY`, the step between adding a new key and dropping the
//! old one (docs/operations.md, "Rotating ORDERPAY_ENCRYPTION_KEY").

use clap::Subcommand;

use orderpay::config::DatabaseArgs;
use orderpay::encryption::Keyring;
use orderpay::merchant_webhooks::secrets::{self, Mode};

use super::{Output, connect, print_one};

#[derive(Subcommand)]
pub enum SecretsCommand {
    /// Seal every live webhook endpoint's secret (and, during a rotation's overlap, its previous
    /// secret) again under the first key of ORDERPAY_ENCRYPTION_KEY, reading them with any of its
    /// keys; secrets under the first key already are left alone, so it is safe to run again.
    /// Once it reports nothing unreadable, the keys after the first can be dropped. Fails
    /// (naming them) when some secret opens under no key.
    Reseal {
        /// The keys, as `serve` reads them: the new one first, then the old one(s), commas between.
        #[arg(long, env = "ORDERPAY_ENCRYPTION_KEY", hide_env_values = true)]
        encryption_key: String,
        /// Endpoints read per batch (each endpoint is then written in a statement of its own).
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..))]
        batch_size: i64,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(command: SecretsCommand) -> anyhow::Result<()> {
    match command {
        SecretsCommand::Reseal { encryption_key, batch_size, output, database } => {
            let keys = Keyring::parse(&encryption_key)?;
            let mut conn = connect(&database).await?;
            let report = secrets::pass(&mut conn, &keys, batch_size, Mode::Reseal).await?;
            let unreadable: Vec<String> = report
                .unreadable
                .iter()
                .map(|endpoint| {
                    format!(
                        "{} ({} of account {})",
                        endpoint.endpoint_id, endpoint.which, endpoint.account_id
                    )
                })
                .collect();
            print_one(
                &report,
                output,
                &[
                    ("resealed", report.resealed.to_string()),
                    ("current", report.current.to_string()),
                    ("expired dropped", report.expired_dropped.to_string()),
                    ("changed meanwhile", report.changed_meanwhile.to_string()),
                    (
                        "unreadable",
                        if unreadable.is_empty() { "-".to_owned() } else { unreadable.join(", ") },
                    ),
                ],
            )?;
            anyhow::ensure!(
                report.unreadable.is_empty(),
                "{} endpoint secret(s) open under no key of ORDERPAY_ENCRYPTION_KEY: add the key they were \
                 sealed with, or rotate those endpoints' secrets (POST /webhook_endpoints/{{id}}/rotate_secret); \
                 keep the old keys until this reports none",
                report.unreadable.len()
            );
            if report.changed_meanwhile > 0 {
                eprintln!("some endpoints changed while they were read (rotated or deleted): run it again");
            }
            Ok(())
        }
    }
}
