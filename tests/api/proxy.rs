//! A TCP fault proxy for chaos tests (in the spirit of crates.io's ChaosProxy): it sits between
//! orderpay and a peer (PostgreSQL, the payment provider) and misbehaves on command.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const PASS: u8 = 0;
const REFUSE: u8 = 1;
const HOLD: u8 = 2;

struct State {
    upstream: String,
    mode: AtomicU8,
    /// Responses still to be answered with a connection reset instead.
    resets: AtomicUsize,
    /// Bumped by `cut`: every open connection ends.
    cuts: watch::Sender<u64>,
}

pub struct ChaosProxy {
    pub port: u16,
    state: Arc<State>,
}

impl ChaosProxy {
    /// Starts forwarding 127.0.0.1:<port> to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> ChaosProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            upstream: upstream.to_owned(),
            mode: AtomicU8::new(PASS),
            resets: AtomicUsize::new(0),
            cuts: watch::channel(0).0,
        });
        let accepting = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accepting.mode.load(Ordering::SeqCst) == REFUSE {
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, accepting.clone()));
            }
        });
        ChaosProxy { port, state }
    }

    /// Closes every open connection and refuses new ones until [`ChaosProxy::restore`].
    pub fn cut(&self) {
        self.state.mode.store(REFUSE, Ordering::SeqCst);
        self.state.cuts.send_modify(|generation| *generation += 1);
    }

    /// Forwards requests but never relays an answer (the peer accepted, did its work, and went
    /// silent), until [`ChaosProxy::restore`].
    pub fn hold_answers(&self) {
        self.state.mode.store(HOLD, Ordering::SeqCst);
    }

    /// Answers the next `count` responses with a connection reset instead of relaying them.
    pub fn reset_next_answers(&self, count: usize) {
        self.state.resets.store(count, Ordering::SeqCst);
    }

    /// Back to plain forwarding (held connections end).
    pub fn restore(&self) {
        let held = self.state.mode.swap(PASS, Ordering::SeqCst) == HOLD;
        if held {
            self.state.cuts.send_modify(|generation| *generation += 1);
        }
    }
}

async fn relay(client: TcpStream, state: Arc<State>) {
    let mut cut = state.cuts.subscribe();
    let Ok(server) = TcpStream::connect(&state.upstream).await else { return };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buffer = vec![0_u8; 16 * 1024];
        loop {
            let read = client_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 || server_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    let downstream = async {
        let mut buffer = vec![0_u8; 16 * 1024];
        loop {
            let read = server_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 {
                return;
            }
            if state.mode.load(Ordering::SeqCst) == HOLD {
                continue; // swallowed: the client waits for an answer that never comes
            }
            let reset =
                state.resets.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            if reset {
                // SO_LINGER 0 turns the close into a RST: the client sees "connection reset".
                // (tokio deprecates it because a non-zero linger blocks on drop; zero does not.)
                #[expect(deprecated, reason = "a zero linger is the point: it makes the close a reset")]
                let _ = client_write.as_ref().set_linger(Some(Duration::ZERO));
                return;
            }
            if client_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = cut.changed() => {}
    }
}
