//! The ledger consumer: Kafka → PostgreSQL, in batches.
//!
//! Order of a batch: read messages, set aside those that are not the service's bookings (out of
//! form or bounds, not signed), apply the rest in one PostgreSQL transaction — one at a time
//! under savepoints if PostgreSQL refuses the batch, setting aside the ones it refuses — commit
//! it, then commit the Kafka offsets, then align Redis (rejected bookings' seats freed,
//! confirmed bookings' sold marks written again, in case a failover lost them). A crash anywhere
//! before the offset commit makes the batch come again; applying is idempotent by booking id
//! ([`super::repo::apply_batch`] answers `Duplicate`), so nothing is lost and nothing applied
//! twice, and no single message can stop the ledger.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use backon::{ExponentialBuilder, Retryable as _};
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::repo::{self, Decision};
use super::{BookingMessage, Bookings};
use crate::config::KafkaConfig;
use crate::telemetry;

/// Most messages applied in one transaction.
const MAX_BATCH: usize = 500;
/// How long to wait for more messages once one has arrived.
const BATCH_WINDOW: Duration = Duration::from_millis(20);

/// Retries of a batch PostgreSQL did not take: from 100 ms, doubling to 5 s, with jitter, for as
/// long as it takes (the offsets must not move past an unapplied booking).
const RETRY_APPLY: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(5))
    .with_jitter()
    .without_max_times();

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

/// Runs the ledger until `shutdown` is cancelled.
pub async fn run(
    cfg: KafkaConfig,
    bookings: Arc<Bookings>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let db = bookings.db().clone();
    let consumer = CloseAside(Some(Arc::new(
        cfg.client()
            .set("group.id", &cfg.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            // Also the longest a rejoin waits for the group's other members: a ledger cut off
            // from the broker for longer than its session rejoins within this, not 5 minutes.
            .set("max.poll.interval.ms", "30000")
            .create()
            .context("creating the ledger consumer")?,
    )));
    consumer
        .subscribe(&[&cfg.topic])
        .context("subscribing to the bookings topic")?;
    tracing::info!(topic = %cfg.topic, group = %cfg.group, "ledger consuming");
    let result = consume(&cfg, &db, &consumer, &bookings, &shutdown).await;
    // Leave the group before returning (a member that vanishes without leaving holds its
    // partitions until the broker gives up on it), but never wait on a broker that is gone.
    consumer.close_within(Duration::from_secs(5)).await;
    result
}

/// The ledger's loop: batches in, decisions out, until `shutdown`.
async fn consume(
    cfg: &KafkaConfig,
    db: &PgPool,
    consumer: &CloseAside,
    bookings: &Arc<Bookings>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    // Exported at 0 from the start, so an alert on its increase has a series to watch.
    metrics::counter!(telemetry::LEDGER_DEAD_LETTERS).increment(0);
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            m = consumer.recv() => m,
        };
        let first = match first {
            Ok(m) => m.detach(),
            Err(e) => {
                tracing::warn!(error = %e, "ledger: kafka receive failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let batch_started = std::time::Instant::now();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout(BATCH_WINDOW, consumer.recv()).await {
                Ok(Ok(m)) => batch.push(m.detach()),
                _ => break,
            }
        }
        let (items, dead) = sort(&batch, bookings);
        // Apply until it succeeds: the offsets must not move past an unapplied booking.
        let applying = (|| apply_batch(db, &cfg.topic, &items, &dead))
            .retry(RETRY_APPLY)
            .notify(|e, wait| {
                tracing::error!(error = %e, retry_in = ?wait, "ledger: batch not applied; retrying")
            });
        let decisions = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            applied = applying => applied.context("a batch retried without end gave up")?,
        };
        let mut tpl = TopicPartitionList::new();
        for m in &batch {
            tpl.add_partition_offset(&cfg.topic, m.partition(), Offset::Offset(m.offset() + 1))
                .context("offset list")?;
        }
        // Asynchronous: a synchronous commit waits for the broker without a bound, on a
        // runtime worker (seen here: a frozen broker stalled the whole process). A commit that
        // does not land only makes the batch come again after a restart; applying it again is
        // harmless (bookings are applied once by id).
        if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!(error = %e, "ledger: offset commit failed");
        }
        metrics::histogram!(telemetry::LEDGER_BATCH_SECONDS)
            .record(batch_started.elapsed().as_secs_f64());
        // On a thread of its own, not the runtime's blocking pool: it may hold the consumer's
        // last reference, and closing a consumer can block (see CloseAside).
        let (c, topic) = (consumer.shared(), cfg.topic.clone());
        std::thread::spawn(move || {
            metrics::gauge!(telemetry::LEDGER_LAG).set(lag(&c, &topic) as f64);
        });
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
        if let Err(e) = bookings.mark_confirmed(&confirmed).await {
            tracing::warn!(error = %e, "ledger: could not write confirmed sold marks to Redis");
        }
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
struct CloseAside(Option<Arc<StreamConsumer>>);

impl CloseAside {
    fn shared(&self) -> Arc<StreamConsumer> {
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
    type Target = StreamConsumer;
    fn deref(&self) -> &StreamConsumer {
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

/// Messages on the topic not yet applied: high watermark − position, over the partitions this
/// consumer holds. Asks the broker (blocking), so it runs on a thread of its own.
fn lag(consumer: &StreamConsumer, topic: &str) -> i64 {
    let Ok(positions) = consumer.position() else {
        return 0;
    };
    positions
        .elements_for_topic(topic)
        .iter()
        .filter_map(|e| {
            let Offset::Offset(pos) = e.offset() else {
                return None;
            };
            let (_, high) = consumer
                .fetch_watermarks(topic, e.partition(), Duration::from_millis(500))
                .ok()?;
            Some((high - pos).max(0))
        })
        .sum()
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
        // own savepoint, and the refused ones set aside.
        Err(sqlx::Error::Database(e)) => {
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
                    Err(sqlx::Error::Database(e)) => {
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
