//! Order persistence: the only code that knows the `orders` and `order_items` tables.
//!
//! Every query is scoped by `account_id`. Status changes are guarded UPDATEs
//! (`WHERE status = 'pending_payment'`), so two racing writers cannot both apply a transition.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::{LineItem, Metadata, Order, OrderStatus, Quantity, Sku};
use crate::db::schema::{order_items, orders};
use crate::db::statement;
use crate::idempotency::{KeyRecord, KeyedRequest, StoredResponse};
use crate::money::{Amount, Currency};

#[derive(Insertable)]
#[diesel(table_name = orders)]
struct NewOrderRow<'a> {
    account_id: Uuid,
    id: Uuid,
    status: &'a str,
    currency: &'a str,
    total_amount: Decimal,
    customer_id: Option<&'a str>,
    metadata: serde_json::Value,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Insertable)]
#[diesel(table_name = order_items)]
struct NewItemRow<'a> {
    account_id: Uuid,
    order_id: Uuid,
    line_number: i16,
    sku: &'a str,
    quantity: i32,
    unit_price: Decimal,
    amount: Decimal,
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = orders)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct OrderRow {
    account_id: Uuid,
    id: Uuid,
    status: String,
    currency: String,
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
    order_id: Uuid,
    sku: String,
    quantity: i32,
    unit_price: Decimal,
    amount: Decimal,
}

/// A row that does not decode into a valid order is a bug or tampering, never client input.
fn corrupt(what: impl Into<String>) -> DbError {
    DbError::DeserializationError(what.into().into())
}

impl OrderRow {
    fn into_order(self, items: Vec<ItemRow>) -> QueryResult<Order> {
        let currency =
            Currency::parse(&self.currency).map_err(|e| corrupt(format!("order currency: {e}")))?;
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
            status: OrderStatus::parse(&self.status).ok_or_else(|| corrupt("order status"))?,
            currency,
            total_amount: amount(self.total_amount)?,
            customer_id: self.customer_id,
            metadata: serde_json::from_value::<Metadata>(self.metadata)
                .map_err(|e| corrupt(format!("order metadata: {e}")))?,
            items,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// The idempotency key row written together with a new order by [`insert_with_key`].
pub struct NewKey<'a> {
    pub request: &'a KeyedRequest,
    pub response: &'a StoredResponse,
    pub expires_at: DateTime<Utc>,
}

const NEW_ORDER_SQL: &str = include_str!("new_order.sql");

/// `new_order.sql` with its parameters: a statement diesel can prepare once per connection and
/// reuse (raw `sql_query` text is prepared anew on every call, one more round trip).
struct NewOrderStatement<'a> {
    account_id: Uuid,
    key: &'a str,
    method: &'a str,
    route: &'a str,
    fingerprint: &'a [u8],
    response_body: &'a [u8],
    response_headers: serde_json::Value,
    response_status: i16,
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    order_id: Uuid,
    currency: &'a str,
    total: Decimal,
    customer_id: Option<&'a str>,
    metadata: serde_json::Value,
    skus: Vec<&'a str>,
    quantities: Vec<i32>,
    unit_prices: Vec<Decimal>,
    amounts: Vec<Decimal>,
}

impl diesel::query_builder::QueryId for NewOrderStatement<'_> {
    type QueryId = NewOrderStatement<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for NewOrderStatement<'_> {
    type SqlType = (
        diesel::sql_types::BigInt,
        // The key row's columns in table order, as `KeyRecord` reads them.
        diesel::sql_types::Nullable<
            diesel::dsl::SqlTypeOf<<crate::db::schema::idempotency_keys::table as diesel::Table>::AllColumns>,
        >,
    );
}

/// What [`insert_with_key`] did.
#[derive(Debug)]
pub enum KeyedInsert {
    /// The key was new: key, order and items are written.
    Inserted,
    /// The key exists; nothing was written. The row, when this statement could see it.
    Exists(Option<Box<KeyRecord>>),
}

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for NewOrderStatement<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{
            Array, Bytea, Int2, Int4, Jsonb, Nullable, Numeric, Text, Timestamptz, Uuid as SqlUuid,
        };
        let sql = statement::strip_comments(NEW_ORDER_SQL);
        statement::walk_numbered(&mut out, "new_order.sql", &sql, |number, out| match number {
            1 => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            2 => out.push_bind_param::<Text, _>(self.key),
            3 => out.push_bind_param::<Text, _>(self.method),
            4 => out.push_bind_param::<Text, _>(self.route),
            5 => out.push_bind_param::<Bytea, _>(self.fingerprint),
            6 => out.push_bind_param::<Bytea, _>(self.response_body),
            7 => out.push_bind_param::<Jsonb, _>(&self.response_headers),
            8 => out.push_bind_param::<Timestamptz, _>(&self.now),
            9 => out.push_bind_param::<Timestamptz, _>(&self.expires_at),
            10 => out.push_bind_param::<SqlUuid, _>(&self.order_id),
            11 => out.push_bind_param::<Text, _>(self.currency),
            12 => out.push_bind_param::<Numeric, _>(&self.total),
            13 => out.push_bind_param::<Nullable<Text>, _>(&self.customer_id),
            14 => out.push_bind_param::<Jsonb, _>(&self.metadata),
            15 => out.push_bind_param::<Array<Text>, _>(&self.skus),
            16 => out.push_bind_param::<Array<Int4>, _>(&self.quantities),
            17 => out.push_bind_param::<Array<Numeric>, _>(&self.unit_prices),
            18 => out.push_bind_param::<Array<Numeric>, _>(&self.amounts),
            19 => out.push_bind_param::<Int2, _>(&self.response_status),
            other => Err(statement::unknown_parameter("new_order.sql", other)),
        })
    }
}

/// Inserts an order, its items and its completed idempotency key in one statement, or, when the
/// key already exists, writes nothing and returns the existing row.
pub async fn insert_with_key(
    conn: &mut AsyncPgConnection,
    order: &Order,
    key: NewKey<'_>,
) -> QueryResult<KeyedInsert> {
    let statement = NewOrderStatement {
        account_id: order.account_id,
        key: key.request.key.as_str(),
        method: &key.request.method,
        route: &key.request.route,
        fingerprint: key.request.fingerprint.as_bytes(),
        response_body: &key.response.body,
        response_headers: crate::idempotency::store::headers_json(key.response),
        response_status: key.response.status as i16,
        now: order.created_at,
        expires_at: key.expires_at,
        order_id: order.id,
        currency: order.currency.code(),
        total: order.total_amount.value(),
        customer_id: order.customer_id.as_deref(),
        metadata: serde_json::to_value(&order.metadata).map_err(|e| corrupt(e.to_string()))?,
        skus: order.items.iter().map(|item| item.sku.as_str()).collect(),
        quantities: order.items.iter().map(|item| item.quantity.get() as i32).collect(),
        unit_prices: order.items.iter().map(|item| item.unit_price.value()).collect(),
        amounts: order.items.iter().map(|item| item.amount.value()).collect(),
    };
    let (claimed, existing): (i64, Option<KeyRecord>) = statement.get_result(conn).await?;
    Ok(if claimed == 1 { KeyedInsert::Inserted } else { KeyedInsert::Exists(existing.map(Box::new)) })
}

/// Inserts an order and its items.
pub async fn insert(conn: &mut AsyncPgConnection, order: &Order) -> QueryResult<()> {
    let metadata = serde_json::to_value(&order.metadata).map_err(|e| corrupt(e.to_string()))?;
    diesel::insert_into(orders::table)
        .values(NewOrderRow {
            account_id: order.account_id,
            id: order.id,
            status: order.status.as_str(),
            currency: order.currency.code(),
            total_amount: order.total_amount.value(),
            customer_id: order.customer_id.as_deref(),
            metadata,
            created_at: order.created_at,
            updated_at: order.updated_at,
        })
        .execute(conn)
        .await?;
    let items: Vec<NewItemRow> = order
        .items
        .iter()
        .enumerate()
        .map(|(line, item)| NewItemRow {
            account_id: order.account_id,
            order_id: order.id,
            // At most 100 lines: validated before an order exists.
            line_number: line as i16,
            sku: item.sku.as_str(),
            quantity: item.quantity.get() as i32,
            unit_price: item.unit_price.value(),
            amount: item.amount.value(),
        })
        .collect();
    diesel::insert_into(order_items::table).values(&items).execute(conn).await?;
    Ok(())
}

async fn load_items(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    order_ids: &[Uuid],
) -> QueryResult<HashMap<Uuid, Vec<ItemRow>>> {
    let rows: Vec<ItemRow> = order_items::table
        .filter(order_items::account_id.eq(account_id))
        .filter(order_items::order_id.eq_any(order_ids))
        .order((order_items::order_id, order_items::line_number))
        .select(ItemRow::as_select())
        .load(conn)
        .await?;
    let mut by_order: HashMap<Uuid, Vec<ItemRow>> = HashMap::with_capacity(order_ids.len());
    for row in rows {
        by_order.entry(row.order_id).or_default().push(row);
    }
    Ok(by_order)
}

/// One order of the account, with its items.
pub async fn find(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<Order>> {
    let row: Option<OrderRow> =
        orders::table.find((account_id, id)).select(OrderRow::as_select()).first(conn).await.optional()?;
    let Some(row) = row else { return Ok(None) };
    let mut items = load_items(conn, account_id, &[id]).await?;
    row.into_order(items.remove(&id).unwrap_or_default()).map(Some)
}

/// A page of the account's orders, newest first (UUIDv7 ids sort by creation time), strictly
/// older than `starting_after` when given. Returns the page and whether more follow.
pub async fn list(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    limit: i64,
    starting_after: Option<Uuid>,
) -> QueryResult<(Vec<Order>, bool)> {
    let mut query = orders::table.filter(orders::account_id.eq(account_id)).into_boxed();
    if let Some(cursor) = starting_after {
        query = query.filter(orders::id.lt(cursor));
    }
    let mut rows: Vec<OrderRow> =
        query.order(orders::id.desc()).limit(limit + 1).select(OrderRow::as_select()).load(conn).await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    let mut items = load_items(conn, account_id, &ids).await?;
    let orders = rows
        .into_iter()
        .map(|row| {
            let order_items = items.remove(&row.id).unwrap_or_default();
            row.into_order(order_items)
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

/// Locks the order row for the rest of the transaction (`FOR UPDATE`) and returns its status and
/// total: the one place where a status change and the checks before it are serialised.
pub async fn lock(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    id: Uuid,
) -> QueryResult<Option<LockedOrder>> {
    let row: Option<(String, String, Decimal)> = orders::table
        .find((account_id, id))
        .select((orders::status, orders::currency, orders::total_amount))
        .for_update()
        .first(conn)
        .await
        .optional()?;
    let Some((status, currency, total)) = row else { return Ok(None) };
    let currency = Currency::parse(&currency).map_err(|e| corrupt(format!("order currency: {e}")))?;
    Ok(Some(LockedOrder {
        status: OrderStatus::parse(&status).ok_or_else(|| corrupt("order status"))?,
        total_amount: Amount::from_decimal(total, currency)
            .map_err(|e| corrupt(format!("order total: {e}")))?,
    }))
}

/// Moves an order from `from` to `to` if, and only if, it is still in `from`. Returns whether
/// this call made the change.
pub async fn transition(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    id: Uuid,
    from: OrderStatus,
    to: OrderStatus,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    let updated = diesel::update(orders::table)
        .filter(orders::account_id.eq(account_id))
        .filter(orders::id.eq(id))
        .filter(orders::status.eq(from.as_str()))
        .set((orders::status.eq(to.as_str()), orders::updated_at.eq(now)))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}
