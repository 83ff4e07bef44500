//! Idempotency keys: one per call, sent unchanged on every attempt, and kept by a [`KeyStore`]
//! per (intent, operation) so that a process that crashed resumes with the same key.
//!
//! A key is bound to its route at the service: creating an order and paying it are two keys of
//! one intent, so the store keys them by the operation too (`createOrder`, `createPayment`...).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Whether `key` is one the service accepts: 1 to 255 visible ASCII characters (0x21-0x7E).
pub fn valid_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|byte| (0x21..=0x7e).contains(&byte))
}

/// A new key: a UUID (v7, time-ordered).
pub fn new_key() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// The key of one (intent, operation), and when it was first sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredKey {
    pub key: String,
    /// Milliseconds since the Unix epoch; `None` until the first send.
    pub first_sent_at_ms: Option<u64>,
}

impl StoredKey {
    pub fn new(key: String) -> Self {
        StoredKey { key, first_sent_at_ms: None }
    }

    /// Whether the key is older than `ttl` at `now_ms` (one never sent is not).
    pub fn expired(&self, ttl: Duration, now_ms: u64) -> bool {
        self.first_sent_at_ms.is_some_and(|sent| now_ms.saturating_sub(sent) > ttl.as_millis() as u64)
    }
}

/// A failure of the store itself (the key could not be kept: the call is not sent).
#[derive(Debug, thiserror::Error)]
#[error("the key store failed: {0}")]
pub struct StoreError(pub String);

/// Where the keys of intents live. `save` returns once the key is durable where the caller
/// needs it: the client saves a new key before its first send, and the first send's time with
/// it, so a process that crashed finds the same key when it resumes the intent.
///
/// The first key saved for an (intent, operation) is the one kept: a `save` of another key for
/// it changes nothing (a `save` of the same key may record its first send's time). The client
/// reads the key back after saving it, so two sends of one intent racing each other share the
/// key that won.
pub trait KeyStore: Send + Sync {
    fn load(&self, intent: &str, operation: &str) -> Result<Option<StoredKey>, StoreError>;
    fn save(&self, intent: &str, operation: &str, key: &StoredKey) -> Result<(), StoreError>;
}

/// The first key saved is kept; the same key again records its first send's time.
fn keep_first<K>(slot: std::collections::hash_map::Entry<'_, K, StoredKey>, key: &StoredKey) {
    match slot {
        std::collections::hash_map::Entry::Vacant(vacant) => {
            vacant.insert(key.clone());
        }
        std::collections::hash_map::Entry::Occupied(mut kept) if kept.get().key == key.key => {
            kept.get_mut().first_sent_at_ms = kept.get().first_sent_at_ms.or(key.first_sent_at_ms);
        }
        std::collections::hash_map::Entry::Occupied(_) => {}
    }
}

/// Keys in this process's memory: they survive retries and resumed calls, not a restart.
#[derive(Debug, Default)]
pub struct MemoryKeyStore {
    keys: Mutex<HashMap<(String, String), StoredKey>>,
}

impl MemoryKeyStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl KeyStore for MemoryKeyStore {
    fn load(&self, intent: &str, operation: &str) -> Result<Option<StoredKey>, StoreError> {
        let keys = self.keys.lock().map_err(|_| StoreError("poisoned".into()))?;
        Ok(keys.get(&(intent.to_owned(), operation.to_owned())).cloned())
    }

    fn save(&self, intent: &str, operation: &str, key: &StoredKey) -> Result<(), StoreError> {
        let mut keys = self.keys.lock().map_err(|_| StoreError("poisoned".into()))?;
        keep_first(keys.entry((intent.to_owned(), operation.to_owned())), key);
        Ok(())
    }
}

/// Keys in a JSON file, written whole to a temporary file and renamed over it on every save:
/// they survive a restart of the process. For one process at a time.
#[derive(Debug)]
pub struct FileKeyStore {
    path: PathBuf,
    lock: Mutex<()>,
}

#[derive(Default, Serialize, Deserialize)]
struct FileContents {
    keys: HashMap<String, StoredKey>,
}

impl FileKeyStore {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileKeyStore { path: path.into(), lock: Mutex::new(()) }
    }

    fn read(&self) -> Result<FileContents, StoreError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| StoreError(error.to_string())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(FileContents::default()),
            Err(error) => Err(StoreError(error.to_string())),
        }
    }
}

fn entry(intent: &str, operation: &str) -> String {
    format!("{intent}\u{1f}{operation}")
}

impl KeyStore for FileKeyStore {
    fn load(&self, intent: &str, operation: &str) -> Result<Option<StoredKey>, StoreError> {
        let _guard = self.lock.lock().map_err(|_| StoreError("poisoned".into()))?;
        Ok(self.read()?.keys.remove(&entry(intent, operation)))
    }

    fn save(&self, intent: &str, operation: &str, key: &StoredKey) -> Result<(), StoreError> {
        let _guard = self.lock.lock().map_err(|_| StoreError("poisoned".into()))?;
        let mut contents = self.read()?;
        keep_first(contents.keys.entry(entry(intent, operation)), key);
        let bytes = serde_json::to_vec(&contents).map_err(|error| StoreError(error.to_string()))?;
        let temporary = self.path.with_extension("tmp");
        std::fs::write(&temporary, bytes)
            .and_then(|()| std::fs::File::open(&temporary)?.sync_all())
            .and_then(|()| std::fs::rename(&temporary, &self.path))
            .map_err(|error| StoreError(error.to_string()))
    }
}
