//! Order use cases, each one database transaction: the order writes and the idempotency record
//! commit together or not at all (the product's central invariant).

use std::time::Duration;

use chrono::Utc;
use diesel_async::AsyncConnection;
use uuid::Uuid;

use super::repository::KeyedInsert;
use super::{Order, OrderStatus, repository};
use crate::clock::after;
use crate::db::Pool;
use crate::error::ApiError;
use crate::idempotency::cache::ReplayCache;
use crate::idempotency::store::{self, Claim, ClaimAs};
use crate::idempotency::{Execution, KeyedRequest, StoredResponse};
use crate::payments;

/// Stores a placed order. `response` is its answer, rendered before anything is written (every
/// field is known once the order is placed), so with a key the key row is written already
/// completed. A new key takes the fast path: key, order and items in one statement, one round
/// trip (`new_order.sql`). A key seen before takes the general path of `idempotency::store`, in
/// one transaction: replay, refuse, or (a key past its retention) run anew.
pub async fn create(
    pool: &Pool,
    replays: &ReplayCache,
    order: &Order,
    keyed: Option<&KeyedRequest>,
    response: &StoredResponse,
    retention: Duration,
) -> Result<Execution, ApiError> {
    let now = Utc::now();
    if let Some(request) = keyed
        && let Some(stored) = replays.replay(request, now)
    {
        return Ok(Execution::Replayed(stored));
    }
    let mut conn = pool.get().await?;
    if let Some(request) = keyed {
        let expires_at = after(now, retention);
        let key = repository::NewKey { request, response, expires_at };
        match repository::insert_with_key(&mut conn, order, key).await? {
            KeyedInsert::Inserted => {
                replays.remember(request, response, expires_at);
                return Ok(Execution::Executed(response.clone()));
            }
            // A replay or a reuse, decided without a transaction or a commit.
            KeyedInsert::Exists(Some(record)) if record.expires_at > now => {
                replays.remember_record(request, &record);
                return store::replay_local(&record, request, now);
            }
            // Past its retention, or not visible yet: the general path below.
            KeyedInsert::Exists(_) => {}
        }
    }
    conn.transaction(async |conn| {
        if let Some(request) = keyed {
            let claim_as = ClaimAs::Completed { response, resource_id: Some(order.id) };
            if let Claim::Existing(record) =
                store::claim(conn, request, claim_as, retention, Utc::now()).await?
            {
                return store::replay_local(&record, request, Utc::now());
            }
        }
        repository::insert(conn, order).await?;
        Ok(Execution::Executed(response.clone()))
    })
    .await
}

/// Cancels a `pending_payment` order. Any other state is a final answer too (409
/// `invalid-state`, stored with the key); an unknown order is a 404 and is not stored. An order
/// with a payment in flight is refused (409 `payment-in-progress`, not stored): the order row lock
/// taken here and by a payment's phase 1 orders the two.
pub async fn cancel(
    pool: &Pool,
    account_id: Uuid,
    order_id: Uuid,
    keyed: Option<&KeyedRequest>,
    retention: Duration,
    render: impl Fn(&Order) -> StoredResponse + Send + Sync,
) -> Result<Execution, ApiError> {
    let mut conn = pool.get().await?;
    conn.transaction(async |conn| {
        if let Some(request) = keyed {
            let claim_as =
                ClaimAs::InProgress { lease: None, resource_id: Some(order_id), recovery_point: "started" };
            if let Claim::Existing(record) =
                store::claim(conn, request, claim_as, retention, Utc::now()).await?
            {
                return store::replay_local(&record, request, Utc::now());
            }
        }
        let not_found = || ApiError::NotFound { resource: "order", id: order_id.to_string() };
        let status = repository::lock(conn, account_id, order_id).await?.ok_or_else(not_found)?.status;
        if status == OrderStatus::PendingPayment
            && let Some(payment_id) =
                payments::repository::processing_for_order(conn, account_id, order_id).await?
        {
            // Its outcome is unknown: the customer may have been charged. Not a final answer.
            return Err(ApiError::PaymentInProgress { order_id, payment_id });
        }
        let response = if status == OrderStatus::PendingPayment {
            let now = Utc::now();
            repository::transition(conn, account_id, order_id, status, OrderStatus::Cancelled, now).await?;
            let order = repository::find(conn, account_id, order_id).await?.ok_or_else(not_found)?;
            render(&order)
        } else {
            ApiError::InvalidState {
                resource: "order",
                id: order_id,
                current: status.to_string(),
                action: "cancelled",
            }
            .to_stored_response()
        };
        if let Some(request) = keyed
            && !store::complete(conn, account_id, request.key.as_str(), order_id, &response).await?
        {
            return Err(ApiError::Internal(anyhow::anyhow!("the claimed key vanished")));
        }
        Ok(Execution::Executed(response))
    })
    .await
}

/// One order of the account.
pub async fn get(pool: &Pool, account_id: Uuid, order_id: Uuid) -> Result<Order, ApiError> {
    let mut conn = pool.get().await?;
    repository::find(&mut conn, account_id, order_id)
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "order", id: order_id.to_string() })
}

/// A page of the account's orders, newest first.
pub async fn list(
    pool: &Pool,
    account_id: Uuid,
    limit: i64,
    starting_after: Option<Uuid>,
) -> Result<(Vec<Order>, bool), ApiError> {
    let mut conn = pool.get().await?;
    Ok(repository::list(&mut conn, account_id, limit, starting_after).await?)
}
