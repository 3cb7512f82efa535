//! [`Store`]: the Redis handles every domain module shares — the connection, the read
//! connection, the key builder and the scripts (each cluster connection carries its slot map).
//!
//! The queue, seats and booking modules each hold an `Arc<Store>` and work through it; none
//! reaches into another module's fields for Redis.

use std::sync::Arc;

use anyhow::Context as _;

use super::batch::NodeGroups;
use super::keys::Keys;
use super::scripts::Scripts;
use super::{connect, connect_reads, connect_waits, RedisConn};
use crate::config::RedisConfig;

/// The shared Redis handles; cheap to share behind an `Arc`.
pub struct Store {
    conn: RedisConn,
    reads: RedisConn,
    /// `reads` goes to replicas (so a read may miss a write the primary holds).
    replica_reads: bool,
    /// Where `WAIT`s go (see [`RedisConn::wait_replicated`]).
    waits: RedisConn,
    keys: Keys,
    scripts: Scripts,
}

impl Store {
    /// A store over connections already made, keys under `keys`.
    pub fn new(conn: RedisConn, reads: RedisConn, keys: Keys) -> Self {
        Store {
            waits: conn.clone(),
            conn,
            reads,
            replica_reads: false,
            keys,
            scripts: Scripts::new(),
        }
    }

    /// Connects as configured (the read connection to replicas when asked for), and loads every
    /// script on every node.
    pub async fn connect(cfg: &RedisConfig) -> anyhow::Result<Arc<Self>> {
        let conn = connect(cfg).await?;
        let reads = connect_reads(cfg, &conn).await?;
        tracing::info!(
            cluster = conn.is_cluster(),
            replica_reads = cfg.read_from_replicas,
            "connected to Redis"
        );
        let replica_reads = cfg.read_from_replicas && conn.is_cluster();
        let mut store = Store::new(conn, reads, Keys::new(cfg.key_prefix.clone()));
        store.replica_reads = replica_reads;
        // WAIT blocks the connection it is sent on: connections of their own (a second
        // `connect` opens new sockets, direct ones included), whose response timeout leaves
        // room for the whole wait (`WAITROOM_BOOKING_WAIT_MS`), so a wait longer than one
        // response timeout is not cut short by the client.
        let mut waits = cfg.clone();
        waits.response_timeout_ms = cfg.response_timeout_ms.max(cfg.booking_wait_ms + 500);
        store.waits = connect_waits(&waits).await?;
        // connect() set the per-command bound from the config it was given: the service's.
        super::set_command_deadline(cfg);
        store
            .scripts
            .preload(&mut store.conn())
            .await
            .context("loading the Lua scripts")?;
        Ok(Arc::new(store))
    }

    /// A handle on the primaries (multiplexed: clone per request).
    pub fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The connection for `WAIT` (see [`RedisConn::wait_replicated`]).
    pub fn waits(&self) -> RedisConn {
        self.waits.clone()
    }

    /// A handle for reads that may be a little stale (replicas when configured).
    pub fn reads(&self) -> RedisConn {
        self.reads.clone()
    }

    /// Whether [`Store::reads`] goes to replicas: a read there may not yet see a write the
    /// primary holds, so finding nothing proves nothing.
    pub fn reads_replicas(&self) -> bool {
        self.replica_reads
    }

    /// Every key format.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The Lua scripts.
    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// Which primary serves which slot, for reads grouped per node (the read connection's map;
    /// None on one non-cluster Redis).
    pub fn node_groups(&self) -> Option<&NodeGroups> {
        self.reads.node_groups()
    }
}
