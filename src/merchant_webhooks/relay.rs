//! The webhooks relay: hands each event of the outbox on as one delivery per endpoint of its
//! account that asked for its type, written in the relay's round (`events::relay`), so the
//! deliveries and the cursor's move commit together. A batch handed on again (after a round
//! that failed) finds its deliveries there already and writes none twice.
//!
//! An endpoint receives the events that happened once it existed (created at or before the
//! event), not the account's older ones still waiting in the outbox.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use chrono::Utc;
use diesel_async::AsyncPgConnection;
use tokio::sync::Notify;

use super::DeliveryOrigin;
use super::endpoints::{self, Subscriber};
use super::queue::{self, NewDelivery};
use crate::events::Event;
use crate::events::relay::Relay;
use crate::ids::{AccountId, DeliveryId};

pub struct WebhookRelay {
    /// Wakes this instance's delivery worker once new deliveries are committed.
    wake: Arc<Notify>,
}

impl WebhookRelay {
    pub fn new(wake: Arc<Notify>) -> Self {
        WebhookRelay { wake }
    }
}

/// The deliveries of `batch` to `subscribers`: one per event and endpoint of its account that
/// existed when it happened and asked for its type.
pub fn deliveries(batch: &[Event], subscribers: &[Subscriber], origin: DeliveryOrigin) -> Vec<NewDelivery> {
    let mut by_account: HashMap<AccountId, Vec<&Subscriber>> = HashMap::new();
    for subscriber in subscribers {
        by_account.entry(subscriber.account_id).or_default().push(subscriber);
    }
    batch
        .iter()
        .flat_map(|event| {
            let endpoints = by_account.get(&event.account_id).map(Vec::as_slice).unwrap_or_default();
            endpoints
                .iter()
                .filter(|endpoint| {
                    origin == DeliveryOrigin::Redeliver || endpoint.created_at <= event.created_at
                })
                .filter(|endpoint| endpoint.enabled_events.accepts(event.event_type))
                .map(|endpoint| NewDelivery {
                    account_id: event.account_id,
                    id: DeliveryId::generate(),
                    endpoint_id: endpoint.id,
                    event_id: event.id,
                    origin,
                })
        })
        .collect()
}

impl Relay for WebhookRelay {
    const NAME: &'static str = "webhooks";

    async fn hand_on(&self, conn: &mut AsyncPgConnection, batch: &[Event]) -> anyhow::Result<()> {
        let accounts: Vec<AccountId> =
            batch.iter().map(|event| event.account_id).collect::<BTreeSet<_>>().into_iter().collect();
        let subscribers = endpoints::subscribers(conn, &accounts, None).await?;
        let deliveries = deliveries(batch, &subscribers, DeliveryOrigin::Outbox);
        if !deliveries.is_empty() {
            queue::insert_deliveries(conn, &deliveries, Utc::now()).await?;
        }
        Ok(())
    }

    fn handed_on(&self, _count: usize) {
        self.wake.notify_one();
    }
}
