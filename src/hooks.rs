//! Named points between the statements of the protocol (a start statement and the answer it
//! stores, a send and its settle, ...), where a test pauses the service or makes it crash on
//! purpose, to build the interleaving it proves something about instead of hoping for it.
//!
//! Compiled in only with the `test-hooks` feature, which the tests turn on (the crate's
//! dev-dependency on itself); in every other build [`point`] is an empty function. Points are
//! process-wide: the test runner (nextest) runs each test in its own process.
//!
//! - In process: [`pause`] holds the next task that reaches a point until the test releases it.
//! - In a subprocess (`orderpay serve` started by a crash test): `ORDERPAY_TEST_CRASH_AT=<name>`
//!   aborts the process the first time the point is reached, as a SIGKILL would stop it there.

/// A point in the service: a task reaching it waits while a test holds it paused.
pub async fn point(name: &'static str) {
    #[cfg(feature = "test-hooks")]
    active::reach(name).await;
    #[cfg(not(feature = "test-hooks"))]
    let _ = name;
}

#[cfg(feature = "test-hooks")]
pub use active::{Paused, pause};

#[cfg(feature = "test-hooks")]
mod active {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};

    use tokio::sync::{Notify, oneshot};

    struct Hold {
        /// Told when a task reaches the point (the test awaits it).
        reached: Option<oneshot::Sender<()>>,
        /// What the held task waits on.
        release: Arc<Notify>,
    }

    fn holds() -> &'static Mutex<HashMap<&'static str, Hold>> {
        static HOLDS: OnceLock<Mutex<HashMap<&'static str, Hold>>> = OnceLock::new();
        HOLDS.get_or_init(Default::default)
    }

    /// A point held by a test: the first task to reach it waits there until [`Paused::release`]
    /// (or the handle is dropped).
    pub struct Paused {
        name: &'static str,
        reached: Option<oneshot::Receiver<()>>,
        release: Arc<Notify>,
    }

    /// Holds the next task that reaches `name`.
    pub fn pause(name: &'static str) -> Paused {
        let (tell, reached) = oneshot::channel();
        let release = Arc::new(Notify::new());
        let hold = Hold { reached: Some(tell), release: release.clone() };
        holds().lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(name, hold);
        Paused { name, reached: Some(reached), release }
    }

    impl Paused {
        /// Waits until a task is held at the point.
        pub async fn reached(&mut self) {
            if let Some(reached) = self.reached.take() {
                let _ = reached.await;
            }
        }

        /// Lets the held task (if any) go on; later tasks pass freely.
        pub fn release(self) {}
    }

    impl Drop for Paused {
        fn drop(&mut self) {
            holds().lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(self.name);
            self.release.notify_one();
        }
    }

    pub(super) async fn reach(name: &'static str) {
        if std::env::var("ORDERPAY_TEST_CRASH_AT").is_ok_and(|crash_at| crash_at == name) {
            eprintln!("test hook: crashing at {name}");
            std::process::abort();
        }
        let release = {
            let mut holds = holds().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let Some(hold) = holds.get_mut(name) else { return };
            let Some(reached) = hold.reached.take() else { return };
            let _ = reached.send(());
            hold.release.clone()
        };
        release.notified().await;
    }
}
