//! Integration tests: the real HTTP app on port 0 against a real PostgreSQL, one fresh database
//! per test so that tests run in parallel and never see each other's rows.

mod helpers;
mod process;
mod proxy;

mod abuse;
mod chaos;
mod cli;
mod database;
mod errors;
mod failure_windows;
mod idempotency;
mod operations;
mod orders;
mod payments;
mod security;
