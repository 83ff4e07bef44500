//! Provider operations: calls to the payment provider whose outcome we may not see (a payment's
//! charge or authorization, a capture, a void, a refund), and the one engine that drives every
//! kind of them to a final state, whoever drives (docs/payments.md).
//!
//! An operation's row holds what moves while it runs: its status (`processing` while the
//! outcome is unknown), the lease of whoever drives it, when it last sent a request, and, once
//! settled, its final answer ([`leases`]). Each kind ([`Kind`]: [`charge`], [`authorization`],
//! [`refund`]) says how to ask the provider about one and how to record a final outcome; the
//! engine does the rest the same way for all of them:
//!
//! - [`drive`]: send, or look the operation up by its downstream key first and re-send (same key)
//!   only what the provider never received, noting each re-send under the lease;
//! - the kind's `settle`: apply a final outcome in one statement (guarded status change,
//!   aggregates, audit row, final answer); or [`leases::release`] an unknown one for a later
//!   check.
//!
//! The drivers are the request ([`request`]: after its own send, or taking an abandoned
//! operation over), the reconciler ([`reconciler`]), which claims due operations of every
//! kind, and the provider's webhooks ([`webhooks`]), which settle an operation in flight as soon
//! as the provider reports its outcome. Whichever commits its guarded transition first wins; the
//! others change nothing and answer from it.

/// Every kind of provider operation, in one list: its [`Kind`], its operation table, its label in
/// metrics and logs, and what a key that starts one names (its `ResourceKind` variant and that
/// variant's spelling in `idempotency_keys.resource_kind`). Everything kept per kind is derived
/// from this list by a callback macro: the operation tables and their lease statements
/// (`leases`), the reconciler's passes (`reconciler`), the resource kinds of keys
/// (`idempotency::store`) and the statements the tests prepare (`db::statement`). Adding a kind
/// is one line here (and its `Kind`; see docs/architecture.md).
macro_rules! every_kind {
    ($callback:ident) => {
        $callback! {
            $crate::operations::charge::Charges => Payments("payments", "payment", Payment = "payment"),
            $crate::operations::authorization::Actions => PaymentOperations(
                "payment_operations", "capture_or_void", PaymentOperation = "payment_operation"
            ),
            $crate::operations::refund::Refunds => Refunds("refunds", "refund", Refund = "refund"),
            $crate::operations::dispute_response::DisputeResponses => DisputeResponses(
                "dispute_responses", "dispute_response", DisputeResponse = "dispute_response"
            ),
        }
    };
}
pub(crate) use every_kind;

pub mod authorization;
pub mod charge;
pub mod dispute_response;
pub mod late_charge;
pub mod late_refund;
pub mod leases;
pub mod operator;
pub mod reconciler;
pub mod refund;
pub mod request;
pub mod settled;
pub mod webhooks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use diesel_async::AsyncPgConnection;
use uuid::Uuid;

use crate::db::{Pool, PoolRunError};
use crate::error::ApiError;
use crate::idempotency::StoredResponse;
use crate::idempotency::store::ResourceKind;
use crate::ids::{AccountId, LeaseId};
use crate::provider::PaymentProvider;
use leases::Table;

/// What every driver of provider operations needs.
#[derive(Clone)]
pub struct Engine {
    pub pool: Pool,
    pub provider: Arc<dyn PaymentProvider>,
    pub timing: Timing,
    /// The reconciler's rules (backoff, attempts, the give-up's quiet period, the watches), which
    /// the other drivers follow too when they start a watch.
    pub reconciler: reconciler::ReconcilerConfig,
}

/// The engine's clock settings.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a request owns an operation while it calls the provider; longer than the
    /// provider timeout, so a live request is never taken over.
    pub lease: Duration,
    /// When an unknown outcome left by a request is first checked again.
    pub recheck_after: Duration,
}

/// What the provider's answer says about an operation, `F` being its kind's final outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding<F> {
    /// A final outcome: done, or definitely refused.
    Final(F),
    /// We do not know (yet): the operation stays `processing`.
    Unknown { reason: String },
    /// The provider has no record of the downstream key: it never received a request. (Only a
    /// lookup answers this; a send never does.)
    NotReceived,
    /// The provider refused the call before acting on it (our credentials): this call did
    /// nothing, and nothing will happen until an operator fixes the settings. The operation
    /// stays `processing` with no check counted against it; a first send answers 503
    /// `provider-unavailable` and its retry sends again. (After an earlier send, a refused
    /// lookup says nothing about that send: the answer is 202, as for `Unknown`.)
    Unsent { reason: String },
    /// The provider holds the operation's downstream key with other parameters: it did not act
    /// on this call, and no later send can (a bug, ours or another's). The operation is held
    /// for a person: `processing`, no check scheduled (the reconciler leaves it alone, so it is
    /// never given up on), listed as stuck, until an operator resolves it.
    KeyConflict { reason: String },
}

impl<F> Finding<F> {
    /// What a failed provider call says about an operation, when the kind reads nothing more
    /// into it: a refused credential is a call never acted on; anything else leaves the outcome
    /// unknown.
    pub fn of_error(error: &crate::provider::ProviderError) -> Finding<F> {
        match error {
            crate::provider::ProviderError::Unauthorized { .. } => {
                Finding::Unsent { reason: error.to_string() }
            }
            crate::provider::ProviderError::KeyReused { .. } => {
                Finding::KeyConflict { reason: error.to_string() }
            }
            _ => Finding::Unknown { reason: error.to_string() },
        }
    }
}

crate::text_enum! {
    /// Who applied a transition, for the audit trail.
    pub enum Actor {
        Request = "request",
        Reconciler = "reconciler",
        Webhook = "webhook",
        Operator = "operator",
        System = "system",
    }
}

/// How much the provider may already know about an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveMode {
    /// Straight after it started: the provider has certainly never seen it; send it.
    FirstCall,
    /// A takeover or the reconciler: look it up by its downstream key first, and re-send it
    /// (same key) only if the provider never received it.
    Redrive,
    /// Look only; never send. The reconciler's last check before giving up.
    LookupOnly,
}

/// A final outcome recorded: the operation's final answer (for its key), and whether this
/// driver applied it (false: someone else settled it first, and theirs is the answer).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub answer: StoredResponse,
    pub applied: bool,
}

/// The reconciler gives up on an operation the provider never received, after `attempts`
/// checks, on a lookup that found nothing: only if that lookup could not miss a send still in
/// flight ([`SendQuiet`]). A payment or refund given up on is then watched for `late_watch`, in
/// case the provider acts anyway; the first look comes `quiet_for` later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveUp {
    pub attempts: i32,
    pub quiet_for: Duration,
    pub late_watch: Duration,
    pub quiet: SendQuiet,
}

/// The guard of every settle that concludes "the provider never received it" (a give-up, an
/// operator's failure without `--force`): it applies only if the operation's last send
/// (`last_send_at`, noted under the lease before every send, at the database's clock) is older
/// than `since`, and only while `lease` still holds the operation. `since` is the database's
/// clock when the lease was taken, before the lookup that found nothing, less the provider
/// timeout and a margin: a send that could still land when the lookup asked holds it back. (A
/// clock read at the settle would let a slow lookup pass: it may have asked while the send was
/// in flight.) Under the lease nobody sends meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendQuiet {
    pub since: DateTime<Utc>,
    pub lease: LeaseId,
}

impl SendQuiet {
    /// For a lookup made under `lease`, taken at `leased_at` (the database's clock), with
    /// `quiet_for` the provider timeout and the give-up's margin.
    pub fn new(leased_at: DateTime<Utc>, quiet_for: Duration, lease: LeaseId) -> Self {
        SendQuiet { since: crate::clock::before(leased_at, quiet_for), lease }
    }
}

/// One kind of provider operation: where its rows are, how to ask the provider about one, and
/// how to record a final outcome. Adding a provider operation means implementing this.
pub trait Kind: Send + Sync + 'static {
    /// Its table (for the shared claim, lease, send mark and release).
    const TABLE: Table;
    /// What a key that starts one names (`idempotency_keys.resource_kind`), as its table says.
    const RESOURCE: ResourceKind = Self::TABLE.resource();
    /// The operation as a driver holds it: its row and what its provider calls need.
    type Op: Clone + Send + Sync + 'static;
    /// Its final outcomes.
    type Final: Send + 'static;

    /// Its row's key.
    fn id(op: &Self::Op) -> (AccountId, Uuid);

    /// Its own statements (its start and settle, and any other only it runs), so that the tests
    /// that prepare and plan every statement (`db::statement::every_statement`) find them.
    #[cfg(any(test, feature = "test-hooks"))]
    fn statements() -> Vec<crate::db::statement::Declared>;

    /// Loads an operation of this kind.
    fn load(
        conn: &mut AsyncPgConnection,
        id: (AccountId, Uuid),
    ) -> impl Future<Output = diesel::QueryResult<Option<Self::Op>>> + Send;

    /// Sends it to the provider (with its downstream key).
    fn send(
        provider: &dyn PaymentProvider,
        op: &Self::Op,
        request_id: Option<&str>,
    ) -> impl Future<Output = Finding<Self::Final>> + Send;

    /// Asks the provider what became of it, by its downstream key.
    fn look_up(
        provider: &dyn PaymentProvider,
        op: &Self::Op,
        request_id: Option<&str>,
    ) -> impl Future<Output = Finding<Self::Final>> + Send;

    /// The final outcome of an operation the reconciler gives up on: the provider never
    /// received it.
    fn gave_up(op: &Self::Op, give_up: GiveUp) -> Self::Final;

    /// How long one given up on is watched for the provider acting on it late (a charge: the
    /// late-charge watch; a refund: the late-refund watch).
    fn late_watch(config: &reconciler::ReconcilerConfig) -> Duration {
        config.late_charge_watch
    }

    /// Applies a final outcome in one statement, guarded by the operation being in flight, and
    /// returns the final answer (someone else's, if they settled it first). `None`: a give-up
    /// held back because a send may still be in flight; the operation is unchanged.
    fn settle(
        pool: &Pool,
        op: &Self::Op,
        outcome: Self::Final,
        actor: Actor,
    ) -> impl Future<Output = Result<Option<Recorded>, EngineError>> + Send {
        async move {
            let mut conn = pool.get().await?;
            let recorded = Self::settle_on(&mut conn, op, outcome, actor).await?;
            if recorded.as_ref().is_some_and(|recorded| recorded.applied) {
                settled::tell(Self::TABLE, Self::id(op).1);
            }
            Ok(recorded)
        }
    }

    /// [`Kind::settle`] on a connection the caller holds, so that it can run inside the caller's
    /// transaction: a webhook writes its dedup row first and commits it with the settle
    /// ([`webhooks`]). The same statement either way: it stays the only writer of a settle.
    fn settle_on(
        conn: &mut AsyncPgConnection,
        op: &Self::Op,
        outcome: Self::Final,
        actor: Actor,
    ) -> impl Future<Output = Result<Option<Recorded>, EngineError>> + Send;

    /// The final answer stored on its row, with the headers that go with it.
    fn stored_answer(id: Uuid, status: u16, body: Vec<u8>) -> StoredResponse;

    /// The 202 answer while its outcome is unknown (not stored).
    fn pending_answer(op: &Self::Op) -> StoredResponse;
}

/// Asks the provider about `op`, as the holder of `lease`. Returns what it found and whether a
/// request was (re)sent.
///
/// A re-send is noted on the operation under the lease first ([`leases::mark_sending`]), so that
/// a give-up, ordered against it by the database, can tell that a send may still be in flight; a
/// driver whose lease was taken over sends nothing.
pub async fn drive<K: Kind>(
    engine: &Engine,
    op: &K::Op,
    lease: LeaseId,
    mode: DriveMode,
    request_id: Option<&str>,
) -> (Finding<K::Final>, bool) {
    let provider = engine.provider.as_ref();
    if mode == DriveMode::FirstCall {
        // The statement that started the operation marked the send.
        crate::hooks::point("drive.before_send").await;
        return (K::send(provider, op, request_id).await, true);
    }
    crate::hooks::point("drive.before_look_up").await;
    match K::look_up(provider, op, request_id).await {
        Finding::NotReceived if mode == DriveMode::LookupOnly => (Finding::NotReceived, false),
        // The provider never received it (W1): send it now, with the same key.
        Finding::NotReceived => {
            crate::hooks::point("drive.before_mark_sending").await;
            match mark_sending::<K>(engine, op, lease).await {
                Ok(true) => {
                    crate::hooks::point("drive.before_send").await;
                    (K::send(provider, op, request_id).await, true)
                }
                Ok(false) => {
                    (Finding::Unknown { reason: "another driver holds the operation".into() }, false)
                }
                Err(error) => (Finding::Unknown { reason: error.to_string() }, false),
            }
        }
        found => (found, false),
    }
}

async fn mark_sending<K: Kind>(engine: &Engine, op: &K::Op, lease: LeaseId) -> Result<bool, EngineError> {
    let mut conn = engine.pool.get().await?;
    Ok(leases::mark_sending(&mut conn, K::TABLE, K::id(op), lease).await?)
}

/// Why the engine could not record what it learned; the operation stays as it was, for a retry
/// or the next reconciler pass.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("database: {0}")]
    Database(#[from] diesel::result::Error),
    #[error("database pool: {0}")]
    Pool(#[from] PoolRunError),
    #[error("{0} vanished")]
    Vanished(String),
    /// What the engine was about to record contradicts what it checked (a bug).
    #[error("inconsistent: {0}")]
    Inconsistent(String),
    /// A provider webhook could not be verified: the provider could not be asked. Nothing was
    /// recorded; the provider delivers the event again.
    #[error("the provider could not be asked to verify: {0}")]
    Unverified(String),
}

/// The engine could not record what it learned: the database is away (503) or a row vanished
/// (500).
impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Database(error) => error.into(),
            EngineError::Pool(error) => error.into(),
            vanished @ EngineError::Vanished(_) => ApiError::Internal(vanished.into()),
            inconsistent @ EngineError::Inconsistent(_) => ApiError::Internal(inconsistent.into()),
            unverified @ EngineError::Unverified(_) => ApiError::Unavailable(unverified.into()),
        }
    }
}
