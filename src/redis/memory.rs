//! The memory guard: new people are turned away before Redis is full, so the sale goes on.
//!
//! A line runs under `noeviction` (an evicted key would be a lost place), and a primary at its
//! `maxmemory` then refuses every write: `OOM command not allowed`. Almost every request of a
//! sale writes: the admission tick, a poll's last-seen record, a hold, a booking's record. So a
//! line left to grow until a node is full stops the whole sale on that node, the people already
//! admitted included: their holds and bookings answer 503 until memory is freed by hand.
//!
//! The line is the one thing that grows with demand. The guard stops it first: every
//! `WAITROOM_REDIS_MEMORY_CHECK_MS` each instance reads `INFO memory` of every primary (the
//! slot owners of `CLUSTER SLOTS`), and
//! while one of them uses `WAITROOM_REDIS_ENTER_MEMORY_PERCENT` or more of its `maxmemory`,
//! an enter of someone who is not in the line answers 503 `unavailable` with a longer
//! Retry-After ([`crate::queue::QueueError::Full`]). Someone already waiting or admitted who
//! enters again gets their standing as always; polls, leaves, admission, holds and bookings
//! go on in the headroom left. The gate opens again at the first read below the line (people
//! admitted and gone free their places).
//!
//! The headroom must hold what the line adds between two reads plus what the sale writes:
//! docs/operations.md, "WaitroomTurningPeopleAway", has the arithmetic. A node that does not
//! answer keeps its last figures (its own requests fail on their own); a node with no
//! `maxmemory` never closes the gate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use super::nodes::{ask_node, host_port, NodeInfo};
use super::{primary_addrs, RedisConn};
use crate::config::RedisConfig;
use crate::telemetry;

/// Whether new people may enter, as the last read of the primaries' memory found.
pub struct MemoryGuard {
    /// At or above this percentage of `maxmemory` on any primary, new people are turned away
    /// (0: never).
    percent: u8,
    closed: AtomicBool,
}

impl MemoryGuard {
    /// A guard closing at `percent` of `maxmemory` (0: a guard that never closes).
    pub fn new(percent: u8) -> Self {
        MemoryGuard {
            percent,
            closed: AtomicBool::new(false),
        }
    }

    /// True while new people are turned away.
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Whether the guard reads anything at all.
    pub fn enabled(&self) -> bool {
        self.percent > 0
    }

    /// Judges the primaries' `(used_memory, maxmemory)`: closed when any node with a
    /// `maxmemory` uses `percent` of it or more. Returns the new state.
    pub fn judge(&self, nodes: impl IntoIterator<Item = (u64, u64)>) -> bool {
        let percent = u128::from(self.percent);
        let closed = percent > 0
            && nodes
                .into_iter()
                .any(|(used, max)| max > 0 && u128::from(used) * 100 >= u128::from(max) * percent);
        let was = self.closed.swap(closed, Ordering::Relaxed);
        if closed != was {
            if closed {
                tracing::warn!(
                    percent = self.percent,
                    "memory guard: a Redis primary is near its maxmemory; new people are turned away"
                );
            } else {
                tracing::info!("memory guard: memory is below the line again; enters are open");
            }
        }
        metrics::gauge!(telemetry::MEMORY_GUARD_CLOSED).set(if closed { 1.0 } else { 0.0 });
        closed
    }
}

/// Reads every primary's memory every `cfg.memory_check_ms` until `shutdown`, and tells
/// `guard`.
pub async fn watch(
    guard: Arc<MemoryGuard>,
    conn: RedisConn,
    cfg: RedisConfig,
    shutdown: CancellationToken,
) {
    if !guard.enabled() {
        return;
    }
    guard.judge([]);
    let every = Duration::from_millis(cfg.memory_check_ms);
    let seed = cfg.nodes.first().cloned().unwrap_or_default();
    let mut conns: HashMap<String, MultiplexedConnection> = HashMap::new();
    let mut last: HashMap<String, (u64, u64)> = HashMap::new();
    let mut info = redis::pipe();
    info.cmd("INFO").arg("memory");
    loop {
        // The primaries that serve slots, as the service's own placement reads them; a read
        // that fails keeps the last figures.
        let addrs = match primary_addrs(&mut conn.clone()).await {
            Ok(Some(addrs)) => {
                last.retain(|a, _| addrs.contains(a));
                conns.retain(|a, _| addrs.contains(a));
                addrs
            }
            Ok(None) => vec![host_port(&seed).to_owned()],
            Err(e) => {
                tracing::warn!(error = %e, "memory guard: CLUSTER SLOTS failed");
                Vec::new()
            }
        };
        for addr in &addrs {
            match ask_node::<(String,)>(&mut conns, &cfg, &seed, addr, &info).await {
                Ok((text,)) => {
                    let node = NodeInfo::parse(&text);
                    let figure = |name| node.number(name).map_or(0, |v| v as u64);
                    last.insert(addr.clone(), (figure("used_memory"), figure("maxmemory")));
                }
                Err(e) => {
                    tracing::debug!(addr = %addr, error = %e, "memory guard: no answer");
                    conns.remove(addr);
                }
            }
        }
        guard.judge(last.values().copied());
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_closes_at_the_percentage_of_any_node_with_a_maxmemory() {
        let g = MemoryGuard::new(90);
        assert!(!g.judge([(899, 1000), (10, 1000)]));
        assert!(g.judge([(10, 1000), (900, 1000)]));
        assert!(g.closed());
        // Opens again at the first read below the line.
        assert!(!g.judge([(10, 1000), (899, 1000)]));
        // No maxmemory: no limit, however much is used.
        assert!(!g.judge([(u64::MAX, 0)]));
        // Figures near u64::MAX do not overflow.
        assert!(g.judge([(u64::MAX, u64::MAX)]));
        assert!(!g.judge([]));
    }

    #[test]
    fn a_guard_at_zero_never_closes() {
        let g = MemoryGuard::new(0);
        assert!(!g.enabled());
        assert!(!g.judge([(1000, 1000)]));
        assert!(!g.closed());
    }
}
