//! Order persistence: the only code that knows the `orders` and `order_items` tables.
//!
//! Every query is scoped by `account_id`. An order is written by one statement only,
//! `new_order.sql`, keyed or not. Status changes are guarded UPDATEs
//! (`WHERE status = 'pending_payment'`), so two racing writers cannot both apply a transition.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use super::{LineItem, Metadata, Order, OrderStatus, Quantity, Sku};
use crate::db::schema::{order_items, orders};
use crate::events::EventType;
use crate::idempotency::store::{ClaimParameters, ResourceKind};
use crate::idempotency::{KeyedRequest, StoredResponse};
use crate::ids::{AccountId, EventId, OrderId, PaymentId};
use crate::money::{Amount, Currency};

#[derive(Queryable, Selectable)]
#[diesel(table_name = orders)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct OrderRow {
    account_id: AccountId,
    id: OrderId,
    status: OrderStatus,
    currency: Currency,
    total_amount: Decimal,
    customer_id: Option<String>,
    metadata: serde_json::Value,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = order_items)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct ItemRow {
    order_id: OrderId,
    sku: String,
    quantity: i32,
    unit_price: Decimal,
    amount: Decimal,
}

/// A row that does not decode into a valid order is a bug or tampering, never client input.
fn corrupt(what: impl Into<String>) -> DbError {
    DbError::DeserializationError(what.into().into())
}

/// The ids of the order's payments, oldest first, read in the order's own query
/// (`payments_by_order`): one round trip still, on the settle's path too.
fn payment_ids() -> diesel::expression::SqlLiteral<diesel::sql_types::Array<diesel::sql_types::Uuid>> {
    diesel::dsl::sql(
        "ARRAY(SELECT payments.id FROM payments WHERE payments.account_id = orders.account_id \
         AND payments.order_id = orders.id ORDER BY payments.id)",
    )
}

impl OrderRow {
    fn into_order(self, items: Vec<ItemRow>, payment_ids: Vec<PaymentId>) -> QueryResult<Order> {
        let currency = self.currency;
        let amount = |value: Decimal| {
            Amount::from_decimal(value, currency).map_err(|e| corrupt(format!("order amount: {e}")))
        };
        let items = items
            .into_iter()
            .map(|item| {
                Ok(LineItem {
                    sku: Sku::parse(&item.sku).map_err(corrupt)?,
                    quantity: u32::try_from(item.quantity)
                        .ok()
                        .and_then(|q| Quantity::new(q).ok())
                        .ok_or_else(|| corrupt("order item quantity"))?,
                    unit_price: amount(item.unit_price)?,
                    amount: amount(item.amount)?,
                })
            })
            .collect::<QueryResult<Vec<_>>>()?;
        Ok(Order {
            id: self.id,
            account_id: self.account_id,
            status: self.status,
            currency,
            total_amount: amount(self.total_amount)?,
            customer_id: self.customer_id,
            metadata: serde_json::from_value::<Metadata>(self.metadata)
                .map_err(|e| corrupt(format!("order metadata: {e}")))?,
            items,
            payment_ids,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

crate::prepared_statement! {
    /// `new_order.sql` with its parameters: the key claim, the order and its items.
    pub(crate) struct NewOrderStatement<'a>("../idempotency/claim_key.sql", "new_order.sql") -> BigInt {
        group claim: ClaimParameters<'a>,
        13 => currency: Currency as Text,
        14 => total: Decimal as Numeric,
        15 => customer_id: Option<&'a str> as Nullable<Text>,
        16 => metadata: serde_json::Value as Jsonb,
        17 => skus: Vec<&'a str> as Array<Text>,
        18 => quantities: Vec<i32> as Array<Int4>,
        19 => unit_prices: Vec<Decimal> as Array<Numeric>,
        20 => amounts: Vec<Decimal> as Array<Numeric>,
        21 => event_id: EventId as Uuid,
    }
}

/// Inserts an order and its items, with `keyed`'s key and its stored `answer` when there is a
/// key, and its `order.created` event. Returns false, having written nothing, when the key
/// exists.
pub async fn insert(
    conn: &mut AsyncPgConnection,
    order: &Order,
    keyed: Option<&KeyedRequest>,
    answer: &StoredResponse,
    retention: Duration,
) -> QueryResult<bool> {
    let resource = (ResourceKind::Order, order.id.as_uuid());
    // The answer's body is the `order.created` event's data: the key row names the event.
    let event_id = EventId::generate();
    let claim =
        ClaimParameters::new(order.account_id, keyed, resource, Some(answer), order.created_at, retention)
            .answered_by_event(event_id.as_uuid());
    let statement = NewOrderStatement {
        claim,
        currency: order.currency,
        total: order.total_amount.value(),
        customer_id: order.customer_id.as_deref(),
        metadata: serde_json::to_value(&order.metadata).map_err(|e| corrupt(e.to_string()))?,
        skus: order.items.iter().map(|item| item.sku.as_str()).collect(),
        quantities: order.items.iter().map(|item| item.quantity.get() as i32).collect(),
        unit_prices: order.items.iter().map(|item| item.unit_price.value()).collect(),
        amounts: order.items.iter().map(|item| item.amount.value()).collect(),
        event_id,
    };
    let placed = statement.get_result::<i64>(conn).await? == 1;
    if placed {
        crate::telemetry::metrics::events_written(std::iter::once(EventType::OrderCreated.as_str()));
    }
    Ok(placed)
}

async fn load_items(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    order_ids: &[OrderId],
) -> QueryResult<HashMap<OrderId, Vec<ItemRow>>> {
    let rows: Vec<ItemRow> = order_items::table
        .filter(order_items::account_id.eq(account_id))
        .filter(order_items::order_id.eq_any(order_ids))
        .order((order_items::order_id, order_items::line_number))
        .select(ItemRow::as_select())
        .load(conn)
        .await?;
    let mut by_order: HashMap<OrderId, Vec<ItemRow>> = HashMap::with_capacity(order_ids.len());
    for row in rows {
        by_order.entry(row.order_id).or_default().push(row);
    }
    Ok(by_order)
}

/// One order of the account, with its items.
pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: OrderId,
) -> QueryResult<Option<Order>> {
    // One round trip: the order joined to its items (a payment's settle renders the order for
    // its event with this, so it is on the hot path).
    let rows: Vec<(OrderRow, Vec<PaymentId>, Option<ItemRow>)> = orders::table
        .left_join(
            order_items::table
                .on(order_items::account_id.eq(orders::account_id).and(order_items::order_id.eq(orders::id))),
        )
        .filter(orders::account_id.eq(account_id))
        .filter(orders::id.eq(id))
        .order(order_items::line_number)
        .select((OrderRow::as_select(), payment_ids(), Option::<ItemRow>::as_select()))
        .load(conn)
        .await?;
    let mut rows = rows.into_iter();
    let Some((order, payment_ids, first_item)) = rows.next() else { return Ok(None) };
    let items = first_item.into_iter().chain(rows.filter_map(|(_, _, item)| item)).collect();
    order.into_order(items, payment_ids).map(Some)
}

/// A page of the account's orders, newest first (UUIDv7 ids sort by creation time), strictly
/// older than `starting_after` when given. Returns the page and whether more follow.
pub async fn list(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    limit: i64,
    starting_after: Option<OrderId>,
) -> QueryResult<(Vec<Order>, bool)> {
    let mut query = orders::table.filter(orders::account_id.eq(account_id)).into_boxed();
    if let Some(cursor) = starting_after {
        query = query.filter(orders::id.lt(cursor));
    }
    let rows: Vec<(OrderRow, Vec<PaymentId>)> = query
        .order(orders::id.desc())
        .limit(limit + 1)
        .select((OrderRow::as_select(), payment_ids()))
        .load(conn)
        .await?;
    let (rows, has_more) = crate::db::page_of(rows, limit);
    let ids: Vec<OrderId> = rows.iter().map(|(row, _)| row.id).collect();
    let mut items = load_items(conn, account_id, &ids).await?;
    let orders = rows
        .into_iter()
        .map(|(row, payment_ids)| {
            let order_items = items.remove(&row.id).unwrap_or_default();
            row.into_order(order_items, payment_ids)
        })
        .collect::<QueryResult<Vec<_>>>()?;
    Ok((orders, has_more))
}

/// What a status change needs to know about an order, read under its row lock.
#[derive(Debug, Clone, Copy)]
pub struct LockedOrder {
    pub status: OrderStatus,
    pub total_amount: Amount,
}

/// Locks the order row for the rest of the transaction (`FOR UPDATE`) and returns the database's
/// clock once the lock is held: the time of a change that waited for the order, so that two
/// changes of one order are stamped in the order they commit. `None`: no such order.
pub async fn lock_and_stamp(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: OrderId,
) -> QueryResult<Option<chrono::DateTime<chrono::Utc>>> {
    orders::table
        .find((account_id, id))
        .select(diesel::dsl::sql::<diesel::sql_types::Timestamptz>("clock_timestamp()"))
        .for_update()
        .first(conn)
        .await
        .optional()
}

/// Locks the order row for the rest of the transaction (`FOR UPDATE`) and returns its status and
/// total: the one place where a status change and the checks before it are serialised.
pub async fn lock(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: OrderId,
) -> QueryResult<Option<LockedOrder>> {
    let row: Option<(OrderStatus, Currency, Decimal)> = orders::table
        .find((account_id, id))
        .select((orders::status, orders::currency, orders::total_amount))
        .for_update()
        .first(conn)
        .await
        .optional()?;
    let Some((status, currency, total)) = row else { return Ok(None) };
    Ok(Some(LockedOrder {
        status,
        total_amount: Amount::from_decimal(total, currency)
            .map_err(|e| corrupt(format!("order total: {e}")))?,
    }))
}

/// Moves an order from `from` to `to` if, and only if, it is still in `from`. Returns whether
/// this call made the change.
pub async fn transition(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: OrderId,
    from: OrderStatus,
    to: OrderStatus,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    let updated = diesel::update(orders::table)
        .filter(orders::account_id.eq(account_id))
        .filter(orders::id.eq(id))
        .filter(orders::status.eq(from))
        .set((orders::status.eq(to), orders::updated_at.eq(now)))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}
