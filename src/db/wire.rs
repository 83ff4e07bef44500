//! A watch on the PostgreSQL protocol of one connection, between tokio-postgres and the socket
//! (above TLS, so it sees the plain messages). It frames the messages with postgres-protocol and
//! passes every byte through unchanged, except in two cases where it ends the connection itself:
//!
//! - **No answer in time.** Each request (the startup, a `Query`, or an extended-protocol batch
//!   ending in `Sync`) is answered by a `ReadyForQuery`. When one is awaited for longer than the
//!   bound, the connection fails with `TimedOut`. The server-side `statement_timeout` cannot do
//!   this for a server that is frozen (SIGSTOP, a stalled VM): its kernel keeps ACKing, TCP
//!   keepalives included, so nothing else would ever notice.
//! - **An error that means the session is over or useless**: severity FATAL or PANIC (the
//!   server closes after sending it: 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot
//!   connect now, "terminating connection due to unexpected postmaster exit", ...), class 08
//!   (connection exception), 25006 (read-only transaction: the server is a standby now, after a
//!   failover), 57014 (query canceled: our statement timeout fired).
//!
//! Either way, tokio-postgres sees a failed socket, every request in flight fails as "connection
//! closed", the client reports itself closed, and the pool drops the connection instead of
//! handing it out again. diesel-async keeps no SQLSTATE in the errors it returns
//! (`DatabaseErrorInformation` has no code), so this is the one place that sees the codes; the
//! HTTP layer only has to map a closed connection to 503.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::backend::{ErrorResponseBody, Header, Message};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_postgres::fallible_iterator::FallibleIterator;
use tokio_postgres::tls::{ChannelBinding, TlsStream};

/// Why an error ends the session, or `None` for an error the session survives (a constraint
/// violation, a serialization failure, a syntax error).
pub fn ends_session(severity: &str, code: &str) -> Option<&'static str> {
    match (severity, code) {
        ("FATAL" | "PANIC", _) => Some("the server ended the session"),
        (_, "25006") => Some("the server is read-only (a standby)"),
        (_, "57014") => Some("the statement was canceled (statement timeout)"),
        (_, "57P01" | "57P02" | "57P03" | "57P04" | "57P05") => {
            Some("the server is shutting down or unavailable")
        }
        (_, code) if code.starts_with("08") => Some("connection exception"),
        _ => None,
    }
}

/// Why the error in `body` ends the session, with its severity, code and message.
fn session_ending(body: &ErrorResponseBody) -> Option<String> {
    let [mut severity, mut localized, mut code, mut message] = [const { String::new() }; 4];
    let mut fields = body.fields();
    while let Ok(Some(field)) = fields.next() {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'V' => severity = value,
            b'S' => localized = value,
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
    }
    // `V` (never localized) is sent by servers since 9.6; `S` may be translated.
    let severity = if severity.is_empty() { localized } else { severity };
    ends_session(&severity, &code).map(|why| format!("{why}: {severity} {code} {message}"))
}

/// A connection's stream, watched. See the module documentation.
pub struct Watched<S> {
    inner: S,
    /// Bytes from the server not yet framed into a whole message.
    incoming: BytesMut,
    /// The header of the message the client is writing, so far (the startup message has no
    /// type byte: a 0 stands in for it), and what is left of that message's body.
    outgoing: BytesMut,
    skip: usize,
    /// Requests sent and not yet answered with ReadyForQuery.
    awaiting: u32,
    bound: Option<Duration>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// Set once the connection is condemned: every later read and write fails with it.
    failed: Option<(io::ErrorKind, String)>,
}

impl<S> Watched<S> {
    /// Watches `inner` from its startup message on; each answer must arrive within `bound`
    /// (`None`: no limit).
    pub fn new(inner: S, bound: Option<Duration>) -> Watched<S> {
        Watched {
            inner,
            incoming: BytesMut::new(),
            outgoing: BytesMut::from(&[0][..]),
            skip: 0,
            awaiting: 0,
            bound,
            deadline: None,
            failed: None,
        }
    }

    fn error(&self) -> Option<io::Error> {
        self.failed.as_ref().map(|(kind, reason)| io::Error::new(*kind, reason.clone()))
    }

    fn arm(&mut self) {
        let Some(bound) = self.bound else { return };
        let at = Instant::now() + bound;
        match &mut self.deadline {
            Some(sleep) => sleep.as_mut().reset(at),
            None => self.deadline = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// Bytes tokio-postgres wrote: counts the requests that expect a ReadyForQuery.
    fn sent(&mut self, mut bytes: &[u8]) {
        let mut requests = 0;
        while !bytes.is_empty() {
            let skipped = self.skip.min(bytes.len());
            self.skip -= skipped;
            bytes = &bytes[skipped..];
            let take = 5_usize.saturating_sub(self.outgoing.len()).min(bytes.len());
            self.outgoing.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            match Header::parse(&self.outgoing) {
                Ok(Some(header)) => {
                    // StartupMessage (0) is answered by ReadyForQuery once authentication is done.
                    requests += u32::from(matches!(header.tag(), 0 | b'Q' | b'S'));
                    self.skip = (header.len() as usize).saturating_sub(4);
                    self.outgoing.clear();
                }
                Ok(None) => {}
                // tokio-postgres wrote something that is not a message: nothing to count any more.
                Err(_) => self.skip = usize::MAX,
            }
        }
        if requests > 0 {
            if self.awaiting == 0 {
                self.arm();
            }
            self.awaiting += requests;
        }
    }

    /// Bytes the server sent: where to cut them if they hold an error that ends the session.
    fn received(&mut self, bytes: &[u8]) -> Option<usize> {
        let carried = self.incoming.len();
        self.incoming.extend_from_slice(bytes);
        let (mut consumed, mut answered, mut cut) = (0, 0, None);
        loop {
            let (start, before) = (consumed, self.incoming.len());
            let parsed = Message::parse(&mut self.incoming);
            consumed += before - self.incoming.len();
            match parsed {
                Ok(None) => break,
                Ok(Some(Message::ReadyForQuery(_))) => answered += 1,
                Ok(Some(Message::ErrorResponse(body))) => {
                    if let Some(reason) = session_ending(&body) {
                        self.failed = Some((io::ErrorKind::ConnectionAborted, reason));
                        cut = Some(start.saturating_sub(carried));
                        break;
                    }
                }
                Ok(Some(_)) => {}
                // A length that frames nothing: tokio-postgres rejects it; stop reading along.
                Err(_) if before == self.incoming.len() => {
                    self.incoming.clear();
                    break;
                }
                // A message postgres-protocol does not know: passed on like any other.
                Err(_) => {}
            }
        }
        if answered > 0 {
            self.awaiting = self.awaiting.saturating_sub(answered);
            if self.awaiting > 0 {
                // The next answer of a pipeline gets a full bound of its own.
                self.arm();
            }
        }
        cut
    }

    /// Ready with an error once an awaited answer is overdue; registers the wake-up otherwise.
    fn overdue(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.awaiting == 0 {
            return Poll::Pending;
        }
        let (Some(deadline), Some(bound)) = (&mut self.deadline, self.bound) else { return Poll::Pending };
        ready!(deadline.as_mut().poll(cx));
        let reason =
            format!("no answer from the database within {} ms; connection dropped", bound.as_millis());
        self.failed = Some((io::ErrorKind::TimedOut, reason));
        Poll::Ready(self.error().unwrap_or_else(|| io::ErrorKind::TimedOut.into()))
    }
}

/// What tokio-postgres asks of a stream its TLS connector returns: no channel binding
/// (SCRAM-SHA-256-PLUS) is offered.
impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Watched<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(error) = this.error() {
            return Poll::Ready(Err(error));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if let Some(cut) = this.received(&buf.filled()[before..]) {
                    // tokio-postgres never sees the fatal message: the read fails instead.
                    buf.set_filled(before + cut);
                    if cut == 0 {
                        return Poll::Ready(Err(this
                            .error()
                            .unwrap_or_else(|| io::ErrorKind::ConnectionAborted.into())));
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => this.overdue(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(error) = this.error() {
            return Poll::Ready(Err(error));
        }
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(written)) => {
                this.sent(&buf[..written]);
                // tokio-postgres polls its read side before writing: the deadline armed now
                // must register this task's waker itself, or nothing would wake it.
                if let Poll::Ready(error) = this.overdue(cx) {
                    return Poll::Ready(Err(error));
                }
                Poll::Ready(Ok(written))
            }
            // A full send buffer (the server reads nothing) is bounded by the same deadline.
            Poll::Pending => this.overdue(cx).map(Err),
            other => other,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.overdue(cx).map(Err),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    fn error_response(severity: &str, code: &str, message: &str) -> Vec<u8> {
        let mut body = Vec::new();
        for (field, value) in [(b'S', severity), (b'V', severity), (b'C', code), (b'M', message)] {
            body.push(field);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        message_bytes(b'E', &body)
    }

    fn message_bytes(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut bytes = vec![kind];
        bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    const SYNC: [u8; 5] = [b'S', 0, 0, 0, 4];

    fn ready_for_query() -> Vec<u8> {
        message_bytes(b'Z', b"I")
    }

    /// A watched client end (past startup) and the server end of an in-memory pipe.
    async fn pipe(bound: Option<Duration>) -> (Watched<DuplexStream>, DuplexStream) {
        let (client, server) = duplex(64 * 1024);
        let mut watched = Watched::new(client, bound);
        watched.outgoing.clear();
        (watched, server)
    }

    /// What the client reads after the server sent `bytes`: the bytes it got, or the error.
    async fn read_after(server_sends: &[u8]) -> Result<Vec<u8>, io::Error> {
        let (mut watched, mut server) = pipe(None).await;
        server.write_all(server_sends).await.unwrap();
        drop(server);
        let mut got = Vec::new();
        watched.read_to_end(&mut got).await.map(|_| got)
    }

    #[test]
    fn every_code_meaning_the_session_is_gone_ends_it() {
        for (severity, code) in [
            ("FATAL", "57P01"), // admin shutdown, and "unexpected postmaster exit"
            ("FATAL", "57P02"), // crash shutdown
            ("FATAL", "57P03"), // cannot connect now
            ("ERROR", "57P01"),
            ("ERROR", "57P02"),
            ("ERROR", "57P03"),
            ("ERROR", "25006"), // read-only transaction: demoted to a standby
            ("ERROR", "57014"), // statement timeout
            ("ERROR", "08000"),
            ("ERROR", "08003"),
            ("ERROR", "08006"),
            ("FATAL", "08P01"),
            ("FATAL", "53300"), // too many connections
            ("PANIC", "XX000"),
        ] {
            assert!(ends_session(severity, code).is_some(), "{severity} {code}");
        }
        for (severity, code) in
            [("ERROR", "23505"), ("ERROR", "40001"), ("ERROR", "40P01"), ("ERROR", "42601")]
        {
            assert!(ends_session(severity, code).is_none(), "{severity} {code}");
        }
    }

    #[tokio::test]
    async fn a_fatal_error_fails_the_read_instead_of_reaching_the_client() {
        for code in ["57P01", "57P02", "57P03", "08006"] {
            let fatal =
                error_response("FATAL", code, "terminating connection due to unexpected postmaster exit");
            let error = read_after(&fatal).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted, "{code}");
            assert!(error.to_string().contains(code), "{error}");
        }
        let read_only = error_response("ERROR", "25006", "cannot execute INSERT in a read-only transaction");
        assert_eq!(read_after(&read_only).await.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
        let timeout = error_response("ERROR", "57014", "canceling statement due to statement timeout");
        assert_eq!(read_after(&timeout).await.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    }

    #[tokio::test]
    async fn ordinary_errors_and_answers_pass_through_unchanged() {
        let mut stream = error_response("ERROR", "23505", "duplicate key value violates unique constraint");
        stream.extend(ready_for_query());
        assert_eq!(read_after(&stream).await.unwrap(), stream);
    }

    #[tokio::test]
    async fn what_came_before_a_fatal_error_is_still_delivered() {
        let mut stream = message_bytes(b'C', b"COMMIT\0");
        stream.extend(ready_for_query());
        let before = stream.len();
        stream.extend(error_response(
            "FATAL",
            "57P01",
            "terminating connection due to administrator command",
        ));
        let (mut watched, mut server) = pipe(None).await;
        server.write_all(&stream).await.unwrap();
        let mut got = vec![0; stream.len()];
        let read = watched.read(&mut got).await.unwrap();
        assert_eq!(&got[..read], &stream[..before], "the COMMIT and ReadyForQuery, not the error");
        assert!(watched.read(&mut got).await.is_err());
    }

    #[tokio::test]
    async fn an_unanswered_request_fails_after_the_bound() {
        let (mut watched, _server) = pipe(Some(Duration::from_millis(50))).await;
        watched.write_all(&SYNC).await.unwrap();
        let mut buffer = [0; 16];
        let error = watched.read(&mut buffer).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(watched.write_all(&SYNC).await.is_err(), "a condemned connection stays failed");
    }

    #[tokio::test]
    async fn an_answered_request_disarms_the_bound() {
        let (mut watched, mut server) = pipe(Some(Duration::from_millis(50))).await;
        watched.write_all(&SYNC).await.unwrap();
        server.write_all(&ready_for_query()).await.unwrap();
        let mut buffer = [0; 16];
        assert_eq!(watched.read(&mut buffer).await.unwrap(), 6);
        // Idle now: nothing is awaited, so waiting well past the bound is not an error.
        let idle = tokio::time::timeout(Duration::from_millis(300), watched.read(&mut buffer)).await;
        assert!(idle.is_err(), "an idle connection is left alone: {idle:?}");
    }

    #[tokio::test]
    async fn startup_is_bounded_too() {
        let (client, _server) = duplex(1024);
        let mut watched = Watched::new(client, Some(Duration::from_millis(50)));
        // StartupMessage: length, protocol 3.0, no parameters.
        let mut startup = 9_u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608_u32.to_be_bytes());
        startup.push(0);
        watched.write_all(&startup).await.unwrap();
        assert_eq!(watched.awaiting, 1);
        let error = watched.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn messages_split_across_reads_are_followed() {
        let (mut watched, mut server) = pipe(None).await;
        let fatal = error_response("FATAL", "57P01", "terminating connection due to administrator command");
        let mut got = vec![0; 1024];
        server.write_all(&fatal[..3]).await.unwrap();
        let first = watched.read(&mut got).await.unwrap();
        assert_eq!(first, 3, "a partial message passes: tokio-postgres waits for the rest");
        server.write_all(&fatal[3..]).await.unwrap();
        let second = watched.read(&mut got).await;
        assert!(second.is_err(), "{second:?}");
    }
}
