//! The `timestamp` strategy: exact position from per-shard counts.
//!
//! The score is the arrival time (microseconds, strictly increasing per service instance). The
//! position of a person at key `(score s, shard i, member m)` is one plus the number of people
//! whose [`crate::OrderKey`] is smaller:
//! - in a shard `j < i`: members with score `<= s` (`ZCOUNT key -inf s`),
//! - in a shard `j > i`: members with score `< s` (`ZCOUNT key -inf (s`),
//! - in the own shard: the member's rank (`ZRANK`), which breaks score ties by member like
//!   [`crate::OrderKey`] does.

/// The score bound to count with in shard `other`, for a person in shard `mine` with score
/// `score`: `(inclusive, score)`. Inclusive for shards before mine (their ties come first).
pub fn count_bound(mine: usize, other: usize, score: f64) -> (bool, f64) {
    (other < mine, score)
}

/// The 1-based position: own rank plus everyone counted ahead in other shards.
pub fn position(own_rank: u64, ahead_in_other_shards: &[u64]) -> u64 {
    1 + own_rank + ahead_in_other_shards.iter().sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OrderKey;
    use proptest::prelude::*;

    proptest! {
        /// Counting with `count_bound` over every shard gives each person exactly their index
        /// in the global order, plus one: positions are 1..W with no gaps and no duplicates.
        #[test]
        fn positions_are_exactly_one_to_w(line in prop::collection::vec((0u32..20, 0usize..5), 1..120)) {
            let n = 5;
            let keys: Vec<OrderKey> = line
                .iter()
                .enumerate()
                .map(|(i, (s, shard))| OrderKey { score: *s as f64, shard: *shard, member: format!("m{i:04}") })
                .collect();
            let mut sorted = keys.clone();
            sorted.sort();
            for k in &keys {
                let own_rank = keys.iter().filter(|o| o.shard == k.shard && (o.score, &o.member) < (k.score, &k.member)).count() as u64;
                let others: Vec<u64> = (0..n)
                    .filter(|j| *j != k.shard)
                    .map(|j| {
                        let (incl, bound) = count_bound(k.shard, j, k.score);
                        keys.iter().filter(|o| o.shard == j && (o.score < bound || (incl && o.score == bound))).count() as u64
                    })
                    .collect();
                let expected = sorted.iter().position(|o| o == k).unwrap() as u64 + 1;
                prop_assert_eq!(position(own_rank, &others), expected);
            }
        }
    }
}
