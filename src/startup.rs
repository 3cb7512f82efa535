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
use crate::config::Config;
use crate::http::ops::Readiness;
use crate::http::{self, AppState};
use crate::queue::{admission, Queue};
use crate::redis::{self as wredis, keys::Keys};

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
            Signer::new(&token_secret),
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
        match tokio::time::timeout(drain, served).await {
            Ok(joined) => joined.context("HTTP server task")?.context("HTTP server")?,
            Err(_) => tracing::warn!("requests still in flight after the drain timeout; exiting"),
        }
        Ok(())
    }
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
