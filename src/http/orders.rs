//! `/orders`: request DTOs, their validation (by hand, like every other body: each field parsed
//! into its domain type, every error reported at once), and the handlers. The order's representation lives
//! with the order domain (`orders::representation`).

use std::borrow::Cow;
use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::auth::Authenticated;
use super::body::{self, JsonBody, OptionalJsonBody};
use super::idempotency::{IdempotencyHeader, respond};
use crate::error::{ApiError, FieldError};
use crate::ids::OrderId;
use crate::money::{self, Amount, AmountError, Currency};
use crate::orders::representation::OrderResource;
use crate::orders::{NewLineItem, NewOrder, Order, PlaceError, Quantity, Sku, service};

/// `POST /orders` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOrderRequest {
    currency: String,
    items: Vec<OrderItemRequest>,
    customer_id: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderItemRequest {
    sku: String,
    quantity: i64,
    /// A decimal string (`"12.50"`) or a JSON number, taken as its exact text.
    unit_price: Value,
}

/// `POST /orders/{id}/cancel` body: nothing, or an empty object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelOrderRequest {}

/// `GET /orders` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListOrdersQuery {
    limit: Option<String>,
    starting_after: Option<String>,
}

/// At most this many items in one order.
const MAX_ITEMS: usize = 100;

fn valid_customer_id(text: &str) -> Result<(), &'static str> {
    if !(1..=255).contains(&text.chars().count()) {
        return Err("must be 1 to 255 characters");
    }
    if text.chars().any(char::is_control) {
        return Err("must not contain control characters");
    }
    Ok(())
}

/// Metadata limits, as Stripe's: at most 50 keys, keys 1 to 40 characters, values up to 500.
fn valid_metadata(metadata: &BTreeMap<String, String>) -> Result<(), &'static str> {
    if metadata.len() > 50 {
        return Err("must have at most 50 keys");
    }
    for (key, value) in metadata {
        if !(1..=40).contains(&key.chars().count()) {
            return Err("keys must be 1 to 40 characters");
        }
        if value.chars().count() > 500 {
            return Err("values must be at most 500 characters");
        }
        if key.contains('\0') || value.contains('\0') {
            return Err("must not contain NUL characters");
        }
    }
    Ok(())
}

/// The text of a money field: a string as is, a number as its exact JSON text.
///
/// Take the value from the body as parsed, not from the request struct deserialised from it:
/// serde_json (with `arbitrary_precision`) keeps a number's exact text in a [`Value`], but when a
/// `Value` is deserialised into a struct, a number goes through an f64 whenever that f64 prints
/// back as the same text, and comes out reformatted: `-0` as `0`, `0.0000001` as `1e-7`.
pub(super) fn decimal_text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::String(text) => Some(Cow::Borrowed(text)),
        Value::Number(number) => Some(Cow::Owned(number.to_string())),
        _ => None,
    }
}

/// Parses a `POST /orders` body into a valid [`NewOrder`], reporting every invalid field at once.
fn parse_new_order(body: Value) -> Result<NewOrder, ApiError> {
    // The prices as written (see `decimal_text`); the struct checks the shape.
    let written_prices: Vec<Value> = match body.get("items") {
        Some(Value::Array(items)) => {
            items.iter().map(|item| item.get("unit_price").cloned().unwrap_or_default()).collect()
        }
        _ => Vec::new(),
    };
    let request: CreateOrderRequest = body::deserialize(body)?;
    let mut errors = Vec::new();
    if !(1..=MAX_ITEMS).contains(&request.items.len()) {
        errors.push(FieldError::new("items", "must list 1 to 100 items"));
    }
    if let Some(Err(error)) = request.customer_id.as_deref().map(valid_customer_id) {
        errors.push(FieldError::new("customer_id", error));
    }
    if let Some(Err(error)) = request.metadata.as_ref().map(valid_metadata) {
        errors.push(FieldError::new("metadata", error));
    }
    let currency = Currency::parse(&request.currency)
        .map_err(|error| errors.push(FieldError::new("currency", error)))
        .ok();
    let mut items = Vec::with_capacity(request.items.len());
    for (index, item) in request.items.iter().enumerate() {
        let field = |name: &str| format!("items[{index}].{name}");
        let sku = Sku::parse(&item.sku).map_err(|e| errors.push(FieldError::new(field("sku"), e)));
        let quantity = u32::try_from(item.quantity)
            .map_err(|_| "must be 1 to 10000")
            .and_then(Quantity::new)
            .map_err(|e| errors.push(FieldError::new(field("quantity"), e)));
        let written = written_prices.get(index).unwrap_or(&item.unit_price);
        let unit_price = match (decimal_text(written), currency) {
            (None, _) => Err(AmountError::Malformed),
            (Some(text), Some(currency)) => Amount::parse(&text, currency).map(Some),
            // Without a valid currency (its error is already reported) the precision cannot be
            // checked, but the grammar, the sign and the size can.
            (Some(text), None) => money::parse_value(&text).map(|_| None),
        }
        .map_err(|error| errors.push(FieldError::new(field("unit_price"), error)));
        if let (Ok(sku), Ok(quantity), Ok(Some(unit_price))) = (sku, quantity, unit_price) {
            items.push(NewLineItem { sku, quantity, unit_price });
        }
    }
    errors.sort_by(|a, b| a.field.cmp(&b.field));
    errors.dedup();
    match currency {
        Some(currency) if errors.is_empty() => Ok(NewOrder {
            currency,
            items,
            customer_id: request.customer_id,
            metadata: request.metadata.unwrap_or_default(),
        }),
        _ => Err(ApiError::Validation(errors)),
    }
}

fn place_error(error: PlaceError) -> ApiError {
    let field = match &error {
        PlaceError::LineAmount { line, .. } => format!("items[{line}].unit_price"),
        PlaceError::Total(_) => "items".to_owned(),
    };
    ApiError::Validation(vec![FieldError::new(field, error)])
}

/// `POST /orders`
pub async fn create(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    key: IdempotencyHeader,
    request: HttpRequest,
    JsonBody(body): JsonBody,
) -> Result<HttpResponse, ApiError> {
    let settings = &state.settings;
    let keyed = key.bind(account.id, &request, "/orders", Some(&body), settings.require_idempotency_key)?;
    let new_order = parse_new_order(body)?;
    let order = Order::place(account.id, new_order, Utc::now()).map_err(place_error)?;
    // An order the provider could never charge is refused now, not at its payment.
    if let Some(refusal) = state.engine.provider.amount_refusal(&order.total_amount) {
        return Err(ApiError::Validation(vec![FieldError::new("items", refusal)]));
    }
    let execution = service::create(&state.pool, &state.keys, &order, keyed.as_ref()).await?;
    Ok(respond(execution, keyed.is_some()))
}

/// `GET /orders/{id}`
pub async fn get(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let order = service::get(&state.pool, account.id, super::parse_id("order", &id, OrderId::parse)?).await?;
    Ok(HttpResponse::Ok().json(OrderResource::from(&order)))
}

/// `GET /orders?limit=&starting_after=`
pub async fn list(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListOrdersQuery = super::list_query(&request)?;
    let limit = super::page_limit(query.limit.as_deref())?;
    let starting_after = super::page_cursor(query.starting_after.as_deref(), "an order", OrderId::parse)?;
    let (orders, has_more) = service::list(&state.pool, account.id, limit, starting_after).await?;
    Ok(super::page(orders.iter().map(OrderResource::from).collect(), has_more))
}

/// `POST /orders/{id}/cancel`
pub async fn cancel(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    key: IdempotencyHeader,
    request: HttpRequest,
    id: web::Path<String>,
    OptionalJsonBody(body): OptionalJsonBody,
) -> Result<HttpResponse, ApiError> {
    let settings = &state.settings;
    let order_id = super::parse_id("order", &id, OrderId::parse)?;
    let route = format!("/orders/{order_id}/cancel");
    let keyed = key.bind(account.id, &request, &route, body.as_ref(), settings.require_idempotency_key)?;
    if let Some(body) = body {
        let CancelOrderRequest {} = body::deserialize(body)?;
    }
    let execution = service::cancel(&state.pool, &state.keys, account.id, order_id, keyed.as_ref()).await?;
    Ok(respond(execution, keyed.is_some()))
}
