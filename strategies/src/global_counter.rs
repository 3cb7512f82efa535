//! The `global_counter` strategy: arrival numbers from one cluster-wide counter.
//!
//! Each arrival takes the next number from the event's counter (`INCR`, one hot key per event)
//! and that number is its score. A position is then a subtraction instead of a count over
//! shards:
//!
//! ```text
//! position = carried + (my number − first number still waiting) − gaps ahead + 1
//! ```
//!
//! `carried` is the number of people still waiting from before the counter range began (people
//! who arrived under another strategy; zero for an event that always used the counter), and
//! "first number still waiting" is "numbers already served" plus one. Both figures are read
//! per tick by the admission leader and published. "Gaps ahead" are the numbers between the
//! first still waiting and mine that wait nowhere: a number an enter took for someone who turned
//! out to be in the line already (an enter takes its number before it reads the shard, so a
//! fresh enter costs two round trips, not four), and the number of someone who left. They are
//! recorded as they happen and counted in the same read as the figures, so a poll costs the own
//! shard's read and one read of the event's figures whatever the number of shards.
//!
//! Error: with every gap recorded, none — positions are exact (1..W), as for `timestamp`. A
//! number whose gap could not be recorded (the enter failed after taking it, or Redis failed
//! between the two) makes positions behind it one too large until the head passes it; so does
//! a figure read a moment before the leader's publication of the next one. A position is never
//! too small.

/// The 1-based position of the person holding `number`, given the figures above and the
/// recorded gaps between the first number still waiting and `number`.
pub fn position(carried: u64, number: u64, first_waiting: u64, gaps_ahead: u64) -> u64 {
    carried
        + number
            .saturating_sub(first_waiting)
            .saturating_sub(gaps_ahead)
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_numbers_give_exact_positions() {
        // Numbers 101..=110 waiting, nobody carried: 101 is first, 110 is tenth.
        assert_eq!(position(0, 101, 101, 0), 1);
        assert_eq!(position(0, 110, 101, 0), 10);
        // 5 people still wait from before the counter range: everyone moves back by 5.
        assert_eq!(position(5, 101, 101, 0), 6);
    }

    #[test]
    fn a_recorded_gap_ahead_is_not_counted() {
        // 101..=105 handed out, 103 left (or went to someone already in the line): 105 is 4th.
        assert_eq!(position(0, 105, 101, 1), 4);
        // Unrecorded, the subtraction says 5th: one too far back, never too near.
        assert_eq!(position(0, 105, 101, 0), 5);
        // Once 101 and 102 are admitted, the head is 104 and the gap is behind it.
        assert_eq!(position(0, 105, 104, 0), 2);
    }

    #[test]
    fn a_stale_head_never_gives_a_position_below_one() {
        assert_eq!(position(0, 100, 105, 0), 1);
        assert_eq!(position(0, 103, 101, 5), 1);
    }
}
