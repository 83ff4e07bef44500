//! Running the checker: a configuration's full breadth-first search, and a mutant's shortest
//! counterexample.

use std::time::{Duration, Instant};

use stateright::{Checker, Model};

use crate::action::Action;
use crate::config::{Config, Mutation};
use crate::protocol::Protocol;
use crate::state::State;

/// What a full check of one configuration found.
pub struct Report {
    pub unique_states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Properties that failed: `always` with a counterexample, `sometimes` never reached.
    pub failures: Vec<(&'static str, String)>,
}

/// Explores every state of `config` with `threads` threads; a property's failure is kept with
/// its path as readable lines.
pub fn check(config: &Config, threads: usize) -> Report {
    let protocol = Protocol::new(config.clone());
    let started = Instant::now();
    let checker = protocol.clone().checker().threads(threads).spawn_bfs();
    let progress = std::env::var_os("ORDERPAY_MODEL_PROGRESS").is_some();
    while !checker.is_done() {
        std::thread::sleep(Duration::from_millis(200));
        if progress && started.elapsed().as_millis() % 10_000 < 200 {
            eprintln!(
                "  {} states, depth {}, {:.0} s",
                checker.unique_state_count(),
                checker.max_depth(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let checker = checker.join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let mut failures = Vec::new();
    for property in protocol.properties() {
        let found = discoveries.get(property.name);
        let failed = match property.expectation {
            stateright::Expectation::Sometimes => found.is_none(),
            _ => found.is_some(),
        };
        if failed {
            let trace = found.map(|path| lines(&protocol, &path.clone().into_actions())).unwrap_or_default();
            failures.push((property.name, trace));
        }
    }
    failures.sort();
    Report { unique_states: checker.unique_state_count(), max_depth: checker.max_depth(), elapsed, failures }
}

/// A mutant's shortest counterexample: the property it breaks and the path's actions.
pub struct Killed {
    pub property: &'static str,
    pub actions: Vec<Action>,
    /// States visited before it was found.
    pub states: usize,
    pub elapsed: Duration,
}

/// The shortest path to a state that breaks an `always` property of `config`, by a plain
/// breadth-first search level by level (exact, single-threaded). `None`: every reachable state
/// keeps every `always` property.
pub fn shortest_counterexample(config: &Config) -> Option<Killed> {
    use std::collections::HashMap;
    let protocol = Protocol::new(config.clone());
    let started = Instant::now();
    let always: Vec<_> = protocol
        .properties()
        .into_iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .collect();
    let broken = |state: &State| always.iter().find(|p| !(p.condition)(&protocol, state)).map(|p| p.name);
    let initial = protocol.initial();
    let mut parents: HashMap<State, Option<(State, Action)>> = HashMap::new();
    parents.insert(initial.clone(), None);
    let mut level = vec![initial];
    let mut enabled = Vec::new();
    while !level.is_empty() {
        let mut next = Vec::new();
        for state in &level {
            if let Some(property) = broken(state) {
                let mut actions = Vec::new();
                let mut at = state.clone();
                while let Some(Some((parent, action))) = parents.get(&at) {
                    actions.push(*action);
                    at = parent.clone();
                }
                actions.reverse();
                let states = parents.len();
                return Some(Killed { property, actions, states, elapsed: started.elapsed() });
            }
            enabled.clear();
            protocol.actions(state, &mut enabled);
            for &action in &enabled {
                let after = protocol.apply(state, action);
                if !parents.contains_key(&after) {
                    parents.insert(after.clone(), Some((state.clone(), action)));
                    next.push(after);
                }
            }
        }
        level = next;
    }
    None
}

/// Kills `mutation` in its configuration; `None`: it survived.
pub fn kill(mutation: Mutation) -> Option<Killed> {
    shortest_counterexample(&Config::for_mutation(mutation))
}

/// A path as readable lines, one per step, in the service's terms.
pub fn lines(protocol: &Protocol, actions: &[Action]) -> String {
    let mut state: State = protocol.initial();
    let mut out = String::new();
    for (index, &action) in actions.iter().enumerate() {
        out.push_str(&format!("  {:>2}. {}\n", index + 1, crate::trace::describe(protocol, &state, action)));
        state = protocol.apply(&state, action);
    }
    out
}
