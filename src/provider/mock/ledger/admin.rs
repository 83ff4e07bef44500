//! The mock's admin views (`GET /_admin/charges`, `GET /_admin/refunds`): every object with
//! what the mock knows about it beyond the API's answer (its request id, how often it was asked).

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::Ledger;
use crate::provider::wire::{ChargeBody, DisputeBody, RefundBody};

impl Ledger {
    /// `GET /_admin/charges`: every charge, oldest first, with what the mock knows about it.
    pub fn admin_charges(&mut self, now: DateTime<Utc>) -> Vec<Value> {
        (0..self.charges.len())
            .map(|index| {
                let body = self.charge_view(index, now);
                let stored = &self.charges[index];
                json!({
                    "request_id": stored.request_id,
                    "requests": stored.requests,
                    "id": body.id,
                    "idempotency_key": body.idempotency_key,
                    "amount": body.amount,
                    "currency": body.currency,
                    "status": body.status,
                    "capture": stored.request.capture,
                    "captured": body.captured,
                    "amount_captured": body.amount_captured,
                    "amount_refunded": body.amount_refunded,
                    "amount_disputed": super::money(stored.amount_disputed, stored.currency),
                    "authorization_expires_at": body.authorization_expires_at,
                    "cancellation_reason": body.cancellation_reason,
                    "decline_code": body.decline_code,
                    "payment_method": body.payment_method,
                    "reference": body.reference,
                    "created_at": body.created_at,
                })
            })
            .collect()
    }

    /// `GET /_admin/refunds`: every refund, oldest first.
    pub fn admin_refunds(&mut self, now: DateTime<Utc>) -> Vec<Value> {
        (0..self.refunds.len())
            .map(|index| {
                let body = self.refund_view(index, now);
                let stored = &self.refunds[index];
                json!({
                    "request_id": stored.request_id,
                    "requests": stored.requests,
                    "id": body.id,
                    "charge": body.charge,
                    "idempotency_key": body.idempotency_key,
                    "amount": body.amount,
                    "currency": body.currency,
                    "status": body.status,
                    "failure_code": body.failure_code,
                    "reference": body.reference,
                    "created_at": body.created_at,
                })
            })
            .collect()
    }

    /// Every charge as its `GET` answers it, oldest first (the Stripe wire's listing).
    pub fn all_charges(&mut self, now: DateTime<Utc>) -> Vec<ChargeBody> {
        (0..self.charges.len()).map(|index| self.charge_view(index, now)).collect()
    }

    /// Every refund as its `GET` answers it, oldest first.
    pub fn all_refunds(&mut self, now: DateTime<Utc>) -> Vec<RefundBody> {
        (0..self.refunds.len()).map(|index| self.refund_view(index, now)).collect()
    }

    /// Every dispute as its `GET` answers it, oldest first.
    pub fn all_disputes(&self) -> Vec<DisputeBody> {
        (0..self.disputes.len()).map(|index| self.dispute_body(index)).collect()
    }
}
