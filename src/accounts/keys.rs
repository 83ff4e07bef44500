//! The API keys of an account (`api_keys`): created, listed, revoked, looked up by hash.
//!
//! The writers of a key row, one each: [`insert`] (a new key), [`touch`] (its last use, at most
//! once a minute) and [`revoke`] (which also bumps the revocation generation, in the same
//! transaction, so that every instance's cache forgets what it knew).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

use super::{Account, ApiKey, hash_api_key};
use crate::db::schema::{api_key_revocations, api_keys};
use crate::ids::AccountId;

/// How often a key's `last_used_at` is written at most: often enough to tell a key in use from
/// one forgotten in a drawer, rare enough that authentication never costs a write per request.
pub const LAST_USED_RESOLUTION: chrono::Duration = chrono::Duration::minutes(1);

/// A key as listings show it: never its secret, nor its hash.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Serialize)]
#[diesel(table_name = api_keys)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct KeyInfo {
    pub id: Uuid,
    pub account_id: AccountId,
    /// `sk_` and the first 8 hex characters; `None` for a key made before keys had prefixes.
    pub prefix: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Stores a new key of `account_id` (its hash and visible prefix).
pub async fn insert(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    key: &ApiKey,
) -> QueryResult<KeyInfo> {
    diesel::insert_into(api_keys::table)
        .values((
            api_keys::id.eq(Uuid::now_v7()),
            api_keys::account_id.eq(account_id),
            api_keys::key_hash.eq(hash_api_key(key.reveal()).as_slice()),
            api_keys::prefix.eq(key.visible_prefix()),
            api_keys::created_at.eq(Utc::now()),
        ))
        .returning(KeyInfo::as_returning())
        .get_result(conn)
        .await
}

/// Creates a new key for an existing account; `None` when there is no such account. The key is
/// returned in clear this once.
pub async fn create(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
) -> anyhow::Result<Option<(Account, KeyInfo, ApiKey)>> {
    let Some(account) = super::find(conn, account_id).await? else {
        return Ok(None);
    };
    let key = ApiKey::generate()?;
    let info = insert(conn, account_id, &key).await?;
    Ok(Some((account, info, key)))
}

/// The keys of an account, oldest first, revoked ones included.
pub async fn list(conn: &mut AsyncPgConnection, account_id: AccountId) -> QueryResult<Vec<KeyInfo>> {
    api_keys::table
        .filter(api_keys::account_id.eq(account_id))
        .order((api_keys::created_at, api_keys::id))
        .select(KeyInfo::as_select())
        .load(conn)
        .await
}

/// What [`revoke`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    /// Revoked now.
    Revoked(KeyInfo),
    /// It was revoked before; nothing changed.
    AlreadyRevoked(KeyInfo),
}

/// Revokes a key: marks it and bumps the revocation generation in one transaction, so that no
/// instance can see the generation move before the key is refused by the database, nor the key
/// refused while the generation stays. `None`: no such key.
pub async fn revoke(conn: &mut AsyncPgConnection, key_id: Uuid) -> QueryResult<Option<Revocation>> {
    conn.transaction(async |conn| {
        let revoked = diesel::update(api_keys::table)
            .filter(api_keys::id.eq(key_id))
            .filter(api_keys::revoked_at.is_null())
            .set(api_keys::revoked_at.eq(Utc::now()))
            .returning(KeyInfo::as_returning())
            .get_result(conn)
            .await
            .optional()?;
        if let Some(key) = revoked {
            diesel::update(api_key_revocations::table)
                .set(api_key_revocations::generation.eq(api_key_revocations::generation + 1))
                .execute(conn)
                .await?;
            return Ok(Some(Revocation::Revoked(key)));
        }
        let existing =
            api_keys::table.find(key_id).select(KeyInfo::as_select()).first(conn).await.optional()?;
        Ok(existing.map(Revocation::AlreadyRevoked))
    })
    .await
}

/// A live key found by its hash, with its account and the revocation generation read in the
/// same statement (so in the same snapshot): a cache entry made from it is known to predate any
/// later revocation.
#[derive(Debug, Clone, Queryable)]
pub struct Found {
    pub account_id: AccountId,
    pub account_name: String,
    pub account_created_at: DateTime<Utc>,
    pub key_id: Uuid,
    pub last_used_at: Option<DateTime<Utc>>,
    pub generation: i64,
}

impl Found {
    pub fn account(&self) -> Account {
        Account { id: self.account_id, name: self.account_name.clone(), created_at: self.account_created_at }
    }
}

/// The live (not revoked) key whose secret hashes to `key_hash`, with its account.
pub async fn lookup(conn: &mut AsyncPgConnection, key_hash: &[u8; 32]) -> QueryResult<Option<Found>> {
    LookupKey { key_hash: key_hash.as_slice() }.get_result(conn).await.optional()
}

crate::prepared_statement! {
    /// A live key by its hash, with its account and the revocation generation (`lookup_key.sql`).
    pub(crate) struct LookupKey<'a>("lookup_key.sql") -> (Uuid, Text, Timestamptz, Uuid, Nullable<Timestamptz>, BigInt) {
        1 => key_hash: &'a [u8] as Bytea,
    }
}

/// Notes that a key was used at `now`, unless that was noted less than a minute ago (by this
/// instance or any other): the guard makes the statement a no-op then, and a concurrent copy
/// waits for the first and finds the guard false. So a key costs at most one write a minute
/// however many requests and instances use it. Returns whether it wrote.
pub async fn touch(conn: &mut AsyncPgConnection, key_id: Uuid, now: DateTime<Utc>) -> QueryResult<bool> {
    let updated = diesel::update(api_keys::table)
        .filter(api_keys::id.eq(key_id))
        .filter(api_keys::last_used_at.is_null().or(api_keys::last_used_at.le(now - LAST_USED_RESOLUTION)))
        .set(api_keys::last_used_at.eq(now))
        .execute(conn)
        .await?;
    Ok(updated == 1)
}

/// The revocation generation: how many keys were ever revoked, as the one-row counter says.
pub async fn generation(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
    api_key_revocations::table.select(api_key_revocations::generation).first(conn).await
}
