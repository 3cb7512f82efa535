//! Building and running the service: `Application::build` binds and connects,
//! `run_until_stopped` serves until the shutdown token fires (zero2prod's shape, so tests run
//! exactly what production runs).
//!
//! Start-up binds the listener first, then connects to Redis (bounded); the database schema and
//! the bookings topic are prepared in the background by [`prepare_backends`], the one place
//! migrations run, so a slow or broken PostgreSQL or Kafka delays only `/readyz`, never
//! `/healthz` or the waiting line. Shutdown has one bound over everything that drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use backon::{ExponentialBuilder, Retryable as _};
use rdkafka::producer::BaseProducer;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Signer;
use crate::booking::producer::{ensure_topic, BookingProducer};
use crate::booking::service::Durability;
use crate::booking::{consumer, Bookings};
use crate::config::{Config, KafkaConfig};
use crate::http::limits::ClientLimits;
use crate::http::ops::Readiness;
use crate::http::server::{self, ConnLimits};
use crate::http::{self, AppState, AppStateParts};
use crate::queue::admission::{self, Housekeeping};
use crate::queue::Queue;
use crate::redis::memory::MemoryGuard;
use crate::redis::Store;
use crate::seats::Seats;

/// Retries of a back end's preparation at start-up: from 200 ms, doubling to 5 s, until it
/// works or the service stops.
const RETRY_PREPARE: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(200))
    .with_max_delay(Duration::from_secs(5))
    .with_jitter()
    .without_max_times();

/// The domain services, wired once: the waiting room, seats and bookings over one Redis store
/// and one database pool.
pub struct Services {
    /// The waiting room.
    pub queue: Arc<Queue>,
    /// Shows, seat maps and holds.
    pub seats: Arc<Seats>,
    /// Bookings and the ledger's side of them.
    pub bookings: Arc<Bookings>,
}

impl Services {
    /// Connects to Redis (scripts loaded) and makes the PostgreSQL pool (lazy: it connects on
    /// first use) and the Kafka producer, for `serve`, `ledger` and `reconcile`.
    pub async fn connect(config: &Config, token_secret: &str) -> anyhow::Result<Self> {
        let store = Store::connect(&config.redis).await?;
        let replicas = config
            .redis
            .booking_replicas
            .unwrap_or(u32::from(store.conn().is_cluster()));
        let wait = Duration::from_millis(config.redis.booking_wait_ms);
        let queue = Arc::new(
            Queue::new(store.clone(), Signer::new(token_secret))
                .with_score_cache(config.redis.score_cache_entries)
                .with_number_durability(replicas, wait)
                .with_numbered_snapshot(Duration::from_millis(config.redis.numbered_snapshot_ms))
                .with_memory_guard(Arc::new(MemoryGuard::new(
                    config.redis.enter_memory_percent,
                ))),
        );
        let db = PgPoolOptions::new()
            .max_connections(config.db.connections)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(config.db.url.expose())
            .context("parsing WAITROOM_DATABASE_URL")?;
        let seats = Arc::new(Seats::new(
            store.clone(),
            queue.clone(),
            db.clone(),
            Duration::from_millis(config.http.seat_map_max_age_ms),
        ));
        let durability = Durability { replicas, wait };
        let bookings = Arc::new(Bookings::new(
            store,
            queue.clone(),
            seats.clone(),
            db,
            BookingProducer::new(&config.kafka)?,
            durability,
        ));
        Ok(Services {
            queue,
            seats,
            bookings,
        })
    }

    /// The ledger's database pool.
    pub fn db(&self) -> &PgPool {
        self.bookings.db()
    }
}

/// A built, not yet running, service.
pub struct Application {
    listener: TcpListener,
    state: AppState,
    config: Config,
    instance: String,
}

impl Application {
    /// Binds the listener and connects to Redis. PostgreSQL and Kafka are prepared in the
    /// background once running: the waiting line must keep working while they are down.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let (admin_token, token_secret) = config.secrets()?;
        crate::telemetry::metrics_handle();
        let listener = TcpListener::bind(config.http.addr)
            .await
            .with_context(|| format!("binding {}", config.http.addr))?;
        let services = Services::connect(&config, &token_secret).await?;
        let kafka: BaseProducer = config
            .kafka
            .client()
            .set("socket.timeout.ms", "2000")
            .create()
            .context("creating the Kafka client")?;
        let instance = config
            .instance_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
        let state = AppState::new(AppStateParts {
            readiness: Arc::new(Readiness::new(
                services.queue.store().conn(),
                services.db().clone(),
                Arc::new(kafka),
            )),
            queue: services.queue,
            seats: services.seats,
            bookings: services.bookings,
            admin_token: admin_token.into(),
            limits: Arc::new(
                ClientLimits::new(&config.http)
                    .map_err(|e| anyhow::anyhow!("WAITROOM_TRUSTED_PROXIES: {e}"))?,
            ),
            request_metrics: Default::default(),
        });
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

    /// Serves until `shutdown` is cancelled: stops admitting, drains requests, exits — all of
    /// it within one bound (`WAITROOM_DRAIN_SECONDS`).
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut background = Vec::new();
        background.push(tokio::spawn(prepare_backends(
            self.state.bookings.db().clone(),
            self.config.kafka.clone(),
            self.state.readiness.clone(),
            shutdown.clone(),
        )));
        background.push(tokio::spawn(crate::redis::nodes::watch(
            self.state.queue.store().conn(),
            self.config.redis.clone(),
            shutdown.clone(),
        )));
        background.push(tokio::spawn(crate::redis::memory::watch(
            self.state.queue.memory_guard().clone(),
            self.state.queue.store().conn(),
            self.config.redis.clone(),
            shutdown.clone(),
        )));
        if !self.config.admission.no_admission {
            let housekeeping: Arc<dyn Housekeeping> = self.state.bookings.clone();
            background.push(tokio::spawn(admission::run(
                self.state.queue.clone(),
                Some(housekeeping),
                self.config.admission.clone(),
                self.instance.clone(),
                shutdown.clone(),
            )));
        }
        {
            let (limits, token) = (self.state.limits.clone(), shutdown.clone());
            background.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(10)) => limits.retain_recent(),
                    }
                }
            }));
        }
        if !self.config.kafka.no_ledger {
            let ledger = consumer::Ledger::new(&self.config, self.state.bookings.clone())?;
            let (ready, token) = (self.state.readiness.clone(), shutdown.clone());
            background.push(tokio::spawn(async move {
                // The ledger writes to the schema and reads the topic: wait until both exist.
                if !ready.wait_for_ledger(&token).await {
                    return;
                }
                if let Err(e) = ledger.run(token).await {
                    tracing::error!(error = ?e, "ledger consumer stopped");
                }
            }));
        }
        let read_timeout = Duration::from_secs(self.config.http.read_timeout_seconds);
        let app = http::router(
            self.state,
            Duration::from_secs(self.config.http.request_timeout_seconds),
            read_timeout,
        );
        let limits = ConnLimits {
            max_connections: self.config.http.max_connections,
            header_read_timeout: read_timeout,
        };
        let served = tokio::spawn(server::serve(self.listener, app, limits, shutdown.clone()));
        shutdown.cancelled().await;
        let drain = Duration::from_secs(self.config.http.drain_seconds);
        let everything = async {
            for task in background {
                let _ = task.await;
            }
            served.await
        };
        match tokio::time::timeout(drain, everything).await {
            Ok(joined) => joined.context("HTTP server task")?,
            Err(_) => tracing::warn!(
                drain_seconds = drain.as_secs(),
                "still draining after the drain timeout; exiting"
            ),
        }
        Ok(())
    }
}

/// Applies the database migrations: the one place they run (`waitroom migrate`, and
/// [`prepare_backends`] at start-up).
pub async fn migrate(db: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    sqlx::migrate!("./migrations").run(db).await
}

/// Prepares PostgreSQL (migrations) and Kafka (the bookings topic) in the background, each
/// retried with backoff until it works, and marks each ready for `/readyz` and the ledger.
pub async fn prepare_backends(
    db: PgPool,
    kafka: KafkaConfig,
    ready: Arc<Readiness>,
    shutdown: CancellationToken,
) {
    let schema = async {
        let done = (|| migrate(&db))
            .retry(RETRY_PREPARE)
            .notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "migrations not applied yet"))
            .await;
        if done.is_ok() {
            ready.mark_schema_ready();
        }
    };
    let topic = async {
        let done = (|| ensure_topic(&kafka))
            .retry(RETRY_PREPARE)
            .notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "bookings topic not created yet; bookings answer 503 until Kafka works"))
            .await;
        if done.is_ok() {
            ready.mark_topic_ready();
        }
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = async { tokio::join!(schema, topic) } => {}
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
