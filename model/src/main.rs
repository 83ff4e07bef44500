//! `make model`: the unit-sized configurations, the large one, and the mutants, with their state
//! counts and times; or a random walk or a counterexample as JSON steps for a conformance
//! harness.
//!
//! ```text
//! orderpay-model unit | large | mutants | defects
//! orderpay-model walk <unit-config-index> <seed> <max-steps>   # JSON steps on stdout
//! orderpay-model counterexample <mutant-index> [correct]        # JSON steps on stdout
//! ```

use std::process::ExitCode;

use orderpay_model::check::{self, Report};
use orderpay_model::config::Defect;
use orderpay_model::{Config, Mutation, Protocol, trace};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn print_report(config: &Config, report: &Report, pinned: Option<usize>) -> bool {
    println!(
        "{}: {} unique states, depth {}, {:.1} s",
        config.name,
        report.unique_states,
        report.max_depth,
        report.elapsed.as_secs_f64()
    );
    let mut ok = report.failures.is_empty();
    for (property, trace) in &report.failures {
        println!("  FAILED: {property}\n{trace}");
    }
    if let Some(pinned) = pinned
        && pinned != report.unique_states
    {
        println!("  the pinned count is {pinned}: the state space changed; re-pin it if that is meant");
        ok = false;
    }
    ok
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
    let ok = match args.first().map(String::as_str) {
        Some("unit") => Config::unit()
            .iter()
            .zip(orderpay_model::UNIT_UNIQUE_STATES)
            .map(|(config, pinned)| print_report(config, &check::check(config, threads()), Some(pinned)))
            .collect::<Vec<bool>>()
            .into_iter()
            .all(|ok| ok),
        Some("large") => {
            let config = Config::large();
            print_report(
                &config,
                &check::check(&config, threads()),
                Some(orderpay_model::LARGE_UNIQUE_STATES),
            )
        }
        Some("mutants") => {
            let configs = Mutation::ALL.map(|m| (m.name(), Config::for_mutation(m)));
            table("mutant", &configs)
        }
        Some("defects") => {
            let configs = Defect::ALL.map(|d| (d.name(), Config::for_defect(d)));
            table("defect found in the service (the model has it fixed)", &configs)
        }
        Some("walk") => match (arg(1), arg(2), arg(3)) {
            (Some(index), Some(seed), Some(steps)) => {
                let mut configs = Config::unit();
                configs.push(Config::large());
                let Some(config) = configs.into_iter().nth(index as usize) else {
                    eprintln!("no unit configuration {index}");
                    return ExitCode::FAILURE;
                };
                let protocol = Protocol::new(config);
                let path = trace::random_walk(&protocol, seed, steps as usize);
                println!(
                    "{}",
                    serde_json::to_string_pretty(&trace::records(&protocol, &path)).expect("JSON")
                );
                true
            }
            _ => usage(),
        },
        Some("counterexample") => match arg(1).and_then(|i| Mutation::ALL.get(i as usize)) {
            Some(&mutation) => match check::kill(mutation) {
                Some(killed) => {
                    let mutated = Config::for_mutation(mutation);
                    let records = if args.get(2).is_some_and(|a| a == "correct") {
                        // The same steps with the mutation switched off, as far as they go.
                        trace::replay(&Protocol::new(Config { mutation: None, ..mutated }), &killed.actions)
                    } else {
                        trace::records(&Protocol::new(mutated), &killed.actions)
                    };
                    println!("{}", serde_json::to_string_pretty(&records).expect("JSON"));
                    true
                }
                None => false,
            },
            None => usage(),
        },
        _ => usage(),
    };
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Each configuration's shortest counterexample (breadth first): the property it breaks, its
/// length, and the path, one line per step. False if one keeps every property.
fn table(what: &str, configs: &[(&str, Config)]) -> bool {
    let mut all_broken = true;
    println!("{what:<58} {:<66} {:>5} {:>7} {:>8}", "property broken", "steps", "states", "time");
    for (name, config) in configs {
        match check::shortest_counterexample(config) {
            Some(found) => {
                println!(
                    "{name:<58} {:<66} {:>5} {:>7} {:>6.2} s",
                    found.property,
                    found.actions.len(),
                    found.states,
                    found.elapsed.as_secs_f64()
                );
                print!("{}", check::lines(&Protocol::new(config.clone()), &found.actions));
            }
            None => {
                println!("{name:<58} SURVIVED");
                all_broken = false;
            }
        }
    }
    all_broken
}

fn usage() -> bool {
    eprintln!(
        "usage: orderpay-model unit | large | mutants | walk <config> <seed> <steps> | counterexample <mutant> [correct]"
    );
    false
}
