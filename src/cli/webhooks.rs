//! `orderpay webhooks failing`: the webhook endpoints whose deliveries fail, with what they
//! answered last and when they are tried next.

use clap::Subcommand;

use orderpay::config::DatabaseArgs;
use orderpay::merchant_webhooks::queue;

use super::{Output, connect, maybe_time, print_list, time};

#[derive(Subcommand)]
pub enum WebhooksCommand {
    /// List the live endpoints with failing deliveries (retrying, or given up on and not
    /// delivered since): endpoint, account, URL, how many, failing since, the last error and
    /// HTTP status, the next attempt. `orderpay events redeliver` sends a given-up event again.
    Failing {
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(command: WebhooksCommand) -> anyhow::Result<()> {
    match command {
        WebhooksCommand::Failing { output, database } => {
            let mut conn = connect(&database).await?;
            let failing = queue::failing_endpoints(&mut conn).await?;
            let columns = [
                "ENDPOINT",
                "ACCOUNT",
                "URL",
                "FAILING",
                "GAVE UP",
                "SINCE",
                "LAST ERROR",
                "LAST STATUS",
                "NEXT ATTEMPT",
            ];
            print_list(&failing, output, &columns, |endpoint| {
                vec![
                    endpoint.endpoint_id.to_string(),
                    endpoint.account_id.to_string(),
                    endpoint.url.clone(),
                    endpoint.failing_deliveries.to_string(),
                    endpoint.gave_up.to_string(),
                    time(endpoint.failing_since),
                    endpoint.last_error.clone().unwrap_or_else(|| "-".to_owned()),
                    endpoint.last_status.map_or_else(|| "-".to_owned(), |status| status.to_string()),
                    maybe_time(endpoint.next_attempt_at),
                ]
            })?;
        }
    }
    Ok(())
}
