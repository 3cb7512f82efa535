//! The `hybrid` policy: exact positions (`timestamp`) while they are cheap or the estimate is
//! not good enough; estimated positions (`statistical`) when the line is large and the measured
//! error of the estimate is within the event's budget.
//!
//! Inputs are measured, not assumed: the admission leader samples waiting people, computes both
//! the exact and the estimated position, and keeps a moving average of the relative error. The
//! other side of the budget is cost: an exact poll costs one command per shard, an estimated one
//! a single command, so estimating is worth its error only when exact polls cost more than
//! [`MIN_EXACT_COST`] commands; with fewer shards the policy stays exact whatever the size.
//! Hysteresis (enter below the budget, leave above 1.5 × budget or below 80 % of the size
//! threshold) keeps the mode from flapping when a figure hovers at a threshold.

use crate::StrategyKind;

/// Exact polls cheaper than this many Redis commands are never traded for estimates.
pub const MIN_EXACT_COST: u32 = 3;

/// Thresholds from the event configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridPolicy {
    /// Below this many waiting, positions are exact.
    pub min_waiting: u64,
    /// Largest tolerated mean relative error of the estimate (e.g. 0.02 = 2 %).
    pub max_relative_error: f64,
}

/// What the leader measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridInputs {
    /// People waiting now.
    pub waiting: u64,
    /// Moving average of |estimate − exact| / exact over sampled people; None before any sample.
    pub relative_error: Option<f64>,
    /// Redis commands an exact poll costs (one per shard).
    pub exact_cost: u32,
}

impl HybridPolicy {
    /// The strategy to use next, given the one in use now.
    pub fn decide(&self, current: StrategyKind, m: HybridInputs) -> StrategyKind {
        let estimated = current == StrategyKind::Statistical;
        let Some(err) = m.relative_error else {
            return StrategyKind::Timestamp;
        };
        if m.exact_cost < MIN_EXACT_COST {
            return StrategyKind::Timestamp;
        }
        if estimated {
            let too_small = (m.waiting as f64) < self.min_waiting as f64 * 0.8;
            let too_wrong = err > self.max_relative_error * 1.5;
            if too_small || too_wrong {
                StrategyKind::Timestamp
            } else {
                StrategyKind::Statistical
            }
        } else if m.waiting >= self.min_waiting && err <= self.max_relative_error {
            StrategyKind::Statistical
        } else {
            StrategyKind::Timestamp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StrategyKind::{Statistical, Timestamp};

    const P: HybridPolicy = HybridPolicy {
        min_waiting: 10_000,
        max_relative_error: 0.02,
    };

    fn m(waiting: u64, err: f64) -> HybridInputs {
        HybridInputs {
            waiting,
            relative_error: Some(err),
            exact_cost: 8,
        }
    }

    #[test]
    fn small_or_unmeasured_lines_are_exact() {
        assert_eq!(P.decide(Timestamp, m(9_999, 0.0)), Timestamp);
        assert_eq!(
            P.decide(
                Timestamp,
                HybridInputs {
                    waiting: 1_000_000,
                    relative_error: None,
                    exact_cost: 8,
                }
            ),
            Timestamp
        );
    }

    #[test]
    fn large_lines_with_a_good_estimate_are_estimated() {
        assert_eq!(P.decide(Timestamp, m(10_000, 0.01)), Statistical);
        assert_eq!(P.decide(Timestamp, m(50_000, 0.03)), Timestamp);
    }

    #[test]
    fn cheap_exact_polls_are_never_traded_for_estimates() {
        let two_shards = HybridInputs {
            waiting: 1_000_000,
            relative_error: Some(0.0),
            exact_cost: 2,
        };
        assert_eq!(P.decide(Timestamp, two_shards), Timestamp);
        assert_eq!(P.decide(Statistical, two_shards), Timestamp);
    }

    #[test]
    fn hysteresis_keeps_the_mode_near_the_thresholds() {
        assert_eq!(P.decide(Statistical, m(9_000, 0.025)), Statistical);
        assert_eq!(P.decide(Statistical, m(7_999, 0.01)), Timestamp);
        assert_eq!(P.decide(Statistical, m(20_000, 0.031)), Timestamp);
    }
}
