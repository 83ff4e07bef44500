//! The protocol as a Stateright model: which actions each state allows, and what each does.

use stateright::{Model, Property};

use crate::action::Action;
use crate::audit;
use crate::config::{Config, Defect, Intent, Mutation};
use crate::provider;
use crate::state::{
    Answer, ChargeStatus, Client, Dispute, Finding, Ghost, Key, LateCharge, Lease, Mode, Op, OpStatus,
    OrderStatus, Outcome, PaymentStatus, Pc, Proc, Provider, ProviderRefundStatus, Request, Resolution,
    ResponseKind, Stage, State, Target, Webhook,
};
use crate::statements::{Recorded, Settlement, Step, refundable};

/// orderpay's protocol under one configuration.
#[derive(Clone, Debug)]
pub struct Protocol {
    pub config: Config,
}

impl Protocol {
    pub fn new(config: Config) -> Protocol {
        Protocol { config }
    }

    pub fn initial(&self) -> State {
        let config = &self.config;
        let faults = config.faults;
        let intents = config.intents.len();
        State {
            order: OrderStatus::PendingPayment,
            payment: None,
            actions: Vec::new(),
            refunds: Vec::new(),
            responses: Vec::new(),
            dispute: None,
            dispute_lookups: Vec::new(),
            keys: vec![Key::Free; intents],
            order_events: 0,
            payment_events: 0,
            provider: Provider {
                charge: None,
                refunds: Vec::new(),
                actions: Vec::new(),
                requests: Vec::new(),
                webhooks: Vec::new(),
                dispute: None,
                responses: Vec::new(),
                evidence: None,
            },
            clients: vec![Client { pc: Pc::Idle, requests_left: config.requests_per_key }; intents],
            reconcilers: vec![Pc::Idle; config.reconcilers as usize],
            operator: config.operator.then_some(Pc::Idle),
            budgets: faults,
            ghost: Ghost {
                told: vec![None; intents],
                charges_created: 0,
                forced: false,
                broken: None,
                refused_for_dispute: false,
                dispute_by_pass: false,
                dispute_waited: false,
                responses_taken: Vec::new(),
                response_found_by_lookup: false,
            },
        }
    }

    /// Every action `state` allows.
    pub fn enabled(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        self.clients(state, actions);
        for proc in state.procs() {
            self.drive(state, proc, actions);
        }
        for r in 0..config.reconcilers {
            if state.reconcilers[r as usize] == Pc::Idle {
                self.reconciler(state, r, actions);
            }
        }
        self.operator(state, actions);
        self.provider(state, actions);
        self.faults(state, actions);
    }

    fn clients(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        for (i, client) in state.clients.iter().enumerate() {
            let i = i as u8;
            if config.intents[i as usize] == Intent::Respond {
                // The merchant answers a dispute it sees recorded, with evidence or an accept; a
                // retry repeats its key's request (a stored refusal answers either).
                if client.pc == Pc::Idle && client.requests_left > 0 && state.dispute.is_some() {
                    match state.responses.iter().find(|r| r.intent == i) {
                        Some(response) => actions.push(Action::Respond(i, response.kind)),
                        None if state.keys[i as usize] == Key::Free => {
                            actions.push(Action::Respond(i, ResponseKind::Evidence));
                            actions.push(Action::Respond(i, ResponseKind::Accept));
                        }
                        None => actions.push(Action::Respond(i, ResponseKind::Evidence)),
                    }
                }
                continue;
            }
            // A client captures, voids or refunds a payment it was told is authorized or paid.
            let told = matches!(state.ghost.told[0], Some(Answer::Authorized | Answer::Paid));
            let ready = client.requests_left > 0 && (i == 0 || told);
            let unlocked_read = config.mutated(Mutation::StartReadsWithoutLock)
                && matches!(config.intents[i as usize], Intent::Refund(_))
                && state.keys[i as usize] == Key::Free
                && !state.refunds.iter().any(|r| r.intent == Some(i));
            match client.pc {
                Pc::Idle if ready && unlocked_read => actions.push(Action::ReadUnlocked(i)),
                Pc::Idle if ready => actions.push(Action::Request(i)),
                Pc::ReadUnlocked { .. } => actions.push(Action::Request(i)),
                _ => {}
            }
        }
    }

    /// The engine's next step for a process driving an operation.
    fn drive(&self, state: &State, proc: Proc, actions: &mut Vec<Action>) {
        match state.pc(proc) {
            Pc::Drive { stage: Stage::Look, .. } => actions.push(Action::LookUp(proc)),
            Pc::Drive { stage: Stage::Marked, .. } => actions.push(Action::Send(proc)),
            Pc::Drive { stage: Stage::Waiting, .. } | Pc::LateVoidWaiting => {
                let replied =
                    state.provider.requests.iter().any(|r| r.from == Some(proc) && r.reply.is_some());
                if replied {
                    actions.push(Action::AnswerArrives(proc));
                }
                actions.push(Action::TimesOut(proc));
            }
            Pc::Drive { mode, stage: Stage::Have(finding), .. } => actions.push(match (finding, mode) {
                (Finding::NotReceived, Mode::LookupOnly) => Action::GiveUp(proc),
                (Finding::NotReceived, _) => Action::MarkSending(proc),
                (Finding::Unknown, _) => Action::Release(proc),
                (Finding::Final(_), _) => Action::Settle(proc),
            }),
            Pc::LateChargeSeen { .. }
            | Pc::LateRefundSeen { .. }
            | Pc::AuthorizationSeen(..)
            | Pc::DisputeListed(_) => {
                let Proc::Reconciler(r) = proc else { unreachable!("only reconcilers watch") };
                actions.push(match state.pc(proc) {
                    Pc::LateChargeSeen { .. } => Action::LateChargeAct(r),
                    Pc::LateRefundSeen { .. } => Action::LateRefundAct(r),
                    Pc::DisputeListed(_) => Action::DisputeRecord(r),
                    _ => Action::AuthorizationEnd(r),
                });
            }
            _ => {}
        }
    }

    fn reconciler(&self, state: &State, r: u8, actions: &mut Vec<Action>) {
        for op in state.ops() {
            if state.in_flight(op) && state.row(op).lease.takeable() {
                actions.push(Action::Claim(r, op));
            }
        }
        let Some(payment) = &state.payment else { return };
        // The watches' looks that could only find nothing new are left out: they change
        // nothing (the next look is rescheduled), so the model loses no behaviour.
        let charge_lands = state.could_land(Target::Op(Op::Charge));
        let money = state
            .provider
            .charge
            .is_some_and(|c| matches!(c.status, ChargeStatus::Succeeded | ChargeStatus::RequiresCapture));
        match payment.late {
            LateCharge::Watching if money || !charge_lands => actions.push(Action::LateChargeLook(r)),
            LateCharge::RefundDue => actions.push(Action::StartSystemRefund(r)),
            _ => {}
        }
        for (k, refund) in state.refunds.iter().enumerate() {
            let watched = refund.status == OpStatus::Failed && refund.watch != crate::state::RefundWatch::Off;
            let checked = refund.check;
            let news = refund.watch == crate::state::RefundWatch::Watching
                || state.provider.refunds[k].is_some()
                || !state.could_land(Target::Op(Op::Refund(k as u8)));
            if (watched && news) || checked {
                actions.push(Action::LateRefundLook(r, k as u8));
            }
        }
        let ended = state.provider.charge.is_some_and(|c| c.status != ChargeStatus::RequiresCapture);
        if payment.status == PaymentStatus::RequiresCapture && ended {
            actions.push(Action::AuthorizationLook(r));
        }
        if dispute_pass_due(state) {
            actions.push(Action::DisputeList(r));
        }
    }

    fn operator(&self, state: &State, actions: &mut Vec<Action>) {
        match state.operator {
            Some(Pc::Idle) => {
                let in_flight = state.payment.as_ref().is_some_and(|p| p.charge_in_flight());
                if in_flight && state.row(Op::Charge).lease.takeable() {
                    actions.push(Action::OperatorLease);
                }
            }
            Some(Pc::OperatorLeased) => {
                actions.push(Action::OperatorLook { to: Resolution::Captured, force: false });
                actions.push(Action::OperatorLook { to: Resolution::Failed, force: false });
                actions.push(Action::OperatorLook { to: Resolution::Failed, force: true });
            }
            Some(Pc::OperatorJudged { .. }) => actions.push(Action::OperatorSettle),
            Some(Pc::OperatorTakingBack) => actions.push(Action::OperatorTakeBack),
            _ => {}
        }
    }

    fn provider(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        let budgets = &state.budgets;
        for (index, request) in state.provider.requests.iter().enumerate() {
            if request.reply.is_some() {
                continue;
            }
            if !request.late || budgets.late > 0 {
                for choice in provider::choices(config, state, index) {
                    actions.push(Action::ProviderActs { index: index as u8, choice });
                }
            }
            if request.from.is_none() && (request.late || request.target == Target::LateVoid) {
                actions.push(Action::ProviderDrops(index as u8));
            }
        }
        for op in state.ops() {
            if self.may_go_quiet(state, op) {
                actions.push(Action::SendsGoQuiet(op));
            }
        }
        if let Some(charge) = state.provider.charge {
            if charge.status == ChargeStatus::Pending {
                actions.push(Action::ChargeSettles);
            }
            if charge.status == ChargeStatus::RequiresCapture && budgets.expiries > 0 {
                actions.push(Action::AuthorizationExpires);
            }
        }
        for (k, refund) in state.provider.refunds.iter().enumerate() {
            match refund {
                Some((ProviderRefundStatus::Pending, _)) => actions.push(Action::RefundSettles(k as u8)),
                Some((ProviderRefundStatus::Succeeded, _)) if budgets.reversals > 0 => {
                    actions.push(Action::RefundReversed(k as u8))
                }
                _ => {}
            }
        }
        for amount in 1..=provider::disputable(state) {
            actions.push(Action::OpenDispute(amount));
        }
        if state.provider.dispute.is_some_and(|d| d.open()) {
            actions.push(Action::DecideDispute { won: true });
            actions.push(Action::DecideDispute { won: false });
        }
        for index in 0..state.dispute_lookups.len() as u8 {
            actions.push(Action::RecordDispute(index));
        }
        for index in 0..state.provider.webhooks.len() as u8 {
            actions.push(Action::Deliver { index, again: false });
            if budgets.duplicates > 0 {
                actions.push(Action::Deliver { index, again: true });
            }
        }
    }

    /// Time may pass the last send of `op` once nobody waits for an answer about it (the
    /// provider timeout is shorter than the quiet period) and no marked send is still to leave.
    fn may_go_quiet(&self, state: &State, op: Op) -> bool {
        state.row(op).send_recent
            && !state.provider.requests.iter().any(|r| r.target == Target::Op(op) && r.from.is_some())
            && !state.procs().any(
                |p| matches!(state.pc(p), Pc::Drive { op: driven, stage: Stage::Marked, .. } if driven == op),
            )
    }

    fn faults(&self, state: &State, actions: &mut Vec<Action>) {
        let budgets = &state.budgets;
        if budgets.crashes > 0 {
            for proc in state.procs() {
                if !matches!(state.pc(proc), Pc::Idle | Pc::Finished) {
                    actions.push(Action::Crash(proc));
                }
            }
        }
        for op in state.ops() {
            if let Lease::Held(holder) = state.row(op).lease
                && (!state.working_on(holder, op) || budgets.lease_runs_out > 0)
            {
                actions.push(Action::LeaseRunsOut(op));
            }
        }
        if budgets.key_expiries > 0 {
            for (i, key) in state.keys.iter().enumerate() {
                let refund = matches!(self.config.intents[i], Intent::Refund(_));
                if refund && *key != Key::Free && state.clients[i].pc == Pc::Idle {
                    actions.push(Action::KeyExpires(i as u8));
                }
            }
        }
    }

    /// The state after `action`, checked against the transition rules (`audit`).
    pub fn apply(&self, before: &State, action: Action) -> State {
        let mut step =
            Step { config: &self.config, state: before.clone(), written: Vec::new(), correction: false };
        step_through(&mut step, action);
        let Step { mut state, written, correction, .. } = step;
        // Two requests with the same downstream key nobody waits for are one: the provider
        // answers the second as a replay of the first.
        state.provider.requests.sort();
        state.provider.requests.dedup();
        if state.ghost.broken.is_none() {
            state.ghost.broken = audit::check(before, &state, &written, correction);
        }
        state
    }
}

/// What `action` does, as the statement or call it stands for.
fn step_through(step: &mut Step, action: Action) {
    let config = step.config;
    match action {
        Action::Request(i) => {
            let client = &mut step.state.clients[i as usize];
            let read = match client.pc {
                Pc::ReadUnlocked { succeeded, refundable } => Some((succeeded, refundable)),
                _ => {
                    client.requests_left -= 1;
                    None
                }
            };
            step.request(i, read);
        }
        Action::Respond(i, kind) => {
            step.state.clients[i as usize].requests_left -= 1;
            step.respond(i, kind);
        }
        Action::ReadUnlocked(i) => {
            step.state.clients[i as usize].requests_left -= 1;
            let (succeeded, refundable) = refundable(config, &step.state);
            step.state.set_pc(Proc::Client(i), Pc::ReadUnlocked { succeeded, refundable });
        }
        Action::LookUp(proc) => {
            let (op, mode) = driving(&step.state, proc);
            let mut finding = provider::look_up(config, &step.state, op);
            // The last check gives up only on a lookup that started once the last send was
            // quiet: one taken while a send may still land says nothing about it.
            let inconclusive = mode == Mode::LookupOnly
                && step.state.row(op).send_recent
                && !config.mutated(Mutation::NoInFlightGuard)
                && !config.has(Defect::GiveUpOnAStaleLookup);
            if finding == Finding::NotReceived && inconclusive {
                finding = Finding::Unknown;
            }
            if let (Op::Response(_), Finding::Final(Outcome::ResponseTaken(_))) = (op, finding) {
                // Its sender never heard it was taken (its answer was lost), or this is a
                // re-drive of one it did hear of but did not settle yet.
                step.state.ghost.response_found_by_lookup = true;
            }
            step.state.set_pc(proc, Pc::Drive { op, mode, stage: Stage::Have(finding) });
        }
        Action::MarkSending(proc) => {
            let (op, mode) = driving(&step.state, proc);
            let stage = if step.state.in_flight(op) && step.state.row(op).lease.names(proc) {
                step.state.row_mut(op).send_recent = true;
                Stage::Marked
            } else {
                // Another driver holds the operation: send nothing.
                Stage::Have(Finding::Unknown)
            };
            step.state.set_pc(proc, Pc::Drive { op, mode, stage });
        }
        Action::Send(proc) => {
            let (op, mode) = driving(&step.state, proc);
            let request = Request { target: Target::Op(op), from: Some(proc), reply: None, late: false };
            step.state.provider.requests.push(request);
            step.state.set_pc(proc, Pc::Drive { op, mode, stage: Stage::Waiting });
        }
        Action::AnswerArrives(proc) => {
            let requests = &mut step.state.provider.requests;
            let index = requests.iter().position(|r| r.from == Some(proc) && r.reply.is_some());
            let reply = requests.remove(index.expect("an answer")).reply.expect("an answer");
            match step.state.pc(proc) {
                Pc::Drive { op, mode, .. } => {
                    step.state.set_pc(proc, Pc::Drive { op, mode, stage: Stage::Have(reply) })
                }
                _ => {
                    // The late void's answer: a voided authorization ends the watch
                    // (`watch_late_again(None)`); anything else leaves it for the next look.
                    let payment = step.state.payment_mut();
                    if reply == Finding::Final(Outcome::Voided) && payment.late == LateCharge::Watching {
                        payment.late = LateCharge::Ended;
                    }
                    finish(step, proc, None);
                }
            }
        }
        Action::TimesOut(proc) => {
            stop_waiting(&mut step.state, proc);
            match step.state.pc(proc) {
                Pc::Drive { op, mode, .. } => {
                    step.state.set_pc(proc, Pc::Drive { op, mode, stage: Stage::Have(Finding::Unknown) })
                }
                _ => finish(step, proc, None),
            }
        }
        Action::Settle(proc) => {
            let Pc::Drive { op, stage: Stage::Have(Finding::Final(outcome)), .. } = step.state.pc(proc)
            else {
                unreachable!("settling without an outcome")
            };
            let answer = step.settle(op, Settlement::Outcome(outcome));
            finish(step, proc, answer);
        }
        Action::GiveUp(proc) => {
            let (op, mode) = driving(&step.state, proc);
            let answer = step.give_up(op, proc);
            if step.state.in_flight(op) {
                // Held back: a send may still be in flight. Released for a later check.
                step.state.set_pc(proc, Pc::Drive { op, mode, stage: Stage::Have(Finding::Unknown) });
            } else {
                finish(step, proc, answer);
            }
        }
        Action::Release(proc) => {
            let (op, _) = driving(&step.state, proc);
            if step.state.in_flight(op) && step.state.row(op).lease.names(proc) {
                step.state.row_mut(op).lease = Lease::Free;
            }
            // Someone else may have settled it meanwhile: their answer is the answer.
            let answer = step.state.answer(op);
            finish(step, proc, answer);
        }
        Action::Claim(r, op) => {
            let proc = Proc::Reconciler(r);
            step.state.row_mut(op).lease = Lease::Held(proc);
            let attempts = (step.state.row(op).attempts + 1).min(config.max_attempts);
            step.state.row_mut(op).attempts = attempts;
            let mode = if attempts >= config.max_attempts { Mode::LookupOnly } else { Mode::Redrive };
            step.state.set_pc(proc, Pc::Drive { op, mode, stage: Stage::Look });
        }
        Action::LateChargeLook(r) => {
            let seen = step.state.provider.charge.map(|c| c.status);
            let landing = step.state.could_land(Target::Op(Op::Charge));
            step.state.set_pc(Proc::Reconciler(r), Pc::LateChargeSeen { seen, landing });
        }
        Action::LateChargeAct(r) => {
            let proc = Proc::Reconciler(r);
            let Pc::LateChargeSeen { seen, landing } = step.state.pc(proc) else { unreachable!() };
            step.state.set_pc(proc, Pc::Idle);
            late_charge_act(step, proc, seen, landing);
        }
        Action::StartSystemRefund(r) => {
            let alive = step.state.refunds.iter().any(|r| r.system() && r.status == OpStatus::Processing);
            let due = step.state.payment.as_ref().is_some_and(|p| p.late == LateCharge::RefundDue);
            if due && !alive {
                step.start_system_refund(Proc::Reconciler(r));
            }
        }
        Action::LateRefundLook(r, k) => {
            let seen = provider::refund_seen(&step.state, k);
            let landing = step.state.could_land(Target::Op(Op::Refund(k)));
            step.state.set_pc(Proc::Reconciler(r), Pc::LateRefundSeen { k, seen, landing });
        }
        Action::LateRefundAct(r) => {
            let proc = Proc::Reconciler(r);
            let Pc::LateRefundSeen { k, seen, landing } = step.state.pc(proc) else { unreachable!() };
            step.state.set_pc(proc, Pc::Idle);
            late_refund_act(step, k, seen, landing);
        }
        Action::AuthorizationLook(r) => {
            let charge = step.state.provider.charge.expect("an authorization's charge");
            step.state.set_pc(Proc::Reconciler(r), Pc::AuthorizationSeen(charge.status, charge.captured));
        }
        Action::AuthorizationEnd(r) => {
            let proc = Proc::Reconciler(r);
            let Pc::AuthorizationSeen(status, captured) = step.state.pc(proc) else { unreachable!() };
            step.state.set_pc(proc, Pc::Idle);
            step.end_authorization(status, captured);
        }
        Action::DisputeList(r) => {
            let listed = step.state.provider.dispute.expect("a dispute to list");
            step.state.set_pc(Proc::Reconciler(r), Pc::DisputeListed(listed));
        }
        Action::DisputeRecord(r) => {
            let proc = Proc::Reconciler(r);
            let Pc::DisputeListed(listed) = step.state.pc(proc) else { unreachable!() };
            step.state.set_pc(proc, Pc::Idle);
            if step.record_dispute(listed) == Recorded::Created {
                step.state.ghost.dispute_by_pass = true;
            }
        }
        Action::OperatorLease => {
            step.state.row_mut(Op::Charge).lease = Lease::Held(Proc::Operator);
            step.state.operator = Some(Pc::OperatorLeased);
        }
        Action::OperatorLook { to, force } => operator_look(step, to, force),
        Action::OperatorSettle => {
            let Some(Pc::OperatorJudged { to, forced, take_back, seen }) = step.state.operator else {
                unreachable!()
            };
            let was = step.state.in_flight(Op::Charge);
            let quiet = !step.state.row(Op::Charge).send_recent
                || forced
                || to != Resolution::Failed
                || config.has(Defect::OperatorFailsOverASendInFlight);
            if quiet {
                step.settle(Op::Charge, Settlement::Resolved(to));
            }
            let applied = was && !step.state.in_flight(Op::Charge);
            if applied && forced {
                step.state.ghost.forced = true;
            }
            if applied && seen {
                // `Resolution::charge_id`: the charge the look saw is recorded, whatever the
                // payment is settled as.
                step.state.payment_mut().charge_known = true;
            }
            step.state.operator =
                Some(if applied && take_back { Pc::OperatorTakingBack } else { Pc::Finished });
        }
        Action::OperatorTakeBack => {
            step.state.operator = Some(Pc::Finished);
            if config.manual() {
                late_void(step, Proc::Operator);
            } else {
                step.take_back(Proc::Operator);
            }
        }
        Action::ProviderActs { index, choice } => {
            let index = index as usize;
            let reply = provider::act(config, &mut step.state, index, choice);
            let requests = &mut step.state.provider.requests;
            if requests[index].from.is_some() {
                requests[index].reply = Some(reply);
            } else {
                requests.remove(index);
            }
        }
        Action::SendsGoQuiet(op) => {
            step.state.row_mut(op).send_recent = false;
            let late = step.state.budgets.late > 0;
            let requests = &mut step.state.provider.requests;
            requests.retain(|r| r.target != Target::Op(op) || r.reply.is_some() || late);
            for request in requests.iter_mut().filter(|r| r.target == Target::Op(op)) {
                request.late = true;
            }
        }
        Action::ProviderDrops(index) => {
            step.state.provider.requests.remove(index as usize);
        }
        Action::ChargeSettles => provider::charge_settles(config, &mut step.state),
        Action::RefundSettles(k) => provider::refund_settles(config, &mut step.state, k),
        Action::AuthorizationExpires => provider::authorization_expires(config, &mut step.state),
        Action::RefundReversed(k) => provider::refund_reversed(config, &mut step.state, k),
        Action::OpenDispute(amount) => provider::open_dispute(config, &mut step.state, amount),
        Action::DecideDispute { won } => provider::decide_dispute(config, &mut step.state, won),
        Action::RecordDispute(index) => {
            let seen = step.state.dispute_lookups.remove(index as usize);
            step.record_dispute(seen);
        }
        Action::Deliver { index, again } => {
            let webhook = step.state.provider.webhooks[index as usize];
            if again {
                step.state.budgets.duplicates -= 1;
            } else {
                step.state.provider.webhooks.remove(index as usize);
            }
            deliver(step, webhook);
        }
        Action::Crash(proc) => {
            step.state.budgets.crashes -= 1;
            stop_waiting(&mut step.state, proc);
            let pc = if proc == Proc::Operator { Pc::Finished } else { Pc::Idle };
            step.state.set_pc(proc, pc);
        }
        Action::LeaseRunsOut(op) => {
            let Lease::Held(holder) = step.state.row(op).lease else { unreachable!() };
            if step.state.working_on(holder, op) {
                step.state.budgets.lease_runs_out -= 1;
            }
            step.state.row_mut(op).lease = Lease::RanOut(holder);
        }
        Action::KeyExpires(i) => {
            step.state.budgets.key_expiries -= 1;
            step.state.keys[i as usize] = Key::Free;
            step.state.ghost.told[i as usize] = None;
        }
    }
}

/// The reconciler's dispute pass has something to record: the provider has a dispute we lack,
/// or one we hold open and differently. (A listing that could only find what we hold changes
/// nothing, and a dispute we hold decided is not looked at again.)
pub fn dispute_pass_due(state: &State) -> bool {
    let held = state.dispute;
    state.provider.dispute.is_some_and(|d| held != Some(d) && held.is_none_or(Dispute::open))
}

/// The operation a process drives, and how.
fn driving(state: &State, proc: Proc) -> (Op, Mode) {
    match state.pc(proc) {
        Pc::Drive { op, mode, .. } => (op, mode),
        pc => unreachable!("{proc:?} drives nothing: {pc:?}"),
    }
}

/// The process stops waiting for its answer: an answer already on its way is lost; a request
/// the provider has not acted on stays on the wire.
fn stop_waiting(state: &mut State, proc: Proc) {
    let requests = &mut state.provider.requests;
    requests.retain(|r| r.from != Some(proc) || r.reply.is_none());
    for request in requests.iter_mut().filter(|r| r.from == Some(proc)) {
        request.from = None;
    }
}

/// The process is done: a client is told its answer (a final one, or 202 for `None`).
fn finish(step: &mut Step, proc: Proc, answer: Option<crate::state::Answer>) {
    match proc {
        Proc::Client(i) => {
            if let Some(answer) = answer {
                step.tell(i, answer);
            }
            step.state.set_pc(proc, Pc::Idle);
        }
        Proc::Reconciler(_) => step.state.set_pc(proc, Pc::Idle),
        Proc::Operator => step.state.operator = Some(Pc::Finished),
    }
}

/// The late void of an authorization held for a failed payment: `cancel_charge` with
/// `orderpay_late_void_<payment>`.
fn late_void(step: &mut Step, proc: Proc) {
    let request = Request { target: Target::LateVoid, from: Some(proc), reply: None, late: false };
    step.state.provider.requests.push(request);
    step.state.set_pc(proc, Pc::LateVoidWaiting);
}

/// `operations::late_charge::look` after the lookup: take a captured charge back, void an
/// authorization, or look again later; the watch ends once nothing can land any more (its
/// window outlasts any provider's lateness).
fn late_charge_act(step: &mut Step, proc: Proc, seen: Option<ChargeStatus>, landing: bool) {
    let watching = step.state.payment.as_ref().is_some_and(|p| p.late == LateCharge::Watching);
    match seen {
        Some(ChargeStatus::Succeeded) => {
            step.take_back(proc);
        }
        Some(ChargeStatus::RequiresCapture) if watching => late_void(step, proc),
        _ => {
            if watching && !landing {
                step.state.payment_mut().late = LateCharge::Ended;
            }
        }
    }
}

/// The late-refund watch after its lookup of refund `k`: a correction on the provider's word,
/// or the end of the watch once nothing can land any more.
fn late_refund_act(step: &mut Step, k: u8, seen: Option<ProviderRefundStatus>, landing: bool) {
    use crate::state::RefundWatch;
    use ProviderRefundStatus as P;
    let refund = &step.state.refunds[k as usize];
    let (status, watched, check) = (refund.status, refund.watch != RefundWatch::Off, refund.check);
    match (status, seen) {
        (OpStatus::Failed, Some(P::Succeeded)) if watched => {
            step.correction = true;
            step.correct_refund(k, OpStatus::Succeeded);
        }
        (OpStatus::Failed, Some(P::Failed | P::Reversed)) if watched => {
            step.state.refunds[k as usize].watch = RefundWatch::Off;
            step.late_charge_follows();
        }
        (OpStatus::Failed, None) if watched => {
            step.state.refunds[k as usize].watch =
                if landing { RefundWatch::SeenAbsent } else { RefundWatch::Off };
            step.late_charge_follows();
        }
        (OpStatus::Succeeded, Some(P::Failed | P::Reversed)) if check => {
            step.correction = true;
            step.correct_refund(k, OpStatus::Failed);
        }
        (OpStatus::Succeeded, Some(P::Succeeded)) if check => step.state.refunds[k as usize].check = false,
        (OpStatus::Failed, _) if check => step.state.refunds[k as usize].check = false,
        _ => {}
    }
}

/// `operations::operator::judge` under the lease, and a refusal's release.
fn operator_look(step: &mut Step, to: Resolution, force: bool) {
    let manual = step.config.manual();
    let charge = step.state.provider.charge.map(|c| c.status);
    // Failing a payment whose send may still land needs the give-up's guard: quiet, under
    // the operator's lease.
    let quiet =
        !step.state.row(Op::Charge).send_recent || step.config.has(Defect::OperatorFailsOverASendInFlight);
    let (to, objection, take_back) = match to {
        Resolution::Failed => match charge {
            None if !quiet => (Resolution::Failed, true, false),
            None | Some(ChargeStatus::Declined | ChargeStatus::Voided | ChargeStatus::Expired) => {
                (Resolution::Failed, false, false)
            }
            Some(ChargeStatus::Succeeded | ChargeStatus::RequiresCapture) => (Resolution::Failed, true, true),
            Some(ChargeStatus::Pending) => (Resolution::Failed, true, false),
        },
        _ => match charge {
            Some(ChargeStatus::Succeeded) => (Resolution::Captured, false, false),
            Some(ChargeStatus::RequiresCapture) if manual => (Resolution::Authorized, false, false),
            _ => (Resolution::Captured, true, false),
        },
    };
    if objection && !force {
        // Refused: nothing changes; the lease is let go for the reconciler's next check.
        if step.state.row(Op::Charge).lease.names(Proc::Operator) && step.state.in_flight(Op::Charge) {
            step.state.row_mut(Op::Charge).lease = Lease::Free;
        }
        step.state.operator = Some(Pc::Finished);
        return;
    }
    step.state.operator =
        Some(Pc::OperatorJudged { to, forced: objection, take_back, seen: charge.is_some() });
}

/// `operations::webhooks::receive`: a verified event, applied in one transaction. An event about
/// an operation in flight settles it as the provider's own lookup says now (`webhooks::verify`),
/// which may be past what the event says (a refund reversed since, an authorization expired).
fn deliver(step: &mut Step, webhook: Webhook) {
    let config = step.config;
    let on_its_word = config.mutated(Mutation::WebhookOnItsWord);
    match webhook {
        Webhook::Charge(status, captured) => {
            let Some(payment) = step.state.payment.clone() else { return };
            let said = crate::state::Charge { status, captured, refunded: 0, landed_late: false };
            if payment.charge_in_flight() {
                // The provider's charge as its lookup finds it now (the event's word, mutated).
                let now = step.state.provider.charge.expect("an event about a charge the provider made");
                let charge = if on_its_word { said } else { now };
                // The payment's own charge: a capture, an authorization or a decline that
                // matches moves it; a cancel releases an authorization, so only the provider's
                // lookup (the reconciler's) may record it.
                match provider::charge_outcome(config, charge) {
                    Finding::Final(
                        outcome @ (Outcome::Captured(_) | Outcome::Authorized | Outcome::Declined),
                    ) => {
                        step.settle(Op::Charge, Settlement::Outcome(outcome));
                    }
                    Finding::Final(outcome) if on_its_word => {
                        step.settle(Op::Charge, Settlement::Outcome(outcome));
                    }
                    _ => {}
                }
            } else if let Some(k) = step.state.actions.iter().position(|a| a.status == OpStatus::Processing) {
                // A capture's amount or a cancel: verified by the reconciler's lookup.
                if on_its_word && let Finding::Final(outcome) = provider::action_outcome(said) {
                    step.settle(Op::Action(k as u8), Settlement::Outcome(outcome));
                }
            } else if payment.status == PaymentStatus::RequiresCapture {
                // The authorization ended: verified by the authorization watch's lookup.
                if on_its_word {
                    step.end_authorization(status, captured);
                }
            }
            // A charge for a failed payment brings the late-charge watch forward: its next
            // look is already possible here (time is abstracted).
        }
        Webhook::Dispute(word) => {
            // The same as the row we hold: a copy or an older event, which asks nothing.
            if step.state.dispute == Some(word) {
                return;
            }
            if config.mutated(Mutation::DisputeWebhookOnItsWord) {
                step.record_dispute(word);
            } else {
                // Rolled back and looked up; recorded by the event's second transaction.
                let seen = step.state.provider.dispute.expect("the provider's dispute");
                step.state.dispute_lookups.push(seen);
                step.state.dispute_lookups.sort();
            }
        }
        Webhook::Refund(k, status) => {
            let refund = &step.state.refunds[k as usize];
            match refund.status {
                OpStatus::Processing => {
                    // The provider's refund as its lookup finds it now (the event's word, mutated).
                    let (now, _) = step.state.provider.refunds[k as usize]
                        .expect("an event about a refund the provider made");
                    let status = if on_its_word { status } else { now };
                    if let Finding::Final(outcome) = provider::refund_outcome(status) {
                        step.settle(Op::Refund(k), Settlement::Outcome(outcome));
                    }
                }
                // Carried out after we gave up: the late-refund watch's lookup records it.
                OpStatus::Failed if status == ProviderRefundStatus::Succeeded && on_its_word => {
                    step.correct_refund(k, OpStatus::Succeeded);
                }
                // A watched refund the provider now says failed: whatever the watch saw before,
                // it looks again.
                OpStatus::Failed
                    if matches!(status, ProviderRefundStatus::Failed | ProviderRefundStatus::Reversed)
                        && refund.watch != crate::state::RefundWatch::Off
                        && !config.has(Defect::ReversalIgnoredWhileWatched) =>
                {
                    step.state.refunds[k as usize].check = true;
                }
                OpStatus::Succeeded
                    if matches!(status, ProviderRefundStatus::Failed | ProviderRefundStatus::Reversed) =>
                {
                    if on_its_word {
                        step.correct_refund(k, OpStatus::Failed);
                    } else {
                        // Reversed? Only the provider's lookup says so: the watch looks.
                        step.state.refunds[k as usize].check = true;
                    }
                }
                _ => {}
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        // A state that broke a rule is a counterexample already: nothing after it matters.
        if state.ghost.broken.is_none() {
            self.enabled(state, actions);
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        Some(self.apply(state, action))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::for_config(&self.config)
    }

    fn format_step(&self, state: &State, action: Action) -> Option<String> {
        Some(crate::trace::describe(self, state, action))
    }
}
