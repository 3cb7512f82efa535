//! The ledger scaled out: two appliers (as two `waitroom ledger` processes would be: each its
//! own consumer-group member and its own pool) on a 3-partition topic, deciding one seated show
//! and one general-admission show whose bookings contend for the same seats and places, with
//! bookings published twice, and one applier stopped mid-sale so the other takes its
//! partitions over. The outcome is checked exactly: every booking decided once, no seat in two
//! bookings, every rejection explained by a seat or a place someone else has.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt as _, TryStreamExt as _};
use rand::seq::IndexedRandom as _;
use rand::Rng as _;
use sqlx::Row as _;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use waitroom::booking::consumer::{Ledger, LedgerStats};
use waitroom::booking::producer::{ensure_topic, BookingProducer};
use waitroom::booking::BookingMessage;
use waitroom::seats::repo::upsert_show;
use waitroom::startup::{migrate, Services};

use crate::common::{test_config, unique};

const SEATS: usize = 120;
const GA_PLACES: i32 = 150;

/// Publishes `msgs` (keyed by booking id, so they spread over the partitions).
async fn publish(producer: &BookingProducer, msgs: &[BookingMessage]) {
    stream::iter(msgs)
        .map(|m| producer.publish(m))
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .expect("the broker takes every booking");
}

/// Waits until `ids` are all decided in PostgreSQL (bounded).
async fn wait_decided(db: &sqlx::PgPool, ids: &[Uuid], limit: Duration) {
    let started = Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM bookings WHERE booking_id = ANY($1) AND status <> 'pending'",
        )
        .bind(ids)
        .fetch_one(db)
        .await
        .unwrap();
        if n as usize == ids.len() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "{n} of {} bookings decided after {limit:?}",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn decided(stats: &LedgerStats) -> u64 {
    stats.decided.load(Ordering::Relaxed)
}

/// A ledger started before its bookings topic exists (a `waitroom ledger` deployed before the
/// first service, or one that subscribed in the same second as a service creating the topic)
/// decides what is published once the topic is there. librdkafka learns of a subscribed topic
/// created after the subscription only at its next metadata refresh, 5 minutes unless the ledger
/// asks for sooner: the bookings stayed `pending` that long, and a CI run's loadgen test hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ledger_started_before_its_topic_exists_decides_the_bookings_published_to_it() {
    waitroom::telemetry::init_tracing();
    let prefix = unique("t");
    let cfg = test_config(&prefix);
    let (_, secret) = cfg.secrets().unwrap();
    let services = Services::connect(&cfg, &secret).await.unwrap();
    migrate(services.db()).await.unwrap();
    let show = format!("{prefix}s");
    let seats = ["A-1".to_owned(), "A-2".to_owned()];
    upsert_show(services.db(), &show, &prefix, &seats, None)
        .await
        .unwrap();

    let ledger = Ledger::new(&cfg, Arc::clone(&services.bookings)).unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(ledger.run(stop.clone()));
    // Long enough for the ledger to join its group and be told its topic does not exist.
    tokio::time::sleep(Duration::from_secs(4)).await;

    ensure_topic(&cfg.kafka).await.unwrap();
    let booking = BookingMessage {
        booking_id: Uuid::new_v4().to_string(),
        show: show.clone(),
        event: prefix.clone(),
        ticket: Uuid::new_v4().to_string(),
        seats: seats.to_vec(),
        quantity: 0,
        mac: String::new(),
    }
    .signed(services.queue.signer());
    let id = Uuid::parse_str(&booking.booking_id).unwrap();
    let producer = BookingProducer::new(&cfg.kafka).unwrap();
    publish(&producer, &[booking]).await;
    // Bounded well below librdkafka's 5 minutes, above the ledger's refresh and a group join.
    wait_decided(services.db(), &[id], Duration::from_secs(45)).await;
    let status: String = sqlx::query_scalar("SELECT status FROM bookings WHERE booking_id = $1")
        .bind(id)
        .fetch_one(services.db())
        .await
        .unwrap();
    assert_eq!(status, "confirmed");
    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_appliers_on_three_partitions_decide_every_booking_once_and_sell_no_seat_twice() {
    waitroom::telemetry::init_tracing();
    let prefix = unique("t");
    let mut cfg = test_config(&prefix);
    cfg.kafka.partitions = 3;
    cfg.ledger.appliers = 1;
    // Small batches: many transactions, so the two appliers' transactions interleave.
    cfg.ledger.batch_max = 40;
    cfg.ledger.batch_window_ms = 10;
    let (_, secret) = cfg.secrets().unwrap();
    let services = Services::connect(&cfg, &secret).await.unwrap();
    migrate(services.db()).await.unwrap();
    ensure_topic(&cfg.kafka).await.unwrap();
    let (event, seated, ga) = (prefix.clone(), format!("{prefix}s"), format!("{prefix}g"));
    let seat_ids: Vec<String> = (0..SEATS).map(|i| format!("S-{i}")).collect();
    upsert_show(services.db(), &seated, &event, &seat_ids, None)
        .await
        .unwrap();
    upsert_show(services.db(), &ga, &event, &[], Some(GA_PLACES))
        .await
        .unwrap();

    // Three waves of bookings, each several times the seats and places there are.
    let signer = services.queue.signer();
    let mut rng = rand::rng();
    let mut make = |n: usize| -> Vec<BookingMessage> {
        (0..n)
            .map(|i| {
                let (show, seats, quantity) = if i % 4 == 3 {
                    (ga.clone(), Vec::new(), rng.random_range(1..=3))
                } else {
                    let k = rng.random_range(1..=3);
                    let seats: Vec<String> =
                        seat_ids.choose_multiple(&mut rng, k).cloned().collect();
                    (seated.clone(), seats, 0)
                };
                BookingMessage {
                    booking_id: Uuid::new_v4().to_string(),
                    show,
                    event: event.clone(),
                    ticket: Uuid::new_v4().to_string(),
                    seats,
                    quantity,
                    mac: String::new(),
                }
                .signed(signer)
            })
            .collect()
    };
    let waves = [make(200), make(200), make(200)];
    let producer = BookingProducer::new(&cfg.kafka).unwrap();
    let ids = |msgs: &[BookingMessage]| -> Vec<Uuid> {
        msgs.iter()
            .map(|m| Uuid::parse_str(&m.booking_id).unwrap())
            .collect()
    };

    // Two appliers, each with its own consumer and pool, as two processes would have.
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let a = Ledger::new(&cfg, Arc::clone(&services.bookings)).unwrap();
    let b = Ledger::new(&cfg, Arc::clone(&services.bookings)).unwrap();
    let (stats_a, stats_b) = (a.stats(), b.stats());
    let run_a = tokio::spawn(a.run(stop_a.clone()));
    let run_b = tokio::spawn(b.run(stop_b.clone()));

    // Wave 1 in small parts, until both appliers have decided some: the group shares the
    // partitions only once both have joined it (bounded).
    let started = Instant::now();
    for part in waves[0].chunks(10) {
        publish(&producer, part).await;
        wait_decided(services.db(), &ids(part), Duration::from_secs(90)).await;
        if decided(&stats_a) == 0 || decided(&stats_b) == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // A slow group join can outlast wave 1: small parts go on until both have decided some.
    let mut extra = Vec::new();
    while (decided(&stats_a) == 0 || decided(&stats_b) == 0)
        && started.elapsed() < Duration::from_secs(90)
    {
        let part = make(10);
        publish(&producer, &part).await;
        wait_decided(services.db(), &ids(&part), Duration::from_secs(90)).await;
        extra.extend(part);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "wave 1 decided in {:?} ({} more after it): a {}, b {}",
        started.elapsed(),
        extra.len(),
        decided(&stats_a),
        decided(&stats_b)
    );
    // Wave 2 with both running, every booking published twice (a repeated confirmation, the
    // sweeper's republication).
    publish(&producer, &waves[1]).await;
    publish(&producer, &waves[1]).await;
    wait_decided(services.db(), &ids(&waves[1]), Duration::from_secs(90)).await;
    let (a_before, b_before) = (decided(&stats_a), decided(&stats_b));
    assert!(
        a_before > 0 && b_before > 0,
        "both appliers decided bookings while both ran (a {a_before}, b {b_before})"
    );

    // Applier a stops (leaving the group): b takes every partition for wave 3.
    stop_a.cancel();
    run_a.await.unwrap().unwrap();
    publish(&producer, &waves[2]).await;
    wait_decided(services.db(), &ids(&waves[2]), Duration::from_secs(120)).await;
    assert_eq!(decided(&stats_a), a_before, "a stopped");
    stop_b.cancel();
    run_b.await.unwrap().unwrap();

    // Every booking decided exactly once: the decisions counted by the two appliers add up to
    // the distinct bookings, though 200 were published twice and partitions changed hands.
    let all: Vec<&BookingMessage> = waves.iter().flatten().chain(&extra).collect();
    assert_eq!(
        decided(&stats_a) + decided(&stats_b),
        all.len() as u64,
        "decisions by a {} and b {}",
        decided(&stats_a),
        decided(&stats_b)
    );

    // The ledger's truth, read back.
    let db = services.db();
    let status: HashMap<Uuid, String> =
        sqlx::query("SELECT booking_id, status FROM bookings WHERE show_id = ANY($1)")
            .bind(vec![seated.clone(), ga.clone()])
            .fetch_all(db)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
    assert_eq!(status.len(), all.len());
    let sold: HashMap<String, Option<Uuid>> =
        sqlx::query("SELECT seat_id, booking_id FROM seats WHERE show_id = $1")
            .bind(&seated)
            .fetch_all(db)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();

    // No seat in two confirmed bookings; each confirmed booking holds every seat it names; each
    // sold seat belongs to a confirmed booking; each rejected booking names a seat another has.
    let mut owner: HashMap<&str, Uuid> = HashMap::new();
    let (mut confirmed, mut rejected) = (0, 0);
    for m in all.iter().filter(|m| m.show == seated) {
        let id = Uuid::parse_str(&m.booking_id).unwrap();
        match status[&id].as_str() {
            "confirmed" => {
                confirmed += 1;
                for s in &m.seats {
                    assert!(
                        owner.insert(s, id).is_none(),
                        "seat {s} in two confirmed bookings"
                    );
                    assert_eq!(sold[s], Some(id), "seat {s} sold to its booking");
                }
            }
            "rejected" => {
                rejected += 1;
                assert!(
                    m.seats.iter().any(|s| sold[s].is_some_and(|o| o != id)),
                    "rejected booking {id} names no seat sold to another"
                );
            }
            other => panic!("booking {id} is {other}"),
        }
    }
    let owned: HashSet<&str> = owner.keys().copied().collect();
    for (seat, by) in &sold {
        assert_eq!(
            by.is_some(),
            owned.contains(seat.as_str()),
            "seat {seat} sold without a confirmed booking naming it"
        );
    }
    assert!(
        confirmed > 0 && rejected > 0,
        "contention: {confirmed} confirmed, {rejected} rejected"
    );

    // General admission: the places sold are the confirmed quantities, within the show, and no
    // rejected booking would have fitted in what is left.
    let ga_sold: i32 = sqlx::query_scalar("SELECT ga_sold FROM shows WHERE show_id = $1")
        .bind(&ga)
        .fetch_one(db)
        .await
        .unwrap();
    let (mut confirmed_places, mut smallest_rejected) = (0u32, u32::MAX);
    for m in all.iter().filter(|m| m.show == ga) {
        match status[&Uuid::parse_str(&m.booking_id).unwrap()].as_str() {
            "confirmed" => confirmed_places += m.quantity,
            "rejected" => smallest_rejected = smallest_rejected.min(m.quantity),
            other => panic!("GA booking is {other}"),
        }
    }
    assert_eq!(confirmed_places as i32, ga_sold);
    assert!(ga_sold <= GA_PLACES);
    assert!(
        smallest_rejected != u32::MAX,
        "GA demand exceeded the places"
    );
    assert!(
        ga_sold + smallest_rejected as i32 > GA_PLACES,
        "a rejected GA booking of {smallest_rejected} would fit: {ga_sold} of {GA_PLACES} sold"
    );
}
