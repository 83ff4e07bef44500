//! Webhook endpoint use cases. A keyed create or rotation writes the endpoint and its key's
//! answer in one transaction, as an order's cancel does; the answer stored for the key leaves the
//! new secret out (`secret: null`), so the secret is shown once, in the answer that made it.

use chrono::{DateTime, SubsecRound, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};

use super::endpoints::{self, Subscriber};
use super::queue;
use super::relay::deliveries;
use super::{
    DeliveryOrigin, EnabledEvents, Endpoint, EndpointUrl, WebhookSettings, address, representation, secrets,
};
use crate::db::Pool;
use crate::error::ApiError;
use crate::events::{Event, repository as events};
use crate::idempotency::store::{self, Claim, KeyRecord, ResourceKind};
use crate::idempotency::{Execution, KeyedRequest, Keys, Resolved, StoredResponse};
use crate::ids::{AccountId, DeliveryId, EndpointId, EventId};
use crate::webhook_signature::Secret;

/// A valid `POST /webhook_endpoints` body.
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    pub url: EndpointUrl,
    pub enabled_events: EnabledEvents,
    pub description: Option<String>,
}

fn not_found(id: EndpointId) -> ApiError {
    ApiError::NotFound { resource: "webhook_endpoint", id: id.to_string() }
}

fn internal(error: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(anyhow::anyhow!("{error}"))
}

/// A new secret and its sealed form for the endpoint's row.
fn new_secret(
    settings: &WebhookSettings,
    account_id: AccountId,
    id: EndpointId,
) -> Result<(String, Vec<u8>), ApiError> {
    let secret = Secret::generate().map_err(internal)?.reveal();
    let sealed =
        secrets::seal(&settings.encryption_keys, account_id, id, secret.as_bytes()).map_err(internal)?;
    Ok((secret, sealed))
}

/// What an earlier use of the key answers: its stored answer (replayed), or a conflict.
fn answer_of(record: &KeyRecord, request: &KeyedRequest) -> Result<Execution, ApiError> {
    match record.resolve(request, Utc::now())? {
        Some(Resolved::Answer(stored)) => Ok(Execution::Replayed(stored)),
        Some(Resolved::Operation { .. }) => {
            Err(ApiError::Internal(anyhow::anyhow!("a webhook endpoint key names a provider operation")))
        }
        None => {
            Err(ApiError::Unavailable(anyhow::anyhow!("an idempotency key expired while it was claimed")))
        }
    }
}

/// Claims the request's key (if any) for endpoint `id` in the caller's transaction: the answer
/// of an earlier use of the key when there was one, and when the key expires.
async fn claim(
    conn: &mut AsyncPgConnection,
    keys: &Keys,
    keyed: Option<&KeyedRequest>,
    id: EndpointId,
) -> Result<(Option<Execution>, DateTime<Utc>), ApiError> {
    let now = Utc::now();
    let Some(request) = keyed else { return Ok((None, keys.expiry_of_claim(now))) };
    let resource = (ResourceKind::WebhookEndpoint, id.as_uuid());
    match store::claim(conn, request, resource, keys.retention, now).await? {
        Claim::Acquired => Ok((None, keys.expiry_of_claim(now))),
        Claim::Existing(record) => Ok((Some(answer_of(&record, request)?), record.expires_at)),
    }
}

/// Stores `stored` for the key the caller's transaction claimed.
async fn complete(
    conn: &mut AsyncPgConnection,
    keyed: Option<&KeyedRequest>,
    id: EndpointId,
    stored: &StoredResponse,
) -> Result<(), ApiError> {
    if let Some(request) = keyed
        && !store::complete(conn, request.account_id, request.key.as_str(), id.as_uuid(), stored).await?
    {
        return Err(ApiError::Internal(anyhow::anyhow!("the claimed key vanished")));
    }
    Ok(())
}

/// The end of a keyed write: remembers the key's answer, and answers with the one shown (with
/// the secret) when this request made it.
fn finish(
    keys: &Keys,
    keyed: Option<&KeyedRequest>,
    (execution, key_expires_at): (Execution, DateTime<Utc>),
    shown: Option<StoredResponse>,
) -> Execution {
    if let Some(request) = keyed {
        keys.remember(request, execution.response(), key_expires_at);
    }
    shown.map_or(execution, Execution::Executed)
}

/// Registers an endpoint with a new secret. The URL's destination is checked first (a name is
/// resolved, outside any transaction), unless the key was used before: that answers as it did,
/// whatever the name resolves to now.
pub async fn create(
    pool: &Pool,
    keys: &Keys,
    settings: &WebhookSettings,
    account_id: AccountId,
    new: NewEndpoint,
    keyed: Option<&KeyedRequest>,
) -> Result<Execution, ApiError> {
    if let Some(request) = keyed {
        if let Some(replay) = keys.replay(request) {
            return Ok(replay);
        }
        let mut conn = pool.get().await?;
        if let Some(record) = store::find(&mut conn, request.account_id, request.key.as_str()).await?
            && record.expires_at > Utc::now()
        {
            let earlier = answer_of(&record, request)?;
            keys.remember(request, earlier.response(), record.expires_at);
            return Ok(earlier);
        }
    }
    if settings.require_https && new.url.is_insecure() {
        return Err(ApiError::WebhookUrlNotAllowed(
            "the URL is http: webhooks go to https URLs only, so that events and their signatures \
             do not cross the network in clear"
                .to_owned(),
        ));
    }
    if !settings.allow_private {
        address::check_at_creation(new.url.as_url(), settings.delivery.timeout)
            .await
            .map_err(|refused| ApiError::WebhookUrlNotAllowed(refused.0))?;
    }
    // What PostgreSQL keeps: the answer shows what a later read returns.
    let now = Utc::now().trunc_subsecs(6);
    let endpoint = Endpoint {
        account_id,
        id: EndpointId::generate(),
        url: new.url,
        description: new.description,
        enabled_events: new.enabled_events,
        previous_secret_expires_at: None,
        created_at: now,
        updated_at: now,
    };
    let (secret, sealed) = new_secret(settings, account_id, endpoint.id)?;
    let mut conn = pool.get().await?;
    let (execution, shown) = conn
        .transaction(async |conn| {
            let (earlier, key_expires_at) = claim(conn, keys, keyed, endpoint.id).await?;
            if let Some(earlier) = earlier {
                return Ok(((earlier, key_expires_at), None));
            }
            endpoints::insert_endpoint(conn, &endpoint, &sealed).await?;
            let stored = representation::created(&endpoint, None);
            complete(conn, keyed, endpoint.id, &stored).await?;
            Ok::<_, ApiError>((
                (Execution::Executed(stored), key_expires_at),
                Some(representation::created(&endpoint, Some(&secret))),
            ))
        })
        .await?;
    Ok(finish(keys, keyed, execution, shown))
}

/// Warns, at start, about the live endpoints that receive events over plain `http` (registered
/// before https was required): they keep receiving, and the warning names some of them.
pub async fn warn_about_insecure_endpoints(pool: &Pool) {
    const NAMED: i64 = 20;
    let found = async {
        let mut conn = pool.get().await.map_err(|error| anyhow::anyhow!("{error}"))?;
        Ok::<_, anyhow::Error>(endpoints::insecure_endpoints(&mut conn, NAMED).await?)
    };
    match found.await {
        Ok((0, _)) => {}
        Ok((count, some)) => {
            let named: Vec<String> =
                some.iter().map(|(account, endpoint)| format!("{endpoint} (account {account})")).collect();
            tracing::warn!(
                count,
                endpoints = %named.join(", "),
                "webhook endpoints with plain http URLs: their events and signatures cross the network \
                 in clear; they keep receiving (`insecure: true` on GET /webhook_endpoints) until their \
                 merchants register https URLs and delete them"
            );
        }
        Err(error) => tracing::warn!(error = ?error, "could not look for webhook endpoints with http URLs"),
    }
}

/// Gives a live endpoint a new secret; the one it had keeps signing beside it for
/// `secret_overlap`, sealed again under the first key. An unknown endpoint is a 404 and is not
/// stored.
///
/// A secret that opens under no key of `ORDERPAY_ENCRYPTION_KEY` cannot sign beside the new
/// one: it is dropped (no overlap, `previous_secret_expires_at: null` in the answer), so that
/// the 200 is true: every delivery from now on is signed, with the new secret. That is also the
/// way out for an endpoint whose secret was sealed under a key that is gone.
pub async fn rotate_secret(
    pool: &Pool,
    keys: &Keys,
    settings: &WebhookSettings,
    account_id: AccountId,
    id: EndpointId,
    keyed: Option<&KeyedRequest>,
) -> Result<Execution, ApiError> {
    if let Some(replay) = keyed.and_then(|request| keys.replay(request)) {
        return Ok(replay);
    }
    let (secret, sealed) = new_secret(settings, account_id, id)?;
    let mut conn = pool.get().await?;
    let (execution, shown) = conn
        .transaction(async |conn| {
            let (earlier, key_expires_at) = claim(conn, keys, keyed, id).await?;
            if let Some(earlier) = earlier {
                return Ok(((earlier, key_expires_at), None));
            }
            let now = Utc::now().trunc_subsecs(6);
            let current = endpoints::lock_secret(conn, account_id, id).await?.ok_or_else(|| not_found(id))?;
            let keys = &settings.encryption_keys;
            let previous = match secrets::open(keys, account_id, id, &current) {
                Ok(opened) => Some((
                    secrets::seal(keys, account_id, id, &opened.plaintext).map_err(internal)?,
                    crate::clock::after(now, settings.secret_overlap),
                )),
                Err(unreadable) => {
                    tracing::error!(
                        account = %account_id,
                        endpoint = %id,
                        "{unreadable}; rotated without an overlap: the new secret alone signs"
                    );
                    None
                }
            };
            let previous = previous.as_ref().map(|(sealed, until)| (sealed.as_slice(), *until));
            let endpoint = endpoints::rotate_secret(conn, account_id, id, &sealed, previous, now)
                .await?
                .ok_or_else(|| not_found(id))?;
            let stored = representation::rotated(&endpoint, None);
            complete(conn, keyed, id, &stored).await?;
            Ok::<_, ApiError>((
                (Execution::Executed(stored), key_expires_at),
                Some(representation::rotated(&endpoint, Some(&secret))),
            ))
        })
        .await?;
    Ok(finish(keys, keyed, execution, shown))
}

pub async fn get(pool: &Pool, account_id: AccountId, id: EndpointId) -> Result<Endpoint, ApiError> {
    let mut conn = pool.get().await?;
    endpoints::find_endpoint(&mut conn, account_id, id).await?.ok_or_else(|| not_found(id))
}

pub async fn list(
    pool: &Pool,
    account_id: AccountId,
    limit: i64,
    starting_after: Option<EndpointId>,
) -> Result<(Vec<Endpoint>, bool), ApiError> {
    let mut conn = pool.get().await?;
    Ok(endpoints::list_endpoints(&mut conn, account_id, limit, starting_after).await?)
}

/// Deletes a live endpoint and stops its pending deliveries (one already being sent still
/// arrives; its outcome changes nothing).
pub async fn delete(pool: &Pool, account_id: AccountId, id: EndpointId) -> Result<(), ApiError> {
    let mut conn = pool.get().await?;
    let canceled = endpoints::delete_endpoint(&mut conn, account_id, id, Utc::now())
        .await?
        .ok_or_else(|| not_found(id))?;
    tracing::info!(account = %account_id, endpoint = %id, canceled, "webhook endpoint deleted");
    Ok(())
}

/// A delivery queued by [`redeliver`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Queued {
    pub delivery_id: DeliveryId,
    pub event_id: EventId,
    pub event_type: &'static str,
    pub endpoint_id: EndpointId,
    pub url: String,
}

/// Why nothing was queued.
#[derive(Debug, thiserror::Error)]
pub enum RedeliverError {
    #[error("no event {0}")]
    NoEvent(EventId),
    #[error("no live webhook endpoint {endpoint} in account {account} (the event's)")]
    NoEndpoint { endpoint: EndpointId, account: AccountId },
    #[error("webhook endpoint {endpoint} does not receive {event_type} events")]
    NotSubscribed { endpoint: EndpointId, event_type: &'static str },
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// Queues new deliveries of an event, due now: to every live endpoint of its account that
/// receives its type, or to `only` that one. Deliveries already made or pending stay as they
/// are; the endpoint receives the event again (the same `webhook-id`).
pub async fn redeliver(
    conn: &mut AsyncPgConnection,
    event_id: EventId,
    only: Option<EndpointId>,
) -> Result<Vec<Queued>, RedeliverError> {
    let event: Event =
        events::find_in_any_account(conn, event_id).await?.ok_or(RedeliverError::NoEvent(event_id))?;
    conn.transaction(async |conn| {
        let subscribers: Vec<Subscriber> = endpoints::subscribers(conn, &[event.account_id], only).await?;
        if let Some(endpoint) = only {
            let Some(subscriber) = subscribers.first() else {
                return Err(RedeliverError::NoEndpoint { endpoint, account: event.account_id });
            };
            if !subscriber.enabled_events.accepts(event.event_type) {
                let event_type = event.event_type.as_str();
                return Err(RedeliverError::NotSubscribed { endpoint, event_type });
            }
        }
        let queued = deliveries(std::slice::from_ref(&event), &subscribers, DeliveryOrigin::Redeliver);
        queue::insert_deliveries(conn, &queued, Utc::now()).await?;
        Ok(queued
            .iter()
            .map(|delivery| Queued {
                delivery_id: delivery.id,
                event_id: event.id,
                event_type: event.event_type.as_str(),
                endpoint_id: delivery.endpoint_id,
                url: subscribers
                    .iter()
                    .find(|subscriber| subscriber.id == delivery.endpoint_id)
                    .map(|subscriber| subscriber.url.clone())
                    .unwrap_or_default(),
            })
            .collect())
    })
    .await
}
