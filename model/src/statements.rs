//! The service's writing statements, each one atomic step of the model: the kinds' starts and
//! settles, the corrections, the end of an authorization, and the late-charge path. Each says
//! which `.sql` file or function it stands for; each writes its events (the outbox) itself.

use crate::audit::{Event, EventType, Subject, order_event};
use crate::config::{Config, Defect, Mutation};
use crate::state::{
    Action, ActionKind, Answer, Dispute, Key, LateCharge, Lease, Mode, Op, OpStatus, OrderStatus, Outcome,
    Payment, PaymentStatus, Pc, Proc, Refund, RefundWatch, Resolution, Response, ResponseKind, Row, Stage,
    State,
};

/// One step being taken: the state it changes and the events it has written.
pub struct Step<'a> {
    pub config: &'a Config,
    pub state: State,
    pub written: Vec<Event>,
    /// The step is a correction on the provider's confirmed word.
    pub correction: bool,
}

/// How an operation is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// The provider's outcome.
    Outcome(Outcome),
    /// The reconciler's give-up: the provider never received it.
    GaveUp,
    /// An operator's resolution (`ChargeOutcome::Resolved`).
    Resolved(Resolution),
}

impl Step<'_> {
    fn mutated(&self, mutation: Mutation) -> bool {
        self.config.mutated(mutation)
    }

    /// Writes an event (`events::Announce` in the statement's transaction).
    pub fn write(&mut self, subject: Subject, event: EventType) {
        match subject {
            Subject::Order => self.state.order_events += 1,
            Subject::Payment => self.state.payment_events += 1,
            Subject::Refund(k) => self.state.refunds[k as usize].events += 1,
        }
        self.written.push((subject, event));
    }

    fn payment(&mut self) -> &mut Payment {
        self.state.payment_mut()
    }

    /// The guard every settle statement has: the operation is in flight (`status =
    /// 'processing'`).
    fn may_settle(&self, op: Op) -> bool {
        self.state.in_flight(op) || self.mutated(Mutation::SettleWithoutStatusGuard)
    }

    /// `Kind::settle` with `GaveUp`, by `giver` after its lookup found nothing: held back
    /// (`None` while in flight) unless the last send is quiet and `giver` still holds the lease,
    /// so that no send was marked since its lookup.
    pub fn give_up(&mut self, op: Op, giver: Proc) -> Option<Answer> {
        let guarded = !self.mutated(Mutation::NoInFlightGuard);
        let holds = self.state.row(op).lease.names(giver) || self.config.has(Defect::GiveUpOnAStaleLookup);
        let quiet = !self.state.row(op).send_recent && holds;
        if guarded && !quiet {
            return self.state.answer(op);
        }
        self.settle(op, Settlement::GaveUp)
    }

    /// `Kind::settle` for any kind. Returns the operation's answer after it (this one's if it
    /// applied, else whoever's settled it first; `None`: a give-up held back).
    pub fn settle(&mut self, op: Op, how: Settlement) -> Option<Answer> {
        if let (
            Op::Response(_),
            Settlement::Outcome(Outcome::ResponseTaken(seen) | Outcome::ResponseRefused(seen)),
        ) = (op, how)
        {
            // A dispute response's `settle_in` records the provider's dispute first, in the same
            // transaction, whether or not the response's own guarded settle then applies.
            self.record_dispute(seen);
        }
        if !self.may_settle(op) {
            return self.state.answer(op);
        }
        self.state.row_mut(op).lease = Lease::Free;
        // A settled operation's attempts no longer matter: not tracked.
        self.state.row_mut(op).attempts = 0;
        let answer = match op {
            Op::Charge => self.settle_payment(how),
            Op::Action(k) => self.settle_capture_or_void(k, how),
            Op::Refund(k) => self.settle_refund(k, how),
            Op::Response(k) => self.settle_response(k, how),
        };
        self.state.row_mut(op).answer = Some(answer);
        Some(answer)
    }

    /// `payments/settle_payment.sql` (via `operations::charge::settle_on`).
    fn settle_payment(&mut self, how: Settlement) -> Answer {
        let total = self.config.total;
        let (status, answer) = match how {
            Settlement::Outcome(Outcome::Captured(amount)) => {
                self.payment().captured = amount;
                (PaymentStatus::Succeeded, Answer::Paid)
            }
            Settlement::Resolved(Resolution::Captured) => {
                self.payment().captured = total;
                (PaymentStatus::Succeeded, Answer::Paid)
            }
            Settlement::Outcome(Outcome::Authorized) | Settlement::Resolved(Resolution::Authorized) => {
                (PaymentStatus::RequiresCapture, Answer::Authorized)
            }
            Settlement::Outcome(Outcome::Voided | Outcome::Expired) => {
                (PaymentStatus::Canceled, Answer::PaymentCanceled)
            }
            Settlement::Outcome(Outcome::Declined) => (PaymentStatus::Failed, Answer::Declined),
            Settlement::GaveUp | Settlement::Resolved(Resolution::Failed) => {
                // A charge sent late could still land: the late-charge watch looks for one.
                self.payment().late = LateCharge::Watching;
                (PaymentStatus::Failed, Answer::PaymentFailed)
            }
            Settlement::Outcome(
                Outcome::RefundSucceeded
                | Outcome::RefundFailed
                | Outcome::ResponseTaken(_)
                | Outcome::ResponseRefused(_),
            ) => {
                unreachable!("another kind's outcome for a charge: {how:?}")
            }
        };
        let payment = self.payment();
        payment.status = status;
        payment.resolved = matches!(how, Settlement::Resolved(_));
        payment.charge_known = status != PaymentStatus::Failed;
        let event = match status {
            PaymentStatus::Succeeded => EventType::PaymentSucceeded,
            PaymentStatus::RequiresCapture => EventType::PaymentRequiresCapture,
            PaymentStatus::Canceled => EventType::PaymentCanceled,
            PaymentStatus::Failed | PaymentStatus::Processing => EventType::PaymentFailed,
        };
        self.write(Subject::Payment, event);
        let order_to = match status {
            PaymentStatus::Succeeded => Some(OrderStatus::Paid),
            PaymentStatus::RequiresCapture => Some(OrderStatus::Authorized),
            _ => None,
        };
        if let Some(to) = order_to {
            // `moved`: only an order still `pending_payment`.
            if self.state.order == OrderStatus::PendingPayment {
                self.state.order = to;
                if to == OrderStatus::Paid {
                    self.write(Subject::Order, EventType::OrderPaid);
                }
            }
        }
        answer
    }

    /// `payments/settle_capture_or_void.sql` (via `operations::authorization::settle_on`).
    fn settle_capture_or_void(&mut self, k: u8, how: Settlement) -> Answer {
        let kind = self.state.actions[k as usize].kind;
        let (status, answer, payment_to, captured) = match (how, kind) {
            (Settlement::Outcome(Outcome::Captured(amount)), ActionKind::Capture) => {
                (OpStatus::Succeeded, Answer::Captured, PaymentStatus::Succeeded, Some(amount))
            }
            (Settlement::Outcome(Outcome::Captured(amount)), ActionKind::Void) => {
                (OpStatus::Failed, Answer::InvalidState, PaymentStatus::Succeeded, Some(amount))
            }
            (Settlement::Outcome(Outcome::Voided), ActionKind::Void) => {
                (OpStatus::Succeeded, Answer::Voided, PaymentStatus::Canceled, None)
            }
            (Settlement::Outcome(Outcome::Voided | Outcome::Expired), _) => {
                (OpStatus::Failed, Answer::AuthorizationExpired, PaymentStatus::Canceled, None)
            }
            (Settlement::Outcome(Outcome::Declined), _) => {
                (OpStatus::Failed, Answer::CaptureDeclined, PaymentStatus::RequiresCapture, None)
            }
            (Settlement::GaveUp, _) => {
                (OpStatus::Failed, Answer::ActionFailed, PaymentStatus::RequiresCapture, None)
            }
            _ => unreachable!("not an outcome of a capture or void: {how:?}"),
        };
        self.state.actions[k as usize].status = status;
        // `moved_payment`: only a payment still `processing`.
        if self.state.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::Processing) {
            let payment = self.payment();
            payment.status = payment_to;
            if let Some(amount) = captured {
                payment.captured = amount;
            }
            let order_to = match payment_to {
                PaymentStatus::Succeeded => Some(OrderStatus::Paid),
                PaymentStatus::Canceled => Some(OrderStatus::PendingPayment),
                _ => None,
            };
            match payment_to {
                PaymentStatus::Succeeded => self.write(Subject::Payment, EventType::PaymentSucceeded),
                PaymentStatus::Canceled => self.write(Subject::Payment, EventType::PaymentCanceled),
                _ => {}
            }
            if let Some(to) = order_to
                && self.state.order == OrderStatus::Authorized
            {
                self.state.order = to;
                if to == OrderStatus::Paid {
                    self.write(Subject::Order, EventType::OrderPaid);
                }
            }
        }
        answer
    }

    /// `refunds/settle_refund.sql` (via `operations::refund::settle_on`).
    fn settle_refund(&mut self, k: u8, how: Settlement) -> Answer {
        let refund = &mut self.state.refunds[k as usize];
        let amount = refund.amount;
        let system = refund.system();
        let succeeded = how == Settlement::Outcome(Outcome::RefundSucceeded);
        refund.status = if succeeded { OpStatus::Succeeded } else { OpStatus::Failed };
        if how == Settlement::GaveUp {
            refund.gave_up = true;
            if !self.config.mutated(Mutation::NoLateRefundWatch) {
                refund.watch = RefundWatch::Watching;
            }
        }
        let payment = self.payment();
        payment.refunding = payment.refunding.saturating_sub(amount);
        if succeeded {
            payment.refunded += amount;
        }
        let event = if succeeded { EventType::RefundSucceeded } else { EventType::RefundFailed };
        self.write(Subject::Refund(k), event);
        if succeeded {
            if system {
                self.write(Subject::Payment, EventType::PaymentLateChargeRefunded);
            } else {
                self.move_order_by_amounts(false);
            }
        }
        if system {
            self.late_charge_follows();
        }
        if succeeded { Answer::RefundSucceeded } else { Answer::RefundFailed }
    }

    /// `disputes/settle_response.sql` (in `dispute_response::settle_in`, after the provider's
    /// dispute was recorded): `succeeded` when the provider took it (200, the dispute), `failed`
    /// when the dispute moved on without it (409, stored) or when given up on.
    fn settle_response(&mut self, k: u8, how: Settlement) -> Answer {
        let (status, answer) = match how {
            Settlement::Outcome(Outcome::ResponseTaken(_)) => (OpStatus::Succeeded, Answer::ResponseTaken),
            Settlement::Outcome(Outcome::ResponseRefused(_)) => (OpStatus::Failed, Answer::InvalidState),
            Settlement::GaveUp => (OpStatus::Failed, Answer::ResponseFailed),
            _ => unreachable!("not an outcome of a dispute response: {how:?}"),
        };
        self.state.responses[k as usize].status = status;
        answer
    }

    /// A client refund's order: `refunded` once everything captured is refunded, else
    /// `partially_refunded`; a correction may bring it back to `paid`. Writes the order's event
    /// for its new status.
    fn move_order_by_amounts(&mut self, correction: bool) {
        let from = self.state.order;
        let movable = matches!(from, OrderStatus::Paid | OrderStatus::PartiallyRefunded)
            || (correction && from == OrderStatus::Refunded);
        if !movable {
            return;
        }
        let payment = self.state.payment.as_ref().expect("a refund's payment");
        let to = if payment.refunded >= payment.captured {
            OrderStatus::Refunded
        } else if payment.refunded == 0 {
            OrderStatus::Paid
        } else {
            OrderStatus::PartiallyRefunded
        };
        self.state.order = to;
        if let Some(event) = order_event(to) {
            self.write(Subject::Order, event);
        }
    }

    /// After a system refund settles or is corrected: what the late charge needs next. A new
    /// system refund is due only once no earlier one may still be carried out (none alive, and
    /// every one given up on seen absent by its watch); after `system_refunds` of them, a
    /// person.
    pub fn late_charge_follows(&mut self) {
        let limit = self.config.system_refunds;
        let no_retry = self.mutated(Mutation::NoSystemRefundRetry);
        let undecided = self.state.refunds.iter().any(|r| {
            r.system()
                && (r.status == OpStatus::Processing
                    || (r.status == OpStatus::Failed && r.gave_up && r.watch == RefundWatch::Watching))
        });
        let payment = self.payment();
        if payment.status != PaymentStatus::Failed
            || !matches!(
                payment.late,
                LateCharge::Refunding | LateCharge::RefundDue | LateCharge::Refunded | LateCharge::Person
            )
        {
            return;
        }
        payment.late = if payment.refunded >= payment.captured {
            LateCharge::Refunded
        } else if undecided || no_retry {
            LateCharge::Refunding
        } else if payment.system_refunds < limit {
            LateCharge::RefundDue
        } else {
            LateCharge::Person
        };
    }

    /// The correction of a refund on the provider's confirmed word: failed -> succeeded (carried
    /// out late) or succeeded -> failed (reversed). One statement: the refund, the payment's
    /// `amount_refunded`, the order to what the amounts say, the events (`"correction": true`),
    /// the audit row. The stored answer stays what the client was told.
    ///
    /// A refund carried out late is recorded only within `refunded + refunding + disputed <=
    /// captured` (the CHECK): while another refund holds its reservation, the correction waits
    /// for it to settle, and the watch looks again. A correction to succeeded keeps a check a webhook
    /// asked for after the lookup it acts on.
    pub fn correct_refund(&mut self, k: u8, to: OpStatus) {
        let amount = self.state.refunds[k as usize].amount;
        if to == OpStatus::Succeeded && !self.config.has(Defect::CorrectionOverTheCheck) {
            let payment = self.state.payment.as_ref().expect("a refund's payment");
            if payment.refunded + payment.refunding + payment.disputed + amount > payment.captured {
                return;
            }
        }
        let refund = &mut self.state.refunds[k as usize];
        refund.status = to;
        refund.corrections += 1;
        refund.watch = RefundWatch::Off;
        if to == OpStatus::Failed {
            refund.check = false;
        }
        let system = refund.system();
        let leaves_the_column = self.mutated(Mutation::ReversalLeavesTheColumn);
        let payment = self.payment();
        if to == OpStatus::Succeeded {
            payment.refunded += amount;
        } else if !leaves_the_column {
            payment.refunded = payment.refunded.saturating_sub(amount);
        }
        let event =
            if to == OpStatus::Succeeded { EventType::RefundSucceeded } else { EventType::RefundFailed };
        self.write(Subject::Refund(k), event);
        if system {
            if to == OpStatus::Succeeded {
                self.write(Subject::Payment, EventType::PaymentLateChargeRefunded);
            }
            self.late_charge_follows();
        } else {
            self.move_order_by_amounts(true);
        }
    }

    /// `payments/end_authorization.sql`: an authorization that ended at the provider while
    /// nothing of ours was in flight. Guarded by the payment still `requires_capture`.
    pub fn end_authorization(&mut self, charge: crate::state::ChargeStatus, captured: u8) {
        use crate::state::ChargeStatus as C;
        let waiting = self.state.payment.as_ref().is_some_and(|p| p.status == PaymentStatus::RequiresCapture);
        if !waiting {
            return;
        }
        let (status, order_to, event) = match charge {
            C::Voided | C::Expired => {
                (PaymentStatus::Canceled, OrderStatus::PendingPayment, EventType::PaymentCanceled)
            }
            C::Succeeded => (PaymentStatus::Succeeded, OrderStatus::Paid, EventType::PaymentSucceeded),
            _ => return,
        };
        let payment = self.payment();
        payment.status = status;
        if status == PaymentStatus::Succeeded {
            payment.captured = captured;
        }
        self.write(Subject::Payment, event);
        if self.state.order == OrderStatus::Authorized {
            self.state.order = order_to;
            if order_to == OrderStatus::Paid {
                self.write(Subject::Order, EventType::OrderPaid);
            }
        }
    }

    /// `refunds/start_refund.sql` with no key, for the payment `failed`: the system's refund of
    /// what the late charge holds, leased to `proc` and marked as sent; `proc` drives it.
    pub fn start_system_refund(&mut self, proc: Proc) {
        let payment = self.payment();
        let amount = payment.captured.saturating_sub(payment.refunded + payment.refunding + payment.disputed);
        if payment.status != PaymentStatus::Failed || amount == 0 {
            return;
        }
        payment.refunding += amount;
        payment.system_refunds += 1;
        payment.late = LateCharge::Refunding;
        let k = self.state.refunds.len() as u8;
        self.state.refunds.push(Refund::started(None, amount, proc));
        self.state.provider.refunds.push(None);
        self.state.set_pc(proc, Pc::Drive { op: Op::Refund(k), mode: Mode::FirstCall, stage: Stage::Marked });
    }

    /// `operations::late_charge::take_back` of a captured charge: `record_late_charge` (guarded by
    /// `late_charge_amount IS NULL`) and the system refund's start, in one transaction.
    pub fn take_back(&mut self, proc: Proc) -> bool {
        let total = self.config.total;
        let payment = self.payment();
        if payment.status != PaymentStatus::Failed || payment.late != LateCharge::Watching {
            return false;
        }
        payment.captured = total;
        payment.charge_known = true;
        self.start_system_refund(proc);
        true
    }

    /// A client request's start statement (after `claim_key.sql`) for a new key, or the
    /// existing operation a key names. `read`: what the mutant's unlocked read saw.
    pub fn request(&mut self, i: u8, read: Option<(bool, u8)>) {
        let me = Proc::Client(i);
        self.state.set_pc(me, Pc::Idle);
        match self.state.keys[i as usize] {
            Key::Stored(answer) => self.tell(i, answer),
            Key::Names(op) => self.existing(i, op),
            Key::Free => match self.config.intents[i as usize] {
                crate::config::Intent::Pay => self.start_payment(),
                crate::config::Intent::Capture(amount) => {
                    self.start_capture_or_void(i, ActionKind::Capture, amount)
                }
                crate::config::Intent::Void => self.start_capture_or_void(i, ActionKind::Void, 0),
                crate::config::Intent::Refund(amount) => self.start_refund(i, amount, read),
                crate::config::Intent::Respond => unreachable!("a dispute response is `respond`"),
            },
        }
    }

    /// A dispute response's request with intent `i`'s key: the response that key names, or its
    /// start statement.
    pub fn respond(&mut self, i: u8, kind: ResponseKind) {
        self.state.set_pc(Proc::Client(i), Pc::Idle);
        match self.state.keys[i as usize] {
            Key::Stored(answer) => self.tell(i, answer),
            Key::Names(op) => self.existing(i, op),
            Key::Free => self.start_response(i, kind),
        }
    }

    /// `disputes/start_response.sql`, under the dispute's lock: only a dispute that needs a
    /// response takes one (else 409 `invalid-state`, stored: it never needs one again), and one
    /// response is in flight per dispute (else 409 in progress, not stored). Evidence past its
    /// due date is not modelled (time is abstracted). The response `processing`, leased to the
    /// request, marked as being sent now.
    fn start_response(&mut self, i: u8, kind: ResponseKind) {
        let Some(dispute) = self.state.dispute else {
            // 404: not reached (the merchant answers a dispute it sees).
            return;
        };
        if !dispute.needs_response() {
            self.state.keys[i as usize] = Key::Stored(Answer::InvalidState);
            self.tell(i, Answer::InvalidState);
            return;
        }
        if self.state.responses.iter().any(|r| r.status == OpStatus::Processing) {
            return;
        }
        let k = self.state.responses.len() as u8;
        let row = Row::started(Proc::Client(i));
        self.state.responses.push(Response { intent: i, kind, status: OpStatus::Processing, row });
        self.state.provider.responses.push(None);
        self.state.ghost.responses_taken.push(0);
        self.state.keys[i as usize] = Key::Names(Op::Response(k));
        self.state.set_pc(
            Proc::Client(i),
            Pc::Drive { op: Op::Response(k), mode: Mode::FirstCall, stage: Stage::Marked },
        );
    }

    /// `operations::request::existing_key`: the answer if it has one, 409 while a live driver
    /// holds it, else a takeover (`operations::leases::lease`, `LeaseTarget::One`).
    fn existing(&mut self, i: u8, op: Op) {
        let me = Proc::Client(i);
        self.state.keys[i as usize] = Key::Names(op);
        if let Some(answer) = self.state.answer(op) {
            self.tell(i, answer);
        } else if self.state.in_flight(op) && self.state.row(op).lease.takeable() {
            self.state.row_mut(op).lease = Lease::Held(me);
            self.state.set_pc(me, Pc::Drive { op, mode: Mode::Redrive, stage: Stage::Look });
        }
        // Else 409 `idempotency-key-in-use`, not stored.
    }

    /// `payments/start_payment.sql`: the payment `processing`, leased to the request, marked as
    /// being sent now.
    fn start_payment(&mut self) {
        if self.state.payment.is_some() || self.state.order != OrderStatus::PendingPayment {
            // One payment per order in this model: not reached.
            return;
        }
        self.state.payment = Some(Payment {
            status: PaymentStatus::Processing,
            row: Row::started(Proc::Client(0)),
            charge_known: false,
            captured: 0,
            refunded: 0,
            refunding: 0,
            late: LateCharge::Off,
            system_refunds: 0,
            resolved: false,
            disputed: 0,
        });
        self.state.keys[0] = Key::Names(Op::Charge);
        self.state.set_pc(
            Proc::Client(0),
            Pc::Drive { op: Op::Charge, mode: Mode::FirstCall, stage: Stage::Marked },
        );
    }

    /// `payments/start_capture_or_void.sql`: only an authorized payment; it goes `processing`
    /// while the operation is in flight.
    fn start_capture_or_void(&mut self, i: u8, kind: ActionKind, amount: u8) {
        let status = self.state.payment.as_ref().map(|p| p.status);
        if status != Some(PaymentStatus::RequiresCapture) {
            self.state.keys[i as usize] = Key::Stored(Answer::InvalidState);
            self.tell(i, Answer::InvalidState);
            return;
        }
        self.payment().status = PaymentStatus::Processing;
        let k = self.state.actions.len() as u8;
        self.state.actions.push(Action {
            intent: i,
            kind,
            amount,
            status: OpStatus::Processing,
            row: Row::started(Proc::Client(i)),
        });
        self.state.provider.actions.push(None);
        self.state.keys[i as usize] = Key::Names(Op::Action(k));
        self.state.set_pc(
            Proc::Client(i),
            Pc::Drive { op: Op::Action(k), mode: Mode::FirstCall, stage: Stage::Marked },
        );
    }

    /// `refunds/start_refund.sql`: a refund whose key names one of the payment's refunds (live,
    /// or past the key's lifetime) answers that refund; else the payment must have succeeded,
    /// and the amount, read under the payment's lock, must be refundable (captured, less
    /// refunded, refunding and disputed): reserved, and the refund `processing`.
    fn start_refund(&mut self, i: u8, amount: u8, read: Option<(bool, u8)>) {
        if let Some(k) = self.state.refunds.iter().position(|r| r.intent == Some(i)) {
            self.existing(i, Op::Refund(k as u8));
            return;
        }
        let (succeeded, refundable) = read.unwrap_or_else(|| refundable(self.config, &self.state));
        if !succeeded {
            self.state.keys[i as usize] = Key::Stored(Answer::InvalidState);
            self.tell(i, Answer::InvalidState);
            return;
        }
        if amount > refundable {
            // 422 `refund-exceeds-refundable`, or 409 `charge-disputed` while a dispute is open;
            // not stored: the key is cleared.
            if self.state.dispute.is_some_and(Dispute::open) {
                self.state.ghost.refused_for_dispute = true;
            }
            return;
        }
        self.payment().refunding += amount;
        let k = self.state.refunds.len() as u8;
        self.state.refunds.push(Refund::started(Some(i), amount, Proc::Client(i)));
        self.state.provider.refunds.push(None);
        self.state.keys[i as usize] = Key::Names(Op::Refund(k));
        self.state.set_pc(
            Proc::Client(i),
            Pc::Drive { op: Op::Refund(k), mode: Mode::FirstCall, stage: Stage::Marked },
        );
    }

    /// `disputes::record::record_on` (after `lock_payment_of_charge`) and
    /// `disputes/record_dispute.sql`: the dispute `seen` (a lookup's or a listing's; a webhook's
    /// word only under the mutant) inserted when we lack it, else moved under its guard: `won`
    /// and `lost` never change, an open one moves to either or stays open, and its money only
    /// grows. The payment's `amount_disputed` moves by the same amount, unless that does not fit
    /// beside what is refunded and reserved for refunds (`does_not_fit`: nothing is written).
    pub fn record_dispute(&mut self, seen: Dispute) -> Recorded {
        let Some(payment) = self.state.payment.as_ref().filter(|p| p.charge_known) else {
            return Recorded::NotOurs;
        };
        let room = payment.captured as i16
            - payment.refunded as i16
            - payment.refunding as i16
            - payment.disputed as i16;
        let held = self.state.dispute;
        let delta = seen.net() as i16 - held.map_or(0, |d| d.net() as i16);
        let outcome = match held {
            None if delta <= room => Recorded::Created,
            None => Recorded::DoesNotFit,
            Some(held) if held == seen => Recorded::Unchanged,
            Some(held) if !dispute_may_move(held, seen) && !self.mutated(Mutation::DisputeWithoutGuard) => {
                Recorded::Refused
            }
            Some(_) if delta > room => Recorded::DoesNotFit,
            Some(_) => Recorded::Updated,
        };
        match outcome {
            Recorded::Created | Recorded::Updated => {
                self.state.dispute = Some(seen);
                let payment = self.payment();
                payment.disputed = (payment.disputed as i16 + delta) as u8;
            }
            Recorded::DoesNotFit => self.state.ghost.dispute_waited = true,
            _ => {}
        }
        outcome
    }

    /// A final answer reaches client `i`: the same key must always answer the same.
    pub fn tell(&mut self, i: u8, answer: Answer) {
        match self.state.ghost.told[i as usize] {
            Some(told) if told != answer => {
                self.state.ghost.broken.get_or_insert(crate::state::Broken::AnswerChanged);
            }
            _ => self.state.ghost.told[i as usize] = Some(answer),
        }
    }
}

/// What a refund's start reads of the payment: whether it succeeded, and what is refundable.
pub fn refundable(config: &Config, state: &State) -> (bool, u8) {
    let disputes_count = !config.mutated(Mutation::RefundIgnoresDisputes);
    match &state.payment {
        Some(p) => {
            let disputed = if disputes_count { p.disputed } else { 0 };
            (
                p.status == PaymentStatus::Succeeded,
                p.captured.saturating_sub(p.refunded + p.refunding + disputed),
            )
        }
        None => (false, 0),
    }
}

/// What recording a dispute did (`RecordOutcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Created,
    Updated,
    Unchanged,
    /// The guard refused the move: nothing written.
    Refused,
    /// Its money does not fit beside a refund's reservation: nothing written, a later pass
    /// records it.
    DoesNotFit,
    /// Its charge is no payment of ours we know the charge of (`Recorded::NotOurs`).
    NotOurs,
}

/// The guard of `disputes/record_dispute.sql`: a final status never changes; an open dispute
/// only moves forward (`needs_response` to `under_review`, `won` or `lost`; `under_review` to
/// `won` or `lost`) or stays; the money withdrawn and reinstated only grows.
pub fn dispute_may_move(held: Dispute, seen: Dispute) -> bool {
    held.open()
        && seen.status.rank() >= held.status.rank()
        && seen.withdrawn >= held.withdrawn
        && seen.reinstated >= held.reinstated
}
