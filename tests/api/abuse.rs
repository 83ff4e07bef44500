//! Hostile or broken clients: each gets a 4xx or a closed connection, never a crash, and the
//! service stays healthy with bounded memory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::Method;

use crate::helpers::{
    RawAnswer, assert_problem, http_client, json, new_key, order_body, read_until_closed, spawn_app,
    spawn_app_with,
};
use crate::process::ServiceProcess;

#[tokio::test]
async fn deeply_nested_json_is_refused_not_recursed_into() {
    let app = spawn_app().await;
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_problem(app.post_order_raw(&nested, Some(&new_key())).await, 400, "malformed-json").await;
    let nested_objects = format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000));
    assert_problem(app.post_order_raw(&nested_objects, Some(&new_key())).await, 400, "malformed-json").await;
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_oversized_chunked_body_is_cut_off_at_the_limit() {
    let app = spawn_app().await;
    let (address, api_key) = (app.address.trim_start_matches("http://").to_owned(), app.api_key.clone());
    // No Content-Length: the limit must hold while the body streams in.
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let head = format!(
            "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..40 {
            let sent = stream
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .and_then(|()| stream.write_all(&chunk))
                .and_then(|()| stream.write_all(b"\r\n"));
            if sent.is_err() {
                break; // the server stopped reading: also a fair answer
            }
        }
        let mut answer = vec![0_u8; 4096];
        let read = stream.read(&mut answer).unwrap_or(0);
        String::from_utf8_lossy(&answer[..read]).into_owned()
    })
    .await
    .unwrap();
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(app.keys_stored().await, 0);
    assert_eq!(app.orders_stored().await, 0);
}

#[tokio::test]
async fn huge_headers_get_a_4xx_or_a_closed_connection() {
    let app = spawn_app().await;
    let huge = "x".repeat(128 * 1024);
    let response = app.request(Method::GET, "/orders").header("X-Padding", huge).send().await;
    if let Ok(response) = response {
        assert!(response.status().is_client_error(), "status {}", response.status());
    }
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_slow_client_is_timed_out_and_disconnected() {
    // Two seconds for a request head: the slow head's case waits them out, and a machine busy
    // with the whole suite once took longer than half a second to read a head that had arrived
    // at once (the last request here was answered 408).
    let app = spawn_app_with(|settings, _| settings.client_timeout = Duration::from_millis(2000)).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let started = Instant::now();
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // Half a request head, then nothing.
        stream.write_all(b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: applic").unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "held for {:?}", started.elapsed());
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_distinct_keys_from_one_account_keep_memory_bounded() {
    let app = spawn_app().await;
    let service = ServiceProcess::start(&app.database_url, &app.provider.address, &[]).await;
    let rss = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap().to_owned();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
    };
    let client = http_client();
    let send = |key: String| {
        client
            .post(format!("{}/orders", service.address))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", key)
            .json(&order_body())
            .send()
    };
    // 64 in flight at a time: the point is how many distinct keys the service keeps, not how
    // many connections a loaded machine accepts at once (500 at once timed out reading requests).
    for batch in 0..6 {
        let answers: Vec<_> =
            futures::stream::iter((0..500).map(|_| send(new_key()))).buffer_unordered(64).collect().await;
        assert!(answers.into_iter().all(|answer| answer.unwrap().status() == 201), "batch {batch}");
    }
    let mib = rss(service.pid());
    assert_eq!(app.orders_stored().await, 3000);
    assert!(mib < 64, "resident memory after 3000 keys: {mib} MiB");
    let health = client.get(format!("{}/readyz", service.address)).send().await.unwrap();
    assert_eq!(json(health).await["status"], "ready");
}

/// Sends `bytes` on a new connection, then reads until the server closes it or `wait` passes
/// without news (blocking).
fn exchange(address: &str, bytes: &[u8], wait: Duration) -> RawAnswer {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.write_all(bytes).unwrap();
    read_until_closed(&mut stream, wait)
}

/// A `POST /orders` head with `extra` headers, authenticated with `api_key`.
fn order_head(api_key: &str, extra: &str) -> String {
    format!(
        "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n\
         Content-Type: application/json\r\n{extra}\r\n"
    )
}

/// Half of a valid order body, sent with Content-Length, as one chunk of a chunked body, and
/// not at all: three ways to stall a body.
fn stalled_bodies(api_key: &str) -> Vec<(&'static str, Vec<u8>)> {
    let body = order_body().to_string();
    let half = &body[..body.len() / 2];
    vec![
        (
            "half a sized body",
            format!("{}{half}", order_head(api_key, &format!("Content-Length: {}\r\n", body.len()))),
        ),
        (
            "a chunk of a chunked body",
            format!(
                "{}{:x}\r\n{half}\r\n",
                order_head(api_key, "Transfer-Encoding: chunked\r\n"),
                half.len()
            ),
        ),
        ("a head and no body", order_head(api_key, &format!("Content-Length: {}\r\n", body.len()))),
    ]
    .into_iter()
    .map(|(name, request)| (name, request.into_bytes()))
    .collect()
}

fn assert_body_timed_out(name: &str, answer: &RawAnswer) {
    assert_eq!(answer.status(), Some(408), "{name}: {answer:?}");
    assert!(answer.closed, "{name}: the connection stayed open: {answer:?}");
    let text = answer.text.to_ascii_lowercase();
    assert!(text.contains("content-type: application/problem+json"), "{name}: {answer:?}");
    assert!(text.contains("connection: close"), "{name}: {answer:?}");
    assert!(text.contains("\"type\":\"request-timeout\""), "{name}: {answer:?}");
}

#[tokio::test]
async fn a_stalled_body_gets_408_and_its_connection_is_closed() {
    let app = spawn_app_with(|settings, _| settings.client_body_timeout = Duration::from_millis(500)).await;
    let address = app.socket_address();
    for (name, request) in stalled_bodies(&app.api_key) {
        let address = address.clone();
        // Well past the 500 ms setting; without a body timeout nothing comes back at all.
        let answer =
            tokio::task::spawn_blocking(move || exchange(&address, &request, Duration::from_secs(10)))
                .await
                .unwrap();
        assert_body_timed_out(name, &answer);
    }
    assert_eq!(app.orders_stored().await, 0);
    assert_eq!(app.keys_stored().await, 0);
}

#[tokio::test]
async fn a_body_nobody_reads_does_not_hold_the_connection() {
    // The default body timeout (10 s): these connections must end long before it, right after
    // their answer.
    let app = spawn_app().await;
    let address = app.socket_address();
    let chunk = "5\r\nhello\r\n";
    let cases = [
        (
            "a chunked body on GET /healthz",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"),
            200,
        ),
        (
            "a chunked body with a wrong key",
            format!("{}{chunk}", order_head("sk_wrong", "Transfer-Encoding: chunked\r\n")),
            401,
        ),
        (
            "a sized body with a wrong key",
            format!("{}{{\"currency\"", order_head("sk_wrong", "Content-Length: 100\r\n")),
            401,
        ),
        (
            "a chunked body on an unknown route",
            format!("POST /nowhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"),
            404,
        ),
    ];
    for (name, request, status) in cases {
        let address = address.clone();
        let answer = tokio::task::spawn_blocking(move || {
            exchange(&address, request.as_bytes(), Duration::from_secs(5))
        })
        .await
        .unwrap();
        assert_eq!(answer.status(), Some(status), "{name}: {answer:?}");
        assert!(answer.closed, "{name}: the connection stayed open after the answer: {answer:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stalled_bodies_do_not_keep_the_server_from_answering_others() {
    const STALLED: usize = 50;
    let app = spawn_app_with(|settings, _| settings.client_body_timeout = Duration::from_secs(3)).await;
    let (sent, all_sent) = std::sync::mpsc::channel();
    let clients: Vec<_> = (0..STALLED)
        .map(|i| {
            let (address, sent) = (app.socket_address(), sent.clone());
            let (name, request) = stalled_bodies(&app.api_key).swap_remove(i % 3);
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(address).unwrap();
                stream.write_all(&request).unwrap();
                sent.send(()).unwrap();
                (name, read_until_closed(&mut stream, Duration::from_secs(20)))
            })
        })
        .collect();
    for _ in 0..STALLED {
        all_sent.recv().unwrap();
    }
    // While every one of them waits on its body, other clients are served.
    let created = app.post_order(&order_body(), Some(&new_key())).await;
    assert_eq!(created.status(), 201);
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), 200);
    for client in clients {
        let (name, answer) = tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
        assert_body_timed_out(name, &answer);
    }
    assert_eq!(app.orders_stored().await, 1);
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_one() {
    // Two connections in all over the tests' two workers: one each. The head timeout is long, so
    // idle connections keep their slot.
    let app = spawn_app_with(|settings, _| {
        settings.max_connections = 2;
        settings.client_timeout = Duration::from_secs(60);
    })
    .await;
    let address = app.socket_address();
    let answer = tokio::task::spawn_blocking(move || {
        let mut idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&address).unwrap()).collect();
        let mut third = TcpStream::connect(&address).unwrap();
        third.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        // Queued in the listen backlog: not served while both slots are taken.
        let early = read_until_closed(&mut third, Duration::from_secs(1));
        assert!(early.text.is_empty() && !early.closed, "served beyond the cap: {early:?}");
        drop(idle.pop());
        read_until_closed(&mut third, Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert_eq!(answer.status(), Some(200), "{answer:?}");
}

#[tokio::test]
async fn what_the_http_layer_refuses_gets_its_status_and_a_closed_connection() {
    // These are answered by actix-http's HTTP/1 parser, before the application sees a request:
    // status codes without a body (see openapi.yaml, "Answers from the HTTP layer").
    // Two seconds for a request head: the slow head's case waits them out, and a machine busy
    // with the whole suite once took longer than half a second to read a head that had arrived
    // at once (the last request here was answered 408).
    let app = spawn_app_with(|settings, _| settings.client_timeout = Duration::from_millis(2000)).await;
    let many_headers: String = (0..100).map(|i| format!("X-Header-{i}: {i}\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("a control character in a header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\x01b\r\n\r\n".to_vec(), 400),
        ("DEL in a header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\x7fb\r\n\r\n".to_vec(), 400),
        (
            "Content-Length and Transfer-Encoding",
            b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                .to_vec(),
            400,
        ),
        ("two Content-Length", b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}".to_vec(), 400),
        ("too many headers", format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").into_bytes(), 431),
        ("a slow request head", b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Ty".to_vec(), 408),
    ];
    let address = app.socket_address();
    for (name, request, status) in cases {
        let address = address.clone();
        let answer =
            tokio::task::spawn_blocking(move || exchange(&address, &request, Duration::from_secs(10)))
                .await
                .unwrap();
        assert_eq!(answer.status(), Some(status), "{name}: {answer:?}");
        assert!(answer.closed, "{name}: the connection stayed open: {answer:?}");
    }
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), 200);
}
