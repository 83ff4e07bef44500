//! A model of orderpay's payment protocol, checked exhaustively with Stateright: every
//! interleaving of the drivers (a client's request and its retries, reconcilers with their
//! watches, the provider's webhooks, an operator), of the provider (acting now, later, never,
//! late; declining, pending, reversing, expiring) and of faults (crashes, leases running out,
//! keys expiring), up to the budgets of a [`Config`].
//!
//! It is an abstract model, not the service: it does not depend on the `orderpay` crate. Each
//! [`Action`] names the statement or function of the service it stands for, and docs/model.md
//! holds the model against the code: what it covers, what it abstracts away and why that is
//! safe, how to run it, how to add a kind, and how a conformance test maps the service's rows to
//! its [`State`].
//!
//! - [`state`]: our rows, the provider's ledger, the processes, the ghost variables;
//! - [`action`]: the steps;
//! - [`statements`]: the writing statements, one atomic step each;
//! - [`provider`]: the provider's contract;
//! - [`protocol`]: the Stateright model (which steps each state allows, and what they do);
//! - [`audit`]: the rules checked on every transition (final states, answers, events);
//! - [`properties`]: what must always hold and what must be reachable;
//! - [`config`]: the configurations and the mutants;
//! - [`trace`]: paths as readable lines and as JSON steps.

pub mod action;
pub mod audit;
pub mod check;
pub mod config;
pub mod properties;
pub mod protocol;
pub mod provider;
pub mod state;
pub mod statements;
pub mod trace;

pub use action::Action;
pub use config::{Config, Mutation};
pub use protocol::Protocol;
pub use state::State;

/// The unique states of each of [`Config::unit`], pinned: a change that shrinks or blows up the
/// space is noticed (re-pin it when that is meant).
pub const UNIT_UNIQUE_STATES: [usize; 5] = [93_666, 52_127, 29_049, 85_801, 24_882];

/// The unique states of [`Config::large`], pinned (checked by `make model`).
pub const LARGE_UNIQUE_STATES: usize = 8_678_299;
