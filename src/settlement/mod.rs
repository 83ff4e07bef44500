//! Settlement reconciliation: the provider's own record of every movement of money (its
//! balance transactions) held against the ledger's, one window of time at a time, so that our
//! books parting from the provider's money is seen within a day, whatever the cause.
//!
//! A run of a window streams the provider's movements made in it, a page at a time (memory is
//! one page, whatever the window holds), and matches each to the ledger movement it stands for:
//! the same payment (a charge, a dispute's funds) or refund, named by the downstream key the
//! provider reports, the same kind of movement, the same rank among that object's movements of
//! that kind. Then it takes the window's ledger movements that nothing matched. Every movement
//! on either side lands in exactly one [`Category`]; an item is unique per provider movement and
//! per ledger movement, so a window run again finds nothing new, and an exception whose other
//! side shows up later (money we recorded after the window closed) is matched then and settled
//! as `matched_later`. A refund the provider's records show reversed or carried out while we
//! hold it in another state is looked up and, on the provider's confirmed word, corrected by the
//! run itself ([`confirm_refunds`]).
//!
//! [`job`] runs each window once, whatever the number of instances; `orderpay settlement run`
//! runs any window by hand. [`repository`] holds the statements. docs/books.md explains the
//! categories to an operator.

pub mod job;
pub mod repository;

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use rust_decimal::Decimal;
use serde::Serialize;
use uuid::Uuid;

use crate::ids::AccountId;
use crate::ledger::MovementType;
use crate::operations::late_refund::{self, Corrected, Correction};
use crate::operations::refund::{Held, Refunds};
use crate::operations::{Actor, Kind};
use crate::provider::wire::reporting_category;
use crate::provider::{BalanceQuery, BalanceTransaction, PaymentProvider, ProviderError};

crate::text_enum! {
    /// Where a movement landed. Every one but `matched` is an exception for a person.
    pub enum Category {
        /// Both sides, the same amount and currency.
        Matched = "matched",
        /// The provider moved money we have no record of (no operation of ours by that key).
        MissingOurs = "missing_ours",
        /// We recorded money the provider did not move.
        MissingProvider = "missing_provider",
        /// Both sides, different amounts.
        AmountMismatch = "amount_mismatch",
        /// Both sides, different currencies.
        CurrencyMismatch = "currency_mismatch",
        /// The provider moved money for an operation of ours that records no such movement (a
        /// payment we hold as failed or still in flight, a refund we hold as failed).
        StatusMismatch = "status_mismatch",
        /// The provider reports a movement of an operation more often than it happened to us.
        DuplicateProvider = "duplicate_provider",
    }
}

crate::text_enum! {
    /// The kind of movement both sides are matched on: the provider's reporting category, and
    /// the ledger types that stand for it.
    pub enum MovementClass {
        Charge = "charge",
        Refund = "refund",
        RefundReversal = "refund_reversal",
        DisputeWithdrawal = "dispute_withdrawal",
        DisputeReinstatement = "dispute_reinstatement",
        /// A category orderpay does not know: never matched.
        Unknown = "unknown",
    }
}

impl MovementClass {
    /// The class of a provider's reporting category.
    pub fn of_category(category: &str) -> MovementClass {
        match category {
            reporting_category::CHARGE => MovementClass::Charge,
            reporting_category::REFUND => MovementClass::Refund,
            reporting_category::REFUND_FAILURE => MovementClass::RefundReversal,
            reporting_category::DISPUTE => MovementClass::DisputeWithdrawal,
            reporting_category::DISPUTE_REVERSAL => MovementClass::DisputeReinstatement,
            _ => MovementClass::Unknown,
        }
    }

    /// The class of a ledger movement's type: a late charge is a charge to the provider, a
    /// correction or a system refund a refund.
    pub fn of_type(movement_type: MovementType) -> MovementClass {
        match movement_type {
            MovementType::ChargeCaptured | MovementType::LateCharge => MovementClass::Charge,
            MovementType::Refund | MovementType::RefundCorrection | MovementType::LateChargeRefund => {
                MovementClass::Refund
            }
            MovementType::RefundReversal => MovementClass::RefundReversal,
            MovementType::DisputeWithdrawal => MovementClass::DisputeWithdrawal,
            MovementType::DisputeReinstatement => MovementClass::DisputeReinstatement,
        }
    }

    /// Whether the object of this class is a refund (else a payment).
    fn names_a_refund(self) -> bool {
        matches!(self, MovementClass::Refund | MovementClass::RefundReversal)
    }
}

/// The payment or refund a provider movement is for, from the idempotency key of the write
/// that created its charge or refund (a payment's key for charges and disputes, a refund's for
/// refunds and their reversals); `None` when the key names nothing of ours.
pub fn object_of(class: MovementClass, key: Option<&str>) -> Option<Uuid> {
    let key = key?;
    match class {
        MovementClass::Unknown => None,
        class if class.names_a_refund() => {
            crate::refunds::refund_of_downstream_key(key).map(|id| id.as_uuid())
        }
        _ => crate::payments::payment_of_downstream_key(key).map(|id| id.as_uuid()),
    }
}

/// The class of a provider movement and the payment or refund of ours it names.
pub fn class_and_object(movement: &BalanceTransaction) -> (MovementClass, Option<Uuid>) {
    let class = MovementClass::of_category(&movement.category);
    (class, object_of(class, movement.source_key.as_deref()))
}

/// One of our ledger movements, as settlement compares it (the columns of `ours_of_objects.sql`
/// and `unmatched_ours.sql`, in order).
#[derive(Debug, Clone, diesel::Queryable)]
pub struct OurMovement {
    pub id: Uuid,
    pub account_id: AccountId,
    pub movement_type: MovementType,
    pub operation_id: Uuid,
    pub payment_id: Uuid,
    pub amount: Decimal,
    pub currency: String,
    pub created_at: DateTime<Utc>,
}

impl OurMovement {
    pub fn class(&self) -> MovementClass {
        MovementClass::of_type(self.movement_type)
    }

    /// The payment or refund it is matched on (see [`object_of`]).
    pub fn object(&self) -> Uuid {
        if self.class().names_a_refund() { self.operation_id } else { self.payment_id }
    }

    /// Signed as the provider signs it: what the movement did to the provider balance.
    pub fn net(&self) -> Decimal {
        match self.class() {
            MovementClass::Charge | MovementClass::RefundReversal | MovementClass::DisputeReinstatement => {
                self.amount
            }
            _ => -self.amount,
        }
    }
}

/// An item already made for an object: which rank of which class it holds, and which sides
/// (the columns of `items_of_objects.sql`, in order).
#[derive(Debug, Clone, diesel::Queryable)]
pub struct ExistingItem {
    pub id: Uuid,
    pub object_id: Uuid,
    pub class: MovementClass,
    pub rank: Option<i32>,
    pub has_provider: bool,
    pub ledger_movement_id: Option<Uuid>,
    /// The provider's side, when the item has one: what our movement is compared with.
    pub provider_amount: Option<Decimal>,
    pub provider_currency: Option<String>,
}

/// An operation of ours that a provider movement names, with its status.
#[derive(Debug, Clone)]
pub struct OurOperation {
    pub account_id: AccountId,
    pub status: String,
}

/// What is known about the objects of a batch: every ledger movement of theirs, ranked per
/// class by time, the items already made, and the operations themselves.
#[derive(Debug, Default)]
pub struct Known {
    /// Per (object, class): our movements, oldest first.
    ours: HashMap<(Uuid, MovementClass), Vec<OurMovement>>,
    /// Per ledger movement: the item holding it, and whether that item has the provider's side.
    claimed: HashMap<Uuid, (Uuid, bool)>,
    /// Per (object, class): how many items hold a provider movement.
    provider_items: HashMap<(Uuid, MovementClass), i32>,
    /// Per (object, class, rank): an item holding only the provider's movement, with its amount
    /// and currency.
    provider_only: HashMap<(Uuid, MovementClass, i32), (Uuid, Decimal, String)>,
    operations: HashMap<Uuid, OurOperation>,
}

impl Known {
    pub fn new(
        ours: Vec<OurMovement>,
        items: Vec<ExistingItem>,
        operations: HashMap<Uuid, OurOperation>,
    ) -> Known {
        let mut known = Known { operations, ..Known::default() };
        for movement in ours {
            known.ours.entry((movement.object(), movement.class())).or_default().push(movement);
        }
        for movements in known.ours.values_mut() {
            movements.sort_by_key(|movement| (movement.created_at, movement.id));
        }
        for item in items {
            if let Some(ledger_id) = item.ledger_movement_id {
                known.claimed.insert(ledger_id, (item.id, item.has_provider));
            }
            if item.has_provider {
                *known.provider_items.entry((item.object_id, item.class)).or_default() += 1;
                if let (None, Some(rank), Some(amount), Some(currency)) =
                    (item.ledger_movement_id, item.rank, item.provider_amount, item.provider_currency)
                {
                    known
                        .provider_only
                        .insert((item.object_id, item.class, rank), (item.id, amount, currency));
                }
            }
        }
        known
    }

    /// Our movements that no item holds yet.
    fn unheld(&self) -> Vec<OurMovement> {
        let movements = self.ours.values().flatten();
        movements.filter(|movement| !self.claimed.contains_key(&movement.id)).cloned().collect()
    }

    /// The rank (1-based) of one of our movements among its object's movements of its class.
    fn rank_of(&self, movement: &OurMovement) -> i32 {
        let list = self.ours.get(&(movement.object(), movement.class()));
        let at = list.and_then(|list| list.iter().position(|other| other.id == movement.id));
        at.map_or(1, |at| at as i32 + 1)
    }
}

/// What to write for one movement.
#[derive(Debug, Clone)]
pub enum Decision {
    /// A new item.
    Insert(NewItem),
    /// The provider's side for an item holding only ours.
    AttachProvider { item: Uuid, category: Category, provider: BalanceTransaction },
    /// Our side for an item holding only the provider's.
    AttachOurs { item: Uuid, category: Category, ours: OurMovement },
}

/// An item to insert: its category, what it is matched on, and the sides it has.
#[derive(Debug, Clone)]
pub struct NewItem {
    pub id: Uuid,
    pub category: Category,
    pub object_id: Option<Uuid>,
    pub class: MovementClass,
    pub rank: Option<i32>,
    pub provider: Option<BalanceTransaction>,
    pub ours: Option<OurMovement>,
    /// For `status_mismatch`: the operation's account and status.
    pub operation: Option<OurOperation>,
}

/// How the provider's amount and currency compare with our movement: currency first (amounts in
/// two currencies are not comparable), then the signed amount.
pub fn compare(provider_amount: Decimal, provider_currency: &str, ours: &OurMovement) -> Category {
    if !provider_currency.eq_ignore_ascii_case(&ours.currency) {
        Category::CurrencyMismatch
    } else if provider_amount != ours.net() {
        Category::AmountMismatch
    } else {
        Category::Matched
    }
}

/// Decides each of a page of provider movements (none already in an item), in the page's order:
/// the n-th provider movement of an object's class is matched with our n-th.
pub fn decide_provider_page(page: Vec<BalanceTransaction>, known: &Known) -> Vec<Decision> {
    let mut seen: HashMap<(Uuid, MovementClass), i32> = HashMap::new();
    page.into_iter()
        .map(|provider| {
            let (class, object) = class_and_object(&provider);
            let Some(object) = object else {
                return Decision::Insert(NewItem::provider_only(
                    Category::MissingOurs,
                    None,
                    class,
                    None,
                    provider,
                ));
            };
            let earlier = seen.entry((object, class)).or_default();
            *earlier += 1;
            let rank = known.provider_items.get(&(object, class)).copied().unwrap_or(0) + *earlier;
            let ours = known.ours.get(&(object, class)).map_or(&[][..], Vec::as_slice);
            match ours.get(rank as usize - 1) {
                Some(movement) => {
                    let category = compare(provider.amount, &provider.currency, movement);
                    match known.claimed.get(&movement.id) {
                        Some(&(item, false)) => Decision::AttachProvider { item, category, provider },
                        // Held with a provider movement already: only a race of two runs gets here.
                        Some(_) => Decision::Insert(NewItem::provider_only(
                            Category::DuplicateProvider,
                            Some(object),
                            class,
                            Some(rank),
                            provider,
                        )),
                        None => Decision::Insert(NewItem {
                            id: Uuid::now_v7(),
                            category,
                            object_id: Some(object),
                            class,
                            rank: Some(rank),
                            provider: Some(provider),
                            ours: Some(movement.clone()),
                            operation: None,
                        }),
                    }
                }
                None if rank > 1 => Decision::Insert(NewItem::provider_only(
                    Category::DuplicateProvider,
                    Some(object),
                    class,
                    Some(rank),
                    provider,
                )),
                None => match known.operations.get(&object) {
                    Some(operation) => Decision::Insert(NewItem {
                        operation: Some(operation.clone()),
                        ..NewItem::provider_only(
                            Category::StatusMismatch,
                            Some(object),
                            class,
                            Some(rank),
                            provider,
                        )
                    }),
                    None => Decision::Insert(NewItem::provider_only(
                        Category::MissingOurs,
                        Some(object),
                        class,
                        Some(rank),
                        provider,
                    )),
                },
            }
        })
        .collect()
}

/// Decides each of our movements of the window that no item holds: matched with a provider
/// movement an earlier run could not match (it came first), else missing at the provider.
pub fn decide_ours(movements: Vec<OurMovement>, known: &Known) -> Vec<Decision> {
    movements
        .into_iter()
        .map(|ours| {
            let rank = known.rank_of(&ours);
            match known.provider_only.get(&(ours.object(), ours.class(), rank)) {
                Some((item, amount, currency)) => {
                    Decision::AttachOurs { item: *item, category: compare(*amount, currency, &ours), ours }
                }
                None => Decision::Insert(NewItem {
                    id: Uuid::now_v7(),
                    category: Category::MissingProvider,
                    object_id: Some(ours.object()),
                    class: ours.class(),
                    rank: Some(rank),
                    provider: None,
                    ours: Some(ours),
                    operation: None,
                }),
            }
        })
        .collect()
}

impl NewItem {
    fn provider_only(
        category: Category,
        object_id: Option<Uuid>,
        class: MovementClass,
        rank: Option<i32>,
        provider: BalanceTransaction,
    ) -> NewItem {
        NewItem {
            id: Uuid::now_v7(),
            category,
            object_id,
            class,
            rank,
            provider: Some(provider),
            ours: None,
            operation: None,
        }
    }
}

/// `value` with exactly the minor units of `currency` (as every amount is shown), or as it is
/// when the currency is not one we know.
pub fn shown(value: Decimal, currency: &str) -> Decimal {
    match crate::money::Currency::parse(currency) {
        Ok(currency) => crate::ledger::in_minor_units(value, currency),
        Err(_) => value,
    }
}

/// A window of time: movements made in `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Window {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// One category's share of a window: how many items (of an exception, how many nobody settled
/// yet), and each side's total per currency.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Bucket {
    pub count: i64,
    pub open: i64,
    pub provider: BTreeMap<String, Decimal>,
    pub ours: BTreeMap<String, Decimal>,
}

/// What a run found: every category (all of them, zeros included), each side's totals, and
/// how much the run itself read and added.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run_id: Uuid,
    pub window: Window,
    pub categories: BTreeMap<&'static str, Bucket>,
    /// The provider's movements made in the window, per currency (the sum of the buckets').
    pub provider_total: BTreeMap<String, Decimal>,
    /// Our movements the window's items hold, per currency.
    pub ours_total: BTreeMap<String, Decimal>,
    /// Provider movements this run read (in the window, whether new or not).
    pub provider_read: u64,
    /// Items this run added or changed.
    pub items_written: u64,
}

impl Report {
    /// Exceptions among the window's items that nobody settled yet.
    pub fn exceptions(&self) -> i64 {
        self.categories.values().map(|bucket| bucket.open).sum()
    }
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the provider's settlement records could not be read: {0}")]
    Provider(#[from] ProviderError),
    #[error("the database failed: {0}")]
    Database(#[from] diesel::result::Error),
    #[error("another instance is running this window")]
    AlreadyClaimed,
}

/// How a run pages.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Provider movements per page (at most 100, as at Stripe) and ledger movements per batch.
    pub page_size: u32,
    /// Scheduled runs are one per window; an operator's are not.
    pub scheduled: bool,
    /// A scheduled claim older than this, unfinished, is taken over (its instance died).
    pub stale_claim: std::time::Duration,
}

/// Runs one window: the provider's movements, then ours that nothing matched, then the report,
/// stored with the run.
pub async fn run(
    conn: &mut AsyncPgConnection,
    provider: &dyn PaymentProvider,
    window: Window,
    options: RunOptions,
) -> Result<Report, RunError> {
    let now = Utc::now();
    let stale = now - chrono::Duration::from_std(options.stale_claim).unwrap_or(chrono::Duration::MAX);
    let run_id = repository::claim_run(conn, window, options.scheduled, now, stale)
        .await?
        .ok_or(RunError::AlreadyClaimed)?;
    let outcome = run_claimed(conn, provider, window, options, run_id).await;
    if outcome.is_err() {
        // Released, so that the job's next poll runs the window again rather than waiting for
        // the claim to go stale; what this run wrote stays (a run again skips it).
        if let Err(error) = repository::release_run(conn, run_id).await {
            tracing::warn!(%error, %run_id, "settlement: a failed run's claim was not released");
        }
    }
    outcome
}

async fn run_claimed(
    conn: &mut AsyncPgConnection,
    provider: &dyn PaymentProvider,
    window: Window,
    options: RunOptions,
    run_id: Uuid,
) -> Result<Report, RunError> {
    let mut written = 0_u64;
    let mut read = 0_u64;
    let mut starting_after = None;
    loop {
        let query = BalanceQuery {
            created_gte: window.start,
            created_lt: window.end,
            limit: options.page_size,
            starting_after: starting_after.take(),
        };
        let page = provider.list_balance_transactions(&query).await?;
        read += page.transactions.len() as u64;
        starting_after = page.transactions.last().map(|last| last.id.clone());
        written +=
            conn.transaction(async |conn| provider_page(conn, run_id, page.transactions).await).await?;
        if !page.has_more || starting_after.is_none() {
            break;
        }
    }
    for account in repository::account_ids(conn).await? {
        let mut after = repository::window_floor(window.start);
        loop {
            let batch = repository::unmatched_ours(conn, account, window, after, options.page_size).await?;
            let Some(last) = batch.last() else { break };
            after = last.id;
            let full = batch.len() == options.page_size as usize;
            written += conn
                .transaction(async |conn| {
                    repository::page_settings(conn).await?;
                    let objects: Vec<Uuid> = batch.iter().map(OurMovement::object).collect();
                    let known = repository::known(conn, &objects).await?;
                    repository::apply(conn, run_id, decide_ours(batch, &known), Utc::now()).await
                })
                .await?;
            if !full {
                break;
            }
        }
    }
    written += confirm_refunds(conn, provider, window, run_id).await?;
    let mut report = repository::window_report(conn, window, run_id).await?;
    report.provider_read = read;
    report.items_written = written;
    repository::finish_run(conn, run_id, &report, Utc::now()).await?;
    Ok(report)
}

/// The refunds behind the window's `status_mismatch` items, looked up at the provider by their
/// downstream key (a read), and corrected on its confirmed word as a provider webhook's would be
/// (`late_refund::correct`): a refund it reversed after it succeeded (the reversal's webhook
/// lost) becomes `failed`, a refund it carried out after we gave up on it and stopped watching
/// becomes `succeeded`. The movement the correction writes completes the item (matched later).
/// A lookup that fails or finds nothing new leaves the item open for the next run or a person.
/// Returns the items written.
async fn confirm_refunds(
    conn: &mut AsyncPgConnection,
    provider: &dyn PaymentProvider,
    window: Window,
    run_id: Uuid,
) -> Result<u64, RunError> {
    let mut written = 0;
    for (account_id, refund_id) in repository::refunds_to_confirm(conn, window).await? {
        let Some(Held { refund, charge_id }) = Refunds::load(conn, (account_id, refund_id)).await? else {
            continue;
        };
        let found = match provider.find_refund(&refund.downstream_key(), charge_id.as_deref(), None).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, %refund_id, "settlement: a refund's lookup failed; its exception stays open");
                continue;
            }
        };
        let Some(correction) = found.and_then(|found| Correction::between(refund.status, &found)) else {
            continue;
        };
        match late_refund::correct(conn, &refund, correction, Actor::Reconciler, None).await {
            Ok(Corrected::Applied) => {
                tracing::warn!(%refund_id, "settlement: a refund corrected on the provider's confirmed word");
            }
            Ok(Corrected::Stale | Corrected::DoesNotFitYet) => continue,
            Err(error) => {
                tracing::warn!(%error, %refund_id, "settlement: a refund's correction failed; its exception stays open");
                continue;
            }
        }
        written += conn
            .transaction(async |conn| {
                let known = repository::known(conn, &[refund_id]).await?;
                let unheld = known.unheld();
                repository::apply(conn, run_id, decide_ours(unheld, &known), Utc::now()).await
            })
            .await?;
    }
    Ok(written)
}

/// One page of the provider's movements, in one transaction: those no item holds yet decided
/// and written. Returns the items written.
async fn provider_page(
    conn: &mut AsyncPgConnection,
    run_id: Uuid,
    movements: Vec<BalanceTransaction>,
) -> diesel::QueryResult<u64> {
    repository::page_settings(conn).await?;
    let known_ids = repository::known_provider_ids(conn, &movements).await?;
    let new: Vec<BalanceTransaction> =
        movements.into_iter().filter(|movement| !known_ids.contains(&movement.id)).collect();
    if new.is_empty() {
        return Ok(0);
    }
    let objects: Vec<Uuid> = new.iter().filter_map(|movement| class_and_object(movement).1).collect();
    let known = repository::known(conn, &objects).await?;
    repository::apply(conn, run_id, decide_provider_page(new, &known), Utc::now()).await
}

#[cfg(test)]
mod tests;
