//! A keyed request that starts or resumes a provider operation (`POST /payments`, a capture, a
//! void, a refund): the part of the request flow every kind shares.
//!
//! The kind's own statement starts the operation (claiming the key with it). From there:
//! a key seen before resolves to its operation, which answers its final answer, tells the
//! client to wait while a live driver holds it, or is taken over when its driver is gone
//! ([`existing_key`]); and an operation this request drives is sent (or looked up and re-sent)
//! in a task of its own, so that a client hanging up does not lose the outcome, and recorded
//! ([`finish`]).

use chrono::Utc;
use diesel_async::AsyncPgConnection;
use tracing::Instrument;

use super::leases::{self, Lease, LeaseTarget};
use super::{Actor, DriveMode, Engine, Finding, Kind, drive};
use crate::clock::after;
use crate::error::ApiError;
use crate::idempotency::store;
use crate::idempotency::{Execution, KeyConflict, KeyedRequest, Keys, Resolved, StoredResponse};
use crate::ids::LeaseId;

/// Where a request stands once its operation's statement ran, or its key was resolved.
pub enum Begin<K: Kind> {
    /// A final answer: executed now (a refusal stored with the key) or replayed.
    Answered(Execution),
    /// An operation this request now drives, under its lease.
    Drive { op: K::Op, lease: LeaseId, mode: DriveMode },
}

/// How a request for a provider operation ends.
#[derive(Debug)]
pub enum Answer {
    /// A final answer, stored for the key (or replayed).
    Final(Execution),
    /// The outcome is unknown (202); nothing final is stored, a retry resumes it.
    Pending(StoredResponse),
}

/// A key that started an operation before (its statement wrote nothing this time): replay,
/// refuse, wait, or take over. `None` when the caller must run its statement again: the key
/// was swept or expired meanwhile (now free), or it names an operation that was never created
/// (its start refused and died before it could clear the key: now cleared).
pub async fn existing_key<K: Kind>(
    engine: &Engine,
    conn: &mut AsyncPgConnection,
    keyed: &KeyedRequest,
) -> Result<Option<Begin<K>>, ApiError> {
    let (account_id, key) = (keyed.account_id, keyed.key.as_str());
    let now = Utc::now();
    let Some(record) = store::find(conn, account_id, key).await? else {
        return Ok(None);
    };
    let resource_id = match record.resolve(keyed, now)? {
        Some(Resolved::Answer(answer)) => return Ok(Some(Begin::Answered(Execution::Replayed(answer)))),
        Some(Resolved::Operation { resource_id, .. }) => resource_id,
        None => {
            store::expire(conn, account_id, key, now).await?;
            return Ok(None);
        }
    };
    let id = (account_id, resource_id);
    let Some(standing) = leases::standing(conn, K::TABLE, id).await? else {
        tracing::info!(%resource_id, "clearing a key whose operation was never created");
        store::abandon(conn, account_id, key, resource_id).await?;
        return Ok(None);
    };
    if let Some((status, body)) = standing.answer() {
        return Ok(Some(Begin::Answered(Execution::Replayed(K::stored_answer(resource_id, status, body)))));
    }
    if let Some(until) = standing.held_until(now) {
        let retry_after = (until - now).to_std().unwrap_or_default();
        return Err(KeyConflict::InUse { retry_after, resource_id: Some(resource_id) }.into());
    }
    let lease = Lease { id: LeaseId::generate(), until: after(now, engine.timing.lease) };
    let taken = leases::lease(conn, K::TABLE, LeaseTarget::One(account_id, resource_id), lease, now).await?;
    let op = match taken.first() {
        Some(_) => K::load(conn, id).await?,
        None => None,
    };
    let Some(op) = op else {
        // Another driver took it between the read and the compare-and-set.
        let retry_after = std::time::Duration::from_secs(1);
        return Err(KeyConflict::InUse { retry_after, resource_id: Some(resource_id) }.into());
    };
    tracing::info!(%resource_id, kind = K::TABLE.label(), "taking over an abandoned operation");
    crate::telemetry::metrics::idempotency_outcome("takeover");
    Ok(Some(Begin::Drive { op, lease: lease.id, mode: DriveMode::Redrive }))
}

/// Ends a request: a final answer as it is, or drives the operation and records what the
/// provider said. Final answers are kept in memory for replays.
pub async fn finish<K: Kind>(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    begin: Begin<K>,
    request_id: &str,
) -> Result<Answer, ApiError> {
    let answer = match begin {
        Begin::Answered(execution) => Answer::Final(execution),
        Begin::Drive { op, lease, mode } => {
            let engine = engine.clone();
            let request_id = request_id.to_owned();
            let task = async move {
                let (finding, _) = drive::<K>(&engine, &op, lease, mode, Some(&request_id)).await;
                record::<K>(&engine, &op, lease, finding).await
            };
            tokio::spawn(task.in_current_span())
                .await
                .map_err(|error| ApiError::Internal(anyhow::anyhow!("operation task failed: {error}")))?
        }
    };
    if let Answer::Final(execution) = &answer {
        keys.remember(keyed, execution.response());
    }
    Ok(answer)
}

/// Records what a request's own drive found: a final outcome is settled and answered; an
/// unknown one releases the lease for a retry or the reconciler and answers 202. If the
/// database fails here, the provider may still have acted: the answer is 202 too, never a 5xx
/// that invites a second attempt, and the lease runs out for a retry or the reconciler.
async fn record<K: Kind>(engine: &Engine, op: &K::Op, lease: LeaseId, finding: Finding<K::Final>) -> Answer {
    let reason = match finding {
        Finding::Final(outcome) => match K::settle(&engine.pool, op, outcome, Actor::Request).await {
            Ok(Some(recorded)) => return Answer::Final(Execution::Executed(recorded.answer)),
            // Only a give-up is ever held back, and requests never give up.
            Ok(None) => return Answer::Pending(K::pending_answer(op)),
            Err(error) => {
                tracing::error!(error = %error, "could not record an operation's outcome; left processing");
                return Answer::Pending(K::pending_answer(op));
            }
        },
        Finding::Unknown { reason } => reason,
        Finding::NotReceived => "the provider has not received the request".to_owned(),
    };
    tracing::warn!(%reason, kind = K::TABLE.label(), "operation outcome unknown; left processing");
    match leave_processing::<K>(engine, op, lease, &reason).await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::error!(error = %error, "could not release an operation's lease");
            Answer::Pending(K::pending_answer(op))
        }
    }
}

async fn leave_processing<K: Kind>(
    engine: &Engine,
    op: &K::Op,
    lease: LeaseId,
    reason: &str,
) -> Result<Answer, super::EngineError> {
    let mut conn = engine.pool.get().await?;
    let next_check = after(Utc::now(), engine.timing.recheck_after);
    let id = K::id(op);
    leases::release(&mut conn, K::TABLE, id, lease, next_check, reason, Utc::now()).await?;
    // Someone else may have settled it meanwhile: their answer is the answer.
    if let Some((status, body)) =
        leases::standing(&mut conn, K::TABLE, id).await?.and_then(|standing| standing.answer())
    {
        return Ok(Answer::Final(Execution::Executed(K::stored_answer(id.1, status, body))));
    }
    let current = K::load(&mut conn, id).await?.unwrap_or_else(|| op.clone());
    Ok(Answer::Pending(K::pending_answer(&current)))
}
