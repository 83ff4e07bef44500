//! `orderpay provider check`: whether the provider settings make sense before `serve` relies on
//! them. With the mock's wire it asks the provider's `/health`, then looks up a key no payment
//! has (a read) to tell whether the provider accepts the API key; with Stripe's it reports which
//! settings are set and the key's mode, then reads Stripe's balance (`GET /v1/balance`, which
//! moves nothing) to tell whether Stripe accepts the key.

use std::time::Duration;

use clap::{Args, Subcommand};

use orderpay::config::{ProviderArgs, ProviderKind, StripeSettings, WebhookArgs};
use orderpay::provider::client::install_crypto_provider;
use orderpay::provider::stripe::{Mode, StripeProvider};
use orderpay::provider::{ChargeLookup, ProviderError};

#[derive(Subcommand)]
pub enum ProviderCommand {
    /// Check the provider settings: with ORDERPAY_PROVIDER=mock, GET the provider's /health
    /// and look up a charge no payment made (a read) with the API key; with stripe, report which settings are set and whether the key is test or live, then
    /// GET /v1/balance with the key. Fails when the provider is unhealthy, refuses the key, or a
    /// setting is missing.
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
            let settings = StripeSettings::read(&args.provider, &args.webhooks)?;
            check_stripe_key(&args.provider, &settings).await
        }
    }
}

/// Reads Stripe's balance with the key: Stripe refusing it, or a mode other than the key's
/// prefix says, fails the check.
async fn check_stripe_key(provider: &ProviderArgs, settings: &StripeSettings) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(provider.provider_timeout_ms.max(1));
    let stripe = StripeProvider::new(&settings.url, timeout, &settings.api_key)?;
    let livemode = stripe
        .check_key()
        .await
        .map_err(|error| anyhow::anyhow!("GET {}/v1/balance failed: {error}", settings.url))?;
    let said = if livemode { Mode::Live } else { Mode::Test };
    anyhow::ensure!(
        said == settings.api_key.mode(),
        "Stripe says the key is a {said} key, but it is written as a {} one",
        settings.api_key.mode()
    );
    println!("{:<15}  ok (GET /v1/balance: {said} mode)", "api call");
    Ok(())
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
    // A lookup moves nothing: a key no payment has is answered "none" once the key is accepted.
    let lookup = orderpay::app::provider(&config)?
        .find_charge(&ChargeLookup::by_key("orderpay_provider_check"), None)
        .await;
    match lookup {
        Ok(_) => println!("api key   ok (a lookup was answered)"),
        Err(error @ ProviderError::Unauthorized { .. }) => {
            anyhow::bail!("the mock provider refuses the API key (ORDERPAY_PROVIDER_API_KEY): {error}")
        }
        Err(error) => anyhow::bail!("the mock provider did not answer a lookup: {error}"),
    }
    Ok(())
}
