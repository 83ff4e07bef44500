//! The endpoints merchants register: the only code that knows the `webhook_endpoints` table
//! (the delivery queue is [`super::queue`]).
//!
//! The writers: [`insert_endpoint`], [`rotate_secret`], [`replace_sealed_secrets`] (a reseal
//! under a new key) and [`delete_endpoint`] (which cancels the endpoint's pending deliveries in
//! the same statement). [`subscribers`] is what the relay and redeliveries read.
//!
//! Lock order (docs/architecture.md): an endpoint row, then deliveries, then attempts. The
//! relay takes its endpoints `FOR SHARE` before it writes their deliveries, and a deletion
//! locks its endpoint before it cancels, so a deletion either comes first (and the relay writes
//! none for it) or waits for the round and then cancels what it wrote.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::{EnabledEvents, Endpoint, EndpointUrl};
use crate::db::schema::webhook_endpoints;
use crate::ids::{AccountId, EndpointId};

/// A row that does not decode into a valid endpoint is a bug or tampering, never client input.
fn corrupt(what: String) -> diesel::result::Error {
    diesel::result::Error::DeserializationError(what.into())
}

#[derive(Queryable, Selectable)]
#[diesel(table_name = webhook_endpoints)]
#[diesel(check_for_backend(diesel::pg::Pg))]
struct EndpointRow {
    account_id: AccountId,
    id: EndpointId,
    url: String,
    description: Option<String>,
    enabled_events: Vec<Option<String>>,
    previous_secret_expires_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn enabled_events(stored: Vec<Option<String>>) -> QueryResult<EnabledEvents> {
    let names: Vec<String> = stored.into_iter().flatten().collect();
    EnabledEvents::parse(&names).map_err(|problems| corrupt(format!("endpoint events: {problems:?}")))
}

impl TryFrom<EndpointRow> for Endpoint {
    type Error = diesel::result::Error;

    fn try_from(row: EndpointRow) -> QueryResult<Endpoint> {
        Ok(Endpoint {
            account_id: row.account_id,
            id: row.id,
            url: EndpointUrl::parse(&row.url).map_err(|error| corrupt(format!("endpoint url: {error}")))?,
            description: row.description,
            enabled_events: enabled_events(row.enabled_events)?,
            previous_secret_expires_at: row.previous_secret_expires_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

fn stored_events(events: &EnabledEvents) -> Vec<Option<&'static str>> {
    events.names().into_iter().map(Some).collect()
}

/// Inserts a new endpoint with its sealed secret.
pub async fn insert_endpoint(
    conn: &mut AsyncPgConnection,
    endpoint: &Endpoint,
    secret: &[u8],
) -> QueryResult<()> {
    diesel::insert_into(webhook_endpoints::table)
        .values((
            webhook_endpoints::account_id.eq(endpoint.account_id),
            webhook_endpoints::id.eq(endpoint.id),
            webhook_endpoints::url.eq(endpoint.url.as_str()),
            webhook_endpoints::description.eq(endpoint.description.as_deref()),
            webhook_endpoints::enabled_events.eq(stored_events(&endpoint.enabled_events)),
            webhook_endpoints::secret.eq(Some(secret)),
            webhook_endpoints::created_at.eq(endpoint.created_at),
            webhook_endpoints::updated_at.eq(endpoint.updated_at),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// One live (not deleted) endpoint of the account.
pub async fn find_endpoint(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
) -> QueryResult<Option<Endpoint>> {
    let row = webhook_endpoints::table
        .find((account_id, id))
        .filter(webhook_endpoints::deleted_at.is_null())
        .select(EndpointRow::as_select())
        .first(conn)
        .await
        .optional()?;
    row.map(Endpoint::try_from).transpose()
}

/// A page of the account's live endpoints, newest first, strictly older than `starting_after`
/// when given. Returns the page and whether more follow.
pub async fn list_endpoints(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    limit: i64,
    starting_after: Option<EndpointId>,
) -> QueryResult<(Vec<Endpoint>, bool)> {
    let mut query = webhook_endpoints::table
        .filter(webhook_endpoints::account_id.eq(account_id))
        .filter(webhook_endpoints::deleted_at.is_null())
        .into_boxed();
    if let Some(cursor) = starting_after {
        query = query.filter(webhook_endpoints::id.lt(cursor));
    }
    let mut rows: Vec<EndpointRow> = query
        .order(webhook_endpoints::id.desc())
        .limit(limit + 1)
        .select(EndpointRow::as_select())
        .load(conn)
        .await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let endpoints = rows.into_iter().map(Endpoint::try_from).collect::<QueryResult<Vec<_>>>()?;
    Ok((endpoints, has_more))
}

/// A live endpoint's sealed secret, its row locked until the caller's transaction ends (a
/// rotation reads it before it replaces it); `None` when there is no such live endpoint.
pub async fn lock_secret(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
) -> QueryResult<Option<Vec<u8>>> {
    let secret: Option<Option<Vec<u8>>> = webhook_endpoints::table
        .find((account_id, id))
        .filter(webhook_endpoints::deleted_at.is_null())
        .select(webhook_endpoints::secret)
        .for_update()
        .first(conn)
        .await
        .optional()?;
    Ok(secret.flatten())
}

/// Replaces a live endpoint's secret by `secret`; `previous` (the replaced one, sealed, and until
/// when it keeps signing) becomes the previous secret, or none (a secret rotated out before,
/// still signing, stops now either way). Returns the endpoint after the change, `None` when there
/// is no such live endpoint.
pub async fn rotate_secret(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
    secret: &[u8],
    previous: Option<(&[u8], DateTime<Utc>)>,
    now: DateTime<Utc>,
) -> QueryResult<Option<Endpoint>> {
    let row = diesel::update(webhook_endpoints::table.find((account_id, id)))
        .filter(webhook_endpoints::deleted_at.is_null())
        .set((
            webhook_endpoints::previous_secret.eq(previous.map(|(sealed, _)| sealed)),
            webhook_endpoints::previous_secret_expires_at.eq(previous.map(|(_, until)| until)),
            webhook_endpoints::secret.eq(Some(secret)),
            webhook_endpoints::updated_at.eq(now),
        ))
        .returning(EndpointRow::as_returning())
        .get_result(conn)
        .await
        .optional()?;
    row.map(Endpoint::try_from).transpose()
}

/// Deletes a live endpoint: it keeps its row (its deliveries name it) without its secrets, and
/// its pending deliveries are canceled, in one transaction. Returns how many were canceled, or
/// `None` when there is no such live endpoint.
///
/// The endpoint's row is locked first, in a statement of its own: that waits for a relay round
/// (or a redelivery) holding it `FOR SHARE` to commit the deliveries it wrote. The cancel then
/// runs in a statement that starts after that commit, so its snapshot sees those deliveries. In
/// one statement it would not: the snapshot is taken before the wait, and a row inserted meanwhile
/// is not re-read (only rows that were updated are), so the round's deliveries stayed pending,
/// retried until they failed.
pub async fn delete_endpoint(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    id: EndpointId,
    now: DateTime<Utc>,
) -> QueryResult<Option<i64>> {
    conn.transaction(async |conn| {
        let live = webhook_endpoints::table
            .find((account_id, id))
            .filter(webhook_endpoints::deleted_at.is_null())
            .select(webhook_endpoints::id)
            .for_update()
            .first::<EndpointId>(conn)
            .await
            .optional()?;
        if live.is_none() {
            return Ok(None);
        }
        let (deleted, canceled): (i64, i64) =
            DeleteEndpoint { account_id, id, now: &now }.get_result(conn).await?;
        Ok((deleted == 1).then_some(canceled))
    })
    .await
}

/// A live endpoint's sealed secrets, as `orderpay secrets reseal` reads them.
#[derive(Debug, Clone, Queryable)]
pub struct SealedSecrets {
    pub account_id: AccountId,
    pub id: EndpointId,
    pub secret: Vec<u8>,
    pub previous_secret: Option<Vec<u8>>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

/// Up to `limit` live endpoints' sealed secrets, in key order, after `after` when given.
pub async fn sealed_secrets_after(
    conn: &mut AsyncPgConnection,
    after: Option<(AccountId, EndpointId)>,
    limit: i64,
) -> QueryResult<Vec<SealedSecrets>> {
    let mut query = webhook_endpoints::table
        .filter(webhook_endpoints::deleted_at.is_null())
        .filter(webhook_endpoints::secret.is_not_null())
        .into_boxed();
    if let Some((account_id, id)) = after {
        query = query.filter(
            webhook_endpoints::account_id
                .gt(account_id)
                .or(webhook_endpoints::account_id.eq(account_id).and(webhook_endpoints::id.gt(id))),
        );
    }
    query
        .order((webhook_endpoints::account_id, webhook_endpoints::id))
        .limit(limit)
        .select((
            webhook_endpoints::account_id,
            webhook_endpoints::id,
            webhook_endpoints::secret.assume_not_null(),
            webhook_endpoints::previous_secret,
            webhook_endpoints::previous_secret_expires_at,
        ))
        .load(conn)
        .await
}

/// Stores an endpoint's secrets sealed again (`previous`: none drops the previous secret), if
/// they are still the ones `read` saw: a rotation or a deletion since wins. One statement, one
/// row lock. Returns whether it was written.
pub async fn replace_sealed_secrets(
    conn: &mut AsyncPgConnection,
    read: &SealedSecrets,
    secret: &[u8],
    previous: Option<&[u8]>,
) -> QueryResult<bool> {
    let written = diesel::update(webhook_endpoints::table.find((read.account_id, read.id)))
        .filter(webhook_endpoints::deleted_at.is_null())
        .filter(webhook_endpoints::secret.eq(&read.secret))
        .filter(webhook_endpoints::previous_secret.is_not_distinct_from(read.previous_secret.as_deref()))
        .set((
            webhook_endpoints::secret.eq(Some(secret)),
            webhook_endpoints::previous_secret.eq(previous),
            webhook_endpoints::previous_secret_expires_at.eq(previous.and(read.previous_secret_expires_at)),
        ))
        .execute(conn)
        .await?;
    Ok(written == 1)
}

/// The live endpoints whose URL is plain `http` (registered before https was required, or with
/// `ORDERPAY_WEBHOOK_REQUIRE_HTTPS=false`): how many, and up to `limit` of them.
pub async fn insecure_endpoints(
    conn: &mut AsyncPgConnection,
    limit: i64,
) -> QueryResult<(i64, Vec<(AccountId, EndpointId)>)> {
    let insecure = webhook_endpoints::table
        .filter(webhook_endpoints::deleted_at.is_null())
        .filter(webhook_endpoints::url.like("http:%"));
    let count = insecure.count().get_result(conn).await?;
    let some = insecure
        .select((webhook_endpoints::account_id, webhook_endpoints::id))
        .order((webhook_endpoints::account_id, webhook_endpoints::id))
        .limit(limit)
        .load(conn)
        .await?;
    Ok((count, some))
}

/// A live endpoint as the relay and redeliveries see it.
#[derive(Debug, Clone)]
pub struct Subscriber {
    pub account_id: AccountId,
    pub id: EndpointId,
    pub url: String,
    pub enabled_events: EnabledEvents,
    pub created_at: DateTime<Utc>,
}

/// The live endpoints of `account_ids` (one of them alone with `only`), locked `FOR SHARE` until
/// the caller's transaction ends: a deletion waits for the deliveries written for them, and then
/// cancels them.
pub async fn subscribers(
    conn: &mut AsyncPgConnection,
    account_ids: &[AccountId],
    only: Option<EndpointId>,
) -> QueryResult<Vec<Subscriber>> {
    type Row = (AccountId, EndpointId, String, Vec<Option<String>>, DateTime<Utc>);
    let rows: Vec<Row> = Subscribers { account_ids, only }.load(conn).await?;
    rows.into_iter()
        .map(|(account_id, id, url, events, created_at)| {
            Ok(Subscriber { account_id, id, url, enabled_events: enabled_events(events)?, created_at })
        })
        .collect()
}

crate::prepared_statement! {
    /// An endpoint deleted with its pending deliveries canceled (`sql/delete_endpoint.sql`).
    pub(crate) struct DeleteEndpoint<'a>("sql/delete_endpoint.sql") -> (BigInt, BigInt) {
        1 => account_id: AccountId as Uuid,
        2 => id: EndpointId as Uuid,
        3 => now: &'a DateTime<Utc> as Timestamptz,
    }
}

crate::prepared_statement! {
    /// The live endpoints of some accounts, locked `FOR SHARE` (`sql/subscribers.sql`).
    pub(crate) struct Subscribers<'a>("sql/subscribers.sql")
        -> (Uuid, Uuid, Text, Array<Nullable<Text>>, Timestamptz)
    {
        1 => account_ids: &'a [AccountId] as Array<Uuid>,
        2 => only: Option<EndpointId> as Nullable<Uuid>,
    }
}
