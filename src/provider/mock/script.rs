//! What the mock does with each write (charge, capture, cancel, refund) before and after it acts
//! on it: the next step of the script a test posted (`POST /_admin/script`), or else the random
//! faults (`POST /_admin/faults`). A script makes one interleaving happen on purpose: "the
//! provider acts now", "acts and the answer is lost", "acts after the sender gave up", "never
//! acts", "is down", "acts when the test says" (a parked write, `POST /_admin/parked/{key}/act`).

use std::collections::VecDeque;
use std::time::Duration;

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::web;
use serde::{Deserialize, Serialize};

use super::ledger::{Forced, Ledger, Reply};
use super::{MockState, chance, respond};

/// One scripted write, as `POST /_admin/script` takes it: `{"act": "now"}`, `{"act": "hold"}`,
/// `{"act": "later", "after_ms": 500}`, `{"act": "never"}`, `{"act": "unavailable"}`,
/// `{"act": "unauthorized"}`, `{"act": "decline"}`, `{"act": "decline_and_hold"}`,
/// `{"act": "pend"}`, `{"act": "pend_and_hold"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "act", rename_all = "snake_case")]
pub enum Scripted {
    /// Acts and answers at once (whatever the random faults say).
    Now,
    /// Acts, then holds the answer past the client's timeout (`timeout_hold`): the answer is
    /// lost, the operation done (or refused: a refusal's answer is lost the same way).
    Hold,
    /// Acts by declining (a charge, a capture or a refund), whatever its payment method, and
    /// answers at once. A void has no decline: its write acts as for `now`.
    Decline,
    /// Declines, then holds the answer past the client's timeout: the decline is lost.
    DeclineAndHold,
    /// Acts by leaving a charge or a refund pending, whatever its payment method, and answers
    /// at once; it settles only when the test says (`POST /_admin/due/{key}/settle`). Other writes
    /// act as for `now`.
    Pend,
    /// Leaves it pending, then holds the answer past the client's timeout.
    PendAndHold,
    /// Acts only `after_ms` from now, then answers (by then the sender may have given up: the
    /// provider acting late). The act happens even if the sender hung up.
    Later { after_ms: u64 },
    /// Never acts; holds the answer past the client's timeout, then answers 503.
    Never,
    /// Answers 503 at once without acting.
    Unavailable,
    /// Answers 401 `authentication_error` at once without acting, as for a revoked API key.
    Unauthorized,
    /// Does not act until the test says so (`POST /_admin/parked/{key}/act`, or `.../drop` for
    /// never); holds the answer past the client's timeout, then answers 503. The provider acting
    /// whenever a test means it to: after the sender gave up, after the reconciler did.
    Park,
}

/// A write the provider has not acted on yet, by its idempotency key: the ledger's operation.
pub(super) type Parked = (String, Box<dyn FnOnce(&mut Ledger, bool) -> Reply + Send>);

/// The longest `after_ms` a script may ask for.
const MAX_LATER_MS: u64 = 60_000;

/// The steps not taken yet, in order, and the writes parked by them.
#[derive(Default)]
pub(super) struct Script {
    steps: VecDeque<Scripted>,
    parked: Vec<Parked>,
}

impl Script {
    /// Replaces the steps to come.
    pub fn set(&mut self, steps: Vec<Scripted>) -> Result<(), &'static str> {
        if steps.iter().any(|step| matches!(step, Scripted::Later { after_ms } if *after_ms > MAX_LATER_MS)) {
            return Err("after_ms is at most 60000");
        }
        self.steps = steps.into();
        Ok(())
    }

    pub fn remaining(&self) -> Vec<Scripted> {
        self.steps.iter().copied().collect()
    }

    fn next(&mut self) -> Option<Scripted> {
        self.steps.pop_front()
    }

    /// Takes the oldest write parked under `key`.
    pub fn unpark(&mut self, key: &str) -> Option<Parked> {
        let index = self.parked.iter().position(|(parked, _)| parked == key)?;
        Some(self.parked.remove(index))
    }

    /// The keys of the parked writes, oldest first.
    pub fn parked_keys(&self) -> Vec<String> {
        self.parked.iter().map(|(key, _)| key.clone()).collect()
    }
}

/// The next script step, or what the random faults draw for this write (their latency waited
/// out first).
async fn plan(state: &MockState) -> Scripted {
    if let Some(step) = state.with_script(Script::next) {
        return step;
    }
    let faults = state.with_ledger(|ledger| ledger.faults.clone());
    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    if chance(faults.error_rate) {
        Scripted::Unavailable
    } else if chance(faults.timeout_rate) {
        Scripted::Hold
    } else {
        Scripted::Now
    }
}

fn unavailable(message: &str) -> Reply {
    Reply::error(StatusCode::SERVICE_UNAVAILABLE, "api_error", None, message)
}

/// Carries out `operation` now with the outcome `how`, holding its answer when `hold`.
fn forced(
    state: &MockState,
    how: Forced,
    operation: impl FnOnce(&mut Ledger, bool) -> Reply,
    hold: bool,
) -> Reply {
    state.with_ledger(|ledger| ledger.forcing(how, |ledger| operation(ledger, hold)))
}

/// Carries out the write of idempotency key `key` as the script or the faults say: `operation`
/// is the ledger's, given whether to hold its answer; the answer is sent after the hold when
/// there is one.
pub(super) async fn act(
    state: web::Data<MockState>,
    key: &str,
    operation: impl FnOnce(&mut Ledger, bool) -> Reply + Send + 'static,
) -> HttpResponse {
    act_rendering(state, key, operation, |reply| reply).await
}

/// [`act`], with every answer (the ledger's, or the script's refusal) passed through `render`
/// first: the Stripe wire's spelling of it.
pub(super) async fn act_rendering(
    state: web::Data<MockState>,
    key: &str,
    operation: impl FnOnce(&mut Ledger, bool) -> Reply + Send + 'static,
    render: impl FnOnce(Reply) -> Reply,
) -> HttpResponse {
    // Received, not acted on yet: a test may step in here.
    crate::hooks::point("mock.before_act").await;
    let reply = match plan(&state).await {
        Scripted::Unavailable => unavailable("injected fault: unavailable"),
        Scripted::Unauthorized => {
            let refused = "scripted: the API key was revoked";
            Reply::error(StatusCode::UNAUTHORIZED, "authentication_error", None, refused)
        }
        Scripted::Park => {
            state.with_script(|script| script.parked.push((key.to_owned(), Box::new(operation))));
            tokio::time::sleep(state.settings.timeout_hold).await;
            unavailable("scripted: parked, not acted on yet")
        }
        Scripted::Never => {
            tokio::time::sleep(state.settings.timeout_hold).await;
            unavailable("scripted: the provider never acted")
        }
        Scripted::Now => state.with_ledger(|ledger| operation(ledger, false)),
        // Whatever the answer, a refusal too: the act is done and recorded under the key.
        Scripted::Hold => Reply { hold: true, ..state.with_ledger(|ledger| operation(ledger, true)) },
        Scripted::Decline => forced(&state, Forced::Decline, operation, false),
        Scripted::DeclineAndHold => forced(&state, Forced::Decline, operation, true),
        Scripted::Pend => forced(&state, Forced::Pend, operation, false),
        Scripted::PendAndHold => forced(&state, Forced::Pend, operation, true),
        Scripted::Later { after_ms } => {
            // A task of its own, so that the act happens even if the sender hangs up (which
            // drops this handler).
            let acting = state.clone();
            let later = actix_web::rt::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                acting.with_ledger(|ledger| operation(ledger, false))
            });
            later.await.unwrap_or_else(|_| unavailable("the scripted act did not finish"))
        }
    };
    // Acted on (or refused), the answer not sent yet: a test may step in here.
    crate::hooks::point("mock.before_answer").await;
    if reply.hold {
        tokio::time::sleep(state.settings.timeout_hold).await;
    }
    respond(render(reply))
}
