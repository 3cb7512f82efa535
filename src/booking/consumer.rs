//! The ledger consumer: Kafka → PostgreSQL, in batches, by one or more appliers.
//!
//! Each ledger process is one member of the ledger's consumer group; the partitions the group
//! gives it are shared among its appliers (`WAITROOM_LEDGER_APPLIERS`) by partition number, so
//! a partition is applied in order by one applier while partitions are applied side by side;
//! several `waitroom ledger` processes share the topic the same way. Appliers cannot decide a
//! seat inconsistently: every row a decision reads is locked first, in one stable order, and
//! the conditional update stays the last line (see [`super::repo::apply_batch`]).
//!
//! Order of a batch: read messages until the batch is full or its window has passed, set aside
//! those that are not the service's bookings (out of form or bounds, not signed), apply the
//! rest in one PostgreSQL transaction — one at a time under savepoints if PostgreSQL refuses
//! the batch, setting aside the ones it refuses — commit it, then store the Kafka offsets
//! (asynchronously), then align Redis (rejected bookings' seats freed, confirmed bookings' sold
//! marks written again, in case a failover lost them). A crash anywhere before the offsets land
//! makes the batch come again; a booking leaves `pending` once ([`super::repo::apply_batch`]
//! answers `Duplicate` for one seen before), so nothing is lost and nothing applied twice, and
//! no single message can stop the ledger.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use backon::{ExponentialBuilder, Retryable as _};
use rdkafka::consumer::{CommitMode, Consumer as _, ConsumerContext, StreamConsumer};
use rdkafka::statistics::Statistics;
use rdkafka::ClientContext;
use rdkafka::{Message as _, Offset, TopicPartitionList};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::repo::{self, Decision};
use super::{BookingMessage, Bookings};
use crate::config::{Config, KafkaConfig, LedgerConfig};
use crate::telemetry;

/// Retries of a batch PostgreSQL did not take: from 100 ms, doubling to 5 s, with jitter, for as
/// long as it takes (the offsets must not move past an unapplied booking).
const RETRY_APPLY: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(5))
    .with_jitter()
    .without_max_times();

/// The longest the broker may hold the ledger's fetch when nothing new is there, ms.
const FETCH_WAIT_MS: &str = "50";

/// How often the ledger asks the broker for its topic's metadata, ms. A consumer subscribed to a
/// topic that did not exist yet learns that it does only at such a refresh, and librdkafka's
/// default is 5 minutes: a ledger started before its topic was created (a `waitroom ledger`
/// deployed before the first service, or one whose topic was deleted and made again) left every
/// booking `pending` that long. It hung a CI run's loadgen test for 300 s, when the service's
/// own ledger subscribed before its start-up had created the topic.
const METADATA_REFRESH_MS: &str = "5000";

/// How often librdkafka reports an applier's statistics, the lag among them, ms.
const STATS_EVERY_MS: &str = "1000";

/// Most seats written back to Redis by one script run (a script blocks its shard).
const ALIGN_CHUNK: usize = 500;

/// One consumed booking, owned.
struct Item {
    partition: i32,
    offset: i64,
    booking: BookingMessage,
}

/// A message set aside (table `dead_letters`).
struct DeadLetter {
    partition: i32,
    offset: i64,
    booking_id: Option<String>,
    reason: String,
    payload: Vec<u8>,
}

/// What a ledger did, summed over its appliers since it started: batches, messages, decisions
/// and time per phase (µs). `ledger-bench` reports it; the same phases are exported as
/// `waitroom_ledger_phase_seconds`.
#[derive(Debug, Default)]
pub struct LedgerStats {
    /// Batches committed.
    pub batches: AtomicU64,
    /// Messages in them (set aside ones included).
    pub messages: AtomicU64,
    /// Bookings decided (confirmed or rejected), not counting redeliveries.
    pub decided: AtomicU64,
    /// µs from a batch's first message until it was full or its window had passed.
    pub receive_us: AtomicU64,
    /// µs in PostgreSQL transactions (retries included).
    pub sql_us: AtomicU64,
    /// µs storing offsets.
    pub offsets_us: AtomicU64,
    /// µs aligning Redis with the decisions.
    pub align_us: AtomicU64,
    /// Partitions the ledger's group member holds now (a benchmark waits for the group to
    /// settle before it measures).
    pub partitions_assigned: AtomicI64,
}

impl LedgerStats {
    fn add(counter: &AtomicU64, phase: &'static str, took: Duration) {
        counter.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        metrics::histogram!(telemetry::LEDGER_PHASE_SECONDS, "phase" => phase)
            .record(took.as_secs_f64());
    }
}

/// The ledger: its settings, its own PostgreSQL pool, and the bookings service it aligns Redis
/// through.
pub struct Ledger {
    kafka: KafkaConfig,
    opts: LedgerConfig,
    db: PgPool,
    bookings: Arc<Bookings>,
    stats: Arc<LedgerStats>,
}

impl Ledger {
    /// A ledger with a pool of its own (`WAITROOM_LEDGER_DB_CONNECTIONS`, lazy: it connects on
    /// first use), so a busy ledger never starves the service's reads and the other way round.
    pub fn new(config: &Config, bookings: Arc<Bookings>) -> anyhow::Result<Self> {
        let db = PgPoolOptions::new()
            .max_connections(config.ledger.db_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(config.db.url.expose())
            .context("parsing WAITROOM_DATABASE_URL")?;
        Ok(Ledger {
            kafka: config.kafka.clone(),
            opts: config.ledger.clone(),
            db,
            bookings,
            stats: Arc::default(),
        })
    }

    /// What the ledger has done so far.
    pub fn stats(&self) -> Arc<LedgerStats> {
        self.stats.clone()
    }

    /// Runs the ledger until `shutdown` is cancelled, or until an applier fails (then the
    /// others are stopped too, and the error returned).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let ledger = Arc::new(self);
        let cfg = &ledger.kafka;
        let context = LagContext {
            topic: cfg.topic.clone(),
            stats: ledger.stats.clone(),
        };
        let consumer = CloseAside(Some(Arc::new(
            cfg.client()
                .set("statistics.interval.ms", STATS_EVERY_MS)
                .set("group.id", &cfg.group)
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                // The longest the broker may hold a fetch with nothing new: a booking can wait
                // this long before the ledger sees it (librdkafka's default is 500 ms).
                .set("fetch.wait.max.ms", FETCH_WAIT_MS)
                .set("topic.metadata.refresh.interval.ms", METADATA_REFRESH_MS)
                .set("session.timeout.ms", "6000")
                // Also the longest a rejoin waits for the group's other members: a ledger cut
                // off from the broker for longer than its session rejoins within this.
                .set("max.poll.interval.ms", "30000")
                .create_with_context(context)
                .context("creating the ledger consumer")?,
        )));
        consumer
            .subscribe(&[&cfg.topic])
            .context("subscribing to the bookings topic")?;
        tracing::info!(topic = %cfg.topic, group = %cfg.group, appliers = ledger.opts.appliers,
            "ledger consuming");
        // Exported at 0 from the start, so an alert on its increase has a series to watch.
        metrics::counter!(telemetry::LEDGER_DEAD_LETTERS).increment(0);
        let result = dispatch(&ledger, &consumer, &shutdown).await;
        // Leave the group before returning (a member that vanishes without leaving holds its
        // partitions until the broker gives up on it), but never wait on a broker that is gone.
        consumer.close_within(Duration::from_secs(5)).await;
        result
    }
}

/// The process's one member of the group: receives the partitions the group gives it and
/// hands each message to the applier of its partition (partition mod appliers), so a
/// partition's bookings are applied in order, by one applier, while the partitions are
/// applied side by side. One member per process, not one per applier: a group of many members
/// takes long to settle on the local broker (45–49 s for 6, and once never, in
/// docs/benchmarks.md), and each member is one more fetcher.
async fn dispatch(
    ledger: &Arc<Ledger>,
    consumer: &CloseAside,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let n = ledger.opts.appliers as usize;
    let stop = shutdown.child_token();
    let mut appliers = tokio::task::JoinSet::new();
    let mut queues = Vec::with_capacity(n);
    for _ in 0..n {
        // Room for two batches: the member reads ahead while the applier applies.
        let (tx, rx) = tokio::sync::mpsc::channel(2 * ledger.opts.batch_max as usize);
        queues.push(tx);
        appliers.spawn(apply_loop(
            ledger.clone(),
            consumer.shared(),
            rx,
            stop.clone(),
        ));
    }
    let mut result = Ok(());
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            done = appliers.join_next() => {
                // Appliers end on shutdown: that is not a failure.
                if stop.is_cancelled() {
                    break;
                }
                // An applier ended before shutdown: it failed.
                let e = match done {
                    Some(Ok(Err(e))) => e,
                    Some(Err(e)) => anyhow::anyhow!("a ledger applier panicked: {e}"),
                    _ => anyhow::anyhow!("a ledger applier stopped"),
                };
                result = Err(e);
                break;
            }
            m = consumer.recv() => m,
        };
        let m = match next {
            Ok(m) => m.detach(),
            Err(e) => {
                tracing::warn!(error = %e, "ledger: kafka receive failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let queue = &queues[m.partition().rem_euclid(n as i32) as usize];
        tokio::select! {
            _ = stop.cancelled() => break,
            sent = queue.send(m) => if sent.is_err() { continue },
        }
    }
    stop.cancel();
    while let Some(done) = appliers.join_next().await {
        let failed = match done {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) => Some(anyhow::anyhow!("a ledger applier panicked: {e}")),
        };
        if let (Some(e), true) = (failed, result.is_ok()) {
            result = Err(e);
        }
    }
    result
}

/// An applier's loop: batches from its queue in, decisions out, until `shutdown`.
async fn apply_loop(
    ledger: Arc<Ledger>,
    consumer: Arc<LedgerConsumer>,
    mut queue: tokio::sync::mpsc::Receiver<rdkafka::message::OwnedMessage>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (cfg, stats, bookings) = (&ledger.kafka, &ledger.stats, &ledger.bookings);
    let max = ledger.opts.batch_max as usize;
    let window = Duration::from_millis(ledger.opts.batch_window_ms);
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            m = queue.recv() => m,
        };
        let Some(first) = first else {
            return Ok(());
        };
        // Fill by count or deadline: a full batch goes at once, a partial one when the window
        // since its first message has passed.
        let batch_started = Instant::now();
        let deadline = tokio::time::Instant::now() + window;
        let mut batch = vec![first];
        while batch.len() < max {
            match tokio::time::timeout_at(deadline, queue.recv()).await {
                Ok(Some(m)) => batch.push(m),
                _ => break,
            }
        }
        LedgerStats::add(&stats.receive_us, "receive", batch_started.elapsed());

        let (items, dead) = sort(&batch, bookings);
        let sql_started = Instant::now();
        // Apply until it succeeds: the offsets must not move past an unapplied booking.
        let applying = (|| apply_batch(&ledger.db, &cfg.topic, &items, &dead))
            .retry(RETRY_APPLY)
            .notify(|e, wait| {
                tracing::error!(error = %e, retry_in = ?wait, "ledger: batch not applied; retrying")
            });
        let decisions = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            applied = applying => applied.context("a batch retried without end gave up")?,
        };
        LedgerStats::add(&stats.sql_us, "sql", sql_started.elapsed());

        let offsets_started = Instant::now();
        let mut tpl = TopicPartitionList::new();
        for m in &batch {
            tpl.add_partition_offset(&cfg.topic, m.partition(), Offset::Offset(m.offset() + 1))
                .context("offset list")?;
        }
        // Asynchronous: a synchronous commit waits for the broker without a bound, on a
        // runtime worker (seen here: a frozen broker stalled the whole process). A commit that
        // does not land only makes the batch come again after a restart or a rebalance;
        // applying it again is harmless (a booking leaves `pending` once).
        if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!(error = %e, "ledger: offset commit failed");
        }
        LedgerStats::add(&stats.offsets_us, "offsets", offsets_started.elapsed());
        metrics::histogram!(telemetry::LEDGER_BATCH_SECONDS)
            .record(batch_started.elapsed().as_secs_f64());
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats
            .messages
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let decided = decisions
            .iter()
            .filter(|(_, d)| !matches!(d, Decision::Duplicate))
            .count();
        stats.decided.fetch_add(decided as u64, Ordering::Relaxed);

        let align_started = Instant::now();
        align(bookings, decisions).await;
        LedgerStats::add(&stats.align_us, "align", align_started.elapsed());
    }
}

/// Aligns Redis with a committed batch's decisions: a rejected booking's seats freed (only
/// those still marked for it), confirmed bookings' sold marks written again. A failure here
/// leaves work for the next batch's marks and for reconcile; it never blocks the ledger.
async fn align(bookings: &Bookings, decisions: Vec<(BookingMessage, Decision)>) {
    let mut confirmed = Vec::new();
    for (booking, decision) in decisions {
        match decision {
            Decision::Rejected(truth) => {
                if let Err(e) = bookings.settle_rejected(&booking, &truth).await {
                    tracing::warn!(error = %e, booking = %booking.booking_id,
                        "ledger: could not align Redis with a rejected booking; reconcile will");
                }
            }
            Decision::Confirmed => confirmed.push(booking),
            Decision::Duplicate => {}
        }
    }
    if let Err(e) = bookings.mark_confirmed(&confirmed, ALIGN_CHUNK).await {
        tracing::warn!(error = %e, "ledger: could not write confirmed sold marks to Redis");
    }
}

/// Splits a batch into the bookings to apply and the messages to set aside.
fn sort(
    batch: &[rdkafka::message::OwnedMessage],
    bookings: &Bookings,
) -> (Vec<Item>, Vec<DeadLetter>) {
    let (mut items, mut dead) = (Vec::new(), Vec::new());
    for m in batch {
        let payload = m.payload().unwrap_or_default();
        let refused = match serde_json::from_slice::<BookingMessage>(payload) {
            Err(_) => Err((None, "not a booking message".to_owned())),
            Ok(b) => match b.refusal(bookings.signer()) {
                Some(reason) => Err((Some(b.booking_id), reason)),
                None => Ok(b),
            },
        };
        match refused {
            Ok(booking) => items.push(Item {
                partition: m.partition(),
                offset: m.offset(),
                booking,
            }),
            Err((booking_id, reason)) => dead.push(DeadLetter {
                partition: m.partition(),
                offset: m.offset(),
                booking_id,
                reason,
                payload: payload.to_vec(),
            }),
        }
    }
    (items, dead)
}

/// The ledger's consumer, closed on a detached thread when dropped. librdkafka's consumer close
/// (leave the group, final commit) can block without bound while the broker is unreachable
/// (fede1024/rust-rdkafka#509): on a runtime worker or in the blocking pool it would stall the
/// shutdown of the whole process, since a runtime waits for those threads when it is dropped.
struct CloseAside(Option<Arc<LedgerConsumer>>);

impl CloseAside {
    fn shared(&self) -> Arc<LedgerConsumer> {
        self.0.clone().expect("held until dropped")
    }

    /// Closes the consumer (leaving its group) on a thread of its own and waits at most
    /// `limit` for it; past that the close goes on in the background.
    async fn close_within(mut self, limit: Duration) {
        let Some(consumer) = self.0.take() else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            drop(consumer);
            let _ = tx.send(());
        });
        if tokio::time::timeout(limit, rx).await.is_err() {
            tracing::warn!("ledger: the consumer did not close within {limit:?}; exiting anyway");
        }
    }
}

impl std::ops::Deref for CloseAside {
    type Target = LedgerConsumer;
    fn deref(&self) -> &LedgerConsumer {
        self.0.as_deref().expect("held until dropped")
    }
}

impl Drop for CloseAside {
    fn drop(&mut self) {
        if let Some(consumer) = self.0.take() {
            std::thread::spawn(move || drop(consumer));
        }
    }
}

/// The consumer of the ledger's one group member (its appliers share it).
type LedgerConsumer = StreamConsumer<LagContext>;

/// Takes the member's lag from librdkafka's statistics (every [`STATS_EVERY_MS`]): per
/// partition it holds, the high watermark of its last fetch − the committed offset (what is on
/// the partition and not applied yet), or − its position while nothing is committed. No request
/// of its own: asking the broker for watermarks after each batch slowed a 6-partition ledger
/// from 2 s to 11–22 s for 20,000 bookings on the local broker (docs/benchmarks.md).
struct LagContext {
    topic: String,
    stats: Arc<LedgerStats>,
}

impl ClientContext for LagContext {
    fn stats(&self, statistics: Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else {
            return;
        };
        let lag: i64 = topic
            .partitions
            .values()
            .filter(|p| p.partition >= 0 && p.desired && p.hi_offset >= 0)
            .map(|p| {
                let done = if p.committed_offset >= 0 {
                    p.committed_offset
                } else {
                    p.hi_offset - p.consumer_lag.max(0)
                };
                (p.hi_offset - done).max(0)
            })
            .sum();
        metrics::gauge!(telemetry::LEDGER_LAG).set(lag as f64);
    }
}

impl ConsumerContext for LagContext {
    fn post_rebalance(
        &self,
        _: &rdkafka::consumer::BaseConsumer<Self>,
        rebalance: &rdkafka::consumer::Rebalance<'_>,
    ) {
        match rebalance {
            rdkafka::consumer::Rebalance::Assign(tpl) => {
                self.stats
                    .partitions_assigned
                    .store(tpl.count() as i64, Ordering::Relaxed);
                tracing::info!(partitions = tpl.count(), "ledger applier assigned");
            }
            rdkafka::consumer::Rebalance::Revoke(_) => {
                self.stats.partitions_assigned.store(0, Ordering::Relaxed)
            }
            rdkafka::consumer::Rebalance::Error(e) => {
                tracing::warn!(error = %e, "ledger: rebalance failed")
            }
        }
    }
}

async fn apply_batch(
    db: &PgPool,
    topic: &str,
    items: &[Item],
    dead: &[DeadLetter],
) -> Result<Vec<(BookingMessage, Decision)>, sqlx::Error> {
    let batch: Vec<BookingMessage> = items.iter().map(|it| it.booking.clone()).collect();
    let mut tx = db.begin().await?;
    let mut set_aside = set_aside(&mut tx, topic, dead.iter()).await?;
    sqlx::query("SAVEPOINT batch").execute(&mut *tx).await?;
    let decided: Vec<(BookingMessage, Decision)> = match repo::apply_batch(&mut tx, &batch).await {
        Ok(d) => batch.into_iter().zip(d).collect(),
        // PostgreSQL refuses one of them (an unknown show, say): one at a time, each under its
        // own savepoint, and the refused ones set aside. A refusal of the moment (a deadlock,
        // a lock or statement timeout, a shutdown) is not the message's fault: the whole batch
        // is tried again.
        Err(sqlx::Error::Database(e)) if !transient(e.as_ref()) => {
            tracing::warn!(error = %e, "ledger: batch refused; applying one by one");
            sqlx::query("ROLLBACK TO SAVEPOINT batch")
                .execute(&mut *tx)
                .await?;
            let mut out = Vec::new();
            for it in items {
                sqlx::query("SAVEPOINT one").execute(&mut *tx).await?;
                match repo::apply_batch(&mut tx, std::slice::from_ref(&it.booking)).await {
                    Ok(mut d) => {
                        sqlx::query("RELEASE SAVEPOINT one")
                            .execute(&mut *tx)
                            .await?;
                        out.push((it.booking.clone(), d.remove(0)));
                    }
                    Err(sqlx::Error::Database(e)) if !transient(e.as_ref()) => {
                        sqlx::query("ROLLBACK TO SAVEPOINT one")
                            .execute(&mut *tx)
                            .await?;
                        let refused = DeadLetter {
                            partition: it.partition,
                            offset: it.offset,
                            booking_id: Some(it.booking.booking_id.clone()),
                            reason: format!("refused by PostgreSQL: {}", e.message()),
                            payload: serde_json::to_vec(&it.booking).unwrap_or_default(),
                        };
                        set_aside += set_aside_one(&mut tx, topic, &refused).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            out
        }
        Err(e) => return Err(e),
    };
    tx.commit().await?;
    if set_aside > 0 {
        metrics::counter!(telemetry::LEDGER_DEAD_LETTERS).increment(set_aside);
    }
    let mut sold = 0u64;
    for (b, d) in &decided {
        let status = match d {
            Decision::Confirmed => {
                sold += b.seats.len().max(b.quantity as usize) as u64;
                "confirmed"
            }
            Decision::Rejected(_) => "rejected",
            Decision::Duplicate => "duplicate",
        };
        metrics::counter!(telemetry::BOOKINGS_LEDGER, "status" => status).increment(1);
    }
    // Seats (or places) this committed batch sold.
    metrics::histogram!(telemetry::LEDGER_BATCH_SEATS).record(sold as f64);
    Ok(decided)
}

/// A PostgreSQL error that says nothing about the message: transaction rollbacks (class 40:
/// serialization failure, deadlock), insufficient resources (53), locks not available (55),
/// operator intervention (57: cancel, shutdown), connection (08) and internal (XX) errors.
fn transient(e: &dyn sqlx::error::DatabaseError) -> bool {
    let code = e.code().unwrap_or_default();
    ["40", "53", "55", "57", "08", "XX"]
        .iter()
        .any(|class| code.starts_with(class))
}

/// Records messages set aside; returns how many were new (a redelivered batch records none).
async fn set_aside<'a>(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    topic: &str,
    dead: impl Iterator<Item = &'a DeadLetter>,
) -> Result<u64, sqlx::Error> {
    let mut n = 0;
    for d in dead {
        n += set_aside_one(tx, topic, d).await?;
    }
    Ok(n)
}

async fn set_aside_one(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    topic: &str,
    d: &DeadLetter,
) -> Result<u64, sqlx::Error> {
    tracing::error!(partition = d.partition, offset = d.offset, booking = ?d.booking_id,
        reason = %d.reason, "ledger: message set aside (dead_letters)");
    Ok(sqlx::query(
        "INSERT INTO dead_letters (topic, kafka_partition, kafka_offset, booking_id, reason, payload) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
    )
    .bind(topic)
    .bind(d.partition)
    .bind(d.offset)
    .bind(&d.booking_id)
    .bind(&d.reason)
    .bind(&d.payload)
    .execute(&mut **tx)
    .await?
    .rows_affected())
}

/// Messages on the bookings topic the ledger's group has not committed yet (summed over the
/// partitions), read from the broker; None when the broker cannot tell within a few seconds.
/// A partition the group never committed on counts from its low watermark.
pub async fn ledger_lag(cfg: &KafkaConfig) -> Option<u64> {
    let cfg = cfg.clone();
    // A thread of its own (not the blocking pool): closing the consumer may block while the
    // broker is unreachable, and a runtime waits for its blocking pool when dropped.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let consumer = cfg
            .client()
            .set("group.id", &cfg.group)
            .set("enable.auto.commit", "false")
            .create::<rdkafka::consumer::BaseConsumer>();
        match consumer {
            Ok(c) => {
                let _ = tx.send(read_lag(&c, &cfg.topic));
                // Closed after the answer is sent.
                drop(c);
            }
            Err(e) => {
                let _ = tx.send(Err(e.into()));
            }
        }
    });
    let lag = tokio::time::timeout(Duration::from_secs(20), rx).await;
    match lag {
        Ok(Ok(Ok(l))) => Some(l),
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "could not read the ledger's lag");
            None
        }
        _ => None,
    }
}

fn read_lag(consumer: &rdkafka::consumer::BaseConsumer, topic: &str) -> anyhow::Result<u64> {
    {
        let timeout = Duration::from_secs(5);
        let meta = consumer.fetch_metadata(Some(topic), timeout)?;
        let mut tpl = TopicPartitionList::new();
        for t in meta.topics() {
            anyhow::ensure!(t.error().is_none(), "topic {}: {:?}", t.name(), t.error());
            for p in t.partitions() {
                tpl.add_partition(t.name(), p.id());
            }
        }
        let committed = consumer.committed_offsets(tpl, timeout)?;
        let mut lag = 0u64;
        for e in committed.elements() {
            let (low, high) = consumer.fetch_watermarks(e.topic(), e.partition(), timeout)?;
            let at = match e.offset() {
                Offset::Offset(o) => o,
                _ => low,
            };
            lag += u64::try_from(high - at).unwrap_or(0);
        }
        Ok(lag)
    }
}
