//! Builds the actix application and its shared state, starts the background tasks, and runs the
//! whole until the server stops. `main` and the integration tests build it the same way.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::middleware::{ErrorHandlers, from_fn};
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::accounts::AccountCache;
use crate::background;
use crate::config::{ApiSettings, Settings};
use crate::db::{self, Pool};
use crate::http;
use crate::idempotency::cache::ReplayCache;
use crate::idempotency::sweeper;
use crate::payments::service::PaymentContext;
use crate::provider::PaymentProvider;
use crate::provider::client::HttpProvider;
use crate::rate_limit::RateLimiter;
use crate::reconciliation;
use crate::telemetry::metrics;

/// Per-worker state handed to every handler.
pub struct AppState {
    pub pool: Pool,
    pub settings: Arc<ApiSettings>,
    /// The same pool, with the provider: what payment use cases need.
    pub payments: PaymentContext,
    pub observability: Arc<Observability>,
    pub accounts: Arc<AccountCache>,
    /// Completed idempotent answers, for replays without a database round trip.
    pub replays: Arc<ReplayCache>,
    pub rate_limiter: Arc<RateLimiter>,
}

/// What `GET /metrics` reads: the recorder's handle and every pool of the process.
pub struct Observability {
    pub metrics: PrometheusHandle,
    pools: Mutex<Vec<Pool>>,
}

impl Observability {
    fn register(&self, pool: &Pool) {
        self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(pool.clone());
    }

    /// Connections in use and idle, over every pool.
    pub fn pool_connections(&self) -> (u32, u32) {
        let pools = self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        pools.iter().map(|pool| pool.state()).fold((0, 0), |(in_use, idle), state| {
            (in_use + state.connections - state.idle_connections, idle + state.idle_connections)
        })
    }
}

/// A bound, running-on-await orderpay: HTTP server plus background tasks.
pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    shutdown: watch::Sender<bool>,
    background: Vec<JoinHandle<()>>,
    grace: Duration,
}

impl Application {
    /// Prepares the database (creates it if missing, applies migrations), binds the listener and
    /// starts the background tasks. The server runs once [`Application::run_until_stopped`] is
    /// awaited.
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        db::prepare(&settings.database.url).await?;
        let listener = TcpListener::bind(&settings.listen)
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        let port = listener.local_addr()?.port();

        let provider: Arc<dyn PaymentProvider> =
            Arc::new(HttpProvider::new(&settings.provider.url, settings.provider.timeout)?);
        let database = settings.database.clone();
        let api = Arc::new(settings.api.clone());
        let payment_settings = settings.payments;
        let worker_provider = provider.clone();
        let observability = Arc::new(Observability { metrics: metrics::install(), pools: Mutex::default() });
        let worker_observability = observability.clone();
        let accounts = Arc::new(AccountCache::new(settings.api.auth_cache_ttl));
        let replays = Arc::new(ReplayCache::new(settings.api.replay_cache_entries));
        let rate_limiter = Arc::new(RateLimiter::new(settings.api.rate_limit));
        let workers = settings.workers.max(1);
        let body_timeout = http::body::BodyTimeout(settings.client_body_timeout);
        // One pool per worker, created on that worker's thread (see db::lazy_pool).
        let pool_per_worker = (database.pool_size / workers as u32).max(1);
        let server = HttpServer::new(move || {
            let pool = db::lazy_pool(&database, pool_per_worker);
            worker_observability.register(&pool);
            let payments = PaymentContext {
                pool: pool.clone(),
                provider: worker_provider.clone(),
                settings: payment_settings,
                replays: replays.clone(),
            };
            let observability = worker_observability.clone();
            let (accounts, replays, rate_limiter) = (accounts.clone(), replays.clone(), rate_limiter.clone());
            let state = AppState {
                pool,
                settings: api.clone(),
                payments,
                observability,
                accounts,
                replays,
                rate_limiter,
            };
            App::new()
                .app_data(web::Data::new(state))
                .wrap(ErrorHandlers::new().default_handler(http::problem_for_foreign_errors))
                .wrap(from_fn(http::echo_idempotency_key))
                .wrap(from_fn(http::observe::observe))
                .app_data(body_timeout)
                .wrap(from_fn(http::body::body_deadline))
                .configure(http::routes)
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
        .run();

        let (shutdown, shutdown_signal) = watch::channel(false);
        let background_pool = db::lazy_pool(&settings.database, 4);
        observability.register(&background_pool);
        let reconciler_context = PaymentContext {
            pool: background_pool.clone(),
            provider,
            settings: settings.payments,
            replays: Arc::new(ReplayCache::new(0)),
        };
        let handle = observability.metrics.clone();
        // The exporter keeps histogram data until upkeep drains it.
        let upkeep =
            background::every(Duration::from_secs(5), Duration::ZERO, shutdown_signal.clone(), move || {
                handle.run_upkeep();
                std::future::ready(false)
            });
        let background = vec![
            tokio::spawn(sweeper::run(background_pool, settings.sweeper, shutdown_signal.clone())),
            tokio::spawn(reconciliation::run(reconciler_context, settings.reconciler, shutdown_signal)),
            tokio::spawn(upkeep),
        ];
        tracing::info!(port, workers, "orderpay listening on {}", settings.listen);
        Ok(Application { port, server, shutdown, background, grace: settings.shutdown_grace })
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
