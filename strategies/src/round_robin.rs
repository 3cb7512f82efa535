//! Round-robin admission over shards (the `statistical` strategy's admission).
//!
//! Instead of merging shard heads by score, the budget is dealt to the shards one at a time in
//! rotation, skipping empty shards; each shard then admits its own first `k`. It needs no heads
//! from the other shards, and because tickets hash uniformly, each shard's front is close to the
//! global front. The rotation cursor persists across ticks so no shard is favoured by remainders.
//!
//! Drift: between any two shards the number admitted differs by at most one per round of
//! dealing, so no shard runs more than one person ahead of its fair share at any time (as long as
//! it has people waiting) — see the property test.

/// Deals `budget` admissions over shards with `waiting[i]` people, starting at `*cursor`.
/// Returns how many to admit from each shard and advances the cursor.
pub fn deal(waiting: &[u64], budget: u64, cursor: &mut usize) -> Vec<u64> {
    let n = waiting.len();
    let mut take = vec![0u64; n];
    if n == 0 {
        return take;
    }
    let mut left = budget.min(waiting.iter().sum());
    *cursor %= n;
    while left > 0 {
        let i = *cursor;
        if take[i] < waiting[i] {
            take[i] += 1;
            left -= 1;
        }
        *cursor = (i + 1) % n;
    }
    take
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn deals_evenly_and_skips_empty_shards() {
        let mut c = 0;
        assert_eq!(deal(&[5, 0, 5], 4, &mut c), vec![2, 0, 2]);
        assert_eq!(c, 0);
        assert_eq!(deal(&[5, 0, 5], 1, &mut c), vec![1, 0, 0]);
        assert_eq!(c, 1);
        assert_eq!(deal(&[1, 1], 10, &mut c), vec![1, 1]);
    }

    proptest! {
        /// Over many ticks, shards that still have people waiting never differ in admitted
        /// count by more than one: the documented drift bound.
        #[test]
        fn shards_with_people_stay_within_one_of_each_other(
            sizes in prop::collection::vec(50u64..200, 1..12),
            budgets in prop::collection::vec(0u64..30, 1..40),
        ) {
            let mut waiting = sizes.clone();
            let mut admitted = vec![0u64; sizes.len()];
            let mut cursor = 0;
            for b in budgets {
                let take = deal(&waiting, b, &mut cursor);
                prop_assert_eq!(take.iter().sum::<u64>(), b.min(waiting.iter().sum()));
                for i in 0..waiting.len() {
                    waiting[i] -= take[i];
                    admitted[i] += take[i];
                }
                let busy: Vec<u64> = (0..waiting.len()).filter(|i| waiting[*i] > 0).map(|i| admitted[i]).collect();
                if let (Some(lo), Some(hi)) = (busy.iter().min(), busy.iter().max()) {
                    prop_assert!(hi - lo <= 1, "admitted {:?}", admitted);
                }
            }
        }
    }
}
