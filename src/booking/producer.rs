//! Publishing bookings to Kafka.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::types::RDKafkaErrorCode;

use super::{BookingError, BookingMessage};
use crate::config::KafkaConfig;
use crate::sync::{Guard as _, Guards as _};

/// Fewest seconds between two replacements of the producer.
const RESET_EVERY: Duration = Duration::from_secs(5);

/// The producer of the bookings topic.
///
/// When a publish fails with anything but a plain timeout (or the client reports a fatal error),
/// the producer is replaced by a new one at most every [`RESET_EVERY`]: a producer can be left
/// unable to produce, and bookings of unknown outcome are published again by the sweeper anyway.
#[derive(Clone)]
pub struct BookingProducer {
    producer: Arc<RwLock<FutureProducer>>,
    last_reset: Arc<Mutex<Instant>>,
    cfg: KafkaConfig,
    ack_timeout: Duration,
}

fn producer(cfg: &KafkaConfig) -> anyhow::Result<FutureProducer> {
    cfg.client()
        .set("enable.idempotence", cfg.idempotence.to_string())
        .set("acks", "all")
        .set("linger.ms", "1")
        .set("message.timeout.ms", cfg.ack_timeout_ms.to_string())
        .create()
        .context("creating the Kafka producer")
}

impl BookingProducer {
    /// A producer with `acks=all` (idempotence as configured: off by default).
    pub fn new(cfg: &KafkaConfig) -> anyhow::Result<Self> {
        Ok(BookingProducer {
            producer: Arc::new(RwLock::new(producer(cfg)?)),
            last_reset: Arc::new(Mutex::new(Instant::now())),
            cfg: cfg.clone(),
            ack_timeout: Duration::from_millis(cfg.ack_timeout_ms),
        })
    }

    /// Publishes one booking and waits until the broker has it (or fails).
    pub async fn publish(&self, booking: &BookingMessage) -> Result<(), BookingError> {
        let payload = serde_json::to_vec(booking).expect("booking serializes");
        // Keyed by booking id: a sale spreads over every partition (and so over every applier),
        // while the copies of one booking (a repeat, the sweeper's republication) share one.
        let record = FutureRecord::to(&self.cfg.topic)
            .key(booking.booking_id.as_bytes())
            .payload(&payload);
        let producer = self.producer.read_guard().clone();
        let sent = producer.send(record, self.ack_timeout).await;
        match sent {
            Ok(_) => Ok(()),
            Err((e, _)) => {
                let timed_out = matches!(
                    e,
                    KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)
                );
                if !timed_out || producer.client().fatal_error().is_some() {
                    self.replace();
                }
                Err(BookingError::Kafka(e.to_string()))
            }
        }
    }

    /// A new producer in place of the current one (at most every [`RESET_EVERY`]).
    fn replace(&self) {
        let mut last = self.last_reset.guard();
        if last.elapsed() < RESET_EVERY {
            return;
        }
        *last = Instant::now();
        match producer(&self.cfg) {
            Ok(p) => {
                *self.producer.write_guard() = p;
                tracing::warn!("kafka producer replaced after a failed publish");
            }
            Err(e) => tracing::warn!(error = %e, "kafka producer could not be replaced"),
        }
    }
}

/// Creates the bookings topic with `cfg.partitions` partitions when it does not exist yet.
pub async fn ensure_topic(cfg: &KafkaConfig) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = cfg
        .client()
        .create()
        .context("creating the Kafka admin client")?;
    let topic = NewTopic::new(&cfg.topic, cfg.partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(5)));
    let results = admin
        .create_topics([&topic], &opts)
        .await
        .context("creating the bookings topic")?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => anyhow::bail!("creating topic {name}: {code}"),
        }
    }
    Ok(())
}
