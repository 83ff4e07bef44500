//! A request waiting on its provider call hears when another driver settles its operation: a
//! provider webhook usually reports the outcome within milliseconds of the provider acting,
//! while the provider's own answer may be held until the request's timeout. The request then
//! answers at once with the settled answer instead of waiting out the call (which is dropped:
//! the operation is settled, and its downstream key makes any late arrival a replay).
//!
//! In process only: a driver that settles an operation tells the requests of this process that
//! wait on it, after its transaction committed. A settle made by another instance is not heard
//! here; that request answers when its provider call ends, as before (the settle is then found
//! and answered from).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;
use uuid::Uuid;

use super::leases::Table;

type Waiting = Mutex<HashMap<(Table, Uuid), Arc<Notify>>>;

fn waiting() -> &'static Waiting {
    static WAITING: OnceLock<Waiting> = OnceLock::new();
    WAITING.get_or_init(Default::default)
}

/// A request's wait on its operation; deregistered when dropped.
pub struct Wait {
    key: (Table, Uuid),
    notify: Arc<Notify>,
}

impl Wait {
    /// Starts listening for another driver settling `id` of `table` (before the request sends).
    pub fn on(table: Table, id: Uuid) -> Wait {
        let notify = Arc::new(Notify::new());
        let mut waiting = waiting().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        waiting.insert((table, id), notify.clone());
        Wait { key: (table, id), notify }
    }

    /// Resolves once another driver said it settled the operation.
    pub async fn settled(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        let mut waiting = waiting().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if waiting.get(&self.key).is_some_and(|notify| Arc::ptr_eq(notify, &self.notify)) {
            waiting.remove(&self.key);
        }
    }
}

/// Tells a request of this process waiting on `id` of `table` that it was settled (call once
/// the settle committed).
pub fn tell(table: Table, id: Uuid) {
    let waiting = waiting().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(notify) = waiting.get(&(table, id)) {
        // A permit is kept if the request is not waiting yet: it will not miss it.
        notify.notify_one();
    }
}
