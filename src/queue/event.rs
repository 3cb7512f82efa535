//! Events: their configuration, the registry of events, and a short-lived per-instance cache.
//!
//! The configuration lives in Redis (`<p>:{event}:cfg`, JSON) so every instance sees the same
//! one. Instances cache it for [`CACHE_TTL`] at most: an admin change (a new strategy, a pause)
//! reaches every instance within that time — the contract asks for one second.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::future::Cache;

use redis::AsyncCommands as _;
use serde::{Deserialize, Serialize};
use waitroom_strategies::StrategyKind;

use super::{Prefetch, QueueError};
use crate::ids::{EventId, Ticket};
use crate::redis::keys::{stats, Keys, NumberedKeys, ShardKeys};
use crate::redis::RedisConn;
use crate::sync::Guard as _;
use crate::telemetry;

/// After a failed refresh, how long requests queued behind it answer 503 without trying again.
const FAILED_REFRESH_BACKOFF: Duration = Duration::from_millis(500);

/// How long an instance may use a cached configuration.
pub const CACHE_TTL: Duration = Duration::from_millis(500);

/// Whether people may enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    /// Entering and admission run.
    Open,
    /// Nobody may enter and nobody is admitted; the line keeps its order.
    Paused,
    /// The sale is over: nobody may enter, nobody is admitted.
    Closed,
}

/// How an event's line writes a ticket as a sorted-set member. Fixed when the event is created:
/// every instance must place a ticket in the same shard under the same member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberForm {
    /// The 36-character ticket: events created before the short form (their stored
    /// configuration has no `member_form`).
    #[default]
    Hyphenated,
    /// 14 characters, [`Ticket::to_short_member`]: 32 B less per waiting person.
    Short,
}

/// How an event keeps its line. Fixed when the event is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LineForm {
    /// A sorted set per shard: every strategy, runtime switching (docs/architecture.md).
    #[default]
    SortedSets,
    /// The numbered line (docs/numbered-line.md): arrival numbers from the event's counter,
    /// an index of small hashes, departures as a bitmap, admission as a boundary. Every
    /// strategy orders by the counter and shows exact positions (see
    /// [`EventConfig::positions_by`]); switching changes no key.
    Numbered,
}

/// Index buckets of a numbered line: ~80 people each at 1.3M waiting keeps every bucket under
/// Redis's `hash-max-listpack-entries` (128), so listpack-encoded.
pub const INDEX_BUCKETS: u32 = 16_384;

/// An event's configuration (the body of `PUT /admin/v1/events/{event}`, completed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventConfig {
    /// Number of shards of the waiting line.
    pub shards: u32,
    /// Most active sessions at once.
    pub active_capacity: u64,
    /// Admissions per second (0 holds admission back).
    pub admit_per_second: f64,
    /// Length of an active session, seconds.
    pub active_ttl_seconds: u64,
    /// Length of a seat hold, seconds.
    pub hold_ttl_seconds: u64,
    /// Most seats in one hold.
    pub max_seats_per_hold: u32,
    /// Most seats one ticket may hold and book in one show, all its holds together (default:
    /// twice `max_seats_per_hold`). A ticket also has at most one live hold per show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seats_per_ticket: Option<u32>,
    /// Ordering strategy.
    pub strategy: StrategyKind,
    /// Open, paused or closed.
    pub state: EventState,
    /// Hash tag of each shard, chosen when the shard count was set (see `redis::keys`).
    pub shard_tags: Vec<String>,
    /// `hybrid`: below this many waiting, positions are exact.
    #[serde(default = "default_hybrid_min_waiting")]
    pub hybrid_min_waiting: u64,
    /// `hybrid`: largest mean relative error of estimated positions before going exact again.
    #[serde(default = "default_hybrid_max_error")]
    pub hybrid_max_error: f64,
    /// People who have neither entered nor polled for this long are skipped at admission and
    /// removed (the server advises at most 12 s between polls, so 60 s is five missed polls).
    #[serde(default = "default_abandon_after_seconds")]
    pub abandon_after_seconds: u64,
    /// The strategy whose order key arrivals before `switch_at_us` still get (set by a switch).
    #[serde(default)]
    pub previous_strategy: Option<StrategyKind>,
    /// When the last strategy switch takes effect for arrivals, µs since the epoch: later than
    /// every instance's cached configuration, so all instances change order key at one instant.
    #[serde(default)]
    pub switch_at_us: u64,
    /// Verified entry: the key (≥ 32 bytes) with which the selling site signs user ids; when
    /// set, entering requires an `entry_token` (docs/api.md). Never shown by the admin API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_key: Option<String>,
    /// First score of the current `global_counter` range: the counter continues from here, above
    /// every score already in the line (0 when the event never used `global_counter`).
    #[serde(default)]
    pub counter_start: u64,
    /// The form of the line's members: `short` for events created by this version.
    #[serde(default)]
    pub member_form: MemberForm,
    /// How the line is kept (`sorted_sets` for events created before the numbered line).
    #[serde(default)]
    pub line_form: LineForm,
    /// Index buckets of a numbered line (0 for the sorted sets), fixed at creation.
    #[serde(default)]
    pub index_buckets: u32,
    /// Where a numbered line's index lives, fixed at creation: `true` (events created by this
    /// version) in the event's own slot beside the counter, so one script per batch of enters
    /// takes the numbers and writes the index; `false` (numbered events created before) spread
    /// over the shards' tags, one `HSETNX` per enter after its number.
    #[serde(default)]
    pub index_in_line: bool,
    /// The period of a numbered line's last-seen records, ms, fixed when the line is created:
    /// a quarter of its abandon time then (0 for the sorted sets). A record holds the number of
    /// the period it was written in, counted from the Unix epoch (lua/numbered_lib.lua), so a
    /// record read with another period length has a meaningless age: a later change of
    /// `abandon_after_seconds` changes how often records are rewritten, not this.
    /// Numbered lines stored before have none (0): theirs is a quarter of their abandon time,
    /// kept from their first change on.
    #[serde(default)]
    pub record_period_ms: u64,
}

impl EventConfig {
    /// `ticket` as this event's line writes it (waiting, active and last-seen sets); its shard
    /// is the CRC16 of this string.
    pub fn member(&self, ticket: &Ticket) -> String {
        match self.member_form {
            MemberForm::Hyphenated => ticket.to_member(),
            MemberForm::Short => ticket.to_short_member(),
        }
    }

    /// The configuration as the admin API shows it: the entry key replaced by whether there is
    /// one (`verified_entry`).
    pub fn shown(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("a configuration serializes");
        if let Some(o) = v.as_object_mut() {
            o.remove("entry_key");
            o.insert(
                "verified_entry".into(),
                serde_json::Value::Bool(self.entry_key.is_some()),
            );
        }
        v
    }

    /// The period of a numbered line's last-seen records, ms
    /// ([`EventConfig::record_period_ms`]; a quarter of the abandon time for a line stored
    /// without one, as it was written with).
    pub fn record_period_ms(&self) -> u64 {
        match self.record_period_ms {
            0 => super::quarter_ms(self.abandon_after_seconds).max(1),
            ms => ms,
        }
    }

    /// How many record periods pass before a poll rewrites a numbered line's record: the
    /// refresh of the abandon time in force ([`super::seen_refresh_ms`], a quarter of it),
    /// at least one. More than one once the abandon time was raised after the line was
    /// created, so records are rewritten as often as that abandon time needs.
    pub fn record_refresh_periods(&self) -> u64 {
        (super::seen_refresh_ms(self) / self.record_period_ms()).max(1)
    }

    /// The per-ticket seat cap in force (see [`EventConfig::max_seats_per_ticket`]).
    pub fn seats_per_ticket(&self) -> u32 {
        self.max_seats_per_ticket
            .unwrap_or(self.max_seats_per_hold.saturating_mul(2))
    }

    /// The strategy that computes positions, given the mode `hybrid` is in (`None`: not decided
    /// yet, exact). On a numbered line it is always `global_counter`: every strategy's order
    /// there is the counter's (arrival at the event's slot, so arrival order without the clock
    /// skew between instances), and the counter's position is exact for three reads, where the
    /// sorted sets' exact position costs a read per shard. An estimate would cost the same and
    /// be worse, so `statistical` and `hybrid` show the exact position too
    /// (docs/numbered-line.md, "The strategies on it").
    pub fn positions_by(&self, hybrid_mode: Option<StrategyKind>) -> StrategyKind {
        match (self.line_form, self.strategy) {
            (LineForm::Numbered, _) => StrategyKind::GlobalCounter,
            (LineForm::SortedSets, StrategyKind::Hybrid) => {
                hybrid_mode.unwrap_or(StrategyKind::Timestamp)
            }
            (LineForm::SortedSets, s) => s,
        }
    }

    /// The strategy whose order key an arrival at `now_us` gets: the previous one until the
    /// switch instant, then the configured one.
    pub fn order_source(&self, now_us: u64) -> StrategyKind {
        match self.previous_strategy {
            Some(prev) if now_us < self.switch_at_us => prev,
            _ => self.strategy,
        }
    }
}

fn default_abandon_after_seconds() -> u64 {
    60
}

fn default_hybrid_min_waiting() -> u64 {
    10_000
}

fn default_hybrid_max_error() -> f64 {
    0.02
}

/// Limits that keep one event from hurting the cluster or the service.
pub const MAX_SHARDS: u32 = 256;

/// A create-or-update request: every field optional.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventPatch {
    /// See [`EventConfig::shards`].
    pub shards: Option<u32>,
    /// See [`EventConfig::active_capacity`].
    pub active_capacity: Option<u64>,
    /// See [`EventConfig::admit_per_second`].
    pub admit_per_second: Option<f64>,
    /// See [`EventConfig::active_ttl_seconds`].
    pub active_ttl_seconds: Option<u64>,
    /// See [`EventConfig::hold_ttl_seconds`].
    pub hold_ttl_seconds: Option<u64>,
    /// See [`EventConfig::max_seats_per_hold`].
    pub max_seats_per_hold: Option<u32>,
    /// See [`EventConfig::max_seats_per_ticket`].
    pub max_seats_per_ticket: Option<u32>,
    /// See [`EventConfig::strategy`].
    #[schema(value_type = Option<crate::http::openapi::Strategy>)]
    pub strategy: Option<StrategyKind>,
    /// See [`EventConfig::state`].
    pub state: Option<EventState>,
    /// See [`EventConfig::hybrid_min_waiting`].
    pub hybrid_min_waiting: Option<u64>,
    /// See [`EventConfig::hybrid_max_error`].
    pub hybrid_max_error: Option<f64>,
    /// See [`EventConfig::abandon_after_seconds`].
    pub abandon_after_seconds: Option<u64>,
    /// See [`EventConfig::entry_key`]; `""` turns verified entry off.
    pub entry_key: Option<String>,
    /// See [`EventConfig::line_form`]; only when the event is created.
    pub line_form: Option<LineForm>,
}

impl EventPatch {
    /// Applies the patch to `base` (or to the defaults for a new event) and checks the result.
    /// Returns the new configuration without shard tags when the shard count changed.
    pub fn apply(&self, base: Option<&EventConfig>) -> Result<EventConfig, String> {
        let d = base.cloned().unwrap_or(EventConfig {
            shards: 8,
            active_capacity: 1000,
            admit_per_second: 100.0,
            active_ttl_seconds: 600,
            hold_ttl_seconds: 300,
            max_seats_per_hold: 4,
            max_seats_per_ticket: None,
            strategy: StrategyKind::Timestamp,
            state: EventState::Open,
            shard_tags: Vec::new(),
            hybrid_min_waiting: default_hybrid_min_waiting(),
            hybrid_max_error: default_hybrid_max_error(),
            abandon_after_seconds: default_abandon_after_seconds(),
            previous_strategy: None,
            switch_at_us: 0,
            counter_start: 0,
            entry_key: None,
            member_form: MemberForm::Short,
            // A new event gets the numbered line unless it asks for the sorted sets: exact
            // positions for every strategy at a fraction of the memory and the admission cost
            // (docs/numbered-line.md). Stored events without the field stay sorted sets
            // (the serde default, `LineForm::default`).
            line_form: LineForm::Numbered,
            index_buckets: 0,
            index_in_line: false,
            record_period_ms: 0,
        });
        let line_form = match (base, self.line_form) {
            (Some(b), Some(f)) if f != b.line_form => {
                return Err("line_form is fixed when the event is created".into())
            }
            (_, f) => f.unwrap_or(d.line_form),
        };
        // A numbered line created before its index moved into the event's slot keeps the index
        // in the shards' tags: a new shard count would lose it. One whose index is in its own
        // slot moves no key at a change (the count only scales its horizon), so it follows the
        // sorted sets' rule: paused or closed, and empty (`Queue::put_event`, 409 otherwise).
        if base.is_some_and(|b| b.line_form == LineForm::Numbered && !b.index_in_line)
            && self.shards.is_some_and(|n| n != d.shards)
        {
            return Err(
                "a numbered line whose index lives in the shards' tags keeps the shard count it was created with"
                    .into(),
            );
        }
        let cfg = EventConfig {
            shards: self.shards.unwrap_or(d.shards),
            active_capacity: self.active_capacity.unwrap_or(d.active_capacity),
            admit_per_second: self.admit_per_second.unwrap_or(d.admit_per_second),
            active_ttl_seconds: self.active_ttl_seconds.unwrap_or(d.active_ttl_seconds),
            hold_ttl_seconds: self.hold_ttl_seconds.unwrap_or(d.hold_ttl_seconds),
            max_seats_per_hold: self.max_seats_per_hold.unwrap_or(d.max_seats_per_hold),
            // 0 goes back to the default (twice max_seats_per_hold).
            max_seats_per_ticket: match self.max_seats_per_ticket {
                Some(0) => None,
                Some(n) => Some(n),
                None => d.max_seats_per_ticket,
            },
            // A new numbered line defaults to its own order's name; an existing event keeps its
            // strategy unless the patch names one.
            strategy: self.strategy.unwrap_or(match (base, line_form) {
                (None, LineForm::Numbered) => StrategyKind::GlobalCounter,
                _ => d.strategy,
            }),
            state: self.state.unwrap_or(d.state),
            shard_tags: if self.shards.is_some_and(|n| n != d.shards) {
                Vec::new()
            } else {
                d.shard_tags
            },
            hybrid_min_waiting: self.hybrid_min_waiting.unwrap_or(d.hybrid_min_waiting),
            hybrid_max_error: self.hybrid_max_error.unwrap_or(d.hybrid_max_error),
            abandon_after_seconds: self
                .abandon_after_seconds
                .unwrap_or(d.abandon_after_seconds),
            previous_strategy: d.previous_strategy,
            switch_at_us: d.switch_at_us,
            counter_start: d.counter_start,
            member_form: d.member_form,
            line_form,
            index_buckets: match line_form {
                LineForm::Numbered if d.index_buckets > 0 => d.index_buckets,
                LineForm::Numbered => INDEX_BUCKETS,
                LineForm::SortedSets => 0,
            },
            // Fixed with the line: its records hold period numbers of this length.
            record_period_ms: match (base, line_form) {
                (_, LineForm::SortedSets) => 0,
                (Some(b), LineForm::Numbered) => b.record_period_ms(),
                (None, LineForm::Numbered) => super::quarter_ms(
                    self.abandon_after_seconds
                        .unwrap_or(d.abandon_after_seconds),
                ),
            },
            // A new numbered line keeps its index in its own slot; an existing one where it is.
            index_in_line: match (base, line_form) {
                (Some(b), _) => b.index_in_line,
                (None, LineForm::Numbered) => true,
                (None, LineForm::SortedSets) => false,
            },
            entry_key: match self.entry_key.as_deref() {
                Some("") => None,
                Some(k) => Some(k.to_owned()),
                None => d.entry_key,
            },
        };
        if cfg
            .entry_key
            .as_ref()
            .is_some_and(|k| k.len() < crate::auth::MIN_ENTRY_KEY_BYTES)
        {
            return Err(format!(
                "entry_key must be at least {} bytes",
                crate::auth::MIN_ENTRY_KEY_BYTES
            ));
        }
        if !(1..=MAX_SHARDS).contains(&cfg.shards) {
            return Err(format!("shards must be 1..={MAX_SHARDS}"));
        }
        if !(cfg.admit_per_second.is_finite()
            && (0.0..=1_000_000.0).contains(&cfg.admit_per_second))
        {
            return Err("admit_per_second must be 0..=1000000".into());
        }
        if !(1..=86_400).contains(&cfg.active_ttl_seconds) {
            return Err("active_ttl_seconds must be 1..=86400".into());
        }
        if !(1..=86_400).contains(&cfg.hold_ttl_seconds) {
            return Err("hold_ttl_seconds must be 1..=86400".into());
        }
        if !(1..=100).contains(&cfg.max_seats_per_hold) {
            return Err("max_seats_per_hold must be 1..=100".into());
        }
        if let Some(cap) = cfg.max_seats_per_ticket {
            if !(cfg.max_seats_per_hold..=1000).contains(&cap) {
                return Err("max_seats_per_ticket must be max_seats_per_hold..=1000".into());
            }
        }
        if cfg.active_capacity > 10_000_000 {
            return Err("active_capacity must be at most 10000000".into());
        }
        if !(cfg.hybrid_max_error.is_finite() && (0.0..=1.0).contains(&cfg.hybrid_max_error)) {
            return Err("hybrid_max_error must be 0..=1".into());
        }
        if !(1..=86_400).contains(&cfg.abandon_after_seconds) {
            return Err("abandon_after_seconds must be 1..=86400".into());
        }
        Ok(cfg)
    }
}

/// An event as the request path sees it: its configuration and the leader's live figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The event's id.
    pub id: EventId,
    /// The configuration.
    pub config: EventConfig,
    /// Admissions per second measured by the admission leader over the last seconds.
    pub measured_rate: Option<f64>,
    /// People waiting, all shards, as the leader last counted them (every tick).
    pub waiting_total: Option<u64>,
    /// People waiting per shard, as the leader counted them with `waiting_total` (empty when
    /// not published).
    pub shard_waiting: Vec<u64>,
    /// The strategy `hybrid` uses now, as the leader last decided.
    pub hybrid_mode: Option<StrategyKind>,
    /// Every show of the event has nothing left: the line has stopped.
    pub sold_out: bool,
    /// The keys of each shard (`config.shard_tags` order), formatted once when the event is
    /// read rather than by every request: a `timestamp` poll needs all of them.
    pub shard_keys: Vec<ShardKeys>,
    /// The event's live-figures hash and `global_counter` gap set, formatted once like the
    /// shard keys: a counted poll reads both.
    pub stats_key: String,
    /// See `stats_key`.
    pub gaps_key: String,
    /// The numbered line's keys (used when `config.line_form` is numbered).
    pub numbered: NumberedKeys,
    /// The request path's metric handles for this event.
    pub metrics: EventMetrics,
    /// When this configuration was read from Redis: it is used until [`CACHE_TTL`] after.
    read_at: Instant,
}

/// The metric handles a request of an event records to, registered when the event is read (every
/// [`CACHE_TTL`] at most): a request then adds to a handle instead of allocating its labels and
/// looking them up in the registry (docs/benchmarks.md, "Instructions per request").
#[derive(Clone)]
pub struct EventMetrics {
    /// `waitroom_queue_entered_total{event}`.
    pub entered: metrics::Counter,
    /// `waitroom_queue_polls_total{event}`.
    pub polls: metrics::Counter,
    /// `waitroom_queue_turned_away_total{event}`.
    pub turned_away: metrics::Counter,
    /// `waitroom_redis_commands_per_poll{strategy}`, by the strategy that computed a position.
    commands_per_poll: [metrics::Histogram; 4],
    /// `waitroom_position_prefetch_total{outcome}`: used, unused, no_guess.
    prefetch: [metrics::Counter; 3],
}

impl EventMetrics {
    fn new(event: &EventId) -> Self {
        let label = event.to_string();
        let per_poll = |s: StrategyKind| metrics::histogram!(telemetry::COMMANDS_PER_POLL, "strategy" => s.as_str());
        EventMetrics {
            entered: metrics::counter!(telemetry::QUEUE_ENTERED, "event" => label.clone()),
            polls: metrics::counter!(telemetry::QUEUE_POLLS, "event" => label.clone()),
            turned_away: metrics::counter!(telemetry::QUEUE_TURNED_AWAY, "event" => label),
            commands_per_poll: [
                per_poll(StrategyKind::GlobalCounter),
                per_poll(StrategyKind::Timestamp),
                per_poll(StrategyKind::Statistical),
                per_poll(StrategyKind::Hybrid),
            ],
            prefetch: [Prefetch::Used, Prefetch::Unused, Prefetch::NoGuess]
                .map(|p| metrics::counter!(telemetry::POSITION_PREFETCH, "outcome" => p.as_str())),
        }
    }

    /// The prefetch counter of `outcome`.
    pub fn prefetch(&self, outcome: Prefetch) -> &metrics::Counter {
        &self.prefetch[outcome as usize]
    }

    /// The commands-per-poll histogram of `strategy`.
    pub fn commands_per_poll(&self, strategy: StrategyKind) -> &metrics::Histogram {
        let i = match strategy {
            StrategyKind::GlobalCounter => 0,
            StrategyKind::Timestamp => 1,
            StrategyKind::Statistical => 2,
            StrategyKind::Hybrid => 3,
        };
        &self.commands_per_poll[i]
    }
}

impl std::fmt::Debug for EventMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventMetrics").finish_non_exhaustive()
    }
}

/// Handles, not state: two events' handles never make them differ.
impl PartialEq for EventMetrics {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

#[cfg(test)]
mod switch_tests {
    use super::*;

    /// A creation that asks for the sorted sets.
    fn sorted_sets() -> EventPatch {
        EventPatch {
            line_form: Some(LineForm::SortedSets),
            ..EventPatch::default()
        }
    }

    #[test]
    fn a_new_event_gets_the_numbered_line_unless_it_asks_for_the_sorted_sets() {
        let created = EventPatch::default().apply(None).unwrap();
        assert_eq!(created.line_form, LineForm::Numbered);
        assert_eq!(created.strategy, StrategyKind::GlobalCounter);
        assert!(created.index_in_line);
        assert_eq!(created.index_buckets, INDEX_BUCKETS);
        let sorted = sorted_sets().apply(None).unwrap();
        assert_eq!(sorted.line_form, LineForm::SortedSets);
        assert_eq!(sorted.strategy, StrategyKind::Timestamp);
        assert_eq!(sorted.index_buckets, 0);
        // An event stored before the field existed is a sorted-set line, and a change that
        // names no form keeps the form it has.
        let mut stored = serde_json::to_value(&sorted).unwrap();
        stored.as_object_mut().unwrap().remove("line_form");
        let stored: EventConfig = serde_json::from_value(stored).unwrap();
        assert_eq!(stored.line_form, LineForm::SortedSets);
        let later = EventPatch {
            admit_per_second: Some(5.0),
            ..EventPatch::default()
        };
        assert_eq!(
            later.apply(Some(&stored)).unwrap().line_form,
            LineForm::SortedSets
        );
        assert_eq!(
            later.apply(Some(&created)).unwrap().line_form,
            LineForm::Numbered
        );
    }

    #[test]
    fn a_numbered_lines_record_period_is_fixed_with_the_line() {
        let numbered = |abandon: Option<u64>| EventPatch {
            line_form: Some(LineForm::Numbered),
            abandon_after_seconds: abandon,
            ..EventPatch::default()
        };
        let abandon = |s: u64| EventPatch {
            abandon_after_seconds: Some(s),
            ..EventPatch::default()
        };
        let cfg = numbered(Some(8)).apply(None).unwrap();
        assert_eq!(cfg.record_period_ms(), 2_000, "a quarter of 8 s");
        assert_eq!(cfg.record_refresh_periods(), 1);
        // Raised: the period stays, a record is rewritten every 7 periods (15 s ÷ 2 s).
        let raised = abandon(60).apply(Some(&cfg)).unwrap();
        assert_eq!(raised.record_period_ms(), 2_000);
        assert_eq!(raised.record_refresh_periods(), 7);
        // Lowered below it: still the same period, rewritten every period.
        let lowered = abandon(1).apply(Some(&raised)).unwrap();
        assert_eq!(
            (lowered.record_period_ms(), lowered.record_refresh_periods()),
            (2_000, 1)
        );
        // The default abandon time, and a line stored without a period: a quarter of the
        // abandon time it was written with, fixed at its first change.
        assert_eq!(
            numbered(None).apply(None).unwrap().record_period_ms(),
            15_000
        );
        let mut stored = numbered(Some(20)).apply(None).unwrap();
        stored.record_period_ms = 0;
        assert_eq!(stored.record_period_ms(), 5_000);
        assert_eq!(
            abandon(4).apply(Some(&stored)).unwrap().record_period_ms,
            5_000
        );
        // The sorted sets keep none.
        let sorted = sorted_sets().apply(None).unwrap();
        assert_eq!(sorted.record_period_ms, 0);
        assert_eq!(abandon(4).apply(Some(&sorted)).unwrap().record_period_ms, 0);
    }

    #[test]
    fn arrivals_before_the_switch_instant_keep_the_previous_order_key() {
        let mut cfg = EventPatch::default().apply(None).unwrap();
        cfg.strategy = StrategyKind::GlobalCounter;
        cfg.previous_strategy = Some(StrategyKind::Timestamp);
        cfg.switch_at_us = 1_000;
        assert_eq!(cfg.order_source(999), StrategyKind::Timestamp);
        assert_eq!(cfg.order_source(1_000), StrategyKind::GlobalCounter);
        cfg.previous_strategy = None;
        assert_eq!(cfg.order_source(0), StrategyKind::GlobalCounter);
    }

    #[test]
    fn a_numbered_line_computes_positions_by_its_counter_under_every_strategy() {
        use StrategyKind::{GlobalCounter, Hybrid, Statistical, Timestamp};
        for strategy in [GlobalCounter, Timestamp, Statistical, Hybrid] {
            let patch = EventPatch {
                line_form: Some(LineForm::Numbered),
                strategy: Some(strategy),
                ..EventPatch::default()
            };
            let cfg = patch.apply(None).unwrap();
            assert_eq!(cfg.strategy, strategy, "accepted as asked");
            for mode in [None, Some(Timestamp), Some(Statistical)] {
                assert_eq!(cfg.positions_by(mode), GlobalCounter, "{strategy} {mode:?}");
            }
            // A later change that names no strategy keeps this one.
            let later = EventPatch {
                admit_per_second: Some(5.0),
                ..EventPatch::default()
            };
            assert_eq!(later.apply(Some(&cfg)).unwrap().strategy, strategy);
        }
        let mut sorted = sorted_sets().apply(None).unwrap();
        sorted.strategy = Hybrid;
        assert_eq!(sorted.positions_by(None), Timestamp);
        assert_eq!(sorted.positions_by(Some(Statistical)), Statistical);
        sorted.strategy = Statistical;
        assert_eq!(sorted.positions_by(Some(Timestamp)), Statistical);
    }

    #[test]
    fn a_numbered_line_takes_a_new_shard_count_unless_its_index_lives_in_the_shards_tags() {
        let created = EventPatch {
            line_form: Some(LineForm::Numbered),
            ..EventPatch::default()
        }
        .apply(None)
        .unwrap();
        assert!(created.index_in_line);
        let reshard = EventPatch {
            shards: Some(created.shards * 2),
            ..EventPatch::default()
        };
        // Its own slot holds the index: the count changes, and new tags are to be chosen
        // (`Queue::put_event`, which refuses while anyone waits).
        let changed = reshard.apply(Some(&created)).unwrap();
        assert_eq!(changed.shards, created.shards * 2);
        assert!(changed.shard_tags.is_empty());
        assert!(changed.index_in_line);
        // A line created before, with its index in the shards' tags: refused.
        let before = EventConfig {
            index_in_line: false,
            shard_tags: vec!["t0".into(); created.shards as usize],
            ..created.clone()
        };
        assert!(reshard.apply(Some(&before)).is_err());
        // The same count is no change.
        let same = EventPatch {
            shards: Some(before.shards),
            ..EventPatch::default()
        };
        assert_eq!(
            same.apply(Some(&before)).unwrap().shard_tags,
            before.shard_tags
        );
    }
}

impl Event {
    /// The strategy that positions are computed with right now.
    pub fn effective_strategy(&self) -> StrategyKind {
        self.config.positions_by(self.hybrid_mode)
    }

    /// The cluster slots a new person's enter grows ([`growth_slots`]).
    pub fn growth_slots(&self) -> impl Iterator<Item = u16> + '_ {
        growth_slots(
            &self.config,
            &self.numbered.line,
            self.shard_keys.iter().map(|k| k.slot),
        )
    }
}

/// The cluster slots a new person's enter grows in the event of `cfg`: a numbered line's slot
/// (that of `line`, its figures' key) and, for a line created before `index_in_line`, its
/// shards' tags, where its index buckets live; or the shards' tags (`shard_slots`) of the
/// sorted sets. The memory guard turns people away from the line while one of them is on a
/// full primary.
pub fn growth_slots<'a>(
    cfg: &EventConfig,
    line: &str,
    shard_slots: impl Iterator<Item = u16> + 'a,
) -> impl Iterator<Item = u16> + 'a {
    let numbered = cfg.line_form == LineForm::Numbered;
    let line = numbered.then(|| crate::redis::keys::slot(line));
    let shards = (!numbered || !cfg.index_in_line).then_some(shard_slots);
    line.into_iter().chain(shards.into_iter().flatten())
}

/// The leader's published figures: measured rate, waiting total, hybrid mode, sold-out flag,
/// waiting per shard.
type LiveFigures = (
    Option<f64>,
    Option<u64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Most events one instance keeps cached (known and unknown ids alike): ids come from request
/// paths, so the cache must not grow with whatever a client sends.
const CACHE_CAPACITY: u64 = 10_000;

/// Most events the request path's first lookup holds ([`EventStore`]'s `hot`). Only events that
/// exist go there, and they are the operators' own, so this is a bound that a sale never meets;
/// when it is met the map starts again empty.
const HOT_CAPACITY: usize = 1_024;

/// The events read lately, looked up by every request before the bounded cache: a lock, a hash
/// and a clock read, where moka's lookup (its frequency sketch and read log) cost ~1.1k
/// instructions of a ~38k-instruction poll (`scripts/bench-instr`, docs/benchmarks.md).
#[derive(Default)]
struct Hot {
    events: foldhash::HashMap<EventId, Arc<Event>>,
    /// Raised by every invalidation: a read begun before it does not put its event back.
    generation: u64,
}

/// Reads and caches event configurations.
///
/// A bounded, single-flight cache (moka): when an entry expires under load, one request reads
/// Redis and the others wait for its answer instead of all reading at once. Unknown ids are
/// cached too (as `None`), so a flood of made-up event ids costs Redis one read per id per
/// [`CACHE_TTL`]. A failed read is remembered for [`FAILED_REFRESH_BACKOFF`]: requests meanwhile
/// answer 503 at once instead of each trying Redis again in turn.
pub struct EventStore {
    keys: Keys,
    cache: Cache<EventId, Option<Arc<Event>>>,
    failed: Cache<EventId, ()>,
    hot: Mutex<Hot>,
}

impl EventStore {
    /// An empty cache.
    pub fn new(keys: Keys) -> Self {
        EventStore {
            keys,
            cache: Cache::builder()
                .max_capacity(CACHE_CAPACITY)
                .time_to_live(CACHE_TTL)
                .build(),
            failed: Cache::builder()
                .max_capacity(CACHE_CAPACITY)
                .time_to_live(FAILED_REFRESH_BACKOFF)
                .build(),
            hot: Mutex::default(),
        }
    }

    fn hot(&self) -> std::sync::MutexGuard<'_, Hot> {
        self.hot.guard()
    }

    /// The event from the first lookup while its configuration is under [`CACHE_TTL`] old; else
    /// None and the generation to put it back under.
    fn hot_get(&self, event: &EventId, now: Instant) -> Result<Arc<Event>, u64> {
        let hot = self.hot();
        match hot.events.get(event) {
            Some(ev) if now.saturating_duration_since(ev.read_at) < CACHE_TTL => Ok(ev.clone()),
            _ => Err(hot.generation),
        }
    }

    /// Puts `ev` into the first lookup unless an invalidation came after `generation`.
    fn hot_put(&self, ev: &Arc<Event>, generation: u64) {
        let mut hot = self.hot();
        if hot.generation != generation {
            return;
        }
        if hot.events.len() >= HOT_CAPACITY && !hot.events.contains_key(&ev.id) {
            hot.events.clear();
        }
        hot.events.insert(ev.id.clone(), ev.clone());
    }

    /// Forgets `event` in both lookups: this instance's next request reads it anew.
    async fn invalidate(&self, event: &EventId) {
        {
            let mut hot = self.hot();
            hot.generation += 1;
            hot.events.remove(event);
        }
        self.cache.invalidate(event).await;
    }

    /// The event, from the cache when fresh.
    pub async fn get(
        &self,
        conn: &mut RedisConn,
        event: &EventId,
    ) -> Result<Arc<Event>, QueueError> {
        let now = Instant::now();
        let generation = match self.hot_get(event, now) {
            Ok(ev) => return Ok(ev),
            Err(generation) => generation,
        };
        if let Some(cached) = self.cache.get(event).await {
            let ev = cached.ok_or(QueueError::UnknownEvent)?;
            if now.saturating_duration_since(ev.read_at) < CACHE_TTL {
                self.hot_put(&ev, generation);
            }
            return Ok(ev);
        }
        if self.failed.contains_key(event) {
            return Err(QueueError::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "event configuration refresh failed moments ago",
            ))));
        }
        let read = self
            .cache
            .try_get_with(event.clone(), self.read(conn, event))
            .await;
        match read {
            Ok(found) => {
                let ev = found.ok_or(QueueError::UnknownEvent)?;
                self.hot_put(&ev, generation);
                Ok(ev)
            }
            Err(e) => {
                self.failed.insert(event.clone(), ()).await;
                Err(match &*e {
                    QueueError::CorruptConfig => QueueError::CorruptConfig,
                    QueueError::WrongType => QueueError::WrongType,
                    QueueError::Redis(e) => QueueError::Redis(e.clone()),
                    other => QueueError::Invalid(other.to_string()),
                })
            }
        }
    }

    /// One read of the configuration and the leader's figures (`None`: no such event).
    async fn read(
        &self,
        conn: &mut RedisConn,
        event: &EventId,
    ) -> Result<Option<Arc<Event>>, QueueError> {
        // Both keys carry the tag {event}: one slot, so one pipeline, one round trip.
        let (raw, (rate, waiting, mode, sold_out, shards)): (Option<String>, LiveFigures) =
            redis::pipe()
                .get(self.keys.event_config(event.as_str()))
                .hmget(
                    self.keys.event_stats(event.as_str()),
                    &[
                        stats::RATE,
                        stats::WAITING,
                        stats::HYBRID_MODE,
                        stats::SOLD_OUT,
                        stats::SHARD_WAITING,
                    ],
                )
                .query_async(conn)
                .await?;
        let Some(config) = parse_config(event, raw)? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(Event {
            id: event.clone(),
            measured_rate: rate,
            waiting_total: waiting,
            shard_waiting: parse_counts(shards.as_deref()),
            hybrid_mode: mode.and_then(|m| m.parse().ok()),
            sold_out: sold_out.as_deref() == Some("1"),
            shard_keys: self.keys.shards(&config.shard_tags),
            stats_key: self.keys.event_stats(event.as_str()),
            gaps_key: self.keys.counter_gaps(event.as_str()),
            numbered: self.keys.numbered(event.as_str()),
            metrics: EventMetrics::new(event),
            config,
            read_at: Instant::now(),
        })))
    }

    /// The configuration straight from Redis (`None` for an unknown event).
    pub async fn load(
        &self,
        conn: &mut RedisConn,
        event: &EventId,
    ) -> Result<Option<EventConfig>, QueueError> {
        let raw: Option<String> = conn.get(self.keys.event_config(event.as_str())).await?;
        parse_config(event, raw)
    }

    /// Stores a configuration and registers the event.
    pub async fn save(
        &self,
        conn: &mut RedisConn,
        event: &EventId,
        cfg: &EventConfig,
    ) -> Result<(), QueueError> {
        let raw = serde_json::to_string(cfg).expect("config serializes");
        let () = conn
            .set(self.keys.event_config(event.as_str()), raw)
            .await?;
        let _: i64 = conn.sadd(self.keys.registry(), event.as_str()).await?;
        // This instance sees its own change at once; the others within CACHE_TTL.
        self.invalidate(event).await;
        Ok(())
    }

    /// All registered events.
    pub async fn registered(&self, conn: &mut RedisConn) -> Result<Vec<EventId>, QueueError> {
        let ids: Vec<String> = conn.smembers(self.keys.registry()).await?;
        Ok(ids.iter().filter_map(|s| EventId::parse(s).ok()).collect())
    }
}

/// `"3,0,12"` → `[3, 0, 12]`; anything unreadable → empty.
fn parse_counts(raw: Option<&str>) -> Vec<u64> {
    raw.filter(|r| !r.is_empty())
        .and_then(|r| r.split(',').map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

fn parse_config(event: &EventId, raw: Option<String>) -> Result<Option<EventConfig>, QueueError> {
    match raw {
        None => Ok(None),
        Some(raw) => serde_json::from_str(&raw).map(Some).map_err(|e| {
            tracing::error!(error = %e, event = %event, "stored event configuration is unreadable");
            QueueError::CorruptConfig
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_event_gets_defaults_and_a_patch_overrides_them() {
        let cfg = EventPatch {
            shards: Some(4),
            ..Default::default()
        }
        .apply(None)
        .unwrap();
        assert_eq!(cfg.shards, 4);
        assert_eq!(cfg.state, EventState::Open);
        // The numbered line's own order (a sorted-set line's default is `timestamp`).
        assert_eq!(cfg.strategy, StrategyKind::GlobalCounter);
        let paused = EventPatch {
            state: Some(EventState::Paused),
            ..Default::default()
        }
        .apply(Some(&cfg))
        .unwrap();
        assert_eq!(paused.shards, 4);
        assert_eq!(paused.state, EventState::Paused);
    }

    #[test]
    fn new_events_write_short_members_and_stored_ones_keep_their_form() {
        let ticket = Ticket::parse("7c0d7d0e-8c0a-4a43-9d7e-3f5cf1f0b2a1").unwrap();
        let new = EventPatch::default().apply(None).unwrap();
        assert_eq!(new.member_form, MemberForm::Short);
        assert_eq!(new.member(&ticket), "fA19DowKzx8LKh");
        // A configuration stored before the short form has no `member_form`: its line keeps
        // the 36-character members, through patches too.
        let mut stored = serde_json::to_value(&new).unwrap();
        stored.as_object_mut().unwrap().remove("member_form");
        let old: EventConfig = serde_json::from_value(stored).unwrap();
        assert_eq!(old.member(&ticket), "7c0d7d0e-8c0a-4a43-9d7e-3f5cf1f0b2a1");
        let patched = EventPatch {
            shards: Some(16),
            ..Default::default()
        }
        .apply(Some(&old))
        .unwrap();
        assert_eq!(patched.member_form, MemberForm::Hyphenated);
        let short = EventPatch::default().apply(Some(&new)).unwrap();
        assert_eq!(short.member_form, MemberForm::Short);
    }

    #[test]
    fn changing_the_shard_count_drops_the_old_tags() {
        let mut cfg = EventPatch::default().apply(None).unwrap();
        cfg.shard_tags = vec!["{e:0}".into(); 8];
        let same = EventPatch {
            shards: Some(8),
            ..Default::default()
        }
        .apply(Some(&cfg))
        .unwrap();
        assert_eq!(same.shard_tags.len(), 8);
        let other = EventPatch {
            shards: Some(2),
            ..Default::default()
        }
        .apply(Some(&cfg))
        .unwrap();
        assert!(other.shard_tags.is_empty());
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for patch in [
            EventPatch {
                shards: Some(0),
                ..Default::default()
            },
            EventPatch {
                shards: Some(MAX_SHARDS + 1),
                ..Default::default()
            },
            EventPatch {
                admit_per_second: Some(-1.0),
                ..Default::default()
            },
            EventPatch {
                admit_per_second: Some(f64::NAN),
                ..Default::default()
            },
            EventPatch {
                active_ttl_seconds: Some(0),
                ..Default::default()
            },
            EventPatch {
                max_seats_per_hold: Some(0),
                ..Default::default()
            },
        ] {
            assert!(patch.apply(None).is_err(), "{patch:?} accepted");
        }
    }
}
