//! The ledger consumer: Kafka → PostgreSQL, in batches.
//!
//! Order of a batch: read messages, apply them all in one PostgreSQL transaction, commit it,
//! then commit the Kafka offsets, then tell Redis about rejected bookings. A crash anywhere
//! before the offset commit makes the batch come again; applying is idempotent by booking id
//! ([`super::repo::apply_batch`] answers `Duplicate`), so nothing is lost and nothing applied twice.

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

/// One consumed message, owned.
struct Item {
    partition: i32,
    offset: i64,
    booking: Option<BookingMessage>,
}

/// Runs the ledger until `shutdown` is cancelled.
pub async fn run(
    cfg: KafkaConfig,
    bookings: Arc<Bookings>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let db = bookings.db().clone();
    let consumer: Arc<StreamConsumer> = Arc::new(
        cfg.client()
            .set("group.id", &cfg.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .create()
            .context("creating the ledger consumer")?,
    );
    consumer
        .subscribe(&[&cfg.topic])
        .context("subscribing to the bookings topic")?;
    tracing::info!(topic = %cfg.topic, group = %cfg.group, "ledger consuming");
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
        let items: Vec<Item> = batch
            .iter()
            .map(|m| Item {
                partition: m.partition(),
                offset: m.offset(),
                booking: m.payload().and_then(|p| serde_json::from_slice(p).ok()),
            })
            .collect();
        for it in items.iter().filter(|it| it.booking.is_none()) {
            metrics::counter!(telemetry::LEDGER_DEAD_LETTERS).increment(1);
            tracing::error!(
                partition = it.partition,
                offset = it.offset,
                "ledger: unreadable message set aside"
            );
        }
        // Apply until it succeeds: the offsets must not move past an unapplied booking.
        let applying = (|| apply_batch(&db, &items))
            .retry(RETRY_APPLY)
            .notify(|e, wait| {
                tracing::error!(error = %e, retry_in = ?wait, "ledger: batch not applied; retrying")
            });
        let decisions = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            applied = applying => applied.context("a batch retried without end gave up")?,
        };
        let mut tpl = TopicPartitionList::new();
        for it in &items {
            tpl.add_partition_offset(&cfg.topic, it.partition, Offset::Offset(it.offset + 1))
                .context("offset list")?;
        }
        if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
            // The batch will come again after a restart; applying it again is harmless.
            tracing::warn!(error = %e, "ledger: offset commit failed");
        }
        metrics::histogram!(telemetry::LEDGER_BATCH_SECONDS)
            .record(batch_started.elapsed().as_secs_f64());
        let (c, topic) = (consumer.clone(), cfg.topic.clone());
        tokio::task::spawn_blocking(move || {
            metrics::gauge!(telemetry::LEDGER_LAG).set(lag(&c, &topic) as f64);
        });
        for (booking, decision) in decisions {
            if let Decision::Rejected(truth) = decision {
                if let Err(e) = bookings.settle_rejected(&booking, &truth).await {
                    tracing::warn!(error = %e, booking = %booking.booking_id,
                        "ledger: could not align Redis with a rejected booking; reconcile will");
                }
            }
        }
    }
}

/// Messages on the topic not yet applied: high watermark − position, over the partitions this
/// consumer holds. Asks the broker (blocking), so it runs on the blocking pool.
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
    items: &[Item],
) -> Result<Vec<(BookingMessage, Decision)>, sqlx::Error> {
    let batch: Vec<BookingMessage> = items.iter().filter_map(|it| it.booking.clone()).collect();
    let mut tx = db.begin().await?;
    let decisions = repo::apply_batch(&mut tx, &batch).await?;
    tx.commit().await?;
    let mut sold = 0u64;
    for (b, d) in batch.iter().zip(&decisions) {
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
    Ok(batch.into_iter().zip(decisions).collect())
}
