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
//! ahead. At `W = 20 000`, `N = 8`, mid-line: σ ≈ 187 (0.9 % of the line). The integration test
//! holds every sampled error to `5σ + 2`; measured figures are in docs/ordering.md.

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
    fn equal_shards_scale_by_the_shard_count() {
        // Middle of one of 4 equal shards of 1000: 499 ahead in it, 1498.5 expected elsewhere.
        assert_eq!(position(499, 1000, 4000), 1999);
        assert_eq!(position(0, 1000, 4000), 3);
        assert_eq!(position(999, 1000, 4000), 3999);
    }

    #[test]
    fn stale_totals_never_give_a_position_outside_the_line() {
        assert_eq!(position(10, 5, 3), 11);
        assert!(position(0, 1, 1_000_000) >= 1);
    }
}
