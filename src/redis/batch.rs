//! The cluster's slot map, kept by the service: read-only commands to many shards sent as one
//! pipeline per node, and commands sent straight to the primary that serves their slot.
//!
//! An exact `timestamp` position is one count per other shard: N − 1 commands, each a round trip
//! of its own through the cluster client (routing, a channel, a timeout, a wake-up). The profile
//! in docs/benchmarks.md puts most of the service's CPU there, and Redis too spends more per
//! command when commands come one per read. redis-rs refuses a pipeline whose keys are in
//! different slots, even on one node, so the grouping is done here: keys are grouped by the
//! primary that serves their slot, from a `CLUSTER SLOTS` map kept for [`MAP_TTL`], and each
//! group is sent as one pipeline to that node (to the replicas when the connection reads from
//! replicas, exactly as a single read would go).
//!
//! **Direct connections** (`WAITROOM_REDIS_DIRECT`, on by default). The cluster client hands
//! every command to a routing task of its own, which parses it for its slot and passes it on to
//! the node's multiplexed connection (a second channel, a second task), and relays the answer
//! back the same way. With direct connections the map also holds one multiplexed connection per
//! primary, and a command whose slot [`command_slot`] can tell goes straight to it: one hop
//! instead of two, and concurrent requests still share one socket per node. The cluster client
//! stays the authority for the rest: a command without a known slot, a node not connected, and
//! every failure the cluster client answers by retrying (a broken connection, MOVED, ASK,
//! TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, LOADING). Such a command is sent again
//! through the cluster client, which follows redirects, refreshes its own map and retries as
//! before, while the map here is dropped and read again in the background (a failed node's
//! connection with it). A failover costs each request in flight at most one extra attempt,
//! within the same per-command bound (`super::bounded`). As with the cluster client's own
//! retries, a write whose answer was lost with its connection may be sent twice. A timeout is
//! answered, not sent again, as the cluster client does ([`settle`]). A pipeline is sent again
//! whole; the service's pipelines are all reads.
//!
//! A stale map can only put a key in the wrong group. Redis then answers MOVED for that key, and
//! the whole group is retried one command at a time (the client follows MOVED there) and the map
//! is read again. Failover keeps the groups intact: a promoted replica takes all its primary's
//! slots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

use super::watched::Watched;
use super::{slot_owners, RedisConn};
use crate::config::RedisConfig;
use crate::sync::{Guard as _, Guards as _};
use crate::telemetry;

/// How long a slot map is used before it is read again.
pub const MAP_TTL: Duration = Duration::from_secs(10);
/// The shortest time between two reads of the map: a failing node must not have every request
/// read it.
const RETRY_AFTER: Duration = Duration::from_millis(250);
/// No primary (more than 254 primaries, or a slot nobody claims).
const NONE: u8 = u8::MAX;

/// A primary's address and its direct requests' counters (`addr` label).
pub(super) struct NodeHandles {
    /// `host:port`, as `CLUSTER SLOTS` names it.
    addr: String,
    answered: metrics::Counter,
    sent_again: metrics::Counter,
    timed_out: metrics::Counter,
}

impl NodeHandles {
    fn new(addr: String) -> Self {
        let counter = |outcome: &'static str| metrics::counter!(telemetry::REDIS_DIRECT, "outcome" => outcome, "addr" => addr.clone());
        NodeHandles {
            answered: counter("answered"),
            sent_again: counter("sent_again"),
            timed_out: counter("timed_out"),
            addr,
        }
    }
}

/// One primary of the map.
struct Node {
    handles: Arc<NodeHandles>,
    /// Its direct connection, when direct connections are on and it answered.
    conn: Option<MultiplexedConnection>,
}

/// A primary as read: its address, its slot ranges and its direct connection.
type Primary = (String, Vec<(u16, u16)>, Option<MultiplexedConnection>);

/// The map as last read.
struct Map {
    read_at: Instant,
    /// The index in `nodes` of the primary serving each slot.
    owner: Vec<u8>,
    nodes: Vec<Node>,
}

impl Map {
    fn new(read_at: Instant, primaries: Vec<Primary>) -> Map {
        let mut owner = vec![NONE; 16384];
        let mut nodes = Vec::new();
        for (i, (addr, ranges, conn)) in primaries.into_iter().take(NONE as usize).enumerate() {
            for (lo, hi) in ranges {
                for slot in lo..=hi.min(16383) {
                    owner[usize::from(slot)] = i as u8;
                }
            }
            nodes.push(Node {
                handles: Arc::new(NodeHandles::new(addr)),
                conn,
            });
        }
        Map {
            read_at,
            owner,
            nodes,
        }
    }

    /// True once the map is older than [`MAP_TTL`]: time to read it again.
    fn is_stale(&self) -> bool {
        self.read_at.elapsed() >= MAP_TTL
    }

    fn node_of(&self, slot: u16) -> Option<usize> {
        match self.owner.get(usize::from(slot)) {
            Some(&i) if i != NONE => Some(usize::from(i)),
            _ => None,
        }
    }
}

/// How to open direct connections to the primaries.
struct DirectTo {
    cfg: RedisConfig,
    /// The first seed URL: its scheme and credentials are used for every node.
    seed: String,
}

/// The cluster's slot-to-primary map, shared by every request on one connection.
pub struct NodeGroups {
    map: RwLock<Option<Map>>,
    refreshing: AtomicBool,
    last_read: Mutex<Option<Instant>>,
    direct: Option<DirectTo>,
    /// Direct connections by address, kept from one read of the map to the next.
    open: Mutex<HashMap<String, MultiplexedConnection>>,
}

impl NodeGroups {
    /// An empty map, read on first use; with `direct`, a connection is opened to each primary.
    pub fn new(direct: Option<RedisConfig>) -> Self {
        NodeGroups {
            map: RwLock::new(None),
            refreshing: AtomicBool::new(false),
            last_read: Mutex::new(None),
            direct: direct.map(|cfg| DirectTo {
                seed: cfg.nodes.first().cloned().unwrap_or_default(),
                cfg,
            }),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Starts a read of the map in the background when it is missing or older than
    /// [`MAP_TTL`] and no read is under way (at most one per [`RETRY_AFTER`]).
    fn refresh_if_due(self: &Arc<Self>, stale: bool, cluster: &Arc<Watched>) {
        if !stale || self.refreshing.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut last = self.last_read.guard();
            if last.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
                return;
            }
            if self.refreshing.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let this = self.clone();
        let cluster = cluster.clone();
        tokio::spawn(async move {
            // Cleared however this ends, so the map is read again later.
            let _done = ClearOnDrop(&this.refreshing);
            let owners = match slot_owners(&cluster).await {
                Ok(o) if !o.is_empty() => o,
                _ => return,
            };
            let mut primaries = Vec::with_capacity(owners.len());
            for (addr, ranges) in owners {
                let conn = this.connection(&addr).await;
                primaries.push((addr, ranges, conn));
            }
            // Connections to nodes no longer primaries (a primary demoted by a failover) go.
            this.open
                .guard()
                .retain(|addr, _| primaries.iter().any(|(a, _, _)| a == addr));
            let map = Map::new(Instant::now(), primaries);
            *this.map.write_guard() = Some(map);
        });
    }

    /// The direct connection to `addr`: the one kept, or a new one (None when direct
    /// connections are off or the node does not answer).
    async fn connection(&self, addr: &str) -> Option<MultiplexedConnection> {
        let to = self.direct.as_ref()?;
        if let Some(c) = self.open.guard().get(addr) {
            return Some(c.clone());
        }
        let connect_timeout = Duration::from_millis(to.cfg.connect_timeout_ms);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(Duration::from_millis(to.cfg.response_timeout_ms)));
        let client = super::nodes::node_client(&to.seed, addr, &to.cfg).ok()?;
        let made = tokio::time::timeout(
            connect_timeout * 2,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await;
        match made {
            Ok(Ok(conn)) => {
                self.open.guard().insert(addr.to_owned(), conn.clone());
                Some(conn)
            }
            Ok(Err(e)) => {
                tracing::debug!(addr, error = %e, "redis: no direct connection");
                None
            }
            Err(_) => {
                tracing::debug!(addr, "redis: no direct connection (timed out)");
                None
            }
        }
    }

    /// The direct connection to the primary serving `slot`, if there is one; starts a read of
    /// the map when it is due.
    fn direct_to(
        self: &Arc<Self>,
        slot: u16,
        cluster: &Arc<Watched>,
    ) -> Option<(Arc<NodeHandles>, MultiplexedConnection)> {
        self.direct.as_ref()?;
        let (stale, found) = {
            let map = self.map.read_guard();
            match map.as_ref() {
                None => (true, None),
                Some(m) => (
                    m.is_stale(),
                    m.node_of(slot).and_then(|i| {
                        let node = &m.nodes[i];
                        node.conn.clone().map(|c| (node.handles.clone(), c))
                    }),
                ),
            }
        };
        self.refresh_if_due(stale, cluster);
        found
    }

    /// A direct attempt met a redirect or a fault: forget the map, and the node's connection
    /// too if the connection itself failed, so both are made anew.
    fn failed(&self, addr: &str, err: Option<&RedisError>) {
        if err.is_some_and(|e| !matches!(e.kind(), ErrorKind::Server(_))) {
            self.open.guard().remove(addr);
        }
        self.invalidate();
    }

    /// Forgets the map (a group met MOVED): the next request reads it again.
    fn invalidate(&self) {
        *self.map.write_guard() = None;
    }

    /// Replaces the map, as if just read, with primaries that have no direct connection: for
    /// tests of a stale map.
    pub fn force(&self, ranges: Vec<Vec<(u16, u16)>>) {
        let primaries = ranges
            .into_iter()
            .enumerate()
            .map(|(i, r)| (format!("forced-{i}:0"), r, None))
            .collect();
        *self.map.write_guard() = Some(Map::new(Instant::now(), primaries));
    }

    /// How many primaries the map holds (None while no map is held: after a group met MOVED,
    /// until the next read).
    pub fn primaries(&self) -> Option<usize> {
        self.map.read_guard().as_ref().map(|m| m.nodes.len())
    }

    /// Groups command indices (by their slots) per primary, with that primary's direct
    /// connection if any; commands whose slot no primary claims (or all, before the map is
    /// read) get a group each. Starts a read of the map when it is due.
    fn group(self: &Arc<Self>, slots: &[u16], cluster: &Arc<Watched>) -> Vec<Group> {
        let (stale, groups) = {
            let map = self.map.read_guard();
            let stale = map.as_ref().is_none_or(Map::is_stale);
            (stale, group(map.as_ref(), slots))
        };
        self.refresh_if_due(stale, cluster);
        groups
    }
}

/// Commands bound for one node.
struct Group {
    idx: Vec<usize>,
    direct: Option<(Arc<NodeHandles>, MultiplexedConnection)>,
}

/// Groups command indices by node; commands whose slot no primary claims get a group each.
fn group(map: Option<&Map>, slots: &[u16]) -> Vec<Group> {
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, slot) in slots.iter().enumerate() {
        let node = map.and_then(|m| m.node_of(*slot)).unwrap_or(usize::MAX - i);
        groups.entry(node).or_default().push(i);
    }
    let mut out: Vec<(usize, Vec<usize>)> = groups.into_iter().collect();
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out.into_iter()
        .map(|(node, idx)| Group {
            direct: map
                .and_then(|m| m.nodes.get(node))
                .and_then(|n| n.conn.clone().map(|c| (n.handles.clone(), c))),
            idx,
        })
        .collect()
}

/// Clears a flag when dropped.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The slot of a command whose keys all share one slot and that one node answers, or None:
/// a single-key command of the list below (its key is the first argument), or a script call
/// (EVALSHA/EVAL/…_RO with at least one key; a script's keys must share a slot on a cluster
/// anyway). Anything else (no key, several keys, a command not listed) goes through the
/// cluster client, which knows every command's routing.
pub fn command_slot(cmd: &Cmd) -> Option<u16> {
    command_key(cmd).map(super::keys::slot_of)
}

/// The key [`command_slot`] routes by.
fn command_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(b) => Some(b),
        _ => None,
    });
    let name = args.next()??;
    // Upper-cased on the stack, then one `match` (compiled to a length dispatch and compares):
    // this runs for every command, and a list scanned with case-insensitive compares cost 5 %
    // of a poll's instructions.
    let mut upper = [0u8; 16];
    let upper = upper.get_mut(..name.len())?;
    upper.copy_from_slice(name);
    upper.make_ascii_uppercase();
    match &*upper {
        b"EVALSHA" | b"EVAL" | b"EVALSHA_RO" | b"EVAL_RO" => {
            let _body = args.next()??;
            let numkeys = args.next()??;
            let keys = numkeys.iter().try_fold(0u32, |n, d| {
                d.is_ascii_digit()
                    .then(|| n.saturating_mul(10).saturating_add(u32::from(d - b'0')))
            })?;
            if numkeys.is_empty() || keys == 0 {
                return None;
            }
            args.next()?
        }
        b"GET" | b"SET" | b"SETEX" | b"SETNX" | b"PSETEX" | b"GETDEL" | b"INCR" | b"INCRBY"
        | b"DECR" | b"DECRBY" | b"EXPIRE" | b"PEXPIRE" | b"TTL" | b"PTTL" | b"TYPE" | b"HGET"
        | b"HSET" | b"HMGET" | b"HGETALL" | b"HDEL" | b"HINCRBY" | b"HLEN" | b"HEXISTS"
        | b"SADD" | b"SREM" | b"SMEMBERS" | b"SISMEMBER" | b"SCARD" | b"ZADD" | b"ZREM"
        | b"ZRANK" | b"ZREVRANK" | b"ZCOUNT" | b"ZCARD" | b"ZSCORE" | b"ZMSCORE" | b"ZRANGE"
        | b"ZRANGEBYSCORE" | b"ZRANDMEMBER" | b"ZINCRBY" => args.next()?,
        _ => None,
    }
}

/// The slot of a pipeline whose commands all share one slot, else None. Transactions
/// (MULTI/EXEC) go through the cluster client.
fn pipeline_slot(pipe: &Pipeline) -> Option<u16> {
    if pipe.is_transaction() {
        return None;
    }
    // A `WAIT` names no key: it counts the writes sent before it on the same connection, so it
    // goes wherever they go.
    let mut cmds = pipe.cmd_iter().filter(|c| !is_wait(c));
    let first = super::keys::hashed_part(command_key(cmds.next()?)?);
    let slot = super::keys::slot_of(first);
    for cmd in cmds {
        // The same hash tag (the usual case: one shard's keys) is the same slot, without a CRC.
        let part = super::keys::hashed_part(command_key(cmd)?);
        if part != first && super::keys::slot_of(part) != slot {
            return None;
        }
    }
    Some(slot)
}

/// True for a `WAIT` command.
fn is_wait(cmd: &Cmd) -> bool {
    matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"WAIT"))
}

/// Errors the cluster client handles by retrying (elsewhere, later or after reconnecting):
/// a direct attempt that meets one is sent again through it.
fn needs_cluster(err: &RedisError) -> bool {
    match err.kind() {
        ErrorKind::Server(kind) => redirect_kind(kind),
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
        _ => err.is_timeout() || err.is_connection_dropped() || err.is_unrecoverable_error(),
    }
}

fn redirect_kind(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::BusyLoading
    )
}

/// True when a reply is an error the cluster client would have retried.
fn redirect_value(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind().is_some_and(redirect_kind))
}

/// What a direct attempt's result means: `Some` to answer with, or None to send the request
/// again through the cluster client (the map forgotten, and the connection if it failed).
///
/// A timeout is answered, not sent again: the cluster client does not retry one either (its
/// whole-request timeout is the response timeout), and a write that timed out may still run on
/// its node. The map and the connection are forgotten all the same, so the next requests go
/// through the cluster client until the map is read again (a frozen primary replaced by its
/// replica is then left behind).
fn settle<T>(
    groups: &NodeGroups,
    node: &NodeHandles,
    result: RedisResult<T>,
    redirect: fn(&T) -> bool,
) -> Option<RedisResult<T>> {
    match result {
        Ok(v) if redirect(&v) => {
            node.sent_again.increment(1);
            groups.failed(&node.addr, None);
            None
        }
        Err(e) if e.is_timeout() => {
            node.timed_out.increment(1);
            groups.failed(&node.addr, Some(&e));
            Some(Err(e))
        }
        Err(e) if needs_cluster(&e) => {
            node.sent_again.increment(1);
            groups.failed(&node.addr, Some(&e));
            None
        }
        answer => {
            node.answered.increment(1);
            Some(answer)
        }
    }
}

/// One command on a cluster: straight to its primary when the map knows it, else (or after a
/// failure the cluster client handles) through the cluster client.
pub(super) fn cluster_command<'a>(
    cluster: &'a Arc<Watched>,
    groups: &'a Arc<NodeGroups>,
    cmd: &'a Cmd,
) -> RedisFuture<'a, Value> {
    Box::pin(async move {
        if let Some((handles, mut node)) =
            command_slot(cmd).and_then(|slot| groups.direct_to(slot, cluster))
        {
            let sent = node.req_packed_command(cmd).await;
            if let Some(answer) = settle(groups, &handles, sent, redirect_value) {
                return answer;
            }
        }
        cluster
            .run(|mut c| async move { c.req_packed_command(cmd).await })
            .await
    })
}

/// A pipeline on a cluster, as [`cluster_command`]: direct when all its commands share a slot.
pub(super) fn cluster_pipeline<'a>(
    cluster: &'a Arc<Watched>,
    groups: &'a Arc<NodeGroups>,
    pipe: &'a Pipeline,
    offset: usize,
    count: usize,
) -> RedisFuture<'a, Vec<Value>> {
    Box::pin(async move {
        if let Some(answer) = direct_pipeline(cluster, groups, pipe, offset, count).await {
            return answer;
        }
        cluster
            .run(|mut c| async move { c.req_packed_commands(pipe, offset, count).await })
            .await
    })
}

/// A pipeline whose commands all share a slot, sent straight to the primary serving it when the
/// map knows one: `Some` to answer with, or None to send it through the cluster client (no
/// direct connection, or a failure the cluster client handles; see [`settle`]).
pub(super) async fn direct_pipeline(
    cluster: &Arc<Watched>,
    groups: &Arc<NodeGroups>,
    pipe: &Pipeline,
    offset: usize,
    count: usize,
) -> Option<RedisResult<Vec<Value>>> {
    let (handles, mut node) =
        pipeline_slot(pipe).and_then(|slot| groups.direct_to(slot, cluster))?;
    let sent = node.req_packed_commands(pipe, offset, count).await;
    let redirected = |values: &Vec<Value>| values.iter().any(redirect_value);
    settle(groups, &handles, sent, redirected)
}

/// Runs read-only single-key commands (`(slot of the key, command)`) and returns their replies
/// in order: one pipeline per node on a cluster, one pipeline in all on a single Redis.
pub async fn read_grouped(
    conn: &RedisConn,
    cmds: Vec<(u16, Cmd)>,
) -> Result<Vec<Value>, RedisError> {
    let (cluster, groups) = match conn {
        RedisConn::Single(c) => {
            let mut pipe = redis::pipe();
            for (_, cmd) in cmds {
                pipe.add_command(cmd);
            }
            return pipe.query_async(&mut c.clone()).await;
        }
        RedisConn::Cluster(c, g) => (c, g),
    };
    let slots: Vec<u16> = cmds.iter().map(|(s, _)| *s).collect();
    let batches = groups.group(&slots, cluster);
    let cmds = &cmds;
    let sent = batches.into_iter().map(|batch| {
        let mut c = conn.clone();
        async move {
            let idx = batch.idx;
            if idx.len() > 1 || batch.direct.is_some() {
                let mut pipe = redis::pipe();
                for i in &idx {
                    pipe.add_command(cmds[*i].1.clone());
                }
                let sent = match batch.direct {
                    Some((handles, mut node)) => {
                        let sent = node.req_packed_commands(&pipe, 0, idx.len()).await;
                        let redirected = |values: &Vec<Value>| values.iter().any(redirect_value);
                        // None: a redirect or a fault; the commands go one by one below.
                        settle(groups, &handles, sent, redirected).unwrap_or_else(|| {
                            Err(RedisError::from((
                                ErrorKind::Client,
                                "sent again one by one",
                            )))
                        })
                    }
                    None => {
                        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(
                            cmds[idx[0]].0,
                            SlotAddr::ReplicaOptional,
                        ));
                        let count = idx.len();
                        cluster
                            .run(|mut c| async move {
                                c.route_pipeline(pipe, 0, count, route).await
                            })
                            .await
                    }
                };
                match sent {
                    Ok(values) if !values.iter().any(|v| matches!(v, Value::ServerError(_))) => {
                        return Ok::<_, RedisError>(idx.into_iter().zip(values).collect());
                    }
                    // A key that moved (or a fault): one by one, as without grouping.
                    _ => groups.invalidate(),
                }
            }
            let mut out = Vec::with_capacity(idx.len());
            for i in idx {
                let v = cmds[i].1.query_async::<Value>(&mut c).await?;
                out.push((i, v));
            }
            Ok(out)
        }
    });
    let mut replies: Vec<Option<Value>> = vec![None; cmds.len()];
    for batch in try_join_all(sent).await? {
        for (i, v) in batch {
            replies[i] = Some(v);
        }
    }
    Ok(replies
        .into_iter()
        .map(|v| v.unwrap_or(Value::Nil))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(ranges: Vec<Vec<(u16, u16)>>) -> Map {
        Map::new(
            Instant::now(),
            ranges
                .into_iter()
                .enumerate()
                .map(|(i, r)| (format!("n{i}:1"), r, None))
                .collect(),
        )
    }

    fn idx(groups: Vec<Group>) -> Vec<Vec<usize>> {
        groups.into_iter().map(|g| g.idx).collect()
    }

    #[test]
    fn commands_are_grouped_by_the_primary_serving_their_slot() {
        let m = map(vec![
            vec![(0, 5460)],
            vec![(5461, 10922)],
            vec![(10923, 16383)],
        ]);
        let groups = idx(group(Some(&m), &[100, 6000, 200, 16000, 5461]));
        assert_eq!(groups, vec![vec![0, 2], vec![1, 4], vec![3]]);
        // No map yet: every command alone.
        assert_eq!(idx(group(None, &[1, 2])), vec![vec![0], vec![1]]);
        // A slot nobody claims (a map read mid-migration): alone too.
        let partial = map(vec![vec![(0, 99)]]);
        assert_eq!(
            idx(group(Some(&partial), &[5, 500, 7])),
            vec![vec![0, 2], vec![1]]
        );
    }

    #[test]
    fn only_commands_with_one_known_slot_go_direct() {
        let key = "wr:{e:1}:w";
        let slot = super::super::keys::slot(key);
        let mut zrank = redis::cmd("ZRANK");
        zrank.arg(key).arg("m");
        assert_eq!(command_slot(&zrank), Some(slot));
        let mut lower = redis::cmd("zcount");
        lower.arg(key).arg("-inf").arg("+inf");
        assert_eq!(command_slot(&lower), Some(slot));
        let mut script = redis::cmd("EVALSHA");
        script.arg("abc").arg(2).arg(key).arg("wr:{e:1}:s").arg("x");
        assert_eq!(command_slot(&script), Some(slot));
        let mut keyless = redis::cmd("EVALSHA");
        keyless.arg("abc").arg(0).arg("x");
        assert_eq!(command_slot(&keyless), None);
        let mut zero = redis::cmd("EVALSHA");
        zero.arg("abc").arg("00").arg("x");
        assert_eq!(command_slot(&zero), None);
        let mut longest = redis::cmd("ZRANGEBYSCORE");
        longest.arg(key).arg(0).arg(1);
        assert_eq!(command_slot(&longest), Some(slot));
        let mut too_long = redis::cmd("ZRANGEBYSCORE_XYZW");
        too_long.arg(key);
        assert_eq!(command_slot(&too_long), None);
        // Several keys, possibly in several slots: the cluster client splits or refuses them.
        let mut del = redis::cmd("DEL");
        del.arg(key).arg("other");
        assert_eq!(command_slot(&del), None);
        assert_eq!(command_slot(&redis::cmd("PING")), None);
        assert_eq!(command_slot(&redis::cmd("GET")), None, "no key");

        let mut same = redis::pipe();
        same.add_command(zrank.clone()).add_command(lower);
        assert_eq!(pipeline_slot(&same), Some(slot));
        let mut other = redis::cmd("GET");
        other.arg("wr:{e:2}:x");
        let mut mixed = redis::pipe();
        mixed.add_command(zrank.clone()).add_command(other);
        assert_eq!(pipeline_slot(&mixed), None);
        let mut atomic = redis::pipe();
        atomic.atomic().add_command(zrank.clone());
        assert_eq!(pipeline_slot(&atomic), None);

        // A `WAIT` names no key: it goes with the pipeline's other commands (a probe write and
        // a check, `RedisConn::wait_replicated`), and alone it goes nowhere direct.
        let mut waited = redis::pipe();
        waited
            .add_command(zrank)
            .add_command(script.clone())
            .cmd("wait")
            .arg(1)
            .arg(100);
        assert_eq!(pipeline_slot(&waited), Some(slot));
        let mut wait_alone = redis::pipe();
        wait_alone.cmd("WAIT").arg(1).arg(100);
        assert_eq!(pipeline_slot(&wait_alone), None);
        let mut not_wait = redis::pipe();
        not_wait
            .add_command(script)
            .cmd("WAITAOF")
            .arg(1)
            .arg(1)
            .arg(100);
        assert_eq!(pipeline_slot(&not_wait), None, "only WAIT itself");
    }

    #[test]
    fn redirects_and_broken_connections_go_back_to_the_cluster_client() {
        let moved = RedisError::from((ErrorKind::Server(ServerErrorKind::Moved), "MOVED"));
        assert!(needs_cluster(&moved));
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert!(needs_cluster(&io));
        let noscript = RedisError::from((ErrorKind::Server(ServerErrorKind::NoScript), "NOSCRIPT"));
        assert!(!needs_cluster(&noscript), "Script::invoke_async loads it");
        let wrong = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "WRONGTYPE",
        ));
        assert!(!needs_cluster(&wrong), "an answer, not a routing fault");
    }
}
