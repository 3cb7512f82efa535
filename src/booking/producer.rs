//! Publishing bookings to Kafka.

use std::time::Duration;

use anyhow::Context as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use super::{BookingError, BookingMessage};
use crate::config::KafkaConfig;

/// Partitions of a topic created by the service.
const PARTITIONS: i32 = 3;

/// An idempotent producer for the bookings topic.
#[derive(Clone)]
pub struct BookingProducer {
    producer: FutureProducer,
    topic: String,
    ack_timeout: Duration,
}

impl BookingProducer {
    /// A producer with `acks=all` and idempotence on (no duplicates or reordering on retry).
    pub fn new(cfg: &KafkaConfig) -> anyhow::Result<Self> {
        let producer: FutureProducer = cfg
            .client()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set("message.timeout.ms", cfg.ack_timeout_ms.to_string())
            .create()
            .context("creating the Kafka producer")?;
        Ok(BookingProducer {
            producer,
            topic: cfg.topic.clone(),
            ack_timeout: Duration::from_millis(cfg.ack_timeout_ms),
        })
    }

    /// Publishes one booking and waits until the broker has it (or fails).
    pub async fn publish(&self, booking: &BookingMessage) -> Result<(), BookingError> {
        let payload = serde_json::to_vec(booking).expect("booking serializes");
        let record = FutureRecord::to(&self.topic)
            .key(booking.show.as_bytes())
            .payload(&payload);
        self.producer
            .send(record, self.ack_timeout)
            .await
            .map(|_| ())
            .map_err(|(e, _)| BookingError::Kafka(e.to_string()))
    }
}

/// Creates the bookings topic when it does not exist yet.
pub async fn ensure_topic(cfg: &KafkaConfig) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = cfg
        .client()
        .create()
        .context("creating the Kafka admin client")?;
    let topic = NewTopic::new(&cfg.topic, PARTITIONS, TopicReplication::Fixed(1));
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
