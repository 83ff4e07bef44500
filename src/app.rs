//! Builds the actix application and its shared state, starts the background tasks, and runs the
//! whole until the server stops. `main` and the integration tests build it the same way. With
//! `ORDERPAY_METRICS_LISTEN`, a second server of its own serves `GET /metrics` alone.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::middleware::{ErrorHandlers, from_fn};
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::accounts::{AccountCache, revocations};
use crate::background;
use crate::config::Settings;
use crate::config::Wire;
use crate::db::{self, Pool};
use crate::http::{self, AppState};
use crate::idempotency::cache::ReplayCache;
use crate::idempotency::{Keys, sweeper};
use crate::merchant_webhooks::relay::WebhookRelay;
use crate::merchant_webhooks::{WebhookSettings, delivery};
use crate::operations::{Engine, reconciler};
use crate::provider::PaymentProvider;
use crate::provider::client::HttpProvider;
use crate::provider::coalesce::Coalescing;
use crate::provider::stripe::StripeProvider;
use crate::rate_limit::RateLimiter;
use crate::telemetry::Observability;

/// The provider-operations engine on `pool`: the one way every part of the process (request
/// workers, the reconciler, `orderpay reconcile`) builds it.
pub fn engine(settings: &Settings, pool: Pool, provider: Arc<dyn PaymentProvider>) -> Engine {
    Engine { pool, provider, timing: settings.timing, reconciler: settings.reconciler }
}

/// The provider client for `settings`.
pub fn provider(settings: &crate::config::ProviderConfig) -> anyhow::Result<Arc<dyn PaymentProvider>> {
    match &settings.wire {
        Wire::Mock { api_key } => {
            let api_key = api_key.as_ref().map(|key| secrecy::ExposeSecret::expose_secret(key).to_owned());
            let client = HttpProvider::new(&settings.url, settings.timeout, api_key)?;
            Ok(Arc::new(Coalescing::new(client)))
        }
        Wire::Stripe { api_key, created_filter } => {
            let mut client = StripeProvider::new(&settings.url, settings.timeout, api_key)?;
            if !created_filter {
                client = client.without_created_filter();
            }
            Ok(Arc::new(Coalescing::new(client)))
        }
    }
}

/// Connections of the webhook delivery worker's own pool: one for its claims, one for its
/// recorder (which writes the outcomes of the sends in batches, one batch at a time), so neither
/// waits behind the other or behind the other background tasks.
pub(crate) const DELIVERY_POOL_SIZE: u32 = 2;
/// Connections shared by the background tasks: the two sweepers, the reconciler and the outbox's
/// relays. A relay round holds one while its destination answers (a NATS round up to its
/// timeout while NATS is away), so there is one for each relay besides the others' share.
pub(crate) const BACKGROUND_POOL_SIZE: u32 = 6;

/// Merchant webhooks' background tasks: the webhooks relay (on the background pool, a round
/// at a time across instances) and this instance's delivery worker (on a pool of its own),
/// which the relay wakes when it wrote new deliveries.
async fn merchant_webhooks_tasks(
    settings: &Settings,
    webhooks: &WebhookSettings,
    background_pool: Pool,
    observability: &Observability,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<[JoinHandle<()>; 2]> {
    let wake = Arc::new(Notify::new());
    let delivery_pool = db::background_pool(&settings.database, DELIVERY_POOL_SIZE);
    observability.register(&delivery_pool);
    let worker = delivery::Worker::new(delivery_pool, webhooks, wake.clone())?;
    crate::events::relay::export_lag::<WebhookRelay>(&background_pool).await;
    let relay = crate::events::relay::run(
        background_pool,
        WebhookRelay::new(wake),
        settings.relay.interval,
        settings.relay.batch_size,
        shutdown.clone(),
    );
    Ok([tokio::spawn(relay), tokio::spawn(delivery::run(worker, shutdown))])
}

/// `GET /metrics` alone, on `ORDERPAY_METRICS_LISTEN`'s address: one worker, its own pool of one
/// connection (operations waiting are counted at each scrape), the same request ids, access
/// log and HTTP metrics as the API, and 404 `route-not-found` for anything else.
fn metrics_server(
    settings: &Settings,
    listener: TcpListener,
    observability: Arc<Observability>,
) -> anyhow::Result<actix_web::dev::Server> {
    let database = settings.database.clone();
    let server = HttpServer::new(move || {
        let pool = db::lazy_pool(&database, 1);
        observability.register(&pool);
        let source =
            web::Data::new(http::health::MetricsSource { observability: observability.clone(), pool });
        App::new()
            .wrap(ErrorHandlers::new().default_handler(http::problem_for_foreign_errors))
            .wrap(from_fn(http::observe::observe))
            .configure(|config| http::metrics_routes(config, source))
            .default_service(web::to(http::route_not_found))
    })
    .workers(1)
    .shutdown_timeout(settings.shutdown_grace.as_secs())
    .client_request_timeout(settings.client_timeout)
    .client_disconnect_timeout(Duration::from_secs(1))
    .listen(listener)?
    .run();
    Ok(server)
}

/// A bound, running-on-await orderpay: HTTP server plus background tasks.
pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    /// The server of `GET /metrics` when `ORDERPAY_METRICS_LISTEN` gives it an address of its own.
    metrics: Option<actix_web::dev::ServerHandle>,
    shutdown: watch::Sender<bool>,
    background: Vec<JoinHandle<()>>,
    grace: Duration,
}

impl Application {
    /// Prepares the database (creates it if missing, applies migrations), binds the listener and
    /// starts the background tasks. The server runs once [`Application::run_until_stopped`] is
    /// awaited.
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        let listener = TcpListener::bind(&settings.listen)
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        let database = settings.database.clone();
        let application = Self::build_on(settings, listener).await?;
        // `serve`'s advice, once the database is prepared (test apps, built on their own
        // listeners, go without it).
        db::advise_on_write_settings(&database).await;
        Ok(application)
    }

    /// [`Application::build`] on a listener bound already (`settings.listen` is then unused): its
    /// address can be handed to the payment provider as the webhook URL before the app exists.
    pub async fn build_on(settings: Settings, listener: TcpListener) -> anyhow::Result<Application> {
        db::prepare(&settings.database).await?;
        let port = listener.local_addr()?.port();
        let webhooks = !settings.api.provider_webhooks.is_off();
        let merchant_webhooks = settings.webhooks.clone().map(web::Data::new);

        let provider = provider(&settings.provider)?;
        let observability = Arc::new(Observability::new());
        let keys = Keys {
            retention: settings.api.idempotency_retention,
            replays: Arc::new(ReplayCache::new(settings.api.replay_cache_bytes)),
        };
        let accounts = Arc::new(AccountCache::new(
            settings.api.auth_cache_ttl,
            settings.api.revocation_poll * revocations::FRESH_INTERVALS,
        ));
        let rate_limiter = Arc::new(RateLimiter::new(settings.api.rate_limit));
        let api = Arc::new(settings.api.clone());
        let workers = settings.workers.max(1);
        let body_timeout = http::body::BodyTimeout(settings.client_body_timeout);
        // Bound before anything starts, so that an address in use stops `serve` at once.
        let metrics_listener = settings
            .metrics_listen
            .as_ref()
            .map(|address| {
                TcpListener::bind(address)
                    .with_context(|| format!("cannot listen on {address} (ORDERPAY_METRICS_LISTEN)"))
            })
            .transpose()?;
        let metrics_on_api = metrics_listener.is_none();
        // One pool per worker, created on that worker's thread (see db::lazy_pool).
        let pool_per_worker = (settings.database.pool_size / workers as u32).max(1);
        let server = {
            let (worker_settings, provider, observability) =
                (settings.clone(), provider.clone(), observability.clone());
            let (rate_limiter, accounts) = (rate_limiter.clone(), accounts.clone());
            let merchant_webhooks = merchant_webhooks.clone();
            HttpServer::new(move || {
                let pool = db::lazy_pool(&worker_settings.database, pool_per_worker);
                observability.register(&pool);
                let metrics_source = web::Data::new(http::health::MetricsSource {
                    observability: observability.clone(),
                    pool: pool.clone(),
                });
                let state = AppState {
                    engine: engine(&worker_settings, pool.clone(), provider.clone()),
                    pool,
                    keys: keys.clone(),
                    settings: api.clone(),
                    observability: observability.clone(),
                    accounts: accounts.clone(),
                    rate_limiter: rate_limiter.clone(),
                };
                App::new()
                    .app_data(web::Data::new(state))
                    .wrap(ErrorHandlers::new().default_handler(http::problem_for_foreign_errors))
                    .wrap(from_fn(http::echo_idempotency_key))
                    .wrap(from_fn(http::observe::observe))
                    .app_data(body_timeout)
                    .wrap(from_fn(http::body::body_deadline))
                    .configure(http::routes)
                    .configure(|config| {
                        if metrics_on_api {
                            http::metrics_routes(config, metrics_source);
                        }
                        if webhooks {
                            http::provider_webhook_routes(config);
                        }
                        if let Some(settings) = &merchant_webhooks {
                            http::webhook_endpoint_routes(config, settings.clone());
                        }
                    })
                    .default_service(web::to(http::route_not_found))
            })
            .workers(workers)
            // On SIGTERM: stop accepting, let in-flight requests finish for up to the grace period.
            .shutdown_timeout(settings.shutdown_grace.as_secs())
            // A client that does not finish sending its request head in time is answered 408 and
            // disconnected, so slow clients cannot hold connections.
            .client_request_timeout(settings.client_timeout)
            .client_disconnect_timeout(Duration::from_secs(1))
            // actix counts connections per worker.
            .max_connections(settings.max_connections.div_ceil(workers).max(1))
            .listen(listener)?
            .run()
        };

        let metrics = match metrics_listener {
            Some(listener) => {
                let server = metrics_server(&settings, listener, observability.clone())?;
                let handle = server.handle();
                tokio::spawn(server);
                Some(handle)
            }
            None => None,
        };

        let (shutdown, shutdown_signal) = watch::channel(false);
        let background_pool = db::background_pool(&settings.database, BACKGROUND_POOL_SIZE);
        observability.register(&background_pool);
        let handle = observability.metrics.clone();
        // The exporter keeps histogram data until upkeep drains it; idle rate-limit buckets are
        // forgotten on the same beat.
        let upkeep =
            background::every(Duration::from_secs(5), Duration::ZERO, shutdown_signal.clone(), move || {
                handle.run_upkeep();
                rate_limiter.prune();
                std::future::ready(false)
            });
        let settlement_provider = provider.clone();
        let reconciler_engine = engine(&settings, background_pool.clone(), provider);
        let events_sweep = crate::events::sweeper::run(
            background_pool.clone(),
            settings.event_retention,
            settings.sweeper.interval,
            settings.sweeper.batch_size,
            shutdown_signal.clone(),
        );
        let mut background = vec![tokio::spawn(events_sweep)];
        if let Some(settlement) = settings.settlement {
            // A connection of its own: a run holds it for minutes once a window, which would
            // otherwise take a share of the reconciler's and the relays' pool.
            let settlement_pool = db::lazy_pool(&settings.database, 1);
            observability.register(&settlement_pool);
            background.push(tokio::spawn(crate::settlement::job::run(
                settlement_pool,
                settlement_provider,
                settlement,
                shutdown_signal.clone(),
            )));
        }
        if let Some(nats) = &settings.nats {
            // Returns at once: the connection is made in the background, retried for ever.
            let relay =
                crate::events::nats::NatsRelay::start(nats.clone(), settings.relay.batch_size).await?;
            crate::events::relay::export_lag::<crate::events::nats::NatsRelay>(&background_pool).await;
            background.push(tokio::spawn(crate::events::relay::run(
                background_pool.clone(),
                relay,
                settings.relay.interval,
                settings.relay.batch_size,
                shutdown_signal.clone(),
            )));
        }
        if accounts.enabled() {
            // A connection of its own: a poll waiting behind a reconciler batch would make every
            // instance distrust its cache.
            let revocation_pool = db::lazy_pool(&settings.database, 1);
            observability.register(&revocation_pool);
            let poll = settings.api.revocation_poll;
            background.push(tokio::spawn(revocations::run(
                revocation_pool,
                accounts.clone(),
                poll,
                shutdown_signal.clone(),
            )));
        }
        if let Some(webhooks) = &settings.webhooks {
            crate::merchant_webhooks::service::warn_about_insecure_endpoints(&background_pool).await;
            crate::merchant_webhooks::secrets::check_at_start(&background_pool, &webhooks.encryption_keys)
                .await;
            background.extend(
                merchant_webhooks_tasks(
                    &settings,
                    webhooks,
                    background_pool.clone(),
                    &observability,
                    shutdown_signal.clone(),
                )
                .await?,
            );
        }
        let delivery_connections = if settings.webhooks.is_some() { DELIVERY_POOL_SIZE } else { 0 };
        crate::telemetry::metrics::pool_max_connections(
            pool_per_worker * workers as u32
                + BACKGROUND_POOL_SIZE
                + u32::from(accounts.enabled())
                + u32::from(settings.settlement.is_some())
                + delivery_connections
                + u32::from(metrics.is_some()),
        );
        background.extend([
            tokio::spawn(sweeper::run(background_pool, settings.sweeper, shutdown_signal.clone())),
            tokio::spawn(reconciler::run(reconciler_engine, settings.reconciler, shutdown_signal)),
            tokio::spawn(upkeep),
        ]);
        tracing::info!(
            port,
            workers,
            provider_webhooks = webhooks,
            merchant_webhooks = settings.webhooks.is_some(),
            nats = settings.nats.is_some(),
            metrics = settings.metrics_listen.as_deref().unwrap_or("on the API's address"),
            "orderpay listening on {}",
            settings.listen
        );
        Ok(Application { port, server, metrics, shutdown, background, grace: settings.shutdown_grace })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from outside (tests, signal handlers other than actix's own).
    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until the server stops (SIGTERM drains in-flight requests; or its handle), then
    /// stops the background tasks between their rounds, waiting for them up to the grace period.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let served = self.server.await;
        if let Some(metrics) = self.metrics {
            metrics.stop(true).await;
        }
        tracing::info!("HTTP server stopped; stopping background tasks");
        let _ = self.shutdown.send(true);
        let background = async {
            for task in self.background {
                let _ = task.await;
            }
        };
        if tokio::time::timeout(self.grace, background).await.is_err() {
            tracing::warn!("background tasks did not stop within the grace period");
        }
        served.context("HTTP server failed")
    }
}
