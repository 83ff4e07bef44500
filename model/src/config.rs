//! What a check explores: the client's intents, the drivers, and budgets for every fault and
//! provider behaviour, which keep the state space finite; and the mutants, seeded bugs each a
//! switch of the model.

use serde::Serialize;

/// A client's intent: one `Idempotency-Key`, sent once and retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Intent {
    /// `POST /payments` for the order.
    Pay,
    /// `POST /payments/{id}/capture` of this amount.
    Capture(u8),
    /// `POST /payments/{id}/void`.
    Void,
    /// `POST /refunds` of this amount.
    Refund(u8),
    /// `POST /disputes/{id}/evidence` or `/accept` for the payment's dispute, once the merchant
    /// sees it recorded: which of the two is the request's choice.
    Respond,
}

/// `capture_method` of the payment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum CaptureMethod {
    Automatic,
    Manual,
}

/// A seeded bug: the model with one guard or one step of the protocol taken out. The checker
/// must find a property it breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Mutation {
    /// A give-up applies while a send may still be in flight: no `last_send_at` guard in the
    /// settle statements.
    NoInFlightGuard,
    /// A system refund of a late charge that fails is not followed by another.
    NoSystemRefundRetry,
    /// No late-refund watch: a refund given up on and carried out later is never recorded.
    NoLateRefundWatch,
    /// A settle statement without its `status = 'processing'` guard.
    SettleWithoutStatusGuard,
    /// The refund's start statement reads what is refundable before it holds the payment's
    /// lock.
    StartReadsWithoutLock,
    /// A provider webhook applied on its word: corrections, cancels and captures without the
    /// provider's confirmation by a lookup.
    WebhookOnItsWord,
    /// The refund's start statement reads what is refundable without `amount_disputed`.
    RefundIgnoresDisputes,
    /// `record_dispute.sql` without its guard: whatever the provider said last is written.
    DisputeWithoutGuard,
    /// A dispute webhook recorded as its event says, without the lookup of the dispute. Not in
    /// [`Mutation::ALL`]: it survives, because `record_dispute.sql`'s guard already refuses
    /// every stale word (see [`Mutation::SURVIVORS`]).
    DisputeWebhookOnItsWord,
    /// The dispute response's lookup (`dispute_state`) counts evidence as taken whenever the
    /// dispute no longer needs a response, without checking that it holds our evidence.
    EvidenceTakenOnAnyMove,
    /// A refund's correction to failed (the provider reversed it) moves the refund's status,
    /// and so writes the ledger's `refund_reversal`, but not the payment's `amount_refunded`.
    ReversalLeavesTheColumn,
    /// The charge's lookup by our key can miss a charge the provider made, read as "never
    /// received": an eventually consistent search (Stripe's Search API) still indexing it, or a
    /// listing whose window misses the charge (clocks apart by more than the slack). The
    /// service's lookup is exact (Stripe's List is strongly consistent, its window from five
    /// minutes before our id to five minutes after our last send); this mutant is what either
    /// would cost.
    LookupMissesACharge,
}

impl Mutation {
    pub const ALL: [Mutation; 11] = [
        Mutation::NoInFlightGuard,
        Mutation::NoSystemRefundRetry,
        Mutation::NoLateRefundWatch,
        Mutation::SettleWithoutStatusGuard,
        Mutation::StartReadsWithoutLock,
        Mutation::WebhookOnItsWord,
        Mutation::RefundIgnoresDisputes,
        Mutation::DisputeWithoutGuard,
        Mutation::EvidenceTakenOnAnyMove,
        Mutation::ReversalLeavesTheColumn,
        Mutation::LookupMissesACharge,
    ];

    /// Mutants no property kills, each kept so that the reason stays checked: a dispute's
    /// webhook is a true snapshot of the provider's dispute, only possibly an old one, and the
    /// guard (a decided dispute never changes, money only grows) makes every record a step
    /// forward along the provider's own history; an open one we hold is looked at again by the
    /// pass. Without the lookup the books lag longer, never differ at rest.
    pub const SURVIVORS: [Mutation; 1] = [Mutation::DisputeWebhookOnItsWord];

    pub fn name(self) -> &'static str {
        match self {
            Mutation::NoInFlightGuard => "no in-flight guard on give-up",
            Mutation::NoSystemRefundRetry => "no retry of a failed system refund",
            Mutation::NoLateRefundWatch => "no late-refund watch",
            Mutation::SettleWithoutStatusGuard => "a settle without its status guard",
            Mutation::StartReadsWithoutLock => "a start that reads the refundable amount without its lock",
            Mutation::WebhookOnItsWord => "a webhook applied on its word",
            Mutation::RefundIgnoresDisputes => "a refund start that ignores what disputes withdrew",
            Mutation::DisputeWithoutGuard => "a dispute recorded without its guard",
            Mutation::DisputeWebhookOnItsWord => "a dispute webhook recorded on its word",
            Mutation::EvidenceTakenOnAnyMove => "evidence counted as taken once the dispute moved on",
            Mutation::ReversalLeavesTheColumn => "a reversal that leaves amount_refunded as it was",
            Mutation::LookupMissesACharge => "a lookup that misses a charge (search lag, a short window)",
        }
    }
}

/// A defect the checker found in the protocol as the service implements it (or in the design
/// of a fix it is getting), each a switch that puts that behaviour back into the model, where
/// it breaks a property. The model without them is the protocol as it must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Defect {
    /// The give-up's guard is evaluated at its settle (`last_send_at` against
    /// `clock_timestamp()` in `settle_payment.sql` and the other settles), not at its lookup: a
    /// lookup that found nothing while a send could still land is given up on once that send is
    /// quiet, though the provider acted in between.
    GiveUpOnAStaleLookup,
    /// `orderpay payments resolve --as failed` without `--force` settles a payment whose send
    /// may still be in flight: `Resolved(Failed)` has no quiet guard.
    OperatorFailsOverASendInFlight,
    /// A `refund.failed` webhook for a refund we hold as failed is ignored, while the
    /// late-refund watch may still act on an older lookup that saw it succeeded.
    ReversalIgnoredWhileWatched,
    /// A late refund's correction is applied whatever another refund holds reserved: it breaks
    /// `amount_refunded + amount_refunding <= amount_captured` (the CHECK fires).
    CorrectionOverTheCheck,
}

impl Defect {
    pub const ALL: [Defect; 4] = [
        Defect::GiveUpOnAStaleLookup,
        Defect::OperatorFailsOverASendInFlight,
        Defect::ReversalIgnoredWhileWatched,
        Defect::CorrectionOverTheCheck,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Defect::GiveUpOnAStaleLookup => "a give-up on a lookup taken while a send could land",
            Defect::OperatorFailsOverASendInFlight => "resolve --as failed over a send in flight",
            Defect::ReversalIgnoredWhileWatched => "a reversal's webhook ignored while the refund is watched",
            Defect::CorrectionOverTheCheck => "a late refund's correction over another's reservation",
        }
    }
}

/// How many times each fault or provider behaviour may happen on one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Faults {
    /// A process dies between two statements.
    pub crashes: u8,
    /// The provider acts on a request later than the provider timeout plus the margin.
    pub late: u8,
    /// The provider declines a charge, a capture or a refund.
    pub declines: u8,
    /// The provider answers `pending` to a charge or a refund, and settles it later.
    pub pending: u8,
    /// A refund that succeeded is reversed.
    pub reversals: u8,
    /// An authorization expires.
    pub expiries: u8,
    /// A provider webhook is delivered again (after its dedup row was swept).
    pub duplicates: u8,
    /// A live driver's lease runs out mid-call (a dead driver's always may).
    pub lease_runs_out: u8,
    /// A refund's key expires (swept past its retention).
    pub key_expiries: u8,
    /// The customer's bank disputes the captured charge.
    pub disputes: u8,
}

impl Faults {
    pub const NONE: Faults = Faults {
        crashes: 0,
        late: 0,
        declines: 0,
        pending: 0,
        reversals: 0,
        expiries: 0,
        duplicates: 0,
        lease_runs_out: 0,
        key_expiries: 0,
        disputes: 0,
    };
}

/// One configuration of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Config {
    pub name: &'static str,
    /// The order's total, in units.
    pub total: u8,
    pub capture_method: CaptureMethod,
    /// The client's intents; the first is always `Pay`.
    pub intents: Vec<Intent>,
    /// Requests per key: the first and its retries.
    pub requests_per_key: u8,
    pub reconcilers: u8,
    /// `ORDERPAY_RECONCILE_MAX_ATTEMPTS`: the check at this attempt only looks, and gives up on
    /// an operation the provider never received.
    pub max_attempts: u8,
    /// System refunds of one late charge before it is left to a person.
    pub system_refunds: u8,
    /// An operator resolves the payment by hand (once).
    pub operator: bool,
    /// The provider sends webhooks.
    pub webhooks: bool,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
    pub defect: Option<Defect>,
}

impl Config {
    pub fn mutated(&self, mutation: Mutation) -> bool {
        self.mutation == Some(mutation)
    }

    pub fn has(&self, defect: Defect) -> bool {
        self.defect == Some(defect)
    }

    pub fn manual(&self) -> bool {
        self.capture_method == CaptureMethod::Manual
    }

    pub fn with_mutation(&self, mutation: Mutation) -> Config {
        Config { mutation: Some(mutation), ..self.clone() }
    }

    pub fn refund_intents(&self) -> usize {
        self.intents.iter().filter(|i| matches!(i, Intent::Refund(_))).count()
    }

    /// An automatic payment, a refund and its retry (its key may expire in between), one
    /// reconciler; the charge or the refund may land late, the provider may decline once and
    /// reverse a refund once; webhooks: the late-charge and late-refund paths, the corrections.
    pub fn unit_charges() -> Config {
        Config {
            name: "unit: a charge, a refund, late charges and refunds",
            total: 2,
            capture_method: CaptureMethod::Automatic,
            intents: vec![Intent::Pay, Intent::Refund(2)],
            requests_per_key: 2,
            reconcilers: 1,
            max_attempts: 1,
            system_refunds: 2,
            operator: false,
            webhooks: true,
            faults: Faults { late: 1, declines: 1, reversals: 1, key_expiries: 1, ..Faults::NONE },
            mutation: None,
            defect: None,
        }
    }

    /// A manual payment with a capture and a void racing, an authorization that may expire, a
    /// crash and a lease running out.
    pub fn unit_authorizations() -> Config {
        Config {
            name: "unit: an authorization, a capture and a void",
            total: 2,
            capture_method: CaptureMethod::Manual,
            intents: vec![Intent::Pay, Intent::Capture(1), Intent::Void],
            requests_per_key: 1,
            reconcilers: 1,
            max_attempts: 1,
            system_refunds: 1,
            operator: false,
            webhooks: true,
            faults: Faults { crashes: 1, expiries: 1, lease_runs_out: 1, ..Faults::NONE },
            mutation: None,
            defect: None,
        }
    }

    /// The operator resolving a payment in flight, with a retry and the reconciler racing.
    pub fn unit_operator() -> Config {
        Config {
            name: "unit: an operator's resolution",
            total: 2,
            capture_method: CaptureMethod::Automatic,
            intents: vec![Intent::Pay],
            requests_per_key: 2,
            reconcilers: 1,
            max_attempts: 2,
            system_refunds: 1,
            operator: true,
            webhooks: true,
            faults: Faults { pending: 1, crashes: 1, ..Faults::NONE },
            mutation: None,
            defect: None,
        }
    }

    /// An automatic payment, a refund of all of it, one reconciler, and a dispute that the
    /// provider may open for part or all of what remains and decide either way; webhooks:
    /// the dispute recorded from a webhook (after its lookup) or by the reconciler's pass,
    /// waiting for the refund's reservation or refusing the refund.
    pub fn unit_disputes() -> Config {
        Config {
            name: "unit: a refund and a dispute",
            requests_per_key: 1,
            system_refunds: 1,
            faults: Faults { disputes: 1, ..Faults::NONE },
            ..Config::unit_charges()
        }
    }

    /// An automatic payment, one reconciler, a dispute the provider may open and decide either
    /// way, and the merchant's answer to it (evidence or accept): taken by the provider, refused
    /// (the dispute was decided first), or never received (the provider drops it, within the
    /// same fault budgets as every kind), with its answer possibly lost; looked up by the
    /// reconciler; settled once, recording the provider's dispute. Apart from the disputes'
    /// configuration, whose refund beside the answer blows the space up past what `cargo test`
    /// should explore.
    pub fn unit_responses() -> Config {
        Config {
            name: "unit: a dispute and the merchant's answer",
            intents: vec![Intent::Pay, Intent::Respond],
            webhooks: false,
            faults: Faults { disputes: 1, late: 1, ..Faults::NONE },
            ..Config::unit_disputes()
        }
    }

    /// The configurations `cargo test` checks.
    pub fn unit() -> Vec<Config> {
        vec![
            Config::unit_charges(),
            Config::unit_authorizations(),
            Config::unit_operator(),
            Config::unit_disputes(),
            Config::unit_responses(),
        ]
    }

    /// The large configuration `make model` checks: two reconcilers, two refunds racing a
    /// capture, a crash, the provider late once, duplicate and reordered webhooks.
    pub fn large() -> Config {
        Config {
            name: "large: 2 reconcilers, 2 refunds racing a capture",
            total: 2,
            capture_method: CaptureMethod::Manual,
            intents: vec![Intent::Pay, Intent::Capture(2), Intent::Refund(1), Intent::Refund(1)],
            requests_per_key: 1,
            reconcilers: 2,
            max_attempts: 1,
            system_refunds: 1,
            operator: false,
            webhooks: true,
            faults: Faults { crashes: 1, late: 1, duplicates: 1, ..Faults::NONE },
            mutation: None,
            defect: None,
        }
    }

    /// A configuration in which `defect` breaks a property (and the model without it passes).
    pub fn for_defect(defect: Defect) -> Config {
        let base = match defect {
            Defect::GiveUpOnAStaleLookup => Config {
                name: "defect: give-up",
                intents: vec![Intent::Pay],
                requests_per_key: 1,
                faults: Faults::NONE,
                webhooks: false,
                ..Config::unit_charges()
            },
            Defect::OperatorFailsOverASendInFlight => Config {
                name: "defect: resolve",
                requests_per_key: 1,
                reconcilers: 0,
                faults: Faults::NONE,
                webhooks: false,
                ..Config::unit_operator()
            },
            Defect::ReversalIgnoredWhileWatched | Defect::CorrectionOverTheCheck => Config {
                name: "defect: late refunds",
                intents: vec![Intent::Pay],
                requests_per_key: 1,
                faults: Faults { late: 2, reversals: 1, ..Faults::NONE },
                ..Config::unit_charges()
            },
        };
        Config { defect: Some(defect), ..base }
    }

    /// The smallest configuration in which `mutation` is killed (and the correct model passes).
    pub fn for_mutation(mutation: Mutation) -> Config {
        let base = match mutation {
            Mutation::NoInFlightGuard => Config {
                name: "mutant: give-up",
                intents: vec![Intent::Pay],
                requests_per_key: 1,
                faults: Faults::NONE,
                webhooks: false,
                ..Config::unit_charges()
            },
            Mutation::NoSystemRefundRetry => Config {
                name: "mutant: system refund",
                intents: vec![Intent::Pay],
                requests_per_key: 1,
                faults: Faults { late: 1, declines: 1, ..Faults::NONE },
                webhooks: false,
                ..Config::unit_charges()
            },
            Mutation::NoLateRefundWatch => Config {
                name: "mutant: late refund",
                requests_per_key: 1,
                faults: Faults { late: 1, ..Faults::NONE },
                webhooks: false,
                ..Config::unit_charges()
            },
            Mutation::SettleWithoutStatusGuard => Config {
                name: "mutant: settle",
                intents: vec![Intent::Pay],
                requests_per_key: 1,
                faults: Faults::NONE,
                ..Config::unit_charges()
            },
            Mutation::StartReadsWithoutLock => Config {
                name: "mutant: refund start",
                intents: vec![Intent::Pay, Intent::Refund(1), Intent::Refund(2)],
                requests_per_key: 1,
                faults: Faults::NONE,
                webhooks: false,
                ..Config::unit_charges()
            },
            Mutation::WebhookOnItsWord => Config {
                name: "mutant: webhook",
                requests_per_key: 1,
                faults: Faults { reversals: 1, ..Faults::NONE },
                ..Config::unit_charges()
            },
            Mutation::RefundIgnoresDisputes => {
                Config { name: "mutant: refund beside a dispute", webhooks: false, ..Config::unit_disputes() }
            }
            Mutation::DisputeWithoutGuard => Config {
                name: "mutant: dispute guard",
                intents: vec![Intent::Pay],
                ..Config::unit_disputes()
            },
            // Copies too: a withdrawal's event delivered again after the dispute was won.
            Mutation::DisputeWebhookOnItsWord => Config {
                name: "mutant: dispute webhook",
                faults: Faults { disputes: 1, duplicates: 1, ..Faults::NONE },
                ..Config::unit_disputes()
            },
            Mutation::EvidenceTakenOnAnyMove => Config {
                name: "mutant: dispute response lookup",
                webhooks: false,
                ..Config::unit_responses()
            },
            Mutation::LookupMissesACharge => Config {
                name: "mutant: lookup lag",
                intents: vec![Intent::Pay],
                requests_per_key: 1,
                faults: Faults::NONE,
                webhooks: false,
                ..Config::unit_charges()
            },
            Mutation::ReversalLeavesTheColumn => Config {
                name: "mutant: reversal",
                requests_per_key: 1,
                faults: Faults { reversals: 1, ..Faults::NONE },
                ..Config::unit_charges()
            },
        };
        base.with_mutation(mutation)
    }
}
