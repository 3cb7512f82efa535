//! `waitroom-bench ledger-bench`: how fast confirmed seats reach PostgreSQL through Kafka.
//!
//! It creates a show with `bookings × seats_per_booking` seats, publishes that many bookings
//! to a fresh topic with the service's producer (measuring publish throughput, each message
//! acknowledged by the broker), then starts the ledger consumer on a fresh group and times how
//! long it takes until every booking is confirmed in PostgreSQL: confirmed seats per second,
//! batched as in production. Nothing here is a test: it reports figures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use futures::{stream, StreamExt as _, TryStreamExt as _};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use waitroom::booking::producer::{ensure_topic, BookingProducer};
use waitroom::booking::{consumer, BookingMessage};
use waitroom::config::Config;
use waitroom::seats::repo;
use waitroom::startup::{migrate, Services};

/// Options of `waitroom-bench ledger-bench`.
#[derive(Debug, Clone, Args)]
pub struct LedgerBenchArgs {
    /// Bookings to publish and apply.
    #[arg(long, default_value_t = 20_000)]
    pub bookings: usize,
    /// Seats in each booking.
    #[arg(long, default_value_t = 2)]
    pub seats_per_booking: usize,
    /// Where to find Redis, PostgreSQL and Kafka (the local stack by default).
    #[command(flatten)]
    pub config: Config,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerReport {
    /// Bookings.
    pub bookings: usize,
    /// Seats per booking.
    pub seats_per_booking: usize,
    /// Bookings published and acknowledged per second (256 in flight).
    pub published_per_second: f64,
    /// Seconds from starting the ledger until every booking was confirmed.
    pub apply_seconds: f64,
    /// Confirmed seats per second into PostgreSQL.
    pub confirmed_seats_per_second: f64,
}

/// Runs the measurement and prints it.
pub async fn run(args: LedgerBenchArgs) -> anyhow::Result<LedgerReport> {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let mut config = args.config.clone();
    config.kafka.topic = format!("bench-{tag}.bookings");
    config.kafka.group = format!("bench-{tag}-ledger");
    let (_, secret) = config.secrets()?;
    let services = Services::connect(&config, &secret).await?;
    migrate(services.db()).await?;
    ensure_topic(&config.kafka).await?;
    let (event, show) = (format!("bench{tag}"), format!("bench{tag}"));
    let seats: Vec<String> = (0..args.bookings * args.seats_per_booking)
        .map(|i| format!("S-{i}"))
        .collect();
    repo::upsert_show(services.db(), &show, &event, &seats, None).await?;

    let producer = BookingProducer::new(&config.kafka)?;
    let messages: Vec<BookingMessage> = seats
        .chunks(args.seats_per_booking)
        .map(|chunk| {
            BookingMessage {
                booking_id: uuid::Uuid::new_v4().to_string(),
                show: show.clone(),
                event: event.clone(),
                ticket: uuid::Uuid::new_v4().to_string(),
                seats: chunk.to_vec(),
                quantity: 0,
                mac: String::new(),
            }
            .signed(services.queue.signer())
        })
        .collect();
    let started = Instant::now();
    stream::iter(&messages)
        .map(|m| producer.publish(m))
        .buffer_unordered(256)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| anyhow::anyhow!("publishing: {e}"))?;
    let published_per_second = messages.len() as f64 / started.elapsed().as_secs_f64();

    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let ledger = tokio::spawn(consumer::run(
        config.kafka.clone(),
        Arc::clone(&services.bookings),
        shutdown.clone(),
    ));
    loop {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM bookings WHERE show_id = $1 AND status = 'confirmed'",
        )
        .bind(&show)
        .fetch_one(services.db())
        .await?;
        if done as usize >= messages.len() {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "ledger did not finish in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let apply_seconds = started.elapsed().as_secs_f64();
    shutdown.cancel();
    let _ = ledger.await;
    let report = LedgerReport {
        bookings: messages.len(),
        seats_per_booking: args.seats_per_booking,
        published_per_second,
        apply_seconds,
        confirmed_seats_per_second: seats.len() as f64 / apply_seconds,
    };
    println!("| bookings | seats/booking | published/s (acked) | apply time | confirmed seats/s |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {:.0} | {:.2} s | {:.0} |",
        report.bookings,
        report.seats_per_booking,
        report.published_per_second,
        report.apply_seconds,
        report.confirmed_seats_per_second
    );
    Ok(report)
}
