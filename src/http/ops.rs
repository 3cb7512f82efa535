//! Operations endpoints: `/metrics`, `/healthz` (the process is up), `/readyz` (every back end
//! answers: Redis Cluster, Kafka, PostgreSQL).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use rdkafka::producer::{BaseProducer, Producer as _};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use super::openapi::Limited;
use super::AppState;
use crate::redis::RedisConn;

/// How long each readiness probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a readiness answer is reused: a flood of `/readyz` costs the back ends one probe
/// per second per instance.
const READY_CACHE: Duration = Duration::from_secs(1);

/// The last readiness answer: when, whether ready, and the per-check body.
type ReadyReport = (Instant, bool, serde_json::Value);

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/metrics", get(get_metrics))
        .route("/healthz", get(get_health))
        .route("/readyz", get(get_ready))
        .route("/openapi.json", get(super::openapi::get_openapi))
}

/// The back ends `/readyz` checks, and what start-up has prepared of them.
pub struct Readiness {
    redis: RedisConn,
    db: PgPool,
    /// A Kafka client used only for metadata requests.
    kafka: Arc<BaseProducer>,
    schema: AtomicBool,
    topic: AtomicBool,
    /// Told when the schema or the topic becomes ready.
    prepared: Notify,
    /// The last answer (one probe at a time; others wait for it and share it).
    last: Mutex<Option<ReadyReport>>,
}

impl Readiness {
    /// Checks of these back ends; nothing prepared yet.
    pub fn new(redis: RedisConn, db: PgPool, kafka: Arc<BaseProducer>) -> Self {
        Readiness {
            redis,
            db,
            kafka,
            schema: AtomicBool::new(false),
            topic: AtomicBool::new(false),
            prepared: Notify::new(),
            last: Mutex::new(None),
        }
    }

    /// The migrations have been applied.
    pub fn mark_schema_ready(&self) {
        self.schema.store(true, Ordering::Release);
        self.prepared.notify_waiters();
    }

    /// The bookings topic exists.
    pub fn mark_topic_ready(&self) {
        self.topic.store(true, Ordering::Release);
        self.prepared.notify_waiters();
    }

    /// Waits until what the ledger needs is there: the migrations applied (it writes to the
    /// schema) and the bookings topic created (a consumer subscribed to a topic that does not
    /// exist yet learns of it only at its next metadata refresh, see
    /// [`crate::booking::consumer`]). False when `shutdown` came first.
    pub async fn wait_for_ledger(&self, shutdown: &CancellationToken) -> bool {
        loop {
            let notified = self.prepared.notified();
            if self.schema.load(Ordering::Acquire) && self.topic.load(Ordering::Acquire) {
                return true;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = notified => {}
            }
        }
    }
}

/// Prometheus metrics of this instance.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String), Limited)
)]
pub(crate) async fn get_metrics() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::telemetry::metrics_handle().render(),
    )
}

/// The process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "up", body = Object), Limited)
)]
pub(crate) async fn get_health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Every back end answers (probed at most once a second per instance).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses((status = 200, description = "ready", body = Object), Limited)
)]
pub(crate) async fn get_ready(State(state): State<AppState>) -> impl IntoResponse {
    let mut last = state.readiness.last.lock().await;
    let (ok, body) = match &*last {
        Some((at, ok, body)) if at.elapsed() < READY_CACHE => (*ok, body.clone()),
        _ => {
            let (ok, body) = probe_all(&state.readiness).await;
            *last = Some((Instant::now(), ok, body.clone()));
            (ok, body)
        }
    };
    drop(last);
    ready_answer(ok, body)
}

/// Probes every back end at once.
async fn probe_all(ready: &Readiness) -> (bool, serde_json::Value) {
    let (redis, db, kafka) = tokio::join!(
        probe_redis(ready.redis.clone()),
        async {
            probe_db(&ready.db).await?;
            prepared(&ready.schema, "migrations not applied yet")
        },
        async {
            probe_kafka(ready.kafka.clone()).await?;
            prepared(&ready.topic, "bookings topic not created yet")
        },
    );
    let ok = redis.is_ok() && db.is_ok() && kafka.is_ok();
    // The body says which part failed; the details go to the log, not to the client.
    let show = |name: &str, r: &Result<(), String>| match r {
        Ok(()) => json!("ok"),
        Err(e) => {
            tracing::warn!(check = name, error = %e, "readiness check failed");
            json!("failed")
        }
    };
    let body = json!({"redis": show("redis", &redis), "postgres": show("postgres", &db), "kafka": show("kafka", &kafka)});
    (ok, body)
}

fn ready_answer(ok: bool, body: serde_json::Value) -> axum::response::Response {
    if ok {
        (
            StatusCode::OK,
            Json(json!({"status": "ready", "checks": body})),
        )
            .into_response()
    } else {
        let mut resp = (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "unavailable", "message": "a back end is not reachable", "checks": body})),
        )
            .into_response();
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            super::error::RETRY_AFTER_UNAVAILABLE.into(),
        );
        resp
    }
}

fn prepared(flag: &AtomicBool, missing: &str) -> Result<(), String> {
    if flag.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(missing.to_owned())
    }
}

async fn probe_redis(mut conn: RedisConn) -> Result<(), String> {
    let probe = async {
        if conn.is_cluster() {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if !info.contains("cluster_state:ok") {
                return Err("cluster_state is not ok".to_owned());
            }
            Ok(())
        } else {
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .map_err(|_| "timed out".to_owned())?
}

async fn probe_db(db: &PgPool) -> Result<(), String> {
    let probe = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(db);
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

async fn probe_kafka(kafka: Arc<BaseProducer>) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        kafka
            .client()
            .fetch_metadata(None, PROBE_TIMEOUT)
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}
