//! Recording disputes as the provider reports them, the one writer of `disputes`: [`record_on`]
//! (in the caller's transaction: a provider webhook's, after its lookup) and the reconciler's
//! [`pass`], which once a minute lists the provider's disputes created since its last listing
//! (so a dispute whose every webhook was lost is recorded by one pass) and looks again at each
//! open one (so a lost `charge.dispute.closed` is too).

use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::Dispute;
use super::repository::{self, RecordDispute, RecordOutcome};
use super::representation::dispute_json;
use crate::events::EventType;
use crate::events::repository::NewEvent;
use crate::ids::AccountId;
use crate::operations::{Engine, EngineError};
use crate::provider::Dispute as ProviderDispute;

/// How far before the last pass the next listing starts: the provider's clock and ours may
/// disagree by this much (the webhooks' timestamp tolerance).
const CLOCK_MARGIN: chrono::Duration = chrono::Duration::minutes(5);
/// The open disputes the reconciler looks at again per listing, least recently changed first.
const OPEN_PER_PASS: i64 = 100;
/// How often the provider's disputes are listed (by one instance), whatever the reconcilers'
/// interval: disputes move in days, and every listing is a call to the provider.
const LIST_EVERY: chrono::Duration = chrono::Duration::minutes(1);

/// What recording a dispute did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The statement's outcome, our dispute's id when we hold it, and its account.
    Done { outcome: RecordOutcome, id: Option<Uuid>, account_id: AccountId },
    /// Its charge is no payment of ours (or one whose charge we do not know yet).
    NotOurs,
    /// It disagrees with its payment (another currency, more than was captured): not recorded.
    Disagrees,
}

impl Recorded {
    /// Whether it changed our records.
    pub fn applied(self) -> bool {
        matches!(self, Recorded::Done { outcome: RecordOutcome::Created | RecordOutcome::Updated, .. })
    }
}

/// Records `dispute` (the provider's word: a lookup's, never a webhook's object alone) on `conn`,
/// inside the caller's transaction: locks its payment, then runs the guarded statement.
pub async fn record_on(
    conn: &mut AsyncPgConnection,
    dispute: &ProviderDispute,
    source: &'static str,
) -> Result<Recorded, EngineError> {
    let Some(payment) = repository::lock_payment_of_charge(conn, &dispute.charge_id).await? else {
        return Ok(Recorded::NotOurs);
    };
    if dispute.currency != payment.currency.code() || dispute.amount > payment.amount_captured {
        tracing::error!(dispute_id = %dispute.id, payment_id = %payment.id, currency = %dispute.currency,
            amount = %dispute.amount, "the provider's dispute disagrees with its payment; not recorded");
        return Ok(Recorded::Disagrees);
    }
    let before = repository::find_by_provider_id(conn, &dispute.id).await?;
    let statement = RecordDispute {
        account_id: payment.account_id,
        id: Uuid::now_v7(),
        payment_id: payment.id,
        order_id: payment.order_id,
        provider_dispute_id: &dispute.id,
        amount: dispute.amount,
        currency: payment.currency,
        reason: &dispute.reason,
        status: dispute.status,
        closed_reason: dispute.closed_reason,
        evidence_due_by: dispute.evidence_due_by,
        amount_withdrawn: dispute.amount_withdrawn,
        amount_reinstated: dispute.amount_reinstated,
        provider_created_at: dispute.created_at,
        now: Utc::now(),
    };
    let now = statement.now;
    let (outcome, id) = repository::record(conn, statement).await?;
    if matches!(outcome, RecordOutcome::Created | RecordOutcome::Updated) {
        announce(conn, before.as_ref(), &dispute.id, now).await?;
    }
    let from = before.as_ref().map_or("none", |before| before.status.as_str());
    match outcome {
        RecordOutcome::Changed => {
            return Err(EngineError::Inconsistent(format!(
                "dispute {} inserted by another transaction under its payment's lock",
                dispute.id
            )));
        }
        RecordOutcome::Refused => tracing::warn!(dispute_id = %dispute.id, payment_id = %payment.id, from,
            to = %dispute.status, source, "a dispute's reported change breaks its guard; ignored"),
        RecordOutcome::DoesNotFit => tracing::warn!(dispute_id = %dispute.id, payment_id = %payment.id,
            source, "a dispute's money does not fit its payment beside a refund in flight; recorded later"),
        RecordOutcome::Created | RecordOutcome::Updated => tracing::info!(dispute_id = %dispute.id,
            payment_id = %payment.id, from, to = %dispute.status, source, "dispute recorded"),
        RecordOutcome::Unchanged => {}
    }
    crate::telemetry::metrics::dispute_recorded(outcome.as_str());
    Ok(Recorded::Done { outcome, id, account_id: payment.account_id })
}

/// Writes the events of what recording a dispute changed, in its transaction: `dispute.created`
/// for one we lacked, `dispute.funds_withdrawn` and `dispute.funds_reinstated` when that money
/// grew, `dispute.closed` when it reached a final status, `dispute.updated` for any other move.
async fn announce(
    conn: &mut AsyncPgConnection,
    before: Option<&Dispute>,
    provider_id: &str,
    now: DateTime<Utc>,
) -> Result<(), EngineError> {
    let Some(after) = repository::find_by_provider_id(conn, provider_id).await? else {
        return Err(EngineError::Vanished(format!("dispute {provider_id}")));
    };
    let data = dispute_json(&after).map_err(|error| EngineError::Inconsistent(error.to_string()))?;
    let mut kinds = Vec::new();
    let (withdrawn, reinstated) = before
        .map_or((Decimal::ZERO, Decimal::ZERO), |before| (before.amount_withdrawn, before.amount_reinstated));
    match before {
        None => kinds.push(EventType::DisputeCreated),
        Some(before) if before.status != after.status && !after.status.is_final() => {
            kinds.push(EventType::DisputeUpdated)
        }
        Some(_) => {}
    }
    if after.amount_withdrawn > withdrawn {
        kinds.push(EventType::DisputeFundsWithdrawn);
    }
    if after.amount_reinstated > reinstated {
        kinds.push(EventType::DisputeFundsReinstated);
    }
    if after.status.is_final() && before.is_none_or(|before| !before.status.is_final()) {
        kinds.push(EventType::DisputeClosed);
    }
    if kinds.is_empty() {
        // Only its evidence's due date moved: an update all the same.
        kinds.push(EventType::DisputeUpdated);
    }
    let events: Vec<NewEvent> = kinds.into_iter().map(|kind| NewEvent::new(kind, data.clone())).collect();
    crate::events::repository::insert(conn, after.account_id, &events, now).await?;
    Ok(())
}

/// Records `dispute` in a transaction of its own.
async fn record(engine: &Engine, dispute: &ProviderDispute) -> Result<Recorded, EngineError> {
    let mut conn = engine.pool.get().await?;
    conn.transaction(async |conn| record_on(conn, dispute, "reconciler").await).await
}

/// What one pass did: disputes recorded or moved, and errors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    pub applied: usize,
    pub errors: usize,
}

/// The reconciler's part for disputes, once per [`LIST_EVERY`] over every instance (the pass
/// that claims it): lists the provider's disputes created since the last listing (less
/// [`CLOCK_MARGIN`]) and records each, then looks at every open one again. The next listing
/// starts at this one's start, or at the oldest dispute it could not record: an error, money
/// that does not fit yet, or a charge that is no payment of ours *yet*. A dispute may name a
/// charge whose payment we have not settled (its charge id unknown while its outcome is
/// unknown, or a late charge not recorded yet); it becomes ours once that payment settles,
/// which the late-charge watch bounds. So a dispute of an unknown charge holds the listing back
/// while it is younger than that watch; an older one is another system's charge.
pub async fn pass(engine: &Engine) -> Result<Pass, EngineError> {
    let started = Utc::now();
    let claimed =
        repository::claim_listing(&mut *engine.pool.get().await?, started, started - LIST_EVERY).await?;
    let Some(from) = claimed else {
        return Ok(Pass::default());
    };
    let unverified = |error: crate::provider::ProviderError| EngineError::Unverified(error.to_string());
    let mut done = Pass::default();
    let mut next_from = started;
    let may_become_ours_since = crate::clock::before(started, engine.reconciler.late_charge_watch);
    let mut note = |outcome: Result<Recorded, EngineError>, created_at: DateTime<Utc>, id: &str| match outcome
    {
        Ok(recorded) => {
            done.applied += usize::from(recorded.applied());
            let not_yet_ours = recorded == Recorded::NotOurs && created_at > may_become_ours_since;
            if not_yet_ours || matches!(recorded, Recorded::Done { outcome: RecordOutcome::DoesNotFit, .. }) {
                next_from = next_from.min(created_at);
            }
        }
        Err(error) => {
            done.errors += 1;
            next_from = next_from.min(created_at);
            tracing::warn!(dispute_id = id, %error, "a dispute could not be recorded; the next pass tries again");
        }
    };
    let mut after: Option<String> = None;
    loop {
        let page =
            engine.provider.list_disputes(from - CLOCK_MARGIN, after.as_deref()).await.map_err(unverified)?;
        for dispute in &page.disputes {
            note(record(engine, dispute).await, dispute.created_at, &dispute.id);
        }
        match page.disputes.last() {
            Some(last) if page.has_more => after = Some(last.id.clone()),
            _ => break,
        }
    }
    let open = repository::open(&mut *engine.pool.get().await?, OPEN_PER_PASS).await?;
    for id in open {
        match engine.provider.get_dispute(&id, None).await {
            // An open dispute we hold is looked at again next pass whatever happens now.
            Ok(Some(dispute)) => note(record(engine, &dispute).await, started, &id),
            Ok(None) => tracing::error!(dispute_id = %id, "the provider no longer knows a dispute we hold"),
            Err(error) => note(Err(unverified(error)), started, &id),
        }
    }
    repository::move_listing(&mut *engine.pool.get().await?, next_from.max(from)).await?;
    Ok(done)
}
