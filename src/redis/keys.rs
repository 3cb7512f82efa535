//! Every Redis key waitroom uses, in one place.
//!
//! Key map (`<p>` is the configured key prefix, `wr` by default):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<p>:events` | set | ids of all events (the registry the admission schedulers walk) |
//! | `<p>:{<event>}:cfg` | string | the event's configuration, JSON |
//! | `<p>:{<event>}:stats` | hash | live figures written by the admission leader |
//! | `<p>:{<event>}:lease` | string | id of the instance that admits for the event (PX) |
//! | `<p>:<tag>:w` | zset | a shard's waiting line: ticket → arrival score (µs) |
//! | `<p>:<tag>:a` | zset | a shard's active sessions: ticket → admission time (ms) |
//! | `<p>:<tag>:n` | string | a shard's admitted-total counter |
//! | `<p>:<tag>:s` | zset | a shard's last-seen times: ticket → last enter or poll (ms); negative for an entry that never polled |
//! | `<p>:<tag>:op` | string | id of the last admission move on the shard (`admit.lua` runs once per id; PX) |
//! | `<p>:{<event>}:seq` | string | the `global_counter` arrival counter (one hot key per event) |
//! | `<p>:{<event>}:gaps` | zset | `global_counter` numbers handed out that wait nowhere (a re-entry's, a leaver's), from the first number still waiting on: number → number |
//! | `<p>:{<event>}:nl` | hash | the numbered line's figures: boundary, departures' prefix sums (see `lua/numbered_lib.lua`) |
//! | `<p>:{<event>}:nl:gone` | string (bitmap) | numbered line: bit n set when number n stopped waiting without being admitted |
//! | `<p>:{<event>}:nl:ended` | string (bitmap) | numbered line: bit n set when admitted number n ended its session early |
//! | `<p>:{<event>}:nl:ticks` | zset | numbered line: boundary after each admission tick → `<boundary>:<ms>:<counter>` |
//! | `<p>:{<event>}:nl:seen` | string | numbered line: last-seen records near the front, two bytes per number: polled or only entered, and in which period |
//! | `<p>:{<event>}:nl:seq` | string | numbered line: the arrival counter |
//! | `<p>:{<event>}:nl:op` | string | numbered line: id of the last admission tick (PX) |
//! | `<p>:{<event>}:nl:ix:<b>` | hash | numbered line: index bucket `b` (member → number), in the event's slot; small, so listpack-encoded |
//! | `<p>:<tag>:ix:<b>` | hash | the same, for numbered lines created before the index moved to the event's slot: in the tag of shard `b mod shards` |
//! | `<p>:{<event>}:shows` | set | ids of the event's shows (for sold-out) |
//! | `<p>:show:{<show>}:info` | hash | event, kind (`seated`/`ga`), total, available, sold |
//! | `<p>:show:{<show>}:seats` | hash | seat → `''` available, `h:<hold>`, `s:<booking>` |
//! | `<p>:show:{<show>}:order` | list | seat ids in display order |
//! | `<p>:show:{<show>}:holds` | zset | live (unbooked) hold → expiry (ms) |
//! | `<p>:show:{<show>}:holdrec` | hash | hold → JSON {ticket, seats or quantity, expires, booking} |
//! | `<p>:show:{<show>}:intents` | zset | hold → ms: booked in Redis, publication not yet known |
//! | `<p>:show:{<show>}:info:replicated` | string | written before each booking's `WAIT` (PX): see `RedisConn::wait_replicated` |
//! | `<p>:booking:{<booking>}` | string | a booking accepted but maybe not yet in PostgreSQL (JSON) |
//!
//! A show's keys share the tag `{<show>}`: one hold or booking script touches one slot.
//!
//! `<tag>` is the shard's hash tag `{<event>:<shard>}`, or `{<event>:<shard>.<salt>}` when a
//! salt was needed to place the shard on the primary chosen for it (see [`choose_tags`]). All
//! keys of one shard share the tag and so one slot: every Lua script touches one slot only and
//! can never fail with CROSSSLOT. Event ids cannot contain `{` or `}`, so a tag cannot be broken.

/// Fields of the event's live-figures hash (`<p>:{<event>}:stats`). The admission leader
/// writes them; requests read them (through the event cache).
pub mod stats {
    /// Admissions per second measured by the leader over the last seconds.
    pub const RATE: &str = "rate";
    /// People waiting over all shards, as the leader last counted them.
    pub const WAITING: &str = "waiting";
    /// People waiting per shard, comma-separated in shard order, published with `WAITING` every
    /// tick: a `statistical` poll corrects a stale total by its own shard's change since.
    pub const SHARD_WAITING: &str = "w_shards";
    /// The strategy `hybrid` uses now (`timestamp` or `statistical`).
    pub const HYBRID_MODE: &str = "hybrid_mode";
    /// The leader's moving average of the estimate's relative position error (sampled).
    pub const POSITION_ERROR: &str = "position_error";
    /// `1` when every show of the event is sold out, else `0`.
    pub const SOLD_OUT: &str = "sold_out";
    /// The `global_counter` range the three `GC_*` figures describe (its first number).
    pub const GC_START: &str = "gc_start";
    /// People waiting from before the counter range.
    pub const GC_CARRIED: &str = "gc_carried";
    /// The first number still waiting ('' when nobody numbered waits).
    pub const GC_FIRST: &str = "gc_first";
}

/// The hash slot of a key, as Redis Cluster computes it (CRC16/XMODEM of the hash tag, or of
/// the whole key when it has none, mod 16384).
pub fn slot(key: &str) -> u16 {
    slot_of(key.as_bytes())
}

/// [`slot`] of a key given as bytes (as it sits in a packed command).
pub fn slot_of(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hashed_part(key)) % 16384
}

/// The part of a key its slot is computed from: the hash tag (between the first `{` and the
/// next `}`, if not empty), else the whole key. Two keys with the same part share a slot.
pub fn hashed_part(key: &[u8]) -> &[u8] {
    match key.iter().position(|b| *b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|b| *b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    }
}

/// Key builder for one key prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

/// The keys of one show (all in one slot), in the order every show script takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShowKeys {
    /// Counters and kind (hash).
    pub info: String,
    /// Seat states (hash).
    pub seats: String,
    /// Live holds by expiry (zset).
    pub holds: String,
    /// Hold records (hash).
    pub holdrec: String,
    /// Seat display order (list).
    pub order: String,
    /// Bookings marked sold whose publication to Kafka is not known yet (zset: hold id → when
    /// marked, ms); the admission leader's sweeper resolves them (`Bookings::resolve_intents`).
    pub intents: String,
}

impl ShowKeys {
    /// The four keys every show script receives first (see lua/show_lib.lua).
    pub fn core(&self) -> [&str; 4] {
        [&self.info, &self.seats, &self.holds, &self.holdrec]
    }
}

/// The keys of one shard (all in one slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardKeys {
    /// Waiting line (zset).
    pub waiting: String,
    /// Active sessions (zset).
    pub active: String,
    /// Admitted-total counter (string).
    pub admitted: String,
    /// Last-seen times of the waiting (zset): abandoned places are found here.
    pub seen: String,
    /// The last admission operation's id (string): `admit.lua` runs once per id.
    pub op: String,
    /// The crossings of the horizon (zset): one entry per admission tick that moved it, scored by
    /// the line score of the last person then inside (`lua/line_lib.lua`).
    pub horizon: String,
    /// The cluster slot of every key above (they share the shard's hash tag).
    pub slot: u16,
}

/// The numbered line's keys of one event (all in the event's slot), in the order every
/// numbered script takes them (`lua/numbered_lib.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumberedKeys {
    /// The line's figures (hash).
    pub line: String,
    /// Departures (bitmap).
    pub gone: String,
    /// Ended sessions (bitmap).
    pub ended: String,
    /// Admission ticks (zset).
    pub ticks: String,
    /// Last-seen records near the front (string of two-byte cells).
    pub seen: String,
    /// The arrival counter (string).
    pub seq: String,
    /// The last tick's operation id (string).
    pub op: String,
}

impl NumberedKeys {
    /// Index bucket `bucket` in the event's slot (lines whose config says `index_in_line`).
    pub fn index(&self, bucket: u32) -> String {
        format!("{}:ix:{bucket}", self.line)
    }

    /// The keys in script order.
    pub fn all(&self) -> [&str; 7] {
        [
            &self.line,
            &self.gone,
            &self.ended,
            &self.ticks,
            &self.seen,
            &self.seq,
            &self.op,
        ]
    }
}

impl Keys {
    /// Keys under `prefix` (tests use a unique prefix each, so they never share state).
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys {
            prefix: prefix.into(),
        }
    }

    /// The prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The registry of events.
    pub fn registry(&self) -> String {
        format!("{}:events", self.prefix)
    }

    /// An event's configuration (JSON string).
    pub fn event_config(&self, event: &str) -> String {
        format!("{}:{{{event}}}:cfg", self.prefix)
    }

    /// An event's live figures (hash).
    pub fn event_stats(&self, event: &str) -> String {
        format!("{}:{{{event}}}:stats", self.prefix)
    }

    /// An event's admission lease.
    pub fn lease(&self, event: &str) -> String {
        format!("{}:{{{event}}}:lease", self.prefix)
    }

    /// An event's `global_counter` arrival counter.
    pub fn counter(&self, event: &str) -> String {
        format!("{}:{{{event}}}:seq", self.prefix)
    }

    /// The `global_counter` numbers of an event that were handed out but wait nowhere (see
    /// `lua/gap.lua`); in the counter's slot.
    pub fn counter_gaps(&self, event: &str) -> String {
        format!("{}:{{{event}}}:gaps", self.prefix)
    }

    /// The numbered line's keys of an event.
    pub fn numbered(&self, event: &str) -> NumberedKeys {
        let p = &self.prefix;
        NumberedKeys {
            line: format!("{p}:{{{event}}}:nl"),
            gone: format!("{p}:{{{event}}}:nl:gone"),
            ended: format!("{p}:{{{event}}}:nl:ended"),
            ticks: format!("{p}:{{{event}}}:nl:ticks"),
            seen: format!("{p}:{{{event}}}:nl:seen"),
            seq: format!("{p}:{{{event}}}:nl:seq"),
            op: format!("{p}:{{{event}}}:nl:op"),
        }
    }

    /// Index bucket `bucket` of a numbered line, in the slot of the shard tag `tag`.
    pub fn index_bucket(&self, tag: &str, bucket: u32) -> String {
        format!("{}:{tag}:ix:{bucket}", self.prefix)
    }

    /// The ids of an event's shows.
    pub fn event_shows(&self, event: &str) -> String {
        format!("{}:{{{event}}}:shows", self.prefix)
    }

    /// The keys of a show.
    pub fn show(&self, show: &str) -> ShowKeys {
        let p = &self.prefix;
        ShowKeys {
            info: format!("{p}:show:{{{show}}}:info"),
            seats: format!("{p}:show:{{{show}}}:seats"),
            holds: format!("{p}:show:{{{show}}}:holds"),
            holdrec: format!("{p}:show:{{{show}}}:holdrec"),
            order: format!("{p}:show:{{{show}}}:order"),
            intents: format!("{p}:show:{{{show}}}:intents"),
        }
    }

    /// A booking's pending record.
    pub fn booking(&self, booking: &str) -> String {
        format!("{}:booking:{{{booking}}}", self.prefix)
    }

    /// The keys of the shard with hash tag `tag` (as returned by [`shard_tag`]).
    pub fn shard(&self, tag: &str) -> ShardKeys {
        let waiting = format!("{}:{tag}:w", self.prefix);
        ShardKeys {
            slot: slot(&waiting),
            waiting,
            active: format!("{}:{tag}:a", self.prefix),
            admitted: format!("{}:{tag}:n", self.prefix),
            seen: format!("{}:{tag}:s", self.prefix),
            op: format!("{}:{tag}:op", self.prefix),
            horizon: format!("{}:{tag}:hz", self.prefix),
        }
    }

    /// The keys of every shard of an event, in the order of its `tags`.
    pub fn shards(&self, tags: &[String]) -> Vec<ShardKeys> {
        tags.iter().map(|tag| self.shard(tag)).collect()
    }
}

/// The hash tag of shard `shard` of `event`, with an optional placement salt.
pub fn shard_tag(event: &str, shard: usize, salt: u32) -> String {
    if salt == 0 {
        format!("{{{event}:{shard}}}")
    } else {
        format!("{{{event}:{shard}.{salt}}}")
    }
}

/// Chooses one hash tag per shard so the shards spread evenly over the cluster's primaries.
///
/// `primaries` holds, per primary, the slot ranges it serves (from `CLUSTER SLOTS`). Shard `i`
/// goes to primary `(i + s) mod P`, where `s` is the slot of the event's id mod `P`: every event
/// starts the round at a primary of its own, so events with fewer shards than primaries (or a
/// count that is not a multiple of `P`) do not all put their first shards on the first primary.
/// Shard `i`'s tag is the first `{event:i}`, `{event:i.1}`, `{event:i.2}`, … whose slot that
/// primary serves. With an empty `primaries` (one non-cluster Redis) the plain
/// tags are used. Placement is decided once, when the shard count is set, and stored with the
/// event: a later resharding of the cluster moves slots, not keys' names.
pub fn choose_tags(event: &str, shards: usize, primaries: &[Vec<(u16, u16)>]) -> Vec<String> {
    let start = usize::from(slot(event));
    (0..shards)
        .map(|i| {
            let Some(ranges) = primaries.get((i + start) % primaries.len().max(1)) else {
                return shard_tag(event, i, 0);
            };
            (0..100_000)
                .map(|salt| shard_tag(event, i, salt))
                .find(|tag| {
                    let s = slot(tag);
                    ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&s))
                })
                .unwrap_or_else(|| shard_tag(event, i, 0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_matches_the_values_measured_on_a_real_cluster() {
        // shared/INFRA.md: q:{ev1:3}:waiting and q:{ev1:3}:active share slot 412; {ev1:4} is 12667.
        assert_eq!(slot("q:{ev1:3}:waiting"), 412);
        assert_eq!(slot("q:{ev1:3}:active"), 412);
        assert_eq!(slot("{ev1:4}"), 12667);
        // Redis's own documented example: "123456789" hashes to 0x31C3 = 12739.
        assert_eq!(slot("123456789"), 12739);
        // An empty tag "{}" does not count: the whole key is hashed.
        assert_eq!(
            slot("a{}b"),
            crc16::State::<crc16::XMODEM>::calculate(b"a{}b") % 16384
        );
    }

    #[test]
    fn all_keys_of_a_shard_share_one_slot() {
        let keys = Keys::new("wr");
        let tag = shard_tag("topgun-open", 5, 0);
        let s = keys.shard(&tag);
        assert_eq!(slot(&s.waiting), slot(&s.active));
        assert_eq!(slot(&s.waiting), slot(&s.admitted));
        assert_eq!(slot(&s.waiting), slot(&s.seen));
        assert_eq!(slot(&s.waiting), slot(&s.horizon));
        assert_eq!(slot(&s.waiting), slot(&s.op));
        assert_eq!(s.slot, slot(&s.waiting));
        assert_eq!(
            slot(&keys.event_config("ev")),
            slot(&keys.event_stats("ev"))
        );
        assert_eq!(slot(&keys.event_config("ev")), slot(&keys.counter("ev")));
        assert_eq!(
            slot(&keys.event_stats("ev")),
            slot(&keys.counter_gaps("ev"))
        );
        let nl = keys.numbered("ev");
        for k in nl.all() {
            assert_eq!(slot(&keys.event_config("ev")), slot(k));
        }
        let show = keys.show("s1");
        for k in [
            &show.seats,
            &show.holds,
            &show.holdrec,
            &show.order,
            &show.intents,
        ] {
            assert_eq!(slot(&show.info), slot(k));
        }
    }

    #[test]
    fn chosen_tags_land_on_their_primary_round_robin() {
        let primaries = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
        let tags = choose_tags("ev1", 8, &primaries);
        assert_eq!(tags.len(), 8);
        let start = usize::from(slot("ev1"));
        for (i, tag) in tags.iter().enumerate() {
            let p = (i + start) % 3;
            let (lo, hi) = primaries[p][0];
            assert!((lo..=hi).contains(&slot(tag)), "{tag} not on primary {p}");
        }
        let mut uniq = tags.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 8);
    }

    #[test]
    fn events_of_fewer_shards_than_primaries_spread_over_all_of_them() {
        let primaries = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
        let mut per_primary = [0; 3];
        for n in 0..300 {
            let tag = &choose_tags(&format!("sale{n}"), 1, &primaries)[0];
            per_primary[usize::from(slot(tag)) * 3 / 16384] += 1;
        }
        // Each event's one shard on the primary its id chose: about a third each, not all 300
        // on the first.
        assert!(
            per_primary.iter().all(|&n| (70..=130).contains(&n)),
            "{per_primary:?}"
        );
    }

    #[test]
    fn without_a_cluster_the_plain_tags_are_used() {
        assert_eq!(choose_tags("ev", 2, &[]), vec!["{ev:0}", "{ev:1}"]);
    }
}
