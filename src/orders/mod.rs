//! Orders: the order domain (types and state machine), its repository, its representation and
//! its service.
//!
//! An order is `pending_payment` when placed; its payments and refunds move it on (see
//! [`OrderStatus`]). Totals are computed here, exactly, from parsed amounts.

pub mod repository;
pub mod representation;
pub mod service;

use std::collections::BTreeMap;

use chrono::{DateTime, SubsecRound, Utc};

use crate::ids::{AccountId, OrderId, PaymentId};
use crate::money::{Amount, AmountError, Currency};

crate::text_enum! {
    /// Order lifecycle: `pending_payment` until a payment captures it (`paid`) or authorizes it
    /// (`authorized`, then `paid` by a capture, or back to `pending_payment` by a void or the
    /// authorization's expiry), or the client cancels it (`cancelled`, final). Refunds move a
    /// paid order to `partially_refunded` and `refunded` (final).
    pub enum OrderStatus {
        PendingPayment = "pending_payment",
        Authorized = "authorized",
        Paid = "paid",
        PartiallyRefunded = "partially_refunded",
        Refunded = "refunded",
        Cancelled = "cancelled",
    }
}

/// A stock-keeping unit: 1 to 64 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sku(String);

impl Sku {
    pub const MAX_CHARS: usize = 64;

    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let chars = text.chars().count();
        if chars == 0 || chars > Self::MAX_CHARS {
            return Err("must be 1 to 64 characters");
        }
        if text.chars().any(char::is_control) {
            return Err("must not contain control characters");
        }
        Ok(Sku(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How many units of a SKU: 1 to 10000.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity(u32);

impl Quantity {
    pub const MAX: u32 = 10_000;

    pub fn new(value: u32) -> Result<Self, &'static str> {
        if (1..=Self::MAX).contains(&value) { Ok(Quantity(value)) } else { Err("must be 1 to 10000") }
    }

    pub fn get(&self) -> u32 {
        self.0
    }
}

/// Free-form string pairs a client attaches to an order (like Stripe's `metadata`).
pub type Metadata = BTreeMap<String, String>;

/// A parsed, valid request to place an order.
#[derive(Debug, Clone)]
pub struct NewOrder {
    pub currency: Currency,
    pub items: Vec<NewLineItem>,
    pub customer_id: Option<String>,
    pub metadata: Metadata,
}

#[derive(Debug, Clone)]
pub struct NewLineItem {
    pub sku: Sku,
    pub quantity: Quantity,
    pub unit_price: Amount,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineItem {
    pub sku: Sku,
    pub quantity: Quantity,
    pub unit_price: Amount,
    /// `unit_price * quantity`, exact.
    pub amount: Amount,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub id: OrderId,
    pub account_id: AccountId,
    pub status: OrderStatus,
    pub currency: Currency,
    pub total_amount: Amount,
    pub customer_id: Option<String>,
    pub metadata: Metadata,
    pub items: Vec<LineItem>,
    /// Its payments, oldest first: none when it is placed.
    pub payment_ids: Vec<PaymentId>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Placing an order failed on its amounts: which line (or the total) overflowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("items[{line}] amount {source}")]
    LineAmount { line: usize, source: AmountError },
    #[error("total_amount {0}")]
    Total(AmountError),
}

impl Order {
    /// Places a new order: assigns a UUIDv7 id and computes every line amount and the total
    /// exactly, refusing (never wrapping) amounts past [`Amount::MAX`]. Times are cut to
    /// microseconds, PostgreSQL's precision, so the answer given now equals what a later read
    /// returns.
    pub fn place(account_id: AccountId, new: NewOrder, now: DateTime<Utc>) -> Result<Order, PlaceError> {
        let now = now.trunc_subsecs(6);
        let mut total = Amount::zero(new.currency);
        let mut items = Vec::with_capacity(new.items.len());
        for (line, item) in new.items.into_iter().enumerate() {
            let amount = item
                .unit_price
                .checked_mul(item.quantity.get())
                .map_err(|source| PlaceError::LineAmount { line, source })?;
            total = total.checked_add(&amount).map_err(PlaceError::Total)?;
            items.push(LineItem {
                sku: item.sku,
                quantity: item.quantity,
                unit_price: item.unit_price,
                amount,
            });
        }
        Ok(Order {
            id: OrderId::generate(),
            account_id,
            status: OrderStatus::PendingPayment,
            currency: new.currency,
            total_amount: total,
            customer_id: new.customer_id,
            metadata: new.metadata,
            items,
            payment_ids: Vec::new(),
            created_at: now,
            updated_at: now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(price: &str, quantity: u32) -> NewLineItem {
        let usd = Currency::parse("USD").unwrap();
        NewLineItem {
            sku: Sku::parse("sku-1").unwrap(),
            quantity: Quantity::new(quantity).unwrap(),
            unit_price: Amount::parse(price, usd).unwrap(),
        }
    }

    fn new_order(items: Vec<NewLineItem>) -> NewOrder {
        NewOrder {
            currency: Currency::parse("USD").unwrap(),
            items,
            customer_id: None,
            metadata: Metadata::new(),
        }
    }

    #[test]
    fn totals_are_exact() {
        let order = Order::place(
            AccountId::generate(),
            new_order(vec![item("0.10", 3), item("19.99", 2)]),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(order.items[0].amount.to_string(), "0.30");
        assert_eq!(order.total_amount.to_string(), "40.28");
        assert_eq!(order.status, OrderStatus::PendingPayment);
    }

    #[test]
    fn overflowing_totals_are_refused() {
        let huge = "999999999999999";
        assert!(matches!(
            Order::place(AccountId::generate(), new_order(vec![item(huge, 2)]), Utc::now()),
            Err(PlaceError::LineAmount { line: 0, .. })
        ));
        assert!(matches!(
            Order::place(AccountId::generate(), new_order(vec![item(huge, 1), item(huge, 1)]), Utc::now()),
            Err(PlaceError::Total(AmountError::TooLarge))
        ));
    }

    #[test]
    fn parsing_bounds() {
        assert!(Sku::parse("").is_err());
        assert!(Sku::parse(&"x".repeat(65)).is_err());
        assert!(Sku::parse(&"é".repeat(64)).is_ok());
        assert!(Sku::parse("a\nb").is_err());
        assert!(Quantity::new(0).is_err());
        assert!(Quantity::new(10_001).is_err());
        assert_eq!(OrderStatus::parse("paid"), Some(OrderStatus::Paid));
        assert_eq!(OrderStatus::parse("PAID"), None);
    }
}
