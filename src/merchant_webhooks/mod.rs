//! Merchant webhooks: the endpoints a merchant registers (`/webhook_endpoints`), and the signed
//! POST of every event of the account to each endpoint that asked for its type, at least once.
//!
//! The way there, in three steps, each with its own transaction:
//! - the outbox: a state change writes its event (`events`);
//! - the webhooks relay ([`relay`]) hands events on in transaction order, writing one delivery
//!   per (event, matching endpoint) in the round that moves its cursor;
//! - the delivery workers ([`delivery`], one in every instance) lease due deliveries, send them,
//!   and write each outcome under the lease, retrying with backoff until a 2xx or the last
//!   attempt.
//!
//! Endpoints are only ever reached at public addresses unless `ORDERPAY_WEBHOOK_ALLOW_PRIVATE`
//! says otherwise ([`address`]). Their signing secrets are stored sealed under
//! `ORDERPAY_ENCRYPTION_KEY` ([`crate::encryption`], [`secrets`]); without that key there are no
//! merchant webhooks at all. docs/events.md has the design.

pub mod address;
pub mod delivery;
pub mod endpoints;
pub mod queue;
pub mod relay;
pub mod representation;
pub mod retention;
pub mod secrets;
pub mod service;

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::encryption::Keyring;
use crate::events::EventType;
use crate::ids::{AccountId, EndpointId};

crate::text_enum! {
    /// A delivery's life: `pending` (waiting for its next attempt, or being sent) until a 2xx
    /// (`delivered`), its last attempt (`failed`) or its endpoint's deletion (`canceled`).
    pub enum DeliveryStatus {
        Pending = "pending",
        Delivered = "delivered",
        Failed = "failed",
        Canceled = "canceled",
    }
}

crate::text_enum! {
    /// Who asked for a delivery: the relay (once per event and endpoint), or an operator.
    pub enum DeliveryOrigin {
        Outbox = "outbox",
        Redeliver = "redeliver",
    }
}

/// What turns merchant webhooks on: set when `ORDERPAY_ENCRYPTION_KEY` is.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// Seal (the first) and open (any) the endpoints' signing secrets.
    pub encryption_keys: Keyring,
    /// Endpoints at private, loopback and other non-public addresses are allowed (development
    /// and tests only).
    pub allow_private: bool,
    /// New endpoints must be `https://` (existing `http://` ones keep receiving, flagged
    /// insecure).
    pub require_https: bool,
    /// How long a rotated-out secret keeps signing next to the new one.
    pub secret_overlap: Duration,
    pub delivery: DeliveryConfig,
}

/// How deliveries are sent and retried.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryConfig {
    /// How often a worker looks for due deliveries (besides being woken by its relay).
    pub poll: Duration,
    /// A send without a 2xx answer within this long has failed.
    pub timeout: Duration,
    /// How long a worker holds a delivery it sends; after that another worker may send it
    /// again. Longer than `timeout`, so that only a worker that died loses its deliveries.
    pub lease: Duration,
    /// The wait before the second attempt; it doubles per attempt, with jitter.
    pub retry_base: Duration,
    /// The longest wait between two attempts.
    pub retry_cap: Duration,
    /// Attempts before a delivery is failed for good.
    pub max_attempts: i32,
    /// Sends in flight at once, per instance.
    pub concurrency: usize,
}

impl DeliveryConfig {
    /// The wait after failed attempt number `attempt` (1-based): `retry_base * 2^(attempt-1)`
    /// capped at `retry_cap`, with equal jitter (a uniform draw from its upper half), so that
    /// endpoints that failed together are not retried in lockstep while each wait keeps at
    /// least half its length.
    pub fn backoff(&self, attempt: i32, random: u64) -> Duration {
        let doublings = attempt.saturating_sub(1).clamp(0, 31) as u32;
        let ceiling = self.retry_base.saturating_mul(1 << doublings).min(self.retry_cap);
        let half = ceiling / 2;
        let spread_ms = u64::try_from((ceiling - half).as_millis()).unwrap_or(u64::MAX);
        half + Duration::from_millis(random % spread_ms.saturating_add(1))
    }
}

/// Which events an endpoint receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnabledEvents {
    /// `["*"]`: every type, also types added later.
    All,
    /// These types (at least one, no duplicates).
    Only(Vec<EventType>),
}

/// Why a list of event types was refused: the position of the bad entry (if one) and why.
pub type EventsProblem = (Option<usize>, String);

impl EnabledEvents {
    pub const ALL: &'static str = "*";

    /// Parses `["*"]` or a list of known event types; every bad entry is reported.
    pub fn parse(items: &[String]) -> Result<EnabledEvents, Vec<EventsProblem>> {
        if items.is_empty() {
            return Err(vec![(None, "must list at least one event type, or \"*\"".to_owned())]);
        }
        if items.len() > EventType::ALL.len() {
            return Err(vec![(None, format!("must list at most {} event types", EventType::ALL.len()))]);
        }
        if items.iter().any(|item| item == Self::ALL) {
            return if items.len() == 1 {
                Ok(EnabledEvents::All)
            } else {
                Err(vec![(None, "\"*\" stands alone: it already means every event type".to_owned())])
            };
        }
        let mut types = Vec::with_capacity(items.len());
        let mut problems = Vec::new();
        for (index, item) in items.iter().enumerate() {
            match EventType::parse(item) {
                Some(event_type) if types.contains(&event_type) => {
                    problems.push((Some(index), format!("{item} is listed twice")));
                }
                Some(event_type) => types.push(event_type),
                None => problems.push((Some(index), format!("{item:?} is not an event type"))),
            }
        }
        if problems.is_empty() { Ok(EnabledEvents::Only(types)) } else { Err(problems) }
    }

    pub fn accepts(&self, event_type: EventType) -> bool {
        match self {
            EnabledEvents::All => true,
            EnabledEvents::Only(types) => types.contains(&event_type),
        }
    }

    /// As stored and shown: `["*"]` or the types.
    pub fn names(&self) -> Vec<&'static str> {
        match self {
            EnabledEvents::All => vec![Self::ALL],
            EnabledEvents::Only(types) => types.iter().map(EventType::as_str).collect(),
        }
    }
}

/// A webhook endpoint as the API shows it (its secrets stay in the repository, sealed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub account_id: AccountId,
    pub id: EndpointId,
    pub url: EndpointUrl,
    pub description: Option<String>,
    pub enabled_events: EnabledEvents,
    /// Until when the secret before the last rotation still signs.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What a secret is sealed for: the endpoint's row, so a sealed secret copied to another
/// endpoint does not open.
pub fn secret_context(account_id: AccountId, id: EndpointId) -> [u8; 32] {
    let mut context = [0_u8; 32];
    context[..16].copy_from_slice(account_id.as_uuid().as_bytes());
    context[16..].copy_from_slice(id.as_uuid().as_bytes());
    context
}

/// An endpoint's URL: `http` or `https`, with a host, without credentials (they would be
/// stored in clear), at most 2048 characters. Where it may point is [`address`]'s business.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointUrl(url::Url);

impl EndpointUrl {
    pub const MAX_CHARS: usize = 2048;

    pub fn parse(text: &str) -> Result<EndpointUrl, &'static str> {
        if text.is_empty() || text.chars().count() > Self::MAX_CHARS {
            return Err("must be 1 to 2048 characters");
        }
        let url = url::Url::parse(text).map_err(|_| "must be an absolute http or https URL")?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("must be an http or https URL");
        }
        if url.host().is_none() {
            return Err("must name a host");
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("must not contain credentials: authenticate the webhook by its signature");
        }
        // What is stored is the parsed form, which may be longer than what was sent (escaping).
        if url.as_str().chars().count() > Self::MAX_CHARS {
            return Err("must be 1 to 2048 characters");
        }
        Ok(EndpointUrl(url))
    }

    pub fn as_url(&self) -> &url::Url {
        &self.0
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// Plain `http`: what is sent, signature included, crosses the network in clear.
    pub fn is_insecure(&self) -> bool {
        self.0.scheme() == "http"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enabled_events_are_a_star_alone_or_known_distinct_types() {
        let parse = |items: &[&str]| {
            EnabledEvents::parse(&items.iter().map(|item| (*item).to_owned()).collect::<Vec<_>>())
        };
        assert_eq!(parse(&["*"]), Ok(EnabledEvents::All));
        let only = parse(&["order.paid", "refund.failed"]).unwrap();
        assert!(only.accepts(EventType::OrderPaid) && !only.accepts(EventType::OrderCreated));
        assert_eq!(only.names(), ["order.paid", "refund.failed"]);
        assert!(EnabledEvents::All.accepts(EventType::RefundFailed));
        assert_eq!(parse(&[]).unwrap_err()[0].0, None);
        assert_eq!(parse(&["*", "order.paid"]).unwrap_err()[0].0, None);
        let problems = parse(&["order.paid", "order.shipped", "order.paid"]).unwrap_err();
        assert_eq!(problems.iter().map(|p| p.0).collect::<Vec<_>>(), [Some(1), Some(2)]);
    }

    #[test]
    fn endpoint_urls_are_http_with_a_host_and_no_credentials() {
        assert!(EndpointUrl::parse("https://example.com/hooks?x=1").is_ok());
        assert_eq!(EndpointUrl::parse("http://127.1:80/").unwrap().as_str(), "http://127.0.0.1/");
        for bad in ["", "example.com/hooks", "ftp://example.com/", "https://user:pw@example.com/", "http://"]
        {
            assert!(EndpointUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(EndpointUrl::parse(&format!("https://example.com/{}", "a".repeat(2048))).is_err());
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_in_the_upper_half() {
        let config = DeliveryConfig {
            poll: Duration::ZERO,
            timeout: Duration::ZERO,
            lease: Duration::ZERO,
            retry_base: Duration::from_millis(5_000),
            retry_cap: Duration::from_millis(21_600_000),
            max_attempts: 20,
            concurrency: 1,
        };
        assert_eq!(config.backoff(1, 0), Duration::from_millis(2_500));
        assert_eq!(config.backoff(1, 2_500), Duration::from_millis(5_000));
        assert_eq!(config.backoff(3, 0), Duration::from_millis(10_000));
        assert_eq!(config.backoff(30, 0), Duration::from_millis(10_800_000));
        assert_eq!(config.backoff(i32::MAX, 0), Duration::from_millis(10_800_000));
        for random in [0, 1, 12_345, u64::MAX / 3, u64::MAX] {
            for attempt in 1..25 {
                let wait = config.backoff(attempt, random);
                let doubled = config.retry_base * 2_u32.pow((attempt - 1).min(20) as u32);
                let ceiling = doubled.min(config.retry_cap);
                assert!(wait >= ceiling / 2 && wait <= ceiling, "{attempt} {random}: {wait:?}");
            }
        }
    }
}
