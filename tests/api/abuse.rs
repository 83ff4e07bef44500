//! Hostile or broken clients: each gets a 4xx or a closed connection, never a crash, and the
//! service stays healthy with bounded memory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::Method;

use crate::helpers::{assert_problem, http_client, json, new_key, order_body, spawn_app, spawn_app_with};
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
    let app = spawn_app_with(|settings, _| settings.client_timeout = Duration::from_millis(500)).await;
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
    for batch in 0..6 {
        let answers = join_all((0..500).map(|_| send(new_key()))).await;
        assert!(answers.into_iter().all(|answer| answer.unwrap().status() == 201), "batch {batch}");
    }
    let mib = rss(service.pid());
    assert_eq!(app.orders_stored().await, 3000);
    assert!(mib < 64, "resident memory after 3000 keys: {mib} MiB");
    let health = client.get(format!("{}/readyz", service.address)).send().await.unwrap();
    assert_eq!(json(health).await["status"], "ready");
}
