//! The mock's settlement records: every movement of the merchant's money (a charge captured, a
//! refund succeeded or reversed, a dispute's funds withdrawn or reinstated), as Stripe's balance
//! transactions list them (`GET /v1/balance_transactions`). Each is dated when the money moved
//! (a pending charge when it settled, not when someone looked), and names the idempotency key
//! its charge or refund was created with, which is how orderpay's settlement run finds its own
//! record of it.
//!
//! For tests the feed can be made to disagree with orderpay's books: a movement added by hand
//! (`POST /_admin/balance_transactions`), one hidden (`DELETE /_admin/balance_transactions/{id}`),
//! and for the benchmark a seeded generator (`POST /_admin/balance_transactions/generate`) that
//! lays down a million movements without a million API calls.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;

use super::{Ledger, money, new_id};
use crate::money::Currency;
use crate::provider::wire::{BalanceTransactionBody, ListBody, reporting_category};

/// The most a page may hold, as at Stripe.
pub const MAX_PAGE: usize = 100;

#[derive(Debug, Clone)]
struct StoredMovement {
    id: String,
    category: String,
    /// Signed: negative when money left the balance.
    amount: Decimal,
    currency: Currency,
    source: String,
    source_key: Option<String>,
    created: DateTime<Utc>,
    hidden: bool,
}

impl StoredMovement {
    fn body(&self) -> BalanceTransactionBody {
        BalanceTransactionBody {
            id: self.id.clone(),
            object: "balance_transaction".to_owned(),
            amount: money(self.amount, self.currency),
            currency: self.currency.code().to_owned(),
            reporting_category: self.category.clone(),
            source: self.source.clone(),
            source_idempotency_key: self.source_key.clone(),
            created: self.created,
        }
    }

    fn order(&self) -> (DateTime<Utc>, &str) {
        (self.created, &self.id)
    }
}

/// Every movement, ordered by (created, id): a window is a slice, a page a walk down from its top.
#[derive(Default)]
pub(super) struct Feed {
    movements: Vec<StoredMovement>,
    created_of: HashMap<String, DateTime<Utc>>,
}

impl Feed {
    fn insert(&mut self, movement: StoredMovement) {
        // Nearly always at the end: movements are recorded as money moves.
        let at = self.movements.partition_point(|stored| stored.order() <= movement.order());
        self.created_of.insert(movement.id.clone(), movement.created);
        self.movements.insert(at, movement);
    }

    fn position(&self, id: &str) -> Option<usize> {
        let created = *self.created_of.get(id)?;
        let at = self.movements.partition_point(|stored| stored.order() < (created, id));
        (self.movements.get(at)?.id == id).then_some(at)
    }
}

/// `GET /v1/balance_transactions` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalanceListQuery {
    pub created_gte: Option<DateTime<Utc>>,
    pub created_lt: Option<DateTime<Utc>>,
    pub limit: Option<usize>,
    pub starting_after: Option<String>,
}

/// `POST /_admin/balance_transactions` body: a movement the provider reports, made up.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectedMovement {
    pub reporting_category: String,
    /// Signed, in the currency's units.
    pub amount: Decimal,
    pub currency: String,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub source_idempotency_key: Option<String>,
    #[serde(default)]
    pub created: Option<DateTime<Utc>>,
}

/// `POST /_admin/balance_transactions/generate` body: `count` movements spread evenly over
/// `[created_gte, created_lt)`, reproducible from `seed` (docs/books.md gives the formula the
/// benchmark uses to lay down orderpay's side).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generate {
    pub seed: u32,
    pub count: u64,
    pub created_gte: DateTime<Utc>,
    pub created_lt: DateTime<Utc>,
}

/// The id the generator gives the payment (or refund) of movement `index` of `seed`: a valid
/// UUIDv7 shape, easy to lay down in SQL too.
pub fn generated_id(seed: u32, index: u64) -> String {
    format!("{seed:08x}-0000-7000-8000-{index:012x}")
}

impl Ledger {
    /// Records that money moved: `amount` is signed (negative when it left the balance).
    pub(super) fn record_movement(
        &mut self,
        category: &str,
        amount: Decimal,
        currency: Currency,
        source: &str,
        source_key: &str,
        at: DateTime<Utc>,
    ) {
        self.balance.insert(StoredMovement {
            id: new_id("txn"),
            category: category.to_owned(),
            amount,
            currency,
            source: source.to_owned(),
            source_key: Some(source_key.to_owned()),
            created: at,
            hidden: false,
        });
    }

    /// `GET /v1/balance_transactions`: the window's movements, newest first, after
    /// `starting_after`. Whatever is due by `now` moves first, so a movement is never missing
    /// only because nobody looked at its charge.
    pub fn balance_transactions(
        &mut self,
        query: &BalanceListQuery,
        now: DateTime<Utc>,
    ) -> Result<ListBody<BalanceTransactionBody>, String> {
        self.advance_due(now);
        let limit = query.limit.unwrap_or(10);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(format!("limit must be 1 to {MAX_PAGE}"));
        }
        let feed = &self.balance;
        let start = query.created_gte.map_or(0, |gte| feed.movements.partition_point(|m| m.created < gte));
        let mut end = query
            .created_lt
            .map_or(feed.movements.len(), |lt| feed.movements.partition_point(|m| m.created < lt));
        if let Some(after) = &query.starting_after {
            let at = feed.position(after).ok_or_else(|| format!("no such balance transaction: {after}"))?;
            end = end.min(at);
        }
        let mut data = Vec::with_capacity(limit);
        let mut at = end;
        while at > start && data.len() < limit {
            at -= 1;
            if !feed.movements[at].hidden {
                data.push(feed.movements[at].body());
            }
        }
        let has_more = feed.movements[start..at].iter().any(|m| !m.hidden);
        Ok(ListBody { object: "list".to_owned(), data, has_more })
    }

    /// `POST /_admin/balance_transactions`: a movement the provider reports that nothing made.
    pub fn inject_movement(
        &mut self,
        movement: InjectedMovement,
        now: DateTime<Utc>,
    ) -> Result<BalanceTransactionBody, String> {
        let currency = Currency::parse(&movement.currency).map_err(|error| format!("currency: {error}"))?;
        let stored = StoredMovement {
            id: new_id("txn"),
            category: movement.reporting_category,
            amount: movement.amount,
            currency,
            source: movement.source.unwrap_or_else(|| new_id("src")),
            source_key: movement.source_idempotency_key,
            created: movement.created.unwrap_or(now),
            hidden: false,
        };
        let body = stored.body();
        self.balance.insert(stored);
        Ok(body)
    }

    /// `DELETE /_admin/balance_transactions/{id}`: the provider stops reporting a movement.
    pub fn hide_movement(&mut self, id: &str) -> bool {
        match self.balance.position(id) {
            Some(at) => {
                self.balance.movements[at].hidden = true;
                true
            }
            None => false,
        }
    }

    /// `POST /_admin/balance_transactions/generate`: movement `i` is a charge of
    /// `orderpay_pay_{generated_id(seed, i)}` for `(1 + i % 9973) / 100` USD, except every tenth
    /// (`i % 10 == 9`), a refund of `orderpay_refund_{generated_id(seed, i)}` for the same amount,
    /// negative; dated `created_gte + i * span / count`.
    pub fn generate_movements(&mut self, generate: &Generate) -> Result<u64, String> {
        let span = generate.created_lt - generate.created_gte;
        if span <= Duration::zero() || generate.count == 0 || generate.count > 10_000_000 {
            return Err("an empty window, or a count outside 1 to 10,000,000".to_owned());
        }
        let step_ns = span.num_nanoseconds().unwrap_or(i64::MAX) / generate.count as i64;
        let usd = Currency::parse("USD").map_err(|error| error.to_string())?;
        self.balance.movements.reserve(generate.count as usize);
        for index in 0..generate.count {
            let id = generated_id(generate.seed, index);
            let amount = Decimal::new(1 + (index % 9973) as i64, 2);
            let (category, key, amount) = if index % 10 == 9 {
                (reporting_category::REFUND, format!("orderpay_refund_{id}"), -amount)
            } else {
                (reporting_category::CHARGE, format!("orderpay_pay_{id}"), amount)
            };
            let created = generate.created_gte + Duration::nanoseconds(step_ns * index as i64);
            self.balance.insert(StoredMovement {
                id: format!("txn_gen_{:08x}_{index:012}", generate.seed),
                category: category.to_owned(),
                amount,
                currency: usd,
                source: format!("src_gen_{index}"),
                source_key: Some(key),
                created,
                hidden: false,
            });
        }
        Ok(generate.count)
    }
}
