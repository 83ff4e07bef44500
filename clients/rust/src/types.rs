//! The API's requests and resources, as openapi.yaml describes them. Money is a decimal string
//! (`"19.99"`), never a float; ids are UUID strings; times are RFC 3339 strings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An exact amount: a decimal string with the currency's minor units (`"19.99"`, `"1200"` in
/// JPY).
pub type Money = String;

/// `POST /orders`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateOrder {
    pub currency: String,
    pub items: Vec<OrderItemRequest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderItemRequest {
    pub sku: String,
    pub quantity: u32,
    pub unit_price: Money,
}

/// A movement of money in the account's books (`GET /balance_transactions`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BalanceTransaction {
    pub id: String,
    #[serde(rename = "type")]
    pub transaction_type: String,
    /// What moved, always positive (a decimal string).
    pub amount: String,
    /// What it did to what the provider holds for the merchant: negative when money left.
    pub net: String,
    pub currency: String,
    pub debit: String,
    pub credit: String,
    pub source: BalanceTransactionSource,
    pub payment_id: String,
    pub order_id: String,
    pub created_at: String,
}

/// A dispute of a payment, as the provider reported it (`GET /disputes/{id}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Dispute {
    pub id: String,
    pub payment_id: String,
    pub order_id: String,
    pub provider_dispute_id: String,
    /// A decimal string, as every amount.
    pub amount: String,
    pub currency: String,
    pub reason: String,
    /// `warning_needs_response`, `warning_under_review`, `warning_closed`, `needs_response`,
    /// `under_review`, `won` or `lost`.
    pub status: String,
    /// `accepted`, `evidence_not_submitted` or `decided`, once closed.
    pub closed_reason: Option<String>,
    pub evidence_due_by: Option<String>,
    pub amount_withdrawn: String,
    pub amount_reinstated: String,
    pub created_at: String,
    pub updated_at: String,
}

/// The payment, refund or dispute whose outcome moved the money.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BalanceTransactionSource {
    pub object: String,
    pub id: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Order {
    pub id: String,
    pub status: String,
    pub currency: String,
    pub total_amount: Money,
    pub items: Vec<OrderItem>,
    pub customer_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// The order's payments, oldest first, as they were when this was rendered.
    pub payment_ids: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct OrderItem {
    pub sku: String,
    pub quantity: u32,
    pub unit_price: Money,
    pub amount: Money,
}

/// `POST /payments`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatePayment {
    pub order_id: String,
    pub payment_method: String,
    /// A guard: when given, it must equal the order's total.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<Money>,
    /// `automatic` (the default) or `manual`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_method: Option<String>,
}

/// `POST /payments/{id}/capture`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Capture {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<Money>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Payment {
    pub id: String,
    pub order_id: String,
    /// `processing`, `requires_capture`, `succeeded`, `failed` or `canceled`.
    pub status: String,
    pub amount: Money,
    pub currency: String,
    pub capture_method: String,
    pub amount_capturable: Money,
    pub amount_captured: Money,
    pub amount_refunded: Money,
    /// Withdrawn by disputes and not reinstated; absent from servers older than the field.
    #[serde(default)]
    pub amount_disputed: Option<Money>,
    pub payment_method: String,
    pub provider_charge_id: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// `POST /disputes/{id}/evidence`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisputeEvidence {
    /// What the merchant tells the card network, as text (1 to 20,000 characters).
    pub evidence: String,
}

/// `POST /refunds`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateRefund {
    pub payment_id: String,
    /// All that is still refundable when left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<Money>,
    /// `requested_by_customer`, `duplicate` or `fraudulent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Refund {
    pub id: String,
    pub payment_id: String,
    pub order_id: String,
    pub amount: Money,
    pub currency: String,
    /// `processing`, `succeeded` or `failed`.
    pub status: String,
    pub reason: Option<String>,
    pub provider_refund_id: Option<String>,
    pub failure_code: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// An event: a change to an order, a payment or a refund, with the resource as it was after.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub created_at: String,
    pub data: EventData,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EventData {
    pub object: EventObject,
}

/// The resource an event carries, told apart by its `object` member.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "object", rename_all = "snake_case")]
pub enum EventObject {
    Order(Order),
    Payment(Payment),
    Refund(Refund),
}

/// `POST /webhook_endpoints`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateWebhookEndpoint {
    pub url: String,
    /// `["*"]` or event types.
    pub enabled_events: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WebhookEndpoint {
    pub id: String,
    pub url: String,
    pub enabled_events: Vec<String>,
    pub description: Option<String>,
    /// The signing secret (`whsec_...`): in the answer that made it only, `None` elsewhere.
    #[serde(default)]
    pub secret: Option<String>,
    pub previous_secret_expires_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DeletedWebhookEndpoint {
    pub id: String,
    pub deleted: bool,
}

/// A page of a list, newest first.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct List<T> {
    pub data: Vec<T>,
    pub has_more: bool,
}

/// The query of a list: a page size (1 to 100) and a cursor (the id the page starts after),
/// and the filters some lists take.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListParams {
    pub limit: Option<u32>,
    pub starting_after: Option<String>,
    /// `GET /payments` and `GET /balance_transactions`: only this order's.
    pub order_id: Option<String>,
    /// `GET /payments` and `GET /disputes`: only this status.
    pub status: Option<String>,
    /// `GET /refunds`, `GET /balance_transactions` and `GET /disputes`: only this payment's.
    pub payment_id: Option<String>,
    /// `GET /events` and `GET /balance_transactions`: only this type.
    pub event_type: Option<String>,
}

impl ListParams {
    pub(crate) fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        let fields = [
            ("limit", self.limit.map(|limit| limit.to_string())),
            ("starting_after", self.starting_after.clone()),
            ("order_id", self.order_id.clone()),
            ("status", self.status.clone()),
            ("payment_id", self.payment_id.clone()),
            ("type", self.event_type.clone()),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                query.push((name, value));
            }
        }
        query
    }
}
