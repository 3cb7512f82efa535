//! The `statistical` strategy: a position from the person's own shard only.
//!
//! Tickets hash uniformly over shards, so each shard holds a random sample of the line in
//! arrival order. A person at 0-based rank `r` in a shard of `s` waiting has about a fraction
//! `(r + ½) / s` of that shard ahead; the same fraction of the `W − s` people in the other
//! shards is then ahead too. The estimate
//!
//! ```text
//! position ≈ 1 + r + (r + ½) / s × (W − s)
//! ```
//!
//! needs one script on the own shard plus `W` (the line's total, published by the admission
//! leader about once a second). Plain "rank × shard count" is the special case of equal shards;
//! this one stays unbiased when shard sizes differ.
//!
//! Error: the person is the `(r+1)`-th of `s` random picks out of the line of `W`, so their true
//! position spreads around the estimate with standard deviation about
//! `σ = √(W · q(1−q) · (W−s)/s) ≈ √(W · q(1−q) · (N−1))` for `N` equal shards, `q` the fraction
//! ahead. At `W = 20 000`, `N = 8`, mid-line: σ ≈ 187 (0.9 % of the line). σ vanishes at the
//! ends of the line, where the half rank leaves a bias instead: the last of a shard is shown
//! `(W − s) / 2s ≈ (N − 1) / 2` places before the end, the first as many after the start. The
//! integration test holds every sampled error to `5σ + (N − 1) / 2 + 1`; measured figures are
//! in docs/ordering.md.

/// The line's size now, from the last published figures and the person's own shard.
///
/// `W` and the shard sizes are published by the admission leader and reach a poll through
/// caches, so during a surge they are seconds old while the person's own rank and shard size are
/// live: an estimate from a stale `W` then puts everyone far too near the front (measured: −49 %
/// at the median after 6,000 entered in a burst). Tickets hash uniformly over shards, so the
/// arrivals (and departures) since the publication are spread evenly: the own shard's change
/// times the shard count estimates the whole line's change, without bias:
///
/// ```text
/// W_now ≈ W_published + N × (s_now − s_own_published)
/// ```
///
/// Its noise grows only with the change (√(N · ΔW) for ΔW arrivals), not with the line. Never
/// below the own shard's size.
pub fn live_total(published_total: u64, published_own: u64, own_now: u64, shards: u32) -> u64 {
    let change = (own_now as i64 - published_own as i64) * i64::from(shards.max(1));
    (published_total as i64 + change).max(own_now as i64) as u64
}

/// The position to show when the person last saw `last`: an estimate that moved back by no more
/// than `budget` (a fraction, the event's error budget) is noise of the estimate, not a real
/// move, and the last one stays on screen; a larger move back is shown as it is, so no real move
/// back is ever hidden. Estimates only: an exact position is shown as computed.
pub fn steady(estimate: u64, last: Option<u64>, budget: f64) -> u64 {
    match last {
        Some(last) if estimate > last && (estimate as f64) <= last as f64 * (1.0 + budget) => last,
        _ => estimate,
    }
}

/// The estimate's own relative spread at `position` in a line of `total` over `shards` shards:
/// σ / position with σ = √(W · q(1−q) · (N−1)), q = position / W (see the module's header).
/// Near the front of a line it is large (one place of rank is N places of line), so `hybrid`
/// shows an exact position to anyone whose spread is over the event's budget.
pub fn relative_spread(position: u64, total: u64, shards: u32) -> f64 {
    let (p, w) = (position.max(1) as f64, total.max(position).max(1) as f64);
    let q = p / w;
    (w * q * (1.0 - q) * f64::from(shards.max(1) - 1)).sqrt() / p
}

/// How many of the estimate's standard deviations must fit in an error budget before `hybrid`
/// shows an estimate: 3 σ, so that a shown estimate moves by more than the budget (when its
/// inputs refresh) for about 3 in 1,000 people, not one in three.
pub const SPREAD_SIGMAS: f64 = 3.0;

/// True when the estimate at `position` is narrow enough for `budget`: [`SPREAD_SIGMAS`] times
/// its relative spread within it.
pub fn fits_budget(position: u64, total: u64, shards: u32, budget: f64) -> bool {
    SPREAD_SIGMAS * relative_spread(position, total, shards) <= budget
}

/// The estimated 1-based position, clamped to `1..=W`.
pub fn position(own_rank: u64, shard_waiting: u64, total_waiting: u64) -> u64 {
    let s = shard_waiting.max(own_rank + 1);
    let w = total_waiting.max(s);
    let q = (own_rank as f64 + 0.5) / s as f64;
    let est = 1.0 + own_rank as f64 + q * (w - s) as f64;
    (est.round() as u64).clamp(1, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_is_exact() {
        for r in 0..100 {
            assert_eq!(position(r, 100, 100), r + 1);
        }
    }

    #[test]
    fn the_ends_of_the_line_carry_the_half_rank_bias() {
        // 8 equal shards of 2,500: the last of a shard is shown (W − s) / 2s = 3.5 places
        // before the end, the first 3.5 after the start (rounded either way).
        assert!((3..=4).contains(&(20_000 - position(2_499, 2_500, 20_000))));
        assert!((4..=5).contains(&position(0, 2_500, 20_000)));
    }

    #[test]
    fn equal_shards_scale_by_the_shard_count() {
        // Middle of one of 4 equal shards of 1000: 499 ahead in it, 1498.5 expected elsewhere.
        assert_eq!(position(499, 1000, 4000), 1999);
        assert_eq!(position(0, 1000, 4000), 3);
        assert_eq!(position(999, 1000, 4000), 3999);
    }

    #[test]
    fn the_live_total_adds_the_own_shards_change_times_the_shard_count() {
        // Published 1,000 over 4 shards (own 250); 100 more arrived in the own shard since.
        assert_eq!(live_total(1_000, 250, 350, 4), 1_400);
        // Departures count too, and the total never drops below the own shard.
        assert_eq!(live_total(1_000, 250, 200, 4), 800);
        assert_eq!(live_total(0, 250, 10, 4), 10);
        // Nothing published yet: the own shard scaled by the shard count.
        assert_eq!(live_total(0, 0, 300, 16), 4_800);
    }

    #[test]
    fn the_spread_is_wide_at_the_front_and_narrow_further_back() {
        // 1M waiting over 16 shards: 1st place ±387 %, 100,000th ±1.2 %, 500,000th ±0.4 %.
        assert!(relative_spread(1, 1_000_000, 16) > 1.0);
        assert!((relative_spread(100_000, 1_000_000, 16) - 0.0116).abs() < 0.0005);
        assert!(relative_spread(500_000, 1_000_000, 16) < 0.004);
        // One shard is exact.
        assert_eq!(relative_spread(10, 100, 1), 0.0);
        // A 2 % budget takes 3 σ ≤ 2 %: the 500,000th of a million fits, the 100,000th not.
        assert!(fits_budget(500_000, 1_000_000, 16, 0.02));
        assert!(!fits_budget(100_000, 1_000_000, 16, 0.02));
    }

    #[test]
    fn a_shown_estimate_moves_back_only_beyond_the_budget() {
        assert_eq!(
            steady(1_010, Some(1_000), 0.02),
            1_000,
            "noise within 2 % stays"
        );
        assert_eq!(
            steady(1_030, Some(1_000), 0.02),
            1_030,
            "a real move back is shown"
        );
        assert_eq!(steady(990, Some(1_000), 0.02), 990, "forward always");
        assert_eq!(steady(1_010, None, 0.02), 1_010);
    }

    proptest::proptest! {
        /// With shards filled by a uniform hash, the live total is unbiased: over many random
        /// surges its mean error stays within a few standard errors of zero.
        #[test]
        fn the_live_total_is_unbiased_under_uniform_hashing(seed in 0u64..1_000) {
            let n = 16u32;
            let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let mut next = || { state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (state >> 33) as u32 };
            let mut shards = vec![0u64; n as usize];
            for _ in 0..2_000 { shards[(next() % n) as usize] += 1; }
            let (published, own_published) = (shards.iter().sum::<u64>(), shards[0]);
            for _ in 0..6_000 { shards[(next() % n) as usize] += 1; }
            let truth = shards.iter().sum::<u64>() as i64;
            let est = live_total(published, own_published, shards[0], n) as i64;
            // One draw: within 5 σ of the truth, σ = √(N · ΔW).
            proptest::prop_assert!((est - truth).abs() as f64 <= 5.0 * ((n as f64) * 6_000.0).sqrt());
        }
    }

    #[test]
    fn stale_totals_never_give_a_position_outside_the_line() {
        assert_eq!(position(10, 5, 3), 11);
        assert!(position(0, 1, 1_000_000) >= 1);
    }
}
