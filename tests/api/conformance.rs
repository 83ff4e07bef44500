//! Trace conformance: the protocol's model (`orderpay-model`, docs/model.md) and the service held
//! to each other. Paths of the model are driven through the real service and the real mock
//! provider, and after each driven stretch the service's rows and the provider's ledger, mapped
//! to the model's abstract state, must equal the model's state.
//!
//! What is driven (docs/model.md, "Conformance", lists what is not): a client's request and its
//! retries with the same key (`POST /payments`, automatic or manual, `POST /refunds`,
//! `POST /payments/{id}/capture`, `/void`, `POST /disputes/{id}/evidence`, `/accept`), a
//! reconciler pass (`orderpay reconcile --once`'s
//! `run_pass`), an operator's resolution (`orderpay payments resolve`'s
//! `operations::operator::resolve`), the provider's behaviour on each send, scripted on the mock
//! (`POST /_admin/script`): acting and answering, acting with the answer lost, declining,
//! leaving a charge or refund pending until the path settles it, never acting; the provider's
//! clock (`POST /_admin/due/{key}/{what}`: settling, expiring, reversing); the bank opening and
//! deciding a dispute (`POST /_admin/disputes`, `/decide`); and the delivery of the provider's
//! webhooks, each event sent by hand (`POST /_admin/webhooks/{id}/deliver`), in the path's
//! order, a copy after the sweep.
//! Nothing runs in the background: the app's reconciler and relays are off and the mock's
//! webhooks leave only when delivered, so each step is the harness's.
//!
//! A path is a random walk of the model (fixed seeds) in which one driver at a time runs from
//! idle to idle (a *stretch*: the request, or the pass, with every step of the provider's on its
//! sends; or one delivery); each stretch's steps are model steps, taken in the model as the
//! checker takes them.
//! The service is compared with the model after every stretch, and the number of sends it made
//! with the number the model made.

use std::time::{Duration, Instant};

use orderpay_model::action::{Action, Choice};
use orderpay_model::config::{CaptureMethod, Faults, Intent};
use orderpay_model::state::{
    ActionKind, Answer, ChargeStatus, Dispute, DisputeStatus, Key, LateCharge, Op, OpStatus, OrderStatus,
    PaymentStatus, Pc, Proc, ProviderRefundStatus, RefundWatch, Resolution, ResponseKind, State, Target,
    Webhook,
};
use orderpay_model::{Config, Mutation, Protocol};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, json, new_key, provider_webhooks_on, spawn_app_with};
use crate::process::ServiceProcess;

/// Paths `make test` (and CI) drive, and how long they may take together
/// (`CONFORMANCE_PATHS`, `CONFORMANCE_SECONDS`: `make model-conformance` drives more).
const PATHS: u64 = 12;
const WALL_CLOCK_CAP: Duration = Duration::from_secs(180);
/// Stretches per path (each a request, a reconciler pass, or time passing).
const STRETCHES: usize = 10;

/// The configuration the harness drives: an automatic payment of 2 units and a refund of both,
/// each key sent twice, one reconciler; the provider acts at once, acts with the
/// answer lost, or acts later (once, after every sender stopped waiting, or after the give-up),
/// or never; sends go quiet, so the reconciler gives up and the late-charge watch looks, and
/// takes back a charge that landed late. The provider's webhooks are delivered when the path
/// says, in any order, one of them twice; a charge, a capture or a refund declined once. The
/// provider's clock and disputes have configurations of their own ([`clock_config`],
/// [`dispute_config`]).
/// With `max_attempts` 1 the reconciler's first check is its last (it only looks, and gives up
/// when a quiet send was never received); with 2 it re-sends first.
fn config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: a charge and a refund, answers lost, the provider late or declining, give-ups, a key expiring",
        total: 2,
        capture_method: CaptureMethod::Automatic,
        intents: vec![Intent::Pay, Intent::Refund(2)],
        requests_per_key: 2,
        reconcilers: 1,
        max_attempts,
        // The service's limit on a late charge's system refunds is its attempt limit.
        system_refunds: max_attempts,
        operator: false,
        webhooks: true,
        faults: Faults { late: 1, duplicates: 1, key_expiries: 1, declines: 1, ..Faults::NONE },
        mutation: None,
        defect: None,
    }
}

/// The manual configuration: the payment of 2 units authorized, then a capture of 1 and a void
/// racing for the authorization (`POST /payments/{id}/capture`, `/void`), each key sent twice;
/// the rest as [`config`]: a late authorization is voided by the late-charge watch.
fn manual_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: an authorization, a capture and a void, answers lost, the provider late",
        capture_method: CaptureMethod::Manual,
        intents: vec![Intent::Pay, Intent::Capture(1), Intent::Void],
        ..config(max_attempts)
    }
}

/// [`config`] with an operator who may resolve the payment by hand once, while its charge is in
/// flight (`orderpay payments resolve`, `--as succeeded` or `--as failed`, with or without
/// `--force`).
fn operator_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: a charge and a refund, an operator's resolution, answers lost, the provider late",
        operator: true,
        ..config(max_attempts)
    }
}

/// [`manual_config`] with the operator of [`operator_config`]: an authorization resolved by hand,
/// or failed by force and voided.
fn manual_operator_config(max_attempts: u8) -> Config {
    Config { operator: true, ..manual_config(max_attempts) }
}

/// [`config`] with the provider's clock: one charge or refund answered pending (the mock's
/// `pend`), left pending until the path settles it (`ChargeSettles`, `RefundSettles`), and one
/// succeeded refund reversed (`RefundReversed`), each the mock's `POST /_admin/due/{key}/{what}`.
fn clock_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: a charge and a refund, pending at the provider until it settles, a refund reversed",
        faults: Faults { pending: 1, reversals: 1, ..config(max_attempts).faults },
        ..config(max_attempts)
    }
}

/// [`manual_config`] with the authorization expiring when the path says (`AuthorizationExpires`).
fn manual_clock_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: an authorization that expires, a capture and a void",
        faults: Faults { expiries: 1, ..manual_config(max_attempts).faults },
        ..manual_config(max_attempts)
    }
}

/// [`config`] with a dispute: the customer's bank may dispute the captured charge once, for part
/// or all of what remains (`POST /_admin/disputes`), and decide it either way
/// (`/_admin/disputes/{id}/decide`); our books record it from its webhooks (each on the
/// service's own lookup) or by the reconciler's dispute pass, and a refund meets it.
fn dispute_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: a charge, a refund and a dispute, answers lost, webhooks once or twice",
        faults: Faults { disputes: 1, duplicates: 1, ..Faults::NONE },
        ..config(max_attempts)
    }
}

/// A dispute and the merchant's answer to it (`POST /disputes/{id}/evidence` or `/accept`, the
/// key sent twice), recorded by the reconciler's dispute pass (no webhooks), the provider late
/// once: the answer taken, refused because the bank decided first, lost and looked up, or given
/// up on.
fn response_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: a dispute and the merchant's answer, answers lost, the provider late",
        intents: vec![Intent::Pay, Intent::Respond],
        webhooks: false,
        faults: Faults { disputes: 1, late: 1, ..Faults::NONE },
        ..config(max_attempts)
    }
}

/// [`config`] with a process dying once (`crashes: 1`), a client's or the reconciler's,
/// anywhere between the statements of its drive, its lease then running out: a retry or the
/// reconciler takes the operation over, or the provider's webhook settles it. No other fault but
/// the provider late once, so that the search for these paths stays short.
fn crash_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: a charge and a refund, a process dying, its lease running out",
        faults: Faults { crashes: 1, late: 1, ..Faults::NONE },
        ..config(max_attempts)
    }
}

/// [`config`] with the provider late once and a lease running out under its live holder once,
/// and no other fault, for the search of paths on which other drivers step in while one is held
/// (each held point multiplies the stretches).
fn step_in_config(max_attempts: u8) -> Config {
    Config {
        name: "conformance: a charge and a refund, webhooks, the provider late once, drivers stepping in",
        faults: Faults { late: 1, lease_runs_out: 1, ..Faults::NONE },
        ..config(max_attempts)
    }
}

/// xorshift, as the model's own random walks: the same seed, the same path.
struct Rng(u64);

impl Rng {
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        from[(self.0 % from.len() as u64) as usize]
    }
}

/// What the mock is told to do with one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scripted {
    Now,
    Hold,
    /// Declined (a charge, a capture or a refund), the answer given or lost.
    Decline,
    /// Declined, and the answer held past the sender's timeout: the decline is lost.
    DeclineAndHold,
    /// Left pending (a charge or a refund) until the path settles it, the answer given or lost.
    Pend,
    PendAndHold,
    /// Not acted on while its sender waits: parked, for the provider to act on later (a
    /// provider stretch) or never.
    Park,
}

impl Scripted {
    fn json(self) -> Value {
        match self {
            Scripted::Now => json!({"act": "now"}),
            Scripted::Hold => json!({"act": "hold"}),
            Scripted::Decline => json!({"act": "decline"}),
            Scripted::DeclineAndHold => json!({"act": "decline_and_hold"}),
            Scripted::Pend => json!({"act": "pend"}),
            Scripted::PendAndHold => json!({"act": "pend_and_hold"}),
            Scripted::Park => json!({"act": "park"}),
        }
    }
}

/// Who runs a stretch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    Client(u8),
    Reconciler,
    /// Time passes: the last send of this operation goes quiet.
    Time(Op),
    /// Time passes: the lease on this operation, held by a driver that died, runs out
    /// (`lease_until` passes).
    LeaseRunsOut(Op),
    /// Time passes: the key of this intent outlives its retention (the next request with it
    /// expires it on the spot, `expire_key.sql`, and counts as new).
    KeyExpires(u8),
    /// The provider acts on a send nobody waits for any more (late, or just after its sender
    /// gave up), or drops it for good (`acts: false`).
    Provider {
        target: Target,
        acts: bool,
    },
    /// The provider does what its clock would (the mock's `POST /_admin/due/{key}/{what}`):
    /// settles a charge or refund it left pending, expires an authorization, reverses a refund.
    ByHand {
        target: Target,
        what: &'static str,
    },
    /// The mock delivers one of its events (`again`: a copy, after the sweep took the first
    /// delivery's row); `result`: what its row must say, `applied` exactly when the model's
    /// step changed our books.
    Deliver {
        webhook: Webhook,
        again: bool,
        result: &'static str,
    },
    /// The customer's bank disputes the charge for `amount` (`POST /_admin/disputes`).
    OpenDispute(u8),
    /// The bank decides the dispute (`POST /_admin/disputes/{id}/decide`).
    DecideDispute {
        won: bool,
    },
    /// The operator resolves the payment (`operations::operator::resolve`) as `to`, forced or
    /// not; `applied`: the model's resolution settled it (else it was refused, nothing changed).
    Operator {
        to: Resolution,
        force: bool,
        applied: bool,
    },
}

/// One stretch taken in the model: its driver, its steps, and what the provider did with each
/// of its sends, in order.
struct Stretch {
    driver: Driver,
    steps: Vec<Action>,
    sends: Vec<Scripted>,
    /// A watch's look when nothing can land any more: in the service, its window has passed.
    windows_pass: bool,
    /// The driver's process dies here (the model's `Crash`): the point of the service
    /// (`hooks::point`) at which its subprocess aborts.
    crash_at: Option<&'static str>,
    /// Other drivers' whole stretches, taken while this one waits between two of its
    /// statements.
    interlude: Option<Box<Interlude>>,
}

/// Stretches taken inside another (the model's interleaving of drivers): the running driver is
/// held at `point` (`hooks::pause`) while each of `stretches` is driven whole, in order, and
/// compared with the model's state after it, then let go on.
struct Interlude {
    point: &'static str,
    stretches: Vec<(Stretch, State)>,
}

impl Interlude {
    /// Held at the mock while its sender's timeout runs: what steps in must be quick, and the
    /// books are compared after the whole stretch only.
    fn at_the_mock(&self) -> bool {
        self.point.starts_with("mock.")
    }
}

fn enabled(protocol: &Protocol, state: &State) -> Vec<Action> {
    let mut actions = Vec::new();
    protocol.enabled(state, &mut actions);
    actions
}

/// The steps that start a stretch from a state where every driver is idle.
fn starts_stretch(state: &State, action: Action) -> bool {
    match action {
        Action::Request(_) | Action::Respond(..) | Action::Claim(0, _) => true,
        Action::DisputeList(0) | Action::OpenDispute(_) | Action::DecideDispute { .. } => true,
        Action::LateChargeLook(0)
        | Action::LateRefundLook(0, _)
        | Action::StartSystemRefund(0)
        | Action::AuthorizationLook(0)
        | Action::SendsGoQuiet(_)
        | Action::LeaseRunsOut(_)
        | Action::KeyExpires(_)
        | Action::OperatorLease
        | Action::ChargeSettles
        | Action::RefundSettles(_)
        | Action::AuthorizationExpires
        | Action::RefundReversed(_) => true,
        Action::ProviderActs { index, choice: Choice::Succeed } => {
            state.provider.requests[index as usize].from.is_none()
        }
        Action::ProviderDrops(_) => true,
        Action::Deliver { .. } => true,
        _ => false,
    }
}

/// The steps that belong to `proc`'s stretch: its own, and the provider acting on what it sent
/// while it waits. (The provider acting on a send nobody waits for any more is never taken: the
/// harness scripts such a send as never acted on.)
fn of_stretch(state: &State, proc: Proc, action: Action) -> bool {
    match action {
        Action::ProviderActs { index, choice: Choice::Succeed } => {
            state.provider.requests[index as usize].from == Some(proc)
        }
        // The mock's script declines a charge, a capture or a refund while its sender waits
        // (`decline`, `decline_and_hold`).
        Action::ProviderActs { index, choice: Choice::Decline } => {
            let request = &state.provider.requests[index as usize];
            request.from == Some(proc)
                && matches!(request.target, Target::Op(Op::Charge | Op::Action(_) | Op::Refund(_)))
        }
        // The mock's script leaves a charge or a refund pending (`pend`, `pend_and_hold`).
        Action::ProviderActs { index, choice: Choice::Pend } => {
            let request = &state.provider.requests[index as usize];
            request.from == Some(proc) && matches!(request.target, Target::Op(Op::Charge | Op::Refund(_)))
        }
        Action::LateChargeAct(r) | Action::LateRefundAct(r) | Action::AuthorizationEnd(r) => {
            proc == Proc::Reconciler(r)
        }
        Action::OperatorLook { .. } | Action::OperatorSettle | Action::OperatorTakeBack => {
            proc == Proc::Operator
        }
        Action::DisputeRecord(r) => proc == Proc::Reconciler(r),
        // A client's or a reconciler's process dies (a subprocess aborted at the point the
        // model's step is at).
        Action::Crash(crashed) => crashed == proc && crash_point(state, proc).is_some(),
        _ => action.engine_step_of() == Some(proc),
    }
}

/// Where the service is when the model's `proc` dies, as a point of `hooks::point` at which a
/// subprocess aborts: before its look-up (a lookup reads, so dying after one that found nothing
/// leaves the rows as dying before it), before its send (marked), or with the drive's finding
/// in hand before recording it (a send waiting for its answer leaves the rows as one whose
/// answer came: the provider's part is the send's script). A client's request runs in
/// `orderpay serve`, a reconciler's pass in `orderpay reconcile --once`, each a subprocess; the
/// reconciler's other steps (its watches, the dispute pass) and the operator do not die here.
fn crash_point(state: &State, proc: Proc) -> Option<&'static str> {
    use orderpay_model::state::{Finding, Mode, Stage};
    let Pc::Drive { stage, mode, .. } = state.pc(proc) else { return None };
    let recorded = recorded_at(proc)?;
    match stage {
        // The last check's lookup that found nothing gives up next: its drive has returned.
        Stage::Have(Finding::NotReceived) if mode == Mode::LookupOnly => Some(recorded),
        Stage::Look | Stage::Have(Finding::NotReceived) => Some("drive.before_look_up"),
        Stage::Marked => Some("drive.before_send"),
        Stage::Waiting | Stage::Have(_) => Some(recorded),
    }
}

/// Where the service is when the model's `proc`, a client's request or the reconciler, is
/// between two statements at which another driver may step in: the point of `hooks::point` at
/// which a test holds it. A send waiting for its answer is held at the mock, before it acts on
/// it or, once it has, before its answer leaves (while the sender's timeout runs: what steps
/// in there must be quick).
fn pause_point(state: &State, proc: Proc) -> Option<&'static str> {
    use orderpay_model::state::{Finding, Mode, Stage};
    let Pc::Drive { stage, mode, .. } = state.pc(proc) else { return None };
    let recorded = recorded_at(proc)?;
    let acted = state.provider.requests.iter().any(|r| r.from == Some(proc) && r.reply.is_some());
    Some(match stage {
        Stage::Waiting if acted => "mock.before_answer",
        Stage::Waiting => "mock.before_act",
        Stage::Look => "drive.before_look_up",
        Stage::Have(Finding::NotReceived) if mode != Mode::LookupOnly => "drive.before_mark_sending",
        Stage::Marked => "drive.before_send",
        Stage::Have(_) => recorded,
    })
}

/// The point after `proc`'s drive, before it records what the drive found: a request's or a
/// reconciler's pass's (the operator's resolution has none).
fn recorded_at(proc: Proc) -> Option<&'static str> {
    match proc {
        Proc::Client(_) => Some("request.before_record"),
        Proc::Reconciler(_) => Some("reconciler.before_record"),
        Proc::Operator => None,
    }
}

/// Whether the stretch `between`, taken from `state` while `proc` is held, can be driven inside
/// `proc`'s stretch: another driver's, sending nothing (the mock's script is the held
/// stretch's) and not dying. A send going quiet cannot: the harness moves `last_send_at` back
/// instead of the clock on, which a held driver's reading of the clock (its lease's time, by
/// which a give-up is judged) would not see. Nor can a delivery the service settles on its own
/// lookup where the model leaves it to the reconciler's claim or a watch's look
/// ([`settled_in_delivery`], [`corrected_on_confirmed_word`]): those stand for steps of
/// reconciler 0 on a free lease, while here a driver is held, often on that very lease.
fn may_step_in(state: &State, between: &[Action], proc: Proc) -> bool {
    let coalesced = match between[0] {
        Action::Deliver { index, .. } => {
            let webhook = state.provider.webhooks[index as usize];
            corrected_on_confirmed_word(state, webhook).is_some()
                || matches!(webhook, Webhook::Charge(status, _) if settled_on_own_lookup(state, status))
        }
        _ => false,
    };
    stretch_proc(between[0]) != Some(proc)
        && !coalesced
        && !matches!(between[0], Action::SendsGoQuiet(_))
        && !between.iter().any(|a| matches!(a, Action::Send(_) | Action::Crash(_)))
}

/// Where a path's steps come from: a random walk's choices, or a given path (a counterexample)
/// as far as the harness can drive it.
enum Source {
    Walk(Rng),
    /// A walk leaning towards the provider's silence and the reconciler's work: while a sender
    /// waits, its answer is lost and the provider does not act; between stretches, anything
    /// but a client's request, when there is anything else. Give-ups and late charges, rare on
    /// a plain walk, are reached on most of these.
    Leaning(Rng),
    Given(std::collections::VecDeque<Action>),
}

impl Source {
    /// The next step among `choices`. A given path that leaves them ends there: its stretch is
    /// completed with the first choice, and no stretch starts after it.
    fn next(&mut self, choices: &[Action]) -> Option<Action> {
        match self {
            Source::Walk(rng) => (!choices.is_empty()).then(|| rng.pick(choices)),
            Source::Leaning(rng) => {
                let waiting = choices.iter().any(|a| matches!(a, Action::TimesOut(_)));
                let silent = |a: &Action| match a {
                    Action::AnswerArrives(_) => false,
                    Action::ProviderActs { .. } => !waiting,
                    _ => true,
                };
                let leaning: Vec<Action> = choices.iter().copied().filter(silent).collect();
                let others: Vec<Action> =
                    leaning.iter().copied().filter(|a| !matches!(a, Action::Request(_))).collect();
                let pool = if !others.is_empty() {
                    others
                } else if !leaning.is_empty() {
                    leaning
                } else {
                    choices.to_vec()
                };
                (!pool.is_empty()).then(|| rng.pick(&pool))
            }
            Source::Given(path) => match path.front() {
                Some(action) if choices.contains(action) => path.pop_front(),
                _ => {
                    path.clear();
                    None
                }
            },
        }
    }
}

/// Whether the service settles a capture or void in flight, or ends an authorization, on a
/// charge event saying `status` (`webhooks::apply_charge`, on its own lookup), where the model
/// leaves it to the reconciler's claim or the authorization watch ([`settled_in_delivery`]).
fn settled_on_own_lookup(state: &State, status: ChargeStatus) -> bool {
    let Some(payment) = &state.payment else { return false };
    let action_in_flight = state.actions.iter().any(|a| a.status == OpStatus::Processing);
    let waits =
        !payment.charge_in_flight() && (action_in_flight || payment.status == PaymentStatus::RequiresCapture);
    waits && matches!(status, ChargeStatus::Succeeded | ChargeStatus::Voided | ChargeStatus::Expired)
}

/// The refund whose correction `webhook` reports (one we gave up on, carried out; a succeeded
/// one, reversed). The service applies it on the provider's confirmed word, its own lookup
/// inside the delivery (`webhooks::apply_refund`, `late_refund::correct`); the model coalesces
/// that lookup with the late-refund watch's (a webhook only brings the watch's look forward), so
/// the delivery stands for the model's `Deliver` and then the watch's look and act.
fn corrected_on_confirmed_word(state: &State, webhook: Webhook) -> Option<u8> {
    let Webhook::Refund(k, status) = webhook else { return None };
    let corrects = matches!(
        (state.refunds[k as usize].status, status),
        (OpStatus::Failed, ProviderRefundStatus::Succeeded)
            | (OpStatus::Succeeded, ProviderRefundStatus::Failed | ProviderRefundStatus::Reversed)
    );
    corrects.then_some(k)
}

/// Takes one stretch from a state where every driver is idle, or `None` when the source starts
/// none.
fn take_stretch(protocol: &Protocol, state: &mut State, source: &mut Source) -> Option<Stretch> {
    take_stretch_inside(protocol, state, source, false)
}

/// [`take_stretch`]; `inside`: the stretch steps in while another driver is held (it holds
/// none itself).
fn take_stretch_inside(
    protocol: &Protocol,
    state: &mut State,
    source: &mut Source,
    inside: bool,
) -> Option<Stretch> {
    let starts: Vec<Action> =
        enabled(protocol, state).into_iter().filter(|a| starts_stretch(state, *a)).collect();
    let start = source.next(&starts)?;
    if let Action::Deliver { index, again } = start {
        let webhook = state.provider.webhooks[index as usize];
        let steps = delivery_steps(protocol, state, start);
        let mut after = state.clone();
        for step in &steps {
            assert!(enabled(protocol, &after).contains(step), "{step:?} is not enabled after {steps:?}");
            after = protocol.apply(&after, *step);
        }
        let moves = Books { webhooks: Vec::new(), ..model_books(protocol, state) }
            != Books { webhooks: Vec::new(), ..model_books(protocol, &after) };
        // A dispute's event about a charge we do not know (yet) is another system's, to the
        // service: its lookup records nothing.
        let not_ours = steps.iter().any(|a| matches!(a, Action::RecordDispute(_)))
            && !state.payment.as_ref().is_some_and(|p| p.charge_known);
        let result = match (moves, not_ours) {
            (true, _) => "applied",
            (false, true) => "unknown",
            (false, false) => "stale",
        };
        *state = after;
        let driver = Driver::Deliver { webhook, again, result };
        return Some(Stretch {
            driver,
            steps,
            sends: Vec::new(),
            windows_pass: false,
            crash_at: None,
            interlude: None,
        });
    }
    let proc = stretch_proc(start);
    let driver = match start {
        Action::Request(i) | Action::Respond(i, _) => Driver::Client(i),
        Action::SendsGoQuiet(op) => Driver::Time(op),
        Action::LeaseRunsOut(op) => Driver::LeaseRunsOut(op),
        Action::KeyExpires(i) => Driver::KeyExpires(i),
        Action::ProviderActs { index, .. } => {
            Driver::Provider { target: state.provider.requests[index as usize].target, acts: true }
        }
        Action::ProviderDrops(index) => {
            Driver::Provider { target: state.provider.requests[index as usize].target, acts: false }
        }
        Action::ChargeSettles => Driver::ByHand { target: Target::Op(Op::Charge), what: "settle" },
        Action::RefundSettles(k) => {
            Driver::ByHand { target: Target::Op(Op::Refund(k)), what: "settle_refund" }
        }
        Action::AuthorizationExpires => Driver::ByHand { target: Target::Op(Op::Charge), what: "expire" },
        Action::RefundReversed(k) => Driver::ByHand { target: Target::Op(Op::Refund(k)), what: "reverse" },
        // What the operator asks for is its next step's (`OperatorLook`), set once taken.
        Action::OperatorLease => Driver::Operator { to: Resolution::Failed, force: false, applied: false },
        Action::OpenDispute(amount) => Driver::OpenDispute(amount),
        Action::DecideDispute { won } => Driver::DecideDispute { won },
        _ => Driver::Reconciler,
    };
    let windows_pass = match start {
        Action::LateChargeLook(_) => !state.could_land(Target::Op(Op::Charge)),
        Action::LateRefundLook(_, k) => !state.could_land(Target::Op(Op::Refund(k))),
        _ => false,
    };
    let mut steps = vec![start];
    *state = protocol.apply(state, start);
    let mut sends = Vec::new();
    let mut crash_at = None;
    let mut interlude: Option<Box<Interlude>> = None;
    // The held driver took a step after the stretches stepped in: no more may.
    let mut moved_since_held = false;
    // What the provider did with the send in flight: acted on it (before its answer arrives or
    // the sender stops waiting).
    let (mut acted, mut choice) = (false, Choice::Succeed);
    while let Some(proc) = proc.filter(|proc| !done(state, *proc)) {
        let choices: Vec<Action> =
            enabled(protocol, state).into_iter().filter(|a| of_stretch(state, proc, *a)).collect();
        assert!(!choices.is_empty(), "{proc:?} is stuck in the model at {:?}", state.pc(proc));
        // A given path may have other drivers step in here: its next step starts a stretch of
        // another driver, which is taken whole while this one is held at its point (once per
        // stretch, for as many stretches as follow each other there).
        let point = pause_point(state, proc)
            .filter(|point| interlude.as_ref().is_none_or(|held| held.point == *point && !moved_since_held));
        // A walk has another driver step in one time in four where it could: a stretch from
        // here, started as the walk picks and completed by its driver's first choices.
        let next = match source {
            Source::Given(given) => given.front().copied().filter(|next| !choices.contains(next)),
            Source::Walk(rng) | Source::Leaning(rng) if point.is_some() && !inside => {
                let starts: Vec<Action> = enabled(protocol, state)
                    .into_iter()
                    .filter(|a| starts_stretch(state, *a) && !choices.contains(a))
                    .collect();
                (rng.pick(&[1, 2, 3, 4]) == 1 && !starts.is_empty()).then(|| rng.pick(&starts))
            }
            _ => None,
        };
        if let (Some(next), Some(point), false) = (next, point, inside)
            && starts_stretch(state, next)
        {
            let given = match &*source {
                Source::Given(given) => given.clone(),
                _ => [next].into(),
            };
            let (mut trial, mut trial_source) = (state.clone(), Source::Given(given));
            if let Some(between) = take_stretch_inside(protocol, &mut trial, &mut trial_source, true)
                && may_step_in(state, &between.steps, proc)
            {
                *state = trial;
                if matches!(source, Source::Given(_)) {
                    *source = trial_source;
                }
                steps.extend(&between.steps);
                let held =
                    interlude.get_or_insert_with(|| Box::new(Interlude { point, stretches: Vec::new() }));
                held.stretches.push((between, state.clone()));
                continue;
            }
        }
        moved_since_held = interlude.is_some();
        let action = source.next(&choices).unwrap_or(choices[0]);
        match action {
            Action::Send(_) => (acted, choice) = (false, Choice::Succeed),
            Action::ProviderActs { choice: how, .. } => (acted, choice) = (true, how),
            Action::AnswerArrives(_) => sends.push(match choice {
                Choice::Succeed => Scripted::Now,
                Choice::Decline => Scripted::Decline,
                Choice::Pend => Scripted::Pend,
            }),
            Action::TimesOut(_) => sends.push(lost(acted, choice)),
            Action::Crash(proc) => {
                // A send still waiting is lost with its process: the provider acted on it or
                // not, as the model's provider did so far.
                if matches!(state.pc(proc), Pc::Drive { stage: orderpay_model::state::Stage::Waiting, .. }) {
                    sends.push(lost(acted, choice));
                }
                crash_at = crash_point(state, proc);
            }
            _ => {}
        }
        steps.push(action);
        *state = protocol.apply(state, action);
    }
    let driver = match (driver, steps.get(1)) {
        (Driver::Operator { .. }, Some(&Action::OperatorLook { to, force })) => {
            let applied = steps.contains(&Action::OperatorSettle) && !state.in_flight(Op::Charge);
            Driver::Operator { to, force, applied }
        }
        (driver, _) => driver,
    };
    Some(Stretch { driver, steps, sends, windows_pass, crash_at, interlude })
}

/// The script of a send whose answer its sender never read: parked when the provider had not
/// acted on it, else acted on (as it chose) with the answer held past the sender's timeout.
fn lost(acted: bool, choice: Choice) -> Scripted {
    match (acted, choice) {
        (false, _) => Scripted::Park,
        (true, Choice::Succeed) => Scripted::Hold,
        (true, Choice::Decline) => Scripted::DeclineAndHold,
        (true, Choice::Pend) => Scripted::PendAndHold,
    }
}

/// The steps a charge event's delivery stands for when the service settles a capture or void in
/// flight, or ends an authorization, on its own lookup inside it: the reconciler's claim of that
/// operation (or the authorization watch's look) and what follows it, when they settle it by
/// their lookup alone. When the lookup finds no outcome (the capture not carried out yet), the
/// service records nothing, as the model's delivery alone: no steps. The claim's check is not
/// the delivery's, but it is counted only while the operation is in flight, and here it settles.
fn settled_in_delivery(protocol: &Protocol, after_delivery: &State) -> Vec<Action> {
    let proc = Proc::Reconciler(0);
    let in_flight = after_delivery.actions.iter().position(|a| a.status == OpStatus::Processing);
    let start = in_flight.map_or(Action::AuthorizationLook(0), |k| Action::Claim(0, Op::Action(k as u8)));
    if !enabled(protocol, after_delivery).contains(&start) {
        return Vec::new();
    }
    let (mut steps, mut at) = (vec![start], protocol.apply(after_delivery, start));
    while !done(&at, proc) {
        let choices: Vec<Action> =
            enabled(protocol, &at).into_iter().filter(|a| of_stretch(&at, proc, *a)).collect();
        match choices[..] {
            [only] if !matches!(only, Action::Send(_) | Action::GiveUp(_)) => {
                steps.push(only);
                at = protocol.apply(&at, only);
            }
            _ => return Vec::new(),
        }
    }
    let settled = steps.iter().any(|a| matches!(a, Action::Settle(_) | Action::AuthorizationEnd(_)));
    if settled { steps } else { Vec::new() }
}

/// A delivery's steps in the model: the delivery, and when the service corrects a refund on its
/// own lookup inside it, the late-refund watch's look and act it stands for; a dispute's event
/// that differs from the dispute we hold is recorded as the service's lookup inside the
/// delivery saw it (`RecordDispute`, the model's second transaction).
fn delivery_steps(protocol: &Protocol, state: &State, start: Action) -> Vec<Action> {
    let Action::Deliver { index, .. } = start else { unreachable!("not a delivery: {start:?}") };
    let mut steps = vec![start];
    let webhook = state.provider.webhooks[index as usize];
    if let Some(k) = corrected_on_confirmed_word(state, webhook) {
        steps.extend([Action::LateRefundLook(0, k), Action::LateRefundAct(0)]);
    }
    if let Webhook::Charge(status, _) = webhook
        && settled_on_own_lookup(state, status)
    {
        steps.extend(settled_in_delivery(protocol, &protocol.apply(state, start)));
    }
    if matches!(webhook, Webhook::Dispute(_)) {
        let after = protocol.apply(state, start);
        let seen = after.provider.dispute;
        if let Some(lookup) = after.dispute_lookups.iter().position(|d| Some(*d) == seen) {
            steps.push(Action::RecordDispute(lookup as u8));
        }
    }
    steps
}

/// Whether `proc`'s stretch is over: it is idle again (the operator, who resolves once, is done).
fn done(state: &State, proc: Proc) -> bool {
    matches!(state.pc(proc), Pc::Idle | Pc::Finished)
}

/// Whose steps a stretch that starts with `start` runs until it is done: a client's, the
/// reconciler's, the operator's, or nobody's (time passing, the provider acting on its own: one
/// step).
fn stretch_proc(start: Action) -> Option<Proc> {
    match start {
        Action::Request(i) | Action::Respond(i, _) => Some(Proc::Client(i)),
        Action::OperatorLease => Some(Proc::Operator),
        Action::SendsGoQuiet(_)
        | Action::LeaseRunsOut(_)
        | Action::KeyExpires(_)
        | Action::ProviderActs { .. }
        | Action::ProviderDrops(_)
        | Action::ChargeSettles
        | Action::RefundSettles(_)
        | Action::AuthorizationExpires
        | Action::RefundReversed(_)
        | Action::OpenDispute(_)
        | Action::DecideDispute { .. } => None,
        _ => Some(Proc::Reconciler(0)),
    }
}

/// How many stretches a search lets step in, one after the other, where a driver is held.
const STEP_INS_AT_ONE_POINT: u8 = 2;

/// Every stretch the harness can take from `state` (every driver idle): each as its steps and
/// the state after them; with `step_ins`, also each with another driver's whole stretch taken
/// once while the driver is held between two statements.
fn every_stretch(protocol: &Protocol, state: &State, step_ins: bool) -> Vec<(Vec<Action>, State)> {
    let mut finished = Vec::new();
    for start in enabled(protocol, state).into_iter().filter(|a| starts_stretch(state, *a)) {
        let steps = match start {
            Action::Deliver { .. } => delivery_steps(protocol, state, start),
            _ => vec![start],
        };
        let after = steps.iter().fold(state.clone(), |at, step| protocol.apply(&at, *step));
        let Some(proc) = stretch_proc(start).filter(|_| !matches!(start, Action::Deliver { .. })) else {
            finished.push((steps, after));
            continue;
        };
        // Each of the driver's choices until it is done, depth first.
        // With the stretches stepped in so far, and whether the driver moved on since (more may
        // step in only at the point where the first did, up to `STEP_INS_AT_ONE_POINT`).
        let mut open = vec![(steps, after, 0, false)];
        while let Some((steps, at, stepped_in, moved)) = open.pop() {
            if done(&at, proc) {
                finished.push((steps, at));
                continue;
            }
            let may = stepped_in == 0 || (!moved && stepped_in < STEP_INS_AT_ONE_POINT);
            if step_ins && may && pause_point(&at, proc).is_some() {
                for (between, after) in every_stretch(protocol, &at, false) {
                    if may_step_in(&at, &between, proc) {
                        open.push(([steps.clone(), between].concat(), after, stepped_in + 1, false));
                    }
                }
            }
            for choice in enabled(protocol, &at).into_iter().filter(|a| of_stretch(&at, proc, *a)) {
                let mut longer = steps.clone();
                longer.push(choice);
                open.push((longer, protocol.apply(&at, choice), stepped_in, stepped_in > 0));
            }
        }
    }
    finished
}

/// The shortest path, in whole stretches as the harness drives them and at most `stretches`
/// of them, to a stretch whose steps `goal` accepts: the model's own search, restricted to what
/// the harness can drive, for steps random walks rarely reach.
fn shortest_drivable_path(
    protocol: &Protocol,
    goal: Goal,
    stretches: usize,
    step_ins: bool,
) -> Option<Vec<Action>> {
    let initial = protocol.initial();
    let mut seen = std::collections::HashSet::from([initial.clone()]);
    let mut level = vec![(initial, Vec::new())];
    for _ in 0..stretches {
        let mut next = Vec::new();
        for (state, path) in &level {
            for (steps, after) in every_stretch(protocol, state, step_ins) {
                let mut longer: Vec<Action> = path.clone();
                longer.extend(&steps);
                if goal(&steps, &after) {
                    return Some(longer);
                }
                if seen.insert(after.clone()) {
                    next.push((after, longer));
                }
            }
        }
        level = next;
    }
    None
}

/// The part of the state both sides have: our rows and the provider's ledger, as the model
/// spells them.
#[derive(Debug, PartialEq, Eq)]
struct Books {
    order: OrderStatus,
    payment: Option<PaymentRow>,
    refunds: Vec<RefundRow>,
    /// Captures and voids, in creation order.
    actions: Vec<ActionRow>,
    /// The merchant's answers to the dispute (`dispute_responses`), in creation order: whether
    /// an accept, and the row.
    responses: Vec<(bool, OpRow)>,
    /// Each intent's key: free, naming its operation, or holding a stored answer.
    keys: Vec<&'static str>,
    order_events: u8,
    payment_events: u8,
    refund_events: u8,
    /// The provider's charge: status, captured, refunded.
    charge: Option<(ChargeStatus, u8, u8)>,
    /// The provider's refund for each of ours: status, amount.
    provider_refunds: Vec<Option<(ProviderRefundStatus, u8)>>,
    /// The payment's dispute as our `disputes` row holds it, and as the provider has it.
    dispute: Option<Dispute>,
    provider_dispute: Option<Dispute>,
    /// The provider's events not yet delivered (a copy delivered leaves its event in flight),
    /// each as the object was when it happened, sorted.
    webhooks: Vec<Webhook>,
}

/// What a refund's and a capture's or void's row share, as the model holds it.
#[derive(Debug, PartialEq, Eq)]
struct OpRow {
    status: OpStatus,
    /// A refund's or a capture's amount; none for a void.
    amount: u8,
    answered: bool,
    leased: bool,
    /// Reconciler checks, while in flight (the model counts up to `max_attempts`).
    attempts: u8,
    send_recent: bool,
}

impl OpRow {
    fn of_model(status: OpStatus, amount: u8, row: &orderpay_model::state::Row, max: u8) -> OpRow {
        OpRow {
            status,
            amount,
            answered: row.answer.is_some(),
            leased: matches!(row.lease, orderpay_model::state::Lease::Held(_)),
            attempts: if status == OpStatus::Processing { row.attempts.min(max) } else { 0 },
            send_recent: row.send_recent,
        }
    }

    /// From a row selected with `status`, `amount`, `answered`, `leased`, `attempts`,
    /// `send_recent`.
    fn of_service(row: &Value, max: u8) -> OpRow {
        let status = op_status(row["status"].as_str().unwrap());
        let units = |name: &str| row[name].as_f64().map_or(0, |v| v.round() as u8);
        OpRow {
            status,
            amount: units("amount"),
            answered: row["answered"].as_bool().unwrap(),
            leased: row["leased"].as_bool().unwrap(),
            attempts: if status == OpStatus::Processing { units("attempts").min(max) } else { 0 },
            send_recent: row["send_recent"].as_bool().unwrap(),
        }
    }
}

/// A `payment_operations` row (a capture or a void) as the model holds it.
#[derive(Debug, PartialEq, Eq)]
struct ActionRow {
    void: bool,
    op: OpRow,
}

/// A refunds row as the model holds it.
#[derive(Debug, PartialEq, Eq)]
struct RefundRow {
    op: OpRow,
    /// Failed by a give-up, and still failed: the service's `failure_code` goes with a
    /// correction to succeeded, the model's `gave_up` is the refund's history.
    gave_up: bool,
    /// The system's (no key).
    system: bool,
    /// The late-refund watch of a failed refund: `off`, `watching` (`next_check_at` set), or
    /// `seen absent` (and `absent_since` set: a look found the provider never carried it out).
    watch: &'static str,
}

/// The payments row as the model holds it.
#[derive(Debug, PartialEq, Eq)]
struct PaymentRow {
    status: PaymentStatus,
    answered: bool,
    leased: bool,
    charge_known: bool,
    captured: u8,
    refunded: u8,
    refunding: u8,
    /// `amount_disputed`: withdrawn by its disputes and not reinstated.
    disputed: u8,
    /// Reconciler checks, while the charge is in flight.
    attempts: u8,
    /// `last_send_at` within the quiet period.
    send_recent: bool,
    /// The late-charge watch: off, watching, ended.
    late: String,
}

fn key_kind(key: Key) -> &'static str {
    match key {
        Key::Free => "free",
        Key::Names(_) => "names its operation",
        Key::Stored(_) => "stored answer",
    }
}

/// The model's state, as [`Books`].
fn model_books(protocol: &Protocol, state: &State) -> Books {
    let max = protocol.config.max_attempts;
    // A lease that ran out (`RanOut`) is one any driver may take: `lease_until` has passed.
    let leased = |lease: orderpay_model::state::Lease| matches!(lease, orderpay_model::state::Lease::Held(_));
    Books {
        order: state.order,
        payment: state.payment.as_ref().map(|p| {
            let attempts = if p.charge_in_flight() { p.row.attempts.min(max) } else { 0 };
            PaymentRow {
                status: p.status,
                answered: p.row.answer.is_some(),
                leased: leased(p.row.lease),
                charge_known: p.charge_known,
                captured: p.captured,
                refunded: p.refunded,
                refunding: p.refunding,
                disputed: p.disputed,
                attempts,
                send_recent: p.row.send_recent,
                late: match p.late {
                    LateCharge::Off => "off".to_owned(),
                    LateCharge::Watching => "watching".to_owned(),
                    LateCharge::Ended => "ended".to_owned(),
                    other => format!("{other:?}"),
                },
            }
        }),
        actions: state
            .actions
            .iter()
            .map(|a| {
                let void = a.kind == ActionKind::Void;
                ActionRow {
                    void,
                    op: OpRow::of_model(a.status, if void { 0 } else { a.amount }, &a.row, max),
                }
            })
            .collect(),
        refunds: state
            .refunds
            .iter()
            .map(|r| RefundRow {
                op: OpRow::of_model(r.status, r.amount, &r.row, max),
                gave_up: r.gave_up && r.status == OpStatus::Failed,
                system: r.system(),
                watch: match (r.status, r.watch) {
                    (OpStatus::Failed, RefundWatch::Watching) => "watching",
                    (OpStatus::Failed, RefundWatch::SeenAbsent) => "seen absent",
                    _ => "off",
                },
            })
            .collect(),
        responses: state
            .responses
            .iter()
            .map(|r| (r.kind == ResponseKind::Accept, OpRow::of_model(r.status, 0, &r.row, max)))
            .collect(),
        keys: state.keys.iter().map(|key| key_kind(*key)).collect(),
        order_events: state.order_events,
        payment_events: state.payment_events,
        refund_events: state.refunds.iter().map(|r| r.events).sum(),
        charge: state.provider.charge.map(|c| (c.status, c.captured, c.refunded)),
        provider_refunds: state
            .provider
            .refunds
            .iter()
            .map(|r| r.filter(|(status, _)| *status != ProviderRefundStatus::Refused))
            .collect(),
        dispute: state.dispute,
        provider_dispute: state.provider.dispute,
        webhooks: state.provider.webhooks.clone(),
    }
}

/// A charge as the mock spells it (`/_admin/charges`, an event's object): status, captured,
/// refunded.
fn charge_of(c: &Value) -> (ChargeStatus, u8, u8) {
    let status = match (c["status"].as_str().unwrap(), c["cancellation_reason"].as_str()) {
        ("pending", _) => ChargeStatus::Pending,
        ("succeeded", _) => ChargeStatus::Succeeded,
        ("requires_capture", _) => ChargeStatus::RequiresCapture,
        ("declined", _) => ChargeStatus::Declined,
        ("canceled", Some("authorization_expired")) => ChargeStatus::Expired,
        ("canceled", _) => ChargeStatus::Voided,
        (other, _) => panic!("a charge status the model does not have: {other}"),
    };
    (status, decimal_units(&c["amount_captured"]), decimal_units(&c["amount_refunded"]))
}

/// A refund as the mock spells it (`/_admin/refunds`, an event's object): status, amount.
fn refund_of(r: &Value) -> (ProviderRefundStatus, u8) {
    let status = match (r["status"].as_str().unwrap(), r["failure_code"].as_str()) {
        ("pending", _) => ProviderRefundStatus::Pending,
        ("succeeded", _) => ProviderRefundStatus::Succeeded,
        ("failed", Some("refund_reversed")) => ProviderRefundStatus::Reversed,
        ("failed", _) => ProviderRefundStatus::Failed,
        (other, _) => panic!("a refund status the model does not have: {other}"),
    };
    (status, decimal_units(&r["amount"]))
}

/// A dispute as the mock spells it (`/_admin/disputes`, an event's object) or our `disputes` row
/// (its amounts as text).
fn dispute_of(d: &Value) -> Dispute {
    let status = match d["status"].as_str().unwrap() {
        "needs_response" => DisputeStatus::NeedsResponse,
        "under_review" => DisputeStatus::UnderReview,
        "won" => DisputeStatus::Won,
        "lost" => DisputeStatus::Lost,
        other => panic!("a dispute status the model does not have: {other}"),
    };
    Dispute {
        status,
        accepted: d["closed_reason"] == "accepted",
        withdrawn: decimal_units(&d["amount_withdrawn"]),
        reinstated: decimal_units(&d["amount_reinstated"]),
    }
}

/// A refund's or a capture's or void's status.
fn op_status(status: &str) -> OpStatus {
    match status {
        "processing" => OpStatus::Processing,
        "succeeded" => OpStatus::Succeeded,
        "failed" => OpStatus::Failed,
        other => panic!("an operation status the model does not have: {other}"),
    }
}

/// Whole units of one of the mock's decimal strings (`"2.00"`).
fn decimal_units(value: &Value) -> u8 {
    value.as_str().unwrap().parse::<f64>().unwrap().round() as u8
}

/// The downstream keys of the path's refunds, in creation order (the model's refund indices).
async fn refund_keys(app: &TestApp, path: &Path) -> Vec<String> {
    let sql = format!(
        "SELECT coalesce(json_agg('orderpay_refund_' || id ORDER BY created_at, id), '[]')::text AS text \
         FROM refunds WHERE order_id = '{}'",
        path.order_id
    );
    serde_json::from_str(&app.text(&sql).await).unwrap()
}

/// The mock's events not yet delivered for good, as the model's webhooks: the object the event
/// carries, a refund named by our row's index. The model's webhook is one change's: the mock
/// tells some dispute changes in two events carrying the same dispute (`created` and
/// `funds_withdrawn`, `funds_reinstated` and `closed`), which are its one webhook here, their
/// ids in order.
async fn events_in_flight(app: &TestApp, path: &Path) -> Vec<(Vec<String>, Webhook)> {
    let keys = refund_keys(app, path).await;
    let events = app.provider.webhooks().await;
    let in_flight = events.iter().filter(|e| !path.delivered.contains(e["id"].as_str().unwrap()));
    let mut grouped: Vec<(Vec<String>, Webhook)> = Vec::new();
    for event in in_flight {
        let id = event["id"].as_str().unwrap().to_owned();
        let object = &event["object"];
        let webhook = match event["type"].as_str().unwrap() {
            kind if kind.starts_with("charge.dispute.") => Webhook::Dispute(dispute_of(object)),
            kind if kind.starts_with("charge.") => {
                let (status, captured, _) = charge_of(object);
                Webhook::Charge(status, captured)
            }
            kind if kind.starts_with("refund.") => {
                let k = keys.iter().position(|key| object["idempotency_key"] == key.as_str());
                Webhook::Refund(k.expect("a refund of ours") as u8, refund_of(object).0)
            }
            other => panic!("an event the model does not have: {other}"),
        };
        match grouped.last_mut() {
            Some((ids, last)) if matches!(webhook, Webhook::Dispute(_)) && *last == webhook => ids.push(id),
            _ => grouped.push((vec![id], webhook)),
        }
    }
    grouped
}

/// The service's rows and the mock's ledger, as [`Books`].
async fn service_books(app: &TestApp, protocol: &Protocol, path: &Path) -> Books {
    // The model counts checks up to the last one (`max_attempts`); the rows go on counting.
    let max = protocol.config.max_attempts;
    let rows = |sql: String| async move {
        let text =
            app.text(&format!("SELECT coalesce(json_agg(t), '[]')::text AS text FROM ({sql}) t")).await;
        serde_json::from_str::<Vec<Value>>(&text).unwrap()
    };
    let units = |value: &Value| value.as_f64().map_or(0, |v| v.round() as u8);
    let order = rows(format!("SELECT status FROM orders WHERE id = '{}'", path.order_id)).await;
    let order = match order[0]["status"].as_str().unwrap() {
        "pending_payment" => OrderStatus::PendingPayment,
        "authorized" => OrderStatus::Authorized,
        "paid" => OrderStatus::Paid,
        "partially_refunded" => OrderStatus::PartiallyRefunded,
        "refunded" => OrderStatus::Refunded,
        other => panic!("an order status the model does not have: {other}"),
    };
    let leased = "lease_until IS NOT NULL AND lease_until > now() AS leased, \
        last_send_at IS NOT NULL AND last_send_at > now() - interval '1 hour' AS send_recent";
    // A late charge's state follows from its system refunds, as the late-charge watch's
    // follow-up decides it (`late_charge::follow_up`): one succeeded, one in flight or given up
    // on and still watched, the attempt limit reached (a person decides), or another one due.
    // The model decides at the late-refund watch's act; the service at the follow-up's next pass.
    let system = "FROM refunds r WHERE r.payment_id = payments.id AND r.idempotency_key IS NULL";
    let payment = rows(format!(
        "SELECT status, answer_status IS NOT NULL AS answered, {leased}, provider_charge_id IS NOT NULL AS known, \
         amount_captured, amount_refunded, amount_refunding, amount_disputed, attempts, \
         CASE WHEN late_watch_until IS NULL THEN 'off' \
         WHEN late_charge_amount IS NOT NULL THEN CASE \
           WHEN EXISTS (SELECT 1 {system} AND r.status = 'succeeded') THEN 'Refunded' \
           WHEN EXISTS (SELECT 1 {system} AND (r.status = 'processing' OR (r.status = 'failed' \
             AND r.failure_code = 'reconciliation_gave_up' AND r.absent_since IS NULL \
             AND r.next_check_at IS NOT NULL))) THEN 'Refunding' \
           WHEN (SELECT count(*) {system}) >= {max} THEN 'Person' \
           ELSE 'RefundDue' END \
         WHEN next_check_at IS NULL THEN 'ended' ELSE 'watching' END AS late FROM payments WHERE order_id = '{}'",
        path.order_id
    ))
    .await;
    let payment = payment.first().map(|p| {
        let status = match p["status"].as_str().unwrap() {
            "processing" => PaymentStatus::Processing,
            "succeeded" => PaymentStatus::Succeeded,
            "requires_capture" => PaymentStatus::RequiresCapture,
            "failed" => PaymentStatus::Failed,
            "canceled" => PaymentStatus::Canceled,
            other => panic!("a payment status the model does not have: {other}"),
        };
        let attempts = if status == PaymentStatus::Processing && p["answered"] == false {
            units(&p["attempts"]).min(max)
        } else {
            0
        };
        let flag = |name: &str| p[name].as_bool().unwrap();
        let amount = |name: &str| units(&p[name]);
        PaymentRow {
            status,
            answered: flag("answered"),
            leased: flag("leased"),
            charge_known: flag("known"),
            captured: amount("amount_captured"),
            refunded: amount("amount_refunded"),
            refunding: amount("amount_refunding"),
            disputed: amount("amount_disputed"),
            attempts,
            send_recent: flag("send_recent"),
            late: p["late"].as_str().unwrap().to_owned(),
        }
    });
    let refund_rows = rows(format!(
        "SELECT id, status, amount, answer_status IS NOT NULL AS answered, {leased}, attempts, \
         failure_code IS NOT DISTINCT FROM 'reconciliation_gave_up' AS gave_up, idempotency_key IS NULL AS system, \
         CASE WHEN status <> 'failed' OR next_check_at IS NULL THEN 'off' \
         WHEN absent_since IS NULL THEN 'watching' ELSE 'seen absent' END AS watch \
         FROM refunds WHERE order_id = '{}' ORDER BY created_at, id",
        path.order_id
    ))
    .await;
    let refunds = refund_rows
        .iter()
        .map(|r| RefundRow {
            op: OpRow::of_service(r, max),
            gave_up: r["gave_up"].as_bool().unwrap(),
            system: r["system"].as_bool().unwrap(),
            watch: match r["watch"].as_str().unwrap() {
                "watching" => "watching",
                "seen absent" => "seen absent",
                _ => "off",
            },
        })
        .collect();
    let action_rows = rows(format!(
        "SELECT kind, status, amount, answer_status IS NOT NULL AS answered, {leased}, attempts \
         FROM payment_operations WHERE payment_id = (SELECT id FROM payments WHERE order_id = '{}') \
         ORDER BY created_at, id",
        path.order_id
    ))
    .await;
    let actions = action_rows
        .iter()
        .map(|a| ActionRow { void: a["kind"] == "void", op: OpRow::of_service(a, max) })
        .collect();
    let response_rows = rows(format!(
        "SELECT r.kind, r.status, r.answer_status IS NOT NULL AS answered, {leased}, r.attempts \
         FROM dispute_responses r JOIN disputes d ON d.id = r.dispute_id WHERE d.order_id = '{}' \
         ORDER BY r.created_at, r.id",
        path.order_id
    ))
    .await;
    let responses =
        response_rows.iter().map(|r| (r["kind"] == "accept", OpRow::of_service(r, max))).collect();
    let mut keys = Vec::new();
    for key in &path.keys {
        // A key past its retention counts as new, swept or not (`expire_key.sql`).
        let found = rows(format!(
            "SELECT response_status FROM idempotency_keys WHERE key = '{key}' AND expires_at > now()"
        ))
        .await;
        keys.push(match found.first() {
            None => "free",
            Some(row) if row["response_status"].is_null() => "names its operation",
            Some(_) => "stored answer",
        });
    }
    let events = rows("SELECT type FROM events".to_owned()).await;
    let count = |prefix: &str| {
        let all = events.iter().filter(|e| e["type"].as_str().unwrap().starts_with(prefix)).count();
        let before = path.events_before.iter().filter(|t| t.starts_with(prefix)).count();
        (all - before) as u8
    };
    let disputes = rows(format!(
        "SELECT status, closed_reason, amount_withdrawn::text AS amount_withdrawn, \
         amount_reinstated::text AS amount_reinstated FROM disputes WHERE order_id = '{}'",
        path.order_id
    ))
    .await;
    let charges = app.provider.charges().await;
    let charge = charges.first().map(charge_of);
    let at_provider = app.provider.refunds().await;
    let provider_refunds = refund_rows
        .iter()
        .map(|ours| {
            let key = format!("orderpay_refund_{}", ours["id"].as_str().unwrap());
            at_provider.iter().find(|r| r["idempotency_key"] == key.as_str()).map(refund_of)
        })
        .collect();
    Books {
        order,
        payment,
        refunds,
        actions,
        responses,
        keys,
        order_events: count("order."),
        payment_events: count("payment."),
        refund_events: count("refund."),
        charge,
        provider_refunds,
        dispute: disputes.first().map(dispute_of),
        provider_dispute: app.provider.disputes().await.first().map(dispute_of),
        webhooks: {
            let mut webhooks: Vec<Webhook> =
                events_in_flight(app, path).await.into_iter().map(|(_, webhook)| webhook).collect();
            webhooks.sort();
            webhooks
        },
    }
}

/// One path's fixtures in the service: its order, its keys, the events written before it, and
/// the mock's events delivered for good (a copy's delivery leaves its event in flight, as in
/// the model).
#[derive(Clone)]
struct Path {
    order_id: String,
    keys: Vec<String>,
    events_before: Vec<String>,
    delivered: std::collections::HashSet<String>,
    /// What each dispute response's key was first sent as.
    responses: std::collections::HashMap<u8, ResponseKind>,
}

async fn writes(app: &TestApp) -> u64 {
    let response = app.client.get(format!("{}/_admin/requests", app.provider.address)).send().await.unwrap();
    json(response).await["writes"].as_u64().unwrap()
}

/// The table and the `WHERE` condition of `op`'s row.
fn row_of(path: &Path, op: Op) -> (&'static str, String) {
    match op {
        Op::Charge => ("payments", format!("order_id = '{}'", path.order_id)),
        Op::Refund(k) => (
            "refunds",
            format!(
                "id = (SELECT id FROM refunds WHERE order_id = '{}' ORDER BY created_at, id OFFSET {k} LIMIT 1)",
                path.order_id
            ),
        ),
        Op::Action(k) => (
            "payment_operations",
            format!(
                "id = (SELECT id FROM payment_operations WHERE payment_id = (SELECT id FROM payments \
                 WHERE order_id = '{}') ORDER BY created_at, id OFFSET {k} LIMIT 1)",
                path.order_id
            ),
        ),
        Op::Response(k) => (
            "dispute_responses",
            format!(
                "id = (SELECT r.id FROM dispute_responses r JOIN disputes d ON d.id = r.dispute_id \
                 WHERE d.order_id = '{}' ORDER BY r.created_at, r.id OFFSET {k} LIMIT 1)",
                path.order_id
            ),
        ),
    }
}

/// The idempotency key the service sends `target`'s write to the provider under.
async fn downstream_key(app: &TestApp, path: &Path, target: Target) -> String {
    let id = |table: &str, offset: usize| {
        let sql = format!(
            "SELECT id::text AS text FROM {table} WHERE order_id = '{}' ORDER BY created_at, id OFFSET {offset} LIMIT 1",
            path.order_id
        );
        async move { app.text(&sql).await }
    };
    match target {
        Target::Op(Op::Charge) => format!("orderpay_pay_{}", id("payments", 0).await),
        Target::Op(Op::Refund(k)) => format!("orderpay_refund_{}", id("refunds", k.into()).await),
        Target::LateVoid => format!("orderpay_late_void_{}", id("payments", 0).await),
        Target::Op(op @ Op::Action(_)) => {
            let (table, row) = row_of(path, op);
            let sql = format!("SELECT 'orderpay_' || kind || '_' || id AS text FROM {table} WHERE {row}");
            app.text(&sql).await
        }
        Target::Op(op @ Op::Response(_)) => {
            let (table, row) = row_of(path, op);
            let sql =
                format!("SELECT 'orderpay_dispute_' || kind || '_' || id AS text FROM {table} WHERE {row}");
            app.text(&sql).await
        }
    }
}

/// Sends a client's request to `orderpay serve` in a subprocess on the app's database and mock,
/// with the app's settings, that aborts at `point` (`ORDERPAY_TEST_CRASH_AT`, as a SIGKILL
/// there would stop it): the model's `Crash` of that client. `Err` when the request is
/// answered, or the process lives on: the service never reached the point the model died at.
async fn crash_at(app: &TestApp, point: &str, route: &str, key: &str, body: &Value) -> Result<(), String> {
    let settings = app.engine_env();
    let mut env: Vec<(&str, &str)> = settings.iter().map(|(name, value)| (*name, value.as_str())).collect();
    env.push(("ORDERPAY_TEST_CRASH_AT", point));
    let mut service = ServiceProcess::start(&app.database_url, &app.provider.address, &env).await;
    let sent = app
        .client
        .post(format!("{}{route}", service.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await;
    if let Ok(answer) = sent {
        return Err(format!("the request answered {} before reaching {point}", answer.status()));
    }
    match service.wait_exit(Duration::from_secs(10)).await {
        Some(_) => Ok(()),
        None => Err(format!("the service lives on: it never reached {point}")),
    }
}

/// Stretches driven while another driver was held, in this test's process (nextest runs each
/// test in its own).
static STEPPED_IN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Drives `stretch` through the service: the provider's script, then the request or the pass,
/// with the stretch that steps in while it is held, if any. `Err`: the service cannot take the
/// step as the model took it.
async fn drive(app: &TestApp, protocol: &Protocol, path: &mut Path, stretch: &Stretch) -> Result<(), String> {
    app.provider.script(Value::Array(stretch.sends.iter().map(|send| send.json()).collect())).await;
    let Some(interlude) = &stretch.interlude else { return run(app, protocol, path, stretch).await };
    let mut held = orderpay::hooks::pause(interlude.point);
    let mut own = path.clone();
    let running = run(app, protocol, &mut own, stretch);
    let stepping_in = async {
        if tokio::time::timeout(Duration::from_secs(10), held.reached()).await.is_err() {
            return Err(format!("the driver never reached {}", interlude.point));
        }
        for (between, after) in &interlude.stretches {
            run(app, protocol, path, between).await?;
            STEPPED_IN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if interlude.at_the_mock() {
                continue;
            }
            let (service, model) = (service_books(app, protocol, path).await, model_books(protocol, after));
            if service != model {
                return Err(format!(
                    "the service ({service:?}) and the model ({model:?}) part after {:?} stepped in at {}",
                    between.steps, interlude.point
                ));
            }
        }
        held.release();
        Ok(())
    };
    let (ran, stepped_in) = tokio::join!(running, stepping_in);
    path.responses.extend(own.responses);
    stepped_in.and(ran)
}

/// Drives one driver's part of `stretch`, its script already posted.
async fn run(app: &TestApp, protocol: &Protocol, path: &mut Path, stretch: &Stretch) -> Result<(), String> {
    match stretch.driver {
        Driver::Client(i) => {
            let key = &path.keys[i as usize];
            let capture_method = if protocol.config.manual() { "manual" } else { "automatic" };
            let payment_id = || async {
                app.text(&format!(
                    "SELECT id::text AS text FROM payments WHERE order_id = '{}'",
                    path.order_id
                ))
                .await
            };
            let (route, body) = match protocol.config.intents[i as usize] {
                Intent::Pay => (
                    "/payments".to_owned(),
                    json!({"order_id": path.order_id, "payment_method": "pm_card_ok", "capture_method": capture_method}),
                ),
                Intent::Refund(amount) => (
                    "/refunds".to_owned(),
                    json!({"payment_id": payment_id().await, "amount": format!("{amount}.00")}),
                ),
                Intent::Capture(amount) => (
                    format!("/payments/{}/capture", payment_id().await),
                    json!({"amount": format!("{amount}.00")}),
                ),
                Intent::Void => (format!("/payments/{}/void", payment_id().await), json!({})),
                Intent::Respond => {
                    // A retry repeats its key's first request (the model's retry after a stored
                    // refusal names evidence, which stands for the same request).
                    let Action::Respond(_, kind) = stretch.steps[0] else { unreachable!() };
                    let kind = *path.responses.entry(i).or_insert(kind);
                    let dispute = app
                        .text(&format!(
                            "SELECT id::text AS text FROM disputes WHERE order_id = '{}'",
                            path.order_id
                        ))
                        .await;
                    match kind {
                        ResponseKind::Evidence => {
                            (format!("/disputes/{dispute}/evidence"), json!({"evidence": "conformance"}))
                        }
                        ResponseKind::Accept => (format!("/disputes/{dispute}/accept"), json!({})),
                    }
                }
            };
            match stretch.crash_at {
                None => {
                    let sent =
                        app.request(Method::POST, &route).header("Idempotency-Key", key).json(&body).send();
                    sent.await.expect("the request is answered");
                }
                Some(point) => crash_at(app, point, &route, key, &body).await?,
            }
        }
        Driver::Reconciler => {
            // Time passes until the operation (or the watch) the stretch is about is due, as
            // the model's step assumes; nothing else is due (rechecks are an hour away).
            let (op, window) = match stretch.steps[0] {
                Action::Claim(_, op) => (Some(op), false),
                Action::LateChargeLook(_) => (Some(Op::Charge), stretch.windows_pass),
                Action::LateRefundLook(_, k) => (Some(Op::Refund(k)), stretch.windows_pass),
                // The authorization watch looks at a `requires_capture` payment whose
                // `next_check_at` has come (watch_authorizations.sql).
                Action::AuthorizationLook(_) => (Some(Op::Charge), false),
                // The dispute pass: its listing is due, no row is.
                Action::DisputeList(_) => (None, false),
                // The late-charge watch's follow-up starts another system refund once the
                // backoff since the last one has passed (`late_charge::follow_up`): an hour in
                // these apps, counted from that refund's `updated_at`.
                Action::StartSystemRefund(_) => {
                    app.execute(&format!(
                        "UPDATE refunds SET updated_at = updated_at - interval '2 hours' \
                         WHERE order_id = '{}' AND idempotency_key IS NULL",
                        path.order_id
                    ))
                    .await;
                    (Some(Op::Charge), false)
                }
                other => panic!("a reconciler stretch does not start with {other:?}"),
            };
            // The dispute pass lists the provider's disputes once a minute over every
            // instance (`dispute_listing`): in the stretch that is the model's `DisputeList`,
            // and in no other.
            let listing = if op.is_none() { "NULL" } else { "now()" };
            app.execute(&format!("UPDATE dispute_listing SET listed_at = {listing}")).await;
            // A webhook may have brought a watch's look forward (`watch_late_now`, `look_again`),
            // which the model takes as a look already possible, not as one that must come in
            // this pass: every other row of the path waits.
            for table in ["payments", "refunds"] {
                app.execute(&format!(
                    "UPDATE {table} SET next_check_at = now() + interval '1 hour' \
                     WHERE order_id = '{}' AND next_check_at <= now()",
                    path.order_id
                ))
                .await;
            }
            if let Some(op) = op {
                let (table, row) = row_of(path, op);
                app.execute(&format!(
                    "UPDATE {table} SET next_check_at = now() - interval '1 second' WHERE {row}"
                ))
                .await;
            }
            if let (Some(op), true) = (op, window) {
                let (table, row) = row_of(path, op);
                // The model's watch ends on a look once nothing can land any more: its window
                // has passed.
                app.execute(&format!(
                    "UPDATE {table} SET late_watch_until = now() - interval '1 second' WHERE {row}"
                ))
                .await;
            }
            match stretch.crash_at {
                None => drop(app.reconcile_once().await),
                Some(point) => {
                    let pass =
                        app.cli_with(&["reconcile", "--once"], &[("ORDERPAY_TEST_CRASH_AT", point)]).await;
                    if pass.status.success() {
                        return Err(format!("the reconciler's pass ended without reaching {point}"));
                    }
                }
            }
        }
        Driver::Provider { target, acts } => {
            let key = downstream_key(app, path, target).await;
            let what = if acts { "act" } else { "drop" };
            let url = format!("{}/_admin/parked/{key}/{what}", app.provider.address);
            let answer = json(app.client.post(url).send().await.unwrap()).await;
            if answer[what] != 1 {
                return Err(format!("no write parked under {key} for the provider to {what}"));
            }
        }
        Driver::Deliver { webhook, again, result: expected } => {
            let events = events_in_flight(app, path).await;
            let Some((ids, _)) = events.into_iter().find(|(_, event)| *event == webhook) else {
                return Err(format!("no event {webhook:?} in flight at the mock"));
            };
            for (nth, id) in ids.iter().enumerate() {
                // A copy comes after the sweep took the first delivery's row (the model's
                // `again`); a first delivery finds no row to take.
                app.execute(&format!("DELETE FROM provider_webhooks WHERE id = '{id}'")).await;
                let url = format!("{}/_admin/webhooks/{id}/deliver", app.provider.address);
                let answer = json(app.client.post(url).send().await.unwrap()).await;
                if answer["status"] != 200 {
                    return Err(format!("the service answered {} to the event {id}", answer["status"]));
                }
                if !again {
                    path.delivered.insert(id.clone());
                }
                // What the delivery did, as its row notes it: applied exactly when the model's
                // step moved our books. The second event of one change finds it recorded.
                let expected = if nth > 0 && expected == "applied" { "stale" } else { expected };
                let result = app
                    .text(&format!("SELECT result AS text FROM provider_webhooks WHERE id = '{id}'"))
                    .await;
                if result != expected {
                    return Err(format!("the event {id} was {result}, the model's delivery {expected}"));
                }
            }
        }
        Driver::OpenDispute(amount) => {
            let charge = app.provider.charges().await[0]["id"].as_str().unwrap().to_owned();
            let body = json!({"charge": charge, "reason": "fraudulent", "amount": format!("{amount}.00")});
            let url = format!("{}/_admin/disputes", app.provider.address);
            let status = app.client.post(url).json(&body).send().await.unwrap().status();
            if status != 201 {
                return Err(format!("the mock answered {status} to a dispute of {amount} units"));
            }
        }
        Driver::DecideDispute { won } => {
            let id = app.provider.disputes().await[0]["id"].as_str().unwrap().to_owned();
            let outcome = json!({"outcome": if won { "won" } else { "lost" }});
            let url = format!("{}/_admin/disputes/{id}/decide", app.provider.address);
            let status = app.client.post(url).json(&outcome).send().await.unwrap().status();
            if status != 200 {
                return Err(format!("the mock answered {status} to deciding the dispute {id}"));
            }
        }
        Driver::Operator { to, force, applied } => {
            use orderpay::operations::operator::{Resolve, Target as As, resolve};
            let payment_id = app
                .text(&format!("SELECT id::text AS text FROM payments WHERE order_id = '{}'", path.order_id))
                .await;
            let request = Resolve {
                payment_id: orderpay::ids::PaymentId::parse(&payment_id).expect("a payment id"),
                to: if to == Resolution::Failed { As::Failed } else { As::Succeeded },
                reason: "conformance".to_owned(),
                force,
            };
            let engine = app.engine_with(orderpay::app::provider(&app.settings.provider).unwrap());
            let resolved = resolve(&engine, &app.settings.reconciler, &request).await;
            if resolved.is_ok() != applied {
                return Err(format!("the resolution answered {resolved:?}, the model's applied: {applied}"));
            }
        }
        Driver::ByHand { target, what } => {
            let key = downstream_key(app, path, target).await;
            let url = format!("{}/_admin/due/{key}/{what}", app.provider.address);
            if json(app.client.post(url).send().await.unwrap()).await["changed"] != 1 {
                return Err(format!("nothing under {key} for the provider to {what}"));
            }
        }
        Driver::Time(op) => {
            let (table, row) = row_of(path, op);
            // Past the quiet period (an hour in these apps), as the model's step says.
            let sql =
                format!("UPDATE {table} SET last_send_at = last_send_at - interval '2 hours' WHERE {row}");
            app.execute(&sql).await;
        }
        Driver::LeaseRunsOut(op) => {
            let (table, row) = row_of(path, op);
            app.execute(&format!("UPDATE {table} SET lease_until = now() - interval '1 second' WHERE {row}"))
                .await;
        }
        Driver::KeyExpires(i) => {
            let key = &path.keys[i as usize];
            app.execute(&format!(
                "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = '{key}'"
            ))
            .await;
        }
    }
    Ok(())
}

/// Drives the path `source` gives in `protocol`'s configuration, checking it after every
/// stretch (`name` says which path, in a disagreement's message); returns the steps checked.
async fn check_path(protocol: &Protocol, mut source: Source, name: &str) -> Vec<Action> {
    let (max_attempts, webhooks) = (protocol.config.max_attempts, protocol.config.webhooks);
    let app = spawn_app_with(|settings, mock| {
        if webhooks {
            // The mock's events leave only when the path delivers them.
            provider_webhooks_on(settings);
            mock.webhooks_by_hand = true;
        }
        // A key expires when the path says so (`KeyExpires` moves `expires_at` in the database),
        // so no in-memory replay outlives it.
        settings.api.replay_cache_bytes = 0;
        // A send goes quiet only when the path says so (`SendsGoQuiet` moves `last_send_at`).
        settings.reconciler.quiet_before_give_up = Duration::from_secs(3600);
        settings.reconciler.max_attempts = max_attempts.into();
        settings.timing.lease = Duration::from_secs(60);
        // Nothing comes due by itself: a stretch moves the one row it is about.
        settings.timing.recheck_after = Duration::from_secs(3600);
        (settings.reconciler.backoff_base, settings.reconciler.backoff_cap) =
            (Duration::from_secs(3600), Duration::from_secs(3600));
        // A watch ends only when a stretch says its window has passed (the model's watch ends
        // once nothing can land), never because its next look, an hour on, falls past it.
        settings.reconciler.late_charge_watch = Duration::from_secs(86_400);
        settings.reconciler.late_refund_watch = Duration::from_secs(86_400);
        // A held answer outlasts the provider timeout (1 s); a parked write answers after it too.
        mock.timeout_hold = Duration::from_millis(1500);
    })
    .await;
    let total = format!("{}.00", protocol.config.total);
    let body = json!({"currency": "USD", "items": [{"sku": "s", "quantity": 1, "unit_price": total}]});
    let order = json(app.post_order(&body, None).await).await;
    let events = app.text("SELECT coalesce(json_agg(type), '[]')::text AS text FROM events").await;
    let mut path = Path {
        order_id: order["id"].as_str().unwrap().to_owned(),
        keys: protocol.config.intents.iter().map(|_| new_key()).collect(),
        events_before: serde_json::from_str(&events).unwrap(),
        delivered: Default::default(),
        responses: Default::default(),
    };
    let mut state = protocol.initial();
    let mut lines = Vec::new();
    let mut steps = Vec::new();
    // A walk stops after [`STRETCHES`]; a given path runs to its end.
    let stretches = if matches!(source, Source::Given(_)) { usize::MAX } else { STRETCHES };
    for _ in 0..stretches {
        let Some(stretch) = take_stretch(protocol, &mut state, &mut source) else { break };
        let before = writes(&app).await;
        let driven = drive(&app, protocol, &mut path, &stretch).await;
        let held = stretch.interlude.as_ref().map_or(String::new(), |held| {
            let drivers: Vec<_> = held.stretches.iter().map(|(between, _)| between.driver).collect();
            format!(", held at {} for {drivers:?}", held.point)
        });
        lines
            .push(format!("{:?}: {:?} (provider: {:?}{held})", stretch.driver, stretch.steps, stretch.sends));
        let trace = lines.join("\n");
        if let Err(refused) = driven {
            panic!("{refused}, {name}, at the last of\n{trace}");
        }
        let sent = writes(&app).await - before;
        assert_eq!(sent as usize, stretch.sends.len(), "sends to the provider, {name}, after\n{trace}");
        assert_eq!(
            service_books(&app, protocol, &path).await,
            model_books(protocol, &state),
            "the service (left) and the model (right) part, {name}, after\n{trace}"
        );
        steps.extend(stretch.steps);
    }
    steps
}

/// A kind of step worth counting, and how to tell it.
type StepKind = (&'static str, fn(&Action) -> bool);

/// How many of `steps` are of each kind worth counting (the paths' reach).
fn reach(steps: &[Action]) -> String {
    let kinds: [StepKind; 30] = [
        ("requests", |a| matches!(a, Action::Request(_))),
        ("claims", |a| matches!(a, Action::Claim(..))),
        ("settles", |a| matches!(a, Action::Settle(_))),
        ("releases", |a| matches!(a, Action::Release(_))),
        ("sends gone quiet", |a| matches!(a, Action::SendsGoQuiet(_))),
        ("keys expired", |a| matches!(a, Action::KeyExpires(_))),
        ("give-ups", |a| matches!(a, Action::GiveUp(_))),
        ("late-charge looks", |a| matches!(a, Action::LateChargeLook(_))),
        ("late-charge acts", |a| matches!(a, Action::LateChargeAct(_))),
        ("late-refund looks", |a| matches!(a, Action::LateRefundLook(..))),
        ("late-refund acts", |a| matches!(a, Action::LateRefundAct(_))),
        ("system refunds started again", |a| matches!(a, Action::StartSystemRefund(_))),
        ("authorizations ended by the watch", |a| matches!(a, Action::AuthorizationEnd(_))),
        ("provider acts or drops", |a| matches!(a, Action::ProviderActs { .. } | Action::ProviderDrops(_))),
        ("declines", |a| matches!(a, Action::ProviderActs { choice: Choice::Decline, .. })),
        ("webhooks delivered", |a| matches!(a, Action::Deliver { again: false, .. })),
        ("copies delivered", |a| matches!(a, Action::Deliver { again: true, .. })),
        ("operator resolutions", |a| matches!(a, Action::OperatorLook { .. })),
        ("operator take-backs", |a| matches!(a, Action::OperatorTakeBack)),
        ("pending answers", |a| matches!(a, Action::ProviderActs { choice: Choice::Pend, .. })),
        ("settled at the provider", |a| matches!(a, Action::ChargeSettles | Action::RefundSettles(_))),
        ("authorizations expired", |a| matches!(a, Action::AuthorizationExpires)),
        ("refunds reversed", |a| matches!(a, Action::RefundReversed(_))),
        ("disputes opened", |a| matches!(a, Action::OpenDispute(_))),
        ("disputes decided", |a| matches!(a, Action::DecideDispute { .. })),
        ("disputes recorded from a webhook's lookup", |a| matches!(a, Action::RecordDispute(_))),
        ("disputes recorded by the pass", |a| matches!(a, Action::DisputeRecord(_))),
        ("answers to a dispute", |a| matches!(a, Action::Respond(..))),
        ("processes killed", |a| matches!(a, Action::Crash(_))),
        ("leases run out", |a| matches!(a, Action::LeaseRunsOut(_))),
    ];
    let counts: Vec<String> =
        kinds.iter().map(|(name, is)| format!("{} {name}", steps.iter().filter(|a| is(a)).count())).collect();
    counts.join(", ")
}

#[tokio::test]
async fn the_service_follows_the_models_paths() {
    let started = Instant::now();
    let setting = |name: &str| std::env::var(name).ok().and_then(|n| n.parse::<u64>().ok());
    let paths = setting("CONFORMANCE_PATHS").unwrap_or(PATHS);
    let cap = setting("CONFORMANCE_SECONDS").map_or(WALL_CLOCK_CAP, Duration::from_secs);
    let (mut run, mut steps, mut actions) = (0, Vec::new(), 0);
    // `CONFORMANCE_FIRST`: the first seed (to drive again a path a longer run failed on).
    let first = setting("CONFORMANCE_FIRST").unwrap_or(1);
    for seed in first..first + paths {
        if started.elapsed() > cap {
            break;
        }
        // Odd seeds give up at the first check, even ones re-send first; every third path leans
        // towards the provider's silence (give-ups, late charges); every fourth authorizes, and
        // captures or voids.
        // The leaning ones have an operator, who may resolve the payment once while its charge
        // is in flight (leaning paths leave charges in flight); every fifth has a dispute, and
        // seeds 2 and 7 a request's process that may die.
        let max_attempts = if seed % 2 == 1 { 1 } else { 2 };
        let protocol = Protocol::new(match (seed % 4 == 0, seed % 3 == 0) {
            (true, false) => manual_config(max_attempts),
            (true, true) => manual_operator_config(max_attempts),
            (false, false) if seed % 5 == 0 => dispute_config(max_attempts),
            (false, false) if seed % 5 == 2 => crash_config(max_attempts),
            (false, false) => config(max_attempts),
            (false, true) => operator_config(max_attempts),
        });
        let source = if seed % 3 == 0 { Source::Leaning(Rng(seed)) } else { Source::Walk(Rng(seed)) };
        let path = check_path(&protocol, source, &format!("seed {seed}")).await;
        let intents = &protocol.config.intents;
        actions += path
            .iter()
            .filter(|a| {
                matches!(a, Action::Request(i) if matches!(intents[*i as usize], Intent::Capture(_) | Intent::Void))
            })
            .count();
        steps.extend(path);
        run += 1;
    }
    println!(
        "conformance: {run} random paths, {} model steps checked ({}; {actions} of the requests captures or voids; {} stretches stepped in while another driver was held), {:.1} s",
        steps.len(),
        reach(&steps),
        STEPPED_IN.load(std::sync::atomic::Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    assert!(run > 0 && !steps.is_empty(), "no path was driven");
}

/// Each mutant's shortest counterexample, with the mutation switched off (the correct model
/// replays it as far as its guards allow), driven as far as the harness drives steps: the
/// stretches up to the first step it cannot drive, that stretch completed in the model.
#[tokio::test]
async fn the_service_follows_every_mutants_counterexample_with_the_mutation_off() {
    let started = Instant::now();
    let mut report = Vec::new();
    for mutation in Mutation::ALL {
        let killed = orderpay_model::check::kill(mutation).expect("every mutant is killed");
        // The service's limit on a late charge's system refunds is its attempt limit: the
        // replay's model allows as many, so that both decide the same at the follow-up.
        let own = Config::for_mutation(mutation);
        let protocol = Protocol::new(Config { mutation: None, system_refunds: own.max_attempts, ..own });
        let replayed: Vec<Action> =
            orderpay_model::trace::replay(&protocol, &killed.actions).into_iter().map(|r| r.action).collect();
        let steps =
            check_path(&protocol, Source::Given(replayed.iter().copied().collect()), mutation.name()).await;
        // The first replayed step the harness did not drive as the replay took it.
        let stop = replayed
            .iter()
            .zip(steps.iter().map(Some).chain(std::iter::repeat(None)))
            .position(|(r, s)| s != Some(r));
        let stop = stop
            .map_or("driven whole".to_owned(), |at| format!("stops at step {} {:?}", at + 1, replayed[at]));
        report.push(format!(
            "{}: {} of {} steps replayed, {} checked, {stop} ({})",
            mutation.name(),
            replayed.len(),
            killed.actions.len(),
            steps.len(),
            reach(&steps)
        ));
    }
    println!(
        "conformance, counterexamples ({:.1} s):\n{}",
        started.elapsed().as_secs_f64(),
        report.join("\n")
    );
}

/// A stretch worth reaching: its steps and the state after them.
type Goal = fn(&[Action], &State) -> bool;

/// For each attempt setting, the shortest drivable path to each of `goals` in the configuration
/// `config` makes, driven whole and checked; prints one line per path under `title`.
async fn follow_shortest_paths(
    title: &str,
    config: fn(u8) -> Config,
    goals: &[(&str, Goal)],
    stretches: usize,
) {
    follow_shortest_paths_stepping_in(title, config, goals, stretches, false).await
}

/// [`follow_shortest_paths`]; `step_ins`: a path may have another driver step in while one is
/// held between two statements.
async fn follow_shortest_paths_stepping_in(
    title: &str,
    config: fn(u8) -> Config,
    goals: &[(&str, Goal)],
    stretches: usize,
    step_ins: bool,
) {
    let started = Instant::now();
    let mut report = Vec::new();
    for max_attempts in [1, 2] {
        let protocol = Protocol::new(config(max_attempts));
        for (what, goal) in goals {
            let name = format!("{title} {what}, max_attempts {max_attempts}");
            let path = shortest_drivable_path(&protocol, *goal, stretches, step_ins)
                .unwrap_or_else(|| panic!("no drivable path: {name}"));
            let steps = check_path(&protocol, Source::Given(path.iter().copied().collect()), &name).await;
            assert_eq!(steps, path, "the whole path is driven: {name}");
            report.push(format!("{name}: {} steps ({})", steps.len(), reach(&steps)));
        }
    }
    println!("conformance, {title} ({:.1} s):\n{}", started.elapsed().as_secs_f64(), report.join("\n"));
}

/// The authorization watch, which random walks rarely reach (an authorization whose capture or
/// void was given up on, then carried out by the provider): for each attempt setting, the
/// shortest drivable path to a stretch in which the watch records a capture, and one in which it
/// records a void, driven and checked.
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_the_authorization_watch() {
    fn ended_as(steps: &[Action], after: &State, status: ChargeStatus) -> bool {
        steps.iter().any(|a| matches!(a, Action::AuthorizationEnd(_)))
            && after.provider.charge.is_some_and(|charge| charge.status == status)
    }
    let goals: [(&str, Goal); 2] = [
        ("records a capture", |steps, after| ended_as(steps, after, ChargeStatus::Succeeded)),
        ("records a void", |steps, after| ended_as(steps, after, ChargeStatus::Voided)),
    ];
    follow_shortest_paths("the authorization watch", manual_config, &goals, STRETCHES).await;
}

/// The late-refund watch, whose states the random walks reach only now and then (a refund given
/// up on, then looked up by the watch): for each attempt setting, the shortest drivable path to
/// a look that records the refund carried out late, to one that finds it absent and watches on,
/// and to one that ends the watch of a refund the provider never carried out, driven and checked
/// (the books compare each refund's watch: off, watching, seen absent).
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_the_late_refund_watch() {
    fn looked(steps: &[Action]) -> bool {
        steps.iter().any(|a| matches!(a, Action::LateRefundAct(_)))
    }
    let goals: [(&str, Goal); 3] = [
        ("records a refund carried out late", |steps, after| {
            looked(steps) && after.refunds.iter().any(|r| r.gave_up && r.status == OpStatus::Succeeded)
        }),
        ("finds a refund absent and watches on", |steps, after| {
            looked(steps) && after.refunds.iter().any(|r| r.watch == RefundWatch::SeenAbsent)
        }),
        ("ends the watch of a refund never carried out", |steps, after| {
            looked(steps)
                && after.refunds.iter().enumerate().any(|(k, r)| {
                    r.gave_up
                        && r.status == OpStatus::Failed
                        && r.watch == RefundWatch::Off
                        && after.provider.refunds[k].is_none()
                })
        }),
    ];
    follow_shortest_paths("the late-refund watch", config, &goals, STRETCHES).await;
}

/// A late charge whose system refund was given up on and found never carried out: the shortest
/// drivable path to the follow-up starting another system refund (the second, under two checks)
/// and to the person it needs once the system refunds ran out (one, under one check).
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_a_late_charges_next_system_refund() {
    let goals: [(&str, Goal); 1] = [("starts another or needs a person", |steps, after| {
        steps.iter().any(|a| matches!(a, Action::StartSystemRefund(_) | Action::LateRefundAct(_)))
            && after.payment.as_ref().is_some_and(|p| {
                p.late == LateCharge::Person || (p.system_refunds > 1 && p.late == LateCharge::Refunding)
            })
    })];
    // Under two checks, each give-up takes two claims: the second refund starts at the 11th.
    follow_shortest_paths("a late charge's next system refund", config, &goals, 11).await;
}

/// A capture declined, scripted on the mock whatever the payment method (`decline`,
/// `decline_and_hold`): the shortest drivable path to a capture answered 402 `capture-declined`
/// with the authorization left to capture or void, and to one whose decline was lost on the way
/// and then answered to the retry of its key (the provider's stored refusal: a lookup cannot
/// see a declined capture, the charge is still to capture).
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_a_capture_declined() {
    fn declined(after: &State) -> bool {
        after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::RequiresCapture)
            && after
                .actions
                .iter()
                .any(|a| a.kind == ActionKind::Capture && a.row.answer == Some(Answer::CaptureDeclined))
    }
    let goals: [(&str, Goal); 2] = [
        ("a capture declined", |_, after| declined(after)),
        ("a capture declined, its answer lost, answered to its key's retry", |steps, after| {
            declined(after)
                && steps.iter().any(|a| matches!(a, Action::Request(_)))
                && !steps.iter().any(|a| matches!(a, Action::ProviderActs { .. }))
        }),
    ];
    follow_shortest_paths("capture declines", manual_config, &goals, STRETCHES).await;
}

/// Declines, scripted on the mock whatever the payment method (`decline`, `decline_and_hold`):
/// the shortest drivable path to a charge declined, and to a refund declined whose answer was
/// lost and which a reconciler's lookup then settled as failed.
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_declines() {
    let goals: [(&str, Goal); 2] = [
        ("a charge declined", |_, after| {
            after.provider.charge.is_some_and(|charge| charge.status == ChargeStatus::Declined)
                && after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Failed)
        }),
        ("a refund declined, its answer lost, settled by a lookup", |steps, after| {
            steps.iter().any(|a| matches!(a, Action::Claim(_, Op::Refund(0))))
                && after.refunds.first().is_some_and(|r| r.status == OpStatus::Failed && !r.gave_up)
                && matches!(after.provider.refunds.first(), Some(Some((ProviderRefundStatus::Failed, _))))
        }),
    ];
    follow_shortest_paths("declines", config, &goals, STRETCHES).await;
}

/// The operator's resolution (`orderpay payments resolve`), which random walks reach only when a
/// charge is left in flight: for each attempt setting, the shortest drivable path to a payment
/// resolved as the provider has it, to a resolution the provider's view refuses (nothing
/// changes), to a failure over a send that can no longer land, and to a failure forced over a
/// charge the provider holds, taken back at once by a system refund; with an authorization, to
/// one resolved as authorized and to one failed by force and voided.
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_an_operators_resolution() {
    fn resolved(steps: &[Action]) -> bool {
        steps.contains(&Action::OperatorSettle)
    }
    fn payment_is(after: &State, status: PaymentStatus) -> bool {
        after.payment.as_ref().is_some_and(|p| p.status == status)
    }
    let goals: [(&str, Goal); 4] = [
        ("resolved as succeeded", |steps, after| {
            resolved(steps) && payment_is(after, PaymentStatus::Succeeded)
        }),
        ("refused by the provider's view", |steps, _| {
            steps.iter().any(|a| matches!(a, Action::OperatorLook { .. })) && !resolved(steps)
        }),
        ("failed, the provider never charged", |steps, after| {
            steps.contains(&Action::OperatorLook { to: Resolution::Failed, force: false })
                && resolved(steps)
                && after.provider.charge.is_none()
        }),
        ("failed by force over a charge, refunded", |steps, after| {
            steps.contains(&Action::OperatorTakeBack)
                && after.refunds.iter().any(|r| r.intent.is_none() && r.status == OpStatus::Succeeded)
        }),
    ];
    follow_shortest_paths("an operator's resolution", operator_config, &goals, STRETCHES).await;
    let goals: [(&str, Goal); 2] = [
        ("resolved as authorized", |steps, after| {
            resolved(steps) && payment_is(after, PaymentStatus::RequiresCapture)
        }),
        ("failed by force over an authorization, voided", |steps, after| {
            steps.contains(&Action::OperatorTakeBack)
                && after.provider.charge.is_some_and(|c| c.status == ChargeStatus::Voided)
        }),
    ];
    follow_shortest_paths("an operator's resolution", manual_operator_config, &goals, STRETCHES).await;
}

/// Pending answers (the mock's `pend`, whatever the payment method), which the walks' configuration
/// does not have: for each attempt setting, the shortest drivable path to a charge left pending,
/// settled by the provider and then recorded by a reconciler's claim, to one recorded from its
/// webhook, and to a refund left pending, settled and recorded.
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_pending_answers() {
    fn after_pending(after: &State) -> bool {
        after.budgets.pending == 0
    }
    fn paid(after: &State) -> bool {
        after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Succeeded)
    }
    let goals: [(&str, Goal); 3] = [
        ("a charge pending, settled, recorded by a claim", |steps, after| {
            after_pending(after)
                && paid(after)
                && steps.iter().any(|a| matches!(a, Action::Claim(_, Op::Charge)))
        }),
        ("a charge pending, settled, recorded from its webhook", |steps, after| {
            after_pending(after) && paid(after) && steps.iter().any(|a| matches!(a, Action::Deliver { .. }))
        }),
        ("a refund pending, settled, recorded", |_, after| {
            after_pending(after)
                && after.refunds.first().is_some_and(|r| r.status == OpStatus::Succeeded)
                && matches!(after.provider.refunds.first(), Some(Some((ProviderRefundStatus::Succeeded, _))))
                && paid(after)
                && after.provider.charge.is_some()
        }),
    ];
    follow_shortest_paths("pending answers", clock_config, &goals, STRETCHES).await;
}

/// The provider's clock besides pending answers: for each attempt setting, the shortest drivable
/// path to a succeeded refund reversed and corrected in our books (by its webhook, on the
/// provider's confirmed word, or by the watch), and to an authorization that expired, recorded
/// by the authorization watch.
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_expiries_and_reversals() {
    let goals: [(&str, Goal); 1] = [("a refund reversed, corrected", |_, after| {
        after.budgets.reversals == 0 && after.refunds.first().is_some_and(|r| r.corrections > 0)
    })];
    follow_shortest_paths("reversals", clock_config, &goals, STRETCHES).await;
    let goals: [(&str, Goal); 1] = [("an authorization expired, recorded", |_, after| {
        after.budgets.expiries == 0
            && after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Canceled)
    })];
    follow_shortest_paths("expiries", manual_clock_config, &goals, STRETCHES).await;
}

/// Disputes (the mock's `POST /_admin/disputes` and `/decide`), which no other configuration
/// has: for each attempt setting, the shortest drivable path to a dispute recorded from its
/// webhook (on the service's own lookup), to one recorded by the reconciler's dispute pass, to one
/// won and to one lost (the funds reinstated or kept, in our books as at the provider), to one won
/// and recorded from its webhooks alone, to one told before its charge was ours (its event's
/// lookup records nothing: `unknown`), to a refund refused while the dispute is open, and to a
/// dispute that waited for a refund in flight.
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_disputes() {
    fn recorded(after: &State, status: DisputeStatus) -> bool {
        after.dispute.is_some_and(|d| d.status == status)
    }
    let goals: [(&str, Goal); 8] = [
        ("recorded from its webhook", |steps, after| {
            steps.iter().any(|a| matches!(a, Action::RecordDispute(_))) && after.dispute.is_some()
        }),
        ("recorded by the reconciler's pass", |_, after| after.ghost.dispute_by_pass),
        ("won, recorded", |_, after| recorded(after, DisputeStatus::Won)),
        ("won, recorded from its webhooks", |_, after| {
            recorded(after, DisputeStatus::Won) && !after.ghost.dispute_by_pass
        }),
        ("told before its charge is ours, not recorded", |steps, after| {
            steps.iter().any(|a| matches!(a, Action::RecordDispute(_)))
                && after.dispute.is_none()
                && !after.ghost.dispute_waited
        }),
        ("lost, recorded", |_, after| recorded(after, DisputeStatus::Lost)),
        ("a refund refused while it is open", |_, after| after.ghost.refused_for_dispute),
        ("waiting for a refund in flight", |_, after| after.ghost.dispute_waited),
    ];
    follow_shortest_paths("disputes", dispute_config, &goals, STRETCHES).await;
}

/// The merchant's answer to a dispute (`POST /disputes/{id}/evidence`, `/accept`), a provider
/// operation of its own: for each attempt setting, the shortest drivable path to evidence taken,
/// to a dispute accepted, to an answer refused because the bank decided first (409, stored), to
/// an answer whose reply was lost and which a reconciler's lookup settled, and to one given up on.
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_a_disputes_answer() {
    fn answered(after: &State, kind: ResponseKind, answer: Answer) -> bool {
        after.responses.iter().any(|r| r.kind == kind && r.row.answer == Some(answer))
    }
    let goals: [(&str, Goal); 5] = [
        ("evidence taken", |_, after| answered(after, ResponseKind::Evidence, Answer::ResponseTaken)),
        ("accepted", |_, after| {
            answered(after, ResponseKind::Accept, Answer::ResponseTaken)
                && after.dispute.is_some_and(|d| d.accepted)
        }),
        ("refused, the bank decided first", |_, after| {
            after.responses.iter().any(|r| r.row.answer == Some(Answer::InvalidState))
        }),
        ("its reply lost, settled by a claim", |steps, after| {
            steps.iter().any(|a| matches!(a, Action::Claim(_, Op::Response(_))))
                && after.responses.iter().any(|r| r.status == OpStatus::Succeeded)
        }),
        ("given up on", |_, after| {
            after.responses.iter().any(|r| r.row.answer == Some(Answer::ResponseFailed))
        }),
    ];
    follow_shortest_paths("a dispute's answer", response_config, &goals, STRETCHES).await;
}

/// A charge event that settles what waits on the charge (`webhooks::apply_charge`, on the
/// service's own lookup inside the delivery): for each attempt setting, the shortest drivable
/// path to a capture and to a void settled by their charge's event while in flight, and to an
/// authorization ended by its event with nothing in flight (expired).
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_charge_events_settling_what_waits() {
    fn delivered_and(steps: &[Action], settled: fn(&Action) -> bool) -> bool {
        matches!(steps.first(), Some(Action::Deliver { .. })) && steps.iter().any(settled)
    }
    fn action_settled(steps: &[Action], after: &State, kind: ActionKind) -> bool {
        delivered_and(steps, |a| matches!(a, Action::Settle(_)))
            && after.actions.iter().any(|a| a.kind == kind && a.status == OpStatus::Succeeded)
    }
    let goals: [(&str, Goal); 2] = [
        ("a capture settled by its charge's event", |steps, after| {
            action_settled(steps, after, ActionKind::Capture)
        }),
        ("a void settled by its charge's event", |steps, after| {
            action_settled(steps, after, ActionKind::Void)
        }),
    ];
    follow_shortest_paths("charge events", manual_config, &goals, STRETCHES).await;
    let goals: [(&str, Goal); 1] = [("an authorization ended by its expiry's event", |steps, after| {
        delivered_and(steps, |a| matches!(a, Action::AuthorizationEnd(_)))
            && after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Canceled)
    })];
    follow_shortest_paths("charge events", manual_clock_config, &goals, STRETCHES).await;
}

/// A process dying between the statements of a drive (`Crash`: `orderpay serve` or `orderpay
/// reconcile --once` in a subprocess, aborted at the point the model's step is at), and what
/// follows its death (`LeaseRunsOut`: `lease_until` passes): for each attempt setting, the
/// shortest drivable path to a payment's request dying before its send, to one dying after the
/// provider charged with the answer unread, to one whose send the provider carries out only
/// after the death, to a retry refused while the dead request's lease holds, to a retry taking
/// the payment over once it ran out, to the reconciler taking it over, to the reconciler's own
/// pass dying, and to a refund settled by the reconciler after a process died (the refund's own
/// request, on the shortest path).
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_a_request_dying() {
    fn crashed(after: &State) -> bool {
        after.budgets.crashes == 0
    }
    fn dies(steps: &[Action]) -> bool {
        steps.iter().any(|a| matches!(a, Action::Crash(_)))
    }
    fn payment_settled(steps: &[Action], after: &State) -> bool {
        steps.iter().any(|a| matches!(a, Action::Settle(_)))
            && after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Succeeded)
    }
    let goals: [(&str, Goal); 8] = [
        ("a payment's request dying before its send", |steps, _| {
            steps == [Action::Request(0), Action::Crash(Proc::Client(0))]
        }),
        ("a payment's request dying after the provider charged", |steps, after| {
            dies(steps)
                && steps.iter().any(|a| matches!(a, Action::ProviderActs { .. }))
                && after.provider.charge.is_some()
        }),
        ("a dead request's send carried out later", |steps, after| {
            crashed(after)
                && matches!(steps, [Action::ProviderActs { .. }])
                && after.provider.charge.is_some()
        }),
        ("a retry refused while the dead request's lease holds", |steps, after| {
            crashed(after)
                && steps == [Action::Request(0)]
                && after
                    .payment
                    .as_ref()
                    .is_some_and(|p| matches!(p.row.lease, orderpay_model::state::Lease::Held(_)))
        }),
        ("a retry taking the payment over", |steps, after| {
            crashed(after) && steps.first() == Some(&Action::Request(0)) && payment_settled(steps, after)
        }),
        ("the reconciler taking the payment over", |steps, after| {
            crashed(after)
                && steps.first() == Some(&Action::Claim(0, Op::Charge))
                && payment_settled(steps, after)
        }),
        ("the reconciler dying inside its pass over the payment", |steps, _| {
            steps.first() == Some(&Action::Claim(0, Op::Charge)) && dies(steps)
        }),
        ("a refund settled by the reconciler after a process died", |steps, after| {
            crashed(after)
                && steps.first() == Some(&Action::Claim(0, Op::Refund(0)))
                && steps.iter().any(|a| matches!(a, Action::Settle(_)))
                && after.refunds.first().is_some_and(|r| r.status == OpStatus::Succeeded)
        }),
    ];
    follow_shortest_paths("a request dying", crash_config, &goals, STRETCHES).await;
}

/// Another driver stepping in while one is held between two statements (`hooks::pause`): for
/// each attempt setting, the shortest drivable path to the charge's webhook delivered while the
/// payment's request holds the provider's answer before recording it (a webhook racing phase
/// 2), the same for a refund, and the provider carrying out a parked send while the
/// reconciler holds what its lookup found (a slow send landing during the check).
#[tokio::test]
async fn the_service_follows_the_shortest_paths_to_drivers_stepping_in() {
    /// The stretch's own driver was held while `stepped_in` happened, before `then`.
    fn held_while(steps: &[Action], stepped_in: fn(&Action) -> bool, then: fn(&Action) -> bool) -> bool {
        let at = steps.iter().skip(1).position(stepped_in);
        at.is_some_and(|at| steps[at + 1..].iter().any(then))
    }
    let goals: [(&str, Goal); 4] = [
        (
            "the reconciler taking the payment over from its held request, which records after it",
            |steps, after| {
                steps.first() == Some(&Action::Request(0))
                    && held_while(
                        steps,
                        |a| matches!(a, Action::Claim(0, Op::Charge)),
                        |a| *a == Action::Settle(Proc::Client(0)),
                    )
                    && after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Succeeded)
            },
        ),
        ("a charge's webhook racing the payment's phase 2", |steps, after| {
            steps.first() == Some(&Action::Request(0))
                && held_while(
                    steps,
                    |a| matches!(a, Action::Deliver { .. }),
                    |a| *a == Action::Settle(Proc::Client(0)),
                )
                && after.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Succeeded)
        }),
        ("a refund's webhook racing the refund's phase 2", |steps, after| {
            steps.first() == Some(&Action::Request(1))
                && held_while(
                    steps,
                    |a| matches!(a, Action::Deliver { .. }),
                    |a| *a == Action::Settle(Proc::Client(1)),
                )
                && after.refunds.first().is_some_and(|r| r.status == OpStatus::Succeeded)
        }),
        ("a parked send carried out while the reconciler holds its lookup", |steps, _| {
            steps.first() == Some(&Action::Claim(0, Op::Charge))
                && held_while(
                    steps,
                    |a| matches!(a, Action::ProviderActs { .. }),
                    |a| {
                        matches!(
                            a,
                            Action::Settle(_)
                                | Action::GiveUp(_)
                                | Action::Release(_)
                                | Action::MarkSending(_)
                        )
                    },
                )
        }),
    ];
    follow_shortest_paths_stepping_in("drivers stepping in", step_in_config, &goals, STRETCHES, true).await;
}
