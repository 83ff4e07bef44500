//! What must always hold, and what must be reachable, checked in every state.

use stateright::Property;

use crate::config::{Config, Intent};
use crate::protocol::{Protocol, dispute_pass_due};
use crate::provider;
use crate::state::{
    ActionKind, Answer, Broken, ChargeStatus, DisputeStatus, KeyRecord, LateCharge, Mode, OpStatus,
    OrderStatus, Payment, PaymentStatus, Pc, ProviderRefundStatus, RefundWatch, ResponseKind, State,
};

/// Nothing is in flight: no operation is `processing`, nothing is on the wire or pending at the
/// provider, no webhook is undelivered, no process is mid-way, and no watch has work left (the
/// late-charge watch is not looking nor due to refund, no late-refund watch or reversal check is
/// open, no authorization the provider let go waits for its watch, no dispute webhook's lookup
/// waits to be recorded, and the dispute pass would record nothing).
pub fn quiescent(state: &State) -> bool {
    let ops_settled = state.ops().all(|op| !state.in_flight(op));
    let provider = &state.provider;
    let wire_empty = provider.requests.is_empty() && provider.webhooks.is_empty();
    let nothing_pending = provider.charge.is_none_or(|c| c.status != ChargeStatus::Pending)
        && !provider.refunds.iter().any(|r| matches!(r, Some((ProviderRefundStatus::Pending, _))));
    let procs_idle = state.procs().all(|p| matches!(state.pc(p), Pc::Idle | Pc::Finished));
    let authorization_ended = |p: &Payment| {
        p.status == PaymentStatus::RequiresCapture
            && provider.charge.is_some_and(|c| c.status != ChargeStatus::RequiresCapture)
    };
    let watches_done = state.payment.as_ref().is_none_or(|p| {
        let late_watch = matches!(p.late, LateCharge::Watching | LateCharge::RefundDue);
        !late_watch && !authorization_ended(p)
    }) && state.refunds.iter().all(|r| r.watch == RefundWatch::Off && !r.check);
    let disputes_done = state.dispute_lookups.is_empty() && !dispute_pass_due(state);
    ops_settled && wire_empty && nothing_pending && procs_idle && watches_done && disputes_done
}

/// The order's status the payment's amounts call for.
fn order_for(payment: &Payment) -> OrderStatus {
    match payment.status {
        PaymentStatus::Succeeded if payment.refunded == 0 => OrderStatus::Paid,
        PaymentStatus::Succeeded if payment.refunded < payment.captured => OrderStatus::PartiallyRefunded,
        PaymentStatus::Succeeded => OrderStatus::Refunded,
        PaymentStatus::RequiresCapture => OrderStatus::Authorized,
        _ => OrderStatus::PendingPayment,
    }
}

/// Our captured, refunded and disputed amounts, our statuses and our dispute equal the
/// provider's.
pub fn books_equal(state: &State) -> bool {
    let charge = state.provider.charge.map(|c| c.status);
    let Some(payment) = &state.payment else {
        return charge.is_none() && state.order == OrderStatus::PendingPayment;
    };
    let (captured, refunded) = state.provider_amounts();
    let amounts = payment.captured == captured
        && payment.refunded == refunded
        && payment.refunding == 0
        && payment.disputed == state.provider_disputed()
        && state.dispute == state.provider.dispute;
    use ChargeStatus as C;
    let status = match (payment.status, charge) {
        (PaymentStatus::Succeeded, Some(C::Succeeded)) => true,
        (PaymentStatus::RequiresCapture, Some(C::RequiresCapture)) => true,
        (PaymentStatus::Canceled, Some(C::Voided | C::Expired)) => true,
        // A late charge is recorded on the failed payment: the amounts say whether it is back.
        (PaymentStatus::Failed, None | Some(C::Declined | C::Voided | C::Expired | C::Succeeded)) => true,
        _ => false,
    };
    let refunds = state.refunds.iter().enumerate().all(|(k, refund)| {
        let theirs = provider::refund_seen(state, k as u8);
        match refund.status {
            OpStatus::Succeeded => theirs == Some(ProviderRefundStatus::Succeeded),
            OpStatus::Failed => {
                !matches!(theirs, Some(ProviderRefundStatus::Succeeded | ProviderRefundStatus::Pending))
            }
            OpStatus::Processing => false,
        }
    });
    amounts && status && refunds && state.order == order_for(payment)
}

/// The provider holds money for the payment: captured and not refunded, or authorized.
fn holds_money(state: &State) -> bool {
    state.provider.charge.is_some_and(|c| {
        (c.status == ChargeStatus::Succeeded && c.captured > c.refunded)
            || c.status == ChargeStatus::RequiresCapture
    })
}

/// The payment's stored answer says it failed.
fn told_failed(payment: &Payment) -> bool {
    matches!(payment.row.answer, Some(Answer::PaymentFailed | Answer::Declined))
}

pub const ONE_CHARGE: &str = "at most one charge per payment at the provider";
pub const PROVIDER_REFUNDS: &str = "the provider never refunds more than it captured";
pub const PROVIDER_DISPUTES: &str = "the provider's refunds and disputes stay within what it captured";
pub const WITHIN_CAPTURED: &str = "our refunds and disputes stay within what was captured";
pub const FINAL_STATES: &str = "final states are left only by the two refund corrections, on a lookup";
pub const ANSWERS: &str = "a stored answer never changes";
pub const EVENTS: &str = "every transition writes its event exactly once";
pub const FAILED_HOLDS_NOTHING: &str = "a failed payment holds no money unless the provider acted late";
pub const ONE_SYSTEM_REFUND: &str = "two system refunds are never both alive";
pub const ONE_REFUND_PER_KEY: &str = "one refund per client key";
pub const BOOKS: &str = "once nothing is in flight, our books equal the provider's";
pub const NOT_KEPT: &str = "money we told the client we did not take is not kept";
pub const DISPUTE_GUARD: &str = "a dispute's recorded status only moves by the guard";
pub const RESPONSE_ONCE: &str = "the provider takes a dispute response at most once per key";
pub const RESPONSE_TAKEN: &str = "a dispute response settles succeeded only if the provider took it";
pub const ACCEPTED_WITHDRAWN: &str = "an accepted dispute keeps its money withdrawn";
pub const LEDGER: &str = "the ledger's movements equal our money columns at every step";

/// Every dispute response settled `succeeded` was taken by the provider under its own key.
fn responses_taken(state: &State) -> bool {
    state.responses.iter().enumerate().all(|(k, response)| {
        response.status != OpStatus::Succeeded || state.provider.responses[k] == Some(KeyRecord::Taken)
    })
}

/// An accepted dispute, the provider's or ours, is lost and reinstated nothing; ours holds
/// everything it withdrew in the payment's `amount_disputed`.
fn accepted_withdrawn(state: &State) -> bool {
    let lost =
        |d: crate::state::Dispute| !d.accepted || (d.status == DisputeStatus::Lost && d.reinstated == 0);
    let ours = state.dispute.is_none_or(|d| {
        lost(d) && (!d.accepted || state.payment.as_ref().is_some_and(|p| p.disputed == d.withdrawn))
    });
    state.provider.dispute.is_none_or(lost) && ours
}

/// The ledger's movements equal the payment's money columns, in every state: the movements
/// are written by triggers on other rows than the columns (a refund's on the refund's status:
/// `refund` when it succeeds, `refund_reversal` and `refund_correction` when a correction moves
/// it; a dispute's on our dispute's withdrawn and reinstated amounts), in the same statement,
/// so the two must agree at every step, not only once nothing is in flight. This is
/// `orderpay ledger check`'s per-payment rule (refunded and disputed sums against
/// `amount_refunded` and `amount_disputed`). Captured money needs no rule here: its movement
/// is written by the trigger on `amount_captured` itself.
pub fn ledger_equal(state: &State) -> bool {
    let Some(payment) = &state.payment else { return true };
    let refunded: u8 = state
        .refunds
        .iter()
        .filter(|refund| refund.status == OpStatus::Succeeded)
        .map(|refund| refund.amount)
        .sum();
    let disputed = state.dispute.map_or(0, crate::state::Dispute::net);
    payment.refunded == refunded && payment.disputed == disputed
}

/// The properties checked under `config`: every `always`, and the `sometimes` whose paths the
/// configuration makes possible.
pub fn for_config(config: &Config) -> Vec<Property<Protocol>> {
    let mut properties = vec![
        Property::<Protocol>::always(ONE_CHARGE, |_, s| s.ghost.charges_created <= 1),
        Property::<Protocol>::always(PROVIDER_REFUNDS, |_, s| {
            s.provider.charge.is_none_or(|c| c.refunded <= c.captured)
        }),
        Property::<Protocol>::always(PROVIDER_DISPUTES, |_, s| {
            s.provider.charge.is_none_or(|c| c.refunded + s.provider_disputed() <= c.captured)
        }),
        Property::<Protocol>::always(WITHIN_CAPTURED, |_, s| {
            s.payment.as_ref().is_none_or(|p| p.refunded + p.refunding + p.disputed <= p.captured)
        }),
        Property::<Protocol>::always(FINAL_STATES, |_, s| s.ghost.broken != Some(Broken::FinalStateLeft)),
        Property::<Protocol>::always(ANSWERS, |_, s| s.ghost.broken != Some(Broken::AnswerChanged)),
        Property::<Protocol>::always(EVENTS, |_, s| s.ghost.broken != Some(Broken::EventsMismatch)),
        Property::<Protocol>::always(DISPUTE_GUARD, |_, s| s.ghost.broken != Some(Broken::DisputeGuard)),
        Property::<Protocol>::always(FAILED_HOLDS_NOTHING, |_, s| {
            let failed = s.payment.as_ref().is_some_and(told_failed);
            let excused = s.provider.charge.is_some_and(|c| c.landed_late) || s.ghost.forced;
            !failed || !holds_money(s) || excused
        }),
        Property::<Protocol>::always(ONE_SYSTEM_REFUND, |_, s| {
            s.refunds.iter().filter(|r| r.system() && r.status == OpStatus::Processing).count() <= 1
        }),
        Property::<Protocol>::always(ONE_REFUND_PER_KEY, |m, s| {
            (0..m.config.intents.len() as u8)
                .all(|i| s.refunds.iter().filter(|r| r.intent == Some(i)).count() <= 1)
        }),
        Property::<Protocol>::always(RESPONSE_ONCE, |_, s| s.ghost.responses_taken.iter().all(|&n| n <= 1)),
        Property::<Protocol>::always(RESPONSE_TAKEN, |_, s| responses_taken(s)),
        Property::<Protocol>::always(ACCEPTED_WITHDRAWN, |_, s| accepted_withdrawn(s)),
        Property::<Protocol>::always(LEDGER, |_, s| ledger_equal(s)),
        Property::<Protocol>::always(BOOKS, |_, s| !quiescent(s) || books_equal(s)),
        Property::<Protocol>::always(NOT_KEPT, |_, s| {
            let failed = s.payment.as_ref().is_some_and(told_failed);
            let paged = s.payment.as_ref().is_some_and(|p| p.late == LateCharge::Person);
            !quiescent(s) || !failed || !holds_money(s) || paged
        }),
    ];
    let faults = config.faults;
    let refunds = config.refund_intents() > 0;
    let automatic = !config.manual();
    let mut sometimes = |name: &'static str, condition: fn(&Protocol, &State) -> bool| {
        properties.push(Property::sometimes(name, condition));
    };
    if automatic {
        sometimes("a payment succeeds", |_, s| {
            s.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Succeeded)
        });
    } else {
        sometimes("an authorization is recorded", |_, s| s.order == OrderStatus::Authorized);
    }
    if config.requests_per_key > 1 {
        sometimes("a retry takes an operation over", |_, s| {
            s.clients.iter().any(|c| matches!(c.pc, Pc::Drive { mode: Mode::Redrive, .. }))
        });
    }
    if config.reconcilers > 0 {
        sometimes("the reconciler gives up on a payment", |_, s| {
            s.payment.as_ref().is_some_and(|p| p.row.answer == Some(Answer::PaymentFailed) && !p.resolved)
        });
    }
    if automatic && faults.late > 0 && config.reconcilers > 0 {
        sometimes("a late charge is refunded", |_, s| {
            s.payment
                .as_ref()
                .is_some_and(|p| p.status == PaymentStatus::Failed && p.late == LateCharge::Refunded)
        });
        sometimes("a late charge is left to a person", |_, s| {
            s.payment.as_ref().is_some_and(|p| p.late == LateCharge::Person)
        });
        if config.system_refunds > 1 {
            sometimes("a late charge's failed refund is followed by another", |_, s| {
                s.payment.as_ref().is_some_and(|p| p.system_refunds > 1)
            });
        }
    }
    if refunds && faults.key_expiries > 0 && config.requests_per_key > 1 {
        sometimes("a refund retried past its key's lifetime answers the same refund", |_, s| {
            // Told after the expiry (which forgets what the key was told before), and told the
            // refund's own answer.
            s.budgets.key_expiries == 0
                && s.refunds.iter().any(|r| {
                    r.intent
                        .is_some_and(|i| r.row.answer.is_some() && s.ghost.told[i as usize] == r.row.answer)
                })
        });
    }
    if refunds {
        sometimes("the books balance after a refund", |_, s| {
            quiescent(s) && s.refunds.iter().any(|r| r.status == OpStatus::Succeeded)
        });
        if faults.late > 0 && config.reconcilers > 0 {
            sometimes("a refund given up on and carried out later is recorded", |_, s| {
                s.refunds.iter().any(|r| r.gave_up && r.status == OpStatus::Succeeded)
            });
        }
        if faults.reversals > 0 && config.webhooks && config.reconcilers > 0 {
            sometimes("a refund reversal is recorded", |_, s| {
                s.refunds.iter().any(|r| r.corrections > 0 && r.status == OpStatus::Failed)
            });
        }
    }
    let mut amounts: Vec<u8> = config
        .intents
        .iter()
        .filter_map(|i| if let Intent::Refund(a) = i { Some(*a) } else { None })
        .collect();
    amounts.sort();
    if amounts.len() > 1 && amounts[0] + amounts[1] <= config.total {
        sometimes("two refunds are in flight at once", |_, s| {
            s.refunds.iter().filter(|r| r.status == OpStatus::Processing).count() > 1
        });
    }
    if config.intents.iter().any(|i| matches!(i, Intent::Capture(_))) {
        sometimes("a capture succeeds", |_, s| {
            s.actions.iter().any(|a| a.kind == ActionKind::Capture && a.status == OpStatus::Succeeded)
        });
        if refunds {
            sometimes("a refund meets a capture in flight", |_, s| {
                let capturing = s.actions.iter().any(|a| a.status == OpStatus::Processing);
                capturing && s.keys.contains(&crate::state::Key::Stored(Answer::InvalidState))
            });
        }
    }
    if config.manual() && faults.late > 0 && config.reconcilers > 0 {
        sometimes("a late authorization is voided", |_, s| {
            s.payment
                .as_ref()
                .is_some_and(|p| p.status == PaymentStatus::Failed && p.late == LateCharge::Ended)
                && s.provider.charge.is_some_and(|c| c.status == ChargeStatus::Voided)
        });
        if config.intents.iter().any(|i| matches!(i, Intent::Capture(_))) {
            sometimes("a capture given up on and carried out later is recorded", |_, s| {
                let gave_up = s.actions.iter().any(|a| a.row.answer == Some(Answer::ActionFailed));
                gave_up && s.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Succeeded)
            });
        }
    }
    if config.intents.contains(&Intent::Void) {
        sometimes("a void succeeds", |_, s| {
            s.actions.iter().any(|a| a.kind == ActionKind::Void && a.status == OpStatus::Succeeded)
        });
    }
    if faults.expiries > 0 {
        sometimes("an expired authorization is recorded", |_, s| {
            s.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Canceled)
                && s.provider.charge.is_some_and(|c| c.status == ChargeStatus::Expired)
        });
    }
    if config.operator {
        sometimes("an operator resolves a payment", |_, s| s.payment.as_ref().is_some_and(|p| p.resolved));
        sometimes("an operator's forced failure takes the money back", |_, s| {
            s.ghost.forced && s.payment.as_ref().is_some_and(|p| p.system_refunds > 0)
        });
    }
    if faults.disputes > 0 {
        sometimes("a dispute is recorded", |_, s| s.dispute.is_some());
        sometimes("a won dispute's funds are reinstated", |_, s| {
            s.dispute.is_some_and(|d| d.status == DisputeStatus::Won)
                && s.payment.as_ref().is_some_and(|p| p.disputed == 0)
        });
        sometimes("a lost dispute is recorded", |_, s| {
            s.dispute.is_some_and(|d| d.status == DisputeStatus::Lost)
        });
        if config.reconcilers > 0 {
            sometimes("the reconciler's pass records a dispute no webhook recorded", |_, s| {
                s.ghost.dispute_by_pass
            });
        }
        if config.intents.contains(&Intent::Respond) {
            sometimes("evidence is taken and the dispute then won", |_, s| {
                let taken = s
                    .responses
                    .iter()
                    .any(|r| r.kind == ResponseKind::Evidence && r.status == OpStatus::Succeeded);
                taken && s.dispute.is_some_and(|d| d.status == DisputeStatus::Won)
            });
            sometimes("an accept is taken", |_, s| {
                s.responses.iter().any(|r| r.kind == ResponseKind::Accept && r.status == OpStatus::Succeeded)
            });
            sometimes("a response is refused: the dispute was decided first", |_, s| {
                s.responses.iter().any(|r| r.row.answer == Some(Answer::InvalidState))
            });
            if config.reconcilers > 0 {
                sometimes("a response whose answer was lost is found taken by the lookup", |_, s| {
                    s.ghost.response_found_by_lookup
                        && s.responses.iter().any(|r| r.status == OpStatus::Succeeded)
                });
            }
        }
        if refunds {
            sometimes("a refund is refused while a dispute is open", |_, s| s.ghost.refused_for_dispute);
            sometimes("a dispute waits for a refund in flight", |_, s| s.ghost.dispute_waited);
        }
    }
    if faults.lease_runs_out > 0 {
        sometimes("two drivers drive one operation at once", |_, s| {
            let driven: Vec<_> = s
                .procs()
                .filter_map(|p| match s.pc(p) {
                    Pc::Drive { op, .. } => Some(op),
                    _ => None,
                })
                .collect();
            driven.iter().enumerate().any(|(i, op)| driven[i + 1..].contains(op))
        });
    }
    properties
}
