//! Builds the actix application and its shared state, starts the background tasks, and runs the
//! whole until the server stops. `main` and the integration tests build it the same way.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::middleware::{ErrorHandlers, from_fn};
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{ApiSettings, Settings};
use crate::db::{self, Pool};
use crate::http;
use crate::idempotency::sweeper;
use crate::payments::service::PaymentContext;
use crate::provider::PaymentProvider;
use crate::provider::client::HttpProvider;
use crate::reconciliation;

/// Per-worker state handed to every handler.
pub struct AppState {
    pub pool: Pool,
    pub settings: Arc<ApiSettings>,
    /// The same pool, with the provider: what payment use cases need.
    pub payments: PaymentContext,
}

/// A bound, running-on-await orderpay: HTTP server plus background tasks.
pub struct Application {
    port: u16,
    server: actix_web::dev::Server,
    shutdown: watch::Sender<bool>,
    background: Vec<JoinHandle<()>>,
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
        let workers = settings.workers.max(1);
        // One pool per worker, created on that worker's thread (see db::lazy_pool).
        let pool_per_worker = (database.pool_size / workers as u32).max(1);
        let server = HttpServer::new(move || {
            let pool = db::lazy_pool(&database, pool_per_worker);
            let payments = PaymentContext {
                pool: pool.clone(),
                provider: worker_provider.clone(),
                settings: payment_settings,
            };
            let state = AppState { pool, settings: api.clone(), payments };
            App::new()
                .app_data(web::Data::new(state))
                .wrap(ErrorHandlers::new().default_handler(http::problem_for_foreign_errors))
                .wrap(from_fn(http::echo_idempotency_key))
                .configure(http::routes)
                .default_service(web::to(http::route_not_found))
        })
        .workers(workers)
        .listen(listener)?
        .run();

        let (shutdown, shutdown_signal) = watch::channel(false);
        let background_pool = db::lazy_pool(&settings.database, 2);
        let reconciler_context =
            PaymentContext { pool: background_pool.clone(), provider, settings: settings.payments };
        let background = vec![
            tokio::spawn(sweeper::run(background_pool, settings.sweeper, shutdown_signal.clone())),
            tokio::spawn(reconciliation::run(reconciler_context, settings.reconciler, shutdown_signal)),
        ];
        tracing::info!(port, workers, "orderpay listening on {}", settings.listen);
        Ok(Application { port, server, shutdown, background })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from outside (tests, signal handlers other than actix's own).
    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until the server stops (SIGINT/SIGTERM, or its handle), then stops the background
    /// tasks between their rounds.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let served = self.server.await;
        let _ = self.shutdown.send(true);
        for task in self.background {
            let _ = task.await;
        }
        served.context("HTTP server failed")
    }
}
