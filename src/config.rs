//! Configuration: flags or `WAITROOM_*` environment variables, with defaults that point at the
//! local stack (`scripts/stack up`), so `waitroom serve` runs bare on a developer machine.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Development-only secrets: used only when `WAITROOM_ENV=development` is asked for.
pub const DEV_ADMIN_TOKEN: &str = "dev-admin-token";
/// Development-only token signing key.
pub const DEV_TOKEN_SECRET: &str = "dev-token-secret-do-not-use-in-production";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "waitroom",
    version,
    about = "A virtual waiting room and seat gate"
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands: the service and its operations tasks.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API and run the admission scheduler.
    Serve(Box<Config>),
    /// Run only the ledger: consume bookings from Kafka into PostgreSQL.
    Ledger(Box<Config>),
    /// Compare Redis's sold seats with PostgreSQL's; `--repair` rewrites Redis from the ledger.
    Reconcile(Box<ReconcileArgs>),
    /// Apply the database migrations and exit.
    Migrate(DbConfig),
    /// Operate a running service over its admin API (list, show, put, pause, open, close,
    /// strategy).
    Admin(Box<crate::admin_cli::AdminArgs>),
    /// Exit 0 when the service at URL answers /healthz.
    Healthcheck {
        /// Base URL of the service.
        #[arg(long, env = "WAITROOM_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
    },
}

/// `waitroom reconcile`.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// Rewrite Redis's seat states from PostgreSQL (the source of truth) where they differ.
    #[arg(long)]
    pub repair: bool,
    #[command(flatten)]
    pub config: Config,
}

/// Everything `serve` needs.
#[derive(Debug, Clone, Parser)]
#[command(name = "serve")]
pub struct Config {
    /// `development` allows the built-in development secrets; anything else, or unset, is
    /// production, which refuses to start without configured secrets of at least 32 bytes.
    #[arg(long, env = "WAITROOM_ENV", default_value = "production")]
    pub env: String,
    /// This instance's id in admission leases (default: `<pid>-<random uuid>`).
    #[arg(long, env = "WAITROOM_INSTANCE_ID")]
    pub instance_id: Option<String>,
    #[command(flatten)]
    pub http: HttpConfig,
    #[command(flatten)]
    pub redis: RedisConfig,
    #[command(flatten)]
    pub db: DbConfig,
    #[command(flatten)]
    pub kafka: KafkaConfig,
    #[command(flatten)]
    pub ledger: LedgerConfig,
    #[command(flatten)]
    pub auth: AuthConfig,
    #[command(flatten)]
    pub admission: AdmissionConfig,
}

/// HTTP listener and per-client limits.
#[derive(Debug, Clone, Args)]
pub struct HttpConfig {
    /// Listen address (port 0 picks a free port).
    #[arg(
        long = "http-addr",
        env = "WAITROOM_HTTP_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub addr: SocketAddr,
    /// Requests per second one client (user id or ticket) may make; 0 turns the limit off.
    #[arg(long, env = "WAITROOM_CLIENT_RATE_PER_SECOND", default_value_t = 5)]
    pub client_rate_per_second: u32,
    /// Requests one client may make in a burst above the steady rate.
    #[arg(long, env = "WAITROOM_CLIENT_BURST", default_value_t = 20)]
    pub client_burst: u32,
    /// Requests per second one client address may make, all routes together (behind a proxy
    /// see `WAITROOM_TRUSTED_PROXIES`); off when `client_rate_per_second` is 0.
    #[arg(long, env = "WAITROOM_ADDRESS_RATE_PER_SECOND", default_value_t = 50)]
    pub address_rate_per_second: u32,
    /// Requests one client address may make in a burst above its steady rate.
    #[arg(long, env = "WAITROOM_ADDRESS_BURST", default_value_t = 100)]
    pub address_burst: u32,
    /// Requests per second one address may make to `/admin` routes (burst: twice that).
    #[arg(long, env = "WAITROOM_ADMIN_RATE_PER_SECOND", default_value_t = 10)]
    pub admin_rate_per_second: u32,
    /// Comma-separated CIDRs of proxies whose `X-Forwarded-For` is believed (none by default:
    /// the peer address is the client).
    #[arg(long, env = "WAITROOM_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<String>,
    /// Most HTTP connections open at once on this instance.
    #[arg(long, env = "WAITROOM_MAX_CONNECTIONS", default_value_t = 20_000)]
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers, or to send its body, seconds.
    #[arg(long, env = "WAITROOM_READ_TIMEOUT_SECONDS", default_value_t = 10)]
    pub read_timeout_seconds: u64,
    /// Oldest a public seat map may be, ms: each instance reads a show's map from Redis at most
    /// once per this (0: every request reads Redis).
    #[arg(long, env = "WAITROOM_SEAT_MAP_MAX_AGE_MS", default_value_t = 1000)]
    pub seat_map_max_age_ms: u64,
    /// Longest a request may take before it is answered 503, seconds (above the Kafka ack
    /// timeout, so a booking's outcome is known before its request is cut).
    #[arg(long, env = "WAITROOM_REQUEST_TIMEOUT_SECONDS", default_value_t = 15)]
    pub request_timeout_seconds: u64,
    /// How long to let in-flight requests finish on shutdown, seconds.
    #[arg(long, env = "WAITROOM_DRAIN_SECONDS", default_value_t = 10)]
    pub drain_seconds: u64,
}

/// How Redis is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisMode {
    /// Ask the first node (`INFO cluster`).
    Auto,
    /// A Redis Cluster.
    Cluster,
    /// One non-cluster Redis (hash tags are kept, so scripts are the same).
    Standalone,
}

/// Redis connection settings.
#[derive(Debug, Clone, Args)]
pub struct RedisConfig {
    /// Comma-separated seed nodes.
    #[arg(
        long = "redis-nodes",
        env = "WAITROOM_REDIS_NODES",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003,redis://127.0.0.1:7004,redis://127.0.0.1:7005"
    )]
    pub nodes: Vec<String>,
    /// Cluster or not.
    #[arg(long = "redis-mode", env = "WAITROOM_REDIS_MODE", value_enum, default_value_t = RedisMode::Auto)]
    pub mode: RedisMode,
    /// Prefix of every key (lets several deployments or tests share one cluster).
    #[arg(long, env = "WAITROOM_KEY_PREFIX", default_value = "wr")]
    pub key_prefix: String,
    /// Replicas of a show's primary that must hold a booking's sold mark before its 201
    /// (`WAIT`); default 1 on a Redis Cluster, 0 on one non-cluster Redis (no replicas). Also
    /// the replicas of a numbered line's counter that must hold an arrival number before it is
    /// used (docs/numbered-line.md).
    #[arg(long, env = "WAITROOM_BOOKING_REPLICAS")]
    pub booking_replicas: Option<u32>,
    /// How long a booking waits for those replicas, ms; past it the booking is undone (503).
    /// Also how long a numbered line's enter waits for its number to reach them (then 503).
    #[arg(long, env = "WAITROOM_BOOKING_WAIT_MS", default_value_t = 1000)]
    pub booking_wait_ms: u64,
    /// Connection timeout, ms.
    #[arg(
        long = "redis-connect-timeout-ms",
        env = "WAITROOM_REDIS_CONNECT_TIMEOUT_MS",
        default_value_t = 1000
    )]
    pub connect_timeout_ms: u64,
    /// Send position reads (other shards' counts, published figures, the numbered index entry
    /// of a ticket an instance does not remember) to replicas: less load on the primaries,
    /// positions up to the replication lag stale. Scripts never go to replicas.
    #[arg(
        long = "redis-read-from-replicas",
        env = "WAITROOM_REDIS_READ_FROM_REPLICAS",
        default_value_t = false
    )]
    pub read_from_replicas: bool,
    /// Send each command whose slot the service can tell straight to the primary serving it,
    /// over a connection of its own per primary, instead of through the cluster client's
    /// routing task; failures and redirects still go through the cluster client
    /// (docs/architecture.md, "Direct connections").
    #[arg(
        long = "redis-direct",
        env = "WAITROOM_REDIS_DIRECT",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub direct: bool,
    /// TCP_NODELAY on every connection to Redis (redis-rs leaves Nagle's algorithm on).
    #[arg(
        long = "redis-tcp-nodelay",
        env = "WAITROOM_REDIS_TCP_NODELAY",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub tcp_nodelay: bool,
    /// Tickets whose score in their shard each instance remembers (0: none), so that an exact
    /// `timestamp` position reads its own shard and counts the other shards in one round trip
    /// instead of two; every remembered score is checked by the same round's own-shard read
    /// (docs/architecture.md, "One round trip per exact position"). The same bound holds the
    /// numbered lines' places, which let a poll far from the front be answered without Redis
    /// (one not remembered reads its index entry first): size it to the longest line (all
    /// numbered events together) an instance's polls reach.
    /// 38–75 bytes per entry, per cache.
    #[arg(
        long = "redis-score-cache-entries",
        env = "WAITROOM_REDIS_SCORE_CACHE_ENTRIES",
        default_value_t = crate::queue::scores::DEFAULT_ENTRIES
    )]
    pub score_cache_entries: usize,
    /// How long (ms) each instance computes a numbered line's waiting positions from the
    /// figures it last read (one script per event per three quarters of this long, read while
    /// the kept figures still answer, instead of one per poll far from the front); a position
    /// is then exact as of a read at most this long ago. 0: every poll runs its
    /// script (docs/numbered-line.md, "Polls without a round trip").
    #[arg(
        long = "numbered-snapshot-ms",
        env = "WAITROOM_NUMBERED_SNAPSHOT_MS",
        default_value_t = 100
    )]
    pub numbered_snapshot_ms: u64,
    /// Password for Redis AUTH (ElastiCache's AUTH token), unless the node URLs carry one.
    #[arg(
        id = "redis_password",
        long = "redis-password",
        env = "WAITROOM_REDIS_PASSWORD"
    )]
    pub password: Option<Secret>,
    /// Username for Redis AUTH (ACL users; the AUTH token alone needs none).
    #[arg(
        id = "redis_username",
        long = "redis-username",
        env = "WAITROOM_REDIS_USERNAME"
    )]
    pub username: Option<String>,
    /// A PEM file of the certificate authority that signed the Redis nodes' certificates, for
    /// `rediss://` nodes whose CA is not in the system's trust store.
    #[arg(
        id = "redis_ca_file",
        long = "redis-ca-file",
        env = "WAITROOM_REDIS_CA_FILE"
    )]
    pub ca_file: Option<std::path::PathBuf>,
    /// Operations per second one Redis node is taken to sustain: dashboards and alerts draw the
    /// 70 % line from it (measure it for your node type; docs/benchmarks.md has this machine's).
    #[arg(
        long = "redis-node-ops-capacity",
        env = "WAITROOM_REDIS_NODE_OPS_CAPACITY",
        default_value_t = 100_000.0
    )]
    pub node_ops_capacity: f64,
    /// The memory guard: while any primary's `used_memory` is at or above this percentage of
    /// its `maxmemory`, the enter of someone not yet in a line answers 503 `unavailable`, so
    /// that a line filling Redis leaves the rest (admission, polls, holds, bookings) room to
    /// write ([`crate::redis::memory`]). 0 turns it off; nodes without `maxmemory` never count.
    #[arg(
        long = "redis-enter-memory-percent",
        env = "WAITROOM_REDIS_ENTER_MEMORY_PERCENT",
        default_value_t = 80,
        value_parser = clap::value_parser!(u8).range(0..=100)
    )]
    pub enter_memory_percent: u8,
    /// How often the memory guard reads the primaries' memory, ms.
    #[arg(
        long = "redis-memory-check-ms",
        env = "WAITROOM_REDIS_MEMORY_CHECK_MS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(50..=60_000)
    )]
    pub memory_check_ms: u64,
    /// Response timeout per request, ms.
    #[arg(
        long = "redis-response-timeout-ms",
        env = "WAITROOM_REDIS_RESPONSE_TIMEOUT_MS",
        default_value_t = 1000
    )]
    pub response_timeout_ms: u64,
}

/// PostgreSQL settings.
#[derive(Debug, Clone, Args)]
pub struct DbConfig {
    /// PostgreSQL URL.
    #[arg(
        long = "database-url",
        env = "WAITROOM_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/waitroom"
    )]
    pub url: Secret,
    /// Connections of the service's own pool (booking status reads, `/readyz`, the sweeper);
    /// the ledger has a pool of its own (`WAITROOM_LEDGER_DB_CONNECTIONS`).
    #[arg(
        long = "database-connections",
        env = "WAITROOM_DATABASE_CONNECTIONS",
        default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub connections: u32,
}

/// The ledger (Kafka → PostgreSQL).
#[derive(Debug, Clone, Args)]
pub struct LedgerConfig {
    /// Appliers in this process: the partitions the ledger's consumer group gives the process
    /// are shared among them by partition number, each applying its own in transactions of its
    /// own. More appliers than partitions leaves the extra ones idle; several `waitroom ledger`
    /// processes share the topic's partitions through the group.
    #[arg(
        long = "ledger-appliers",
        env = "WAITROOM_LEDGER_APPLIERS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=64)
    )]
    pub appliers: u32,
    /// Connections of the ledger's own PostgreSQL pool (one per applier is used at a time).
    #[arg(
        long = "ledger-db-connections",
        env = "WAITROOM_LEDGER_DB_CONNECTIONS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub db_connections: u32,
    /// Most bookings applied in one transaction.
    #[arg(
        long = "ledger-batch-max",
        env = "WAITROOM_LEDGER_BATCH_MAX",
        default_value_t = 5000,
        value_parser = clap::value_parser!(u32).range(1..=50_000)
    )]
    pub batch_max: u32,
    /// Longest a batch waits to fill once its first booking arrived, ms (the ledger's latency
    /// floor under a light load; under a heavy one batches fill by count first).
    #[arg(
        long = "ledger-batch-window-ms",
        env = "WAITROOM_LEDGER_BATCH_WINDOW_MS",
        default_value_t = 50,
        value_parser = clap::value_parser!(u64).range(1..=5_000)
    )]
    pub batch_window_ms: u64,
}

/// Kafka settings.
#[derive(Debug, Clone, Args)]
pub struct KafkaConfig {
    /// Bootstrap servers.
    #[arg(
        long = "kafka-brokers",
        env = "WAITROOM_KAFKA_BROKERS",
        default_value = "127.0.0.1:9092"
    )]
    pub brokers: String,
    /// Topic confirmed bookings are published to (created at start-up when missing).
    #[arg(
        long = "kafka-topic",
        env = "WAITROOM_KAFKA_TOPIC",
        default_value = "waitroom.bookings"
    )]
    pub topic: String,
    /// Consumer group of the ledger (the consumer that writes bookings to PostgreSQL).
    #[arg(
        long = "kafka-group",
        env = "WAITROOM_KAFKA_GROUP",
        default_value = "waitroom-ledger"
    )]
    pub group: String,
    /// Partitions of the bookings topic when the service creates it (an existing topic keeps
    /// its own). Bookings are keyed by booking id, so a sale spreads over all of them and as
    /// many appliers can decide it side by side.
    #[arg(
        long = "kafka-partitions",
        env = "WAITROOM_KAFKA_PARTITIONS",
        default_value_t = 6,
        value_parser = clap::value_parser!(i32).range(1..=1000)
    )]
    pub partitions: i32,
    /// Do not run the ledger consumer inside `serve` (run `waitroom ledger` separately).
    #[arg(long, env = "WAITROOM_NO_LEDGER", default_value_t = false)]
    pub no_ledger: bool,
    /// `plaintext`, `ssl` or `sasl_ssl` (MSK with SCRAM: `sasl_ssl`).
    #[arg(
        long = "kafka-security-protocol",
        env = "WAITROOM_KAFKA_SECURITY_PROTOCOL",
        default_value = "plaintext"
    )]
    pub security_protocol: String,
    /// SASL mechanism with `sasl_ssl` (MSK: `SCRAM-SHA-512`).
    #[arg(
        long = "kafka-sasl-mechanism",
        env = "WAITROOM_KAFKA_SASL_MECHANISM",
        default_value = "SCRAM-SHA-512"
    )]
    pub sasl_mechanism: String,
    /// SASL username.
    #[arg(long = "kafka-sasl-username", env = "WAITROOM_KAFKA_SASL_USERNAME")]
    pub sasl_username: Option<String>,
    /// SASL password.
    #[arg(long = "kafka-sasl-password", env = "WAITROOM_KAFKA_SASL_PASSWORD")]
    pub sasl_password: Option<Secret>,
    /// A PEM file of the certificate authority of the brokers, when not in the trust store.
    #[arg(
        id = "kafka_ca_file",
        long = "kafka-ca-file",
        env = "WAITROOM_KAFKA_CA_FILE"
    )]
    pub ca_file: Option<std::path::PathBuf>,
    /// How long to wait for Kafka to acknowledge a booking before answering 503, ms.
    #[arg(
        long = "kafka-ack-timeout-ms",
        env = "WAITROOM_KAFKA_ACK_TIMEOUT_MS",
        default_value_t = 5000
    )]
    pub ack_timeout_ms: u64,
    /// librdkafka's idempotent producer. Off by default: the ledger applies a booking id once,
    /// so a duplicate from a retry is harmless, and an idempotent producer whose messages timed
    /// out needs the broker to bump its epoch, which the local broker (tansu 0.6) cannot: it
    /// panics and stops serving (docs/reliability.md).
    #[arg(
        long = "kafka-idempotence",
        env = "WAITROOM_KAFKA_IDEMPOTENCE",
        default_value_t = false
    )]
    pub idempotence: bool,
}

/// Tokens.
#[derive(Debug, Clone, Args)]
pub struct AuthConfig {
    /// Bearer token for /admin, at least 32 bytes (required outside development).
    #[arg(long, env = "WAITROOM_ADMIN_TOKEN")]
    pub admin_token: Option<Secret>,
    /// A file holding the admin token (for secrets mounted as files), instead of the variable.
    #[arg(long, env = "WAITROOM_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// Key that signs access tokens and derives tickets, at least 32 bytes; all instances
    /// share it (required outside development).
    #[arg(long, env = "WAITROOM_TOKEN_SECRET")]
    pub token_secret: Option<Secret>,
    /// A file holding the token secret, instead of the variable.
    #[arg(long, env = "WAITROOM_TOKEN_SECRET_FILE")]
    pub token_secret_file: Option<std::path::PathBuf>,
}

/// Shortest secret accepted in production.
pub const MIN_SECRET_BYTES: usize = 32;

impl AuthConfig {
    /// One secret: the variable, else the file (trailing newline trimmed), else none.
    fn read(
        value: &Option<Secret>,
        file: &Option<std::path::PathBuf>,
        name: &str,
    ) -> anyhow::Result<Option<String>> {
        if let Some(s) = value.as_ref().filter(|s| !s.0.is_empty()) {
            return Ok(Some(s.0.clone()));
        }
        match file {
            Some(path) => {
                let raw = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("reading {name}_FILE {}: {e}", path.display()))?;
                Ok(Some(raw.trim_end_matches(['\n', '\r']).to_owned()).filter(|s| !s.is_empty()))
            }
            None => Ok(None),
        }
    }
}

/// The admission scheduler.
#[derive(Debug, Clone, Args)]
pub struct AdmissionConfig {
    /// Admission tick, ms.
    #[arg(long, env = "WAITROOM_ADMISSION_TICK_MS", default_value_t = 100)]
    pub tick_ms: u64,
    /// Lease length, ms: another instance takes over this long after the leader dies.
    #[arg(long, env = "WAITROOM_LEASE_MS", default_value_t = 3000)]
    pub lease_ms: u64,
    /// Do not run the admission scheduler in this process (serve HTTP only).
    #[arg(long, env = "WAITROOM_NO_ADMISSION", default_value_t = false)]
    pub no_admission: bool,
}

impl KafkaConfig {
    /// A librdkafka configuration with the brokers and the security settings; every Kafka
    /// client of the service (producer, consumer, admin, readiness probe) starts from it.
    pub fn client(&self) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        c.set("security.protocol", &self.security_protocol);
        if self.security_protocol.starts_with("sasl") {
            c.set("sasl.mechanism", &self.sasl_mechanism);
            if let Some(user) = &self.sasl_username {
                c.set("sasl.username", user);
            }
            if let Some(pass) = &self.sasl_password {
                c.set("sasl.password", pass.expose());
            }
        }
        if let Some(ca) = &self.ca_file {
            c.set("ssl.ca.location", ca.to_string_lossy());
        }
        c
    }
}

impl Config {
    /// True only when development mode was asked for explicitly (`WAITROOM_ENV=development`).
    pub fn is_development(&self) -> bool {
        self.env == "development"
    }

    /// Resolves the admin token and the token secret. Production (anything but
    /// `WAITROOM_ENV=development`) fails closed: both must be configured, from the environment
    /// or a file, at least [`MIN_SECRET_BYTES`] long, and not the development values. The
    /// errors name the setting, never the value.
    pub fn secrets(&self) -> anyhow::Result<(String, String)> {
        let a = &self.auth;
        let admin = AuthConfig::read(&a.admin_token, &a.admin_token_file, "WAITROOM_ADMIN_TOKEN")?;
        let secret = AuthConfig::read(
            &a.token_secret,
            &a.token_secret_file,
            "WAITROOM_TOKEN_SECRET",
        )?;
        if self.is_development() {
            return Ok((
                admin.unwrap_or_else(|| DEV_ADMIN_TOKEN.to_owned()),
                secret.unwrap_or_else(|| DEV_TOKEN_SECRET.to_owned()),
            ));
        }
        let check = |value: Option<String>, name: &str, dev: &str| -> anyhow::Result<String> {
            let v = value.ok_or_else(|| {
                anyhow::anyhow!(
                    "{name} (or {name}_FILE) is required: production is the default; set \
                     WAITROOM_ENV=development only on a developer machine"
                )
            })?;
            anyhow::ensure!(
                v != dev,
                "{name} is the development value, refused in production"
            );
            anyhow::ensure!(
                v.len() >= MIN_SECRET_BYTES,
                "{name} is {} bytes; production needs at least {MIN_SECRET_BYTES}",
                v.len()
            );
            Ok(v)
        };
        Ok((
            check(admin, "WAITROOM_ADMIN_TOKEN", DEV_ADMIN_TOKEN)?,
            check(secret, "WAITROOM_TOKEN_SECRET", DEV_TOKEN_SECRET)?,
        ))
    }
}

/// A string that never shows in logs or `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl Secret {
    /// The secret value; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_serve_points_at_the_local_stack_and_is_production() {
        let cfg = Config::try_parse_from(["serve"]).unwrap();
        assert_eq!(cfg.http.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(cfg.redis.nodes.len(), 6);
        assert_eq!(cfg.kafka.brokers, "127.0.0.1:9092");
        assert_eq!(cfg.env, "production");
        // Safe by default: the memory guard is on, at a line a sorted-set rehash cannot carry
        // past maxmemory (docs/operations.md, "WaitroomTurningPeopleAway").
        assert_eq!(cfg.redis.enter_memory_percent, 80);
        assert!(Config::try_parse_from(["serve", "--redis-enter-memory-percent", "101"]).is_err());
    }

    fn with_auth(env: &str, admin: Option<&str>, secret: Option<&str>) -> Config {
        let mut cfg = Config::try_parse_from(["serve", "--env", env]).unwrap();
        cfg.auth = AuthConfig {
            admin_token: admin.map(|s| Secret(s.into())),
            admin_token_file: None,
            token_secret: secret.map(|s| Secret(s.into())),
            token_secret_file: None,
        };
        cfg
    }

    #[test]
    fn production_fails_closed_without_long_secrets_and_development_must_be_asked_for() {
        let long = "x".repeat(MIN_SECRET_BYTES);
        let other = "y".repeat(MIN_SECRET_BYTES);
        for env in ["production", "prod", "", "Development"] {
            assert!(with_auth(env, None, None).secrets().is_err(), "{env:?}");
            let short = with_auth(env, Some("short"), Some(&other)).secrets();
            let err = short.unwrap_err().to_string();
            assert!(err.contains("32") && !err.contains("short"), "{err}");
            assert!(with_auth(env, Some(DEV_ADMIN_TOKEN), Some(&other))
                .secrets()
                .is_err());
            assert!(with_auth(env, Some(&long), Some(DEV_TOKEN_SECRET))
                .secrets()
                .is_err());
            assert_eq!(
                with_auth(env, Some(&long), Some(&other)).secrets().unwrap(),
                (long.clone(), other.clone())
            );
        }
        assert_eq!(
            with_auth("development", None, None).secrets().unwrap(),
            (DEV_ADMIN_TOKEN.to_owned(), DEV_TOKEN_SECRET.to_owned())
        );
    }

    #[test]
    fn secrets_can_come_from_files() {
        let dir = std::env::temp_dir().join(format!("waitroom-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, t) = (dir.join("admin"), dir.join("token"));
        std::fs::write(&a, format!("{}\n", "a".repeat(40))).unwrap();
        std::fs::write(&t, "t".repeat(33)).unwrap();
        let mut cfg = with_auth("production", None, None);
        cfg.auth.admin_token_file = Some(a);
        cfg.auth.token_secret_file = Some(t);
        assert_eq!(cfg.secrets().unwrap(), ("a".repeat(40), "t".repeat(33)));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn secrets_do_not_print() {
        assert_eq!(format!("{:?}", Secret("hunter2".into())), "Secret(***)");
    }
}
