//! A 201 is a seat (docs/reliability.md): bookings while the broker is frozen past the ack
//! timeout, a double submit racing it, the service killed between marking seats sold and the
//! broker's answer, and poison messages on the topic. Each runs a sale with concurrent buyers on
//! a private broker and asserts the exact outcome: every booking answered ends `confirmed`, no
//! seat is in two confirmed bookings, no seat stays sold without a booking the ledger decided.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use futures::future::join_all;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::procs::{Broker, Partition};
use crate::common::{db, eventually, free_port, spawn_app_with, unique, TestApp, ADMIN_TOKEN};

/// An event admitting at once and a 40-seat show (rows A-D of 10).
async fn sale(app: &TestApp) -> (String, String) {
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"shards": 2, "admit_per_second": 100000, "active_capacity": 100000}),
    )
    .await;
    let show = unique("s");
    app.create_show(
        &show,
        json!({"event": ev, "rows": "A-D", "seats_per_row": 10}),
    )
    .await;
    (ev, show)
}

/// `n` buyers admitted, each holding two seats of its own: (token, hold id, seats).
async fn holders(
    app: &TestApp,
    ev: &str,
    show: &str,
    n: usize,
) -> Vec<(String, String, Vec<String>)> {
    let rows = ["A", "B", "C", "D"];
    let mut out = Vec::new();
    for i in 0..n {
        let token = app.admitted(ev, &format!("buyer-{i}")).await;
        let seats: Vec<String> = (0..2)
            .map(|k| format!("{}-{}", rows[(2 * i + k) / 10], (2 * i + k) % 10 + 1))
            .collect();
        let r = app
            .http
            .post(format!("{}/v1/shows/{show}/holds", app.base))
            .bearer_auth(&token)
            .json(&json!({"seats": seats}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let hold = r.json::<Value>().await.unwrap()["hold_id"]
            .as_str()
            .unwrap()
            .to_owned();
        out.push((token, hold, seats));
    }
    out
}

async fn book(
    http: &reqwest::Client,
    base: &str,
    show: &str,
    token: &str,
    hold: &str,
) -> (StatusCode, Value) {
    let r = http
        .post(format!("{base}/v1/shows/{show}/bookings"))
        .bearer_auth(token)
        .json(&json!({"hold_id": hold}))
        .send()
        .await
        .expect("the service answers");
    let status = r.status();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        assert!(
            r.headers().contains_key("retry-after"),
            "503 without Retry-After"
        );
    }
    (status, r.json().await.unwrap_or_default())
}

/// Waits until every booking is decided and returns their statuses.
async fn decided(app: &TestApp, ids: &[String], limit: Duration) -> HashMap<String, String> {
    eventually(limit, "every booking decided", || async {
        let mut out = HashMap::new();
        for id in ids {
            let r = app.get(&format!("/v1/bookings/{id}")).await;
            if r.status() != StatusCode::OK {
                return None;
            }
            let s = r.json::<Value>().await.unwrap()["status"]
                .as_str()
                .unwrap()
                .to_owned();
            if s == "pending" {
                return None;
            }
            out.insert(id.clone(), s);
        }
        Some(out)
    })
    .await
}

/// The exact end state of a show: no seat in two confirmed bookings (PostgreSQL), and Redis's
/// sold marks are exactly the confirmed bookings' seats.
async fn assert_consistent(app: &TestApp, show: &str, expect_sold: usize) {
    let db = db().await;
    let rows: Vec<(String, Vec<String>)> = sqlx::query_as(
        "SELECT booking_id::text, seats FROM bookings WHERE show_id = $1 AND status = 'confirmed'",
    )
    .bind(show)
    .fetch_all(&db)
    .await
    .unwrap();
    let mut seen = HashSet::new();
    for (_, seats) in &rows {
        for s in seats {
            assert!(
                seen.insert(s.clone()),
                "seat {s} is in two confirmed bookings"
            );
        }
    }
    assert_eq!(seen.len(), expect_sold, "seats in confirmed bookings");
    let sold_in_db: i64 =
        sqlx::query_scalar("SELECT count(*) FROM seats WHERE show_id = $1 AND status = 'SOLD'")
            .bind(show)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(sold_in_db as usize, expect_sold);
    let map: Value = app.seat_map(show).await;
    let sold_in_redis: HashSet<String> = map["seats"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "sold")
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        sold_in_redis, seen,
        "Redis sells exactly the confirmed seats"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bookings_past_the_ack_timeout_are_never_undone_and_all_end_confirmed() {
    // The service reaches the broker only through a proxy that can cut the network. (Freezing
    // tansu itself with SIGSTOP breaks its sqlite engine: a produce retried after the freeze
    // panics its idempotence check, and it never recovers. The proxy swallows requests instead,
    // so the broker never sees a write twice.)
    let proxy_port = free_port();
    let broker = Broker::start_behind(free_port(), proxy_port);
    let partition = Partition::start(proxy_port, broker.port).await;
    // The ledger runs in a second instance started after the partition heals: this test is
    // about the booking side (a ledger cut off from its group coordinator is another fault).
    let prefix = unique("t");
    let tweak = |c: &mut waitroom::config::Config| {
        c.kafka.brokers = broker.addr();
        c.kafka.ack_timeout_ms = 1500;
        c.redis.key_prefix = prefix.clone();
        c.kafka.topic = format!("{prefix}.bookings");
        c.kafka.group = format!("{prefix}-ledger");
    };
    let app = spawn_app_with(|c| {
        tweak(c);
        c.kafka.no_ledger = true;
    })
    .await;
    let (ev, show) = sale(&app).await;
    let buyers = holders(&app, &ev, &show, 10).await;
    partition.freeze();
    // Every buyer confirms twice at once (a double click), while the broker answers nothing.
    let answers = join_all(buyers.iter().map(|(token, hold, _)| {
        let (http, base, show) = (app.http.clone(), app.base.clone(), show.clone());
        async move {
            let (a, b) = tokio::join!(
                book(&http, &base, &show, token, hold),
                book(&http, &base, &show, token, hold)
            );
            [a, b]
        }
    }))
    .await;
    let mut ids = Vec::new();
    let mut unknown = 0;
    for pair in &answers {
        let id_of = |(status, body): &(StatusCode, Value)| {
            assert!(
                *status == StatusCode::CREATED || *status == StatusCode::SERVICE_UNAVAILABLE,
                "{status} {body}"
            );
            body["booking_id"]
                .as_str()
                .expect("every answer names the booking")
                .to_owned()
        };
        let (a, b) = (id_of(&pair[0]), id_of(&pair[1]));
        assert_eq!(a, b, "a double submit names one booking");
        unknown += pair
            .iter()
            .filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
            .count();
        ids.push(a);
    }
    assert!(
        unknown > 0,
        "the frozen broker caused no unknown outcome: the fault was not real"
    );
    // Nothing was undone on a guess: every seat is still sold while the broker is frozen.
    let map: Value = app.seat_map(&show).await;
    let sold = map["seats"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "sold")
        .count();
    assert_eq!(sold, 20, "a booking with an unknown outcome was undone");
    for id in &ids {
        let r = app.get(&format!("/v1/bookings/{id}")).await;
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "the buyer can follow booking {id}"
        );
    }
    partition.thaw();
    let ledger = spawn_app_with(tweak).await;
    let statuses = decided(&app, &ids, Duration::from_secs(90)).await;
    assert!(statuses.values().all(|s| s == "confirmed"), "{statuses:?}");
    assert_consistent(&app, &show, 20).await;
    // Both services stop while the broker still runs (it is dropped last).
    ledger.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_killed_between_marking_seats_and_the_ack_leaves_nothing_stuck() {
    let proxy_port = free_port();
    let broker = Broker::start_behind(free_port(), proxy_port);
    let partition = Partition::start(proxy_port, broker.port).await;
    let prefix = unique("t");
    let topic = format!("{prefix}.bookings");
    let tweak = |c: &mut waitroom::config::Config| {
        c.kafka.brokers = broker.addr();
        c.redis.key_prefix = prefix.clone();
        c.kafka.topic = topic.clone();
        c.kafka.group = format!("{prefix}-ledger");
    };
    // The sale is set up through an in-process instance, which then stops.
    let app = spawn_app_with(tweak).await;
    let (ev, show) = sale(&app).await;
    let buyers = holders(&app, &ev, &show, 5).await;
    app.stop().await;
    // The buyers confirm through a separate service process while the broker is frozen.
    let port = free_port();
    let mut child = crate::common::procs::dies_with_test(env!("CARGO_BIN_EXE_waitroom"))
        .arg("serve")
        .env("WAITROOM_ENV", "development")
        .env("WAITROOM_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("WAITROOM_KEY_PREFIX", &prefix)
        .env("WAITROOM_KAFKA_BROKERS", broker.addr())
        .env("WAITROOM_KAFKA_TOPIC", &topic)
        .env("WAITROOM_KAFKA_GROUP", format!("{prefix}-ledger"))
        .env("WAITROOM_KAFKA_ACK_TIMEOUT_MS", "60000")
        .env("WAITROOM_NO_LEDGER", "true")
        .env("WAITROOM_REQUEST_TIMEOUT_SECONDS", "90")
        .env("WAITROOM_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("WAITROOM_CLIENT_RATE_PER_SECOND", "0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    eventually(Duration::from_secs(20), "the process serves", || async {
        let r = http.get(format!("{base}/readyz")).send().await.ok()?;
        (r.status() == StatusCode::OK).then_some(())
    })
    .await;
    partition.freeze();
    for (token, hold, _) in &buyers {
        let (http, base, show, token, hold) = (
            http.clone(),
            base.clone(),
            show.clone(),
            token.clone(),
            hold.clone(),
        );
        // These requests die with the process: their answers are not awaited.
        tokio::spawn(async move {
            let _ = http
                .post(format!("{base}/v1/shows/{show}/bookings"))
                .bearer_auth(&token)
                .json(&json!({"hold_id": hold}))
                .send()
                .await;
        });
    }
    // book.lua has run for all five (their seats read sold), the broker has answered none.
    eventually(
        Duration::from_secs(20),
        "every seat marked sold",
        || async {
            let map: Value = http
                .get(format!("{base}/v1/shows/{show}/seats"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let sold = map["seats"]
                .as_array()?
                .iter()
                .filter(|s| s["state"] == "sold")
                .count();
            (sold == 10).then_some(())
        },
    )
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    partition.thaw();
    // Another instance on the same line takes over; nobody runs reconcile by hand.
    let app = spawn_app_with(tweak).await;
    let ids: Vec<String> = {
        let mut conn = app.redis.clone();
        let mut ids = Vec::new();
        for (_, hold, _) in &buyers {
            let raw: String =
                redis::AsyncCommands::hget(&mut conn, app.keys.show(&show).holdrec, hold)
                    .await
                    .unwrap();
            let rec: Value = serde_json::from_str(&raw).unwrap();
            ids.push(
                rec["booking"]
                    .as_str()
                    .expect("marked as booked")
                    .to_owned(),
            );
        }
        ids
    };
    let statuses = decided(&app, &ids, Duration::from_secs(90)).await;
    assert!(statuses.values().all(|s| s == "confirmed"), "{statuses:?}");
    assert_consistent(&app, &show, 10).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_messages_are_set_aside_and_the_ledger_goes_on() {
    let app = spawn_app_with(|_| {}).await;
    let (ev, show) = sale(&app).await;
    let topic = app.kafka_topic.clone();
    let producer: FutureProducer = ClientConfig::new()
        .set(
            "bootstrap.servers",
            std::env::var("WAITROOM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()),
        )
        .set("message.timeout.ms", "10000")
        .create()
        .unwrap();
    let good = |id: &str| {
        json!({"booking_id": id, "show": show, "event": ev, "ticket": "7c0d7d0e-8c0a-4a43-9d7e-3f5cf1f0b2a1",
               "seats": ["D-9"], "quantity": 0})
    };
    let poison: Vec<(&str, Vec<u8>)> = vec![
        ("not json", b"{\"booking_id\": ".to_vec()),
        (
            "a booking id that is not a UUID",
            serde_json::to_vec(&good("not-a-uuid")).unwrap(),
        ),
        (
            "no signature",
            serde_json::to_vec(&good(&uuid::Uuid::new_v4().to_string())).unwrap(),
        ),
        ("a forged signature", {
            let mut v = good(&uuid::Uuid::new_v4().to_string());
            v["mac"] = json!("00".repeat(32));
            serde_json::to_vec(&v).unwrap()
        }),
    ];
    for (_, payload) in &poison {
        producer
            .send(
                FutureRecord::to(&topic).key(show.as_str()).payload(payload),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    // A real sale after the poison: it is confirmed.
    let buyers = holders(&app, &ev, &show, 3).await;
    let mut ids = Vec::new();
    for (token, hold, _) in &buyers {
        let (status, body) = book(&app.http, &app.base, &show, token, hold).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["booking_id"].as_str().unwrap().to_owned());
    }
    let statuses = decided(&app, &ids, Duration::from_secs(60)).await;
    assert!(statuses.values().all(|s| s == "confirmed"), "{statuses:?}");
    assert_consistent(&app, &show, 6).await;
    // Each poison message is recorded with its reason, and D-9 was never sold by one.
    let dead: Vec<(String,)> =
        sqlx::query_as("SELECT reason FROM dead_letters WHERE topic = $1 ORDER BY kafka_offset")
            .bind(&topic)
            .fetch_all(&db().await)
            .await
            .unwrap();
    assert_eq!(dead.len(), poison.len(), "{dead:?}");
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("waitroom_ledger_dead_letters_total") && !l.ends_with(" 0")),
        "the dead-letter counter moved"
    );
}

/// The broker killed with -9 mid-sale and started again on its own storage 3 s later: bookings
/// answered meanwhile are 201 or 503 naming the booking (never another 5xx), and every one ends
/// `confirmed` once the broker is back — the 201s sent before the kill included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_broker_killed_and_restarted_mid_sale_loses_no_booking() {
    let mut broker = Broker::start(free_port());
    let prefix = unique("t");
    let addr = broker.addr();
    let app = spawn_app_with(|c| {
        c.kafka.brokers = addr.clone();
        c.kafka.ack_timeout_ms = 2000;
        c.redis.key_prefix = prefix.clone();
        c.kafka.topic = format!("{prefix}.bookings");
        c.kafka.group = format!("{prefix}-ledger");
    })
    .await;
    let (ev, show) = sale(&app).await;
    let buyers = holders(&app, &ev, &show, 20).await;
    // Buyers confirm one after another, 150 ms apart, across the kill and the restart.
    let bookings = {
        let (http, base, show) = (app.http.clone(), app.base.clone(), show.clone());
        let buyers = buyers.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for (token, hold, _) in &buyers {
                out.push(book(&http, &base, &show, token, hold).await);
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            out
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    broker.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    broker.restart();
    let answers = bookings.await.unwrap();
    let mut ids = Vec::new();
    let mut unknown = 0;
    for (status, body) in &answers {
        assert!(
            *status == StatusCode::CREATED || *status == StatusCode::SERVICE_UNAVAILABLE,
            "{status} {body}"
        );
        unknown += usize::from(*status == StatusCode::SERVICE_UNAVAILABLE);
        ids.push(
            body["booking_id"]
                .as_str()
                .expect("every answer names the booking")
                .to_owned(),
        );
    }
    assert!(
        unknown > 0,
        "no booking saw the broker down: the fault was not real"
    );
    let statuses = decided(&app, &ids, Duration::from_secs(90)).await;
    assert!(statuses.values().all(|s| s == "confirmed"), "{statuses:?}");
    assert_consistent(&app, &show, 40).await;
    eprintln!(
        "broker killed and restarted: {} bookings, {unknown} answered 503 with their id, all {} confirmed",
        answers.len(),
        statuses.len()
    );
    app.stop().await;
}

/// PostgreSQL crashes mid-sale (`pg_ctl stop -m immediate`, a private server) and comes back 3 s
/// later: bookings made meanwhile answer 201 (the booking path needs Redis and Kafka, not
/// PostgreSQL) and stay `pending` while the ledger cannot write; a status read answers 503 with
/// Retry-After, never a guess; once PostgreSQL is back the ledger drains its lag and every 201
/// ends `confirmed`, each seat sold once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_crashed_and_restarted_mid_sale_keeps_every_201() {
    use crate::common::procs::PgProc;
    let pg = PgProc::start(free_port());
    let url = pg.url();
    let app = spawn_app_with(|c| c.db.url = waitroom::config::Secret(url.clone())).await;
    let private = sqlx::PgPool::connect(&url).await.unwrap();
    let (ev, show) = sale(&app).await;
    let buyers = holders(&app, &ev, &show, 15).await;
    let mut ids = Vec::new();
    for (token, hold, _) in &buyers[..5] {
        let (status, body) = book(&app.http, &app.base, &show, token, hold).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["booking_id"].as_str().unwrap().to_owned());
    }
    decided(&app, &ids, Duration::from_secs(60)).await;
    pg.crash();
    for (token, hold, _) in &buyers[5..] {
        let (status, body) = book(&app.http, &app.base, &show, token, hold).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "booking while PostgreSQL is down: {body}"
        );
        ids.push(body["booking_id"].as_str().unwrap().to_owned());
    }
    let r = app.get(&format!("/v1/bookings/{}", ids[7])).await;
    assert_eq!(
        r.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "a status needs the ledger"
    );
    assert_eq!(r.headers()["retry-after"], "2");
    let ready = app.get("/readyz").await;
    assert_eq!(
        ready.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready without PostgreSQL"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.up();
    let statuses = decided(&app, &ids, Duration::from_secs(90)).await;
    assert!(statuses.values().all(|s| s == "confirmed"), "{statuses:?}");
    let sold: Vec<(String,)> =
        sqlx::query_as("SELECT seat_id FROM seats WHERE show_id = $1 AND status = 'SOLD'")
            .bind(&show)
            .fetch_all(&private)
            .await
            .unwrap();
    assert_eq!(sold.len(), 30, "15 bookings of 2 seats, each seat once");
    eventually(
        Duration::from_secs(30),
        "the ledger's lag drained",
        || async {
            app.metrics()
                .await
                .lines()
                .any(|l| l == "waitroom_ledger_lag 0")
                .then_some(())
        },
    )
    .await;
    app.stop().await;
}
