//! `orderpay provider check`: whether the provider settings make sense before `serve` relies on
//! them. With the mock's wire it asks the provider's `/health`; with Stripe's it reports which
//! settings are set and the key's mode, and says that no call is made yet.

use std::time::Duration;

use clap::{Args, Subcommand};

use orderpay::config::{ProviderArgs, ProviderKind, StripeSettings, WebhookArgs};
use orderpay::provider::client::install_crypto_provider;

#[derive(Subcommand)]
pub enum ProviderCommand {
    /// Check the provider settings: with ORDERPAY_PROVIDER=mock, GET the provider's /health;
    /// with stripe, report which settings are set and whether the key is test or live (no call
    /// is made yet). Fails when the provider is unhealthy or a setting is missing.
    Check(CheckArgs),
}

#[derive(Args)]
pub struct CheckArgs {
    #[command(flatten)]
    provider: ProviderArgs,
    #[command(flatten)]
    webhooks: WebhookArgs,
}

pub async fn run(command: ProviderCommand) -> anyhow::Result<()> {
    let ProviderCommand::Check(args) = command;
    match args.provider.kind {
        ProviderKind::Mock => check_health(&args.provider).await,
        ProviderKind::Stripe => {
            let report = args.provider.stripe_report(&args.webhooks);
            let width = report.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
            for (name, value) in &report {
                println!("{name:<width$}  {value}");
            }
            StripeSettings::read(&args.provider, &args.webhooks).map(drop)
        }
    }
}

async fn check_health(provider: &ProviderArgs) -> anyhow::Result<()> {
    let config = provider.config()?;
    let url = format!("{}/health", config.url.trim_end_matches('/'));
    install_crypto_provider();
    let client = reqwest::Client::builder().timeout(config.timeout.max(Duration::from_millis(1))).build()?;
    let answer =
        client.get(&url).send().await.map_err(|error| {
            anyhow::anyhow!("the mock provider at {} did not answer: {error}", config.url)
        })?;
    let status = answer.status();
    anyhow::ensure!(status.is_success(), "the mock provider at {url} answered HTTP {status}");
    println!("provider  mock");
    println!("url       {}", config.url);
    println!("health    ok (GET {url}: HTTP {})", status.as_u16());
    Ok(())
}
