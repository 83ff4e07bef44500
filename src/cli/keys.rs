//! `orderpay keys show --account A KEY`: what an idempotency key did, while it is live and, after
//! it expired, from the audit.

use chrono::{DateTime, Utc};
use clap::Subcommand;
use diesel_async::AsyncPgConnection;
use serde::Serialize;
use uuid::Uuid;

use orderpay::config::DatabaseArgs;
use orderpay::idempotency::ResourceKind;
use orderpay::idempotency::store;
use orderpay::ids::{AccountId, LeaseId};
use orderpay::operations::leases::{self, Table};

use super::{Output, connect, print_one, time};

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Show what an Idempotency-Key was bound to and what it did: live, expired (waiting for the
    /// sweeper), or expired-in-audit (metadata kept ORDERPAY_IDEMPOTENCY_AUDIT_DAYS, no answer
    /// body); for an operation in flight, its lease and owner.
    Show {
        /// The account the key belongs to (its id, as `orderpay accounts list` shows it).
        #[arg(long, value_parser = super::account_id)]
        account: AccountId,
        /// The key, as the client sent it (without RFC 8941 quotes).
        key: String,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

/// Where a key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum State {
    /// Within its retention: a retry replays it.
    Live,
    /// Past its retention but not swept yet: a new request with it runs as new.
    Expired,
    /// Swept: only its metadata is left, in the audit.
    ExpiredInAudit,
}

impl State {
    /// As JSON spells it.
    fn as_str(self) -> &'static str {
        match self {
            State::Live => "live",
            State::Expired => "expired",
            State::ExpiredInAudit => "expired-in-audit",
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    account_id: AccountId,
    key: String,
    state: State,
    method: String,
    route: String,
    /// SHA-256 of the canonical request body, hex.
    fingerprint: String,
    resource_kind: ResourceKind,
    resource_id: Uuid,
    /// The answer's status: stored on the key row (orders), or on the operation's row once it
    /// settled (payments, captures, voids, refunds).
    stored_status: Option<i16>,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    /// Whether the operation is still in flight (its outcome unknown).
    in_flight: bool,
    /// While in flight: the lease of whoever drives it, when a live one holds it.
    lease_until: Option<DateTime<Utc>>,
    lease_owner: Option<LeaseId>,
    /// The operation's own status now, when the key started one.
    operation_status: Option<String>,
    /// Earlier uses of the same key, each expired, still in the audit.
    earlier_uses: usize,
}

pub async fn run(command: KeysCommand) -> anyhow::Result<()> {
    let KeysCommand::Show { account, key, output, database } = command;
    let mut conn = connect(&database).await?;
    let Some(report) = report(&mut conn, account, &key).await? else {
        anyhow::bail!(
            "no key {key:?} for account {account}: never used, or past its retention and the audit's"
        );
    };
    let lease = match (report.in_flight, report.lease_until, report.lease_owner) {
        (false, ..) => "-".to_owned(),
        (true, Some(until), Some(owner)) => format!("held by {owner} until {}", time(until)),
        (true, ..) => "none: waiting for a retry or the reconciler".to_owned(),
    };
    let fields = [
        ("account", report.account_id.to_string()),
        ("key", report.key.clone()),
        ("state", report.state.as_str().to_owned()),
        ("method", report.method.clone()),
        ("route", report.route.clone()),
        ("fingerprint", report.fingerprint.clone()),
        ("resource", format!("{} {}", report.resource_kind, report.resource_id)),
        ("stored status", report.stored_status.map_or_else(|| "-".to_owned(), |status| status.to_string())),
        ("operation", report.operation_status.clone().unwrap_or_else(|| "-".to_owned())),
        ("in flight", if report.in_flight { "yes" } else { "no" }.to_owned()),
        ("lease", lease),
        ("created", time(report.created_at)),
        ("expires", time(report.expires_at)),
        ("earlier uses", report.earlier_uses.to_string()),
    ];
    print_one(&report, output, &fields)
}

/// The key's current use (live, or the newest in the audit), with its operation.
async fn report(
    conn: &mut AsyncPgConnection,
    account: AccountId,
    key: &str,
) -> anyhow::Result<Option<Report>> {
    let now = Utc::now();
    let audit = store::find_audit(conn, account, key).await?;
    let live = store::find(conn, account, key).await?;
    let mut report = match (live, <[_]>::first(&audit)) {
        (Some(record), _) => Report {
            account_id: record.account_id,
            key: record.key,
            state: if record.expires_at > now { State::Live } else { State::Expired },
            method: record.method,
            route: record.route,
            fingerprint: hex::encode(&record.fingerprint),
            resource_kind: record.resource_kind,
            resource_id: record.resource_id,
            stored_status: record.response_status,
            created_at: record.created_at,
            expires_at: record.expires_at,
            in_flight: false,
            lease_until: None,
            lease_owner: None,
            operation_status: None,
            earlier_uses: audit.len(),
        },
        (None, Some(record)) => Report {
            account_id: record.account_id,
            key: record.key.clone(),
            state: State::ExpiredInAudit,
            method: record.method.clone(),
            route: record.route.clone(),
            fingerprint: hex::encode(&record.fingerprint),
            resource_kind: record.resource_kind,
            resource_id: record.resource_id,
            stored_status: record.response_status,
            created_at: record.created_at,
            expires_at: record.expires_at,
            in_flight: false,
            lease_until: None,
            lease_owner: None,
            operation_status: None,
            earlier_uses: audit.len() - 1,
        },
        (None, None) => return Ok(None),
    };
    // Tables come from the closed list of operation kinds, never from input.
    let table = Table::of(report.resource_kind);
    let operation = match table {
        Some(table) => leases::standing(conn, table, (account, report.resource_id)).await?,
        None => None,
    };
    if let Some(operation) = operation {
        report.in_flight = operation.processing && operation.answer_status().is_none();
        report.stored_status = report.stored_status.or(operation.answer_status());
        if report.in_flight
            && let Some(until) = operation.held_until(now)
        {
            report.lease_until = Some(until);
            report.lease_owner = operation.lease_id;
        }
        report.operation_status = Some(operation.status);
    }
    Ok(Some(report))
}
