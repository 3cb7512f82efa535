//! Each waiting ticket's score in its shard as this instance last read it, so that a `timestamp`
//! position needs one round trip instead of two.
//!
//! An exact position is the rank in the ticket's own shard plus, for every other shard, a count
//! of those ahead of the ticket's score. Without the score the counts wait for the own shard's
//! read; with a remembered score they go out in the same round, and the own shard's read
//! (which returns the score anyway) confirms it. A score that does not match (the ticket left
//! and came back, a shard count change moved it, another instance's entry) costs the second
//! round it would have cost anyway: the cache is a guess that is always checked, never a source
//! of a position.
//!
//! Bounded: `entries` in all (rounded up to a multiple of [`STRIPES`]), over [`STRIPES`]
//! independently locked maps; a full stripe is emptied to take a new entry (those tickets' next
//! positions take their two rounds and are remembered again). Keyed by the ticket alone: a
//! ticket is derived from (event, user), so two events never share one. A ticket found not
//! waiting, or leaving, is forgotten.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use crate::ids::Ticket;
use crate::sync::Guard as _;

/// The default bound, 4,194,304 entries: at most ~300 MB per cache (an entry is 32 bytes, u128
/// being 16-aligned, plus a control byte, at a table load between 7/16 and 7/8: 38–75 bytes per
/// entry), taken only as tickets are remembered. A numbered line's polls are answered without
/// Redis only for the tickets the instance remembers, and a load balancer sends every ticket's
/// polls to every instance, so each instance needs room for the whole line: with a line of
/// 375,000 and room for 131,072, a numbered poll cost the event's primary 14.5 µs instead of
/// 1.0 (docs/benchmarks.md, "Remembered places"). Four million covers a sale of two million
/// people pressing at once, twice over.
pub const DEFAULT_ENTRIES: usize = 1 << 22;

/// Independently locked parts: a poll locks one for a lookup, so concurrent requests rarely
/// meet on a lock.
const STRIPES: usize = 64;

/// A ticket's hash in a stripe's map: its two halves folded together, no hashing.
///
/// A ticket is HMAC output under the server's key, and only tickets Redis found in the line are
/// ever remembered, so nobody can choose keys that collide; the default SipHash bought nothing
/// here (docs/benchmarks.md, "Hashing on the request path"). Both halves are folded because each
/// has bits that do not vary: the stripe's (the low 6), a UUID's version nibble (bits 76–79) and
/// its variant (bits 62–63); the map takes its bucket from the hash's low bits and a tag from its
/// top 7.
#[derive(Default)]
struct TicketHasher(u64);

impl Hasher for TicketHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u128(&mut self, key: u128) {
        self.0 ^= (key >> 64) as u64 ^ key as u64;
    }

    /// Not reached (the maps are keyed by `u128`); a plain FNV-1a, to be correct if it were.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

type Stripe<V> = HashMap<u128, V, BuildHasherDefault<TicketHasher>>;

/// Tickets' last read scores, bounded (or another small value per ticket: a numbered line's
/// place, see `numbered.rs`).
pub struct ScoreCache<V = f64> {
    stripes: Vec<Mutex<Stripe<V>>>,
    per_stripe: usize,
    /// The `cache` label of `waitroom_remembered_forgotten_total`.
    name: &'static str,
}

impl<V: Copy> ScoreCache<V> {
    /// A cache of at most `entries` scores (0 turns it off: every lookup misses).
    pub fn new(entries: usize) -> Self {
        ScoreCache {
            stripes: (0..STRIPES)
                .map(|_| Mutex::new(Stripe::default()))
                .collect(),
            per_stripe: entries.div_ceil(STRIPES),
            name: "scores",
        }
    }

    /// This cache counted under `cache="name"` in `waitroom_remembered_forgotten_total`, which
    /// is registered at 0 here so that a dashboard has the series before the first overflow.
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        metrics::counter!(crate::telemetry::REMEMBERED_FORGOTTEN, "cache" => name).increment(0);
        self
    }

    fn stripe(&self, key: u128) -> &Mutex<Stripe<V>> {
        // Tickets are HMAC output: any bits are as good as a hash of them.
        &self.stripes[(key as usize) % STRIPES]
    }

    /// The score `ticket` last had, if remembered.
    pub fn get(&self, ticket: &Ticket) -> Option<V> {
        if self.per_stripe == 0 {
            return None;
        }
        let key = ticket.as_u128();
        self.stripe(key).guard().get(&key).copied()
    }

    /// Remembers `score` for `ticket`; returns how many entries it forgot to make room (counted
    /// in `waitroom_remembered_forgotten_total`).
    pub fn put(&self, ticket: &Ticket, score: V) -> u64 {
        if self.per_stripe == 0 {
            return 0;
        }
        let key = ticket.as_u128();
        let mut map = self.stripe(key).guard();
        let mut dropped = 0;
        if map.len() >= self.per_stripe && !map.contains_key(&key) {
            // Constant work per entry taken, unlike picking entries to evict one by one.
            dropped = map.len() as u64;
            map.clear();
            metrics::counter!(crate::telemetry::REMEMBERED_FORGOTTEN, "cache" => self.name)
                .increment(dropped);
        }
        map.insert(key, score);
        dropped
    }

    /// Forgets `ticket`'s score.
    pub fn remove(&self, ticket: &Ticket) {
        if self.per_stripe == 0 {
            return;
        }
        let key = ticket.as_u128();
        self.stripe(key).guard().remove(&key);
    }

    /// Scores remembered now.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.guard().len()).sum()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(i: u128) -> Ticket {
        Ticket::from_uuid(uuid::Uuid::from_u128(
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835),
        ))
    }

    #[test]
    fn tickets_of_one_stripe_spread_over_the_maps_buckets_and_tags() {
        use std::hash::BuildHasher as _;
        // Tickets as the server makes them (version-8 UUIDs of random bytes), only those of
        // stripe 0: the low 6 bits, the version nibble and the variant bits are all fixed.
        let build = BuildHasherDefault::<TicketHasher>::default();
        let hashes: Vec<u64> = (0u32..)
            .map(|i| {
                let mut bytes = [0u8; 16];
                let mut x = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32;
                for b in &mut bytes {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *b = x as u8;
                }
                uuid::Uuid::new_v8(bytes).as_u128()
            })
            .filter(|k| (*k as usize).is_multiple_of(STRIPES))
            .take(1 << 14)
            .map(|k| build.hash_one(k))
            .collect();
        // A table of 2^14 buckets indexes by the low 14 bits; each of them, and each of the
        // top 7 (the tag), must vary, or most buckets would stay empty.
        for bit in (0..14).chain(57..64) {
            let ones = hashes.iter().filter(|h| *h >> bit & 1 == 1).count();
            assert!(
                (6_000..10_400).contains(&ones),
                "bit {bit} is set in {ones} of {} hashes",
                hashes.len()
            );
        }
    }

    #[test]
    fn remembers_the_last_score_put() {
        let cache: ScoreCache = ScoreCache::new(1000);
        assert_eq!(cache.get(&ticket(1)), None);
        cache.put(&ticket(1), 5.0);
        cache.put(&ticket(1), 7.0);
        assert_eq!(cache.get(&ticket(1)), Some(7.0));
        assert_eq!(cache.get(&ticket(2)), None);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn never_holds_more_than_its_bound_and_keeps_taking_new_scores() {
        let cache: ScoreCache = ScoreCache::new(640);
        let mut forgotten = 0;
        for i in 0..10_000 {
            forgotten += cache.put(&ticket(i), i as f64);
            assert_eq!(cache.get(&ticket(i)), Some(i as f64), "the newest is kept");
        }
        assert!(cache.len() <= 640, "{} entries", cache.len());
        assert!(cache.len() >= 64, "{} entries", cache.len());
        // Every entry taken is held or was forgotten with a full stripe, and counted then.
        assert_eq!(forgotten + cache.len() as u64, 10_000);
    }

    #[test]
    fn a_cache_with_room_forgets_nothing() {
        let cache: ScoreCache = ScoreCache::new(640).named("test");
        let forgotten: u64 = (0..320).map(|i| cache.put(&ticket(i), i as f64)).sum();
        assert_eq!((forgotten, cache.len()), (0, 320));
    }

    #[test]
    fn a_removed_score_is_forgotten() {
        let cache: ScoreCache = ScoreCache::new(100);
        cache.put(&ticket(1), 5.0);
        cache.put(&ticket(2), 6.0);
        cache.remove(&ticket(1));
        assert_eq!(cache.get(&ticket(1)), None);
        assert_eq!(cache.get(&ticket(2)), Some(6.0));
    }

    #[test]
    fn zero_entries_remembers_nothing() {
        let cache: ScoreCache = ScoreCache::new(0);
        cache.put(&ticket(1), 1.0);
        assert_eq!(cache.get(&ticket(1)), None);
        assert!(cache.is_empty());
    }
}
