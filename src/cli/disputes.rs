//! `orderpay disputes list`: every account's disputes as the provider reported them, newest
//! first, those whose evidence is due soon on request (the `OrderpayDisputeEvidenceDueSoon`
//! runbook).

use std::time::Duration;

use chrono::Utc;
use clap::Subcommand;
use serde::Serialize;

use orderpay::config::DatabaseArgs;
use orderpay::disputes::repository::{self, Filter};
use orderpay::disputes::representation::DisputeResource;
use orderpay::disputes::{Dispute, DisputeStatus};
use orderpay::ids::AccountId;
use orderpay::money::Amount;

use super::{Output, maybe_time, print_list};

#[derive(Subcommand)]
pub enum DisputesCommand {
    /// List disputes, newest first. The JSON objects are GET /disputes/{id}'s, with account_id.
    List {
        /// Only disputes that need a response (needs_response, warning_needs_response) whose
        /// evidence is due within this long: 12h, 3d, or a sum such as 1d12h.
        #[arg(long, value_parser = super::duration)]
        due_within: Option<Duration>,
        /// Only disputes in this status: warning_needs_response, warning_under_review,
        /// warning_closed, needs_response, under_review, won, lost.
        #[arg(long, value_parser = status)]
        status: Option<DisputeStatus>,
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

fn status(text: &str) -> Result<DisputeStatus, String> {
    DisputeStatus::parse(text.trim()).ok_or_else(|| format!("{text:?} is not a dispute status"))
}

#[derive(Serialize)]
struct Listed<'a> {
    #[serde(skip)]
    row: &'a Dispute,
    account_id: AccountId,
    #[serde(flatten)]
    dispute: DisputeResource<'a>,
}

pub async fn run(command: DisputesCommand) -> anyhow::Result<()> {
    match command {
        DisputesCommand::List { due_within, status, limit, output, database } => {
            let mut conn = super::connect(&database).await?;
            let due_before = due_within
                .map(|within| chrono::Duration::from_std(within).map(|within| Utc::now() + within))
                .transpose()?;
            let filter = Filter { status, payment_id: None, due_before };
            let (disputes, _) = repository::list(&mut conn, None, filter, limit, None).await?;
            let listed = disputes
                .iter()
                .map(|row| Ok(Listed { row, account_id: row.account_id, dispute: DisputeResource::of(row)? }))
                .collect::<Result<Vec<_>, orderpay::error::ApiError>>()
                .map_err(|error| anyhow::anyhow!("{error}"))?;
            let columns =
                ["ID", "ACCOUNT", "PAYMENT", "STATUS", "AMOUNT", "REASON", "EVIDENCE DUE", "PROVIDER ID"];
            print_list(&listed, output, &columns, |listed| {
                let dispute = listed.row;
                let amount = Amount::from_decimal(dispute.amount, dispute.currency)
                    .map_or_else(|_| dispute.amount.to_string(), |amount| amount.to_string());
                vec![
                    dispute.id.to_string(),
                    dispute.account_id.to_string(),
                    dispute.payment_id.to_string(),
                    dispute.status.to_string(),
                    format!("{amount} {}", dispute.currency),
                    dispute.reason.clone(),
                    maybe_time(dispute.evidence_due_by),
                    dispute.provider_dispute_id.clone(),
                ]
            })?;
        }
    }
    Ok(())
}
