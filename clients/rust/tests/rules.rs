//! The retry rules of `clients/retry-rules.json` (shared with the TypeScript client), the
//! operations of openapi.yaml, the version, and webhook signatures: no service needed.

use std::collections::BTreeSet;
use std::time::Duration;

use orderpay_client::retry::{self, Decision, Outcome, Settings, Stop, Transport};
use orderpay_client::{
    FileKeyStore, KeyStore, MemoryKeyStore, StoredKey, Webhook, WebhookError, keys, operations,
};
use serde_json::Value;

fn repository_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

fn rules() -> Value {
    serde_json::from_str(&repository_file("clients/retry-rules.json")).expect("retry-rules.json is JSON")
}

fn ms(value: &Value) -> Duration {
    Duration::from_millis(value.as_u64().expect("milliseconds"))
}

#[test]
fn the_defaults_are_the_published_ones() {
    let defaults = &rules()["defaults"];
    let settings = Settings::default();
    assert_eq!(settings.max_retries as u64, defaults["max_retries"].as_u64().unwrap());
    assert_eq!(settings.backoff_base, ms(&defaults["backoff_base_ms"]));
    assert_eq!(settings.backoff_cap, ms(&defaults["backoff_cap_ms"]));
    assert_eq!(settings.backoff_floor, ms(&defaults["backoff_floor_ms"]));
    assert_eq!(settings.timeout, ms(&defaults["timeout_ms"]));
    assert_eq!(settings.deadline, ms(&defaults["deadline_ms"]));
    assert_eq!(settings.key_ttl, ms(&defaults["key_ttl_ms"]));
}

#[test]
fn backoff_doubles_from_half_a_second_to_five_with_jitter_and_a_floor() {
    let vectors = rules()["backoff"].as_array().unwrap().clone();
    assert!(!vectors.is_empty());
    for vector in vectors {
        let retry = vector["retry"].as_u64().unwrap() as u32;
        let delay = retry::backoff(&Settings::default(), retry, vector["random"].as_f64().unwrap());
        assert_eq!(delay.as_millis() as u64, vector["delay_ms"].as_u64().unwrap(), "{vector}");
    }
}

fn outcome(value: &Value) -> Outcome {
    if let Some(kind) = value["transport"].as_str() {
        return Outcome::Transport(match kind {
            "refused" => Transport::Refused,
            "reset" => Transport::Reset,
            "timeout" => Transport::Timeout,
            "tls" => Transport::Tls,
            _ => Transport::Other,
        });
    }
    Outcome::Answer {
        status: value["status"].as_u64().unwrap() as u16,
        problem_type: value["type"].as_str().map(str::to_owned),
        retry_after: value["retry_after"].as_u64().map(Duration::from_secs),
        should_retry: value["should_retry"].as_str().map(|text| text == "true"),
    }
}

fn error_name(stop: Stop) -> &'static str {
    match stop {
        Stop::Api => "api",
        Stop::KeyReused => "key_reused",
        Stop::InProgress => "in_progress",
        Stop::Transport => "transport",
        Stop::Deadline => "deadline",
    }
}

#[test]
fn every_decision_of_the_shared_table() {
    let vectors = rules()["decisions"].as_array().unwrap().clone();
    assert!(vectors.len() > 40);
    for vector in vectors {
        let mut settings = Settings::default();
        if let Some(max_retries) = vector["settings"]["max_retries"].as_u64() {
            settings.max_retries = max_retries as u32;
        }
        let decision = retry::decide(
            &settings,
            vector["attempt"].as_u64().unwrap() as u32,
            &outcome(&vector["outcome"]),
            vector["waiting"].as_bool().unwrap_or(false),
            vector.get("remaining_ms").map_or(Duration::from_secs(60), ms),
            vector["random"].as_f64().unwrap_or(0.0),
        );
        let name = &vector["name"];
        match (vector["expect"].as_str().unwrap(), decision) {
            ("done", Decision::Done) => {}
            ("retry", Decision::Retry(delay)) => assert_eq!(delay, ms(&vector["delay_ms"]), "{name}"),
            ("stop", Decision::Stop(stop)) => assert_eq!(error_name(stop), vector["error"], "{name}"),
            (expected, decision) => panic!("{name}: expected {expected}, decided {decision:?}"),
        }
    }
}

#[test]
fn keys_the_service_accepts_and_their_lifetime() {
    let rules = rules();
    for key in rules["keys"]["valid"].as_array().unwrap() {
        assert!(keys::valid_key(key.as_str().unwrap()), "{key}");
    }
    for key in rules["keys"]["invalid"].as_array().unwrap() {
        assert!(!keys::valid_key(key.as_str().unwrap()), "{key}");
    }
    let longest = rules["keys"]["longest_valid_length"].as_u64().unwrap() as usize;
    assert!(keys::valid_key(&"k".repeat(longest)) && !keys::valid_key(&"k".repeat(longest + 1)));
    assert!(keys::valid_key(&keys::new_key()));
    let ttl = Settings::default().key_ttl;
    let now = 10_000_000_000;
    for vector in rules["key_ttl"].as_array().unwrap() {
        let stored = StoredKey {
            key: "k".into(),
            first_sent_at_ms: vector["first_sent_ago_ms"].as_u64().map(|ago| now - ago),
        };
        assert_eq!(stored.expired(ttl, now), vector["expired"].as_bool().unwrap(), "{vector}");
    }
}

/// The `operationId`s of openapi.yaml's paths (each at the indentation of an operation).
fn published_operations() -> BTreeSet<String> {
    repository_file("openapi.yaml")
        .lines()
        .filter_map(|line| line.strip_prefix("      operationId: "))
        .map(|id| id.trim().to_owned())
        .collect()
}

#[test]
fn every_operation_of_openapi_is_covered_or_excluded_by_name() {
    let published = published_operations();
    assert!(published.len() > 20, "{published:?}");
    let covered: BTreeSet<String> = operations::COVERED.iter().map(|(id, _, _)| (*id).to_owned()).collect();
    let excluded: BTreeSet<String> = operations::EXCLUDED.iter().map(|id| (*id).to_owned()).collect();
    let missing: Vec<&String> =
        published.iter().filter(|id| !covered.contains(*id) && !excluded.contains(*id)).collect();
    assert!(missing.is_empty(), "openapi.yaml has operations the client lacks: {missing:?}");
    let stale: Vec<&String> = covered.union(&excluded).filter(|id| !published.contains(*id)).collect();
    assert!(stale.is_empty(), "the client lists operations openapi.yaml does not have: {stale:?}");
}

#[test]
fn the_routes_are_the_published_ones() {
    let spec = repository_file("openapi.yaml");
    for (id, method, path) in operations::COVERED {
        let at = spec.find(&format!("\n  {path}:\n")).unwrap_or_else(|| panic!("{path} is not a path"));
        let block = &spec[at..];
        let block = &block[..block[1..].find("\n  /").map_or(block.len(), |end| end + 1)];
        let method_at = block
            .find(&format!("\n    {}:\n", method.to_lowercase()))
            .unwrap_or_else(|| panic!("{method} {path}"));
        let operation = block[method_at..].lines().find_map(|line| line.strip_prefix("      operationId: "));
        assert_eq!(operation, Some(*id), "{method} {path}");
    }
}

#[test]
fn the_version_is_the_apis() {
    let spec = repository_file("openapi.yaml");
    let version = spec.lines().find_map(|line| line.strip_prefix("  version: ")).expect("info.version");
    assert_eq!(env!("CARGO_PKG_VERSION"), version.trim());
}

#[test]
fn webhook_signatures_follow_the_standard_webhooks_reference() {
    // The reference libraries' own test message.
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (id, timestamp, body) = ("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, br#"{"test": 2432232314}"#);
    let expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    assert_eq!(orderpay_client::webhooks::signature(secret, id, timestamp, body).unwrap(), expected);
    let headers = |signature: &'static str| {
        move |name: &str| match name {
            "webhook-id" => Some(id),
            "webhook-timestamp" => Some("1614265330"),
            "webhook-signature" => Some(signature),
            _ => None,
        }
    };
    let webhook = Webhook::new(&[secret]).unwrap();
    // Genuine, but not an orderpay event.
    assert!(matches!(
        webhook.verify_at(headers(expected), body, 1_614_265_330),
        Err(WebhookError::InvalidEvent(_))
    ));
    let rotated = format!("v1,bm9wZQ== {expected}");
    let rotated: &'static str = Box::leak(rotated.into_boxed_str());
    assert!(matches!(
        webhook.verify_at(headers(rotated), body, 1_614_265_330),
        Err(WebhookError::InvalidEvent(_))
    ));
    assert_eq!(
        webhook.verify_at(headers(expected), b"{\"test\": 2432232315}", 1_614_265_330).unwrap_err(),
        WebhookError::NoMatchingSignature
    );
    assert_eq!(
        webhook.verify_at(headers(expected), body, 1_614_265_330 + 301).unwrap_err(),
        WebhookError::TimestampOutOfTolerance
    );
    let other = Webhook::new(&["whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQtMzJieXRlcw=="]).unwrap();
    assert_eq!(
        other.verify_at(headers(expected), body, 1_614_265_330).unwrap_err(),
        WebhookError::NoMatchingSignature
    );
    assert_eq!(Webhook::new(&["whsec_***"]).unwrap_err(), WebhookError::InvalidSecret);
}

#[test]
fn a_key_store_keeps_the_first_key_of_an_intent() {
    let file = std::env::temp_dir().join(format!("orderpay-keys-{}.json", keys::new_key()));
    let stores: [Box<dyn KeyStore>; 2] =
        [Box::new(MemoryKeyStore::new()), Box::new(FileKeyStore::new(&file))];
    for store in stores {
        let first = StoredKey { key: "first".into(), first_sent_at_ms: None };
        store.save("intent", "createOrder", &first).unwrap();
        store
            .save("intent", "createOrder", &StoredKey { key: "second".into(), first_sent_at_ms: Some(1) })
            .unwrap();
        assert_eq!(
            store.load("intent", "createOrder").unwrap(),
            Some(first.clone()),
            "the first key is kept"
        );
        store.save("intent", "createOrder", &StoredKey { first_sent_at_ms: Some(7), ..first }).unwrap();
        assert_eq!(store.load("intent", "createOrder").unwrap().unwrap().first_sent_at_ms, Some(7));
        assert_eq!(store.load("intent", "createPayment").unwrap(), None, "one key per operation");
    }
    // The file's keys outlive the store that wrote them.
    assert_eq!(FileKeyStore::new(&file).load("intent", "createOrder").unwrap().unwrap().key, "first");
    std::fs::remove_file(file).unwrap();
}
