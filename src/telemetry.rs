//! Logging and metrics. Metric names are constants here so dashboards and alert rules can be
//! checked against them.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// HTTP requests, by `route` (matched path), `method` and `status`.
pub const HTTP_REQUESTS: &str = "waitroom_http_requests_total";
/// HTTP request latency in seconds, by `route` and `method`.
pub const HTTP_LATENCY: &str = "waitroom_http_request_duration_seconds";
/// Open HTTP connections of this instance (gauge; capped by `WAITROOM_MAX_CONNECTIONS`).
pub const HTTP_CONNECTIONS: &str = "waitroom_http_connections";
/// Requests refused 429 by a per-client limit, by `limit` (`address`, `ticket`, `user`, `admin`).
pub const RATE_LIMITED: &str = "waitroom_rate_limited_total";
/// Seat-map reads answered, by `source` (`snapshot`: from this instance's copy, `not_modified`:
/// 304 on a matching `ETag`, `redis`: the copy was refreshed from Redis).
pub const SEAT_MAP_READS: &str = "waitroom_seat_map_reads_total";
/// People waiting, by `event` (set by the admission leader each tick).
pub const QUEUE_WAITING: &str = "waitroom_queue_waiting";
/// Active sessions, by `event` (set by the admission leader each tick).
pub const QUEUE_ACTIVE: &str = "waitroom_queue_active";
/// People admitted by this instance, by `event`.
pub const ADMITTED_TOTAL: &str = "waitroom_admitted_total";
/// Places removed at admission because their holder stopped polling, by `event`.
pub const ABANDONED_TOTAL: &str = "waitroom_abandoned_total";
/// 1 while the overload guard keeps admission from removing abandoned places (gauge, by event).
pub const ABANDONMENT_SUSPENDED: &str = "waitroom_abandonment_suspended";
/// Failed admission ticks, by `event`.
pub const ADMISSION_ERRORS: &str = "waitroom_admission_errors_total";
/// Shard moves of an admission tick refused because the tick outlived its lease (the fence in
/// `lua/admit.lua`), by `event`.
pub const ADMISSION_FENCED: &str = "waitroom_admission_fenced_total";
/// Requests answered 503 because Redis could not answer.
pub const REDIS_UNAVAILABLE: &str = "waitroom_redis_unavailable_total";
/// Commands and pipelines sent over a direct connection to their primary
/// (`WAITROOM_REDIS_DIRECT`), by `addr` (the primary) and `outcome`: `answered` there,
/// `sent_again` through the cluster client after a redirect or a connection fault (failovers,
/// slot moves), or `timed_out` (answered with the timeout, as the cluster client would).
pub const REDIS_DIRECT: &str = "waitroom_redis_direct_requests_total";
/// Redis Cluster clients replaced because they answered nothing but timeouts for 5 s
/// (`src/redis/watched.rs`), by `client`: `primaries`, `replica_reads` or `waits`.
pub const REDIS_CLIENT_REPLACED: &str = "waitroom_redis_client_replaced_total";
/// |shown − exact| position of sampled waiting people, by `strategy`: `statistical` (estimates)
/// and `global_counter` (counted positions); `timestamp` is exact by construction.
pub const POSITION_ERROR: &str = "waitroom_position_error";
/// Positions whose other reads went out in the same round as the own shard's, by `outcome`:
/// `used` (one round trip), `unused` (read for another score or for nobody waiting) and
/// `no_guess` (a `timestamp` position with no remembered score: two round trips).
pub const POSITION_PREFETCH: &str = "waitroom_position_prefetch_total";
/// `global_counter` numbers that waited nowhere (taken by someone already in the line, or by
/// a leaver) and could not be recorded as gaps because Redis failed: each makes counted
/// positions behind it one too large until the head passes it.
pub const COUNTER_GAPS_LOST: &str = "waitroom_counter_gaps_lost_total";
/// Enters of a numbered line answered 503 because their arrival number did not reach the
/// counter primary's replicas within the wait (`Durable` in src/queue/numbered.rs).
pub const NUMBERS_NOT_REPLICATED: &str = "waitroom_numbers_not_replicated_total";
/// Counter `cache` (`scores`: sorted-set scores; `places`: numbered lines' places): entries an
/// instance's remembered tickets dropped because their part of the bound
/// (`WAITROOM_REDIS_SCORE_CACHE_ENTRIES`) was full. Above 0 while the lines outgrow it: each
/// forgotten numbered place is learned again at its next poll (`PLACES_LEARNED`).
pub const REMEMBERED_FORGOTTEN: &str = "waitroom_remembered_forgotten_total";
/// Counter `from`: polls of a numbered line whose ticket the instance did not remember, by how
/// its place was learned. `index`: a plain read of the index entry, the position from the
/// line's figures, no script; `script`: a standing script ran on the event's primary (near the
/// front, after the read; a number found gone; a line wholly near the front; a line whose
/// index is in the shards' tags).
pub const PLACES_LEARNED: &str = "waitroom_places_learned_total";
/// Reads of a numbered line's figures for positions computed in this instance
/// (`lua/nl_snapshot.lua`, at most one per `WAITROOM_NUMBERED_SNAPSHOT_MS` per event and
/// instance, fewer while nobody polls).
pub const LINE_FIGURES_READS: &str = "waitroom_line_figures_reads_total";
/// Bytes of departure bits those reads received from the event's primary: the blocks that
/// changed since the instance's last read, or every block holding a departure on a first read.
pub const LINE_FIGURES_BYTES: &str = "waitroom_line_figures_bytes_total";
/// Blocks of departure bits those reads did not receive because the instance held them
/// unchanged (4,096 bytes each; the bitmap's last block may be shorter).
pub const LINE_FIGURES_BLOCKS_HELD: &str = "waitroom_line_figures_blocks_held_total";
/// Redis commands one poll of a waiting person sent to find its position (round trips, counted
/// where they are sent; the occasional record of the poll is not one of them), by the
/// `strategy` that computed the position; 0 for a numbered line's position computed from the
/// figures this instance holds (src/queue/snapshot.rs).
pub const COMMANDS_PER_POLL: &str = "waitroom_redis_commands_per_poll";
/// Redis commands sent by admission ticks, by `event`; divide by `waitroom_admitted_total`
/// for commands per admitted person.
pub const ADMISSION_COMMANDS: &str = "waitroom_admission_redis_commands_total";
/// 1 while a `hybrid` event shows estimated positions, by `event`.
pub const HYBRID_ESTIMATED: &str = "waitroom_hybrid_estimated";
/// `hybrid` mode changes, by `event` and `to`.
pub const HYBRID_SWITCHES: &str = "waitroom_hybrid_switches_total";
/// Holds asked for, by `result` (`held`, `conflict`: a seat was taken, `sold_out`, `capped`:
/// the ticket already holds seats in the show or is at its cap).
pub const HOLDS: &str = "waitroom_holds_total";
/// Bookings answered by the API, by `status` (`pending`, `replayed`, `unknown`: 503 with the
/// booking id, `not_replicated`: undone, `expired`).
pub const BOOKINGS_API: &str = "waitroom_bookings_total";
/// Bookings of unknown outcome the sweeper published again until Kafka had them.
pub const BOOKING_INTENTS_RESOLVED: &str = "waitroom_booking_intents_resolved_total";
/// Bookings decided by the ledger, by `status` (`confirmed`, `rejected`, `duplicate`).
pub const BOOKINGS_LEDGER: &str = "waitroom_ledger_bookings_total";
/// Seats (or places) sold per ledger batch.
pub const LEDGER_BATCH_SEATS: &str = "waitroom_ledger_batch_seats";
/// Bookings on the topic the ledger has not applied yet (consumer lag), after each batch.
pub const LEDGER_LAG: &str = "waitroom_ledger_lag";
/// Time for Kafka to acknowledge a booking, seconds.
pub const KAFKA_PRODUCE_LATENCY: &str = "waitroom_kafka_produce_seconds";
/// Keys found holding the wrong type and moved aside.
pub const WRONGTYPE_REPAIRS: &str = "waitroom_wrongtype_repairs_total";

/// People waiting in one shard, by `event` and `shard` (set by the admission leader each tick).
pub const QUEUE_SHARD_WAITING: &str = "waitroom_queue_shard_waiting";
/// The event's configured admission rate, per second, by `event` (set by the leader).
pub const ADMIT_RATE_CONFIGURED: &str = "waitroom_admit_rate_configured";
/// The admission rate the leader measured over the last seconds, by `event`.
pub const ADMIT_RATE_MEASURED: &str = "waitroom_admit_rate_measured";
/// Unix seconds of the leader's last completed tick, by `event`: admission lag is `time() −`
/// this while people wait.
pub const ADMISSION_LAST_TICK: &str = "waitroom_admission_last_tick_timestamp_seconds";
/// 1 for the strategy computing positions now, by `event` and `strategy` (0 for the others).
pub const EFFECTIVE_STRATEGY: &str = "waitroom_effective_strategy";
/// The event's error budget for estimated positions (its `hybrid_max_error`), by `event`.
pub const POSITION_ERROR_BUDGET: &str = "waitroom_position_error_budget";
/// 1 while the event admits (open, not sold out, a rate above 0), by `event`; set by every
/// instance's event task, leader or not, so a paused event never looks stalled.
pub const ADMISSION_ENABLED: &str = "waitroom_admission_enabled";
/// The event's `active_capacity`, by `event` (set by the leader).
pub const ACTIVE_CAPACITY: &str = "waitroom_active_capacity";
/// The leader's moving average of |shown − exact| / exact for estimated positions, by `event`
/// (what `hybrid` compares with `hybrid_max_error`).
pub const POSITION_RELATIVE_ERROR: &str = "waitroom_position_relative_error";
/// Enters answered by this instance, by `event`.
pub const QUEUE_ENTERED: &str = "waitroom_queue_entered_total";
/// Enters of people not in the line that this instance turned away (503) while the memory
/// guard was closed, by `event`.
pub const QUEUE_TURNED_AWAY: &str = "waitroom_queue_turned_away_total";
/// 1 while this instance's memory guard turns people new to the lines on a full primary away (a
/// Redis primary at or above `WAITROOM_REDIS_ENTER_MEMORY_PERCENT` of its `maxmemory`), else 0.
pub const MEMORY_GUARD_CLOSED: &str = "waitroom_memory_guard_closed";
/// The memory guard's line as a share of `maxmemory` (`WAITROOM_REDIS_ENTER_MEMORY_PERCENT` ÷ 100;
/// 0 when the guard is off), for the warning before it closes and the dashboards.
pub const MEMORY_GUARD_LINE: &str = "waitroom_memory_guard_line_ratio";
/// Polls answered by this instance, by `event`.
pub const QUEUE_POLLS: &str = "waitroom_queue_polls_total";
/// Seconds one ledger batch took from its first message to its committed offsets.
pub const LEDGER_BATCH_SECONDS: &str = "waitroom_ledger_batch_seconds";
/// Seconds of each phase of a ledger batch, by `phase`: `receive` (first message to a full or
/// timed-out batch), `sql` (the transaction), `offsets` (storing the offsets), `align` (Redis
/// aligned with the decisions).
pub const LEDGER_PHASE_SECONDS: &str = "waitroom_ledger_phase_seconds";
/// Booking messages the ledger could not apply and set aside.
pub const LEDGER_DEAD_LETTERS: &str = "waitroom_ledger_dead_letters_total";
/// The configured capacity of one Redis node, operations per second (the 70 % line of the
/// dashboards and alerts is drawn from it).
pub const REDIS_NODE_OPS_CAPACITY: &str = "waitroom_redis_node_ops_capacity";

/// Redis nodes as an operator sees them, read from each node's `INFO` by the service, under
/// the metric names of the common redis_exporter (oliver006/redis_exporter), with the node in
/// the label `addr`, so its community dashboards and ours read the same series.
pub mod redis_node {
    /// 1 when the node answered the last read, else 0.
    pub const UP: &str = "redis_up";
    /// `total_commands_processed` (counter).
    pub const COMMANDS_PROCESSED: &str = "redis_commands_processed_total";
    /// `instantaneous_ops_per_sec`.
    pub const OPS_PER_SEC: &str = "redis_instantaneous_ops_per_sec";
    /// `used_memory`, bytes.
    pub const MEMORY_USED: &str = "redis_memory_used_bytes";
    /// `maxmemory`, bytes (0: no limit).
    pub const MEMORY_MAX: &str = "redis_memory_max_bytes";
    /// `connected_clients`.
    pub const CONNECTED_CLIENTS: &str = "redis_connected_clients";
    /// 1, with labels `role` and `redis_version`.
    pub const INSTANCE_INFO: &str = "redis_instance_info";
    /// 1 when a replica's link to its primary is up (replicas only).
    pub const MASTER_LINK_UP: &str = "redis_master_link_up";
    /// `connected_slaves`.
    pub const CONNECTED_SLAVES: &str = "redis_connected_slaves";
    /// `master_repl_offset`.
    pub const MASTER_REPL_OFFSET: &str = "redis_master_repl_offset";
    /// `slave_repl_offset` (replicas only).
    pub const SLAVE_REPL_OFFSET: &str = "redis_slave_repl_offset";
    /// `SLOWLOG LEN`.
    pub const SLOWLOG_LENGTH: &str = "redis_slowlog_length";
    /// Keys per database, label `db`.
    pub const DB_KEYS: &str = "redis_db_keys";
}

/// Registers the service-wide counters at 0, so dashboards and alerts have a series to watch
/// before the first event happens: the rare ones, and the numbered lines' before the first
/// numbered enter or poll.
pub fn register_counters() {
    for name in [
        REDIS_UNAVAILABLE,
        WRONGTYPE_REPAIRS,
        LEDGER_DEAD_LETTERS,
        NUMBERS_NOT_REPLICATED,
        LINE_FIGURES_READS,
        LINE_FIGURES_BYTES,
        LINE_FIGURES_BLOCKS_HELD,
    ] {
        metrics::counter!(name).increment(0);
    }
    for from in ["index", "script"] {
        metrics::counter!(PLACES_LEARNED, "from" => from).increment(0);
    }
}

/// Sets up the log subscriber (`RUST_LOG`, default `info`); safe to call more than once.
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ];
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(HTTP_LATENCY.to_owned()), &buckets)
                .expect("valid buckets")
                .set_buckets_for_metric(Matcher::Full(KAFKA_PRODUCE_LATENCY.to_owned()), &buckets)
                .expect("valid buckets")
                .set_buckets_for_metric(
                    Matcher::Full(LEDGER_BATCH_SEATS.to_owned()),
                    &[
                        1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
                    ],
                )
                .expect("valid buckets")
                .set_buckets_for_metric(Matcher::Full(LEDGER_BATCH_SECONDS.to_owned()), &buckets)
                .expect("valid buckets")
                .set_buckets_for_metric(Matcher::Full(LEDGER_PHASE_SECONDS.to_owned()), &buckets)
                .expect("valid buckets")
                .set_buckets_for_metric(
                    Matcher::Full(COMMANDS_PER_POLL.to_owned()),
                    &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
                )
                .expect("valid buckets")
                .set_buckets_for_metric(
                    Matcher::Full(POSITION_ERROR.to_owned()),
                    &[
                        0.0, 1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0,
                    ],
                )
                .expect("valid buckets")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be set (a test harness); ours then renders nothing,
            // which tests of /metrics would notice.
            let _ = metrics::set_global_recorder(recorder);
            register_counters();
            handle
        })
        .clone()
}
