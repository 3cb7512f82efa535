//! The waiting line: tickets, positions, re-entry, leave.

use std::collections::HashMap;
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Semaphore;
use waitroom::redis::keys::slot;

use crate::common::on_both_forms;
use crate::common::{in_form, member, spawn_app, unique};

on_both_forms!(
    tokio::test(flavor = "multi_thread", worker_threads = 4),
    five_thousand_concurrent_enters:
    five_thousand_concurrent_enters_get_positions_one_to_w_in_arrival_order,
    /// The same surge on a numbered line, where the enters of an instance go in batches, one
    /// script each: places 1..W, and in the order of the numbers the index holds.
    on_a_numbered_line_five_thousand_concurrent_enters_get_positions_one_to_w_in_order
);

async fn five_thousand_concurrent_enters(form: &str) {
    // Arrange: 8 shards, admission held back.
    let app = Arc::new(spawn_app().await);
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(form, json!({"shards": 8, "admit_per_second": 0})),
    )
    .await;

    // Act: 5,000 concurrent enters, then 100 sequential ones.
    let gate = Arc::new(Semaphore::new(200));
    let tasks: Vec<_> = (0..5000)
        .map(|i| {
            let (app, ev, gate) = (app.clone(), ev.clone(), gate.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire().await.unwrap();
                let s = app.enter_ok(&ev, &format!("user{i}")).await;
                s["ticket"].as_str().unwrap().to_owned()
            })
        })
        .collect();
    let mut tickets = Vec::new();
    for t in tasks {
        tickets.push(t.await.unwrap());
    }
    let mut sequential = Vec::new();
    for i in 0..100 {
        let s = app.enter_ok(&ev, &format!("late{i}")).await;
        sequential.push(s["ticket"].as_str().unwrap().to_owned());
    }

    // Assert: every enter got its own ticket.
    let mut uniq = tickets.clone();
    uniq.extend(sequential.iter().cloned());
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 5100);

    // Positions of everyone, polled concurrently.
    let all: Vec<String> = tickets.iter().chain(&sequential).cloned().collect();
    let polls: Vec<_> = all
        .iter()
        .map(|t| {
            let (app, ev, t, gate) = (app.clone(), ev.clone(), t.clone(), gate.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire().await.unwrap();
                let s = app.poll_ok(&ev, &t).await;
                assert_eq!(s["status"], "waiting");
                (t, s["position"].as_u64().unwrap())
            })
        })
        .collect();
    let mut position: HashMap<String, u64> = HashMap::new();
    for p in polls {
        let (t, pos) = p.await.unwrap();
        position.insert(t, pos);
    }
    let mut sorted: Vec<u64> = position.values().copied().collect();
    sorted.sort();
    assert_eq!(
        sorted,
        (1..=5100).collect::<Vec<_>>(),
        "positions are exactly 1..W"
    );

    // The sequential enters came last and in order.
    for (i, t) in sequential.iter().enumerate() {
        assert_eq!(position[t], 5001 + i as u64);
    }

    if form == "numbered" {
        // Position order is number order: sorted by the number each index entry holds, the
        // positions read 1, 2, 3, ...
        let cfg = app.get_event(&ev).await["config"].clone();
        let mut read = redis::pipe();
        for t in &all {
            read.hget(crate::numbered::index_key_of(&app, &ev, &cfg, t), member(t));
        }
        let numbers: Vec<u64> = read.query_async(&mut app.redis.clone()).await.unwrap();
        let mut by_number: Vec<(u64, &String)> = numbers.into_iter().zip(&all).collect();
        by_number.sort();
        for (i, (n, t)) in by_number.iter().enumerate() {
            assert_eq!(position[*t], i as u64 + 1, "ticket {t}, number {n}");
        }
        return;
    }
    // Position order is arrival order: sorted by stored score (then shard, member), the
    // positions read 1, 2, 3, ...
    let exact = crate::strategies::exact_positions(&app, &ev).await;
    assert_eq!(exact.len(), position.len());
    for (t, p) in &position {
        assert_eq!(exact[t], *p, "ticket {t}");
    }
}

#[tokio::test]
async fn shards_spread_over_every_primary_and_keys_of_a_shard_share_a_slot() {
    let app = spawn_app().await;
    let ev = unique("e");
    // The sorted sets' shards (a numbered line keeps no key in its shards' tags).
    app.create_event(&ev, json!({"line_form": "sorted_sets", "shards": 8}))
        .await;
    let tags = app.shard_tags(&ev).await;
    assert_eq!(tags.len(), 8);

    // Which primary serves each shard's slot, asked from Redis itself.
    let mut per_primary: HashMap<String, usize> = HashMap::new();
    for tag in &tags {
        let k = app.keys.shard(tag);
        let s: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&k.waiting)
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        assert_eq!(s, slot(&k.waiting));
        assert_eq!(s, slot(&k.active));
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut app.redis.clone())
            .await
            .unwrap();
        let owner = nodes
            .lines()
            .find(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 8
                    && f[2].contains("master")
                    && f[8..].iter().any(|r| {
                        let (lo, hi) = r
                            .split_once('-')
                            .map(|(a, b)| (a.parse().unwrap_or(1), b.parse().unwrap_or(0)))
                            .unwrap_or((0, 0));
                        (lo..=hi).contains(&s)
                    })
            })
            .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
            .expect("a primary serves the slot");
        *per_primary.entry(owner).or_default() += 1;
    }
    let mut counts: Vec<usize> = per_primary.values().copied().collect();
    counts.sort();
    assert_eq!(
        counts,
        vec![2, 3, 3],
        "8 shards over 3 primaries spread as evenly as possible"
    );
}

#[tokio::test]
async fn re_entering_returns_the_same_ticket_and_never_a_worse_position() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 4, "admit_per_second": 0}))
        .await;
    for i in 0..20 {
        app.enter_ok(&ev, &format!("u{i}")).await;
    }
    let first = app.enter_ok(&ev, "alice").await;
    assert_eq!(first["position"], 21);
    for i in 20..40 {
        app.enter_ok(&ev, &format!("u{i}")).await;
    }
    // Someone ahead leaves: alice moves up, and re-entering keeps her place.
    let ahead = app.enter_ok(&ev, "u0").await;
    assert_eq!(
        app.leave(&ev, ahead["ticket"].as_str().unwrap())
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    let again = app.enter_ok(&ev, "alice").await;
    assert_eq!(again["ticket"], first["ticket"]);
    assert_eq!(again["position"], 20);
    assert_eq!(again["status"], "waiting");
    assert!(again["next_poll_ms"].as_u64().unwrap() > 0);
    assert!(again["access_token"].is_null());
}

on_both_forms!(
    tokio::test,
    entering_again_while_admitted:
    /// Someone admitted who enters again (a refreshed page, a second tab) keeps the session: the
    /// answer is `admitted`, with the same admission time and a token, and takes no place in the
    /// line behind the people still waiting.
    entering_again_while_admitted_keeps_the_session_and_takes_no_place,
    /// The same on a numbered line, where the second enter's spare number is marked gone.
    on_a_numbered_line_entering_again_while_admitted_keeps_the_session_and_takes_no_place
);

async fn entering_again_while_admitted(form: &str) {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(
            form,
            json!({"shards": 2, "admit_per_second": 1000, "active_capacity": 1}),
        ),
    )
    .await;
    let ticket = app.enter_ok(&ev, "alice").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let admitted = crate::common::eventually(
        std::time::Duration::from_secs(10),
        "alice admitted",
        || async {
            let s = app.poll_ok(&ev, &ticket).await;
            (s["status"] == "admitted").then_some(s)
        },
    )
    .await;
    // Capacity 1: these wait behind her session.
    for i in 0..3 {
        app.enter_ok(&ev, &format!("u{i}")).await;
    }
    let again = app.enter_ok(&ev, "alice").await;
    assert_eq!(again["status"], "admitted", "{again}");
    assert_eq!(again["ticket"], ticket.as_str());
    assert_eq!(again["admitted_at_ms"], admitted["admitted_at_ms"]);
    assert!(again["access_token"].is_string());
    assert_eq!(
        app.active_tickets(&ev).await,
        std::collections::HashSet::from([member(&ticket)])
    );
    assert_eq!(
        app.get_event(&ev).await["stats"]["waiting"],
        3,
        "she took no place in the line"
    );
    // The three behind her: places 1 to 3, none behind a place of hers.
    for i in 0..3 {
        let s = app.enter_ok(&ev, &format!("u{i}")).await;
        assert_eq!(s["position"], i + 1, "{s}");
    }
}

#[tokio::test]
async fn leaving_removes_the_ticket_and_closes_the_gap() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 3, "admit_per_second": 0}))
        .await;
    let a = app.enter_ok(&ev, "a").await;
    let b = app.enter_ok(&ev, "b").await;
    let c = app.enter_ok(&ev, "c").await;
    let (a, b, c) = (
        a["ticket"].as_str().unwrap(),
        b["ticket"].as_str().unwrap(),
        c["ticket"].as_str().unwrap(),
    );
    assert_eq!(app.leave(&ev, b).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.poll(&ev, b).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.leave(&ev, b).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.poll_ok(&ev, a).await["position"], 1);
    assert_eq!(app.poll_ok(&ev, c).await["position"], 2);
    // Leaving and entering again puts the user at the back.
    let b2 = app.enter_ok(&ev, "b").await;
    assert_eq!(b2["ticket"].as_str().unwrap(), b);
    assert_eq!(b2["position"], 3);
}

#[tokio::test]
async fn poll_interval_is_longer_far_back_and_jittered() {
    let app = spawn_app().await;
    let ev = unique("e");
    // Admission is open but capacity 0: the rate is known, nobody moves.
    app.create_event(
        &ev,
        json!({"shards": 2, "admit_per_second": 10, "active_capacity": 0}),
    )
    .await;
    let mut last = None;
    for i in 0..400 {
        let s = app.enter_ok(&ev, &format!("u{i}")).await;
        last = Some(s);
    }
    let first = app.enter_ok(&ev, "u0").await;
    let last = last.unwrap();
    let near: Vec<u64> = futures::future::join_all(
        (0..5).map(|_| app.poll_ok(&ev, first["ticket"].as_str().unwrap())),
    )
    .await
    .iter()
    .map(|s| s["next_poll_ms"].as_u64().unwrap())
    .collect();
    let far = app.poll_ok(&ev, last["ticket"].as_str().unwrap()).await["next_poll_ms"]
        .as_u64()
        .unwrap();
    // Position 1 at 10/s: 1 s base x 0.8-1.2; position 400: 10 s base x 0.8-1.2.
    assert!(near.iter().all(|ms| (800..=1200).contains(ms)), "{near:?}");
    assert!((8000..=12000).contains(&far), "{far}");
    // The jitter is the client's own: stable for one ticket, different between tickets.
    assert!(near.iter().all(|ms| *ms == near[0]), "{near:?}");
    let mut across = Vec::new();
    for i in 380..400 {
        across.push(
            app.enter_ok(&ev, &format!("u{i}")).await["next_poll_ms"]
                .as_u64()
                .unwrap(),
        );
    }
    across.sort();
    across.dedup();
    assert!(
        across.len() > 10,
        "clients poll at different phases: {across:?}"
    );
    assert_eq!(last["eta_seconds"].as_f64().unwrap(), 40.0);
}

/// A line that was already waiting when this version came in keeps its 36-character members:
/// an event whose stored configuration has no `member_form` (as written before the short form)
/// is entered, polled, admitted and left under the hyphenated ticket, and a new event beside
/// it under the 14-character member.
#[tokio::test]
async fn an_event_stored_before_the_short_member_keeps_the_hyphenated_one() {
    let app = spawn_app().await;
    let (old, new) = (unique("e"), unique("e"));
    for ev in [&old, &new] {
        app.create_event(
            ev,
            json!({"line_form": "sorted_sets", "shards": 2, "admit_per_second": 0}),
        )
        .await;
    }
    // Arrange: the old event's configuration as an earlier version stored it.
    let key = app.keys.event_config(&old);
    let mut conn = app.redis.clone();
    let stored: String = redis::AsyncCommands::get(&mut conn, &key).await.unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(
        cfg["member_form"], "short",
        "a new event writes short members"
    );
    cfg.as_object_mut().unwrap().remove("member_form");
    let () = redis::AsyncCommands::set(&mut conn, &key, cfg.to_string())
        .await
        .unwrap();
    // Past every instance's cache of the configuration.
    tokio::time::sleep(waitroom::queue::event::CACHE_TTL * 2).await;

    let mut tickets = HashMap::new();
    for ev in [&old, &new] {
        let mut mine = Vec::new();
        for user in ["ann", "bob", "cy"] {
            mine.push(
                app.enter_ok(ev, user).await["ticket"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        tickets.insert(ev.clone(), mine);
    }
    let hyphenated: std::collections::HashSet<String> = tickets[&old].iter().cloned().collect();
    assert_eq!(app.waiting_members(&old).await, hyphenated);
    assert_eq!(
        app.waiting_members(&new).await,
        crate::common::members(&tickets[&new])
    );
    for ev in [&old, &new] {
        assert_eq!(app.poll_ok(ev, &tickets[ev][2]).await["position"], 3);
        assert_eq!(
            app.leave(ev, &tickets[ev][0]).await.status(),
            StatusCode::NO_CONTENT
        );
        assert_eq!(app.poll_ok(ev, &tickets[ev][2]).await["position"], 2);
    }
    // Admission moves the old event's members as they are.
    app.update_event(&old, json!({"admit_per_second": 1000}))
        .await;
    crate::common::eventually(
        std::time::Duration::from_secs(10),
        "both admitted",
        || async {
            (app.active_tickets(&old).await == tickets[&old][1..].iter().cloned().collect())
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        app.poll_ok(&old, &tickets[&old][2]).await["status"],
        "admitted"
    );
}
