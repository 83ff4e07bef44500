//! Refunds the provider carries out after we gave up on them are recorded, not lost; refunds it
//! reverses after they succeeded are recorded too. Both on the provider's confirmed word.
//!
//! A give-up waits until the refund's last send has been quiet for the provider timeout and a
//! margin (the charge's guard, ordered against every send by the database); still, a provider
//! can act later than any timeout. So a refund given up on is watched (`refunds.late_watch_until`,
//! `ORDERPAY_LATE_REFUND_WATCH_SECS`, with backoff): the reconciler looks its downstream key up,
//! a read that never creates or changes anything at the provider. What it finds:
//!
//! - a refund that succeeded: the give-up is corrected, `failed` -> `succeeded` ([`correct`]);
//! - none, or a failed one: it is known not carried out so far (`absent_since`), and looked at
//!   again until the watch ends; the first time, a system refund's payment is looked at again
//!   (`late_charge`'s follow-up may now start another refund of the late charge);
//! - a pending one, or no answer: looked at again later, past the watch's end if need be (the
//!   provider has not said yet whether it carried the refund out).
//!
//! A provider webhook reporting a watched refund failed brings its next look forward
//! ([`refunds::look_again`](crate::refunds::repository::look_again)) while the watch is on; a
//! watch that has ended stays ended (the webhook agrees with what we hold).
//!
//! [`correct`] is the one writer of the two corrections that leave a final state (docs/payments.md):
//! `failed` -> `succeeded` (carried out late) and `succeeded` -> `failed` (a reversal, reported by
//! the provider's webhook and confirmed by a lookup). Each moves `amount_refunded`, the order to
//! what the amounts say, writes the refund's event with `"correction": true` (and the order's
//! for its new status), and the audit row; the refund's stored answer never changes.

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use rust_decimal::Decimal;

use super::reconciler::{PassReport, ReconcilerConfig};
use super::refund::{RefundOutcome, Refunds};
use super::{Actor, Engine, EngineError, Finding, Kind};
use crate::clock::after;
use crate::events::repository::NewEvent;
use crate::events::{Announce, EventType};
use crate::orders::OrderStatus;
use crate::orders::repository as orders;
use crate::orders::service::rendered_after;
use crate::payments::repository as payments;
use crate::payments::representation::payment_json;
use crate::payments::watches;
use crate::provider::{Refund as ProviderRefund, RefundStatus as ProviderRefundStatus};
use crate::refunds::repository::{self as refunds, CorrectRefund, Watched};
use crate::refunds::representation::correction_json;
use crate::refunds::{Refund, RefundStatus};

/// A settled refund's correction, on the provider's confirmed word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Correction {
    /// `failed` -> `succeeded`: the provider carried it out after all.
    CarriedOut { provider_refund_id: String },
    /// `succeeded` -> `failed`: the provider reversed it (the card was closed, ...).
    Reversed { code: String, message: String },
}

impl Correction {
    /// The correction that takes a settled refund of ours (`ours`) to what the provider holds
    /// (`provider`): `None` when they agree, or when ours is not settled.
    pub fn between(ours: RefundStatus, provider: &ProviderRefund) -> Option<Correction> {
        match (ours, &provider.status) {
            (RefundStatus::Failed, ProviderRefundStatus::Succeeded) => {
                Some(Correction::CarriedOut { provider_refund_id: provider.id.clone() })
            }
            (RefundStatus::Succeeded, ProviderRefundStatus::Failed { code, message }) => {
                Some(Correction::Reversed { code: code.clone(), message: message.clone() })
            }
            _ => None,
        }
    }

    fn statuses(&self) -> (RefundStatus, RefundStatus) {
        match self {
            Correction::CarriedOut { .. } => (RefundStatus::Failed, RefundStatus::Succeeded),
            Correction::Reversed { .. } => (RefundStatus::Succeeded, RefundStatus::Failed),
        }
    }
}

/// What a correction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corrected {
    Applied,
    /// The refund is no longer in the state the correction starts from (someone corrected it
    /// first, or it never was): nothing changed.
    Stale,
    /// The money it would move back does not fit what is captured now (another refund still
    /// reserves it, and the provider will refuse that one): nothing changed; look again later.
    DoesNotFitYet,
}

/// Looks at the refunds given up on that are due.
pub async fn watch_due(engine: &Engine, config: &ReconcilerConfig) -> Result<PassReport, EngineError> {
    let now = Utc::now();
    let claimed_until = after(now, config.claim_for);
    let due = {
        let mut conn = engine.pool.get().await?;
        refunds::watch_late(&mut conn, now, config.batch_size, claimed_until).await?
    };
    let mut report = PassReport { claimed: due.len(), ..PassReport::default() };
    for watched in due {
        let watched = match watched {
            Ok(watched) => watched,
            Err(error) => {
                report.errors += 1;
                tracing::error!(error = %error, "a watched refund cannot be read; left for a later pass");
                continue;
            }
        };
        match look(engine, config, &watched, claimed_until).await {
            Ok(true) => report.settled += 1,
            Ok(false) => report.rescheduled += 1,
            Err(error) => {
                report.errors += 1;
                tracing::warn!(refund_id = %watched.refund.id, error = %error, "looking for a late refund failed");
            }
        }
    }
    Ok(report)
}

/// One look at a refund given up on, claimed until `claimed_until`. Returns whether it found it
/// carried out and recorded it.
async fn look(
    engine: &Engine,
    config: &ReconcilerConfig,
    watched: &Watched,
    claimed_until: DateTime<Utc>,
) -> Result<bool, EngineError> {
    let refund = &watched.refund;
    let id = (refund.account_id, refund.id.as_uuid());
    let held = {
        let mut conn = engine.pool.get().await?;
        <Refunds as Kind>::load(&mut conn, id).await?
    };
    let Some(held) = held else { return Err(EngineError::Vanished(format!("refund {}", refund.id))) };
    let now = Utc::now().trunc_subsecs(6);
    let after_backoff = after(now, config.backoff(watched.attempts));
    let next = (after_backoff <= watched.watch_until).then_some(after_backoff);
    let mut conn = engine.pool.get().await?;
    match Refunds::look_up(engine.provider.as_ref(), &held, None).await {
        Finding::Final(RefundOutcome::Succeeded { refund_id }) => {
            tracing::warn!(refund_id = %refund.id, provider_refund_id = %refund_id,
                "the provider carried out a refund given up on; recording it");
            let correction = Correction::CarriedOut { provider_refund_id: refund_id };
            crate::hooks::point("late_refund.before_correction").await;
            match correct(&mut conn, &held.refund, correction, Actor::Reconciler, Some(claimed_until)).await?
            {
                Corrected::Applied => Ok(true),
                // Corrected meanwhile, or a webhook says the lookup may be stale: the refund is
                // looked at again (the webhook moved its next look to now).
                Corrected::Stale => Ok(false),
                Corrected::DoesNotFitYet => {
                    refunds::watch_late_again(&mut conn, refund, Some(next.unwrap_or(now))).await?;
                    Ok(false)
                }
            }
        }
        // Definitely not carried out (a failed refund at the provider), or not so far (none).
        found @ (Finding::Final(_) | Finding::NotReceived) => {
            let definite = matches!(found, Finding::Final(_));
            if refunds::note_absent(&mut conn, refund, now).await? && refund.idempotency_key.is_none() {
                // A late charge's refund known not carried out: the follow-up may start another.
                watches::follow_up_late_charge(&mut conn, refund.account_id, refund.payment_id, now).await?;
            }
            refunds::watch_late_again(&mut conn, refund, if definite { None } else { next }).await?;
            Ok(false)
        }
        // A refund pending at the provider, or no answer: the provider has not said whether it
        // carried the refund out, so the watch goes on past its end until it does. Ending it here
        // would leave the refund neither corrected nor known absent, and a late charge's
        // follow-up waits for one or the other before it refunds again. (A lookup never
        // conflicts with a key; should the provider say so, it is no answer yet.)
        Finding::Unknown { reason } | Finding::KeyConflict { reason } => {
            tracing::info!(refund_id = %refund.id, %reason, "a refund given up on: no answer yet");
            refunds::watch_late_again(&mut conn, refund, Some(after_backoff)).await?;
            Ok(false)
        }
        // The provider refused our credentials: it said nothing, so the watch goes on, past its
        // end if need be, until the provider answers.
        Finding::Unsent { reason } => {
            tracing::warn!(refund_id = %refund.id, %reason, "a refund given up on: the provider refused our credentials");
            refunds::watch_late_again(&mut conn, refund, Some(after(now, config.backoff_cap))).await?;
            Ok(false)
        }
    }
}

/// Corrects a settled refund to what the provider confirmed: in one transaction, the order and
/// the payment locked first (the lock order), the refund read under those locks, then
/// `correct_refund.sql`. See the module doc.
///
/// `watched_until`: for the late-refund watch, the next look its claim set; if a webhook moved it
/// meanwhile (reporting the refund failed while the lookup was on its way), the lookup may be
/// stale and nothing is applied ([`Corrected::Stale`]); the refund is looked at again.
pub async fn correct(
    conn: &mut AsyncPgConnection,
    refund: &Refund,
    correction: Correction,
    actor: Actor,
    watched_until: Option<DateTime<Utc>>,
) -> Result<Corrected, EngineError> {
    let (account_id, refund_id) = (refund.account_id, refund.id);
    let (from, to) = correction.statuses();
    let corrected = conn
        .transaction::<_, EngineError, _>(async |conn| {
            let vanished = || EngineError::Vanished(format!("refund {refund_id}'s payment or order"));
            let order = orders::lock(conn, account_id, refund.order_id).await?.ok_or_else(vanished)?;
            let money = payments::lock_amounts(conn, account_id, refund.payment_id).await?.ok_or_else(vanished)?;
            let Some(current) = refunds::find(conn, account_id, refund_id).await? else {
                return Err(EngineError::Vanished(format!("refund {refund_id}")));
            };
            if current.status != from {
                return Ok(Corrected::Stale);
            }
            let amount = current.amount.value();
            let refunded_by = if to == RefundStatus::Succeeded { amount } else { -amount };
            if to == RefundStatus::Succeeded
                && money.amount_refunded + money.amount_refunding + money.amount_disputed + amount
                    > money.amount_captured
            {
                return Ok(Corrected::DoesNotFitYet);
            }
            let now = Utc::now().trunc_subsecs(6);
            let mut after_correction = Refund { status: to, updated_at: now, ..current.clone() };
            let detail = match &correction {
                Correction::CarriedOut { provider_refund_id } => {
                    after_correction.provider_refund_id = Some(provider_refund_id.clone());
                    after_correction.failure_code = None;
                    after_correction.failure_message = None;
                    format!("corrected: the provider carried it out after all ({provider_refund_id})")
                }
                Correction::Reversed { code, message } => {
                    after_correction.failure_code = Some(code.clone());
                    after_correction.failure_message = Some(message.clone());
                    format!("corrected: the provider reversed it ({code}: {message})")
                }
            };
            let system = current.idempotency_key.is_none();
            let refunded = money.amount_refunded + refunded_by;
            let order_status = (!system)
                .then(|| order_after(money.amount_captured, refunded))
                .filter(|status| *status != order.status && refundable_order(order.status));
            let event_type =
                if to == RefundStatus::Succeeded { EventType::RefundSucceeded } else { EventType::RefundFailed };
            let event = NewEvent::new(event_type, correction_json(&after_correction));
            let second = match order_status {
                Some(status) => rendered_after(conn, account_id, refund.order_id, status, now)
                    .await?
                    .map(|order| NewEvent::new(order_event(status), order)),
                None if system && to == RefundStatus::Succeeded => {
                    payments::find(conn, account_id, refund.payment_id).await?.map(|payment| {
                        let payment = crate::payments::Payment {
                            amount_refunded: payment.amount_refunded.checked_add(&current.amount).unwrap_or(payment.amount_refunded),
                            updated_at: now,
                            ..payment
                        };
                        NewEvent::new(EventType::PaymentLateChargeRefunded, payment_json(&payment))
                    })
                }
                None => None,
            };
            let statement = CorrectRefund {
                announce: Announce::new(Some(&event), second.as_ref()),
                account_id,
                refund_id,
                payment_id: refund.payment_id,
                order_id: refund.order_id,
                from,
                to,
                provider_refund_id: after_correction.provider_refund_id.as_deref(),
                failure_code: after_correction.failure_code.as_deref(),
                failure_message: after_correction.failure_message.as_deref(),
                now,
                actor: actor.as_str(),
                detail: &detail,
                refunded_by,
                order_status,
                // A late charge no longer refunded: the follow-up may start another refund.
                follow_up_at: (system && to == RefundStatus::Failed).then_some(now),
                watched_until,
            };
            if !refunds::correct(conn, statement).await? {
                return Ok(Corrected::Stale);
            }
            Announce::new(Some(&event), second.as_ref()).count_written(true, second.is_some());
            tracing::warn!(%refund_id, from = %from, to = %to, actor = actor.as_str(), order_status = ?order_status,
                "refund corrected to what the provider confirmed");
            crate::telemetry::metrics::refund_corrected(to.as_str());
            if system {
                let succeeded = to == RefundStatus::Succeeded;
                crate::telemetry::metrics::late_charge(if succeeded { "refunded" } else { "refund_failed" });
            }
            Ok(Corrected::Applied)
        })
        .await?;
    Ok(corrected)
}

/// The order's status for what is captured and refunded of its payment.
fn order_after(captured: Decimal, refunded: Decimal) -> OrderStatus {
    if refunded >= captured {
        OrderStatus::Refunded
    } else if refunded > Decimal::ZERO {
        OrderStatus::PartiallyRefunded
    } else {
        OrderStatus::Paid
    }
}

/// Whether an order's status follows its payment's refunds.
fn refundable_order(status: OrderStatus) -> bool {
    matches!(status, OrderStatus::Paid | OrderStatus::PartiallyRefunded | OrderStatus::Refunded)
}

fn order_event(status: OrderStatus) -> EventType {
    match status {
        OrderStatus::Refunded => EventType::OrderRefunded,
        OrderStatus::PartiallyRefunded => EventType::OrderPartiallyRefunded,
        _ => EventType::OrderPaid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_follows_what_is_refunded_of_what_was_captured() {
        let captured = Decimal::new(10_000, 2);
        assert_eq!(order_after(captured, Decimal::ZERO), OrderStatus::Paid);
        assert_eq!(order_after(captured, Decimal::new(4_000, 2)), OrderStatus::PartiallyRefunded);
        assert_eq!(order_after(captured, captured), OrderStatus::Refunded);
        assert!(!refundable_order(OrderStatus::PendingPayment));
    }
}
