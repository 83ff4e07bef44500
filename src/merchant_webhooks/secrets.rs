//! Endpoints' signing secrets at rest, under the keys of `ORDERPAY_ENCRYPTION_KEY`
//! ([`Keyring`]: the first seals, every one opens): opening one, with the error an operator can
//! act on when none opens it; sealing every secret again under the first key (`orderpay secrets
//! reseal`, the step that lets an old key be dropped); and the check `serve` makes at start.
//!
//! A secret that opens under no key cannot sign: its endpoint's deliveries fail with
//! [`UNREADABLE`] as their error (`orderpay webhooks failing` shows it), each counted by
//! `orderpay_webhook_secret_errors_total`, and `serve` names such endpoints when it starts.

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::endpoints::{self, SealedSecrets};
use super::secret_context;
use crate::db::Pool;
use crate::encryption::{Keyring, Opened};
use crate::ids::{AccountId, EndpointId};
use crate::webhook_signature::Secret;

/// Why an endpoint's secret does not sign: what the attempt records and the operator reads.
pub const UNREADABLE: &str = "the endpoint's signing secret opens under no key of ORDERPAY_ENCRYPTION_KEY: \
                              add the key it was sealed with to ORDERPAY_ENCRYPTION_KEY, or rotate the \
                              endpoint's secret";

/// An endpoint's secret that does not open (another key, changed bytes) or is not a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", UNREADABLE)]
pub struct Unreadable;

/// Opens a sealed secret of endpoint `id`.
pub fn open(
    keys: &Keyring,
    account_id: AccountId,
    id: EndpointId,
    sealed: &[u8],
) -> Result<Opened, Unreadable> {
    keys.open(sealed, &secret_context(account_id, id)).map_err(|_| Unreadable)
}

/// Opens a sealed secret of endpoint `id`, ready to sign.
pub fn signing(
    keys: &Keyring,
    account_id: AccountId,
    id: EndpointId,
    sealed: &[u8],
) -> Result<Secret, Unreadable> {
    let opened = open(keys, account_id, id, sealed)?;
    Secret::parse(&String::from_utf8_lossy(&opened.plaintext)).map_err(|_| Unreadable)
}

/// `plaintext` sealed for endpoint `id` under the first key.
pub fn seal(
    keys: &Keyring,
    account_id: AccountId,
    id: EndpointId,
    plaintext: &[u8],
) -> Result<Vec<u8>, crate::encryption::SealError> {
    keys.seal(plaintext, &secret_context(account_id, id))
}

/// An endpoint whose secret (or, during a rotation's overlap, previous secret) opens under no key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnreadableEndpoint {
    pub account_id: AccountId,
    pub endpoint_id: EndpointId,
    /// `secret` or `previous_secret`.
    pub which: &'static str,
}

/// What a pass over every live endpoint's secrets found (and, resealing, did).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Endpoints whose secrets were (or, checking only, would be) sealed again under the first key.
    pub resealed: usize,
    /// Endpoints whose secrets are all under the first key already.
    pub current: usize,
    /// Expired previous secrets dropped on the way (they sign nothing any more).
    pub expired_dropped: usize,
    /// Endpoints rotated or deleted between the read and the write: left for the next run.
    pub changed_meanwhile: usize,
    pub unreadable: Vec<UnreadableEndpoint>,
}

/// Whether [`pass`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `orderpay secrets reseal`: every secret not under the first key is sealed again under it.
    Reseal,
    /// At start: only look.
    Check,
}

/// One endpoint's secrets, sealed again under the first key where they are not already; `None`
/// when there is nothing to write.
struct Resealed {
    secret: Vec<u8>,
    previous: Option<Vec<u8>>,
    /// A secret was sealed under an older key.
    stale: bool,
    expired_dropped: bool,
}

/// Reads every live endpoint's secrets in batches of `batch_size` (in key order), opens each,
/// and with [`Mode::Reseal`] writes those not under the first key again, sealed under it, one
/// endpoint per statement and only if its secrets are still the ones read (a rotation or a
/// deletion meanwhile wins; the endpoint is counted as changed). A previous secret past its
/// overlap is dropped on the way. A secret that opens under no key is reported and left as it
/// is. Running it again finds everything current: it is safe to repeat.
pub async fn pass(
    conn: &mut AsyncPgConnection,
    keys: &Keyring,
    batch_size: i64,
    mode: Mode,
) -> diesel::QueryResult<Report> {
    let mut report = Report::default();
    let mut after = None;
    loop {
        let batch = endpoints::sealed_secrets_after(conn, after, batch_size).await?;
        let Some(last) = batch.last() else { break };
        after = Some((last.account_id, last.id));
        let now = Utc::now();
        for endpoint in &batch {
            let resealed = match reseal(keys, endpoint, now) {
                Err(which) => {
                    report.unreadable.push(UnreadableEndpoint {
                        account_id: endpoint.account_id,
                        endpoint_id: endpoint.id,
                        which,
                    });
                    continue;
                }
                Ok(None) => {
                    report.current += 1;
                    continue;
                }
                Ok(Some(resealed)) => resealed,
            };
            if mode == Mode::Check {
                match resealed.stale {
                    true => report.resealed += 1,
                    false => report.current += 1,
                }
                continue;
            }
            let written = endpoints::replace_sealed_secrets(
                conn,
                endpoint,
                &resealed.secret,
                resealed.previous.as_deref(),
            )
            .await?;
            match written {
                true => {
                    report.resealed += 1;
                    report.expired_dropped += usize::from(resealed.expired_dropped);
                }
                false => report.changed_meanwhile += 1,
            }
        }
        if (batch.len() as i64) < batch_size {
            break;
        }
    }
    Ok(report)
}

/// The endpoint's secrets as they should be stored: `Ok(None)` when they are already, `Err`
/// naming the secret that opens under no key.
fn reseal(
    keys: &Keyring,
    endpoint: &SealedSecrets,
    now: DateTime<Utc>,
) -> Result<Option<Resealed>, &'static str> {
    let (account_id, id) = (endpoint.account_id, endpoint.id);
    let again = |opened: Opened| -> Result<Vec<u8>, &'static str> {
        seal(keys, account_id, id, &opened.plaintext).map_err(|_| "secret")
    };
    let current = open(keys, account_id, id, &endpoint.secret).map_err(|_| "secret")?;
    let live_previous = endpoint
        .previous_secret
        .as_ref()
        .filter(|_| endpoint.previous_secret_expires_at.is_some_and(|until| until > now));
    let expired_dropped = endpoint.previous_secret.is_some() && live_previous.is_none();
    let previous = live_previous
        .map(|sealed| open(keys, account_id, id, sealed).map_err(|_| "previous_secret"))
        .transpose()?;
    let stale = !current.under_first_key || previous.as_ref().is_some_and(|opened| !opened.under_first_key);
    if !stale && !expired_dropped {
        return Ok(None);
    }
    let secret = if current.under_first_key { endpoint.secret.clone() } else { again(current)? };
    let previous = match (previous, live_previous) {
        (Some(opened), _) if !opened.under_first_key => Some(again(opened)?),
        (_, kept) => kept.cloned(),
    };
    Ok(Some(Resealed { secret, previous, stale, expired_dropped }))
}

/// At start: says, at error, which endpoints' secrets open under no key (their deliveries fail
/// until the key they were sealed with is added or their secrets are rotated), and, at info, how
/// many are sealed under an older key (`orderpay secrets reseal` moves them to the first).
pub async fn check_at_start(pool: &Pool, keys: &Keyring) {
    const NAMED: usize = 20;
    let checked = async {
        let mut conn = pool.get().await.map_err(|error| anyhow::anyhow!("{error}"))?;
        Ok::<_, anyhow::Error>(pass(&mut conn, keys, 1000, Mode::Check).await?)
    };
    match checked.await {
        Ok(report) => {
            if !report.unreadable.is_empty() {
                let named: Vec<String> = report
                    .unreadable
                    .iter()
                    .take(NAMED)
                    .map(|endpoint| {
                        format!(
                            "{} (account {}, {})",
                            endpoint.endpoint_id, endpoint.account_id, endpoint.which
                        )
                    })
                    .collect();
                tracing::error!(
                    count = report.unreadable.len(),
                    endpoints = %named.join(", "),
                    "webhook endpoints whose signing secret opens under no key of ORDERPAY_ENCRYPTION_KEY: \
                     their deliveries fail until the key they were sealed with is added to \
                     ORDERPAY_ENCRYPTION_KEY or their secrets are rotated"
                );
            }
            if report.resealed > 0 {
                tracing::info!(
                    count = report.resealed,
                    "webhook endpoint secrets sealed under an older key of ORDERPAY_ENCRYPTION_KEY: \
                     `orderpay secrets reseal` seals them under the first"
                );
            }
        }
        Err(error) => tracing::warn!(error = ?error, "could not check the webhook endpoints' secrets"),
    }
}
