//! The `global_counter` strategy: arrival numbers from one cluster-wide counter.
//!
//! Each arrival takes the next number from the event's counter (`INCR`, one hot key per event)
//! and that number is its score. The numbers of one counter range are dense, so a position is
//! a subtraction instead of a count over shards:
//!
//! ```text
//! position = carried + (my number − first number still waiting) + 1
//! ```
//!
//! `carried` is the number of people still waiting from before the counter range began (people
//! who arrived under another strategy; zero for an event that always used the counter), and
//! "first number still waiting" is "numbers already served" plus one. Both figures are read
//! per tick by the admission leader and published, so a poll costs two commands (the own shard's
//! script and one read of those figures) whatever the number of shards.
//!
//! Error: nobody who left, was admitted or was removed as abandoned *behind the head and ahead
//! of me* is subtracted, so each such gap makes my position one too large until the gap reaches
//! the head. With nobody leaving, positions are exact (1..W), as for `timestamp`.

/// The 1-based position of the person holding `number`, given the figures above.
pub fn position(carried: u64, number: u64, first_waiting: u64) -> u64 {
    carried + number.saturating_sub(first_waiting) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_numbers_give_exact_positions() {
        // Numbers 101..=110 waiting, nobody carried: 101 is first, 110 is tenth.
        assert_eq!(position(0, 101, 101), 1);
        assert_eq!(position(0, 110, 101), 10);
        // 5 people still wait from before the counter range: everyone moves back by 5.
        assert_eq!(position(5, 101, 101), 6);
    }

    #[test]
    fn a_leaver_ahead_overestimates_by_one_until_the_head_passes() {
        // 101..=105 entered, 103 left: 105 is really 4th, the subtraction says 5th.
        assert_eq!(position(0, 105, 101), 5);
        // Once 101 and 102 are admitted, the head is 104 and 105 is exactly 2nd.
        assert_eq!(position(0, 105, 104), 2);
    }

    #[test]
    fn a_stale_head_never_gives_a_position_below_one() {
        assert_eq!(position(0, 100, 105), 1);
    }
}
