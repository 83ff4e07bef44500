//! The statements of settlement (`sql/*.sql`): runs claimed and finished, what is known of a
//! batch's payments and refunds, the decisions written, the window's report, the exceptions.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;
use serde::Serialize;
use uuid::Uuid;

use super::{
    Bucket, Category, Decision, ExistingItem, Known, MovementClass, NewItem, OurMovement, OurOperation,
    Report, Window, shown,
};
use crate::ids::AccountId;
use crate::ledger::MovementType;
use crate::provider::BalanceTransaction;

crate::prepared_statement! {
    struct ClaimRun<'a>("sql/claim_run.sql") -> Uuid {
        1 => id: Uuid as Uuid,
        2 => start: &'a DateTime<Utc> as Timestamptz,
        3 => end: &'a DateTime<Utc> as Timestamptz,
        4 => scheduled: bool as Bool,
        5 => now: &'a DateTime<Utc> as Timestamptz,
        6 => stale_before: &'a DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    struct FinishRun<'a>("sql/finish_run.sql") -> Uuid {
        1 => id: Uuid as Uuid,
        2 => now: &'a DateTime<Utc> as Timestamptz,
        3 => report: &'a serde_json::Value as Jsonb,
    }
}

crate::prepared_statement! {
    struct ReleaseRun<'a>("sql/release_run.sql") -> Uuid {
        1 => id: &'a Uuid as Uuid,
    }
}

crate::prepared_statement! {
    struct KnownProviderIds<'a>("sql/known_provider_ids.sql") -> Text {
        1 => ids: &'a [&'a str] as Array<Text>,
    }
}

crate::prepared_statement! {
    struct OursOfObjects<'a>("sql/ours_of_objects.sql")
        -> (Uuid, Uuid, Text, Uuid, Uuid, Numeric, Text, Timestamptz)
    {
        1 => objects: &'a [Uuid] as Array<Uuid>,
    }
}

crate::prepared_statement! {
    struct ItemsOfObjects<'a>("sql/items_of_objects.sql")
        -> (Uuid, Uuid, Text, Nullable<Int4>, Bool, Nullable<Uuid>, Nullable<Numeric>, Nullable<Text>)
    {
        1 => objects: &'a [Uuid] as Array<Uuid>,
    }
}

crate::prepared_statement! {
    struct StatusesOfObjects<'a>("sql/statuses_of_objects.sql") -> (Uuid, Uuid, Text) {
        1 => objects: &'a [Uuid] as Array<Uuid>,
    }
}

crate::prepared_statement! {
    struct InsertItems<'a>("sql/insert_items.sql") -> Uuid {
        1 => run_id: Uuid as Uuid,
        2 => ids: &'a [Uuid] as Array<Uuid>,
        3 => categories: &'a [Category] as Array<Text>,
        4 => objects: &'a [Option<Uuid>] as Array<Nullable<Uuid>>,
        5 => classes: &'a [MovementClass] as Array<Text>,
        6 => ranks: &'a [Option<i32>] as Array<Nullable<Int4>>,
        7 => provider_ids: &'a [Option<&'a str>] as Array<Nullable<Text>>,
        8 => provider_categories: &'a [Option<&'a str>] as Array<Nullable<Text>>,
        9 => provider_amounts: &'a [Option<Decimal>] as Array<Nullable<Numeric>>,
        10 => provider_currencies: &'a [Option<String>] as Array<Nullable<Text>>,
        11 => provider_sources: &'a [Option<&'a str>] as Array<Nullable<Text>>,
        12 => provider_keys: &'a [Option<&'a str>] as Array<Nullable<Text>>,
        13 => provider_created: &'a [Option<DateTime<Utc>>] as Array<Nullable<Timestamptz>>,
        14 => accounts: &'a [Option<AccountId>] as Array<Nullable<Uuid>>,
        15 => ledger_ids: &'a [Option<Uuid>] as Array<Nullable<Uuid>>,
        16 => ours_types: &'a [Option<MovementType>] as Array<Nullable<Text>>,
        17 => ours_amounts: &'a [Option<Decimal>] as Array<Nullable<Numeric>>,
        18 => ours_currencies: &'a [Option<&'a str>] as Array<Nullable<Text>>,
        19 => ours_created: &'a [Option<DateTime<Utc>>] as Array<Nullable<Timestamptz>>,
        20 => ours_statuses: &'a [Option<&'a str>] as Array<Nullable<Text>>,
    }
}

crate::prepared_statement! {
    struct AttachProvider<'a>("sql/attach_provider.sql") -> Uuid {
        1 => item: Uuid as Uuid,
        2 => category: Category as Text,
        3 => provider_id: &'a str as Text,
        4 => provider_category: &'a str as Text,
        5 => amount: Decimal as Numeric,
        6 => currency: &'a str as Text,
        7 => source: &'a str as Text,
        8 => key: Option<&'a str> as Nullable<Text>,
        9 => created: &'a DateTime<Utc> as Timestamptz,
        10 => now: &'a DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    struct AttachOurs<'a>("sql/attach_ours.sql") -> Uuid {
        1 => item: Uuid as Uuid,
        2 => category: Category as Text,
        3 => account_id: AccountId as Uuid,
        4 => ledger_id: Uuid as Uuid,
        5 => movement_type: MovementType as Text,
        6 => amount: Decimal as Numeric,
        7 => currency: &'a str as Text,
        8 => created: &'a DateTime<Utc> as Timestamptz,
        9 => now: &'a DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    struct UnmatchedOurs<'a>("sql/unmatched_ours.sql")
        -> (Uuid, Uuid, Text, Uuid, Uuid, Numeric, Text, Timestamptz)
    {
        1 => account_id: AccountId as Uuid,
        2 => after: Uuid as Uuid,
        3 => before: Uuid as Uuid,
        4 => start: &'a DateTime<Utc> as Timestamptz,
        5 => end: &'a DateTime<Utc> as Timestamptz,
        6 => limit: i64 as BigInt,
    }
}

crate::prepared_statement! {
    struct PageSettings("sql/page_settings.sql") -> (Text, Text, Text);
}

crate::prepared_statement! {
    struct AccountIds("sql/account_ids.sql") -> Uuid;
}

crate::prepared_statement! {
    struct WindowReport<'a>("sql/window_report.sql")
        -> (Text, Nullable<Text>, Nullable<Text>, BigInt, Numeric, Numeric, BigInt, BigInt, BigInt)
    {
        1 => start: &'a DateTime<Utc> as Timestamptz,
        2 => end: &'a DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    struct OpenExceptions<'a>("sql/open_exceptions.sql")
        -> (
            Uuid, Text, Text, Uuid, Nullable<Uuid>, Text, Nullable<Text>, Nullable<Text>,
            Nullable<Numeric>, Nullable<Text>, Nullable<Text>, Nullable<Text>, Nullable<Timestamptz>,
            Nullable<Uuid>, Nullable<Uuid>, Nullable<Text>, Nullable<Numeric>, Nullable<Text>,
            Nullable<Timestamptz>, Nullable<Text>,
        )
    {
        1 => limit: &'a i64 as BigInt,
    }
}

crate::prepared_statement! {
    struct ResolveException<'a>("sql/resolve_exception.sql") -> Uuid {
        1 => id: Uuid as Uuid,
        2 => now: &'a DateTime<Utc> as Timestamptz,
        3 => note: &'a str as Text,
    }
}

crate::prepared_statement! {
    struct CountOpenExceptions("sql/count_open_exceptions.sql") -> (Text, BigInt);
}

crate::prepared_statement! {
    struct RefundsToConfirm<'a>("sql/refunds_to_confirm.sql") -> (Uuid, Uuid) {
        1 => start: &'a DateTime<Utc> as Timestamptz,
        2 => end: &'a DateTime<Utc> as Timestamptz,
    }
}

/// Every statement above, for the checks of `db::statement`'s tests and the integration tests' plans.
#[cfg(any(test, feature = "test-hooks"))]
pub(crate) fn declared_statements() -> Vec<crate::db::statement::Declared> {
    use crate::db::statement::declared;
    vec![
        declared::<ClaimRun<'static>>(),
        declared::<FinishRun<'static>>(),
        declared::<ReleaseRun<'static>>(),
        declared::<KnownProviderIds<'static>>(),
        declared::<OursOfObjects<'static>>(),
        declared::<ItemsOfObjects<'static>>(),
        declared::<StatusesOfObjects<'static>>(),
        declared::<InsertItems<'static>>(),
        declared::<AttachProvider<'static>>(),
        declared::<AttachOurs<'static>>(),
        declared::<UnmatchedOurs<'static>>(),
        declared::<PageSettings>(),
        declared::<AccountIds>(),
        declared::<WindowReport<'static>>(),
        declared::<OpenExceptions<'static>>(),
        declared::<ResolveException<'static>>(),
        declared::<CountOpenExceptions>(),
        declared::<RefundsToConfirm<'static>>(),
    ]
}

/// Claims a run of `window`; `None` when it is scheduled and another instance holds the window
/// (it ran it, or is running it and its claim is younger than `stale_before`).
pub async fn claim_run(
    conn: &mut AsyncPgConnection,
    window: Window,
    scheduled: bool,
    now: DateTime<Utc>,
    stale_before: DateTime<Utc>,
) -> QueryResult<Option<Uuid>> {
    let claim = ClaimRun {
        id: Uuid::now_v7(),
        start: &window.start,
        end: &window.end,
        scheduled,
        now: &now,
        stale_before: &stale_before,
    };
    claim.get_results(conn).await.map(|ids: Vec<Uuid>| ids.into_iter().next())
}

pub async fn finish_run(
    conn: &mut AsyncPgConnection,
    run_id: Uuid,
    report: &Report,
    now: DateTime<Utc>,
) -> QueryResult<()> {
    let report = serde_json::to_value(report).unwrap_or_default();
    FinishRun { id: run_id, now: &now, report: &report }.execute(conn).await.map(drop)
}

/// Settings for the transaction of one page (`sql/page_settings.sql` says why).
pub async fn page_settings(conn: &mut AsyncPgConnection) -> QueryResult<()> {
    PageSettings.execute(conn).await.map(drop)
}

/// Gives up a failed run's claim of its window, so that the job runs the window again.
pub async fn release_run(conn: &mut AsyncPgConnection, run_id: Uuid) -> QueryResult<()> {
    ReleaseRun { id: &run_id }.execute(conn).await.map(drop)
}

/// The ids of `movements` some item already holds.
pub async fn known_provider_ids(
    conn: &mut AsyncPgConnection,
    movements: &[BalanceTransaction],
) -> QueryResult<HashSet<String>> {
    let ids: Vec<&str> = movements.iter().map(|movement| movement.id.as_str()).collect();
    let known: Vec<String> = KnownProviderIds { ids: &ids }.load(conn).await?;
    Ok(known.into_iter().collect())
}

/// Everything known about these payments and refunds: their ledger movements, the items made
/// for them, and the operations themselves.
pub async fn known(conn: &mut AsyncPgConnection, objects: &[Uuid]) -> QueryResult<Known> {
    let mut objects = objects.to_vec();
    objects.sort_unstable();
    objects.dedup();
    let ours: Vec<OurMovement> = OursOfObjects { objects: &objects }.load(conn).await?;
    let items: Vec<ExistingItem> = ItemsOfObjects { objects: &objects }.load(conn).await?;
    let operations: Vec<(Uuid, AccountId, String)> =
        StatusesOfObjects { objects: &objects }.load(conn).await?;
    let operations =
        operations.into_iter().map(|(id, account_id, status)| (id, OurOperation { account_id, status }));
    Ok(Known::new(ours, items, operations.collect()))
}

/// Writes a batch's decisions: the new items in one statement, the attachments one by one
/// (they are rare: an exception whose other side arrived). Returns the items written.
pub async fn apply(
    conn: &mut AsyncPgConnection,
    run_id: Uuid,
    decisions: Vec<Decision>,
    now: DateTime<Utc>,
) -> QueryResult<u64> {
    let mut inserts = Vec::new();
    let mut written = 0_u64;
    for decision in decisions {
        match decision {
            Decision::Insert(item) => inserts.push(item),
            Decision::AttachProvider { item, category, provider } => {
                let attach = AttachProvider {
                    item,
                    category,
                    provider_id: &provider.id,
                    provider_category: &provider.category,
                    amount: provider.amount,
                    currency: &provider.currency.to_ascii_uppercase(),
                    source: &provider.source,
                    key: provider.source_key.as_deref(),
                    created: &provider.created,
                    now: &now,
                };
                written += attach.execute(conn).await? as u64;
            }
            Decision::AttachOurs { item, category, ours } => {
                let attach = AttachOurs {
                    item,
                    category,
                    account_id: ours.account_id,
                    ledger_id: ours.id,
                    movement_type: ours.movement_type,
                    amount: ours.net(),
                    currency: &ours.currency,
                    created: &ours.created_at,
                    now: &now,
                };
                written += attach.execute(conn).await? as u64;
            }
        }
    }
    if !inserts.is_empty() {
        written += insert_items(conn, run_id, &inserts).await? as u64;
    }
    Ok(written)
}

fn provider(item: &NewItem) -> Option<&BalanceTransaction> {
    item.provider.as_ref()
}

fn ours(item: &NewItem) -> Option<&OurMovement> {
    item.ours.as_ref()
}

async fn insert_items(conn: &mut AsyncPgConnection, run_id: Uuid, items: &[NewItem]) -> QueryResult<usize> {
    let ids: Vec<Uuid> = items.iter().map(|item| item.id).collect();
    let categories: Vec<Category> = items.iter().map(|item| item.category).collect();
    let objects: Vec<Option<Uuid>> = items.iter().map(|item| item.object_id).collect();
    let classes: Vec<MovementClass> = items.iter().map(|item| item.class).collect();
    let ranks: Vec<Option<i32>> = items.iter().map(|item| item.rank).collect();
    let provider_ids: Vec<Option<&str>> = items.iter().map(|i| provider(i).map(|p| p.id.as_str())).collect();
    let provider_categories: Vec<Option<&str>> =
        items.iter().map(|i| provider(i).map(|p| p.category.as_str())).collect();
    let provider_amounts: Vec<Option<Decimal>> =
        items.iter().map(|i| provider(i).map(|p| p.amount)).collect();
    let provider_currencies: Vec<Option<String>> =
        items.iter().map(|i| provider(i).map(|p| p.currency.to_ascii_uppercase())).collect();
    let provider_sources: Vec<Option<&str>> =
        items.iter().map(|i| provider(i).map(|p| p.source.as_str())).collect();
    let provider_keys: Vec<Option<&str>> =
        items.iter().map(|i| provider(i).and_then(|p| p.source_key.as_deref())).collect();
    let provider_created: Vec<Option<DateTime<Utc>>> =
        items.iter().map(|i| provider(i).map(|p| p.created)).collect();
    let accounts: Vec<Option<AccountId>> = items
        .iter()
        .map(|i| ours(i).map(|o| o.account_id).or(i.operation.as_ref().map(|o| o.account_id)))
        .collect();
    let ledger_ids: Vec<Option<Uuid>> = items.iter().map(|i| ours(i).map(|o| o.id)).collect();
    let ours_types: Vec<Option<MovementType>> =
        items.iter().map(|i| ours(i).map(|o| o.movement_type)).collect();
    let ours_amounts: Vec<Option<Decimal>> = items.iter().map(|i| ours(i).map(OurMovement::net)).collect();
    let ours_currencies: Vec<Option<&str>> =
        items.iter().map(|i| ours(i).map(|o| o.currency.as_str())).collect();
    let ours_created: Vec<Option<DateTime<Utc>>> =
        items.iter().map(|i| ours(i).map(|o| o.created_at)).collect();
    let ours_statuses: Vec<Option<&str>> =
        items.iter().map(|i| i.operation.as_ref().map(|o| o.status.as_str())).collect();
    InsertItems {
        run_id,
        ids: &ids,
        categories: &categories,
        objects: &objects,
        classes: &classes,
        ranks: &ranks,
        provider_ids: &provider_ids,
        provider_categories: &provider_categories,
        provider_amounts: &provider_amounts,
        provider_currencies: &provider_currencies,
        provider_sources: &provider_sources,
        provider_keys: &provider_keys,
        provider_created: &provider_created,
        accounts: &accounts,
        ledger_ids: &ledger_ids,
        ours_types: &ours_types,
        ours_amounts: &ours_amounts,
        ours_currencies: &ours_currencies,
        ours_created: &ours_created,
        ours_statuses: &ours_statuses,
    }
    .execute(conn)
    .await
}

pub async fn account_ids(conn: &mut AsyncPgConnection) -> QueryResult<Vec<AccountId>> {
    AccountIds.load(conn).await
}

/// The smallest time-ordered id of a movement made at `at` (ids are UUIDv7: their first 48
/// bits are the milliseconds since the epoch), less one, so that `id > floor` starts there.
pub fn window_floor(at: DateTime<Utc>) -> Uuid {
    let millis = at.timestamp_millis().max(0) as u128;
    Uuid::from_u128((millis << 80).saturating_sub(1))
}

/// A batch of an account's ledger movements made in `window` that no item holds, after `after`.
pub async fn unmatched_ours(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    window: Window,
    after: Uuid,
    limit: u32,
) -> QueryResult<Vec<OurMovement>> {
    let before = Uuid::from_u128(((window.end.timestamp_millis().max(0) as u128) + 1) << 80);
    let query = UnmatchedOurs {
        account_id,
        after,
        before,
        start: &window.start,
        end: &window.end,
        limit: i64::from(limit),
    };
    query.load(conn).await
}

/// The window's items summed per category, each side per currency.
pub async fn window_report(
    conn: &mut AsyncPgConnection,
    window: Window,
    run_id: Uuid,
) -> QueryResult<Report> {
    type Row = (Category, Option<String>, Option<String>, i64, Decimal, Decimal, i64, i64, i64);
    let rows: Vec<Row> = WindowReport { start: &window.start, end: &window.end }.load(conn).await?;
    let mut categories: std::collections::BTreeMap<&'static str, Bucket> =
        Category::ALL.iter().map(|category| (category.as_str(), Bucket::default())).collect();
    let mut report = Report {
        run_id,
        window,
        categories: Default::default(),
        provider_total: Default::default(),
        ours_total: Default::default(),
        provider_read: 0,
        items_written: 0,
    };
    for (category, provider_currency, ours_currency, count, provider_sum, ours_sum, providers, ours, open) in
        rows
    {
        let bucket = categories.entry(category.as_str()).or_default();
        bucket.count += count;
        if category != Category::Matched {
            bucket.open += open;
        }
        if let (Some(currency), true) = (provider_currency, providers > 0) {
            let sum = shown(provider_sum, &currency);
            *bucket.provider.entry(currency.clone()).or_default() += sum;
            *report.provider_total.entry(currency).or_default() += sum;
        }
        if let (Some(currency), true) = (ours_currency, ours > 0) {
            let sum = shown(ours_sum, &currency);
            *bucket.ours.entry(currency.clone()).or_default() += sum;
            *report.ours_total.entry(currency).or_default() += sum;
        }
    }
    report.categories = categories;
    Ok(report)
}

/// An exception nobody settled yet, with both sides as far as they exist.
#[derive(Debug, Clone, Serialize)]
pub struct Exception {
    pub id: Uuid,
    pub category: Category,
    pub found_as: Category,
    pub run_id: Uuid,
    pub object_id: Option<Uuid>,
    pub movement_class: MovementClass,
    pub provider: Option<ProviderSide>,
    pub ours: Option<OursSide>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProviderSide {
    pub id: String,
    pub category: Option<String>,
    pub amount: Option<Decimal>,
    pub currency: Option<String>,
    pub source: Option<String>,
    pub source_key: Option<String>,
    pub created: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct OursSide {
    pub account_id: Option<Uuid>,
    pub ledger_movement_id: Option<Uuid>,
    #[serde(rename = "type")]
    pub movement_type: Option<String>,
    pub amount: Option<Decimal>,
    pub currency: Option<String>,
    pub created: Option<DateTime<Utc>>,
    /// For `status_mismatch`: the status of our operation, which records no movement.
    pub status: Option<String>,
}

type ExceptionRow = (
    Uuid,
    Category,
    Category,
    Uuid,
    Option<Uuid>,
    MovementClass,
    Option<String>,
    Option<String>,
    Option<Decimal>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<DateTime<Utc>>,
    Option<Uuid>,
    Option<Uuid>,
    Option<String>,
    Option<Decimal>,
    Option<String>,
    Option<DateTime<Utc>>,
    Option<String>,
);

/// Up to `limit` open exceptions, oldest first.
pub async fn open_exceptions(conn: &mut AsyncPgConnection, limit: i64) -> QueryResult<Vec<Exception>> {
    let rows: Vec<ExceptionRow> = OpenExceptions { limit: &limit }.load(conn).await?;
    Ok(rows
        .into_iter()
        .map(|row| Exception {
            id: row.0,
            category: row.1,
            found_as: row.2,
            run_id: row.3,
            object_id: row.4,
            movement_class: row.5,
            provider: row.6.map(|id| ProviderSide {
                id,
                category: row.7,
                amount: row.8.map(|amount| shown(amount, row.9.as_deref().unwrap_or_default())),
                currency: row.9,
                source: row.10,
                source_key: row.11,
                created: row.12,
            }),
            ours: (row.13.is_some() || row.14.is_some()).then_some(OursSide {
                account_id: row.13,
                ledger_movement_id: row.14,
                movement_type: row.15,
                amount: row.16.map(|amount| shown(amount, row.17.as_deref().unwrap_or_default())),
                currency: row.17,
                created: row.18,
                status: row.19,
            }),
        })
        .collect())
}

/// Acknowledges an open exception; `false` when there is no open exception of that id.
pub async fn resolve_exception(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    note: &str,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    let resolved: Vec<Uuid> = ResolveException { id, now: &now, note }.load(conn).await?;
    Ok(!resolved.is_empty())
}

/// Open exceptions per category, every category present (zero when none).
pub async fn count_open_exceptions(conn: &mut AsyncPgConnection) -> QueryResult<HashMap<Category, i64>> {
    let rows: Vec<(Category, i64)> = CountOpenExceptions.load(conn).await?;
    let mut counts: HashMap<Category, i64> =
        Category::ALL.iter().filter(|c| **c != Category::Matched).map(|c| (*c, 0)).collect();
    counts.extend(rows);
    Ok(counts)
}

/// The refunds (account, refund id) behind the open `status_mismatch` items of `window`.
pub async fn refunds_to_confirm(
    conn: &mut AsyncPgConnection,
    window: Window,
) -> QueryResult<Vec<(AccountId, Uuid)>> {
    let rows: Vec<(Uuid, Uuid)> =
        RefundsToConfirm { start: &window.start, end: &window.end }.load(conn).await?;
    Ok(rows.into_iter().map(|(account, refund)| (AccountId::from_uuid(account), refund)).collect())
}
