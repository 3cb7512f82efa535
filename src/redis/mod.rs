//! The Redis client: one Redis Cluster, or one non-cluster Redis, behind one type.
//!
//! [`RedisConn`] is a cheap clone of a multiplexed connection: concurrent requests from many
//! handlers share one socket per node and are pipelined on the wire. All timeouts are explicit —
//! redis-rs retries for minutes by default, and a waiting room must answer 503 within a second
//! or two instead (shared/INFRA.md, "redis crate notes").
//!
//! The same code runs on both deployments: keys carry hash tags in both, so moving from one
//! Redis to a cluster changes no script.

pub mod batch;
pub mod keys;
pub mod memory;
pub mod nodes;
pub mod replies;
pub mod scripts;
pub mod store;
pub mod watched;

pub use store::Store;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RandomReplicaStrategy;
use redis::io::tcp::TcpSettings;
use redis::{
    Cmd, IntoConnectionInfo as _, Pipeline, RedisError, RedisFuture, TlsCertificates, Value,
};

use crate::config::{RedisConfig, RedisMode};

/// A connection to either deployment; clone it freely.
#[derive(Clone)]
pub enum RedisConn {
    /// A Redis Cluster (slots, MOVED handling, failover), with the service's own slot map
    /// (grouped reads, and direct connections to the primaries when configured: [`batch`]).
    Cluster(Arc<watched::Watched>, Arc<batch::NodeGroups>),
    /// One non-cluster Redis, reconnecting by itself.
    Single(ConnectionManager),
}

/// The longest one command (or pipeline) may take, client retries and topology refreshes
/// included, in ms; 0 = no bound. Set from the configuration when connecting
/// ([`command_deadline`]). Without it a node that hangs (a frozen process, a network that drops
/// packets) held requests until it came back: measured, a poll waited out a whole 5 s freeze.
static DEADLINE_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The bound for one command: two response timeouts and half a second for the retry in between.
pub fn command_deadline(cfg: &RedisConfig) -> Duration {
    Duration::from_millis(cfg.response_timeout_ms * 2 + 500)
}

fn bounded<'a, T: Send + 'a>(fut: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
    let ms = DEADLINE_MS.load(std::sync::atomic::Ordering::Relaxed);
    if ms == 0 {
        return fut;
    }
    Box::pin(async move {
        match tokio::time::timeout(Duration::from_millis(ms), fut).await {
            Ok(r) => r,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer from Redis within {ms} ms"),
            ))),
        }
    })
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        bounded(match self {
            RedisConn::Cluster(c, g) => batch::cluster_command(c, g, cmd),
            RedisConn::Single(c) => c.req_packed_command(cmd),
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        bounded(match self {
            RedisConn::Cluster(c, g) => batch::cluster_pipeline(c, g, cmd, offset, count),
            RedisConn::Single(c) => c.req_packed_commands(cmd, offset, count),
        })
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Cluster(c, _) => c.current().get_db(),
            RedisConn::Single(c) => c.get_db(),
        }
    }
}

impl RedisConn {
    /// Makes sure every write the primary serving `probe`'s slot took so far has reached
    /// `replicas` of its replicas, waiting at most `timeout_ms`; returns how many acknowledged.
    ///
    /// `WAIT` counts the writes of the connection it is sent on, and blocks that connection
    /// meanwhile. So it runs on a connection of its own (`Store::waits`, so a slow replica does
    /// not hold up other requests to the node) after a write of its own to `probe`: a primary's
    /// replication stream is ordered, so once that write is acknowledged, every earlier write of
    /// any connection (a booking's sold mark included) is too.
    ///
    /// The probe write, a read of `check` (a hash field) and the `WAIT` go to one node as one
    /// pipeline, and the read's value comes back with the count: the caller checks that what it
    /// wrote earlier is on the node that acknowledged. Sent separately, a `WAIT` that the client
    /// retried on another node after a failover (a new connection, nothing written on it) answered
    /// at once with that node's replicas, for a mark the dead node took with it.
    ///
    /// The pipeline goes straight to the primary of `probe`'s slot when the connection's map
    /// knows it (direct connections, [`batch`]), else, or after a redirect or a broken
    /// connection, whole through the cluster client to that slot's primary. Without the
    /// cluster client's two extra hops each way, a numbered line's enters, whose batches wait on
    /// this round trip, ran 12–18 % faster (docs/benchmarks.md, "`WAIT` on direct
    /// connections").
    pub async fn wait_replicated(
        &mut self,
        probe: &str,
        check: (&str, &str),
        replicas: u32,
        timeout_ms: u64,
    ) -> redis::RedisResult<(Option<String>, u32)> {
        let mut read = redis::cmd("HGET");
        read.arg(check.0).arg(check.1);
        self.wait_replicated_reading(probe, read, replicas, timeout_ms)
            .await
    }

    /// [`RedisConn::wait_replicated`] with any read of one value in `probe`'s slot as the check
    /// (a numbered line's counter: `GET`).
    pub async fn wait_replicated_reading(
        &mut self,
        probe: &str,
        check: redis::Cmd,
        replicas: u32,
        timeout_ms: u64,
    ) -> redis::RedisResult<(Option<String>, u32)> {
        let (value, acked) = self
            .wait_replicated_after(probe, check, replicas, timeout_ms)
            .await?;
        Ok((redis::from_redis_value(value)?, acked))
    }

    /// [`RedisConn::wait_replicated`] with any command in `probe`'s slot (a read, or a script
    /// whose writes are to reach the replicas: a numbered line's batch of enters) sent between
    /// the probe write and the `WAIT`. Its reply is returned as it came; an error reply comes
    /// as `Value::ServerError` from a cluster and as the call's error from one Redis (NOSCRIPT
    /// for a script the node does not hold, either way: the caller loads it).
    pub async fn wait_replicated_after(
        &mut self,
        probe: &str,
        check: redis::Cmd,
        replicas: u32,
        timeout_ms: u64,
    ) -> redis::RedisResult<(Value, u32)> {
        use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg(probe).arg(1).arg("PX").arg(60_000);
        pipe.add_command(check);
        pipe.cmd("WAIT").arg(replicas).arg(timeout_ms);
        // Bounded by the wait itself plus the per-command bound, not by the latter alone: WAIT
        // answers only when its own timeout has passed.
        let limit = Duration::from_millis(
            timeout_ms + DEADLINE_MS.load(std::sync::atomic::Ordering::Relaxed),
        );
        let timed_out = || {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer to WAIT within {limit:?}"),
            ))
        };
        let values = match self {
            RedisConn::Cluster(c, g) => {
                let sent = async {
                    if let Some(answer) = batch::direct_pipeline(c, g, &pipe, 0, 3).await {
                        return answer;
                    }
                    let route = SingleNodeRoutingInfo::SpecificNode(Route::new(
                        keys::slot(probe),
                        SlotAddr::Master,
                    ));
                    c.run(|mut c| async move { c.route_pipeline(pipe, 0, 3, route).await })
                        .await
                };
                tokio::time::timeout(limit, sent)
                    .await
                    .map_err(|_| timed_out())??
            }
            RedisConn::Single(c) => tokio::time::timeout(limit, pipe.query_async::<Vec<Value>>(c))
                .await
                .map_err(|_| timed_out())??,
        };
        let (_, check, acked): (Value, Value, u32) = redis::from_redis_value(Value::Array(values))?;
        Ok((check, acked))
    }

    /// True for a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(..))
    }

    /// The slot map of a cluster connection (None on one non-cluster Redis).
    pub fn node_groups(&self) -> Option<&batch::NodeGroups> {
        match self {
            RedisConn::Cluster(_, g) => Some(g),
            RedisConn::Single(_) => None,
        }
    }
}

/// A client for one node at `url` with the configured AUTH credentials and, for `rediss://`,
/// the configured certificate authority.
pub fn client(url: &str, cfg: &RedisConfig) -> anyhow::Result<redis::Client> {
    let mut info = url
        .into_connection_info()
        .context("parsing the Redis URL")?;
    let mut auth = info.redis_settings().clone();
    if let Some(user) = &cfg.username {
        auth = auth.set_username(user);
    }
    if let Some(pass) = &cfg.password {
        auth = auth.set_password(pass.expose());
    }
    info = info
        .set_redis_settings(auth)
        .set_tcp_settings(tcp_settings(cfg));
    match tls_certificates(cfg)? {
        Some(certs) => redis::Client::build_with_tls(info, certs),
        None => redis::Client::open(info),
    }
    .context("making the Redis client")
}

/// TCP options of every connection to Redis.
fn tcp_settings(cfg: &RedisConfig) -> TcpSettings {
    TcpSettings::default().set_nodelay(cfg.tcp_nodelay)
}

/// The configured CA for TLS, read from its file.
fn tls_certificates(cfg: &RedisConfig) -> anyhow::Result<Option<TlsCertificates>> {
    let Some(path) = &cfg.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(path)
        .with_context(|| format!("reading WAITROOM_REDIS_CA_FILE {}", path.display()))?;
    Ok(Some(TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

/// Connects to the configured deployment, detecting cluster mode when asked to. Every command
/// goes to the primary of its slot (directly when `WAITROOM_REDIS_DIRECT` is on: [`batch`]).
pub async fn connect(cfg: &RedisConfig) -> anyhow::Result<RedisConn> {
    connect_with(cfg, false, cfg.direct, "primaries").await
}

/// [`connect`] for the connection that carries `WAIT`s ([`Store::waits`]).
pub(crate) async fn connect_waits(cfg: &RedisConfig) -> anyhow::Result<RedisConn> {
    connect_with(cfg, false, cfg.direct, "waits").await
}

/// The connection for reads that may be a little stale (other shards' counts for a position,
/// the leader's published figures): routed to replicas when `read_from_replicas` is set and the
/// deployment is a cluster, else the primaries as usual. Never used for scripts, admissions or
/// holds — those always go to the primary.
pub async fn connect_reads(cfg: &RedisConfig, primary: &RedisConn) -> anyhow::Result<RedisConn> {
    if cfg.read_from_replicas && primary.is_cluster() {
        connect_with(cfg, true, false, "replica_reads").await
    } else {
        Ok(primary.clone())
    }
}

/// Sets the bound every Redis command is held to (see [`bounded`]).
pub(crate) fn set_command_deadline(cfg: &RedisConfig) {
    DEADLINE_MS.store(
        command_deadline(cfg).as_millis() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

async fn connect_with(
    cfg: &RedisConfig,
    replica_reads: bool,
    direct: bool,
    role: &'static str,
) -> anyhow::Result<RedisConn> {
    set_command_deadline(cfg);
    let connect_timeout = Duration::from_millis(cfg.connect_timeout_ms);
    let response_timeout = Duration::from_millis(cfg.response_timeout_ms);
    let first = cfg
        .nodes
        .first()
        .context("WAITROOM_REDIS_NODES names no node")?
        .clone();
    let cluster = match cfg.mode {
        RedisMode::Cluster => true,
        RedisMode::Standalone => false,
        RedisMode::Auto => detect_cluster(cfg, connect_timeout).await?,
    };
    if cluster {
        let conn = cluster_client(cfg, replica_reads).await?;
        let again = cfg.clone();
        let build: watched::Build = Box::new(move || {
            let cfg = again.clone();
            Box::pin(async move { cluster_client(&cfg, replica_reads).await })
        });
        let groups = batch::NodeGroups::new(direct.then(|| cfg.clone()));
        return Ok(RedisConn::Cluster(
            watched::Watched::new(conn, role, build),
            Arc::new(groups),
        ));
    }
    // Bound the whole set-up: an async connect can hang (shared/INFRA.md).
    let setup = async {
        let client = client(&first, cfg)?;
        let mcfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(400));
        client
            .get_connection_manager_with_config(mcfg)
            .await
            .context("connecting to Redis")
    };
    let conn = tokio::time::timeout(connect_timeout * 10, setup)
        .await
        .context("Redis connection set-up timed out")??;
    Ok(RedisConn::Single(conn))
}

/// A Redis Cluster client as configured (reads routed to replicas with `replica_reads`),
/// connected; the set-up is bounded (an async connect can hang, shared/INFRA.md).
pub async fn cluster_client(
    cfg: &RedisConfig,
    replica_reads: bool,
) -> anyhow::Result<ClusterConnection> {
    let connect_timeout = Duration::from_millis(cfg.connect_timeout_ms);
    let response_timeout = Duration::from_millis(cfg.response_timeout_ms);
    let setup = async {
        let mut builder = ClusterClientBuilder::new(cfg.nodes.clone())
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout)
            .retries(2)
            .min_retry_wait(50)
            .max_retry_wait(400)
            .tcp_settings(tcp_settings(cfg));
        if replica_reads {
            builder = builder.read_routing_strategy(RandomReplicaStrategy);
        }
        if let Some(user) = &cfg.username {
            builder = builder.username(user);
        }
        if let Some(pass) = &cfg.password {
            builder = builder.password(pass.expose());
        }
        if let Some(certs) = tls_certificates(cfg)? {
            builder = builder.certs(certs);
        }
        let client = builder
            .build()
            .context("building the Redis Cluster client")?;
        client
            .get_async_connection()
            .await
            .context("connecting to the Redis Cluster")
    };
    tokio::time::timeout(connect_timeout * 10, setup)
        .await
        .context("Redis connection set-up timed out")?
}

/// Asks the seed nodes, in turn, whether they run in cluster mode (`INFO cluster`): the first
/// that answers decides, so one seed being down does not stop the service from starting.
async fn detect_cluster(cfg: &RedisConfig, timeout: Duration) -> anyhow::Result<bool> {
    let mut failures = Vec::new();
    for url in &cfg.nodes {
        match ask_cluster_mode(url, cfg, timeout).await {
            Ok(cluster) => return Ok(cluster),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    anyhow::bail!("no Redis seed answered: {}", failures.join("; "))
}

async fn ask_cluster_mode(url: &str, cfg: &RedisConfig, timeout: Duration) -> anyhow::Result<bool> {
    let client = client(url, cfg)?;
    let probe = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut conn)
            .await?;
        Ok::<_, RedisError>(info.contains("cluster_enabled:1"))
    };
    let shown = redact(url);
    tokio::time::timeout(timeout * 5, probe)
        .await
        .with_context(|| format!("no answer from Redis at {shown}"))?
        .with_context(|| format!("asking {shown} for its cluster mode"))
}

/// A Redis URL fit for a log or an error message: any password in it replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

/// The slot ranges served by each primary, from `CLUSTER SLOTS`; empty for one non-cluster Redis.
pub async fn primaries(conn: &mut RedisConn) -> Result<Vec<Vec<(u16, u16)>>, RedisError> {
    match conn {
        RedisConn::Single(_) => Ok(Vec::new()),
        RedisConn::Cluster(c, _) => Ok(slot_owners(c)
            .await?
            .into_iter()
            .map(|(_, ranges)| ranges)
            .collect()),
    }
}

/// Each primary's address (`host:port`) and slot ranges, from `CLUSTER SLOTS`; `None` for one
/// non-cluster Redis.
pub async fn primary_slots(conn: &mut RedisConn) -> Result<Option<SlotOwners>, RedisError> {
    match conn {
        RedisConn::Single(_) => Ok(None),
        RedisConn::Cluster(c, _) => Ok(Some(slot_owners(c).await?)),
    }
}

/// Primaries by address, each with the slot ranges it serves.
pub type SlotOwners = Vec<(String, Vec<(u16, u16)>)>;

/// Each primary's address (`host:port`) and slot ranges, from `CLUSTER SLOTS`, in a stable
/// order (by their first slot), so every instance would choose the same placement.
async fn slot_owners(cluster: &Arc<watched::Watched>) -> Result<SlotOwners, RedisError> {
    let mut read = redis::cmd("CLUSTER");
    read.arg("SLOTS");
    let reply = cluster
        .run(|mut c| async move { bounded(c.req_packed_command(&read)).await })
        .await?;
    let slots: Vec<Value> = redis::from_redis_value(reply)?;
    let mut by_primary: Vec<(String, Vec<(u16, u16)>)> = Vec::new();
    for entry in slots {
        let Value::Array(parts) = entry else { continue };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(node))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let addr = match (node.first(), node.get(1)) {
            (Some(Value::BulkString(h)), Some(Value::Int(p))) => {
                let host = String::from_utf8_lossy(h);
                // An IPv6 address is written in brackets, as in a URL.
                if host.contains(':') {
                    format!("[{host}]:{p}")
                } else {
                    format!("{host}:{p}")
                }
            }
            _ => continue,
        };
        let range = (*lo as u16, *hi as u16);
        match by_primary.iter_mut().find(|(a, _)| *a == addr) {
            Some((_, ranges)) => ranges.push(range),
            None => by_primary.push((addr, vec![range])),
        }
    }
    // A stable order, so every instance would choose the same placement.
    by_primary.sort_by_key(|(_, ranges)| ranges.iter().map(|r| r.0).min());
    Ok(by_primary)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacted_urls_keep_no_password() {
        assert_eq!(
            redact("rediss://:s3cret@10.0.0.1:6379"),
            "rediss://:***@10.0.0.1:6379"
        );
        assert_eq!(redact("redis://app:s3cret@h:1/0"), "redis://app:***@h:1/0");
        assert_eq!(redact("redis://127.0.0.1:7000"), "redis://127.0.0.1:7000");
    }
}

/// How a Redis failure should be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A key holds a value of the wrong type: data to repair, not a reason to retry.
    WrongType,
    /// Unreachable, timing out, failing over, or otherwise unable to answer: 503, retry later.
    Unavailable,
}

/// Classifies a Redis error.
pub fn classify(err: &RedisError) -> Fault {
    if err.code() == Some("WRONGTYPE") || err.to_string().contains("WRONGTYPE") {
        Fault::WrongType
    } else {
        Fault::Unavailable
    }
}
