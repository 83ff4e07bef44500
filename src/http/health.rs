//! Liveness, readiness and the published API description.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde_json::json;

use chrono::Utc;

use super::AppState;
use crate::db;
use crate::error::ApiError;
use crate::operations::leases::{self, Table};
use crate::telemetry::metrics;

/// The OpenAPI document, compiled in so the binary always serves the spec it implements.
pub const OPENAPI_YAML: &str = include_str!("../../openapi.yaml");

/// `GET /healthz`: the process is up and serving.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// `GET /readyz`: a writable primary answers; 503 otherwise (the database unreachable, or only a
/// standby or read-only server reachable, as during a failover), so that a load balancer stops
/// sending traffic until writes can succeed again.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let check = async {
        let mut conn = state.pool.get().await?;
        if !db::is_writable(&mut conn).await? {
            // Useless for requests: dropped, so that the pool finds the primary for the next one.
            db::discard(&mut conn);
            return Err(ApiError::Unavailable(anyhow::anyhow!("the database is read-only (a standby)")));
        }
        Ok::<_, ApiError>(())
    };
    match tokio::time::timeout(Duration::from_secs(2), check).await {
        Ok(Ok(())) => Ok(HttpResponse::Ok().json(json!({ "status": "ready" }))),
        Ok(Err(ApiError::Internal(cause) | ApiError::Unavailable(cause))) => {
            Err(ApiError::Unavailable(cause))
        }
        Ok(Err(other)) => Err(other),
        Err(_elapsed) => Err(ApiError::Unavailable(anyhow::anyhow!("database check timed out"))),
    }
}

/// What `GET /metrics` reads, wherever it is served (the API's address, or
/// `ORDERPAY_METRICS_LISTEN`'s): the recorder, every pool, and a pool to count operations
/// waiting.
pub struct MetricsSource {
    pub observability: std::sync::Arc<crate::telemetry::Observability>,
    pub pool: db::Pool,
}

/// `GET /metrics`: Prometheus text format. The gauges that need the database are read here; if
/// it is away they keep their last value and the scrape still succeeds.
pub async fn metrics(state: web::Data<MetricsSource>) -> HttpResponse {
    let observability = &state.observability;
    let (in_use, idle) = observability.pool_connections();
    metrics::pool_connections(in_use, idle);
    let waiting = async {
        let mut conn = state.pool.get().await.ok()?;
        let mut counts = Vec::new();
        for &table in Table::ALL {
            counts.push((table, leases::count_waiting(&mut conn, table, Utc::now()).await.ok()?));
        }
        let unrefunded = crate::payments::inspect::count_late_charges_unrefunded(&mut conn).await.ok()?;
        let exceptions = crate::settlement::repository::count_open_exceptions(&mut conn).await.ok()?;
        let soon = Utc::now() + chrono::Duration::days(1);
        let due_soon = crate::disputes::repository::count_due_before(&mut conn, soon).await.ok()?;
        Some((counts, unrefunded, exceptions, due_soon))
    };
    if let Ok(Some((counts, unrefunded, exceptions, due_soon))) =
        tokio::time::timeout(Duration::from_secs(1), waiting).await
    {
        for (table, count) in counts {
            metrics::operations_waiting(table.label(), count);
        }
        metrics::late_charges_unrefunded(unrefunded);
        metrics::disputes_evidence_due_soon(due_soon);
        metrics::settlement_exceptions(&exceptions);
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(observability.metrics.render())
}

/// `GET /openapi.yaml`
pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok().content_type("application/yaml").body(OPENAPI_YAML)
}
