//! The memory guard (src/redis/memory.rs) on a private cluster: a line that fills Redis stops
//! growing before Redis refuses writes, and the sale goes on for the people already in it.
//!
//! Each test gives every primary a `maxmemory` of 1.5 × what it uses, with the guard's line at
//! 50 % (`WAITROOM_REDIS_ENTER_MEMORY_PERCENT`; 80 by default), so the guard is closed at once
//! and Redis itself stays a third below refusing anything: what the test sees is the guard's
//! doing, not Redis's `OOM`. (The same margins at 80 % would need a node using megabytes more
//! than an empty one does, and a test's writes could cross them.)

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::procs::RedisProcs;
use crate::common::{
    assert_error, eventually, in_form, on_both_forms, spawn_app_with, unique, TestApp,
};
use crate::seats::{book, hold, wait_decided};
use waitroom::redis::keys::slot;

/// `waitroom_memory_guard_closed` as the service exports it.
async fn guard_closed(app: &TestApp) -> bool {
    app.metric("waitroom_memory_guard_closed").await == 1.0
}

/// A service on `cluster` whose guard closes at 50 % of `maxmemory` and reads every 100 ms.
async fn guarded_app(cluster: &RedisProcs) -> TestApp {
    let urls = cluster.urls();
    spawn_app_with(|c| {
        c.redis.nodes = urls;
        c.redis.enter_memory_percent = 50;
        c.redis.memory_check_ms = 100;
    })
    .await
}

/// Waits (bounded) until the guard of `app` has opened again.
async fn guard_opened(app: &TestApp) {
    eventually(Duration::from_secs(10), "the guard opened", || async {
        (!guard_closed(app).await).then_some(())
    })
    .await;
}

/// An enter's answer: its status and body.
async fn enter(app: &TestApp, ev: &str, user: &str) -> (StatusCode, reqwest::Response) {
    let r = app.enter(ev, user).await;
    (r.status(), r)
}

async fn near_full(form: &str) {
    let cluster = RedisProcs::cluster(if form == "numbered" { 7220 } else { 7210 });
    let app = guarded_app(&cluster).await;
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(
            form,
            json!({"shards": 4, "active_capacity": 1, "admit_per_second": 100}),
        ),
    )
    .await;
    let show = unique("s");
    // A third seat left over: with every seat sold or held, the leader's next look would call
    // the event sold out, and the last enter below would answer `sold_out`, not `waiting`.
    app.create_show(&show, json!({"event": ev, "seats": ["A-1", "A-2", "A-3"]}))
        .await;
    let alice = app.admitted(&ev, "alice").await;
    let bob: Value = app.enter_ok(&ev, "bob").await;
    assert_eq!(bob["status"], "waiting", "one place, taken by alice: {bob}");
    assert!(!guard_closed(&app).await, "the guard is open before");
    assert_eq!(app.get_event(&ev).await["stats"]["turning_away"], false);

    // Every primary at two thirds of a maxmemory: over the guard's 50 %, far from Redis's own
    // limit.
    let primaries = cluster.primaries();
    assert_eq!(primaries.len(), 3);
    let limits: Vec<u64> = primaries
        .iter()
        .map(|p| {
            let limit = cluster.used_memory(*p) * 3 / 2;
            cluster.set_maxmemory(*p, limit);
            limit
        })
        .collect();
    // The guard reads the primaries one by one, and they were given their limits one by one:
    // wait for a read that found the event's own primaries over the line.
    eventually(Duration::from_secs(10), "the guard closed", || async {
        (app.get_event(&ev).await["stats"]["turning_away"] == true).then_some(())
    })
    .await;
    assert!(guard_closed(&app).await);
    assert_eq!(
        app.metric("waitroom_memory_guard_line_ratio").await,
        0.5,
        "the line the warning and the dashboards compare with"
    );

    // Someone new is turned away, with a Retry-After longer than a fault's (30 s and up to
    // 15 s at random).
    let (status, r) = enter(&app, &ev, "carol").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((30..=45).contains(&wait), "Retry-After {wait}");
    assert_error(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    assert_eq!(
        app.metric(&format!(
            r#"waitroom_queue_turned_away_total{{event="{ev}"}}"#
        ))
        .await,
        1.0
    );

    // Whoever is in the line already keeps their standing when they enter again.
    let again: Value = app.enter_ok(&ev, "bob").await;
    assert_eq!(again["ticket"], bob["ticket"]);
    assert_eq!(again["status"], "waiting");
    assert_eq!(again["position"], 1);
    let again: Value = app.enter_ok(&ev, "alice").await;
    assert_eq!(again["status"], "admitted");

    // The sale goes on: alice holds, books, and the booking is confirmed; her purchase ends her
    // session, and the tick admits bob into the place.
    let r = hold(&app, &show, &alice, json!({"seats": ["A-1"]})).await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "hold while the guard is closed"
    );
    let h: Value = r.json().await.unwrap();
    let r = book(&app, &show, &alice, h["hold_id"].as_str().unwrap()).await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "booking while the guard is closed"
    );
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        wait_decided(&app, b["booking_id"].as_str().unwrap()).await,
        "confirmed"
    );
    let ticket = bob["ticket"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(20), "bob admitted", || async {
        (app.poll_ok(&ev, &ticket).await["status"] == "admitted").then_some(())
    })
    .await;
    assert!(
        guard_closed(&app).await,
        "the guard stayed closed throughout"
    );
    let (status, _) = enter(&app, &ev, "dave").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "still no one new");
    // Redis itself refused nothing: every primary stayed under its maxmemory.
    for (p, limit) in primaries.iter().zip(&limits) {
        let used = cluster.used_memory(*p);
        assert!(used < *limit, "node {p} used {used} B of {limit} B");
    }

    // What the guard keeps the sale from: Redis at its own limit refuses every write. Bob's
    // hold is then a 503 with the short Retry-After of a fault (never a 500, never a guess),
    // and it held nothing: once memory is back the seat is his to hold.
    for p in &primaries {
        cluster.set_maxmemory(*p, 1);
    }
    let bob_token = app.poll_ok(&ev, &ticket).await["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = hold(&app, &show, &bob_token, json!({"seats": ["A-2"]})).await;
    assert_eq!(r.headers()["retry-after"], "2");
    assert_error(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;

    // Memory back (here: no limit): the door opens again.
    for p in &primaries {
        cluster.set_maxmemory(*p, 0);
    }
    let r = hold(&app, &show, &bob_token, json!({"seats": ["A-2"]})).await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "bob's hold once memory is back"
    );
    guard_opened(&app).await;
    let carol: Value = app.enter_ok(&ev, "carol").await;
    assert_eq!(carol["status"], "waiting");
    assert_eq!(app.get_event(&ev).await["stats"]["turning_away"], false);
}

on_both_forms!(
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    near_full:
    /// Sorted sets: a Redis near full turns new people away (503, Retry-After 30–45) while those
    /// in the line keep their standing, hold, book and get admitted; a Redis at its limit
    /// answers a hold 503 (Retry-After 2) and holds nothing; the door opens again when memory
    /// comes back.
    a_redis_near_full_turns_new_people_away_and_the_sale_goes_on_sorted_sets,
    /// The same on a numbered line, whose enters go in batches.
    a_redis_near_full_turns_new_people_away_and_the_sale_goes_on_numbered
);

/// The one slot a one-shard line grows: a numbered line's, or its shard's.
async fn line_slot(app: &TestApp, ev: &str, form: &str) -> u16 {
    if form == "numbered" {
        return slot(&app.keys.numbered(ev).line);
    }
    let stats = app.get_event(ev).await["stats"].clone();
    let tag = stats["shards"][0]["tag"].as_str().unwrap().to_owned();
    slot(&app.keys.shard(&tag).waiting)
}

async fn one_node_full(form: &str) {
    let cluster = RedisProcs::cluster(if form == "numbered" { 7250 } else { 7240 });
    let app = guarded_app(&cluster).await;
    // Two lines of one slot each, on two different primaries.
    let body = in_form(form, json!({"shards": 1, "admit_per_second": 0}));
    let a = unique("a");
    app.create_event(&a, body.clone()).await;
    let node_a = cluster.primary_for_slot(line_slot(&app, &a, form).await);
    let mut b = String::new();
    for _ in 0..40 {
        let name = unique("b");
        app.create_event(&name, body.clone()).await;
        if cluster.primary_for_slot(line_slot(&app, &name, form).await) != node_a {
            b = name;
            break;
        }
    }
    assert!(
        !b.is_empty(),
        "no event landed on another primary in 40 tries"
    );
    let alice: Value = app.enter_ok(&a, "alice").await;
    let bob: Value = app.enter_ok(&b, "bob").await;

    // A's primary at two thirds of a maxmemory, over the guard's 50 %; the others unlimited.
    cluster.set_maxmemory(node_a, cluster.used_memory(node_a) * 3 / 2);
    eventually(Duration::from_secs(10), "the guard closed", || async {
        guard_closed(&app).await.then_some(())
    })
    .await;
    assert_eq!(app.get_event(&a).await["stats"]["turning_away"], true);
    assert_eq!(app.get_event(&b).await["stats"]["turning_away"], false);

    // Someone new to A's line is turned away; someone new to B's line, on a primary with
    // room, joins it behind bob.
    let (status, r) = enter(&app, &a, "carol").await;
    assert_error(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let dave: Value = app.enter_ok(&b, "dave").await;
    assert_eq!(dave["status"], "waiting", "{dave}");
    assert_eq!(dave["position"], 2, "{dave}");
    let again: Value = app.enter_ok(&a, "alice").await;
    assert_eq!(
        again["ticket"], alice["ticket"],
        "alice keeps her place in A"
    );
    assert_eq!(again["position"], 1);
    assert_eq!(bob["position"], 1);
    let turned = |ev: &str| format!(r#"waitroom_queue_turned_away_total{{event="{ev}"}}"#);
    assert_eq!(app.metric(&turned(&a)).await, 1.0);
    assert_eq!(app.metric(&turned(&b)).await, 0.0);

    // Memory back: A takes new people again.
    cluster.set_maxmemory(node_a, 0);
    guard_opened(&app).await;
    let carol: Value = app.enter_ok(&a, "carol").await;
    assert_eq!(carol["position"], 2, "{carol}");
    assert_eq!(app.get_event(&a).await["stats"]["turning_away"], false);
}

on_both_forms!(
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    one_node_full:
    /// Sorted sets: one primary near full turns away only the people new to the lines on it;
    /// an event whose line lives on another primary takes new people as before.
    one_full_primary_turns_away_only_the_lines_on_it_sorted_sets,
    /// The same on numbered lines, each in its event's one slot.
    one_full_primary_turns_away_only_the_lines_on_it_numbered
);
