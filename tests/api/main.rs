//! Integration tests: the real HTTP app on port 0 against a real PostgreSQL, one fresh database
//! per test so that tests run in parallel and never see each other's rows.

mod cluster;
mod helpers;
mod process;
mod proxy;

mod abuse;
mod books;
// chaos.rs includes failover.rs: its tests are named chaos::failover::…, so that `make chaos`
// runs them and `make test` does not.
mod captures;
mod chaos;
mod cli;
mod clients;
mod conformance;
mod database;
mod disputes;
mod errors;
mod events;
mod failure_windows;
mod idempotency;
mod late_charges;
mod ledger;
mod monitoring;
mod nats;
mod operations;
mod operator_payments;
mod operators;
mod orders;
mod payments;
mod provider;
mod provider_webhooks;
mod refunds;
mod security;
mod settlement;
// Against localstripe: `make test-stripe` runs them, `make test` leaves them out.
mod stripe_wire;
mod webhooks;
