//! The public representation of an order: what `GET /orders/{id}` returns, what creating and
//! cancelling answer (and store with their keys), and what order events carry.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{LineItem, Metadata, Order, OrderStatus};
use crate::idempotency::StoredResponse;
use crate::ids::{OrderId, PaymentId};
use crate::money::Amount;

#[derive(Serialize)]
pub struct OrderResource<'a> {
    id: OrderId,
    object: &'static str,
    status: OrderStatus,
    currency: &'static str,
    total_amount: Amount,
    items: Vec<ItemResource<'a>>,
    customer_id: Option<&'a str>,
    metadata: &'a Metadata,
    /// Its payments' ids, oldest first, as they were when this was rendered: a stored answer
    /// keeps them as they were then (the creation's: none).
    payment_ids: &'a [PaymentId],
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Serialize)]
struct ItemResource<'a> {
    sku: &'a str,
    quantity: u32,
    unit_price: Amount,
    amount: Amount,
}

impl<'a> From<&'a Order> for OrderResource<'a> {
    fn from(order: &'a Order) -> Self {
        OrderResource {
            id: order.id,
            object: "order",
            status: order.status,
            currency: order.currency.code(),
            total_amount: order.total_amount,
            items: order.items.iter().map(ItemResource::from).collect(),
            customer_id: order.customer_id.as_deref(),
            metadata: &order.metadata,
            payment_ids: &order.payment_ids,
            created_at: order.created_at,
            updated_at: order.updated_at,
        }
    }
}

impl<'a> From<&'a LineItem> for ItemResource<'a> {
    fn from(item: &'a LineItem) -> Self {
        ItemResource {
            sku: item.sku.as_str(),
            quantity: item.quantity.get(),
            unit_price: item.unit_price,
            amount: item.amount,
        }
    }
}

/// The order as JSON.
pub fn order_json(order: &Order) -> Vec<u8> {
    // Serialising our own plain structs cannot fail.
    serde_json::to_vec(&OrderResource::from(order)).unwrap_or_default()
}

pub fn location(id: OrderId) -> String {
    format!("/orders/{id}")
}

/// 201 with the new order and its `Location`: the answer to `POST /orders`.
pub fn created(order: &Order) -> StoredResponse {
    StoredResponse::json(201, order_json(order)).with_header("location", location(order.id))
}

/// 200 with the order: the answer to a successful cancel.
pub fn ok(order: &Order) -> StoredResponse {
    StoredResponse::json(200, order_json(order))
}
