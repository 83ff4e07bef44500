//! What becomes of an authorization (a payment made with `capture_method: manual`): a capture
//! takes all or part of it, a void lets it go. Each is a provider operation of its own, with a
//! row in `payment_operations` holding its unknown outcome while it runs; the payment shows
//! `processing` meanwhile. This module owns that table.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;

use crate::db::schema::payment_operations;
use crate::idempotency::store::ClaimParameters;
use crate::ids::{AccountId, LeaseId, OperationId, OrderId, PaymentId};
use crate::operations::leases::Lease;

use super::PaymentStatus;

crate::text_enum! {
    /// What is done to an authorization.
    pub enum Action {
        Capture = "capture",
        Void = "void",
    }
}

crate::text_enum! {
    /// A capture's or void's own status: `processing` while its outcome is unknown.
    pub enum ActionStatus {
        Processing = "processing",
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

/// A capture or a void.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = payment_operations)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct PaymentOperation {
    pub account_id: AccountId,
    pub id: OperationId,
    pub payment_id: PaymentId,
    pub kind: Action,
    pub status: ActionStatus,
    /// A capture's amount; `None` for a void.
    pub amount: Option<Decimal>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub idempotency_key: Option<String>,
    pub attempts: i32,
    pub lease_until: Option<DateTime<Utc>>,
    pub lease_id: Option<LeaseId>,
    pub created_at: DateTime<Utc>,
}

impl PaymentOperation {
    /// The idempotency key of every provider call for this operation.
    pub fn downstream_key(&self) -> String {
        format!("orderpay_{}_{}", self.kind, self.id)
    }

    pub fn lease(&self) -> Option<Lease> {
        Some(Lease { id: self.lease_id?, until: self.lease_until? })
    }
}

pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: OperationId,
) -> QueryResult<Option<PaymentOperation>> {
    payment_operations::table
        .find((account_id, id))
        .select(PaymentOperation::as_select())
        .first(conn)
        .await
        .optional()
}

/// The payment's capture or void in flight, if any (at most one: the unique index
/// `payment_operations_one_in_flight`, which also serves this lookup).
pub async fn in_flight(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    payment_id: PaymentId,
) -> QueryResult<Option<PaymentOperation>> {
    payment_operations::table
        .filter(payment_operations::account_id.eq(account_id))
        .filter(payment_operations::payment_id.eq(payment_id))
        .filter(payment_operations::status.eq(ActionStatus::Processing))
        .select(PaymentOperation::as_select())
        .first(conn)
        .await
        .optional()
}

/// Every capture and void of a payment, oldest first.
pub async fn for_payment(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    payment_id: PaymentId,
) -> QueryResult<Vec<PaymentOperation>> {
    payment_operations::table
        .filter(payment_operations::account_id.eq(account_id))
        .filter(payment_operations::payment_id.eq(payment_id))
        .order(payment_operations::id)
        .select(PaymentOperation::as_select())
        .load(conn)
        .await
}

crate::text_enum! {
    /// What the statement that starts a capture or a void decided.
    pub enum StartOutcome {
        Started = "started",
        KeyExists = "key_exists",
        PaymentNotFound = "payment_not_found",
        /// The payment is not waiting for a capture.
        InvalidState = "invalid_state",
        /// A capture asked for more than was authorized.
        ExceedsCapturable = "exceeds_capturable",
        /// The payment changed while the statement waited for its lock: nothing of the
        /// operation was written; run the statement again.
        Changed = "changed",
    }
}

crate::prepared_statement! {
    /// A capture or a void started (`start_capture_or_void.sql` after the key claim).
    pub struct StartAction<'a>("../idempotency/claim_key.sql", "start_capture_or_void.sql")
        -> (Text, Nullable<Text>, Nullable<Numeric>, Nullable<Text>)
    {
        group claim: ClaimParameters<'a>,
        13 => payment_id: PaymentId as Uuid,
        14 => kind: Action as Text,
        15 => amount: Option<Decimal> as Nullable<Numeric>,
        16 => lease_until: DateTime<Utc> as Timestamptz,
        17 => lease_id: LeaseId as Uuid,
    }
}

/// What the start statement decided, with the payment's status, authorized amount and failure
/// code as they were.
pub async fn start(
    conn: &mut AsyncPgConnection,
    start: StartAction<'_>,
) -> QueryResult<(StartOutcome, Option<PaymentStatus>, Option<Decimal>, Option<String>)> {
    start.get_result(conn).await
}

crate::prepared_statement! {
    /// A capture or a void settled (`settle_capture_or_void.sql`).
    pub struct SettleAction<'a>("settle_capture_or_void.sql") -> (BigInt, BigInt) {
        group announce: crate::events::Announce<'a>,
        1 => account_id: AccountId as Uuid,
        2 => id: OperationId as Uuid,
        3 => order_id: OrderId as Uuid,
        4 => payment_id: PaymentId as Uuid,
        5 => status: ActionStatus as Text,
        6 => failure_code: Option<&'a str> as Nullable<Text>,
        7 => failure_message: Option<&'a str> as Nullable<Text>,
        8 => now: DateTime<Utc> as Timestamptz,
        9 => actor: &'a str as Text,
        10 => detail: Option<&'a str> as Nullable<Text>,
        11 => answer_status: i16 as Int2,
        12 => answer_body: &'a [u8] as Bytea,
        13 => payment_status: PaymentStatus as Text,
        14 => amount_captured: Option<Decimal> as Nullable<Numeric>,
        15 => payment_failure_code: Option<&'a str> as Nullable<Text>,
        16 => payment_failure_message: Option<&'a str> as Nullable<Text>,
        17 => payment_next_check_at: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        18 => order_status: Option<crate::orders::OrderStatus> as Nullable<Text>,
        19 => quiet_since: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        20 => quiet_lease: Option<LeaseId> as Nullable<Uuid>,
    }
}

/// Runs the settle statement. Returns (operations settled, orders moved).
pub async fn settle(conn: &mut AsyncPgConnection, settle: SettleAction<'_>) -> QueryResult<(i64, i64)> {
    settle.get_result(conn).await
}
