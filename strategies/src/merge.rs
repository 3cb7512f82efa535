//! K-way merge of shard heads: whom to admit next, in global order.
//!
//! The admission scheduler reads the first `k` members of every shard (a prefix, possibly the
//! whole shard) and asks [`merge_heads`] for the next `take` people in global [`OrderKey`] order.
//!
//! Invariant: the merge never guesses past what it was shown. When a shard's prefix is used up
//! and the shard holds more than the prefix, the next person of that shard is unknown and might
//! come before everyone left in the other prefixes — so the merge stops there. Reading `take`
//! heads from every shard always allows `take` picks, because each pick consumes one head.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::OrderKey;

/// The first members of one shard, in the shard's own order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardHeads {
    /// `(score, member)` pairs in ascending order, as `ZRANGE … WITHSCORES` returns them.
    pub heads: Vec<(f64, String)>,
    /// True when `heads` is the whole shard (nothing more behind it).
    pub complete: bool,
}

/// One person picked by the merge: the `index`-th head of shard `shard`. Picks borrow nothing
/// and copy nothing: the member is looked up in the [`ShardHeads`] only where it is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Shard index.
    pub shard: usize,
    /// Index into that shard's heads.
    pub index: usize,
}

impl Pick {
    /// The picked person's order key (an owned copy of the member).
    pub fn key(&self, shards: &[ShardHeads]) -> OrderKey {
        let (score, member) = &shards[self.shard].heads[self.index];
        OrderKey {
            score: *score,
            shard: self.shard,
            member: member.clone(),
        }
    }
}

/// What to admit from one shard: the first `count` members, the last of which is `last`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardPick {
    /// Shard index.
    pub shard: usize,
    /// How many of the shard's head members to admit.
    pub count: usize,
    /// The last (largest) admitted key of this shard: the admission script admits only members
    /// at or before it, so a concurrent leave can never make it admit someone further back.
    /// `None` admits the first `count` whoever they are (round-robin, where no cross-shard
    /// order is kept).
    pub last: Option<(f64, String)>,
}

/// A shard's next head in the merge's heap, borrowing its member. Ordered as [`OrderKey`].
#[derive(Debug, PartialEq)]
struct Head<'a> {
    score: f64,
    shard: usize,
    member: &'a str,
    index: usize,
}

impl Eq for Head<'_> {}

impl PartialOrd for Head<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Head<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(self.shard.cmp(&other.shard))
            .then_with(|| self.member.cmp(other.member))
    }
}

impl<'a> Head<'a> {
    fn of(shards: &'a [ShardHeads], shard: usize, index: usize) -> Option<Reverse<Self>> {
        let (score, member) = shards[shard].heads.get(index)?;
        Some(Reverse(Head {
            score: *score,
            shard,
            member,
            index,
        }))
    }
}

/// Picks the next `take` people over all shards in global order: a heap of one head per shard,
/// O(take · log shards), no allocation per pick.
///
/// Returns the picks in global order — callers group them by shard with [`group_by_shard`].
pub fn merge_heads(shards: &[ShardHeads], take: usize) -> Vec<Pick> {
    let mut heap = BinaryHeap::with_capacity(shards.len());
    for (i, s) in shards.iter().enumerate() {
        match Head::of(shards, i, 0) {
            Some(h) => heap.push(h),
            // A shard that has people but showed none: its first member is unknown.
            None if !s.complete => return Vec::new(),
            None => {}
        }
    }
    let mut out = Vec::with_capacity(take.min(shards.iter().map(|s| s.heads.len()).sum()));
    while out.len() < take {
        let Some(Reverse(h)) = heap.pop() else { break };
        out.push(Pick {
            shard: h.shard,
            index: h.index,
        });
        match Head::of(shards, h.shard, h.index + 1) {
            Some(next) => heap.push(next),
            // An exhausted prefix of a shard that has more: its next member is unknown and
            // might come before everyone left in the other prefixes.
            None if !shards[h.shard].complete => break,
            None => {}
        }
    }
    out
}

/// Groups global-order picks by shard: one [`ShardPick`] per shard that admits anyone, with
/// only its last member copied.
pub fn group_by_shard(shards: &[ShardHeads], picks: &[Pick]) -> Vec<ShardPick> {
    let mut last = vec![None::<usize>; shards.len()];
    let mut count = vec![0usize; shards.len()];
    for p in picks {
        count[p.shard] += 1;
        last[p.shard] = Some(last[p.shard].map_or(p.index, |l| l.max(p.index)));
    }
    (0..shards.len())
        .filter_map(|shard| {
            let index = last[shard]?;
            let (score, member) = &shards[shard].heads[index];
            Some(ShardPick {
                shard,
                count: count[shard],
                last: Some((*score, member.clone())),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A line of people `(score, shard)` as per-shard sorted members, and the whole line in
    /// global order.
    fn line_of(line: &[(u32, usize)], n: usize) -> (Vec<Vec<(f64, String)>>, Vec<OrderKey>) {
        let mut shards: Vec<Vec<(f64, String)>> = vec![Vec::new(); n];
        for (i, (score, s)) in line.iter().enumerate() {
            shards[*s].push((*score as f64, format!("m{i:04}")));
        }
        let mut all: Vec<OrderKey> = Vec::new();
        for (s, items) in shards.iter_mut().enumerate() {
            items.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            all.extend(items.iter().map(|(sc, m)| OrderKey {
                score: *sc,
                shard: s,
                member: m.clone(),
            }));
        }
        all.sort();
        (shards, all)
    }

    fn members(shards: &[ShardHeads], picks: &[Pick]) -> Vec<String> {
        picks.iter().map(|p| p.key(shards).member).collect()
    }

    fn shard(items: &[(f64, &str)], complete: bool) -> ShardHeads {
        ShardHeads {
            heads: items.iter().map(|(s, m)| (*s, m.to_string())).collect(),
            complete,
        }
    }

    #[test]
    fn merge_takes_heads_in_global_order() {
        let shards = vec![
            shard(&[(1.0, "a"), (4.0, "d")], true),
            shard(&[(2.0, "b"), (3.0, "c")], true),
        ];
        let picks = members(&shards, &merge_heads(&shards, 10));
        assert_eq!(picks, vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn merge_stops_where_an_incomplete_prefix_runs_out() {
        // Shard 1 showed one head but has more; after "b" its next member is unknown.
        let shards = vec![
            shard(&[(1.0, "a"), (5.0, "e"), (6.0, "f")], true),
            shard(&[(2.0, "b")], false),
        ];
        let picks = members(&shards, &merge_heads(&shards, 10));
        assert_eq!(picks, vec!["a", "b"]);
    }

    #[test]
    fn group_by_shard_counts_and_bounds_each_shard() {
        let shards = vec![
            shard(&[(1.0, "a"), (3.0, "c")], true),
            shard(&[(2.0, "b")], true),
        ];
        let groups = group_by_shard(&shards, &merge_heads(&shards, 3));
        assert_eq!(
            groups,
            vec![
                ShardPick {
                    shard: 0,
                    count: 2,
                    last: Some((3.0, "c".into()))
                },
                ShardPick {
                    shard: 1,
                    count: 1,
                    last: Some((2.0, "b".into()))
                },
            ]
        );
    }

    proptest! {
        /// Merging `take`-long prefixes of every shard yields exactly the first `take` people of
        /// the globally sorted line: nobody skipped, nobody repeated, order preserved.
        #[test]
        fn merge_of_prefixes_equals_global_sort_prefix(
            line in prop::collection::vec((0u32..50, 0usize..6), 0..200),
            take in 0usize..80,
        ) {
            let n = 6;
            let (shards, all) = line_of(&line, n);
            let heads: Vec<ShardHeads> = shards
                .iter()
                .map(|items| ShardHeads {
                    heads: items.iter().take(take).cloned().collect(),
                    complete: items.len() <= take,
                })
                .collect();
            let picks: Vec<OrderKey> =
                merge_heads(&heads, take).iter().map(|p| p.key(&heads)).collect();
            let expected: Vec<OrderKey> = all.into_iter().take(take).collect();
            prop_assert_eq!(picks, expected);
        }

        /// Prefixes of any length, as the scheduler reads them (share + 6·√share + 16, not
        /// `take`): the merge returns a prefix of the global order, and stops exactly where the
        /// first incomplete prefix ran out — or takes `take` people when none ran out before.
        #[test]
        fn merge_of_short_prefixes_is_the_longest_safe_prefix_of_the_global_order(
            line in prop::collection::vec((0u32..50, 0usize..6), 0..200),
            lens in prop::collection::vec(0usize..40, 6),
            take in 0usize..80,
        ) {
            let n = 6;
            let (shards, all) = line_of(&line, n);
            let heads: Vec<ShardHeads> = shards
                .iter()
                .zip(&lens)
                .map(|(items, len)| ShardHeads {
                    heads: items.iter().take(*len).cloned().collect(),
                    complete: items.len() <= *len,
                })
                .collect();
            // The reference: walk the global order; stop at anyone not shown, or once a shard
            // whose prefix is used up (and has more) could hold the next person.
            let mut expected = Vec::new();
            let mut used = vec![0usize; n];
            for k in &all {
                if expected.len() == take { break; }
                if (0..n).any(|s| used[s] == heads[s].heads.len() && !heads[s].complete) { break; }
                if used[k.shard] >= heads[k.shard].heads.len() { break; }
                used[k.shard] += 1;
                expected.push(k.clone());
            }
            let picks: Vec<OrderKey> =
                merge_heads(&heads, take).iter().map(|p| p.key(&heads)).collect();
            prop_assert_eq!(picks, expected);
        }
    }
}
