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
//! slot owners of `CLUSTER SLOTS`), and while one of them uses
//! `WAITROOM_REDIS_ENTER_MEMORY_PERCENT` or more of its `maxmemory`, an enter of someone who is
//! not in the line of an event whose line has a slot on that primary answers 503
//! `unavailable` with a longer Retry-After ([`crate::queue::QueueError::Full`]). The events
//! whose lines live on other primaries take new people as before: one event's line that filled
//! its node does not close the door of every event. Someone already waiting or admitted who
//! enters again gets their standing as always; polls, leaves, admission, holds and bookings go
//! on in the headroom left. The gate opens again at the first read below the line (people
//! admitted and gone free their places).
//!
//! The headroom must hold what the line adds between two reads plus what the sale writes:
//! docs/operations.md, "WaitroomTurningPeopleAway", has the arithmetic. A node that does not
//! answer keeps its last figures (its own requests fail on their own); a node with no
//! `maxmemory` never closes the gate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use super::nodes::{ask_node, host_port, NodeInfo};
use super::{primary_slots, RedisConn, SlotOwners};
use crate::config::RedisConfig;
use crate::telemetry;

/// Every slot: what one Redis outside a cluster serves.
const ALL_SLOTS: (u16, u16) = (0, 16383);

/// Whether new people may enter, as the last read of the primaries' memory found.
pub struct MemoryGuard {
    /// At or above this percentage of `maxmemory` on any primary, new people are turned away
    /// (0: never).
    percent: u8,
    /// Some primary is at or above the line: the one check on an enter while all is well.
    closed: AtomicBool,
    /// The slot ranges of the primaries at or above the line (empty while open).
    full: RwLock<Vec<(u16, u16)>>,
}

impl MemoryGuard {
    /// A guard closing at `percent` of `maxmemory` (0: a guard that never closes).
    pub fn new(percent: u8) -> Self {
        MemoryGuard {
            percent,
            closed: AtomicBool::new(false),
            full: RwLock::new(Vec::new()),
        }
    }

    /// True while some primary is at or above the line, so the people new to a line there are
    /// turned away.
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Whether someone new to a line that writes into `slots` is turned away now: some slot is
    /// served by a primary at or above the line.
    pub fn turns_away(&self, slots: impl IntoIterator<Item = u16>) -> bool {
        if !self.closed() {
            return false;
        }
        let full = self.full.read().unwrap_or_else(PoisonError::into_inner);
        slots
            .into_iter()
            .any(|slot| full.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)))
    }

    /// Whether the guard reads anything at all.
    pub fn enabled(&self) -> bool {
        self.percent > 0
    }

    /// Judges the primaries' `(used_memory, maxmemory, slot ranges)`: closed for the slots of
    /// every node with a `maxmemory` that uses `percent` of it or more. Returns whether any
    /// node is.
    pub fn judge<'a>(&self, nodes: impl IntoIterator<Item = (u64, u64, &'a [(u16, u16)])>) -> bool {
        let percent = u128::from(self.percent);
        let full: Vec<(u16, u16)> = if percent == 0 {
            Vec::new()
        } else {
            nodes
                .into_iter()
                .filter(|&(used, max, _)| {
                    max > 0 && u128::from(used) * 100 >= u128::from(max) * percent
                })
                .flat_map(|(_, _, ranges)| ranges.iter().copied())
                .collect()
        };
        let closed = !full.is_empty();
        // The ranges first: a reader that sees `closed` finds them.
        *self.full.write().unwrap_or_else(PoisonError::into_inner) = full;
        let was = self.closed.swap(closed, Ordering::Relaxed);
        if closed != was {
            if closed {
                tracing::warn!(
                    percent = self.percent,
                    "memory guard: a Redis primary is near its maxmemory; new people are turned away from the lines on it"
                );
            } else {
                tracing::info!("memory guard: memory is below the line again; enters are open");
            }
        }
        metrics::gauge!(telemetry::MEMORY_GUARD_CLOSED).set(if closed { 1.0 } else { 0.0 });
        metrics::gauge!(telemetry::MEMORY_GUARD_LINE).set(f64::from(self.percent) / 100.0);
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
        metrics::gauge!(telemetry::MEMORY_GUARD_LINE).set(0.0);
        return;
    }
    guard.judge([]);
    let every = Duration::from_millis(cfg.memory_check_ms);
    let seed = cfg.nodes.first().cloned().unwrap_or_default();
    let mut conns: HashMap<String, MultiplexedConnection> = HashMap::new();
    let mut last: HashMap<String, (u64, u64)> = HashMap::new();
    let mut owners: SlotOwners = Vec::new();
    let mut info = redis::pipe();
    info.cmd("INFO").arg("memory");
    loop {
        // The primaries that serve slots, as the service's own placement reads them. A read
        // that fails keeps the last owners and figures.
        let read = match primary_slots(&mut conn.clone()).await {
            Ok(Some(now)) => {
                owners = now;
                last.retain(|a, _| owners.iter().any(|(o, _)| o == a));
                conns.retain(|a, _| owners.iter().any(|(o, _)| o == a));
                true
            }
            Ok(None) => {
                owners = vec![(host_port(&seed).to_owned(), vec![ALL_SLOTS])];
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "memory guard: CLUSTER SLOTS failed");
                false
            }
        };
        for (addr, _) in owners.iter().filter(|_| read) {
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
        guard.judge(owners.iter().filter_map(|(addr, ranges)| {
            let &(used, max) = last.get(addr)?;
            Some((used, max, ranges.as_slice()))
        }));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[(u16, u16)] = &[(0, 5460)];
    const B: &[(u16, u16)] = &[(5461, 10922), (16000, 16383)];

    #[test]
    fn the_gate_closes_at_the_percentage_of_any_node_with_a_maxmemory() {
        let g = MemoryGuard::new(90);
        assert!(!g.judge([(899, 1000, A), (10, 1000, B)]));
        assert!(g.judge([(10, 1000, A), (900, 1000, B)]));
        assert!(g.closed());
        // Opens again at the first read below the line.
        assert!(!g.judge([(10, 1000, A), (899, 1000, B)]));
        // No maxmemory: no limit, however much is used.
        assert!(!g.judge([(u64::MAX, 0, A)]));
        // Figures near u64::MAX do not overflow.
        assert!(g.judge([(u64::MAX, u64::MAX, A)]));
        assert!(!g.judge([]));
    }

    #[test]
    fn only_lines_with_a_slot_on_a_full_node_turn_people_away() {
        let g = MemoryGuard::new(80);
        assert!(!g.turns_away([0, 6000]), "open: nobody");
        assert!(g.judge([(10, 1000, A), (800, 1000, B)]));
        assert!(
            !g.turns_away([0, 100, 5460]),
            "every slot on the node below the line"
        );
        assert!(g.turns_away([5461]), "the first slot of B");
        assert!(g.turns_away([0, 16383]), "one slot of B among others");
        assert!(g.turns_away([10922]));
        assert!(
            !g.turns_away([10923, 15999]),
            "the slots between B's ranges are no one's here"
        );
        assert!(!g.turns_away([]), "a line with no slot");
        // Both full, then open again.
        assert!(g.judge([(800, 1000, A), (800, 1000, B)]));
        assert!(g.turns_away([0]));
        assert!(!g.judge([(10, 1000, A), (10, 1000, B)]));
        assert!(!g.turns_away([0, 5461]));
        // One Redis outside a cluster serves every slot.
        assert!(g.judge([(900, 1000, &[ALL_SLOTS][..])]));
        assert!(g.turns_away([12345]));
    }

    #[test]
    fn a_guard_at_zero_never_closes() {
        let g = MemoryGuard::new(0);
        assert!(!g.enabled());
        assert!(!g.judge([(1000, 1000, A)]));
        assert!(!g.closed());
        assert!(!g.turns_away([0]));
    }
}
