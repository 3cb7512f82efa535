//! Building and running the service: `Application::build` binds and connects,
//! `run_until_stopped` serves until the shutdown token fires (zero2prod's shape, so tests run
//! exactly what production runs).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::producer::BaseProducer;
use rdkafka::ClientConfig;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Signer;
use crate::booking::consumer;
use crate::booking::producer::{ensure_topic, BookingProducer};
use crate::config::Config;
use crate::http::ops::Readiness;
use crate::http::{self, AppState};
use crate::queue::{admission, Queue};
use crate::redis::{self as wredis, keys::Keys};
use crate::seats::Sales;

/// A built, not yet running, service.
pub struct Application {
    listener: TcpListener,
    state: AppState,
    config: Config,
    instance: String,
}

impl Application {
    /// Binds the listener and connects to Redis (PostgreSQL and Kafka connect lazily: the
    /// waiting line must keep working while they are down).
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let (admin_token, token_secret) = config.secrets()?;
        if config.auth.admin_token.is_none() {
            tracing::warn!(admin_token = %admin_token, "no WAITROOM_ADMIN_TOKEN set: using the development admin token");
        }
        crate::telemetry::metrics_handle();
        let sales = connect_sales(&config, &token_secret).await?;
        let (queue, db) = (sales.queue.clone(), sales.db.clone());
        let kafka: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &config.kafka.brokers)
            .set("socket.timeout.ms", "2000")
            .create()
            .context("creating the Kafka client")?;
        let listener = TcpListener::bind(config.http.addr)
            .await
            .with_context(|| format!("binding {}", config.http.addr))?;
        let instance = config
            .instance_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
        let state = AppState {
            queue,
            sales,
            admin_token: admin_token.into(),
            limiter: AppState::client_limiter(
                config.http.client_rate_per_second,
                config.http.client_burst,
            ),
            readiness: Arc::new(Readiness {
                db,
                kafka: Arc::new(kafka),
            }),
        };
        Ok(Application {
            listener,
            state,
            config,
            instance,
        })
    }

    /// The bound port (useful with port 0).
    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// This instance's id in admission leases.
    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// Serves until `shutdown` is cancelled: stops admitting, drains requests (bounded), exits.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let scheduler = (!self.config.admission.no_admission).then(|| {
            tokio::spawn(admission::run(
                self.state.queue.clone(),
                Some(self.state.sales.clone()),
                self.config.admission.clone(),
                self.instance.clone(),
                shutdown.clone(),
            ))
        });
        if let Some(limiter) = self.state.limiter.clone() {
            let token = shutdown.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(30)) => limiter.retain_recent(),
                    }
                }
            });
        }
        let ledger = (!self.config.kafka.no_ledger).then(|| {
            let (cfg, db, sales, token) = (
                self.config.kafka.clone(),
                self.state.readiness.db.clone(),
                self.state.sales.clone(),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = consumer::run(cfg, db, sales, token).await {
                    tracing::error!(error = ?e, "ledger consumer stopped");
                }
            })
        });
        tokio::spawn(migrate_when_reachable(
            self.state.readiness.db.clone(),
            shutdown.clone(),
        ));
        let drain = Duration::from_secs(self.config.http.drain_seconds);
        let app = http::router(self.state);
        let token = shutdown.clone();
        let server = axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { token.cancelled().await });
        let served = tokio::spawn(async move { server.await });
        shutdown.cancelled().await;
        if let Some(s) = scheduler {
            let _ = s.await;
        }
        if let Some(l) = ledger {
            let _ = l.await;
        }
        match tokio::time::timeout(drain, served).await {
            Ok(joined) => joined.context("HTTP server task")?.context("HTTP server")?,
            Err(_) => tracing::warn!("requests still in flight after the drain timeout; exiting"),
        }
        Ok(())
    }
}

/// Connects everything the sale needs — Redis (scripts loaded), PostgreSQL (migrated when it
/// answers), Kafka (topic created when it answers) — for `serve`, `ledger` and `reconcile`.
pub async fn connect_sales(config: &Config, token_secret: &str) -> anyhow::Result<Arc<Sales>> {
    let conn = wredis::connect(&config.redis).await?;
    let reads = wredis::connect_reads(&config.redis, &conn).await?;
    tracing::info!(
        cluster = conn.is_cluster(),
        replica_reads = config.redis.read_from_replicas,
        "connected to Redis"
    );
    let queue = Arc::new(Queue::new(
        conn,
        reads,
        Keys::new(config.redis.key_prefix.clone()),
        Signer::new(token_secret),
    ));
    queue
        .scripts
        .preload(&mut queue.conn.clone())
        .await
        .context("loading the Lua scripts")?;
    let db = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(config.db.url.expose())
        .context("parsing WAITROOM_DATABASE_URL")?;
    // Tables first when PostgreSQL answers now; otherwise the service starts anyway and a
    // background task applies them once it does.
    let migrated = tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::migrate!("./migrations").run(&db),
    )
    .await;
    if !matches!(migrated, Ok(Ok(()))) {
        tracing::warn!("database migrations not applied at start-up; retrying in the background");
    }
    match tokio::time::timeout(Duration::from_secs(10), ensure_topic(&config.kafka)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "bookings topic not created; bookings will answer 503 until Kafka works")
        }
        Err(_) => tracing::warn!(
            "Kafka did not answer at start-up; bookings will answer 503 until it does"
        ),
    }
    Ok(Arc::new(Sales {
        queue,
        db,
        producer: BookingProducer::new(&config.kafka)?,
    }))
}

/// Applies the migrations once PostgreSQL answers. The waiting line does not need the database,
/// so a database that is down at start-up delays only this, not the service.
async fn migrate_when_reachable(db: sqlx::PgPool, shutdown: CancellationToken) {
    loop {
        match sqlx::migrate!("./migrations").run(&db).await {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, "migrations not applied yet; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

/// A token cancelled on ctrl-c or SIGTERM.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("installing the SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutdown requested");
        t.cancel();
    });
    token
}
