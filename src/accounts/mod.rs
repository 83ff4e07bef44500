//! Accounts (tenants) and their secret API keys.
//!
//! A key is `sk_` followed by 64 hex characters (256 random bits). It is printed once at creation
//! and only its SHA-256 is stored: with that much entropy a fast hash is as safe as a slow one,
//! and lets every request authenticate with one indexed lookup.
//!
//! An account holds any number of keys (`api_keys`), each created, used and revoked on its own,
//! so that a key can be rotated without downtime: create a new one, deploy it, revoke the old
//! one ([`keys`]). Authenticated keys are cached in memory ([`cache`]); a revocation reaches
//! every instance's cache within a second through a generation counter ([`revocations`]).

pub mod cache;
pub mod keys;
pub mod revocations;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

pub use cache::AccountCache;

use crate::db::schema::accounts;
use crate::ids::AccountId;

pub const API_KEY_PREFIX: &str = "sk_";

/// Hex characters of the secret shown after `sk_` in listings: 32 of its 256 bits.
const VISIBLE_HEX: usize = 8;

/// A freshly generated secret API key. Deliberately not `Debug` or `Display`, so it cannot end up
/// in a log line by accident; [`ApiKey::reveal`] is the one way to read it.
pub struct ApiKey(String);

impl ApiKey {
    pub fn generate() -> anyhow::Result<Self> {
        let mut secret = [0_u8; 32];
        crate::crypto::fill_random(&mut secret)?;
        Ok(ApiKey(format!("{API_KEY_PREFIX}{}", hex::encode(secret))))
    }

    pub fn reveal(&self) -> &str {
        &self.0
    }

    /// What listings show of the key (`sk_` and its first 8 hex characters), so that a person
    /// can tell which key a client holds without the secret being kept anywhere.
    pub fn visible_prefix(&self) -> String {
        self.0.chars().take(API_KEY_PREFIX.len() + VISIBLE_HEX).collect()
    }
}

/// SHA-256 of a presented key, the form it is stored and looked up in.
pub fn hash_api_key(presented: &str) -> [u8; 32] {
    crate::crypto::sha256(presented.as_bytes())
}

/// The account a request is authenticated as.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Serialize)]
#[diesel(table_name = accounts)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Account {
    pub id: AccountId,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// An account as `orderpay accounts list` shows it.
#[derive(Debug, Clone, Queryable, Serialize)]
pub struct AccountSummary {
    pub id: AccountId,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// Keys not revoked.
    pub live_keys: i64,
}

/// Creates an account with its first API key, in one transaction, and returns both: the only
/// time the key exists in clear.
pub async fn create(conn: &mut AsyncPgConnection, name: &str) -> anyhow::Result<(Account, ApiKey)> {
    let name = name.trim().to_owned();
    anyhow::ensure!(
        (1..=200).contains(&name.chars().count()) && !name.contains('\0'),
        "an account name is 1 to 200 characters"
    );
    let key = ApiKey::generate()?;
    let account = conn
        .transaction(async |conn| {
            let account = diesel::insert_into(accounts::table)
                .values((
                    accounts::id.eq(AccountId::generate()),
                    accounts::name.eq(&name),
                    accounts::created_at.eq(Utc::now()),
                ))
                .returning(Account::as_returning())
                .get_result(conn)
                .await?;
            keys::insert(conn, account.id, &key).await?;
            Ok::<_, diesel::result::Error>(account)
        })
        .await?;
    Ok((account, key))
}

/// One account, by id.
pub async fn find(conn: &mut AsyncPgConnection, id: AccountId) -> QueryResult<Option<Account>> {
    accounts::table.find(id).select(Account::as_select()).first(conn).await.optional()
}

/// Every account, oldest first, with its number of live keys.
pub async fn list(conn: &mut AsyncPgConnection) -> QueryResult<Vec<AccountSummary>> {
    ListAccounts.load(conn).await
}

crate::prepared_statement! {
    /// Every account with its number of live keys (`list_accounts.sql`).
    pub(crate) struct ListAccounts("list_accounts.sql") -> (Uuid, Text, Timestamptz, BigInt);
}

/// Authenticates a presented key: from the cache when it was seen recently and no key has been
/// revoked since, else from the database (and then cached). Notes the key's use at most once a
/// minute (see [`keys::touch`]), in a task of its own so that no request waits for that write.
pub async fn authenticate(
    cache: &AccountCache,
    pool: &crate::db::Pool,
    presented: &str,
) -> Result<Option<Account>, crate::error::ApiError> {
    if !presented.starts_with(API_KEY_PREFIX) {
        return Ok(None);
    }
    let hash = hash_api_key(presented);
    let now = Utc::now();
    if let Some(hit) = cache.get(&hash) {
        if hit.usage.due(now) {
            spawn_touch(pool.clone(), hit.key_id, now);
        }
        return Ok(Some(hit.account));
    }
    let mut conn = pool.get().await?;
    let Some(found) = keys::lookup(&mut conn, &hash).await? else {
        return Ok(None);
    };
    let usage = cache::Usage::since(found.last_used_at);
    if usage.due(now) {
        spawn_touch(pool.clone(), found.key_id, now);
    }
    let account = found.account();
    cache.put(
        hash,
        cache::Cached { account: account.clone(), key_id: found.key_id, usage },
        found.generation,
    );
    Ok(Some(account))
}

fn spawn_touch(pool: crate::db::Pool, key_id: uuid::Uuid, now: DateTime<Utc>) {
    tokio::spawn(async move {
        let touched = async {
            let mut conn = pool.get().await?;
            anyhow::Ok(keys::touch(&mut conn, key_id, now).await?)
        };
        if let Err(error) = touched.await {
            // Only bookkeeping: the request it belongs to was served.
            tracing::debug!(%key_id, error = %error, "could not note an API key's last use");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_prefixed_random_and_hash_deterministically() {
        let a = ApiKey::generate().unwrap();
        let b = ApiKey::generate().unwrap();
        assert!(a.reveal().starts_with("sk_"));
        assert_eq!(a.reveal().len(), 3 + 64);
        assert_ne!(a.reveal(), b.reveal());
        assert_eq!(hash_api_key(a.reveal()), hash_api_key(a.reveal()));
        assert_ne!(hash_api_key(a.reveal()), hash_api_key(b.reveal()));
    }

    #[test]
    fn the_visible_prefix_is_sk_and_eight_hex_characters_of_the_secret() {
        let key = ApiKey::generate().unwrap();
        let prefix = key.visible_prefix();
        assert_eq!(prefix.len(), 11);
        assert!(key.reveal().starts_with(&prefix));
        assert!(prefix[3..].chars().all(|c| c.is_ascii_hexdigit()));
    }
}
