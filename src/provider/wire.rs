//! The provider's JSON, shared by the client and the mock so that they cannot drift apart.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `POST /v1/charges` body. Amounts are exact decimal strings, as everywhere in orderpay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateChargeBody {
    pub amount: String,
    pub currency: String,
    pub payment_method: String,
    pub reference: String,
}

/// A charge as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeBody {
    pub id: String,
    pub object: String,
    pub idempotency_key: String,
    pub amount: String,
    pub currency: String,
    /// `succeeded`, `declined` or `pending`.
    pub status: String,
    pub payment_method: String,
    pub reference: String,
    pub decline_code: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// An error answer: `{"error": {"type": ..., "message": ...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}
