//! A keyed request that starts or resumes a provider operation (`POST /payments`, a capture, a
//! void, a refund): the request flow every kind shares, written once.
//!
//! [`run`] is the whole flow: a replay from memory; then rounds of the kind's own start
//! statement ([`Start`]), which claims the key and starts the operation in one statement and
//! says what it decided ([`Started`]); a key seen before resolves to its operation, which
//! answers its final answer, tells the client to wait while a live driver holds it, or is taken
//! over when its driver is gone ([`existing_key`]); and an operation this request drives is sent
//! (or looked up and re-sent) in a task of its own, so that a client hanging up does not lose the
//! outcome, and recorded ([`finish`]).

use std::future::Future;

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::AsyncPgConnection;
use tracing::Instrument;
use uuid::Uuid;

use super::leases::{self, Lease, LeaseTarget};
use super::settled::Wait;
use super::{Actor, DriveMode, Engine, Finding, Kind, drive};
use crate::clock::after;
use crate::error::ApiError;
use crate::idempotency::store::{self, ClaimParameters};
use crate::idempotency::{Execution, KeyConflict, KeyedRequest, Keys, Resolved, StoredResponse};
use crate::ids::LeaseId;

/// How often a start statement runs again when what it met changed under it (a key swept or
/// expired, a row committed while it waited for a lock); more means the database misbehaves.
const START_ROUNDS: usize = 3;

/// What a kind's start statement decided, for the start loop to act on.
pub enum Started<K: Kind> {
    /// The operation is inserted `processing`, leased to this request: send it.
    Drive(K::Op),
    /// A final answer about the request (the resource is in a state that refuses it), stored
    /// with the key.
    Answer(StoredResponse),
    /// A refusal the client can fix: not stored, the key is cleared for a corrected request.
    Refuse(ApiError),
    /// The key was used before; nothing was written.
    ExistingKey,
    /// The key started this operation before (it expired since and was claimed anew): that
    /// operation answers; nothing was started.
    Resume(Uuid),
    /// What the statement met changed under it (a row committed while it waited for a lock):
    /// nothing of the operation was written; run it again.
    Again,
}

/// Why a start statement could not decide.
#[derive(Debug)]
pub enum StartError {
    Database(diesel::result::Error),
    Api(ApiError),
}

impl From<diesel::result::Error> for StartError {
    fn from(error: diesel::result::Error) -> Self {
        StartError::Database(error)
    }
}

impl From<ApiError> for StartError {
    fn from(error: ApiError) -> Self {
        StartError::Api(error)
    }
}

/// One round of a start: the new operation's id, its lease, the clock, and the key's claim for
/// the operation (the first piece of every start statement, `claim_key.sql`).
pub struct Round<'a> {
    pub id: Uuid,
    pub lease: Lease,
    pub now: DateTime<Utc>,
    pub claim: ClaimParameters<'a>,
}

/// A request that starts one operation of `Self::Kind`: its start statement, run once a round.
pub trait Start: Sync {
    type Kind: Kind;

    /// Runs the start statement once and says what it decided.
    fn run(
        &self,
        conn: &mut AsyncPgConnection,
        round: Round<'_>,
    ) -> impl Future<Output = Result<Started<Self::Kind>, StartError>> + Send;
}

/// Where a request stands once its operation's statement ran, or its key was resolved; with
/// when its key expires (the in-memory copy of a final answer lives no longer).
pub enum Begin<K: Kind> {
    /// A final answer: executed now (a refusal stored with the key) or replayed.
    Answered { execution: Execution, key_expires_at: DateTime<Utc> },
    /// An operation this request now drives, under its lease.
    Drive { op: K::Op, lease: LeaseId, mode: DriveMode, key_expires_at: DateTime<Utc> },
}

/// How a request for a provider operation ends.
#[derive(Debug)]
pub enum Answer {
    /// A final answer, stored for the key (or replayed).
    Final(Execution),
    /// The outcome is unknown (202); nothing final is stored, a retry resumes it.
    Pending(StoredResponse),
}

/// A keyed request that starts an operation: replay, start (or resume), drive, record.
pub async fn run<S: Start>(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    start: &S,
    request_id: &str,
) -> Result<Answer, ApiError> {
    if let Some(replay) = keys.replay(keyed) {
        return Ok(Answer::Final(replay));
    }
    let begin = {
        let mut conn = engine.pool.get().await?;
        begin(engine, &mut conn, keys, keyed, start).await?
    };
    finish::<S::Kind>(engine, keys, keyed, begin, request_id).await
}

/// The start loop: the kind's statement, run again when what it met changed under it.
async fn begin<S: Start>(
    engine: &Engine,
    conn: &mut AsyncPgConnection,
    keys: &Keys,
    keyed: &KeyedRequest,
    start: &S,
) -> Result<Begin<S::Kind>, ApiError> {
    let (account_id, key) = (keyed.account_id, keyed.key.as_str());
    for _ in 0..START_ROUNDS {
        let now = Utc::now().trunc_subsecs(6);
        let id = Uuid::now_v7();
        let lease = Lease { id: LeaseId::generate(), until: after(now, engine.timing.lease) };
        let resource = (<S::Kind as Kind>::RESOURCE, id);
        let claim = ClaimParameters::new(account_id, Some(keyed), resource, None, now, keys.retention);
        let key_expires_at = claim.expires_at;
        let started = match start.run(conn, Round { id, lease, now, claim }).await {
            Ok(started) => started,
            Err(StartError::Database(error)) => {
                if let Some(constraint) = crate::db::money_guard_violated(&error) {
                    // The statement's own guard should have refused it first: a bug in the guard.
                    // Nothing was written; the next round answers what the guard says.
                    tracing::error!(constraint, error = %error, kind = <S::Kind as Kind>::TABLE.label(),
                        "a money constraint refused what a start statement's guard let through");
                    crate::telemetry::metrics::guard_violation(constraint);
                    continue;
                }
                return Err(error.into());
            }
            Err(StartError::Api(error)) => return Err(error),
        };
        match started {
            Started::Drive(op) => {
                return Ok(Begin::Drive { op, lease: lease.id, mode: DriveMode::FirstCall, key_expires_at });
            }
            Started::Answer(answer) => {
                crate::hooks::point("start.before_answer").await;
                // False: the claim was cleared meanwhile (this request stalled past the grace a
                // retry gives it); the key's answer is whatever it holds now, never a second one.
                if store::complete(conn, account_id, key, id, &answer).await? {
                    let execution = Execution::Executed(answer);
                    return Ok(Begin::Answered { execution, key_expires_at });
                }
            }
            Started::Refuse(error) => {
                store::abandon(conn, account_id, key, id).await?;
                return Err(error);
            }
            Started::ExistingKey => {
                if let Some(begin) = existing_key::<S::Kind>(engine, conn, keyed).await? {
                    return Ok(begin);
                }
            }
            Started::Resume(earlier) => {
                if store::repoint(conn, account_id, key, id, earlier).await? {
                    return resume::<S::Kind>(engine, conn, (account_id, earlier), key_expires_at).await;
                }
            }
            // The statement may have claimed the key for an operation it did not start.
            Started::Again => store::abandon(conn, account_id, key, id).await?,
        }
    }
    Err(ApiError::Unavailable(anyhow::anyhow!("starting an operation kept meeting changes")))
}

/// A key that started an operation before (its statement wrote nothing this time): replay,
/// refuse, wait, or take over. `None` when the caller must run its statement again: the key
/// was swept or expired meanwhile (now free), or it names an operation that was never created
/// and whose claimer is gone (its start refused and died before it could answer or clear the
/// key: now cleared).
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
    let key_expires_at = record.expires_at;
    let resource_id = match record.resolve(keyed, now)? {
        Some(Resolved::Answer(answer)) => {
            let execution = Execution::Replayed(answer);
            return Ok(Some(Begin::Answered { execution, key_expires_at }));
        }
        Some(Resolved::Operation { resource_id, .. }) => resource_id,
        None => {
            store::expire(conn, account_id, key, now).await?;
            return Ok(None);
        }
    };
    let id = (account_id, resource_id);
    if leases::standing(conn, K::TABLE, id).await?.is_none() {
        // Its start statement refused and committed the claim; the request that ran it answers
        // (or clears) the key next, unless it died. Until a lease's time has passed it is alive,
        // and its answer is the key's: wait for it rather than run again with another answer.
        let claimer_until = after(record.created_at, engine.timing.lease);
        if claimer_until > now {
            let retry_after = (claimer_until - now).to_std().unwrap_or_default();
            return Err(KeyConflict::InUse { retry_after, resource_id: Some(resource_id) }.into());
        }
        tracing::info!(%resource_id, "clearing a key whose operation was never created");
        store::abandon(conn, account_id, key, resource_id).await?;
        return Ok(None);
    }
    resume::<K>(engine, conn, (account_id, resource_id), key_expires_at).await.map(Some)
}

/// The operation a key started: its final answer (a replay), a wait while a live driver holds
/// it, or a takeover when its driver is gone.
async fn resume<K: Kind>(
    engine: &Engine,
    conn: &mut AsyncPgConnection,
    id: (crate::ids::AccountId, Uuid),
    key_expires_at: DateTime<Utc>,
) -> Result<Begin<K>, ApiError> {
    let (account_id, resource_id) = id;
    let now = Utc::now();
    let Some(standing) = leases::standing(conn, K::TABLE, id).await? else {
        return Err(ApiError::Internal(anyhow::anyhow!("{} {resource_id} vanished", K::TABLE.label())));
    };
    if let Some((status, body)) = standing.answer() {
        let execution = Execution::Replayed(K::stored_answer(resource_id, status, body));
        return Ok(Begin::Answered { execution, key_expires_at });
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
    Ok(Begin::Drive { op, lease: lease.id, mode: DriveMode::Redrive, key_expires_at })
}

/// Ends a request: a final answer as it is, or drives the operation and records what the
/// provider said. Final answers are kept in memory for replays, until their key expires.
pub async fn finish<K: Kind>(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    begin: Begin<K>,
    request_id: &str,
) -> Result<Answer, ApiError> {
    let (answer, key_expires_at) = match begin {
        Begin::Answered { execution, key_expires_at } => (Answer::Final(execution), key_expires_at),
        Begin::Drive { op, lease, mode, key_expires_at } => {
            let engine = engine.clone();
            let request_id = request_id.to_owned();
            let task = async move {
                // Another driver (the provider's webhook, usually) may settle it while the
                // provider holds its answer: then that is the answer, at once.
                let id = K::id(&op);
                let wait = Wait::on(K::TABLE, id.1);
                tokio::select! {
                    (finding, _) = drive::<K>(&engine, &op, lease, mode, Some(&request_id)) => {
                        crate::hooks::point("request.before_record").await;
                        record::<K>(&engine, &op, (lease, mode), finding).await
                    }
                    () = wait.settled() => Ok(settled_meanwhile::<K>(&engine, &op, lease).await),
                }
            };
            let answer = tokio::spawn(task.in_current_span())
                .await
                .map_err(|error| ApiError::Internal(anyhow::anyhow!("operation task failed: {error}")))??;
            (answer, key_expires_at)
        }
    };
    if let Answer::Final(execution) = &answer {
        keys.remember(keyed, execution.response(), key_expires_at);
    }
    Ok(answer)
}

/// Records what a request's own drive found: a final outcome is settled and answered; an
/// unknown one releases the lease for a retry or the reconciler and answers 202. If the
/// database fails here, the provider may still have acted: the answer is 202 too, never a 5xx
/// that invites a second attempt, and the lease runs out for a retry or the reconciler.
///
/// A first send the provider refused unacted (our credentials) answers 503
/// `provider-unavailable` with the operation's id: the operation is recorded and released
/// unsent, no answer is stored, and a retry with the same key sends it again under the same
/// downstream key (so does the reconciler, once the provider accepts us). After an earlier send
/// (a takeover) the refusal may have come from the lookup, after that send acted: the outcome
/// is unknown, and the answer is 202 like any unknown outcome.
async fn record<K: Kind>(
    engine: &Engine,
    op: &K::Op,
    (lease, mode): (LeaseId, DriveMode),
    finding: Finding<K::Final>,
) -> Result<Answer, ApiError> {
    let reason = match finding {
        Finding::Final(outcome) => match K::settle(&engine.pool, op, outcome, Actor::Request).await {
            Ok(Some(recorded)) => return Ok(Answer::Final(Execution::Executed(recorded.answer))),
            // Only a give-up is ever held back, and requests never give up.
            Ok(None) => return Ok(Answer::Pending(K::pending_answer(op))),
            Err(error) => {
                tracing::error!(error = %error, "could not record an operation's outcome; left processing");
                return Ok(Answer::Pending(K::pending_answer(op)));
            }
        },
        Finding::Unsent { reason } if mode == DriveMode::FirstCall => {
            tracing::error!(%reason, kind = K::TABLE.label(),
                "the provider refused our credentials on the first send; it acted on nothing");
            return match leave_processing::<K>(engine, op, lease, &reason).await {
                // Settled meanwhile by another driver: that is the answer.
                Ok(answer @ Answer::Final(_)) => Ok(answer),
                Ok(Answer::Pending(_)) => Err(ApiError::ProviderUnavailable {
                    resource_id: K::id(op).1,
                    retry_after_secs: crate::error::retry_after_secs(engine.timing.recheck_after),
                }),
                Err(error) => {
                    tracing::error!(error = %error, "could not release an operation's lease");
                    Ok(Answer::Pending(K::pending_answer(op)))
                }
            };
        }
        Finding::KeyConflict { reason } => {
            tracing::error!(%reason, kind = K::TABLE.label(),
                "the provider holds the operation's key with other parameters; held for a person");
            return Ok(hold_for_person::<K>(engine, op, lease, &reason).await.unwrap_or_else(|error| {
                tracing::error!(error = %error, "could not hold an operation for a person");
                Answer::Pending(K::pending_answer(op))
            }));
        }
        Finding::Unsent { reason } | Finding::Unknown { reason } => reason,
        Finding::NotReceived => "the provider has not received the request".to_owned(),
    };
    tracing::warn!(%reason, kind = K::TABLE.label(), "operation outcome unknown; left processing");
    match leave_processing::<K>(engine, op, lease, &reason).await {
        Ok(answer) => Ok(answer),
        Err(error) => {
            tracing::error!(error = %error, "could not release an operation's lease");
            Ok(Answer::Pending(K::pending_answer(op)))
        }
    }
}

/// The answer of an operation another driver settled while this request's provider call was on
/// its way.
async fn settled_meanwhile<K: Kind>(engine: &Engine, op: &K::Op, lease: LeaseId) -> Answer {
    let id = K::id(op);
    let standing = match engine.pool.get().await {
        Ok(mut conn) => leases::standing(&mut conn, K::TABLE, id).await.ok().flatten(),
        Err(_) => None,
    };
    match standing.and_then(|standing| standing.answer()) {
        Some((status, body)) => {
            tracing::info!(
                kind = K::TABLE.label(),
                "another driver settled the operation while its provider call was on its way"
            );
            Answer::Final(Execution::Executed(K::stored_answer(id.1, status, body)))
        }
        // Not to be seen (only an applied settle tells): let it go for a retry or the reconciler.
        None => leave_processing::<K>(engine, op, lease, "told it was settled, but it was not")
            .await
            .unwrap_or_else(|_| Answer::Pending(K::pending_answer(op))),
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
    leases::release(&mut conn, K::TABLE, K::id(op), lease, next_check, reason, Utc::now()).await?;
    answer_after_release::<K>(&mut conn, op).await
}

/// As [`leave_processing`], but with no check scheduled: held for a person
/// ([`super::Finding::KeyConflict`]).
async fn hold_for_person<K: Kind>(
    engine: &Engine,
    op: &K::Op,
    lease: LeaseId,
    reason: &str,
) -> Result<Answer, super::EngineError> {
    let mut conn = engine.pool.get().await?;
    leases::hold(&mut conn, K::TABLE, K::id(op), lease, reason, Utc::now()).await?;
    answer_after_release::<K>(&mut conn, op).await
}

/// The answer once a request has let its operation go unsettled: 202 with the operation as it
/// stands, unless someone else settled it meanwhile (their answer is the answer).
async fn answer_after_release<K: Kind>(
    conn: &mut diesel_async::AsyncPgConnection,
    op: &K::Op,
) -> Result<Answer, super::EngineError> {
    let id = K::id(op);
    if let Some((status, body)) =
        leases::standing(conn, K::TABLE, id).await?.and_then(|standing| standing.answer())
    {
        return Ok(Answer::Final(Execution::Executed(K::stored_answer(id.1, status, body))));
    }
    let current = K::load(conn, id).await?.unwrap_or_else(|| op.clone());
    Ok(Answer::Pending(K::pending_answer(&current)))
}
