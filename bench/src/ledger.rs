//! `waitroom-bench ledger-bench`: how fast confirmed seats reach PostgreSQL through Kafka.
//!
//! For each partition count asked for, and each run: a show with `bookings × seats_per_booking`
//! seats and a fresh topic of that many partitions; the ledger started on a fresh group with as
//! many appliers as partitions, and left to settle (every partition held: joining a group is
//! start-up, not throughput); then every booking published at once with the service's
//! producer (each acknowledged by the broker), timed from the first publish until every booking
//! is confirmed in PostgreSQL; then the same messages read back by a bare consumer (the broker's
//! fetch speed alone, no SQL). Reported: confirmed seats per second, published → confirmed, the
//! ledger's time per phase, and a check that every seat was sold once, to the booking that
//! names it. Nothing here is a test: it
//! reports figures (the check only refuses to report a figure of a wrong outcome).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::{stream, StreamExt as _, TryStreamExt as _};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use waitroom::booking::consumer::Ledger;
use waitroom::booking::producer::{ensure_topic, BookingProducer};
use waitroom::booking::BookingMessage;
use waitroom::config::Config;
use waitroom::seats::repo;
use waitroom::startup::{migrate, Services};

/// Options of `waitroom-bench ledger-bench`.
#[derive(Debug, Clone, Args)]
pub struct LedgerBenchArgs {
    /// Bookings to publish and apply (per run).
    #[arg(long, default_value_t = 20_000)]
    pub bookings: usize,
    /// Seats in each booking.
    #[arg(long, default_value_t = 2)]
    pub seats_per_booking: usize,
    /// Partition counts of the bookings topic to measure, comma-separated; each runs with as
    /// many appliers.
    #[arg(long = "partitions", value_delimiter = ',', default_value = "1")]
    pub partition_counts: Vec<i32>,
    /// Runs per partition count (the median is reported).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Where to find Redis, PostgreSQL and Kafka (the local stack by default).
    #[command(flatten)]
    pub config: Config,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerRun {
    /// Partitions of the topic (and appliers).
    pub partitions: i32,
    /// Bookings.
    pub bookings: usize,
    /// Seats per booking.
    pub seats_per_booking: usize,
    /// Bookings published and acknowledged per second (256 in flight), while the ledger ran.
    pub published_per_second: f64,
    /// Messages a bare consumer read back per second (the broker's fetch path alone).
    pub fetched_per_second: f64,
    /// Seconds from the first publish until every booking was confirmed.
    pub apply_seconds: f64,
    /// Confirmed seats per second into PostgreSQL, published → confirmed.
    pub confirmed_seats_per_second: f64,
    /// Seconds the ledger's group took to settle before the measurement (start-up, not
    /// counted).
    pub join_seconds: f64,
    /// Batches the ledger committed.
    pub batches: u64,
    /// Mean messages per batch.
    pub mean_batch: f64,
    /// Seconds in each phase, summed over the appliers: receive, sql, offsets, align.
    pub receive_seconds: f64,
    /// Seconds in PostgreSQL transactions.
    pub sql_seconds: f64,
    /// Seconds storing offsets.
    pub offsets_seconds: f64,
    /// Seconds aligning Redis.
    pub align_seconds: f64,
}

/// Every run, and the median confirmed seats per second of each partition count.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerReport {
    /// Each run, in order.
    pub runs: Vec<LedgerRun>,
    /// (partitions, median confirmed seats per second).
    pub medians: Vec<(i32, f64)>,
}

/// Runs the measurement and prints it.
pub async fn run(args: LedgerBenchArgs) -> anyhow::Result<LedgerReport> {
    let (_, secret) = args.config.secrets()?;
    let services = Services::connect(&args.config, &secret).await?;
    migrate(services.db()).await?;
    let producer_cfg = args.config.kafka.clone();
    let mut runs = Vec::new();
    println!(
        "| partitions = appliers | bookings | seats/booking | published/s (acked) | fetched/s (bare consumer) | first publish → all confirmed | group settled in (not counted) | confirmed seats/s | batches | mean batch | receive s | sql s | offsets s | align s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &partitions in &args.partition_counts {
        for _ in 0..args.runs.max(1) {
            let mut config = args.config.clone();
            config.kafka = producer_cfg.clone();
            config.kafka.partitions = partitions;
            config.ledger.appliers = partitions as u32;
            config.ledger.db_connections = config.ledger.db_connections.max(partitions as u32);
            let r = one(&args, config, &services).await?;
            println!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.2} s | {:.2} s | {:.0} | {} | {:.0} | {:.2} | {:.2} | {:.3} | {:.2} |",
                r.partitions,
                r.bookings,
                r.seats_per_booking,
                r.published_per_second,
                r.fetched_per_second,
                r.apply_seconds,
                r.join_seconds,
                r.confirmed_seats_per_second,
                r.batches,
                r.mean_batch,
                r.receive_seconds,
                r.sql_seconds,
                r.offsets_seconds,
                r.align_seconds
            );
            runs.push(r);
        }
    }
    let medians: Vec<(i32, f64)> = args
        .partition_counts
        .iter()
        .map(|&p| {
            let mut v: Vec<f64> = runs
                .iter()
                .filter(|r| r.partitions == p)
                .map(|r| r.confirmed_seats_per_second)
                .collect();
            v.sort_by(f64::total_cmp);
            (p, v[v.len() / 2])
        })
        .collect();
    for (p, m) in &medians {
        println!(
            "partitions {p}: median {m:.0} confirmed seats/s over {} runs",
            args.runs.max(1)
        );
    }
    Ok(LedgerReport { runs, medians })
}

/// One run on a fresh topic, group and show.
async fn one(
    args: &LedgerBenchArgs,
    mut config: Config,
    services: &Services,
) -> anyhow::Result<LedgerRun> {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..10];
    config.kafka.topic = format!("bench-{tag}.bookings");
    config.kafka.group = format!("bench-{tag}-ledger");
    ensure_topic(&config.kafka).await?;
    topic_ready(&config).await?;
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
    // The ledger first, on an empty topic, until its group has settled (every partition held):
    // joining a group is start-up, not throughput. Then every
    // booking is published at once and the time runs from the first publish to the last
    // confirmation: published → confirmed, end to end.
    let shutdown = CancellationToken::new();
    let ledger = Ledger::new(&config, Arc::clone(&services.bookings))?;
    let stats = ledger.stats();
    let join_started = Instant::now();
    let running = tokio::spawn(ledger.run(shutdown.clone()));
    loop {
        let held = stats.partitions_assigned.load(Ordering::Relaxed);
        if held == i64::from(config.kafka.partitions) {
            // Settled for a moment, not in the middle of another round.
            tokio::time::sleep(Duration::from_secs(1)).await;
            if stats.partitions_assigned.load(Ordering::Relaxed) == held {
                break;
            }
        }
        anyhow::ensure!(
            join_started.elapsed() < Duration::from_secs(120),
            "the ledger's group did not settle in 2 minutes: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let join_seconds = join_started.elapsed().as_secs_f64();
    let started = Instant::now();
    let publishing = {
        let sends: Vec<_> = messages
            .iter()
            .map(|m| {
                let (producer, m) = (producer.clone(), m.clone());
                async move { producer.publish(&m).await }
            })
            .collect();
        let n = messages.len();
        tokio::spawn(async move {
            let started = Instant::now();
            stream::iter(sends)
                .buffer_unordered(256)
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| anyhow::anyhow!("publishing: {e}"))?;
            anyhow::Ok(n as f64 / started.elapsed().as_secs_f64())
        })
    };
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
        anyhow::ensure!(!running.is_finished(), "the ledger stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let apply_seconds = started.elapsed().as_secs_f64();
    let published_per_second = publishing.await??;
    shutdown.cancel();
    let _ = running.await;
    let fetched_per_second = fetch_only(&config, messages.len()).await?;
    // Every seat sold once, to the confirmed booking that names it.
    let wrong: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM seats s LEFT JOIN bookings b ON b.booking_id = s.booking_id \
         WHERE s.show_id = $1 AND (s.status <> 'SOLD' OR b.status IS DISTINCT FROM 'confirmed' \
         OR NOT (s.seat_id = ANY(b.seats)))",
    )
    .bind(&show)
    .fetch_one(services.db())
    .await?;
    anyhow::ensure!(
        wrong == 0,
        "{wrong} seats not sold to their confirmed booking"
    );
    let batches = stats.batches.load(Ordering::Relaxed);
    let secs = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed) as f64 / 1e6;
    Ok(LedgerRun {
        partitions: config.kafka.partitions,
        bookings: messages.len(),
        seats_per_booking: args.seats_per_booking,
        published_per_second,
        fetched_per_second,
        apply_seconds,
        confirmed_seats_per_second: seats.len() as f64 / apply_seconds,
        join_seconds,
        batches,
        mean_batch: stats.messages.load(Ordering::Relaxed) as f64 / batches.max(1) as f64,
        receive_seconds: secs(&stats.receive_us),
        sql_seconds: secs(&stats.sql_us),
        offsets_seconds: secs(&stats.offsets_us),
        align_seconds: secs(&stats.align_us),
    })
}

/// Reads `n` messages of the topic with a bare consumer on a group of its own, nothing else
/// done with them: the broker's fetch speed, for comparison with the ledger's. Messages/s.
async fn fetch_only(config: &Config, n: usize) -> anyhow::Result<f64> {
    let consumer: StreamConsumer = config
        .kafka
        .client()
        .set("group.id", format!("{}-fetch", config.kafka.group))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .context("creating the fetch consumer")?;
    consumer.subscribe(&[&config.kafka.topic])?;
    tokio::time::timeout(Duration::from_secs(60), consumer.recv())
        .await
        .context("no message for 60 s")??;
    // Timed from the first message: joining the group is not the fetch path.
    let started = Instant::now();
    let mut seen = 1;
    while seen < n {
        tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .context("no message for 60 s")??;
        seen += 1;
    }
    let rate = (n - 1) as f64 / started.elapsed().as_secs_f64();
    // Closing blocks while librdkafka leaves the group: not on a runtime worker.
    std::thread::spawn(move || drop(consumer));
    Ok(rate)
}

/// Waits (bounded) until the broker's metadata shows every partition of the fresh topic: a group
/// that assigns partitions before then holds only those it saw, until its next metadata refresh.
async fn topic_ready(config: &Config) -> anyhow::Result<()> {
    let (kafka, want) = (config.kafka.clone(), config.kafka.partitions as usize);
    tokio::task::spawn_blocking(move || {
        let client: rdkafka::consumer::BaseConsumer = kafka.client().create()?;
        let started = Instant::now();
        loop {
            let meta = client.fetch_metadata(Some(&kafka.topic), Duration::from_secs(5))?;
            let seen = meta
                .topics()
                .iter()
                .find(|t| t.name() == kafka.topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len());
            if seen == want {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "topic {} shows {seen} of {want} partitions after 30 s",
                kafka.topic
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await?
}
