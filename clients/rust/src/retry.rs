//! The retry rules, as one pure function: what to do after an attempt's outcome. The same rules
//! are written as test vectors in `clients/retry-rules.json`, which both clients' tests load.
//!
//! - Retried: a refused or reset connection, a timeout before any response byte, 409
//!   `idempotency-key-in-use` and `payment-in-progress`, 429 with `Retry-After`, 500, 502, 503,
//!   504. Stopped: everything else (400, 401, 402, 403, 404, 422, TLS errors, any other 409...).
//! - `Orderpay-Should-Retry: true|false`, when the service sends it, has the last word.
//! - The delay before retry `n` is `min(base x 2^(n-1), cap) x U[0.5, 1)`, at least `floor`;
//!   a `Retry-After` replaces it. No retry past the call's deadline.
//! - A 202 is a success whose status is `processing`; the `*_and_wait` calls re-send it (same
//!   key) until a final answer, bounded by the deadline only.

use std::time::Duration;

/// Every setting of the retries; all public, with the defaults of [`Settings::default`].
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Retries after the first attempt (2).
    pub max_retries: u32,
    /// The first backoff (500 ms), doubled on each retry up to `backoff_cap` (5 s), then taken
    /// times a random factor in [0.5, 1), and never under `backoff_floor` (500 ms).
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    pub backoff_floor: Duration,
    /// One attempt's time limit (30 s): above the service's provider timeout (5 s), so that a
    /// payment's answer, 202 included, arrives within it.
    pub timeout: Duration,
    /// The whole call's time limit, retries and waits included (60 s).
    pub deadline: Duration,
    /// The age past which a stored key is not sent again (23 h; the service keeps a key 24 h).
    pub key_ttl: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_retries: 2,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(5),
            backoff_floor: Duration::from_millis(500),
            timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(60),
            key_ttl: Duration::from_secs(23 * 3600),
        }
    }
}

/// How an attempt failed before it had an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The connection was refused.
    Refused,
    /// The connection was reset or closed before an answer.
    Reset,
    /// No answer byte within the attempt's time limit.
    Timeout,
    /// The TLS handshake failed: retrying does not fix a certificate.
    Tls,
    /// Anything else (a malformed answer, a body cut short after its head).
    Other,
}

/// What one attempt got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Answer {
        status: u16,
        /// The problem `type` of a problem+json answer.
        problem_type: Option<String>,
        retry_after: Option<Duration>,
        /// `Orderpay-Should-Retry`.
        should_retry: Option<bool>,
    },
    Transport(Transport),
}

/// Why a call stops without a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// An answer that is final for this request (its status and problem say why).
    Api,
    /// 422 `idempotency-key-reused`: the key was first sent with another request. A bug in the
    /// caller; never retried.
    KeyReused,
    /// Still running at the service (409 in use, payment in progress, 202) when the retries ran
    /// out.
    InProgress,
    /// A transport failure that is not retried, or the last one when the retries ran out.
    Transport,
    /// The next retry would come after the call's deadline.
    Deadline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A success: 2xx (202 too, unless waiting for a final answer).
    Done,
    Retry(Duration),
    Stop(Stop),
}

/// The delay before retry `retry` (1 for the first), for a uniform `random` in [0, 1).
pub fn backoff(settings: &Settings, retry: u32, random: f64) -> Duration {
    let doubled = settings.backoff_base.saturating_mul(1_u32 << retry.saturating_sub(1).min(20));
    let capped = doubled.min(settings.backoff_cap);
    capped.mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0)).max(settings.backoff_floor)
}

fn retryable(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Transport(kind) => {
            matches!(kind, Transport::Refused | Transport::Reset | Transport::Timeout)
        }
        Outcome::Answer { status, problem_type, retry_after, .. } => match status {
            409 => matches!(problem_type.as_deref(), Some("idempotency-key-in-use" | "payment-in-progress")),
            429 => retry_after.is_some(),
            500 | 502 | 503 | 504 => true,
            _ => false,
        },
    }
}

fn in_progress(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Answer { status: 202, .. })
        || matches!(outcome, Outcome::Answer { status: 409, .. } if retryable(outcome))
}

fn stop_for(outcome: &Outcome) -> Stop {
    match outcome {
        Outcome::Transport(_) => Stop::Transport,
        _ if in_progress(outcome) => Stop::InProgress,
        Outcome::Answer { status: 422, problem_type: Some(kind), .. } if kind == "idempotency-key-reused" => {
            Stop::KeyReused
        }
        Outcome::Answer { .. } => Stop::Api,
    }
}

/// What to do after `attempt` (1 for the first send) got `outcome`, with `remaining` left before
/// the call's deadline and `random` uniform in [0, 1) for the jitter. `waiting`: a 202 is not
/// final (the `*_and_wait` calls).
pub fn decide(
    settings: &Settings,
    attempt: u32,
    outcome: &Outcome,
    waiting: bool,
    remaining: Duration,
    random: f64,
) -> Decision {
    let (status, retry_after, should_retry) = match outcome {
        Outcome::Answer { status, retry_after, should_retry, .. } => {
            (Some(*status), *retry_after, *should_retry)
        }
        Outcome::Transport(_) => (None, None, None),
    };
    let processing = status == Some(202);
    if status.is_some_and(|status| (200..300).contains(&status)) && !(processing && waiting) {
        return Decision::Done;
    }
    // A 202 being waited on is re-sent until the deadline; the retry budget is for failures.
    if !processing {
        let allowed = should_retry.unwrap_or_else(|| retryable(outcome));
        if !allowed || attempt > settings.max_retries {
            return Decision::Stop(stop_for(outcome));
        }
    }
    let delay = retry_after.unwrap_or_else(|| backoff(settings, attempt, random));
    if delay > remaining {
        return Decision::Stop(Stop::Deadline);
    }
    Decision::Retry(delay)
}

/// `Retry-After` in seconds (an HTTP date is not used by orderpay, and is ignored).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A uniform random number in [0, 1) from the operating system, for the jitter.
pub(crate) fn random() -> f64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0_u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1_u64 << 53) as f64
}
