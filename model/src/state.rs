//! The abstract state: our rows, the provider's ledger, the processes that drive operations, and
//! a few ghost variables that only the properties read.
//!
//! Every field is something a conformance test can compute from the service's tables
//! (`orders`, `payments`, `payment_operations`, `refunds`, `idempotency_keys`, `events`) and the
//! mock provider's ledger (`GET /_admin/charges`, `/_admin/refunds`), or is the model's own
//! bookkeeping of what a process is doing (docs/model.md, "Conformance"). Amounts are small
//! integers (units); time is abstracted to steps ("a lease ran out", "the last send went quiet").

use serde::Serialize;

use crate::config::Faults;

/// Which process acts: a client's request (by its key), a reconciler, or the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Proc {
    /// The request of client intent `i` (its `Idempotency-Key`), the first or a retry.
    Client(u8),
    /// Reconciler `r` (`orderpay reconcile --once`, or the background task of `serve`).
    Reconciler(u8),
    /// `orderpay payments resolve`.
    Operator,
}

/// A provider operation, as its row names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Op {
    /// The payment's charge (or authorization): the `payments` row.
    Charge,
    /// A capture or a void: `payment_operations` row number `k`.
    Action(u8),
    /// A refund, the client's or the system's: `refunds` row number `k`.
    Refund(u8),
    /// The merchant's answer to the dispute: `dispute_responses` row number `k`.
    Response(u8),
}

/// Who holds an operation's lease (`lease_id`, `lease_until`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Lease {
    Free,
    /// Held by a live lease.
    Held(Proc),
    /// The lease ran out: anyone may take it over, but until someone does its `lease_id` still
    /// names the old holder (whose `mark_sending` and `release` still match).
    RanOut(Proc),
}

impl Lease {
    /// Whether `proc`'s lease id is the one on the row.
    pub fn names(self, proc: Proc) -> bool {
        matches!(self, Lease::Held(p) | Lease::RanOut(p) if p == proc)
    }

    /// Whether a compare-and-set may take it (`operations::leases::lease`).
    pub fn takeable(self) -> bool {
        !matches!(self, Lease::Held(_))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum OrderStatus {
    PendingPayment,
    Authorized,
    Paid,
    PartiallyRefunded,
    Refunded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum PaymentStatus {
    Processing,
    Succeeded,
    RequiresCapture,
    Failed,
    Canceled,
}

/// A capture's, void's or refund's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum OpStatus {
    Processing,
    Succeeded,
    Failed,
}

/// A final answer, as stored for a key (`answer_status`, `answer_body` on the operation's row,
/// or `response_status` on the key's row) and replayed to every retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Answer {
    /// 201, the payment `succeeded`.
    Paid,
    /// 201, the payment `requires_capture`.
    Authorized,
    /// 402 `payment-declined`.
    Declined,
    /// 402 `payment-failed`: given up on, or failed by an operator.
    PaymentFailed,
    /// 201, the payment `canceled` (an authorization that ended before it was recorded).
    PaymentCanceled,
    /// 200, captured.
    Captured,
    /// 200, voided.
    Voided,
    /// 402 `capture-declined`.
    CaptureDeclined,
    /// 402 `capture-failed` / `void-failed`: given up on.
    ActionFailed,
    /// 402 `authorization-expired`.
    AuthorizationExpired,
    /// 201, the refund `succeeded`.
    RefundSucceeded,
    /// 402 `refund-failed`: declined, refused, or given up on.
    RefundFailed,
    /// 409 `invalid-state` (stored: a final answer about the resource's state).
    InvalidState,
    /// 200, the dispute as recorded after the provider took the merchant's answer.
    ResponseTaken,
    /// 402 `operation-failed`: a dispute response given up on.
    ResponseFailed,
}

/// The late-charge watch of a failed payment, and what became of a charge it found
/// (`late_watch_until`, `late_charge_amount`, `next_check_at` on the payment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum LateCharge {
    /// Not watched: the payment did not fail by a give-up or an operator.
    Off,
    /// Looking the payment's downstream key up for a charge that landed late.
    Watching,
    /// A charge was recorded; a system refund of it is alive, or given up on and watched.
    Refunding,
    /// The last system refund is definitely not carried out: another one is due.
    RefundDue,
    /// A system refund gave the late charge back.
    Refunded,
    /// System refunds ran out (`ORDERPAY_RECONCILE_MAX_ATTEMPTS`): listed as stuck, paged.
    Person,
    /// The watch ended: nothing landed, or a late authorization was voided.
    Ended,
}

/// What every operation row has (`operations::leases`): its final answer, who drives it, the
/// reconciler's checks, and whether its last send is recent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Row {
    /// The final answer; `None` while the operation is in flight.
    pub answer: Option<Answer>,
    pub lease: Lease,
    /// Reconciler checks (saturating at the last check; not tracked once settled).
    pub attempts: u8,
    /// `last_send_at` is within the provider timeout plus the margin: the give-up guard holds.
    pub send_recent: bool,
}

impl Row {
    /// A row its start statement wrote: leased to `holder`, marked as being sent now.
    pub fn started(holder: Proc) -> Row {
        Row { answer: None, lease: Lease::Held(holder), attempts: 0, send_recent: true }
    }
}

/// The payments row: the payment, its amounts, and its charge as an operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Payment {
    pub status: PaymentStatus,
    /// The charge as an operation (its answer is `None` while the charge is in flight).
    pub row: Row,
    /// `provider_charge_id` is known (captures, voids and refunds need it).
    pub charge_known: bool,
    pub captured: u8,
    pub refunded: u8,
    pub refunding: u8,
    pub late: LateCharge,
    /// System refunds started for its late charge.
    pub system_refunds: u8,
    /// Settled by an operator (`orderpay payments resolve`; the audit row's actor).
    pub resolved: bool,
    /// `amount_disputed`: what its disputes withdrew and did not reinstate (no longer
    /// refundable).
    pub disputed: u8,
}

impl Payment {
    /// Its charge (or authorization) is in flight (`status = 'processing' AND answer_status IS
    /// NULL`).
    pub fn charge_in_flight(&self) -> bool {
        self.status == PaymentStatus::Processing && self.row.answer.is_none()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ActionKind {
    Capture,
    Void,
}

/// A `payment_operations` row: a capture or a void.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Action {
    pub intent: u8,
    pub kind: ActionKind,
    pub amount: u8,
    pub status: OpStatus,
    pub row: Row,
}

/// The late-refund watch of a refund given up on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum RefundWatch {
    Off,
    /// Looking its downstream key up.
    Watching,
    /// Still watching, and a look found the provider never received it: definitely not carried
    /// out unless the provider acts later than any timeout.
    SeenAbsent,
}

/// A `refunds` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Refund {
    /// The client's key (its intent), or `None` for a system refund of a late charge.
    pub intent: Option<u8>,
    pub amount: u8,
    pub status: OpStatus,
    pub row: Row,
    /// Given up on, once: failed by a give-up (`failure_code = reconciliation_gave_up` while it
    /// stays failed; a correction to succeeded clears the code, not this history).
    pub gave_up: bool,
    pub watch: RefundWatch,
    /// A provider webhook said this succeeded refund failed: the watch looks it up (the
    /// webhook's verification, coalesced with the reconciler's lookup).
    pub check: bool,
    /// Corrections applied (failed -> succeeded, succeeded -> failed).
    pub corrections: u8,
    /// Events written about it (`refund.succeeded`, `refund.failed`).
    pub events: u8,
}

impl Refund {
    /// A refund its start statement wrote, reserving `amount`: the client's (`intent`) or the
    /// system's (`None`), driven by `holder`.
    pub fn started(intent: Option<u8>, amount: u8, holder: Proc) -> Refund {
        Refund {
            intent,
            amount,
            status: OpStatus::Processing,
            row: Row::started(holder),
            gave_up: false,
            watch: RefundWatch::Off,
            check: false,
            corrections: 0,
            events: 0,
        }
    }

    pub fn system(&self) -> bool {
        self.intent.is_none()
    }
}

/// An `idempotency_keys` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Key {
    /// Never used, or swept past its retention.
    Free,
    /// Names the operation whose row holds the answer.
    Names(Op),
    /// Holds its answer itself (a refusal stored with the key).
    Stored(Answer),
}

/// A charge at the provider, found by our downstream key `orderpay_pay_<payment>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ChargeStatus {
    Pending,
    Succeeded,
    RequiresCapture,
    Declined,
    /// Voided (`requested`).
    Voided,
    /// `authorization_expired`.
    Expired,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Charge {
    pub status: ChargeStatus,
    pub captured: u8,
    pub refunded: u8,
    /// Ghost: created by a request the provider acted on later than any timeout.
    pub landed_late: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ProviderRefundStatus {
    Pending,
    Succeeded,
    Failed,
    /// Succeeded, then reversed (the card was closed): `failed` to a lookup.
    Reversed,
    /// Refused (over what remains, or the charge is not refundable): the key's answer is the
    /// refusal, and a lookup by key finds nothing.
    Refused,
}

/// What the provider answers to a send (and to a lookup), in our terms: what the kind's
/// `outcome_of` makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Finding {
    /// Only a lookup answers this: the provider has no record of the key.
    NotReceived,
    /// Pending, or a state that is no outcome for this operation.
    Unknown,
    Final(Outcome),
}

/// A final outcome of a provider operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Outcome {
    /// A charge captured, or a capture done, for this amount.
    Captured(u8),
    Authorized,
    Declined,
    /// The authorization was voided.
    Voided,
    /// The authorization expired.
    Expired,
    RefundSucceeded,
    RefundFailed,
    /// The provider took the merchant's answer: the dispute as it is after.
    ResponseTaken(Dispute),
    /// The dispute moved on without the answer: the dispute as it is now.
    ResponseRefused(Dispute),
}

/// A chargeback's status: `NeedsResponse` and `UnderReview` are open (their funds are
/// withdrawn); `Won` and `Lost` are final. (An inquiry, `warning_*`, moves no money and is not
/// modelled.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum DisputeStatus {
    NeedsResponse,
    UnderReview,
    Won,
    Lost,
}

impl DisputeStatus {
    /// How far along it is: a dispute only moves forward (`record_dispute.sql`'s guard, the
    /// mock's transitions).
    pub fn rank(self) -> u8 {
        match self {
            DisputeStatus::NeedsResponse => 0,
            DisputeStatus::UnderReview => 1,
            DisputeStatus::Won | DisputeStatus::Lost => 2,
        }
    }
}

/// A dispute as one side holds it: the provider's (and what a lookup or a webhook says of it),
/// or our `disputes` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Dispute {
    pub status: DisputeStatus,
    /// `closed_reason = accepted`: the merchant accepted it (lost, with no decision). The other
    /// closed reasons (`decided`, `evidence_not_submitted`) tell nothing the model needs.
    pub accepted: bool,
    pub withdrawn: u8,
    pub reinstated: u8,
}

impl Dispute {
    /// What it holds of the charge's money: withdrawn less reinstated.
    pub fn net(self) -> u8 {
        self.withdrawn - self.reinstated
    }

    pub fn open(self) -> bool {
        self.status.rank() < 2
    }

    /// It still waits for the merchant's response (`needs_response`).
    pub fn needs_response(self) -> bool {
        self.status == DisputeStatus::NeedsResponse
    }
}

/// What the merchant answers a dispute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ResponseKind {
    /// `POST /disputes/{id}/evidence`: evidence submitted (the provider's `update_dispute`).
    Evidence,
    /// `POST /disputes/{id}/accept`: the dispute accepted (the provider's `close_dispute`).
    Accept,
}

/// A `dispute_responses` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Response {
    pub intent: u8,
    pub kind: ResponseKind,
    pub status: OpStatus,
    pub row: Row,
}

/// What the provider did with a response's key (the mock's record for the key, replayed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum KeyRecord {
    /// Took it: the dispute moved (`needs_response` -> `under_review`, or lost as accepted).
    Taken,
    /// Refused it (409): the dispute no longer needed a response.
    Refused,
}

/// A request the provider received (or will), and the answer it has for its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Request {
    pub target: Target,
    /// The process still waiting for the answer (`None`: it timed out or crashed).
    pub from: Option<Proc>,
    /// The provider acted: the answer on its way back.
    pub reply: Option<Finding>,
    /// Past the provider timeout plus the margin: acting on it is acting late.
    pub late: bool,
}

/// What a request is about, by its downstream key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Target {
    Op(Op),
    /// The late void of an authorization held for a failed payment
    /// (`orderpay_late_void_<payment>`).
    LateVoid,
}

/// A provider webhook in flight: the object as it was when the event happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Webhook {
    /// `charge.succeeded`, `.failed`, `.captured`, `.canceled`: the charge's status and captured
    /// amount.
    Charge(ChargeStatus, u8),
    /// `refund.succeeded`, `refund.failed` about refund `k`.
    Refund(u8, ProviderRefundStatus),
    /// `charge.dispute.created`, `.funds_withdrawn`, `.funds_reinstated`, `.closed`: the dispute
    /// as it was then.
    Dispute(Dispute),
}

/// The provider's ledger and what is on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Provider {
    pub charge: Option<Charge>,
    /// By our refund's downstream key (`orderpay_refund_<id>`), in our rows' order.
    pub refunds: Vec<Option<(ProviderRefundStatus, u8)>>,
    /// A capture's or void's answer, replayed to its key (by our action's index).
    pub actions: Vec<Option<Finding>>,
    /// Requests on the wire, sorted.
    pub requests: Vec<Request>,
    /// Webhooks not yet delivered, sorted.
    pub webhooks: Vec<Webhook>,
    /// The dispute of the payment's charge, if its customer's bank opened one.
    pub dispute: Option<Dispute>,
    /// What it did with each dispute response's key (`orderpay_dispute_response_<id>`), in our
    /// rows' order.
    pub responses: Vec<Option<KeyRecord>>,
    /// The response whose evidence the dispute holds, submitted (`evidence` is its text and
    /// `submission_count > 0`).
    pub evidence: Option<u8>,
}

/// What a process is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Pc {
    Idle,
    /// Driving `op` under its lease (`operations::drive` and what its driver does after).
    Drive {
        op: Op,
        mode: Mode,
        stage: Stage,
    },
    /// A refund start that read the payment before its lock (a mutant only).
    ReadUnlocked {
        succeeded: bool,
        refundable: u8,
    },
    /// The late-charge watch looked the payment's key up and saw this; `landing`: a request
    /// for it could still land then (the watch's window had not passed).
    LateChargeSeen {
        seen: Option<ChargeStatus>,
        landing: bool,
    },
    /// The late void was sent; waiting for its answer.
    LateVoidWaiting,
    /// The late-refund watch looked refund `k` up and saw this; `landing` as for charges.
    LateRefundSeen {
        k: u8,
        seen: Option<ProviderRefundStatus>,
        landing: bool,
    },
    /// The authorization watch looked the charge up and saw this (status, captured amount).
    AuthorizationSeen(ChargeStatus, u8),
    /// The operator holds the payment's lease.
    OperatorLeased,
    /// The operator judged the provider's view: settle as `to`, `forced` over an objection,
    /// `take_back` money the provider holds; `seen`: the view had a charge (whose id the
    /// resolution records).
    OperatorJudged {
        to: Resolution,
        forced: bool,
        take_back: bool,
        seen: bool,
    },
    /// The operator settled a forced failure over money the provider holds: take it back.
    OperatorTakingBack,
    /// The operator is done (its one resolution, applied or refused).
    Finished,
    /// The reconciler's dispute pass listed the provider's dispute as this; about to record it.
    DisputeListed(Dispute),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Resolution {
    Captured,
    Authorized,
    Failed,
}

/// How much the provider may already know about an operation (`operations::DriveMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Mode {
    FirstCall,
    Redrive,
    LookupOnly,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Stage {
    /// About to look the operation up by its downstream key.
    Look,
    /// The send is marked (`last_send_at`); about to send.
    Marked,
    /// Sent; waiting for the answer.
    Waiting,
    /// Has this finding; about to record it (settle, give up, or release).
    Have(Finding),
}

/// A client intent's request process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Client {
    pub pc: Pc,
    /// Requests it may still send with its key (the first and the retries).
    pub requests_left: u8,
}

/// Ghost variables: history the properties need, not rows.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Ghost {
    /// The final answer each key was seen to give, in its key's lifetime.
    pub told: Vec<Option<Answer>>,
    /// Charges the provider created for the payment's key.
    pub charges_created: u8,
    /// An operator forced a resolution over the provider's word.
    pub forced: bool,
    /// The first rule a step broke, if any (see `audit`).
    pub broken: Option<Broken>,
    /// A client's refund was refused (409 `charge-disputed`) while a dispute was open.
    pub refused_for_dispute: bool,
    /// The dispute's row was created by the reconciler's pass (no webhook recorded it first).
    pub dispute_by_pass: bool,
    /// A dispute's record did not fit beside a refund in flight (`does_not_fit`).
    pub dispute_waited: bool,
    /// Times the provider took each response's key (moved the dispute for it), by our rows.
    pub responses_taken: Vec<u8>,
    /// A lookup found a response taken that its sender never heard of.
    pub response_found_by_lookup: bool,
}

/// A rule broken by one step, found by comparing the state before and after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Broken {
    /// A final state was left other than by a documented correction.
    FinalStateLeft,
    /// A stored answer was rewritten, or a key answered two different final answers.
    AnswerChanged,
    /// The events written do not match the transitions applied.
    EventsMismatch,
    /// A dispute's row moved other than its guard allows, or the payment's `amount_disputed`
    /// did not move with it.
    DisputeGuard,
}

/// The whole abstract state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct State {
    pub order: OrderStatus,
    pub payment: Option<Payment>,
    pub actions: Vec<Action>,
    pub refunds: Vec<Refund>,
    /// The merchant's answers to the dispute (`dispute_responses`).
    pub responses: Vec<Response>,
    /// The `disputes` row of the payment's dispute, once recorded.
    pub dispute: Option<Dispute>,
    /// Dispute webhooks verified by a lookup (`get_dispute`), each about to be recorded with
    /// what the lookup said in the event's second transaction; sorted.
    pub dispute_lookups: Vec<Dispute>,
    pub keys: Vec<Key>,
    /// Events written about the order and about the payment (the outbox, as counts).
    pub order_events: u8,
    pub payment_events: u8,
    pub provider: Provider,
    pub clients: Vec<Client>,
    pub reconcilers: Vec<Pc>,
    pub operator: Option<Pc>,
    /// Faults and provider behaviours still allowed on this path (each a budget).
    pub budgets: Faults,
    pub ghost: Ghost,
}

impl State {
    /// The row of `op` (which exists).
    pub fn row(&self, op: Op) -> &Row {
        match op {
            Op::Charge => &self.payment.as_ref().expect("the payment exists").row,
            Op::Action(k) => &self.actions[k as usize].row,
            Op::Refund(k) => &self.refunds[k as usize].row,
            Op::Response(k) => &self.responses[k as usize].row,
        }
    }

    pub fn row_mut(&mut self, op: Op) -> &mut Row {
        match op {
            Op::Charge => &mut self.payment_mut().row,
            Op::Action(k) => &mut self.actions[k as usize].row,
            Op::Refund(k) => &mut self.refunds[k as usize].row,
            Op::Response(k) => &mut self.responses[k as usize].row,
        }
    }

    /// In flight: `status = 'processing'` with no answer yet.
    pub fn in_flight(&self, op: Op) -> bool {
        match op {
            Op::Charge => self.payment.as_ref().is_some_and(Payment::charge_in_flight),
            Op::Action(k) => self.actions[k as usize].status == OpStatus::Processing,
            Op::Refund(k) => self.refunds[k as usize].status == OpStatus::Processing,
            Op::Response(k) => self.responses[k as usize].status == OpStatus::Processing,
        }
    }

    pub fn answer(&self, op: Op) -> Option<Answer> {
        self.row(op).answer
    }

    pub fn payment_mut(&mut self) -> &mut Payment {
        self.payment.as_mut().expect("the payment exists")
    }

    pub fn pc(&self, proc: Proc) -> Pc {
        match proc {
            Proc::Client(i) => self.clients[i as usize].pc,
            Proc::Reconciler(r) => self.reconcilers[r as usize],
            Proc::Operator => self.operator.unwrap_or(Pc::Idle),
        }
    }

    pub fn set_pc(&mut self, proc: Proc, pc: Pc) {
        match proc {
            Proc::Client(i) => self.clients[i as usize].pc = pc,
            Proc::Reconciler(r) => self.reconcilers[r as usize] = pc,
            Proc::Operator => self.operator = Some(pc),
        }
    }

    /// Every operation row there is.
    pub fn ops(&self) -> impl Iterator<Item = Op> + '_ {
        let charge = self.payment.is_some().then_some(Op::Charge);
        let actions = (0..self.actions.len() as u8).map(Op::Action);
        let refunds = (0..self.refunds.len() as u8).map(Op::Refund);
        let responses = (0..self.responses.len() as u8).map(Op::Response);
        charge.into_iter().chain(actions).chain(refunds).chain(responses)
    }

    /// Every process.
    pub fn procs(&self) -> impl Iterator<Item = Proc> + '_ {
        let clients = (0..self.clients.len() as u8).map(Proc::Client);
        let reconcilers = (0..self.reconcilers.len() as u8).map(Proc::Reconciler);
        let operator = self.operator.map(|_| Proc::Operator);
        clients.chain(reconcilers).chain(operator)
    }

    /// Whether `proc` is in the middle of working on `op` (so its lease running out is a fault,
    /// not the normal end of a dead holder's lease).
    pub fn working_on(&self, proc: Proc, op: Op) -> bool {
        match self.pc(proc) {
            Pc::Drive { op: driven, .. } => driven == op,
            Pc::OperatorLeased | Pc::OperatorJudged { .. } => op == Op::Charge,
            _ => false,
        }
    }

    /// The provider's captured and refunded amounts for the payment's charge.
    /// A request for `target` is on the wire, or its object is pending at the provider: it
    /// could still land. (A watch's window ends only once nothing can: the windows outlast any
    /// provider's lateness.)
    pub fn could_land(&self, target: Target) -> bool {
        let on_wire = self.provider.requests.iter().any(|r| r.target == target);
        let pending = match target {
            Target::Op(Op::Charge) => self.provider.charge.is_some_and(|c| c.status == ChargeStatus::Pending),
            Target::Op(Op::Refund(k)) => {
                matches!(self.provider.refunds[k as usize], Some((ProviderRefundStatus::Pending, _)))
            }
            _ => false,
        };
        on_wire || pending
    }

    pub fn provider_amounts(&self) -> (u8, u8) {
        self.provider.charge.map_or((0, 0), |c| (c.captured, c.refunded))
    }

    /// What the provider's dispute withdrew and did not reinstate.
    pub fn provider_disputed(&self) -> u8 {
        self.provider.dispute.map_or(0, Dispute::net)
    }
}
