//! The Redis Cluster client, replaced when it stops answering.
//!
//! Found 2026-12-05 with `booking_failover::the_shows_primary_killed_with_its_replica_behind_
//! loses_no_201` (3 runs of 16 alone, on an idle machine): a redis-rs cluster client (1.8.1) that
//! began a slot refresh the moment its primary was killed never finished it. From then on it
//! sent nothing to any node (the nodes' `CLIENT LIST` showed its connections idle for minutes)
//! and answered every request "timed out" after its response timeout, while the cluster had
//! long failed over and a fresh replica was in sync, and while the service's other cluster
//! clients, built the same way, worked. Its trace showed it in the `Recover` state at every
//! request until the test ended. Every booking was answered 503 for as long as the process
//! lived, because the connection that carries the `WAIT`s was that client.
//!
//! [`Watched`] holds the client and a way to build another. Every request sent through the
//! client reports how it ended ([`Watched::observe`]): once the client has answered nothing but
//! timeouts for [`STALL`] (at least [`STALL_TIMEOUTS`] of them, not one answer in between), a new
//! client is built in the background and takes its place; requests already sent finish on the
//! old one. A node that hangs does not trigger it while the client answers for the other nodes;
//! if the whole cluster is unreachable, the new client cannot connect, the old one stays, and
//! the next attempt comes after another [`STALL`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use redis::RedisResult;

use crate::sync::Guards as _;
use crate::telemetry;

/// How long a client may answer nothing but timeouts before it is replaced.
pub const STALL: Duration = Duration::from_secs(5);
/// The fewest timeouts in a row that count as a stall (a single slow request is not one).
pub const STALL_TIMEOUTS: u32 = 3;

/// Builds a new cluster client (the same configuration as the first).
pub type Build = Box<
    dyn Fn() -> Pin<Box<dyn Future<Output = anyhow::Result<ClusterConnection>> + Send>>
        + Send
        + Sync,
>;

/// A cluster client and what it takes to replace it; shared by every clone of a connection.
pub struct Watched {
    conn: RwLock<ClusterConnection>,
    build: Build,
    /// What the client is, for the log and the metric: `primaries`, `replica_reads` or `waits`.
    role: &'static str,
    epoch: Instant,
    /// When the client last answered (anything but a timeout), in ms since `epoch`.
    answered_at: AtomicU64,
    /// Timeouts since that answer.
    timeouts: AtomicU32,
    replacing: AtomicBool,
}

impl Watched {
    pub fn new(conn: ClusterConnection, role: &'static str, build: Build) -> Arc<Self> {
        // Registered at 0 (not reset: a second connection of one process keeps the count).
        metrics::counter!(telemetry::REDIS_CLIENT_REPLACED, "client" => role).increment(0);
        Arc::new(Watched {
            conn: RwLock::new(conn),
            build,
            role,
            epoch: Instant::now(),
            answered_at: AtomicU64::new(0),
            timeouts: AtomicU32::new(0),
            replacing: AtomicBool::new(false),
        })
    }

    /// The client in use (a cheap clone of a handle).
    pub fn current(&self) -> ClusterConnection {
        self.conn.read_guard().clone()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Records how a request sent through the client ended; starts a replacement when the
    /// client has stalled (see the module's documentation).
    pub fn observe<T>(self: &Arc<Self>, result: &RedisResult<T>) {
        let timed_out = matches!(result, Err(e) if e.is_timeout());
        if !timed_out {
            // Written only when it changes by more than a few ms: every request through the
            // client passes here, and a store to a shared line on each would bounce it.
            let now = self.now_ms();
            if now > self.answered_at.load(Ordering::Relaxed) + 10 {
                self.answered_at.store(now, Ordering::Relaxed);
            }
            if self.timeouts.load(Ordering::Relaxed) != 0 {
                self.timeouts.store(0, Ordering::Relaxed);
            }
            return;
        }
        let timeouts = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        let silent_ms = self
            .now_ms()
            .saturating_sub(self.answered_at.load(Ordering::Relaxed));
        if timeouts < STALL_TIMEOUTS || silent_ms < STALL.as_millis() as u64 {
            return;
        }
        // Outside a runtime (a request dropped as the process ends) nothing is started.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        runtime.spawn(async move {
            this.replace(silent_ms).await;
            this.replacing.store(false, Ordering::Release);
        });
    }

    async fn replace(&self, silent_ms: u64) {
        tracing::warn!(
            client = self.role,
            silent_ms,
            timeouts = self.timeouts.load(Ordering::Relaxed),
            "redis: the cluster client has answered nothing but timeouts; building a new one"
        );
        match (self.build)().await {
            Ok(conn) => {
                *self.conn.write_guard() = conn;
                metrics::counter!(telemetry::REDIS_CLIENT_REPLACED, "client" => self.role)
                    .increment(1);
                tracing::warn!(client = self.role, "redis: cluster client replaced");
            }
            Err(e) => {
                tracing::warn!(client = self.role, error = %format!("{e:#}"), "redis: could not build a new cluster client; keeping the old one");
            }
        }
        // Either way the next attempt waits for another whole stall.
        self.answered_at.store(self.now_ms(), Ordering::Relaxed);
        self.timeouts.store(0, Ordering::Relaxed);
    }

    /// Runs `request` on the current client and observes how it ended. A request dropped
    /// before it ended (the caller's own deadline passed first) counts as a timeout.
    pub async fn run<T, F>(
        self: &Arc<Self>,
        request: impl FnOnce(ClusterConnection) -> F,
    ) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let mut unfinished = Unfinished(Some(self));
        let result = request(self.current()).await;
        unfinished.0 = None;
        self.observe(&result);
        result
    }
}

/// Counts a request as timed out if it is dropped before it ends.
struct Unfinished<'a>(Option<&'a Arc<Watched>>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(watched) = self.0 {
            watched.observe::<()>(&Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            ))));
        }
    }
}
