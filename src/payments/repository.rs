//! Payment persistence: the only code that knows the `payments` and `payment_events` tables.
//!
//! Every status change is a guarded UPDATE (`WHERE status = 'processing'`) that records its
//! transition in `payment_events` in the same transaction: of two workers racing on one payment,
//! exactly one applies the transition and the other sees the result.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::Error as DbError;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::{Payment, PaymentStatus};
use crate::db::schema::{idempotency_keys, payments};
use crate::db::statement;
use crate::idempotency::KeyRecord;
use crate::money::{Amount, Currency};

#[derive(Queryable, QueryableByName, Selectable, Insertable)]
#[diesel(table_name = payments)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct PaymentRow {
    account_id: Uuid,
    id: Uuid,
    order_id: Uuid,
    status: String,
    amount: Decimal,
    currency: String,
    payment_method: String,
    provider_charge_id: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    idempotency_key: Option<String>,
    attempts: i32,
    next_check_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn corrupt(what: impl Into<String>) -> DbError {
    DbError::DeserializationError(what.into().into())
}

impl PaymentRow {
    fn into_payment(self) -> QueryResult<Payment> {
        let currency =
            Currency::parse(&self.currency).map_err(|e| corrupt(format!("payment currency: {e}")))?;
        Ok(Payment {
            id: self.id,
            account_id: self.account_id,
            order_id: self.order_id,
            status: PaymentStatus::parse(&self.status).ok_or_else(|| corrupt("payment status"))?,
            amount: Amount::from_decimal(self.amount, currency)
                .map_err(|e| corrupt(format!("payment amount: {e}")))?,
            payment_method: self.payment_method,
            provider_charge_id: self.provider_charge_id,
            failure_code: self.failure_code,
            failure_message: self.failure_message,
            idempotency_key: self.idempotency_key,
            attempts: self.attempts,
            next_check_at: self.next_check_at,
            last_error: self.last_error,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    fn of(payment: &Payment) -> PaymentRow {
        PaymentRow {
            account_id: payment.account_id,
            id: payment.id,
            order_id: payment.order_id,
            status: payment.status.as_str().to_owned(),
            amount: payment.amount.value(),
            currency: payment.amount.currency().code().to_owned(),
            payment_method: payment.payment_method.clone(),
            provider_charge_id: payment.provider_charge_id.clone(),
            failure_code: payment.failure_code.clone(),
            failure_message: payment.failure_message.clone(),
            idempotency_key: payment.idempotency_key.clone(),
            attempts: payment.attempts,
            next_check_at: payment.next_check_at,
            last_error: payment.last_error.clone(),
            created_at: payment.created_at,
            updated_at: payment.updated_at,
        }
    }
}

pub async fn insert(conn: &mut AsyncPgConnection, payment: &Payment) -> QueryResult<()> {
    diesel::insert_into(payments::table).values(PaymentRow::of(payment)).execute(conn).await?;
    Ok(())
}

pub async fn find(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<Payment>> {
    payments::table
        .find((account_id, id))
        .select(PaymentRow::as_select())
        .first(conn)
        .await
        .optional()?
        .map(PaymentRow::into_payment)
        .transpose()
}

/// The order's payment whose outcome is still unknown, if any (at most one: a unique index).
pub async fn processing_for_order(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    order_id: Uuid,
) -> QueryResult<Option<Uuid>> {
    payments::table
        .filter(payments::account_id.eq(account_id))
        .filter(payments::order_id.eq(order_id))
        .filter(payments::status.eq(PaymentStatus::Processing.as_str()))
        .select(payments::id)
        .first(conn)
        .await
        .optional()
}

/// Leaves a `processing` payment for a later check at `next_check_at`, noting why.
pub async fn reschedule(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    id: Uuid,
    next_check_at: DateTime<Utc>,
    last_error: &str,
    now: DateTime<Utc>,
) -> QueryResult<bool> {
    let updated = diesel::update(payments::table)
        .filter(payments::account_id.eq(account_id))
        .filter(payments::id.eq(id))
        .filter(payments::status.eq(PaymentStatus::Processing.as_str()))
        .set((
            payments::next_check_at.eq(Some(next_check_at)),
            payments::last_error.eq(Some(last_error)),
            payments::updated_at.eq(now),
        ))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// A payment claimed by the reconciler, with the lease on its key that the reconciler now owns
/// (`None` when the payment has no key row any more).
#[derive(Debug)]
pub struct Claimed {
    pub payment: Payment,
    pub lease_id: Option<Uuid>,
}

/// The reconciler's claim: up to `limit` `processing` payments that are due, skipping rows
/// another reconciler holds (`FOR UPDATE SKIP LOCKED`) and payments whose key is leased by a
/// live driver. The key's lease is the lock: it is taken here by compare-and-set (waiting for a
/// concurrent takeover to commit, then seeing it held), and a payment whose lease cannot be taken
/// is left alone. Each claimed payment counts an attempt and is hidden from other reconcilers
/// until `claimed_until`, when its lease runs out too.
pub async fn claim_due(
    conn: &mut AsyncPgConnection,
    now: DateTime<Utc>,
    limit: i64,
    claimed_until: DateTime<Utc>,
) -> QueryResult<Vec<Claimed>> {
    let due: Vec<PaymentRow> = diesel::sql_query(
        "SELECT p.* FROM payments p \
         WHERE p.status = 'processing' AND p.next_check_at <= $1 \
           AND NOT EXISTS ( \
               SELECT 1 FROM idempotency_keys k \
               WHERE k.account_id = p.account_id AND k.key = p.idempotency_key \
                 AND k.resource_id = p.id AND k.state = 'in_progress' AND k.locked_until > $1) \
         ORDER BY p.next_check_at \
         LIMIT $2 \
         FOR UPDATE OF p SKIP LOCKED",
    )
    .bind::<diesel::sql_types::Timestamptz, _>(now)
    .bind::<diesel::sql_types::BigInt, _>(limit)
    .load(conn)
    .await?;
    let mut claimed = Vec::with_capacity(due.len());
    for row in due {
        let payment = row.into_payment()?;
        let lease_id = match &payment.idempotency_key {
            None => None,
            Some(key) => {
                let lease_id = Uuid::now_v7();
                let in_progress = idempotency_keys::table
                    .filter(idempotency_keys::account_id.eq(payment.account_id))
                    .filter(idempotency_keys::key.eq(key))
                    .filter(idempotency_keys::state.eq("in_progress"))
                    .filter(idempotency_keys::resource_id.eq(payment.id));
                let leased = diesel::update(in_progress)
                    .filter(
                        idempotency_keys::locked_until.is_null().or(idempotency_keys::locked_until.le(now)),
                    )
                    .set((
                        idempotency_keys::locked_until.eq(Some(claimed_until)),
                        idempotency_keys::lease_id.eq(Some(lease_id)),
                    ))
                    .execute(conn)
                    .await?;
                if leased == 1 {
                    Some(lease_id)
                } else if diesel::select(diesel::dsl::exists(in_progress)).get_result(conn).await? {
                    continue; // a live driver holds it
                } else {
                    None // the key row is gone (or reused): nothing to lease
                }
            }
        };
        diesel::update(payments::table)
            .filter(payments::account_id.eq(payment.account_id))
            .filter(payments::id.eq(payment.id))
            .set((
                payments::next_check_at.eq(Some(claimed_until)),
                payments::attempts.eq(payments::attempts + 1),
            ))
            .execute(conn)
            .await?;
        let payment =
            Payment { attempts: payment.attempts + 1, next_check_at: Some(claimed_until), ..payment };
        claimed.push(Claimed { payment, lease_id });
    }
    Ok(claimed)
}

const START_PAYMENT_SQL: &str = include_str!("start_payment.sql");
const SETTLE_PAYMENT_SQL: &str = include_str!("settle_payment.sql");

/// Phase 1's one statement (`start_payment.sql`) and its parameters.
pub struct StartPayment<'a> {
    pub account_id: Uuid,
    pub key: &'a str,
    pub method: &'a str,
    pub route: &'a str,
    pub fingerprint: &'a [u8],
    pub now: DateTime<Utc>,
    pub key_expires_at: DateTime<Utc>,
    pub lease_until: DateTime<Utc>,
    pub lease_id: Uuid,
    pub payment_id: Uuid,
    pub order_id: Uuid,
    pub payment_method: &'a str,
    pub first_check_at: DateTime<Utc>,
    pub amount: Option<Decimal>,
}

impl diesel::query_builder::QueryId for StartPayment<'_> {
    type QueryId = StartPayment<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for StartPayment<'_> {
    type SqlType = (
        diesel::sql_types::BigInt,
        diesel::sql_types::Nullable<diesel::sql_types::Text>,
        diesel::sql_types::Nullable<diesel::sql_types::Numeric>,
        diesel::sql_types::Nullable<diesel::sql_types::Text>,
        diesel::sql_types::BigInt,
        diesel::sql_types::Nullable<
            diesel::dsl::SqlTypeOf<<idempotency_keys::table as diesel::Table>::AllColumns>,
        >,
    );
}

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for StartPayment<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{Bytea, Nullable, Numeric, Text, Timestamptz, Uuid as SqlUuid};
        let sql = statement::strip_comments(START_PAYMENT_SQL);
        statement::walk_numbered(&mut out, "start_payment.sql", &sql, |number, out| match number {
            1 => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            2 => out.push_bind_param::<Text, _>(self.key),
            3 => out.push_bind_param::<Text, _>(self.method),
            4 => out.push_bind_param::<Text, _>(self.route),
            5 => out.push_bind_param::<Bytea, _>(self.fingerprint),
            6 => out.push_bind_param::<Timestamptz, _>(&self.now),
            7 => out.push_bind_param::<Timestamptz, _>(&self.key_expires_at),
            8 => out.push_bind_param::<Timestamptz, _>(&self.lease_until),
            9 => out.push_bind_param::<SqlUuid, _>(&self.lease_id),
            10 => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            11 => out.push_bind_param::<SqlUuid, _>(&self.order_id),
            12 => out.push_bind_param::<Text, _>(self.payment_method),
            13 => out.push_bind_param::<Timestamptz, _>(&self.first_check_at),
            14 => out.push_bind_param::<Nullable<Numeric>, _>(&self.amount),
            other => Err(statement::unknown_parameter("start_payment.sql", other)),
        })
    }
}

/// What phase 1's statement found and did.
#[derive(Debug)]
pub struct Started {
    /// The key was new and is now claimed (committed, in progress, leased).
    pub claimed: bool,
    /// The order's status, total and currency, when the key was claimed and the order exists.
    pub order: Option<(String, Decimal, String)>,
    /// The payment was inserted `processing`.
    pub started: bool,
    /// The key's existing row, when it was not claimed and this statement could see it.
    pub existing: Option<KeyRecord>,
}

/// Runs phase 1's statement.
pub async fn start(conn: &mut AsyncPgConnection, start: &StartPayment<'_>) -> QueryResult<Started> {
    type Row = (i64, Option<String>, Option<Decimal>, Option<String>, i64, Option<KeyRecord>);
    let (claimed, status, total, currency, started, existing): Row = start.get_result(conn).await?;
    let order = match (status, total, currency) {
        (Some(status), Some(total), Some(currency)) => Some((status, total, currency)),
        _ => None,
    };
    Ok(Started { claimed: claimed == 1, order, started: started == 1, existing })
}

/// Phase 2's one statement (`settle_payment.sql`) and its parameters.
pub struct SettlePayment<'a> {
    pub account_id: Uuid,
    pub payment_id: Uuid,
    pub status: &'static str,
    pub provider_charge_id: Option<&'a str>,
    pub failure_code: Option<&'a str>,
    pub failure_message: Option<&'a str>,
    pub now: DateTime<Utc>,
    pub actor: &'static str,
    pub detail: Option<&'a str>,
    pub response_status: i16,
    pub response_headers: serde_json::Value,
    pub response_body: &'a [u8],
}

impl diesel::query_builder::QueryId for SettlePayment<'_> {
    type QueryId = SettlePayment<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for SettlePayment<'_> {
    type SqlType = (diesel::sql_types::BigInt, diesel::sql_types::BigInt);
}

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for SettlePayment<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{Bytea, Int2, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
        let sql = statement::strip_comments(SETTLE_PAYMENT_SQL);
        statement::walk_numbered(&mut out, "settle_payment.sql", &sql, |number, out| match number {
            1 => out.push_bind_param::<SqlUuid, _>(&self.account_id),
            2 => out.push_bind_param::<SqlUuid, _>(&self.payment_id),
            3 => out.push_bind_param::<Text, _>(self.status),
            4 => out.push_bind_param::<Nullable<Text>, _>(&self.provider_charge_id),
            5 => out.push_bind_param::<Nullable<Text>, _>(&self.failure_code),
            6 => out.push_bind_param::<Nullable<Text>, _>(&self.failure_message),
            7 => out.push_bind_param::<Timestamptz, _>(&self.now),
            8 => out.push_bind_param::<Text, _>(self.actor),
            9 => out.push_bind_param::<Nullable<Text>, _>(&self.detail),
            10 => out.push_bind_param::<Int2, _>(&self.response_status),
            11 => out.push_bind_param::<Jsonb, _>(&self.response_headers),
            12 => out.push_bind_param::<Bytea, _>(self.response_body),
            other => Err(statement::unknown_parameter("settle_payment.sql", other)),
        })
    }
}

/// Runs phase 2's statement. Returns (payments settled, orders marked paid).
pub async fn settle(conn: &mut AsyncPgConnection, settle: &SettlePayment<'_>) -> QueryResult<(i64, i64)> {
    settle.get_result(conn).await
}
