//! The merchant's answers to a dispute, as the `dispute_responses` table holds them: evidence
//! submitted, or the dispute accepted. Each is a provider operation (`operations::dispute_response`
//! drives it); this module is the only code that knows the table: the start statement
//! (`start_response.sql`, claiming the key with it), the settle (`settle_response.sql`) and the
//! reads.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::DisputeStatus;
use crate::db::schema::dispute_responses;
use crate::idempotency::store::ClaimParameters;
use crate::ids::{AccountId, LeaseId};

crate::text_enum! {
    /// What the merchant answers.
    pub enum ResponseKind {
        /// Text evidence, submitted: the dispute goes under review.
        Evidence = "evidence",
        /// No contest: the dispute is lost (an inquiry closes).
        Accept = "accept",
    }
}

crate::text_enum! {
    pub enum ResponseStatus {
        Processing = "processing",
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

/// A response as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = dispute_responses)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct DisputeResponse {
    pub account_id: AccountId,
    pub id: Uuid,
    pub dispute_id: Uuid,
    pub kind: ResponseKind,
    pub status: ResponseStatus,
    pub evidence: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub idempotency_key: Option<String>,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

impl DisputeResponse {
    /// The idempotency key of every provider call for this response.
    pub fn downstream_key(&self) -> String {
        format!("orderpay_dispute_{}_{}", self.kind, self.id)
    }
}

pub async fn find(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: Uuid,
) -> QueryResult<Option<DisputeResponse>> {
    dispute_responses::table
        .find((account_id, id))
        .select(DisputeResponse::as_select())
        .first(conn)
        .await
        .optional()
}

crate::text_enum! {
    /// What the start statement decided.
    pub enum StartOutcome {
        Started = "started",
        KeyExists = "key_exists",
        DisputeNotFound = "dispute_not_found",
        /// The dispute does not need a response (any more).
        InvalidState = "invalid_state",
        /// Evidence after it was due.
        PastDue = "past_due",
        /// Another response of the dispute is in flight.
        InFlight = "in_flight",
        Changed = "changed",
    }
}

crate::prepared_statement! {
    pub struct StartResponse<'a>("../idempotency/claim_key.sql", "start_response.sql")
        -> (Text, Nullable<Text>, Nullable<Timestamptz>, Nullable<Uuid>)
    {
        group claim: ClaimParameters<'a>,
        13 => dispute_id: Uuid as Uuid,
        14 => kind: ResponseKind as Text,
        15 => evidence: Option<&'a str> as Nullable<Text>,
        16 => lease_until: DateTime<Utc> as Timestamptz,
        17 => lease_id: LeaseId as Uuid,
    }
}

/// What the start statement decided, with the dispute's status and evidence due date as it read
/// them and the response in flight, if one is.
pub type Started = (StartOutcome, Option<DisputeStatus>, Option<DateTime<Utc>>, Option<Uuid>);

pub async fn start(conn: &mut AsyncPgConnection, start: StartResponse<'_>) -> QueryResult<Started> {
    start.get_result(conn).await
}

crate::prepared_statement! {
    pub struct SettleResponse<'a>("settle_response.sql") -> BigInt {
        1 => account_id: AccountId as Uuid,
        2 => id: Uuid as Uuid,
        3 => status: ResponseStatus as Text,
        4 => failure_code: Option<&'a str> as Nullable<Text>,
        5 => failure_message: Option<&'a str> as Nullable<Text>,
        6 => now: DateTime<Utc> as Timestamptz,
        7 => answer_status: i16 as Int2,
        8 => answer_body: &'a [u8] as Bytea,
        9 => quiet_since: Option<DateTime<Utc>> as Nullable<Timestamptz>,
        10 => quiet_lease: Option<LeaseId> as Nullable<Uuid>,
    }
}

/// Applies a settle; 1 when it applied, 0 when someone settled it first (or a give-up was held
/// back).
pub async fn settle(conn: &mut AsyncPgConnection, settle: SettleResponse<'_>) -> QueryResult<i64> {
    settle.get_result(conn).await
}
