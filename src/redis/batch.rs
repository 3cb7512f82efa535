//! Read-only commands to many shards, sent as one pipeline per node.
//!
//! An exact `timestamp` position is one count per other shard: N − 1 commands, each a round trip
//! of its own through the cluster client (routing, a channel, a timeout, a wake-up). The profile
//! in docs/benchmarks.md puts most of the service's CPU there, and Redis too spends more per
//! command when commands come one per read. redis-rs refuses a pipeline whose keys are in
//! different slots, even on one node, so the grouping is done here: keys are grouped by the
//! primary that serves their slot, from a `CLUSTER SLOTS` map kept for [`MAP_TTL`], and each
//! group is sent as one pipeline routed to its first key's slot (to the replicas when the
//! connection reads from replicas, exactly as a single read would go).
//!
//! A stale map can only put a key in the wrong group. Redis then answers MOVED for that key, and
//! the whole group is retried one command at a time (the client follows MOVED there) and the map
//! is refreshed. Failover keeps the groups intact: a promoted replica takes all its primary's
//! slots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, RedisError, Value};

use super::{primaries, RedisConn};

/// How long a slot map is used before it is read again.
pub const MAP_TTL: Duration = Duration::from_secs(10);

/// Slot ranges per primary, as last read.
type SlotMap = Arc<Vec<Vec<(u16, u16)>>>;

/// The cluster's slot-to-primary map, shared by every request.
#[derive(Default)]
pub struct NodeGroups {
    map: Mutex<Option<(Instant, SlotMap)>>,
    refreshing: AtomicBool,
}

impl NodeGroups {
    /// An empty map: read on first use.
    pub fn new() -> Self {
        NodeGroups::default()
    }

    /// The map to group by, read again when older than [`MAP_TTL`]. One request refreshes it
    /// while the others go on with the old one (or, before the first read, ungrouped).
    async fn current(&self, conn: &RedisConn) -> Option<SlotMap> {
        let cached = self.map.lock().expect("slot map").clone();
        let fresh = cached
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < MAP_TTL);
        if fresh || self.refreshing.swap(true, Ordering::AcqRel) {
            return cached.map(|(_, m)| m);
        }
        // Cleared however this ends: a request dropped mid-read (its client went away) must not
        // leave the flag set, or the map would never be read again.
        let _done = ClearOnDrop(&self.refreshing);
        let read = primaries(&mut conn.clone()).await;
        match read {
            Ok(ranges) if !ranges.is_empty() => {
                let map = Arc::new(ranges);
                *self.map.lock().expect("slot map") = Some((Instant::now(), map.clone()));
                Some(map)
            }
            _ => cached.map(|(_, m)| m),
        }
    }

    /// Forgets the map (a group met MOVED): the next request reads it again.
    fn invalidate(&self) {
        *self.map.lock().expect("slot map") = None;
    }

    /// Replaces the map, as if just read: for tests of a stale map.
    pub fn force(&self, ranges: Vec<Vec<(u16, u16)>>) {
        *self.map.lock().expect("slot map") = Some((Instant::now(), Arc::new(ranges)));
    }

    /// True while a map is held (false after a group met MOVED, until the next read).
    pub fn is_known(&self) -> bool {
        self.map.lock().expect("slot map").is_some()
    }
}

/// Clears a flag when dropped.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Which primary of `map` serves `slot`.
fn node_of(map: &[Vec<(u16, u16)>], slot: u16) -> Option<usize> {
    map.iter()
        .position(|ranges| ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)))
}

/// Groups command indices by node; commands whose slot no primary claims get a group each.
fn group(map: Option<&[Vec<(u16, u16)>]>, slots: &[u16]) -> Vec<Vec<usize>> {
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, slot) in slots.iter().enumerate() {
        let node = map
            .and_then(|m| node_of(m, *slot))
            .unwrap_or(usize::MAX - i);
        groups.entry(node).or_default().push(i);
    }
    let mut out: Vec<Vec<usize>> = groups.into_values().collect();
    out.sort();
    out
}

/// Runs read-only single-key commands (`(slot of the key, command)`) and returns their replies
/// in order: one pipeline per node on a cluster, one pipeline in all on a single Redis.
pub async fn read_grouped(
    conn: &RedisConn,
    groups: &NodeGroups,
    cmds: Vec<(u16, Cmd)>,
) -> Result<Vec<Value>, RedisError> {
    let cluster = match conn {
        RedisConn::Single(c) => {
            let mut pipe = redis::pipe();
            for (_, cmd) in cmds {
                pipe.add_command(cmd);
            }
            return pipe.query_async(&mut c.clone()).await;
        }
        RedisConn::Cluster(c) => c,
    };
    let slots: Vec<u16> = cmds.iter().map(|(s, _)| *s).collect();
    let map = groups.current(conn).await;
    let batches = group(map.as_deref().map(Vec::as_slice), &slots);
    let cmds = &cmds;
    let sent = batches.into_iter().map(|idx| {
        let mut c = cluster.clone();
        async move {
            if idx.len() > 1 {
                let mut pipe = redis::pipe();
                for i in &idx {
                    pipe.add_command(cmds[*i].1.clone());
                }
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(
                    cmds[idx[0]].0,
                    SlotAddr::ReplicaOptional,
                ));
                match c.route_pipeline(pipe, 0, idx.len(), route).await {
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

    #[test]
    fn commands_are_grouped_by_the_primary_serving_their_slot() {
        let map = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
        let groups = group(Some(&map), &[100, 6000, 200, 16000, 5461]);
        assert_eq!(groups, vec![vec![0, 2], vec![1, 4], vec![3]]);
        // No map yet: every command alone.
        assert_eq!(group(None, &[1, 2]), vec![vec![0], vec![1]]);
        // A slot nobody claims (a map read mid-migration): alone too.
        let partial = vec![vec![(0, 99)]];
        assert_eq!(
            group(Some(&partial), &[5, 500, 7]),
            vec![vec![0, 2], vec![1]]
        );
    }
}
