//! # waitroom-strategies: global order over a sharded waiting line
//!
//! A waiting line is spread over N Redis sorted sets ("shards"). A sorted set orders only its own
//! members, so the line has no global order by itself. This crate decides — from numbers that the
//! Redis layer reads for it (shard counts, shard heads, ranks) — what position to show a person and
//! whom to admit next. It does no I/O, so every rule here is unit- and property-tested in
//! microseconds.
//!
//! ## Layout
//! - [`StrategyKind`]: the four strategy names fixed by the HTTP contract.
//! - [`OrderKey`]: the stored order key of one person (score in the shard's sorted set, shard,
//!   member); its total order is the global arrival order all exact strategies agree on.
//! - [`merge`]: K-way merge of shard heads (admission for `timestamp` and `global_counter`).
//! - [`timestamp`]: exact position from per-shard counts of those ahead.
//! - [`global_counter`]: position from a dense arrival number and the first number waiting.
//! - [`statistical`]: estimated position from the own shard's rank and the line's total.
//! - [`round_robin`]: admission dealt over shards in rotation (`statistical`).
//! - [`hybrid`]: the policy that picks `timestamp` or `statistical` from measured error.
//!
//! ## Invariant
//! Every strategy reads the same stored key (arrival score per shard), so switching strategy
//! never re-queues anyone: only the way a position is computed and heads are picked changes.
//! Clock scores (µs) and counter numbers share one scale: a counter range starts above every
//! score already in the line (see the service's `queue::event`).

#![forbid(unsafe_code)]

pub mod global_counter;
pub mod hybrid;
pub mod merge;
pub mod round_robin;
pub mod statistical;
pub mod timestamp;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The ordering strategies an event can use (names fixed by shared/API.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    /// Arrival number from one cluster-wide counter; K-way merge of shard heads.
    GlobalCounter,
    /// Arrival time as score; position = sum over shards of those ahead; K-way merge.
    Timestamp,
    /// Position estimated from the own shard only; round-robin admission.
    Statistical,
    /// `timestamp` while exactness is cheap, `statistical` when the line is large and stable.
    Hybrid,
}

impl StrategyKind {
    /// All strategies, in the order the docs list them.
    pub const ALL: [StrategyKind; 4] = [
        StrategyKind::GlobalCounter,
        StrategyKind::Timestamp,
        StrategyKind::Statistical,
        StrategyKind::Hybrid,
    ];

    /// The wire name, as in shared/API.md.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::GlobalCounter => "global_counter",
            StrategyKind::Timestamp => "timestamp",
            StrategyKind::Statistical => "statistical",
            StrategyKind::Hybrid => "hybrid",
        }
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A strategy name that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStrategy(pub String);

impl fmt::Display for UnknownStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown strategy {:?}", self.0)
    }
}

impl std::error::Error for UnknownStrategy {}

impl FromStr for StrategyKind {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

/// The global order key of one waiting person.
///
/// Ordered by arrival score, then shard index, then member: the same tie-break that
/// [`timestamp::position`] counts with and [`merge::merge_heads`] admits with, so the position
/// shown and the admission order can never disagree.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderKey {
    /// Score in the shard's sorted set (arrival time in microseconds).
    pub score: f64,
    /// Shard index, 0-based.
    pub shard: usize,
    /// The member (ticket) in the sorted set.
    pub member: String,
}

impl Eq for OrderKey {}

impl PartialOrd for OrderKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then(self.shard.cmp(&other.shard))
            .then_with(|| self.member.cmp(&other.member))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_name_round_trips() {
        for k in StrategyKind::ALL {
            assert_eq!(k.as_str().parse::<StrategyKind>(), Ok(k));
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.as_str())
            );
        }
        assert_eq!(
            "fifo".parse::<StrategyKind>(),
            Err(UnknownStrategy("fifo".into()))
        );
    }

    #[test]
    fn order_key_breaks_score_ties_by_shard_then_member() {
        let k = |score, shard, m: &str| OrderKey {
            score,
            shard,
            member: m.into(),
        };
        assert!(k(1.0, 5, "z") < k(2.0, 0, "a"));
        assert!(k(1.0, 0, "z") < k(1.0, 1, "a"));
        assert!(k(1.0, 1, "a") < k(1.0, 1, "b"));
    }
}
