//! The payment provider as the mock implements its contract (docs/payments.md, "The provider
//! contract"): charges deduplicated by our downstream key, captures and voids idempotent on
//! theirs, refunds capped at what remains of the charge, disputes that withdraw and reinstate
//! funds, the merchant's answers to a dispute (taken once per key while it needs a response,
//! refused after), and a webhook for every final state and every dispute's move.
//! What a lookup or a send's answer means for an operation is the kinds' own mapping
//! (`charge::outcome_of`, `authorization::charge_state`, `refund::outcome_of`,
//! `dispute_response::dispute_state`).

use crate::action::Choice;
use crate::config::{Config, Mutation};
use crate::state::{
    ActionKind, Charge, ChargeStatus, Dispute, DisputeStatus, Finding, KeyRecord, Op, Outcome,
    ProviderRefundStatus as Refund, ResponseKind, State, Target, Webhook,
};

/// `charge::outcome_of`: what the charge's state means for the payment.
pub fn charge_outcome(config: &Config, charge: Charge) -> Finding {
    match charge.status {
        ChargeStatus::Succeeded => Finding::Final(Outcome::Captured(charge.captured)),
        ChargeStatus::RequiresCapture if config.manual() => Finding::Final(Outcome::Authorized),
        ChargeStatus::Voided if config.manual() => Finding::Final(Outcome::Voided),
        ChargeStatus::Expired if config.manual() => Finding::Final(Outcome::Expired),
        ChargeStatus::Declined => Finding::Final(Outcome::Declined),
        _ => Finding::Unknown,
    }
}

/// `authorization::charge_state`: what the charge's state means for a capture or void of it.
pub fn action_outcome(charge: Charge) -> Finding {
    match charge.status {
        ChargeStatus::Succeeded => Finding::Final(Outcome::Captured(charge.captured)),
        ChargeStatus::Voided => Finding::Final(Outcome::Voided),
        ChargeStatus::Expired => Finding::Final(Outcome::Expired),
        // Still waiting: this capture or void has not happened; re-sent with its key.
        ChargeStatus::RequiresCapture => Finding::NotReceived,
        ChargeStatus::Pending | ChargeStatus::Declined => Finding::Unknown,
    }
}

/// `refund::outcome_of`.
pub fn refund_outcome(status: Refund) -> Finding {
    match status {
        Refund::Succeeded => Finding::Final(Outcome::RefundSucceeded),
        Refund::Failed | Refund::Reversed | Refund::Refused => Finding::Final(Outcome::RefundFailed),
        Refund::Pending => Finding::Unknown,
    }
}

/// `dispute_response::dispute_state`: what the provider's `dispute` says of response `k`.
/// Evidence was taken when the dispute holds it, submitted, and no longer waits for a response;
/// an accept, when the dispute closed as accepted (by whoever: the provider's dispute does not
/// say which key closed it). A dispute still waiting has not seen this response; one that moved
/// on without it refuses it.
pub fn dispute_state(config: &Config, state: &State, k: u8, dispute: Dispute) -> Finding {
    let taken = match state.responses[k as usize].kind {
        ResponseKind::Evidence => {
            let ours = state.provider.evidence == Some(k) || config.mutated(Mutation::EvidenceTakenOnAnyMove);
            ours && !dispute.needs_response()
        }
        ResponseKind::Accept => dispute.accepted,
    };
    if taken {
        Finding::Final(Outcome::ResponseTaken(dispute))
    } else if dispute.needs_response() {
        Finding::NotReceived
    } else {
        Finding::Final(Outcome::ResponseRefused(dispute))
    }
}

/// `Kind::look_up`: the provider's view of `op` by its downstream key, now.
pub fn look_up(config: &Config, state: &State, op: Op) -> Finding {
    match op {
        Op::Charge if config.mutated(Mutation::LookupMissesACharge) => Finding::NotReceived,
        Op::Charge => state.provider.charge.map_or(Finding::NotReceived, |c| charge_outcome(config, c)),
        Op::Action(_) => state.provider.charge.map_or(Finding::Unknown, action_outcome),
        Op::Refund(k) => match state.provider.refunds[k as usize] {
            None | Some((Refund::Refused, _)) => Finding::NotReceived,
            Some((status, _)) => refund_outcome(status),
        },
        Op::Response(k) => {
            state.provider.dispute.map_or(Finding::Unknown, |d| dispute_state(config, state, k, d))
        }
    }
}

/// A refund as a lookup by its key finds it (a refused one is not found).
pub fn refund_seen(state: &State, k: u8) -> Option<Refund> {
    state.provider.refunds[k as usize].map(|(status, _)| status).filter(|s| *s != Refund::Refused)
}

/// The choices the provider has in acting on request `index` now.
pub fn choices(config: &Config, state: &State, index: usize) -> Vec<Choice> {
    let budgets = &state.budgets;
    let mut choices = vec![Choice::Succeed];
    let mut decline = false;
    let mut pend = false;
    match state.provider.requests[index].target {
        Target::Op(Op::Charge) if state.provider.charge.is_none() => {
            decline = true;
            pend = true;
        }
        Target::Op(Op::Action(k)) => {
            let fresh = state.provider.actions[k as usize].is_none();
            let waiting = state.provider.charge.is_some_and(|c| c.status == ChargeStatus::RequiresCapture);
            decline = fresh && waiting && state.actions[k as usize].kind == ActionKind::Capture;
        }
        Target::Op(Op::Refund(k)) => {
            let fresh = state.provider.refunds[k as usize].is_none();
            let amount = state.refunds[k as usize].amount;
            let refundable = state.provider.charge.is_some_and(|c| {
                c.status == ChargeStatus::Succeeded && amount <= c.captured.saturating_sub(c.refunded)
            });
            decline = fresh && refundable;
            pend = fresh && refundable;
        }
        _ => {}
    }
    if decline && budgets.declines > 0 {
        choices.push(Choice::Decline);
    }
    if pend && budgets.pending > 0 {
        choices.push(Choice::Pend);
    }
    let _ = config;
    choices
}

/// The provider acts on request `index`; returns its answer.
pub fn act(config: &Config, state: &mut State, index: usize, choice: Choice) -> Finding {
    let request = state.provider.requests[index];
    if request.late {
        state.budgets.late -= 1;
    }
    match choice {
        Choice::Succeed => {}
        Choice::Decline => state.budgets.declines -= 1,
        Choice::Pend => state.budgets.pending -= 1,
    }
    match request.target {
        Target::Op(Op::Charge) => create_charge(config, state, choice, request.late),
        Target::Op(Op::Action(k)) => capture_or_void(config, state, k, choice),
        Target::Op(Op::Refund(k)) => create_refund(config, state, k, choice),
        Target::Op(Op::Response(k)) => respond_to_dispute(config, state, k),
        Target::LateVoid => late_void(config, state),
    }
}

fn emit(config: &Config, state: &mut State, webhook: Webhook) {
    if config.webhooks {
        state.provider.webhooks.push(webhook);
        state.provider.webhooks.sort();
    }
}

fn emit_charge(config: &Config, state: &mut State) {
    if let Some(charge) = state.provider.charge {
        emit(config, state, Webhook::Charge(charge.status, charge.captured));
    }
}

/// `POST /v1/charges` with `Idempotency-Key: orderpay_pay_<payment>`: the same key returns the
/// same charge.
fn create_charge(config: &Config, state: &mut State, choice: Choice, late: bool) -> Finding {
    if let Some(charge) = state.provider.charge {
        return charge_outcome(config, charge);
    }
    let status = match choice {
        Choice::Succeed if config.manual() => ChargeStatus::RequiresCapture,
        Choice::Succeed => ChargeStatus::Succeeded,
        Choice::Decline => ChargeStatus::Declined,
        Choice::Pend => ChargeStatus::Pending,
    };
    let captured = if status == ChargeStatus::Succeeded { config.total } else { 0 };
    let charge = Charge { status, captured, refunded: 0, landed_late: late };
    state.provider.charge = Some(charge);
    state.ghost.charges_created += 1;
    if status != ChargeStatus::Pending {
        emit_charge(config, state);
    }
    charge_outcome(config, charge)
}

/// `POST /v1/charges/{id}/capture` or `/cancel` with the operation's key: its first answer is
/// kept for the key; a refusal because the charge moved on is answered by what the charge is now
/// (the service looks it up).
fn capture_or_void(config: &Config, state: &mut State, k: u8, choice: Choice) -> Finding {
    if let Some(answer) = state.provider.actions[k as usize] {
        return answer;
    }
    let Some(mut charge) = state.provider.charge else { return Finding::Unknown };
    let action = &state.actions[k as usize];
    let answer = match (action.kind, charge.status) {
        (ActionKind::Capture, ChargeStatus::RequiresCapture) if choice == Choice::Decline => {
            Finding::Final(Outcome::Declined)
        }
        (ActionKind::Capture, ChargeStatus::RequiresCapture) => {
            charge.status = ChargeStatus::Succeeded;
            charge.captured = action.amount;
            Finding::Final(Outcome::Captured(action.amount))
        }
        (ActionKind::Void, ChargeStatus::RequiresCapture) => {
            charge.status = ChargeStatus::Voided;
            Finding::Final(Outcome::Voided)
        }
        (_, ChargeStatus::Expired) => Finding::Final(Outcome::Expired),
        _ => return action_outcome(charge),
    };
    state.provider.actions[k as usize] = Some(answer);
    if state.provider.charge != Some(charge) {
        state.provider.charge = Some(charge);
        emit_charge(config, state);
    }
    answer
}

/// What remains of the charge to refund or dispute: captured, less refunded, less what its
/// dispute withdrew and did not reinstate.
pub fn remaining(state: &State) -> u8 {
    state.provider.charge.map_or(0, |c| c.captured.saturating_sub(c.refunded + state.provider_disputed()))
}

/// `POST /v1/refunds` with `orderpay_refund_<id>`: refused unless the charge is captured and the
/// amount is within what remains of it.
fn create_refund(config: &Config, state: &mut State, k: u8, choice: Choice) -> Finding {
    if let Some((status, _)) = state.provider.refunds[k as usize] {
        return refund_outcome(status);
    }
    let amount = state.refunds[k as usize].amount;
    let remaining = remaining(state);
    let Some(mut charge) = state.provider.charge else { return Finding::Unknown };
    let status = if charge.status != ChargeStatus::Succeeded || remaining == 0 || amount > remaining {
        Refund::Refused
    } else {
        match choice {
            Choice::Succeed => Refund::Succeeded,
            Choice::Decline => Refund::Failed,
            Choice::Pend => Refund::Pending,
        }
    };
    if matches!(status, Refund::Succeeded | Refund::Pending) {
        // Pending refunds count too, so the remainder can never be refunded twice.
        charge.refunded += amount;
        state.provider.charge = Some(charge);
    }
    state.provider.refunds[k as usize] = Some((status, amount));
    if matches!(status, Refund::Succeeded | Refund::Failed) {
        emit(config, state, Webhook::Refund(k, status));
    }
    refund_outcome(status)
}

/// `POST /v1/disputes/{id}` (evidence, submitted) or `/close` (accept) with the response's key:
/// taken only while the dispute needs a response (to `under_review`, or `lost` as accepted),
/// else refused (409); the key's first outcome is replayed. The answer is the dispute as it is
/// now: the service makes of a taken one what `dispute_state` says (a dispute still waiting is
/// no answer), and looks a refused one up (`send` on `ProviderError::Refused`).
fn respond_to_dispute(config: &Config, state: &mut State, k: u8) -> Finding {
    let Some(mut dispute) = state.provider.dispute else { return Finding::Unknown };
    if state.provider.responses[k as usize].is_none() {
        let record = if dispute.needs_response() {
            match state.responses[k as usize].kind {
                ResponseKind::Evidence => {
                    dispute.status = DisputeStatus::UnderReview;
                    state.provider.evidence = Some(k);
                }
                ResponseKind::Accept => {
                    dispute.status = DisputeStatus::Lost;
                    dispute.accepted = true;
                }
            }
            state.provider.dispute = Some(dispute);
            state.ghost.responses_taken[k as usize] += 1;
            emit(config, state, Webhook::Dispute(dispute));
            KeyRecord::Taken
        } else {
            KeyRecord::Refused
        };
        state.provider.responses[k as usize] = Some(record);
    }
    match dispute_state(config, state, k, dispute) {
        Finding::NotReceived => Finding::Unknown,
        found => found,
    }
}

/// The late void of an authorization held for a failed payment (`orderpay_late_void_<id>`).
fn late_void(config: &Config, state: &mut State) -> Finding {
    match state.provider.charge {
        Some(mut charge) if charge.status == ChargeStatus::RequiresCapture => {
            charge.status = ChargeStatus::Voided;
            state.provider.charge = Some(charge);
            emit_charge(config, state);
            Finding::Final(Outcome::Voided)
        }
        // Refused (already canceled or captured): the void failed; the watch looks again.
        _ => Finding::Unknown,
    }
}

/// A pending charge settles: captured, or authorized for a manual payment.
pub fn charge_settles(config: &Config, state: &mut State) {
    if let Some(charge) = state.provider.charge.as_mut() {
        if config.manual() {
            charge.status = ChargeStatus::RequiresCapture;
        } else {
            charge.status = ChargeStatus::Succeeded;
            charge.captured = config.total;
        }
    }
    emit_charge(config, state);
}

pub fn refund_settles(config: &Config, state: &mut State, k: u8) {
    if let Some((status, _)) = state.provider.refunds[k as usize].as_mut() {
        *status = Refund::Succeeded;
    }
    emit(config, state, Webhook::Refund(k, Refund::Succeeded));
}

pub fn authorization_expires(config: &Config, state: &mut State) {
    state.budgets.expiries -= 1;
    if let Some(charge) = state.provider.charge.as_mut() {
        charge.status = ChargeStatus::Expired;
    }
    emit_charge(config, state);
}

/// A succeeded refund reversed: the money is back on the card's side of the charge.
pub fn refund_reversed(config: &Config, state: &mut State, k: u8) {
    state.budgets.reversals -= 1;
    let Some((status, amount)) = state.provider.refunds[k as usize].as_mut() else { return };
    *status = Refund::Reversed;
    let amount = *amount;
    if let Some(charge) = state.provider.charge.as_mut() {
        charge.refunded = charge.refunded.saturating_sub(amount);
    }
    emit(config, state, Webhook::Refund(k, Refund::Reversed));
}

/// The most a dispute may withdraw from the charge now (the mock's `open_dispute`: a captured
/// charge, within what remains of it); 0 when none may open.
pub fn disputable(state: &State) -> u8 {
    let captured = state.provider.charge.is_some_and(|c| c.status == ChargeStatus::Succeeded);
    let budget = state.budgets.disputes > 0 && state.provider.dispute.is_none();
    if captured && budget { remaining(state) } else { 0 }
}

/// The customer's bank disputes `amount` of the charge: the funds are withdrawn when it opens.
pub fn open_dispute(config: &Config, state: &mut State, amount: u8) {
    state.budgets.disputes -= 1;
    let dispute =
        Dispute { status: DisputeStatus::NeedsResponse, accepted: false, withdrawn: amount, reinstated: 0 };
    state.provider.dispute = Some(dispute);
    emit(config, state, Webhook::Dispute(dispute));
}

/// The bank decides the open dispute (the mock's `decide_dispute`): won reinstates the funds.
/// One the merchant accepted is lost already, and closed: no decision.
pub fn decide_dispute(config: &Config, state: &mut State, won: bool) {
    let Some(mut dispute) = state.provider.dispute.filter(|d| d.open()) else { return };
    if won {
        dispute.status = DisputeStatus::Won;
        dispute.reinstated = dispute.withdrawn;
    } else {
        dispute.status = DisputeStatus::Lost;
    }
    state.provider.dispute = Some(dispute);
    emit(config, state, Webhook::Dispute(dispute));
}
