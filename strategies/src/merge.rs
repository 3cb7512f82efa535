//! K-way merge of shard heads: whom to admit next, in global order.
//!
//! The admission scheduler reads the first `k` members of every shard (a prefix, possibly the
//! whole shard) and asks [`merge_heads`] for the next `take` people in global [`OrderKey`] order.
//!
//! Invariant: the merge never guesses past what it was shown. When a shard's prefix is used up
//! and the shard holds more than the prefix, the next person of that shard is unknown and might
//! come before everyone left in the other prefixes — so the merge stops there. Reading `take`
//! heads from every shard always allows `take` picks, because each pick consumes one head.

use crate::OrderKey;

/// The first members of one shard, in the shard's own order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardHeads {
    /// `(score, member)` pairs in ascending order, as `ZRANGE … WITHSCORES` returns them.
    pub heads: Vec<(f64, String)>,
    /// True when `heads` is the whole shard (nothing more behind it).
    pub complete: bool,
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
    pub last: (f64, String),
}

/// Picks the next `take` people over all shards in global order.
///
/// Returns the picks in global order (one [`OrderKey`] per person) — callers group them by shard
/// with [`group_by_shard`].
pub fn merge_heads(shards: &[ShardHeads], take: usize) -> Vec<OrderKey> {
    let mut cursor = vec![0usize; shards.len()];
    let mut out = Vec::with_capacity(take);
    while out.len() < take {
        let mut best: Option<OrderKey> = None;
        for (i, s) in shards.iter().enumerate() {
            match s.heads.get(cursor[i]) {
                Some((score, member)) => {
                    let key = OrderKey {
                        score: *score,
                        shard: i,
                        member: member.clone(),
                    };
                    if best.as_ref().is_none_or(|b| key < *b) {
                        best = Some(key);
                    }
                }
                // An exhausted prefix of a shard that has more: its next member is unknown.
                None if !s.complete => return out,
                None => {}
            }
        }
        match best {
            Some(k) => {
                cursor[k.shard] += 1;
                out.push(k);
            }
            None => break,
        }
    }
    out
}

/// Groups global-order picks by shard: one [`ShardPick`] per shard that admits anyone.
pub fn group_by_shard(picks: &[OrderKey]) -> Vec<ShardPick> {
    let mut by: Vec<ShardPick> = Vec::new();
    for k in picks {
        match by.iter_mut().find(|p| p.shard == k.shard) {
            Some(p) => {
                p.count += 1;
                p.last = (k.score, k.member.clone());
            }
            None => by.push(ShardPick {
                shard: k.shard,
                count: 1,
                last: (k.score, k.member.clone()),
            }),
        }
    }
    by.sort_by_key(|p| p.shard);
    by
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        let picks: Vec<_> = merge_heads(&shards, 10)
            .into_iter()
            .map(|k| k.member)
            .collect();
        assert_eq!(picks, vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn merge_stops_where_an_incomplete_prefix_runs_out() {
        // Shard 1 showed one head but has more; after "b" its next member is unknown.
        let shards = vec![
            shard(&[(1.0, "a"), (5.0, "e"), (6.0, "f")], true),
            shard(&[(2.0, "b")], false),
        ];
        let picks: Vec<_> = merge_heads(&shards, 10)
            .into_iter()
            .map(|k| k.member)
            .collect();
        assert_eq!(picks, vec!["a", "b"]);
    }

    #[test]
    fn group_by_shard_counts_and_bounds_each_shard() {
        let shards = vec![
            shard(&[(1.0, "a"), (3.0, "c")], true),
            shard(&[(2.0, "b")], true),
        ];
        let groups = group_by_shard(&merge_heads(&shards, 3));
        assert_eq!(
            groups,
            vec![
                ShardPick {
                    shard: 0,
                    count: 2,
                    last: (3.0, "c".into())
                },
                ShardPick {
                    shard: 1,
                    count: 1,
                    last: (2.0, "b".into())
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
            let mut shards: Vec<Vec<(f64, String)>> = vec![Vec::new(); n];
            for (i, (score, s)) in line.iter().enumerate() {
                shards[*s].push((*score as f64, format!("m{i:04}")));
            }
            let mut all: Vec<OrderKey> = Vec::new();
            for (s, items) in shards.iter_mut().enumerate() {
                items.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
                all.extend(items.iter().map(|(sc, m)| OrderKey { score: *sc, shard: s, member: m.clone() }));
            }
            all.sort();
            let heads: Vec<ShardHeads> = shards
                .iter()
                .map(|items| ShardHeads {
                    heads: items.iter().take(take).cloned().collect(),
                    complete: items.len() <= take,
                })
                .collect();
            let picks = merge_heads(&heads, take);
            let expected: Vec<OrderKey> = all.into_iter().take(take).collect();
            prop_assert_eq!(picks, expected);
        }
    }
}
