//! Admission: capacity, rate, global arrival order, refill on leave and on session expiry.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::on_both_forms;
use crate::common::{eventually, in_form, member, members, spawn_app, unique, TestApp};

/// Enters `n` users one after another; returns their tickets in arrival order.
async fn enter_in_order(app: &crate::common::TestApp, ev: &str, n: usize) -> Vec<String> {
    let mut tickets = Vec::new();
    for i in 0..n {
        let s = app.enter_ok(ev, &format!("u{i}")).await;
        tickets.push(s["ticket"].as_str().unwrap().to_owned());
    }
    tickets
}

on_both_forms!(
    tokio::test,
    admission_respects_capacity_and_rate_and_admits_in_arrival_order_in:
    admission_respects_capacity_and_rate_and_admits_in_arrival_order,
    on_a_numbered_line_admission_respects_capacity_and_rate_and_admits_in_arrival_order
);

async fn admission_respects_capacity_and_rate_and_admits_in_arrival_order_in(form: &str) {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(
            form,
            json!({"shards": 4, "admit_per_second": 0, "active_capacity": 30}),
        ),
    )
    .await;
    let tickets = enter_in_order(&app, &ev, 60).await;

    // Open the gate at 6 people per second: 5 s to fill the room, so that a sampler whose
    // two reads take a few hundred ms (a numbered line's reads every index bucket) still sees
    // admission under way many times. At 20/s a fresh-clone `.ci/run` on a slow machine
    // sampled it 5 times or fewer, and the test failed on that alone.
    let rate = 6.0;
    let t0 = Instant::now();
    let r = app.put_event(&ev, json!({"admit_per_second": rate})).await;
    assert_eq!(r.status(), StatusCode::OK);

    let mut samples = 0;
    loop {
        // The shards are read one after another while admission runs: a tick landing between
        // two reads would show a torn set. Two reads that agree saw no tick in between.
        let active = loop {
            let first = app.active_tickets(&ev).await;
            if app.active_tickets(&ev).await == first {
                break first;
            }
        };
        let elapsed = t0.elapsed().as_secs_f64();
        // Capacity is never exceeded.
        assert!(active.len() <= 30, "{} active > capacity 30", active.len());
        // Rate: the token bucket holds one tick (50 ms) of tokens plus one at most.
        let bound = rate * elapsed + rate * 0.05 + 1.0;
        assert!(
            active.len() as f64 <= bound,
            "{} admitted after {elapsed:.2}s > {bound:.1}",
            active.len()
        );
        // Global arrival order: the admitted are exactly the first k who arrived.
        let expected = members(&tickets[..active.len()]);
        assert_eq!(
            active, expected,
            "admitted set is not a prefix of the arrival order"
        );
        samples += 1;
        if active.len() == 30 {
            break;
        }
        assert!(elapsed < 20.0, "admission stalled at {}", active.len());
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(
        samples > 5,
        "the run was sampled while admission was under way"
    );

    // At capacity, nobody else gets in; the 31st waits at position 1.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.active_tickets(&ev).await.len(), 30);
    let next = app.poll_ok(&ev, &tickets[30]).await;
    assert_eq!(next["status"], "waiting");
    assert_eq!(next["position"], 1);

    // An admitted person gets a token bound to the session; the admin figures agree.
    let admitted = app.poll_ok(&ev, &tickets[0]).await;
    assert_eq!(admitted["status"], "admitted");
    assert!(admitted["position"].is_null());
    assert!(admitted["access_token"]
        .as_str()
        .is_some_and(|t| t.contains('.')));
    let stats = app.get_event(&ev).await["stats"].clone();
    assert_eq!(stats["active"], 30);
    assert_eq!(stats["waiting"], 30);
    assert_eq!(stats["admitted_total"], 30);
}

on_both_forms!(
    tokio::test,
    a_slot_freed_by_leave_goes_to_the_next_in_line_in:
    a_slot_freed_by_leave_goes_to_the_next_in_line,
    on_a_numbered_line_a_slot_freed_by_leave_goes_to_the_next_in_line
);

async fn a_slot_freed_by_leave_goes_to_the_next_in_line_in(form: &str) {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(
            form,
            json!({"shards": 2, "admit_per_second": 100, "active_capacity": 2}),
        ),
    )
    .await;
    let tickets = enter_in_order(&app, &ev, 4).await;
    eventually(Duration::from_secs(10), "two admitted", || async {
        (app.active_tickets(&ev).await.len() == 2).then_some(())
    })
    .await;
    assert_eq!(app.poll_ok(&ev, &tickets[2]).await["position"], 1);

    assert_eq!(
        app.leave(&ev, &tickets[0]).await.status(),
        StatusCode::NO_CONTENT
    );

    eventually(Duration::from_secs(10), "third admitted", || async {
        let s = app.poll_ok(&ev, &tickets[2]).await;
        (s["status"] == "admitted").then_some(())
    })
    .await;
    let active = app.active_tickets(&ev).await;
    assert_eq!(active, members([&tickets[1], &tickets[2]]));
    // Let in by the tick after the leave, not by the one that let the first two in (the tick
    // that stopped just before it).
    let at = |s: Value| s["admitted_at_ms"].as_u64().unwrap();
    assert!(
        at(app.poll_ok(&ev, &tickets[2]).await) > at(app.poll_ok(&ev, &tickets[1]).await),
        "the third's admission time is the tick that let it in"
    );
    assert_eq!(app.poll_ok(&ev, &tickets[3]).await["position"], 1);
    assert_eq!(
        app.poll(&ev, &tickets[0]).await.status(),
        StatusCode::NOT_FOUND
    );
}

on_both_forms!(
    tokio::test,
    slots_freed_by_session_expiry_in:
    slots_freed_by_session_expiry_go_to_the_next_in_line,
    on_a_numbered_line_slots_freed_by_session_expiry_go_to_the_next_in_line
);

async fn slots_freed_by_session_expiry_in(form: &str) {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(
            form,
            json!({"shards": 3, "admit_per_second": 0, "active_capacity": 3, "active_ttl_seconds": 1}),
        ),
    )
    .await;
    let tickets = enter_in_order(&app, &ev, 9).await;
    // The gate opens once all nine wait, so the three waves' two seconds count from here
    // however long the enters took.
    let t0 = Instant::now();
    app.update_event(&ev, json!({"admit_per_second": 100}))
        .await;
    let tags = app.shard_tags(&ev).await;
    let mut max_active = 0;
    let stats = loop {
        // Sessions live at one instant `at`: admitted by then (score: the tick's time, ms) and
        // not lapsed by then. The three shards are read one after another while ticks run, so
        // a lapsed entry not yet dropped in one shard and a later admission in another are
        // both in the sets, though never live together.
        let at = wall_ms();
        let mut active = 0;
        if form == "numbered" {
            // One read of the whole line, in one script: the sessions the tick has not ended,
            // which it ends before it lets anyone in.
            active = app.active_tickets(&ev).await.len();
        }
        for tag in tags.iter().filter(|_| form != "numbered") {
            let sessions: Vec<(String, f64)> = redis::AsyncCommands::zrange_withscores(
                &mut app.redis.clone(),
                app.keys.shard(tag).active,
                0,
                -1,
            )
            .await
            .unwrap();
            active += sessions
                .iter()
                .filter(|(_, admitted)| *admitted <= at && at < admitted + 1000.0)
                .count();
        }
        max_active = max_active.max(active);
        let stats = app.get_event(&ev).await["stats"].clone();
        if stats["admitted_total"] == 9 {
            break stats;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "all nine admitted over three sessions"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    };
    assert_eq!(max_active, 3, "capacity filled, never exceeded");
    assert_eq!(stats["waiting"], 0);
    // Three waves of one-second sessions cannot finish in under two seconds.
    assert!(t0.elapsed() >= Duration::from_secs(2));
    // The first wave's sessions have ended: their tickets are gone.
    assert_eq!(
        app.poll(&ev, &tickets[0]).await.status(),
        StatusCode::NOT_FOUND
    );
}

on_both_forms!(
    tokio::test,
    a_paused_event_admits_nobody_until_reopened_in:
    a_paused_event_admits_nobody_until_reopened,
    on_a_numbered_line_a_paused_event_admits_nobody_until_reopened
);

async fn a_paused_event_admits_nobody_until_reopened_in(form: &str) {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(form, json!({"shards": 2, "admit_per_second": 0})),
    )
    .await;
    let tickets = enter_in_order(&app, &ev, 5).await;
    app.update_event(&ev, json!({"state": "paused", "admit_per_second": 1000}))
        .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(app.active_tickets(&ev).await.is_empty());
    // People already waiting may still poll a paused event.
    assert_eq!(app.poll_ok(&ev, &tickets[4]).await["position"], 5);
    app.update_event(&ev, json!({"state": "open"})).await;
    eventually(
        Duration::from_secs(10),
        "all admitted after reopening",
        || async { (app.active_tickets(&ev).await.len() == 5).then_some(()) },
    )
    .await;
}

/// An instance's own change to an event shows in its very next answer, though every request
/// reads the configuration from the instance's cache (500 ms): pausing and reopening through
/// one instance, the next enter there is refused, then let in, with no wait in between. (It
/// fails when a change leaves the request path's first lookup holding the old configuration.)
#[tokio::test]
async fn an_instances_own_change_to_an_event_shows_in_its_next_answer() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2, "admit_per_second": 0}))
        .await;
    // Read into the cache, and used within its age.
    assert_eq!(app.enter_ok(&ev, "u1").await["position"], 1);
    assert_eq!(app.enter_ok(&ev, "u2").await["position"], 2);
    for round in 0..3 {
        app.update_event(&ev, json!({"state": "paused"})).await;
        let r = app.enter(&ev, &format!("p{round}")).await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "round {round}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "event_closed", "round {round}: {body}");
        app.update_event(&ev, json!({"state": "open"})).await;
        assert_eq!(
            app.enter_ok(&ev, &format!("o{round}")).await["position"],
            3 + round,
            "round {round}"
        );
    }
}

/// Puts `member` straight into a shard's line with order key `score`, and into its last-seen
/// set when `seen` (ms) is given: a line shaped as a test needs it, without entering.
async fn place(app: &TestApp, tag: &str, member: &str, score: f64, seen: Option<f64>) {
    let k = app.keys.shard(tag);
    let mut conn = app.redis.clone();
    let _: i64 = redis::AsyncCommands::zadd(&mut conn, k.waiting, member, score)
        .await
        .unwrap();
    if let Some(seen) = seen {
        let _: i64 = redis::AsyncCommands::zadd(&mut conn, k.seen, member, seen)
            .await
            .unwrap();
    }
}

/// A one-shard event with admission held back and abandonment after 60 s: its id and shard tag.
async fn one_shard_line(app: &TestApp, capacity: u64) -> (String, String) {
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 1, "admit_per_second": 0, "active_capacity": capacity,
               "abandon_after_seconds": 60}),
    )
    .await;
    let tag = app.shard_tags(&ev).await.remove(0);
    (ev, tag)
}

/// Now, in ms since the epoch (the unit of the last-seen records).
fn wall_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64
}

/// Waits until the shard's line is empty: everyone admitted or removed.
async fn line_emptied(app: &TestApp, tag: &str) {
    let waiting_key = app.keys.shard(tag).waiting;
    eventually(Duration::from_secs(10), "the line emptied", || async {
        let left: u64 = redis::AsyncCommands::zcard(&mut app.redis.clone(), &waiting_key)
            .await
            .unwrap();
        (left == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn admission_keeps_global_order_when_the_front_of_the_line_is_all_in_one_shard() {
    // The scheduler reads only a few heads per shard (an even share of a tick's budget plus a
    // margin: 38 of a 50-person tick here). Here the first 300 people all wait in shard 0, so
    // that prefix runs out first: the tick must admit fewer rather than jump anyone, and read
    // more next time.
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0, "active_capacity": 100000}),
    )
    .await;
    let tags = app.shard_tags(&ev).await;
    let mut order = Vec::new();
    for i in 0..300u32 {
        let member = format!("front-{i:04}");
        place(&app, &tags[0], &member, f64::from(1 + i), None).await;
        order.push(member);
    }
    for j in 0..300u32 {
        let member = format!("rest-{j:04}");
        place(
            &app,
            &tags[(j % 8) as usize],
            &member,
            f64::from(1000 + j),
            None,
        )
        .await;
        order.push(member);
    }
    let mut conn = app.redis.clone();

    let r = app.put_event(&ev, json!({"admit_per_second": 1000})).await;
    assert_eq!(r.status(), StatusCode::OK);
    eventually(Duration::from_secs(20), "all 600 admitted", || async {
        (app.active_tickets(&ev).await.len() == order.len()).then_some(())
    })
    .await;
    // Each active entry's score is the time of the tick that admitted it. Reading the shards'
    // active sets one after another while admission runs is not a snapshot, so the order is
    // checked on those times instead: along the global order they never go back.
    let mut admitted_at = std::collections::HashMap::new();
    for tag in &tags {
        let entries: Vec<(String, f64)> =
            redis::AsyncCommands::zrange_withscores(&mut conn, app.keys.shard(tag).active, 0, -1)
                .await
                .unwrap();
        admitted_at.extend(entries);
    }
    let times: Vec<f64> = order.iter().map(|m| admitted_at[m]).collect();
    for (i, pair) in times.windows(2).enumerate() {
        assert!(
            pair[0] <= pair[1],
            "{} (admitted at {}) came before {} (admitted at {})",
            order[i],
            pair[0],
            order[i + 1],
            pair[1]
        );
    }
    let ticks: std::collections::BTreeSet<u64> = times.iter().map(|t| *t as u64).collect();
    assert!(
        ticks.len() > 5,
        "admitted over several ticks: {}",
        ticks.len()
    );
}

#[tokio::test]
async fn nobody_is_taken_for_gone_when_most_of_the_line_has_not_been_heard_from() {
    // 1,000 people over 2 shards who have polled, all last seen 200 s ago (as when polls stop
    // reaching an overloaded service), with abandonment after 60 s: the overload guard admits
    // them instead of removing them, as long as a shard holds at least 100 who have polled and
    // for at most 5 windows (300 s; tests/it/security.rs shows the bound and that entries
    // which never polled are not covered).
    let app = spawn_app().await;
    let quiet = unique("e");
    let now_ms = wall_ms();
    // Puts people straight into an event's shards: (shard, member, order key, last seen).
    let fill = |event: String, people: Vec<(usize, String, f64, f64)>| {
        let app = &app;
        async move {
            app.create_event(
                &event,
                json!({"line_form": "sorted_sets", "shards": 2, "admit_per_second": 0, "active_capacity": 100000,
                       "abandon_after_seconds": 60}),
            )
            .await;
            let tags = app.shard_tags(&event).await;
            for (shard, member, score, seen) in people {
                place(app, &tags[shard], &member, score, Some(seen)).await;
            }
        }
    };
    let stale = now_ms - 200_000.0;
    fill(
        quiet.clone(),
        (0..1000u32)
            .map(|i| {
                (
                    (i % 2) as usize,
                    format!("quiet-{i:04}"),
                    f64::from(i),
                    stale,
                )
            })
            .collect(),
    )
    .await;
    app.update_event(&quiet, json!({"admit_per_second": 300}))
        .await;
    let suspended = format!(r#"waitroom_abandonment_suspended{{event="{quiet}"}} 1"#);
    eventually(Duration::from_secs(5), "the guard on", || async {
        app.metrics().await.contains(&suspended).then_some(())
    })
    .await;
    eventually(Duration::from_secs(15), "600 admitted", || async {
        (app.active_tickets(&quiet).await.len() >= 600).then_some(())
    })
    .await;
    app.update_event(&quiet, json!({"admit_per_second": 0}))
        .await;
    let none = format!(r#"waitroom_abandoned_total{{event="{quiet}"}} 0"#);
    assert!(app.metrics().await.contains(&none), "missing {none}");

    // A shard that hears from most of its line: the guard stays off and the silent 20 at its
    // front are removed, not admitted.
    let heard = unique("e");
    fill(
        heard.clone(),
        (0..220u32)
            .map(|i| {
                let seen = if i < 20 { stale } else { now_ms };
                (0, format!("back-{i:04}"), f64::from(i), seen)
            })
            .collect(),
    )
    .await;
    app.update_event(&heard, json!({"admit_per_second": 5000}))
        .await;
    eventually(
        Duration::from_secs(10),
        "the 200 heard from admitted",
        || async { (app.active_tickets(&heard).await.len() == 200).then_some(()) },
    )
    .await;
    let active = app.active_tickets(&heard).await;
    assert!(
        (0..20).all(|i| !active.contains(&format!("back-{i:04}"))),
        "the silent 20 were removed, not admitted"
    );
    let removed = format!(r#"waitroom_abandoned_total{{event="{heard}"}} 20"#);
    assert!(app.metrics().await.contains(&removed), "missing {removed}");
}

/// While the overload guard holds, someone who came inside the horizon without a record since
/// (they may have polled further back, where nothing is recorded) keeps the guard's longer bound
/// like someone who polled; an entry recorded at its enter that never polled (a negative record)
/// does not, so a crowd that enters and never polls is still removed.
#[tokio::test]
async fn while_the_guard_holds_people_who_came_inside_keep_their_places_and_silent_entries_do_not()
{
    let app = spawn_app().await;
    let (ev, tag) = one_shard_line(&app, 100_000).await;
    let stale = wall_ms() - 200_000.0;
    // At the front, alternating: 10 who came inside 200 s ago and have no record since (one
    // crossing 200 s ago covers the first 20 scores; it goes first, so no tick's crossing can
    // cover them later), and 10 recorded at their enter 200 s ago who never polled.
    let () = redis::AsyncCommands::zadd(
        &mut app.redis.clone(),
        app.keys.shard(&tag).horizon,
        format!("{}:19", stale as u64),
        19.0,
    )
    .await
    .unwrap();
    for i in 0..20u32 {
        if i % 2 == 0 {
            place(&app, &tag, &format!("stamped-{i:02}"), f64::from(i), None).await;
        } else {
            place(
                &app,
                &tag,
                &format!("never-{i:02}"),
                f64::from(i),
                Some(-stale),
            )
            .await;
        }
    }
    // Behind them 200 who polled, all last seen 200 s ago: the guard's case.
    for i in 0..200u32 {
        place(
            &app,
            &tag,
            &format!("quiet-{i:03}"),
            f64::from(100 + i),
            Some(stale),
        )
        .await;
    }
    app.update_event(&ev, json!({"admit_per_second": 5000}))
        .await;
    line_emptied(&app, &tag).await;
    let active = app.active_tickets(&ev).await;
    // The 200 who polled 200 s ago are admitted only while the guard holds (the normal bound is
    // 75 s): their admission shows it held.
    assert!(
        (0..200).all(|i| active.contains(&format!("quiet-{i:03}"))),
        "the guard held"
    );
    let stamped: Vec<_> = (0..20)
        .step_by(2)
        .map(|i| format!("stamped-{i:02}"))
        .collect();
    let never: Vec<_> = (1..20)
        .step_by(2)
        .map(|i| format!("never-{i:02}"))
        .collect();
    assert!(
        stamped.iter().all(|m| active.contains(m)),
        "every stamped one admitted"
    );
    assert!(
        never.iter().all(|m| !active.contains(m)),
        "no silent entry admitted"
    );
    assert_eq!(active.len(), 210, "the 200 who polled and the 10 stamped");
    // The tick counts its removals after its moves: read the counter once it has.
    let removed = format!(r#"waitroom_abandoned_total{{event="{ev}"}} "#);
    let count = eventually(Duration::from_secs(5), "the removals counted", || async {
        let metrics = app.metrics().await;
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&removed))?
            .to_owned();
        line[removed.len()..]
            .parse::<f64>()
            .ok()
            .filter(|n| *n >= 10.0)
    })
    .await;
    assert_eq!(count, 10.0, "the 10 silent entries removed as abandoned");
}

/// `lua/admit.lua` as the scheduler runs it, on the real cluster: a move carrying a fence that
/// the shard's clock has passed (a tick that outlived its lease) admits nobody; a move run twice
/// with one operation id (a client retry of a move that went through) admits once; a move that
/// would fail half way (the active set holds the wrong type) leaves the line as it was.
#[tokio::test]
async fn a_move_past_its_lease_or_run_twice_admits_nobody_more() {
    use waitroom::redis::replies::{AdmitRefusal, Admitted};
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 1, "admit_per_second": 0, "active_capacity": 1000}),
    )
    .await;
    let tag = app.shard_tags(&ev).await.remove(0);
    for i in 0..10 {
        place(&app, &tag, &format!("p{i}"), f64::from(i), None).await;
    }
    let scripts = waitroom::redis::scripts::Scripts::new();
    let k = app.keys.shard(&tag);
    let now_ms = wall_ms() as u64;
    let conn = app.redis.clone();
    // `bound`: the last member the scheduler chose (its score and name), or none.
    let admit = |count: u32,
                 bound: (&'static str, &'static str),
                 fence: String,
                 op: &'static str,
                 active: String| {
        let (scripts, k, mut conn) = (&scripts, &k, conn.clone());
        async move {
            scripts
                .admit
                .key(&k.waiting)
                .key(active)
                .key(&k.admitted)
                .key(&k.seen)
                .key(&k.op)
                .key(&k.horizon)
                .arg(count)
                .arg(bound.0)
                .arg(bound.1)
                .arg(now_ms)
                .arg(0)
                .arg(0)
                .arg(fence)
                .arg(op)
                .invoke_async::<Admitted>(&mut conn)
                .await
        }
    };
    let waiting = |app: &TestApp| {
        let (mut conn, w) = (app.redis.clone(), k.waiting.clone());
        async move {
            redis::AsyncCommands::zcard::<_, u64>(&mut conn, w)
                .await
                .unwrap()
        }
    };
    // Fenced: the lease lapsed a second ago by the shard's own clock.
    let late = admit(
        3,
        ("", ""),
        (now_ms - 1000).to_string(),
        "op-1",
        k.active.clone(),
    )
    .await
    .unwrap();
    assert_eq!(late.refused, Some(AdmitRefusal::Fenced));
    assert!(late.members.is_empty());
    assert_eq!(
        waiting(&app).await,
        10,
        "a fenced move took nobody from the line"
    );
    // Within the fence: three move; the same operation again moves nobody more.
    let fence = (now_ms + 60_000).to_string();
    let first = admit(3, ("", ""), fence.clone(), "op-2", k.active.clone())
        .await
        .unwrap();
    assert_eq!(first.members, ["p0", "p1", "p2"]);
    let again = admit(3, ("", ""), fence.clone(), "op-2", k.active.clone())
        .await
        .unwrap();
    assert_eq!(again.refused, Some(AdmitRefusal::AlreadyRan));
    assert!(again.members.is_empty());
    assert_eq!(
        waiting(&app).await,
        7,
        "a retried move admitted a second batch"
    );
    assert_eq!(app.active_tickets(&ev).await.len(), 3);
    // The scheduler chose p3 to p5 of this shard (so its bound is p5), and then p3 left: the
    // move takes p4 and p5, and not p6, who stands behind people of other shards the tick let
    // in before p5.
    let _: i64 = redis::AsyncCommands::zrem(&mut app.redis.clone(), &k.waiting, "p3")
        .await
        .unwrap();
    let bounded = admit(3, ("5", "p5"), fence.clone(), "op-4", k.active.clone())
        .await
        .unwrap();
    assert_eq!(
        bounded.members,
        ["p4", "p5"],
        "a bounded move admits nobody past its bound"
    );
    assert_eq!(waiting(&app).await, 4);
    // A wrong-typed active set: the script refuses before its first write.
    let bad_active = format!("{}:bad", k.active);
    let _: () = redis::AsyncCommands::set(&mut app.redis.clone(), &bad_active, "x")
        .await
        .unwrap();
    let refused = admit(3, ("", ""), fence.clone(), "op-3", bad_active).await;
    assert!(
        refused.is_err_and(|e| e.to_string().contains("WRONGTYPE")),
        "a wrong type is refused"
    );
    assert_eq!(
        waiting(&app).await,
        4,
        "a refused move took nobody from the line"
    );
}

/// A poll records itself only when its last record is older than a quarter of the abandon time
/// (`Queue::read_shard`): polls in between write nothing and replicate nothing.
#[tokio::test]
async fn a_poll_records_itself_at_most_once_per_quarter_of_the_abandon_time() {
    let app = spawn_app().await;
    let ev = unique("e");
    // Abandonment after 1 s: a poll records itself at most every 250 ms.
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 1, "admit_per_second": 0, "abandon_after_seconds": 1}),
    )
    .await;
    let ticket = app.enter_ok(&ev, "alice").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let seen_key = app.keys.shard(&app.shard_tags(&ev).await[0]).seen;
    let seen = || {
        let (mut conn, key, ticket) = (app.redis.clone(), seen_key.clone(), ticket.clone());
        async move {
            redis::AsyncCommands::zscore::<_, _, f64>(&mut conn, key, member(&ticket))
                .await
                .unwrap()
        }
    };
    assert!(
        seen().await < 0.0,
        "an entry that never polled is recorded negative"
    );
    app.poll_ok(&ev, &ticket).await;
    let first = seen().await;
    assert!(first > 0.0, "the first poll is recorded");
    app.poll_ok(&ev, &ticket).await;
    assert_eq!(seen().await, first, "a poll right after writes nothing");
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.poll_ok(&ev, &ticket).await;
    assert!(
        seen().await >= first + 250.0,
        "a poll after the refresh is recorded"
    );
}

/// The abandon bound lies a quarter of the abandon time further back than the abandon time, so
/// a skipped record never makes a live person look gone: someone whose last record is 70 s old
/// may have polled 55 s ago (abandonment after 60 s) and keeps their place; someone recorded
/// 80 s ago has not polled for at least 65 s and is removed.
#[tokio::test]
async fn a_poll_that_skipped_its_record_never_makes_anyone_look_gone() {
    let app = spawn_app().await;
    let (ev, tag) = one_shard_line(&app, 1000).await;
    let now_ms = wall_ms();
    place(&app, &tag, "recorded-80s-ago", 1.0, Some(now_ms - 80_000.0)).await;
    place(&app, &tag, "recorded-70s-ago", 2.0, Some(now_ms - 70_000.0)).await;
    place(&app, &tag, "recorded-now", 3.0, Some(now_ms)).await;
    app.update_event(&ev, json!({"admit_per_second": 1000}))
        .await;
    line_emptied(&app, &tag).await;
    let active = app.active_tickets(&ev).await;
    assert_eq!(
        active,
        ["recorded-70s-ago", "recorded-now"]
            .map(String::from)
            .into_iter()
            .collect(),
        "admitted"
    );
}

/// Only the first `horizon` people of a shard keep a last-seen record (1,000 here: the floor, at
/// a rate of 0). Two people enter behind 1,200 others: neither entering nor polling writes a
/// record for them. When the line has brought them inside (the 1,200 admitted, capacity full),
/// the tick records when they came inside (one crossing); the one who keeps polling gets a
/// record, the one who stopped is found gone at the front and removed, not admitted, as when
/// everyone had a record. Without the crossing, the silent one would have no record and be
/// admitted.
#[tokio::test]
async fn people_beyond_the_horizon_write_nothing_and_are_still_found_gone_at_the_front() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 1, "admit_per_second": 0, "active_capacity": 1200,
               "abandon_after_seconds": 1}),
    )
    .await;
    let tag = app.shard_tags(&ev).await.remove(0);
    let k = app.keys.shard(&tag);
    let mut conn = app.redis.clone();
    // 1,200 people ahead, placed directly (their scores are below any arrival score).
    let mut pipe = redis::pipe();
    for i in 0..1200 {
        pipe.zadd(&k.waiting, format!("ahead-{i:04}"), f64::from(i + 1))
            .ignore();
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
    let ticket = |v: Value| v["ticket"].as_str().unwrap().to_owned();
    let polls = ticket(app.enter_ok(&ev, "keeps-polling").await);
    let silent = ticket(app.enter_ok(&ev, "goes-silent").await);
    let record = |t: &str| {
        let (mut conn, key, t) = (app.redis.clone(), k.seen.clone(), member(t));
        async move {
            redis::AsyncCommands::zscore::<_, _, Option<f64>>(&mut conn, key, t)
                .await
                .unwrap()
        }
    };
    let first = app.poll_ok(&ev, &polls).await;
    assert_eq!(first["position"], 1201, "behind the 1,200");
    assert_eq!(
        record(&polls).await,
        None,
        "a poll beyond the horizon writes nothing"
    );
    assert_eq!(
        record(&silent).await,
        None,
        "an enter beyond the horizon writes nothing"
    );
    let seen_size: u64 = redis::AsyncCommands::zcard(&mut conn, &k.seen)
        .await
        .unwrap();
    assert_eq!(seen_size, 0, "nobody else wrote one either");

    // Admit the 1,200: capacity is then full, and the two stand at the front, inside.
    app.update_event(&ev, json!({"admit_per_second": 100000}))
        .await;
    // The tick records that the line brought them inside: one crossing, not a record each.
    let silent_score: f64 = redis::AsyncCommands::zscore(&mut conn, &k.waiting, member(&silent))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "both inside", || async {
        let newest: Vec<(String, f64)> =
            redis::AsyncCommands::zrange_withscores(&mut app.redis.clone(), &k.horizon, -1, -1)
                .await
                .unwrap();
        newest
            .first()
            .is_some_and(|(_, score)| *score >= silent_score)
            .then_some(())
    })
    .await;
    assert_eq!(record(&silent).await, None, "no record per person");
    // Past the silent one's abandon bound (1 s + 250 ms), with the other polling meanwhile.
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        app.poll_ok(&ev, &polls).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        record(&polls).await.is_some_and(|s| s > 0.0),
        "the polling one's first poll inside wrote a record"
    );
    app.update_event(&ev, json!({"active_capacity": 1300}))
        .await;
    let admitted = eventually(
        Duration::from_secs(10),
        "the polling one admitted",
        || async {
            let s = app.poll_ok(&ev, &polls).await;
            (s["status"] == "admitted").then_some(s)
        },
    )
    .await;
    assert_eq!(admitted["status"], "admitted");
    assert_eq!(
        app.poll(&ev, &silent).await.status(),
        StatusCode::NOT_FOUND,
        "the silent one was removed as abandoned"
    );
    let active = app.active_tickets(&ev).await;
    assert_eq!(active.len(), 1201, "the 1,200 and the polling one");
    assert!(!active.contains(&member(&silent)));
}

/// Whatever the strategy, admission lets in the people still polling and removes the abandoned
/// (last seen longer ago than the event's abandon time), never admits them. The merging
/// strategies judge them as they read the shards' heads (`shard_heads.lua`); round-robin
/// (`statistical`) reads no heads, so there `admit.lua` judges them itself.
#[tokio::test]
async fn every_strategy_admits_the_people_still_polling_and_removes_the_abandoned() {
    let app = spawn_app().await;
    for strategy in ["global_counter", "timestamp", "statistical", "hybrid"] {
        let ev = unique("e");
        app.create_event(
            &ev,
            json!({"line_form": "sorted_sets", "shards": 1, "admit_per_second": 0, "active_capacity": 1000,
                   "abandon_after_seconds": 60, "strategy": strategy}),
        )
        .await;
        let tag = app.shard_tags(&ev).await.remove(0);
        let now = wall_ms();
        let mut polling = std::collections::HashSet::new();
        for i in 0..30u32 {
            let member = format!("p{i:02}");
            // Every third one last polled 200 s ago: gone.
            let gone = i % 3 == 1;
            let seen = if gone { now - 200_000.0 } else { now };
            place(&app, &tag, &member, f64::from(1 + i), Some(seen)).await;
            if !gone {
                polling.insert(member);
            }
        }
        app.update_event(&ev, json!({"admit_per_second": 1000}))
            .await;
        line_emptied(&app, &tag).await;
        assert_eq!(app.active_tickets(&ev).await, polling, "{strategy}");
    }
}

/// Entries that never polled do not count towards the overload guard: 150 of them (as a surge
/// of fresh arrivals would be) beside 61 people who polled, one of whom went quiet 200 s ago,
/// leave the guard off (61 who polled are too few to tell), and the quiet one is taken for gone
/// at the normal bound instead of being admitted under the guard's longer one.
#[tokio::test]
async fn entries_that_never_polled_do_not_switch_the_guard_on_for_those_who_did() {
    let app = spawn_app().await;
    let (ev, tag) = one_shard_line(&app, 100_000).await;
    let now = wall_ms();
    place(&app, &tag, "quiet", 1.0, Some(now - 200_000.0)).await;
    let mut admitted = std::collections::HashSet::new();
    for i in 0..60u32 {
        let member = format!("polled-{i:02}");
        place(&app, &tag, &member, f64::from(2 + i), Some(now)).await;
        admitted.insert(member);
    }
    for i in 0..150u32 {
        let member = format!("entry-{i:03}");
        place(&app, &tag, &member, f64::from(100 + i), Some(-now)).await;
        admitted.insert(member);
    }
    app.update_event(&ev, json!({"admit_per_second": 1000}))
        .await;
    line_emptied(&app, &tag).await;
    assert_eq!(app.active_tickets(&ev).await, admitted);
}
