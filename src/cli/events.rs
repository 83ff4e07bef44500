//! `orderpay events redeliver EVENT_ID [--endpoint ID]`: sends an event again to the webhook
//! endpoints that receive it (or to one of them), for an endpoint that missed it.

use clap::Subcommand;

use orderpay::config::DatabaseArgs;
use orderpay::ids::{EndpointId, EventId};
use orderpay::merchant_webhooks::service;

use super::{Output, connect, print_list};

#[derive(Subcommand)]
pub enum EventsCommand {
    /// Queue new deliveries of an event, due now: to every live webhook endpoint of its account
    /// that receives its type, or to --endpoint alone. Prints what it queued. The receiver sees
    /// the event again with the same webhook-id.
    Redeliver {
        /// The event's id, as GET /events shows it.
        #[arg(value_parser = event_id)]
        event: EventId,
        /// Only this endpoint (its id, as GET /webhook_endpoints or `orderpay webhooks failing`
        /// shows it).
        #[arg(long, value_parser = endpoint_id)]
        endpoint: Option<EndpointId>,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

fn event_id(text: &str) -> Result<EventId, String> {
    EventId::parse(text.trim()).ok_or_else(|| format!("{text:?} is not an event id (a UUID)"))
}

pub fn endpoint_id(text: &str) -> Result<EndpointId, String> {
    EndpointId::parse(text.trim()).ok_or_else(|| format!("{text:?} is not a webhook endpoint id (a UUID)"))
}

pub async fn run(command: EventsCommand) -> anyhow::Result<()> {
    match command {
        EventsCommand::Redeliver { event, endpoint, output, database } => {
            let mut conn = connect(&database).await?;
            let queued = service::redeliver(&mut conn, event, endpoint).await?;
            if queued.is_empty() {
                eprintln!("no live webhook endpoint receives this event: nothing queued");
            }
            print_list(&queued, output, &["DELIVERY", "EVENT", "TYPE", "ENDPOINT", "URL"], |queued| {
                vec![
                    queued.delivery_id.to_string(),
                    queued.event_id.to_string(),
                    queued.event_type.to_owned(),
                    queued.endpoint_id.to_string(),
                    queued.url.clone(),
                ]
            })?;
        }
    }
    Ok(())
}
