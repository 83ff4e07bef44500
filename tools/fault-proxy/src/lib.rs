//! An HTTP/1.1 fault proxy between a client and orderpay, for the client libraries' tests, their
//! fault runs and the checkout example.
//!
//! Every request is read whole, then, at the configured rate, one fault of the enabled kinds is
//! chosen at random for it:
//!
//! - `drop`: the request is forwarded and the service answers (its write committed), then the
//!   client's connection is reset instead of relaying the answer;
//! - `reset`: the client's connection is reset before anything is forwarded;
//! - `unavailable`: the proxy answers 503 itself (nothing forwarded, no `Retry-After`);
//! - `delay`: the request is forwarded after `delay_ms`.
//!
//! Besides, answers to requests that start with `hold` (`/payments`, or `POST /payments`) are kept
//! until a release (or until the hold is cleared), as a slow network would keep them. Each exchange uses a connection of its
//! own upstream (`Connection: close`), and the client's connection closes after its answer.
//!
//! The proxy is steered over HTTP on its own port under `/_faults` (never forwarded):
//! `GET /_faults` the counts, `POST /_faults` a new [`Faults`] (JSON), `POST /_faults/release`
//! lets every held answer go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The largest request head read; more is refused with 431.
const MAX_HEAD: usize = 64 * 1024;

/// What the proxy does to the exchanges it forwards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// The share of exchanges faulted, 0 to 1.
    pub rate: f64,
    /// The kinds to choose from (all four when empty).
    pub kinds: Vec<Fault>,
    /// How long a `delay` waits before forwarding.
    pub delay_ms: u64,
    /// Only requests whose path starts with one of these are faulted (all when empty).
    pub paths: Vec<String>,
    /// Answers to requests that start with this are held until a release: a path prefix
    /// (`/payments`), or a method and a path prefix (`POST /payments`).
    pub hold: Option<String>,
    /// At most this many faults, then none (unlimited when absent).
    pub times: Option<u64>,
    /// The random sequence's seed (a fixed one repeats a run's choices); 0 takes the clock's.
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Drop,
    Reset,
    Unavailable,
    Delay,
}

const ALL: [Fault; 4] = [Fault::Drop, Fault::Reset, Fault::Unavailable, Fault::Delay];

/// What the proxy did, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub exchanges: u64,
    pub drop: u64,
    pub reset: u64,
    pub unavailable: u64,
    pub delay: u64,
    pub held: u64,
}

impl Stats {
    /// Exchanges that met a fault (held answers are not faults).
    pub fn faulted(&self) -> u64 {
        self.drop + self.reset + self.unavailable + self.delay
    }
}

#[derive(Default)]
struct Counters {
    exchanges: AtomicU64,
    drop: AtomicU64,
    reset: AtomicU64,
    unavailable: AtomicU64,
    delay: AtomicU64,
    held: AtomicU64,
}

struct State {
    upstream: String,
    faults: Mutex<(Faults, u64)>,
    counters: Counters,
    /// Bumped by a release: every held answer goes.
    releases: watch::Sender<u64>,
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    pub port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Listens on `listen` (`127.0.0.1:0` for any free port) and forwards to `upstream`
    /// (`host:port`).
    pub async fn start(listen: &str, upstream: &str, faults: Faults) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind(listen).await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(State {
            upstream: upstream.to_owned(),
            faults: Mutex::new(seeded(faults)),
            counters: Counters::default(),
            releases: watch::channel(0).0,
        });
        let accepting = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(exchange(client, accepting.clone()));
            }
        });
        Ok(FaultProxy { port, state, task })
    }

    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Replaces what the proxy does from the next exchange on.
    pub fn set(&self, faults: Faults) {
        set(&self.state, faults);
    }

    pub fn stats(&self) -> Stats {
        stats(&self.state)
    }

    /// Lets every held answer go.
    pub fn release(&self) {
        self.state.releases.send_modify(|generation| *generation += 1);
    }
}

fn seeded(faults: Faults) -> (Faults, u64) {
    let seed = match faults.seed {
        0 => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9, |since| since.as_nanos() as u64),
        seed => seed,
    };
    (faults, seed | 1)
}

fn set(state: &State, faults: Faults) {
    let clears_hold = faults.hold.is_none();
    *state.faults.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = seeded(faults);
    if clears_hold {
        state.releases.send_modify(|generation| *generation += 1);
    }
}

fn stats(state: &State) -> Stats {
    let counters = &state.counters;
    Stats {
        exchanges: counters.exchanges.load(Ordering::SeqCst),
        drop: counters.drop.load(Ordering::SeqCst),
        reset: counters.reset.load(Ordering::SeqCst),
        unavailable: counters.unavailable.load(Ordering::SeqCst),
        delay: counters.delay.load(Ordering::SeqCst),
        held: counters.held.load(Ordering::SeqCst),
    }
}

/// xorshift64*: enough randomness to pick faults, repeatable from a seed.
fn next_random(seed: &mut u64) -> f64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    (seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1_u64 << 53) as f64
}

/// The fault for a request to `path`, if any, and whether its answer is held.
fn choose(state: &State, method: &str, path: &str) -> (Option<Fault>, bool, Duration) {
    let mut guard = state.faults.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (faults, seed) = &mut *guard;
    let held = faults.hold.as_deref().is_some_and(|hold| match hold.split_once(' ') {
        Some((held_method, prefix)) => held_method == method && path.starts_with(prefix),
        None => path.starts_with(hold),
    });
    let eligible = faults.paths.is_empty() || faults.paths.iter().any(|prefix| path.starts_with(prefix));
    let delay = Duration::from_millis(faults.delay_ms);
    if !eligible || faults.times == Some(0) || faults.rate <= 0.0 || next_random(seed) >= faults.rate {
        return (None, held, delay);
    }
    if let Some(times) = &mut faults.times {
        *times -= 1;
    }
    let kinds: &[Fault] = if faults.kinds.is_empty() { &ALL } else { &faults.kinds };
    let index = ((next_random(seed) * kinds.len() as f64) as usize).min(kinds.len() - 1);
    (Some(kinds[index]), held, delay)
}

/// One request head and body as read from the client.
struct Request {
    head: String,
    body: Vec<u8>,
    method: String,
    path: String,
}

async fn read_request(client: &mut TcpStream) -> Option<Request> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0_u8; 8192];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end;
        }
        if buffer.len() > MAX_HEAD {
            return None;
        }
        let read = client.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).ok()?;
    let mut body = buffer[head_end + 4..].to_vec();
    let length = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while body.len() < length {
        let read = client.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..read]);
    }
    let mut request_line = head.lines().next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    Some(Request { head, body, method, path })
}

/// The request as sent upstream: its own head with `Connection: close`, and its body.
fn upstream_bytes(request: &Request) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(request.head.len() + request.body.len() + 32);
    for (index, line) in request.head.split("\r\n").enumerate() {
        let is_connection = line.split_once(':').is_some_and(|(name, _)| {
            let name = name.trim();
            name.eq_ignore_ascii_case("connection") || name.eq_ignore_ascii_case("keep-alive")
        });
        if index > 0 && is_connection {
            continue;
        }
        bytes.extend_from_slice(line.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"Connection: close\r\n\r\n");
    bytes.extend_from_slice(&request.body);
    bytes
}

/// Sends the request upstream and reads the whole answer (the upstream closes after it).
async fn forward(state: &State, request: &Request) -> Option<Vec<u8>> {
    let mut upstream = TcpStream::connect(&state.upstream).await.ok()?;
    upstream.write_all(&upstream_bytes(request)).await.ok()?;
    let mut answer = Vec::new();
    upstream.read_to_end(&mut answer).await.ok()?;
    (!answer.is_empty()).then_some(answer)
}

/// Closes the client's connection with a reset (SO_LINGER 0), as a dropped connection looks.
fn reset(client: TcpStream) {
    // tokio deprecates set_linger because a non-zero linger blocks on drop; zero does not.
    #[expect(deprecated, reason = "a zero linger is the point: it makes the close a reset")]
    let _ = client.set_linger(Some(Duration::ZERO));
    drop(client);
}

async fn exchange(mut client: TcpStream, state: Arc<State>) {
    let Some(request) = read_request(&mut client).await else { return };
    if request.path.starts_with("/_faults") {
        let answer = admin(&state, &request);
        let _ = client.write_all(&answer).await;
        let _ = client.shutdown().await;
        return;
    }
    state.counters.exchanges.fetch_add(1, Ordering::SeqCst);
    let (fault, held, delay) = choose(&state, &request.method, &request.path);
    let counters = &state.counters;
    match fault {
        Some(Fault::Reset) => {
            counters.reset.fetch_add(1, Ordering::SeqCst);
            return reset(client);
        }
        Some(Fault::Unavailable) => {
            counters.unavailable.fetch_add(1, Ordering::SeqCst);
            let body = br#"{"type":"service-unavailable","title":"Service unavailable","status":503,"detail":"the fault proxy answered"}"#;
            let _ = client
                .write_all(&response(503, "Service Unavailable", "application/problem+json", body))
                .await;
            let _ = client.shutdown().await;
            return;
        }
        Some(Fault::Delay) => {
            counters.delay.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
        }
        Some(Fault::Drop) | None => {}
    }
    let Some(answer) = forward(&state, &request).await else {
        return reset(client);
    };
    if fault == Some(Fault::Drop) {
        counters.drop.fetch_add(1, Ordering::SeqCst);
        return reset(client);
    }
    if held {
        counters.held.fetch_add(1, Ordering::SeqCst);
        let mut releases = state.releases.subscribe();
        let _ = releases.changed().await;
    }
    let _ = client.write_all(&answer).await;
    let _ = client.shutdown().await;
}

fn response(status: u16, reason: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn admin(state: &State, request: &Request) -> Vec<u8> {
    let json =
        |value: &serde_json::Value| response(200, "OK", "application/json", value.to_string().as_bytes());
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/_faults") => json(&serde_json::json!(stats(state))),
        ("POST", "/_faults/release") => {
            state.releases.send_modify(|generation| *generation += 1);
            json(&serde_json::json!(stats(state)))
        }
        ("POST", "/_faults") => match serde_json::from_slice::<Faults>(&request.body) {
            Ok(faults) => {
                set(state, faults);
                json(&serde_json::json!(stats(state)))
            }
            Err(error) => response(400, "Bad Request", "text/plain", error.to_string().as_bytes()),
        },
        _ => response(404, "Not Found", "text/plain", b"GET /_faults, POST /_faults, POST /_faults/release"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_come_at_the_configured_rate_over_the_kinds_enabled() {
        let state = State {
            upstream: String::new(),
            faults: Mutex::new(seeded(Faults {
                rate: 0.2,
                kinds: vec![Fault::Drop, Fault::Unavailable],
                seed: 7,
                ..Faults::default()
            })),
            counters: Counters::default(),
            releases: watch::channel(0).0,
        };
        let chosen: Vec<Option<Fault>> = (0..10_000).map(|_| choose(&state, "POST", "/orders").0).collect();
        let faulted = chosen.iter().flatten().count();
        assert!((1_800..2_200).contains(&faulted), "{faulted} of 10000 at 20%");
        assert!(chosen.iter().flatten().all(|fault| matches!(fault, Fault::Drop | Fault::Unavailable)));
        assert!(chosen.contains(&Some(Fault::Drop)) && chosen.contains(&Some(Fault::Unavailable)));
    }

    #[test]
    fn only_the_paths_named_are_faulted_and_held() {
        let state = State {
            upstream: String::new(),
            faults: Mutex::new(seeded(Faults {
                rate: 1.0,
                paths: vec!["/payments".into()],
                hold: Some("POST /payments".into()),
                seed: 3,
                ..Faults::default()
            })),
            counters: Counters::default(),
            releases: watch::channel(0).0,
        };
        assert_eq!(choose(&state, "POST", "/orders").0, None);
        assert!(!choose(&state, "POST", "/orders").1);
        let (fault, held, _) = choose(&state, "POST", "/payments");
        assert!(fault.is_some() && held);
        assert!(!choose(&state, "GET", "/payments/01a2").1, "only the method named is held");
    }

    #[test]
    fn a_number_of_faults_then_none() {
        let state = State {
            upstream: String::new(),
            faults: Mutex::new(seeded(Faults { rate: 1.0, times: Some(2), seed: 5, ..Faults::default() })),
            counters: Counters::default(),
            releases: watch::channel(0).0,
        };
        let chosen: Vec<bool> = (0..5).map(|_| choose(&state, "POST", "/payments").0.is_some()).collect();
        assert_eq!(chosen, [true, true, false, false, false]);
    }

    #[test]
    fn the_upstream_request_closes_its_connection() {
        let request = Request {
            head: "POST /orders HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 2".into(),
            body: b"{}".to_vec(),
            method: "POST".into(),
            path: "/orders".into(),
        };
        let sent = String::from_utf8(upstream_bytes(&request)).unwrap();
        assert_eq!(
            sent,
            "POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
    }
}
