//! Accounts (tenants) and their secret API keys.
//!
//! A key is `sk_` followed by 64 hex characters (256 random bits). It is printed once at creation
//! and only its SHA-256 is stored: with that much entropy a fast hash is as safe as a slow one,
//! and lets every request authenticate with one indexed lookup.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use sha2::{Digest, Sha256};

use crate::db::schema::accounts;
use crate::ids::AccountId;

pub const API_KEY_PREFIX: &str = "sk_";

/// A freshly generated secret API key. Deliberately not `Debug` or `Display`, so it cannot end up
/// in a log line by accident; [`ApiKey::reveal`] is the one way to read it.
pub struct ApiKey(String);

impl ApiKey {
    pub fn generate() -> anyhow::Result<Self> {
        let mut secret = [0_u8; 32];
        getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
        Ok(ApiKey(format!("{API_KEY_PREFIX}{}", hex::encode(secret))))
    }

    pub fn reveal(&self) -> &str {
        &self.0
    }
}

/// SHA-256 of a presented key, the form it is stored and looked up in.
pub fn hash_api_key(presented: &str) -> [u8; 32] {
    Sha256::digest(presented.as_bytes()).into()
}

/// The account a request is authenticated as.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = accounts)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Account {
    pub id: AccountId,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Creates an account and returns it with its API key, the only time the key exists in clear.
pub async fn create(conn: &mut AsyncPgConnection, name: &str) -> anyhow::Result<(Account, ApiKey)> {
    let name = name.trim();
    anyhow::ensure!(
        (1..=200).contains(&name.chars().count()) && !name.contains('\0'),
        "an account name is 1 to 200 characters"
    );
    let key = ApiKey::generate()?;
    let account = diesel::insert_into(accounts::table)
        .values((
            accounts::id.eq(AccountId::generate()),
            accounts::name.eq(name),
            accounts::api_key_hash.eq(hash_api_key(key.reveal()).as_slice()),
        ))
        .returning(Account::as_returning())
        .get_result(conn)
        .await?;
    Ok((account, key))
}

/// Finds the account whose API key hashes to `key_hash`.
pub async fn find_by_key_hash(
    conn: &mut AsyncPgConnection,
    key_hash: &[u8; 32],
) -> QueryResult<Option<Account>> {
    accounts::table
        .filter(accounts::api_key_hash.eq(key_hash.as_slice()))
        .select(Account::as_select())
        .first(conn)
        .await
        .optional()
}

/// Accounts recently authenticated, by API key hash, so that a busy client does not cost a
/// database round trip per request. Entries live `ttl` (a deleted or rotated key keeps working
/// that long). Unknown keys are never cached, so guessing keys cannot fill it; when full,
/// quick_cache's S3-FIFO eviction drops the coldest entries, so a burst of new accounts cannot
/// empty it for the busy ones.
pub struct AccountCache {
    ttl: Duration,
    entries: quick_cache::sync::Cache<[u8; 32], (Account, Instant)>,
}

impl AccountCache {
    const CAPACITY: usize = 10_000;

    /// A cache keeping entries `ttl`; a zero `ttl` disables it.
    pub fn new(ttl: Duration) -> Self {
        AccountCache { ttl, entries: quick_cache::sync::Cache::new(Self::CAPACITY) }
    }

    pub fn get(&self, key_hash: &[u8; 32]) -> Option<Account> {
        let (account, cached_at) = self.entries.get(key_hash)?;
        (cached_at.elapsed() < self.ttl).then_some(account)
    }

    pub fn put(&self, key_hash: [u8; 32], account: Account) {
        if !self.ttl.is_zero() {
            self.entries.insert(key_hash, (account, Instant::now()));
        }
    }
}

/// Authenticates a presented key: from the cache when it was seen within the TTL, else from the
/// database (and then cached).
pub async fn authenticate(
    cache: &AccountCache,
    pool: &crate::db::Pool,
    presented: &str,
) -> Result<Option<Account>, crate::error::ApiError> {
    if !presented.starts_with(API_KEY_PREFIX) {
        return Ok(None);
    }
    let hash = hash_api_key(presented);
    if let Some(account) = cache.get(&hash) {
        return Ok(Some(account));
    }
    let mut conn = pool.get().await?;
    let account = find_by_key_hash(&mut conn, &hash).await?;
    if let Some(account) = &account {
        cache.put(hash, account.clone());
    }
    Ok(account)
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
    fn the_cache_forgets_after_its_ttl_and_can_be_off() {
        let account = Account { id: AccountId::generate(), name: "a".into(), created_at: Utc::now() };
        let cache = AccountCache::new(Duration::from_millis(50));
        cache.put([1; 32], account.clone());
        assert_eq!(cache.get(&[1; 32]), Some(account.clone()));
        assert_eq!(cache.get(&[2; 32]), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.get(&[1; 32]), None);
        let off = AccountCache::new(Duration::ZERO);
        off.put([1; 32], account);
        assert_eq!(off.get(&[1; 32]), None);
    }
}
