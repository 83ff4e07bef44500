//! Paths in the service's terms: one readable line per step (who acted, the statement or call it
//! stands for, what changed), and the same steps as JSON for a conformance harness to replay
//! (docs/model.md, "Conformance").

use serde::Serialize;

use crate::action::Action;
use crate::config::Intent;
use crate::protocol::Protocol;
use crate::state::{Key, Op, Pc, Proc, Stage, State};

/// Who takes `action`.
pub fn actor(protocol: &Protocol, action: Action) -> String {
    let proc = match action {
        Action::Request(i) | Action::ReadUnlocked(i) | Action::Respond(i, _) => Some(Proc::Client(i)),
        Action::Crash(p) => Some(p),
        Action::Claim(r, _)
        | Action::LateChargeLook(r)
        | Action::LateChargeAct(r)
        | Action::StartSystemRefund(r)
        | Action::LateRefundLook(r, _)
        | Action::LateRefundAct(r)
        | Action::AuthorizationLook(r)
        | Action::AuthorizationEnd(r)
        | Action::DisputeList(r)
        | Action::DisputeRecord(r) => Some(Proc::Reconciler(r)),
        Action::OperatorLease
        | Action::OperatorLook { .. }
        | Action::OperatorSettle
        | Action::OperatorTakeBack => Some(Proc::Operator),
        _ => action.engine_step_of(),
    };
    match (proc, action) {
        (Some(proc), _) => proc_name(protocol, proc),
        (None, Action::Deliver { .. } | Action::RecordDispute(_)) => "webhook".to_owned(),
        (None, Action::SendsGoQuiet(_) | Action::LeaseRunsOut(_) | Action::KeyExpires(_)) => {
            "time".to_owned()
        }
        (None, _) => "provider".to_owned(),
    }
}

fn proc_name(protocol: &Protocol, proc: Proc) -> String {
    match proc {
        Proc::Client(i) => {
            let what = match protocol.config.intents[i as usize] {
                Intent::Pay => "POST /payments".to_owned(),
                Intent::Capture(amount) => format!("POST /payments/{{id}}/capture {amount}"),
                Intent::Void => "POST /payments/{id}/void".to_owned(),
                Intent::Refund(amount) => format!("POST /refunds {amount}"),
                Intent::Respond => "POST /disputes/{id}/evidence or /accept".to_owned(),
            };
            format!("client {i} ({what})")
        }
        Proc::Reconciler(r) => format!("reconciler {r}"),
        Proc::Operator => "operator".to_owned(),
    }
}

fn op_name(op: Op) -> String {
    match op {
        Op::Charge => "the charge".to_owned(),
        Op::Action(k) => format!("capture/void {k}"),
        Op::Refund(k) => format!("refund {k}"),
        Op::Response(k) => format!("dispute response {k}"),
    }
}

fn settle_statement(op: Op) -> &'static str {
    match op {
        Op::Charge => "payments/settle_payment.sql",
        Op::Action(_) => "payments/settle_capture_or_void.sql",
        Op::Refund(_) => "refunds/settle_refund.sql",
        Op::Response(_) => "disputes/record_dispute.sql, disputes/settle_response.sql",
    }
}

/// The statement or function of the service `action` stands for, in `state`.
pub fn statement(protocol: &Protocol, state: &State, action: Action) -> &'static str {
    let driven = |proc: Proc| match state.pc(proc) {
        Pc::Drive { op, .. } => Some(op),
        _ => None,
    };
    match action {
        Action::Request(i) | Action::Respond(i, _) if state.keys[i as usize] != Key::Free => {
            "operations::request::existing_key"
        }
        Action::Respond(..) => "disputes/start_response.sql",
        Action::Request(i) | Action::ReadUnlocked(i) => match protocol.config.intents[i as usize] {
            Intent::Pay => "payments/start_payment.sql",
            Intent::Capture(_) | Intent::Void => "payments/start_capture_or_void.sql",
            Intent::Refund(_) => "refunds/start_refund.sql",
            Intent::Respond => unreachable!("a dispute response's request is `Respond`"),
        },
        Action::LookUp(_) => "Kind::look_up",
        Action::MarkSending(_) => "operations::leases::mark_sending",
        Action::Send(proc) if driven(proc).is_none() => "operations::late_charge::take_back (late void)",
        Action::Send(_) => "Kind::send",
        Action::AnswerArrives(_) => "the provider's answer",
        Action::TimesOut(_) => "ORDERPAY_PROVIDER_TIMEOUT_MS",
        Action::Settle(proc) | Action::GiveUp(proc) => driven(proc).map_or("Kind::settle", settle_statement),
        Action::Release(_) => "operations::leases::release",
        Action::Claim(..) => "operations::leases::lease",
        Action::LateChargeLook(_) => "operations::late_charge::look",
        Action::LateChargeAct(_) => "operations::late_charge::take_back",
        Action::StartSystemRefund(_) => "refunds/start_refund.sql (system)",
        Action::LateRefundLook(..) => "the late-refund watch: find_refund",
        Action::LateRefundAct(_) => "the late-refund watch: the correction",
        Action::AuthorizationLook(_) => "operations::authorization::watch",
        Action::AuthorizationEnd(_) => "payments/end_authorization.sql",
        Action::DisputeList(_) => "disputes::record::pass (list_disputes)",
        Action::DisputeRecord(_) | Action::RecordDispute(_) => "disputes/record_dispute.sql",
        Action::OpenDispute(_) => "the customer's bank disputes the charge",
        Action::DecideDispute { .. } => "the bank decides the dispute",
        Action::OperatorLease => "operations::operator::resolve (take_lease)",
        Action::OperatorLook { .. } => "operations::operator::resolve (judge)",
        Action::OperatorSettle => "payments/settle_payment.sql (Resolved)",
        Action::OperatorTakeBack => "operations::late_charge::take_back",
        Action::ProviderActs { .. } => "the provider acts",
        Action::SendsGoQuiet(_) => "ORDERPAY_GIVE_UP_MARGIN_MS passes",
        Action::ProviderDrops(_) => "the provider never acts",
        Action::ChargeSettles | Action::RefundSettles(_) => "the provider settles",
        Action::AuthorizationExpires => "the authorization expires",
        Action::RefundReversed(_) => "the provider reverses a refund",
        Action::Deliver { .. } => "operations::webhooks::receive",
        Action::Crash(_) => "SIGKILL",
        Action::LeaseRunsOut(_) => "lease_until passes",
        Action::KeyExpires(_) => "idempotency::store::delete_expired",
    }
}

/// What `action` does, in words.
fn doing(protocol: &Protocol, before: &State, after: &State, action: Action) -> String {
    let request = |index: u8| before.provider.requests.get(index as usize).copied();
    match action {
        Action::Request(_) => "sends its request".to_owned(),
        Action::Respond(_, kind) => format!("answers the dispute: {kind:?}"),
        Action::ReadUnlocked(_) => "reads the payment without its lock".to_owned(),
        Action::LookUp(proc) => match after.pc(proc) {
            Pc::Drive { op, stage: Stage::Have(finding), .. } => {
                format!("looks {} up: {finding:?}", op_name(op))
            }
            _ => "looks up".to_owned(),
        },
        Action::MarkSending(proc) => match after.pc(proc) {
            Pc::Drive { op, stage: Stage::Marked, .. } => format!("marks a re-send of {}", op_name(op)),
            _ => "may not re-send: another driver holds it".to_owned(),
        },
        Action::Send(proc) => match before.pc(proc) {
            Pc::Drive { op, .. } => format!("sends {}", op_name(op)),
            _ => "sends the late void".to_owned(),
        },
        Action::AnswerArrives(proc) => match after.pc(proc) {
            Pc::Drive { stage: Stage::Have(finding), .. } => format!("gets the answer: {finding:?}"),
            _ => "gets the answer".to_owned(),
        },
        Action::TimesOut(_) => "times out waiting for the answer".to_owned(),
        Action::Settle(proc) => match before.pc(proc) {
            Pc::Drive { op, stage: Stage::Have(finding), .. } => {
                format!("settles {} as {finding:?}", op_name(op))
            }
            _ => "settles".to_owned(),
        },
        Action::GiveUp(proc) => match before.pc(proc) {
            Pc::Drive { op, .. } if after.in_flight(op) => {
                format!("gives up on {}: held back, a send may be in flight", op_name(op))
            }
            Pc::Drive { op, .. } => format!("gives up on {}", op_name(op)),
            _ => "gives up".to_owned(),
        },
        Action::Release(_) => "releases its lease, outcome unknown".to_owned(),
        Action::Claim(_, op) => format!("claims {} (attempt {})", op_name(op), after.row(op).attempts),
        Action::LateChargeLook(_) => {
            format!("looks for a late charge: {:?}", before.provider.charge.map(|c| c.status))
        }
        Action::LateChargeAct(_) => "acts on what the late-charge watch saw".to_owned(),
        Action::StartSystemRefund(_) => "starts another system refund of the late charge".to_owned(),
        Action::LateRefundLook(_, k) => {
            format!("looks refund {k} up: {:?}", crate::provider::refund_seen(before, k))
        }
        Action::LateRefundAct(_) => "acts on what the late-refund watch saw".to_owned(),
        Action::AuthorizationLook(_) => {
            format!("looks the authorization up: {:?}", before.provider.charge.map(|c| c.status))
        }
        Action::AuthorizationEnd(_) => "records how the authorization ended".to_owned(),
        Action::DisputeList(_) => format!("lists the provider's dispute: {:?}", before.provider.dispute),
        Action::DisputeRecord(r) => match before.pc(Proc::Reconciler(r)) {
            Pc::DisputeListed(seen) => format!("records the dispute as listed: {seen:?}"),
            _ => "records the dispute".to_owned(),
        },
        Action::RecordDispute(i) => {
            format!("records the dispute as looked up: {:?}", before.dispute_lookups[i as usize])
        }
        Action::OpenDispute(amount) => format!("a dispute withdraws {amount}"),
        Action::DecideDispute { won } => format!("the dispute is {}", if won { "won" } else { "lost" }),
        Action::OperatorLease => "takes the payment's lease".to_owned(),
        Action::OperatorLook { to, force } => {
            format!("judges --as {to:?}{}", if force { " --force" } else { "" })
        }
        Action::OperatorSettle => "settles the payment by hand".to_owned(),
        Action::OperatorTakeBack => "takes the money back".to_owned(),
        Action::ProviderActs { index, choice } => match request(index) {
            Some(r) => format!(
                "acts on {:?}{} ({choice:?})",
                r.target,
                if r.late { ", later than any timeout" } else { "" }
            ),
            None => "acts".to_owned(),
        },
        Action::SendsGoQuiet(op) => format!("the last send of {} goes quiet", op_name(op)),
        Action::ProviderDrops(index) => format!("never acts on {:?}", request(index).map(|r| r.target)),
        Action::ChargeSettles => "the pending charge settles".to_owned(),
        Action::RefundSettles(k) => format!("pending refund {k} settles"),
        Action::AuthorizationExpires => "the authorization expires".to_owned(),
        Action::RefundReversed(k) => format!("refund {k} is reversed"),
        Action::Deliver { index, again } => format!(
            "delivers {:?}{}",
            before.provider.webhooks[index as usize],
            if again { " (a copy stays in flight)" } else { "" }
        ),
        Action::Crash(proc) => format!("{} dies", proc_name(protocol, proc)),
        Action::LeaseRunsOut(op) => format!("the lease on {} runs out", op_name(op)),
        Action::KeyExpires(i) => format!("key {i} expires"),
    }
}

/// What changed, briefly.
fn changes(before: &State, after: &State) -> Vec<String> {
    let mut changes = Vec::new();
    if before.order != after.order {
        changes.push(format!("order {:?} -> {:?}", before.order, after.order));
    }
    match (&before.payment, &after.payment) {
        (None, Some(p)) => changes.push(format!("payment {:?}", p.status)),
        (Some(b), Some(a)) => {
            if b.status != a.status {
                changes.push(format!("payment {:?} -> {:?}", b.status, a.status));
            }
            if (b.captured, b.refunded, b.refunding) != (a.captured, a.refunded, a.refunding) {
                changes.push(format!(
                    "payment captured {} refunded {} refunding {}",
                    a.captured, a.refunded, a.refunding
                ));
            }
            if b.late != a.late {
                changes.push(format!("late charge {:?} -> {:?}", b.late, a.late));
            }
            if b.disputed != a.disputed {
                changes.push(format!("payment disputed {}", a.disputed));
            }
        }
        _ => {}
    }
    for (k, refund) in after.refunds.iter().enumerate() {
        match before.refunds.get(k) {
            None => changes.push(format!(
                "refund {k} {:?} of {}{}",
                refund.status,
                refund.amount,
                if refund.system() { " (system)" } else { "" }
            )),
            Some(was) if was.status != refund.status => {
                changes.push(format!("refund {k} {:?} -> {:?}", was.status, refund.status))
            }
            _ => {}
        }
    }
    for (k, response) in after.responses.iter().enumerate() {
        match before.responses.get(k) {
            None => changes.push(format!("dispute response {k} {:?} {:?}", response.kind, response.status)),
            Some(was) if was.status != response.status => {
                changes.push(format!("dispute response {k} {:?} -> {:?}", was.status, response.status))
            }
            _ => {}
        }
    }
    for (k, action) in after.actions.iter().enumerate() {
        match before.actions.get(k) {
            None => changes.push(format!("{:?} {k} {:?}", action.kind, action.status)),
            Some(was) if was.status != action.status => {
                changes.push(format!("{:?} {k} {:?} -> {:?}", action.kind, was.status, action.status))
            }
            _ => {}
        }
    }
    if before.provider.charge != after.provider.charge
        && let Some(c) = after.provider.charge
    {
        changes
            .push(format!("provider: charge {:?} captured {} refunded {}", c.status, c.captured, c.refunded));
    }
    for (k, refund) in after.provider.refunds.iter().enumerate() {
        if before.provider.refunds.get(k) != Some(refund)
            && let Some((status, amount)) = refund
        {
            changes.push(format!("provider: refund {k} {status:?} ({amount})"));
        }
    }
    if before.dispute != after.dispute
        && let Some(d) = after.dispute
    {
        changes.push(format!(
            "dispute {:?}{} withdrawn {} reinstated {}",
            d.status,
            if d.accepted { " (accepted)" } else { "" },
            d.withdrawn,
            d.reinstated
        ));
    }
    if before.provider.dispute != after.provider.dispute
        && let Some(d) = after.provider.dispute
    {
        changes.push(format!(
            "provider: dispute {:?}{} withdrawn {} reinstated {}",
            d.status,
            if d.accepted { " (accepted)" } else { "" },
            d.withdrawn,
            d.reinstated
        ));
    }
    for (i, told) in after.ghost.told.iter().enumerate() {
        if before.ghost.told[i] != *told
            && let Some(answer) = told
        {
            changes.push(format!("client {i} is told {answer:?}"));
        }
    }
    if before.ghost.broken.is_none()
        && let Some(broken) = after.ghost.broken
    {
        changes.push(format!("BROKEN: {broken:?}"));
    }
    changes
}

/// One line for the step `action` from `state`.
pub fn describe(protocol: &Protocol, state: &State, action: Action) -> String {
    let after = protocol.apply(state, action);
    let changes = changes(state, &after);
    let mut line = format!(
        "{}: {} [{}]",
        actor(protocol, action),
        doing(protocol, state, &after, action),
        statement(protocol, state, action)
    );
    if !changes.is_empty() {
        line.push_str(" => ");
        line.push_str(&changes.join("; "));
    }
    line
}

/// One step of a path, as a conformance harness replays it.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    pub step: usize,
    pub actor: String,
    pub action: Action,
    pub statement: &'static str,
    pub line: String,
    /// The abstract state after the step, to compare with the service's rows and the provider's
    /// ledger mapped the same way.
    pub state: State,
}

/// A path (its actions from the initial state) as step records.
pub fn records(protocol: &Protocol, actions: &[Action]) -> Vec<StepRecord> {
    let mut state = protocol.initial();
    let mut records = Vec::with_capacity(actions.len());
    for (index, &action) in actions.iter().enumerate() {
        let line = describe(protocol, &state, action);
        let statement = statement(protocol, &state, action);
        state = protocol.apply(&state, action);
        records.push(StepRecord {
            step: index + 1,
            actor: actor(protocol, action),
            action,
            statement,
            line,
            state: state.clone(),
        });
    }
    records
}

/// `actions` replayed from the initial state as far as each is enabled: a mutant's
/// counterexample in the model without the mutation, where it stops at the step the guard
/// forbids (or runs on, harmless). Returns the records of the steps taken.
pub fn replay(protocol: &Protocol, actions: &[Action]) -> Vec<StepRecord> {
    let mut state = protocol.initial();
    let mut enabled = Vec::new();
    let mut taken = Vec::new();
    for &action in actions {
        enabled.clear();
        stateright::Model::actions(protocol, &state, &mut enabled);
        if !enabled.contains(&action) {
            break;
        }
        state = protocol.apply(&state, action);
        taken.push(action);
    }
    records(protocol, &taken)
}

/// A random walk of at most `max_steps` steps from the initial state, chosen by `seed`
/// (xorshift: the same seed, the same walk).
pub fn random_walk(protocol: &Protocol, seed: u64, max_steps: usize) -> Vec<Action> {
    let mut rng = seed.max(1);
    let mut state = protocol.initial();
    let mut path = Vec::new();
    let mut enabled = Vec::new();
    for _ in 0..max_steps {
        enabled.clear();
        stateright::Model::actions(protocol, &state, &mut enabled);
        if enabled.is_empty() {
            break;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let action = enabled[(rng % enabled.len() as u64) as usize];
        state = protocol.apply(&state, action);
        path.push(action);
    }
    path
}
