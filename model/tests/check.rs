//! The model checked as `cargo test` runs it: the unit-sized configurations in full (every
//! property kept, every path that should be reachable reached, the state counts pinned), each
//! mutant killed where the model without it passes, each defect found in the service breaking
//! a property, and paths exported as the step lists a conformance harness replays.

use orderpay_model::check::{self, shortest_counterexample};
use orderpay_model::config::Defect;
use orderpay_model::properties;
use orderpay_model::{Config, Mutation, Protocol, UNIT_UNIQUE_STATES, trace};

#[test]
fn the_unit_configurations_keep_every_property_and_their_pinned_sizes() {
    for (config, pinned) in Config::unit().iter().zip(UNIT_UNIQUE_STATES) {
        let report = check::check(config, 2);
        let failures: Vec<_> =
            report.failures.iter().map(|(name, trace)| format!("{name}\n{trace}")).collect();
        assert!(failures.is_empty(), "{}: {}", config.name, failures.join("\n"));
        assert_eq!(
            report.unique_states, pinned,
            "{}: the state space changed; re-pin it if that is meant",
            config.name
        );
    }
}

/// Each mutant, the property its shortest counterexample breaks, and that counterexample's
/// length (`make model` prints the same table with the paths).
const MUTANTS: [(Mutation, &str, usize); 11] = [
    (Mutation::NoInFlightGuard, properties::FAILED_HOLDS_NOTHING, 8),
    (Mutation::NoSystemRefundRetry, properties::NOT_KEPT, 15),
    (Mutation::NoLateRefundWatch, properties::BOOKS, 14),
    (Mutation::SettleWithoutStatusGuard, properties::EVENTS, 6),
    (Mutation::StartReadsWithoutLock, properties::WITHIN_CAPTURED, 9),
    (Mutation::WebhookOnItsWord, properties::FINAL_STATES, 11),
    (Mutation::RefundIgnoresDisputes, properties::WITHIN_CAPTURED, 9),
    (Mutation::DisputeWithoutGuard, properties::DISPUTE_GUARD, 10),
    (Mutation::EvidenceTakenOnAnyMove, properties::RESPONSE_TAKEN, 14),
    (Mutation::ReversalLeavesTheColumn, properties::LEDGER, 13),
    (Mutation::LookupMissesACharge, properties::FAILED_HOLDS_NOTHING, 9),
];

#[test]
fn every_mutant_is_killed_where_the_model_without_it_passes() {
    for (mutation, property, steps) in MUTANTS {
        let killed = check::kill(mutation).unwrap_or_else(|| panic!("{} survived", mutation.name()));
        assert_eq!((killed.property, killed.actions.len()), (property, steps), "{}", mutation.name());
        let correct = Config { mutation: None, ..Config::for_mutation(mutation) };
        let report = check::check(&correct, 2);
        assert!(report.failures.is_empty(), "{} without the mutant: {:?}", mutation.name(), report.failures);
    }
}

/// A full search of the disputes' unit configuration with each survivor (`Mutation::SURVIVORS`
/// says why they survive): a survivor that starts being killed belongs in `Mutation::ALL`.
#[test]
fn every_survivor_still_survives() {
    for mutation in Mutation::SURVIVORS {
        assert!(
            check::kill(mutation).is_none(),
            "{} is killed now: move it to Mutation::ALL",
            mutation.name()
        );
    }
}

#[test]
fn every_defect_found_in_the_service_breaks_a_property_the_model_keeps() {
    let expected = [
        (Defect::GiveUpOnAStaleLookup, properties::FAILED_HOLDS_NOTHING),
        (Defect::OperatorFailsOverASendInFlight, properties::FAILED_HOLDS_NOTHING),
        (Defect::ReversalIgnoredWhileWatched, properties::BOOKS),
        (Defect::CorrectionOverTheCheck, properties::WITHIN_CAPTURED),
    ];
    for (defect, property) in expected {
        let config = Config::for_defect(defect);
        let found =
            shortest_counterexample(&config).unwrap_or_else(|| panic!("{} breaks nothing", defect.name()));
        assert_eq!(found.property, property, "{}", defect.name());
        let fixed = Config { defect: None, ..config };
        assert!(shortest_counterexample(&fixed).is_none(), "{} without the defect", defect.name());
    }
}

#[test]
fn a_counterexample_reads_as_the_service_s_statements() {
    let killed = check::kill(Mutation::NoInFlightGuard).expect("killed");
    let protocol = Protocol::new(Config::for_mutation(Mutation::NoInFlightGuard));
    let lines = check::lines(&protocol, &killed.actions);
    assert_eq!(lines.lines().count(), killed.actions.len());
    for statement in
        ["payments/start_payment.sql", "operations::leases::lease", "payments/settle_payment.sql"]
    {
        assert!(lines.contains(statement), "{statement} missing from\n{lines}");
    }
}

#[test]
fn a_counterexample_replayed_without_its_mutation_stops_where_the_guard_forbids() {
    let killed = check::kill(Mutation::NoInFlightGuard).expect("killed");
    let correct = Config { mutation: None, ..Config::for_mutation(Mutation::NoInFlightGuard) };
    let replayed = trace::replay(&Protocol::new(correct), &killed.actions);
    assert!(replayed.len() < killed.actions.len(), "the give-up is not enabled without the mutant");
    let last = &replayed.last().expect("steps").state;
    assert!(
        properties::for_config(&Config::for_mutation(Mutation::NoInFlightGuard))
            .iter()
            .filter(|p| p.expectation == stateright::Expectation::Always)
            .all(|p| (p.condition)(&Protocol::new(Config::for_mutation(Mutation::NoInFlightGuard)), last))
    );
}

#[test]
fn a_random_walk_exports_as_steps_whose_states_follow_from_their_actions() {
    let protocol = Protocol::new(Config::unit_charges());
    let (seed, walk) = (1..100)
        .map(|seed| (seed, trace::random_walk(&protocol, seed, 60)))
        .find(|(_, walk)| walk.len() > 20)
        .expect("a walk of more than 20 steps");
    assert_eq!(walk, trace::random_walk(&protocol, seed, 60), "the same seed, the same walk");
    let records = trace::records(&protocol, &walk);
    let mut state = protocol.initial();
    for (record, action) in records.iter().zip(&walk) {
        state = protocol.apply(&state, *action);
        assert_eq!(record.state, state, "step {}", record.step);
    }
    let json: serde_json::Value = serde_json::to_value(&records).expect("JSON");
    let steps = json.as_array().expect("a list of steps");
    assert_eq!(steps.len(), walk.len());
    assert!(steps.iter().all(|step| step["statement"].is_string() && step["state"]["order"].is_string()));
}
