//! The model's actions. Each names, in its doc comment, the statement or function of the
//! service it stands for (docs/model.md has the same table), so that a reader can hold the model
//! against the code and a conformance test can drive the service through the same step.

use serde::Serialize;

use crate::state::{Op, Proc, Resolution, ResponseKind};

/// How the provider treats a request it acts on, where it has a choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Choice {
    /// Charges, captures, voids, refunds: done.
    Succeed,
    /// Declines the charge, the capture or the refund.
    Decline,
    /// Answers `pending`, and settles later.
    Pend,
}

/// One step of one process, of the provider, or of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Action {
    // --- A client's request ---
    /// A request with intent `i`'s key, the first or a retry: the kind's start statement after
    /// `idempotency/claim_key.sql` (`payments/start_payment.sql`,
    /// `payments/start_capture_or_void.sql`, `refunds/start_refund.sql`), or, for a key seen
    /// before, `operations::request::existing_key` (a replay, 409 in use, or a takeover by
    /// `operations::leases::lease`).
    Request(u8),
    /// A request with intent `i`'s key answering the dispute with `kind`, the first or a retry:
    /// `disputes/start_response.sql` after `idempotency/claim_key.sql` (the dispute locked; it
    /// must need a response, and no other response be in flight), or, for a key seen before,
    /// `operations::request::existing_key`.
    Respond(u8, ResponseKind),
    /// Only with the mutant `StartReadsWithoutLock`: the refund's start reads the payment
    /// before it holds the lock (`refunds/start_refund.sql` split in two).
    ReadUnlocked(u8),

    // --- The engine, for every driver (`operations::drive` and what follows it) ---
    /// `Kind::look_up`: the provider's view by the downstream key (`find_charge`,
    /// `get_charge`, `find_refund`; a dispute response's, `get_dispute` and `dispute_state`).
    LookUp(Proc),
    /// `operations::leases::mark_sending`: `last_send_at` under the lease, before a re-send.
    MarkSending(Proc),
    /// `Kind::send`: the request leaves (`create_charge`, `capture_charge`, `cancel_charge`,
    /// `create_refund`, `respond_to_dispute`; the late void's `cancel_charge`).
    Send(Proc),
    /// The provider's answer reaches the process that sent the request.
    AnswerArrives(Proc),
    /// `ORDERPAY_PROVIDER_TIMEOUT_MS` passes (or the connection breaks): the answer is lost, or
    /// never comes; the outcome is unknown.
    TimesOut(Proc),
    /// `Kind::settle`: `payments/settle_payment.sql`, `payments/settle_capture_or_void.sql`,
    /// `refunds/settle_refund.sql`; a dispute response's `settle_in`: the provider's dispute
    /// through `disputes/record_dispute.sql`, then `disputes/settle_response.sql`.
    Settle(Proc),
    /// `Kind::settle` with `GaveUp` (the reconciler's last check found nothing): the same
    /// statements with the give-up guard (`last_send_at` quiet).
    GiveUp(Proc),
    /// `operations::leases::release`: the outcome stays unknown (a request then answers 202).
    Release(Proc),

    // --- The reconciler ---
    /// `operations::leases::lease` with `LeaseTarget::Due`: reconciler `r` claims `op`,
    /// counting an attempt (`operations::reconciler::pass_over`).
    Claim(u8, Op),
    /// `operations::late_charge::look`: the late-charge watch looks the payment's key up
    /// (`payments::watches::watch_late`, `find_charge`).
    LateChargeLook(u8),
    /// What the late-charge watch does with what it saw: `operations::late_charge::take_back`
    /// (`record_late_charge` and `refunds/start_refund.sql` for a system refund, one
    /// transaction), the late void, or `watch_late_again` (next look, or the end of the watch).
    LateChargeAct(u8),
    /// A new system refund for a late charge whose last one is definitely not carried out
    /// (`refunds/start_refund.sql` with no key, payment `failed`).
    StartSystemRefund(u8),
    /// The late-refund watch looks refund `k` up (`find_refund`): a refund given up on, or a
    /// succeeded one a webhook said failed.
    LateRefundLook(u8, u8),
    /// What the late-refund watch does with what it saw: a correction (failed -> succeeded,
    /// succeeded -> failed, one statement with the order's and the refund's events), or the
    /// end of the watch.
    LateRefundAct(u8),
    /// `operations::authorization::watch`: looks a watched authorization's charge up.
    AuthorizationLook(u8),
    /// `payments/end_authorization.sql` via `operations::authorization::end_on`.
    AuthorizationEnd(u8),
    /// `disputes::record::pass`: the provider's disputes listed (`list_disputes`, or
    /// `get_dispute` for one we hold open), for one we lack or hold open and differently.
    DisputeList(u8),
    /// `disputes::record::record_on` for what the pass listed, in a transaction of its own
    /// (`disputes/record_dispute.sql`).
    DisputeRecord(u8),

    // --- The operator (`orderpay payments resolve`, `operations::operator::resolve`) ---
    /// `take_lease`: the payment's lease by compare-and-set, as a takeover.
    OperatorLease,
    /// The provider's view under the lease (`look_up`), judged (`judge`) against `--as to`,
    /// with or without `--force`; a refusal releases the lease.
    OperatorLook { to: Resolution, force: bool },
    /// `Charges::settle` with `ChargeOutcome::Resolved` (actor `operator`).
    OperatorSettle,
    /// `late_charge::take_back` after a forced failure over money the provider holds.
    OperatorTakeBack,

    // --- The provider ---
    /// The provider acts on request `index` (now, or later than the sender waited, or later
    /// than any timeout).
    ProviderActs { index: u8, choice: Choice },
    /// Time: `op`'s last send is older than the provider timeout plus
    /// `ORDERPAY_GIVE_UP_MARGIN_MS`. A request the provider has not acted on yet either never
    /// will or will act late.
    SendsGoQuiet(Op),
    /// The provider never acts on request `index`.
    ProviderDrops(u8),
    /// A pending charge settles at the provider.
    ChargeSettles,
    /// A pending refund `k` settles at the provider.
    RefundSettles(u8),
    /// The authorization expires at the provider.
    AuthorizationExpires,
    /// Refund `k` is reversed at the provider (`pm_refund_reversed`).
    RefundReversed(u8),
    /// The customer's bank disputes the captured charge for `amount` (the mock's
    /// `open_dispute`, `POST /_admin/disputes`): the funds are withdrawn.
    OpenDispute(u8),
    /// The bank decides the open dispute (the mock's `decide_dispute`); won reinstates the funds.
    DecideDispute { won: bool },
    /// Webhook `index` is delivered to `POST /provider/webhooks`
    /// (`operations::webhooks::receive`); `again`: a copy stays in flight, to be delivered after
    /// its `provider_webhooks` row was swept. An operation in flight is settled as the
    /// provider's lookup finds it at delivery (`webhooks::verify`), not as the event says. A
    /// dispute's event that differs from the row we hold is not applied: its transaction rolls
    /// back and the dispute is looked up (`webhooks::verify`, `get_dispute`).
    Deliver { index: u8, again: bool },
    /// The second transaction of a dispute event verified by lookup `index`:
    /// `webhooks::apply_dispute` with what the lookup said (`disputes::record::record_on`,
    /// `disputes/record_dispute.sql`).
    RecordDispute(u8),

    // --- Faults and time ---
    /// The process dies between two statements (SIGKILL); its leases stay until they run out.
    Crash(Proc),
    /// `op`'s lease runs out (`lease_until` passes).
    LeaseRunsOut(Op),
    /// Intent `i`'s key is swept past its retention (`idempotency::store::delete_expired`).
    KeyExpires(u8),
}

impl Action {
    /// The process taking this step when it is one of the engine's, which every driver takes
    /// alike (`LookUp` ... `Release`).
    pub fn engine_step_of(self) -> Option<Proc> {
        match self {
            Action::LookUp(p)
            | Action::MarkSending(p)
            | Action::Send(p)
            | Action::AnswerArrives(p)
            | Action::TimesOut(p)
            | Action::Settle(p)
            | Action::GiveUp(p)
            | Action::Release(p) => Some(p),
            _ => None,
        }
    }
}
