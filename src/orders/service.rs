//! Order use cases. Each writes in one statement or one transaction: the order writes and the
//! idempotency record commit together or not at all (the product's central invariant).

use chrono::Utc;
use diesel_async::AsyncConnection;

use super::{Order, OrderStatus, repository, representation};
use crate::db::Pool;
use crate::error::ApiError;
use crate::events::EventType;
use crate::events::repository::{self as events, NewEvent};
use crate::idempotency::store::{self, Claim, ResourceKind};
use crate::idempotency::{Execution, KeyedRequest, Keys, Resolved, StoredResponse};
use crate::ids::{AccountId, OrderId};
use crate::payments;

/// How often a keyed write tries again when its key changes under it (swept or expired between
/// two statements); more means the database is misbehaving.
const KEY_ROUNDS: usize = 3;

/// Stores a placed order. Its answer is rendered before anything is written (every field is
/// known once the order is placed), so the key row is written with it, in the same statement as
/// the order (`new_order.sql`), keyed or not. A key seen before writes nothing; its row is then
/// read to replay or refuse, or, past its retention, expired and claimed again.
pub async fn create(
    pool: &Pool,
    keys: &Keys,
    order: &Order,
    keyed: Option<&KeyedRequest>,
) -> Result<Execution, ApiError> {
    if let Some(replay) = keyed.and_then(|request| keys.replay(request)) {
        return Ok(replay);
    }
    let answer = representation::created(order);
    let mut conn = pool.get().await?;
    for _ in 0..KEY_ROUNDS {
        let inserted = repository::insert(&mut conn, order, keyed, &answer, keys.retention).await?;
        let Some(request) = keyed else {
            return Ok(Execution::Executed(answer));
        };
        if inserted {
            keys.remember(request, &answer, keys.expiry_of_claim(order.created_at));
            return Ok(Execution::Executed(answer));
        }
        let now = Utc::now();
        let Some(record) = store::find(&mut conn, request.account_id, request.key.as_str()).await? else {
            continue; // swept meanwhile: the key is free again
        };
        match record.resolve(request, now)? {
            Some(Resolved::Answer(stored)) => {
                keys.remember(request, &stored, record.expires_at);
                return Ok(Execution::Replayed(stored));
            }
            Some(Resolved::Operation { .. }) => {
                return Err(ApiError::Internal(anyhow::anyhow!("an order key names a provider operation")));
            }
            None => store::expire(&mut conn, request.account_id, request.key.as_str(), now).await?,
        }
    }
    Err(key_keeps_changing())
}

fn key_keeps_changing() -> ApiError {
    ApiError::Unavailable(anyhow::anyhow!("an idempotency key kept changing while it was claimed"))
}

/// Cancels a `pending_payment` order. Any other state is a final answer too (409
/// `invalid-state`, stored with the key); an unknown order is a 404 and is not stored. An order
/// with a payment in flight is refused (409 `payment-in-progress`, not stored): the order row lock
/// taken here and by a payment's phase 1 orders the two.
pub async fn cancel(
    pool: &Pool,
    keys: &Keys,
    account_id: AccountId,
    order_id: OrderId,
    keyed: Option<&KeyedRequest>,
) -> Result<Execution, ApiError> {
    if let Some(replay) = keyed.and_then(|request| keys.replay(request)) {
        return Ok(replay);
    }
    let mut conn = pool.get().await?;
    let claimed_at = Utc::now();
    let (execution, key_expires_at) = conn
        .transaction(async |conn| {
            if let Some(request) = keyed {
                let resource = (ResourceKind::Order, order_id.as_uuid());
                if let Claim::Existing(record) =
                    store::claim(conn, request, resource, keys.retention, claimed_at).await?
                {
                    return match record.resolve(request, Utc::now())? {
                        Some(Resolved::Answer(stored)) => {
                            Ok((Execution::Replayed(stored), record.expires_at))
                        }
                        _ => Err(key_keeps_changing()),
                    };
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
            let answer = if status == OrderStatus::PendingPayment {
                let now = Utc::now();
                repository::transition(conn, account_id, order_id, status, OrderStatus::Cancelled, now)
                    .await?;
                let order = repository::find(conn, account_id, order_id).await?.ok_or_else(not_found)?;
                let event = NewEvent::new(EventType::OrderCancelled, representation::order_json(&order));
                events::insert(conn, account_id, &[event], now).await?;
                representation::ok(&order)
            } else {
                not_cancellable(order_id, status)
            };
            if let Some(request) = keyed
                && !store::complete(conn, account_id, request.key.as_str(), order_id.as_uuid(), &answer)
                    .await?
            {
                return Err(ApiError::Internal(anyhow::anyhow!("the claimed key vanished")));
            }
            Ok((Execution::Executed(answer), keys.expiry_of_claim(claimed_at)))
        })
        .await?;
    if let Some(request) = keyed {
        keys.remember(request, execution.response(), key_expires_at);
    }
    Ok(execution)
}

fn not_cancellable(order_id: OrderId, current: OrderStatus) -> StoredResponse {
    ApiError::InvalidState {
        resource: "order",
        id: order_id.as_uuid(),
        current: current.to_string(),
        action: "cancelled",
    }
    .to_stored_response()
}

/// One order of the account.
pub async fn get(pool: &Pool, account_id: AccountId, order_id: OrderId) -> Result<Order, ApiError> {
    let mut conn = pool.get().await?;
    repository::find(&mut conn, account_id, order_id)
        .await?
        .ok_or_else(|| ApiError::NotFound { resource: "order", id: order_id.to_string() })
}

/// A page of the account's orders, newest first.
pub async fn list(
    pool: &Pool,
    account_id: AccountId,
    limit: i64,
    starting_after: Option<OrderId>,
) -> Result<(Vec<Order>, bool), ApiError> {
    let mut conn = pool.get().await?;
    Ok(repository::list(&mut conn, account_id, limit, starting_after).await?)
}

/// The `order.paid` event of a settle that moves the order to paid, `None` for one that does not.
pub async fn paid_event(
    conn: &mut diesel_async::AsyncPgConnection,
    account_id: AccountId,
    order_id: OrderId,
    moves_to: Option<OrderStatus>,
    now: chrono::DateTime<Utc>,
) -> diesel::QueryResult<Option<crate::events::repository::NewEvent>> {
    if moves_to != Some(OrderStatus::Paid) {
        return Ok(None);
    }
    let order = rendered_after(conn, account_id, order_id, OrderStatus::Paid, now).await?;
    Ok(order
        .map(|order| crate::events::repository::NewEvent::new(crate::events::EventType::OrderPaid, order)))
}

/// The order's JSON as it will be once moved to `status` at `now` (for the event a settle
/// writes with the move: everything but the status and `updated_at` is fixed at creation).
pub async fn rendered_after(
    conn: &mut diesel_async::AsyncPgConnection,
    account_id: AccountId,
    order_id: OrderId,
    status: OrderStatus,
    now: chrono::DateTime<Utc>,
) -> diesel::QueryResult<Option<Vec<u8>>> {
    Ok(rendered_after_each(conn, account_id, order_id, [status], now).await?.map(|[order]| order))
}

/// The order's JSON as it will be once moved to each of `statuses` at `now`, from one read of
/// the order (a refund's settle names both moves it may make: partially refunded, refunded).
pub async fn rendered_after_each<const N: usize>(
    conn: &mut diesel_async::AsyncPgConnection,
    account_id: AccountId,
    order_id: OrderId,
    statuses: [OrderStatus; N],
    now: chrono::DateTime<Utc>,
) -> diesel::QueryResult<Option<[Vec<u8>; N]>> {
    let Some(mut order) = repository::find(conn, account_id, order_id).await? else {
        return Ok(None);
    };
    order.updated_at = now;
    Ok(Some(statuses.map(|status| {
        order.status = status;
        representation::order_json(&order)
    })))
}
