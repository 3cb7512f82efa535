//! Redis nodes failing mid-sale, on a private 3+3 cluster: a primary killed by PID with its
//! replica not caught up (entries kept coming until the kill), and a primary frozen with SIGSTOP
//! (a hang, not a refusal) then resumed. Clients see 200 or 503 with Retry-After, never another
//! status and never a hang; service comes back without a restart; admission goes on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use waitroom::config::Config;
use waitroom::redis::command_deadline;
use waitroom::redis::keys::slot;

use crate::common::procs::RedisProcs;
use crate::common::{eventually, spawn_app_with, unique, TestApp};

/// Enters `n` users one after another; returns their tickets in order.
async fn line(app: &TestApp, ev: &str, tag: &str, n: usize) -> Vec<String> {
    let mut tickets = Vec::new();
    for i in 0..n {
        tickets.push(
            app.enter_ok(ev, &format!("{tag}{i}")).await["ticket"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    tickets
}

/// What clients saw while a fault lasted.
#[derive(Default, Debug)]
struct Seen {
    statuses: HashMap<u16, usize>,
    /// Retry-After values of the 503s (seconds).
    retry_after: Vec<u64>,
    /// Slowest answer.
    slowest: Duration,
    /// From the start of the polling to the start of the round whose answers were all 200:
    /// when service was back.
    back: Duration,
}

/// Polls every tenth ticket until every answer is 200 again after the fault was felt, or
/// `limit`.
async fn poll_through(app: &TestApp, ev: &str, tickets: &[String], limit: Duration) -> Seen {
    let started = Instant::now();
    let mut seen = Seen::default();
    loop {
        let round_began = started.elapsed();
        let mut all_ok = true;
        for t in tickets.iter().step_by(10) {
            let sent = Instant::now();
            let r = app.poll(ev, t).await;
            seen.slowest = seen.slowest.max(sent.elapsed());
            *seen.statuses.entry(r.status().as_u16()).or_default() += 1;
            if r.status() == StatusCode::SERVICE_UNAVAILABLE {
                let secs = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .expect("a 503 says when to come back, in whole seconds");
                seen.retry_after.push(secs);
            }
            all_ok &= r.status() == StatusCode::OK;
        }
        if all_ok && felt(&seen) {
            seen.back = round_began;
            return seen;
        }
        assert!(started.elapsed() < limit, "no recovery: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether clients felt the fault: a 503, or an answer held 2 s or more (a request that
/// reached the promoted replica after the failover, within its bound).
fn felt(seen: &Seen) -> bool {
    seen.statuses.contains_key(&503) || seen.slowest >= Duration::from_secs(2)
}

/// The checks every fault shares: only 200 and 503, each 503 with a sensible Retry-After.
fn assert_clean(seen: &Seen) {
    assert!(felt(seen), "clients felt the fault: {seen:?}");
    assert_eq!(
        seen.statuses
            .keys()
            .filter(|c| **c != 200 && **c != 503)
            .count(),
        0,
        "only 200 or 503: {seen:?}"
    );
    assert!(
        seen.retry_after.iter().all(|s| (1..=30).contains(s)),
        "Retry-After between 1 and 30 s: {:?}",
        seen.retry_after
    );
}

/// Prints what clients saw, from the fault's start (`polled`: how long after the fault the
/// polling began).
fn report(what: &str, polled: Duration, seen: &Seen) {
    eprintln!(
        "{what} {:?} after the fault; answers {:?}; slowest {:?}",
        polled + seen.back,
        seen.statuses,
        seen.slowest
    );
}

/// Everyone in `tickets` still has a place, and the places are exactly 1..=n.
async fn assert_line_intact(app: &TestApp, ev: &str, tickets: &[String]) {
    let mut positions = Vec::new();
    for t in tickets {
        positions.push(app.poll_ok(ev, t).await["position"].as_u64().unwrap());
    }
    positions.sort();
    assert_eq!(positions, (1..=tickets.len() as u64).collect::<Vec<_>>());
}

/// Active sessions of an event, from the admin API's figures.
async fn active(app: &TestApp, ev: &str) -> u64 {
    app.active_tickets(ev).await.len() as u64
}

/// A service on `cluster` with two events: `ev`, 200 people waiting (admission off), and
/// `flowing`, 600 people admitted 10 a second all along, so admission runs through the fault.
async fn sale(cluster: &RedisProcs) -> (Arc<TestApp>, String, String, Vec<String>) {
    let urls = cluster.urls();
    let app = Arc::new(spawn_app_with(|c| c.redis.nodes = urls).await);
    // The sorted sets, by name: these tests stop the primary of one shard's slot (the numbered
    // line's own failover tests are below).
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0}),
    )
    .await;
    let flowing = unique("e");
    app.create_event(
        &flowing,
        json!({"line_form": "sorted_sets", "shards": 2, "admit_per_second": 10, "active_capacity": 100000}),
    )
    .await;
    line(&app, &flowing, "f", 600).await;
    let tickets = line(&app, &ev, "u", 200).await;
    (app, ev, flowing, tickets)
}

/// `waitroom_redis_direct_requests_total{outcome, addr}` from /metrics.
async fn direct(app: &TestApp, outcome: &str, addr: &str) -> f64 {
    let (o, a) = (
        format!(r#"outcome="{outcome}""#),
        format!(r#"addr="{addr}""#),
    );
    app.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("waitroom_redis_direct_requests_total{"))
        .filter(|l| l.contains(&o) && l.contains(&a))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `host:port` of the live primary serving `slot`, from `CLUSTER NODES` of any live node.
async fn serving(app: &TestApp, slot: u16) -> Option<String> {
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut app.redis.clone())
        .await
        .ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
            return None;
        }
        let covers = f[8..].iter().any(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
        });
        covers.then(|| f[1].split('@').next().unwrap_or(f[1]).to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_primary_gives_503_during_failover_then_service_resumes_with_nobody_lost() {
    let mut cluster = RedisProcs::cluster(7100);
    let (app, ev, flowing, tickets) = sale(&cluster).await;
    // Entries keep coming right up to the kill: nothing waits for the replicas to catch up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let late = {
        let (app, ev, stop) = (app.clone(), ev.clone(), stop.clone());
        tokio::spawn(async move {
            let mut answered = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = app.enter(&ev, &format!("late{i}")).await;
                if r.status() == StatusCode::OK {
                    let b: Value = r.json().await.unwrap();
                    answered.push(b["ticket"].as_str().unwrap().to_owned());
                }
                i += 1;
            }
            answered
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tags = app.shard_tags(&ev).await;
    let victim = cluster.primary_for_slot(slot(&app.keys.shard(&tags[0]).waiting));
    let admitted_before = active(&app, &flowing).await;
    cluster.kill(victim);
    let seen = poll_through(&app, &ev, &tickets, Duration::from_secs(40)).await;
    stop.store(true, Ordering::Relaxed);
    let late = late.await.unwrap();
    assert_clean(&seen);
    report("failover: service back", Duration::ZERO, &seen);
    // Everyone who entered a second before the kill is still in line, in order, 1..200.
    assert_line_intact(&app, &ev, &tickets).await;
    // Entries of the last moment on the killed primary may be lost (asynchronous replication;
    // docs/reliability.md): a lost ticket is told so (404), never shown a wrong place.
    let mut lost = 0;
    for t in &late {
        let r = app.poll(&ev, t).await;
        match r.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => lost += 1,
            s => panic!("a late entry answered {s}"),
        }
    }
    eprintln!(
        "failover: {lost} of {} entries answered during the last 300 ms before the kill and the failover were lost",
        late.len()
    );
    // Admission went on: the flowing event admitted more after the failover.
    eventually(Duration::from_secs(20), "admission resumed", || async {
        (active(&app, &flowing).await > admitted_before + 10).then_some(())
    })
    .await;
    // With direct connections (the default), requests sent straight to the killed primary
    // were sent again through the cluster client, and once the map was read again the
    // promoted replica answered them directly.
    if crate::common::test_config("x").redis.direct {
        let shard0 = slot(&app.keys.shard(&tags[0]).waiting);
        assert!(
            direct(&app, "sent_again", &format!("127.0.0.1:{victim}")).await > 0.0,
            "no direct request met the dead primary"
        );
        let promoted = serving(&app, shard0)
            .await
            .expect("a primary serves shard 0 again");
        assert_ne!(promoted, format!("127.0.0.1:{victim}"));
        eventually(
            Duration::from_secs(20),
            "direct to the promoted replica",
            || async {
                for t in tickets.iter().take(5) {
                    assert_eq!(app.poll(&ev, t).await.status(), StatusCode::OK);
                }
                (direct(&app, "answered", &promoted).await > 0.0).then_some(())
            },
        )
        .await;
    }
}

/// Freezes the primary on `victim` (SIGSTOP) for 10 s, longer than the cluster's node timeout
/// (2 s), so its replica takes over meanwhile and the old primary wakes up to find itself
/// demoted, while every tenth of `tickets` polls through ([`poll_through`]). Checks what clients
/// saw: only 200 or 503 with Retry-After, and no hang. Returns when the freeze began.
async fn freeze_through(
    cluster: &RedisProcs,
    victim: u16,
    app: &TestApp,
    ev: &str,
    tickets: &[String],
    what: &str,
) -> Instant {
    cluster.pause(victim);
    let frozen_at = Instant::now();
    let thaw = async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        cluster.resume(victim);
    };
    let (seen, ()) = tokio::join!(
        poll_through(app, ev, tickets, Duration::from_secs(40)),
        thaw
    );
    assert_clean(&seen);
    // A hang is answered, not waited out: every Redis command is bounded (6.5 s here: twice the
    // tests' 3 s response timeout, plus 500 ms); nobody waits for the 10 s freeze to end.
    assert!(
        seen.slowest < Duration::from_secs(8),
        "an answer took {:?} while a node hung",
        seen.slowest
    );
    report(what, Duration::ZERO, &seen);
    frozen_at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_gives_503_not_a_hang_and_service_resumes_when_it_thaws() {
    let cluster = RedisProcs::cluster(7110);
    let (app, ev, flowing, tickets) = sale(&cluster).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tags = app.shard_tags(&ev).await;
    let victim = cluster.primary_for_slot(slot(&app.keys.shard(&tags[0]).waiting));
    freeze_through(
        &cluster,
        victim,
        &app,
        &ev,
        &tickets,
        "frozen primary: service back",
    )
    .await;
    assert_line_intact(&app, &ev, &tickets).await;
    // Requests sent straight to the frozen primary timed out and were answered so (503), not
    // sent again (the slowest answer above shows no doubled wait).
    if crate::common::test_config("x").redis.direct {
        assert!(
            direct(&app, "timed_out", &format!("127.0.0.1:{victim}")).await > 0.0,
            "no direct request timed out on the frozen primary"
        );
    }
    let admitted = active(&app, &flowing).await;
    eventually(Duration::from_secs(20), "admission resumed", || async {
        (active(&app, &flowing).await > admitted + 10).then_some(())
    })
    .await;
}

/// A numbered event's enters come in batches, one in flight at a time. Its primary hangs for
/// 15 s with no failover to end it (its replica told not to take over), while 20 clients enter
/// people one after another, each until 200. Every answer comes within one deadline, 200 or 503
/// with Retry-After: the enters queued behind the hung batch get its failure with it, instead
/// of sending a batch of their own to the same frozen node and waiting a second deadline. After
/// the thaw, everyone answered 200 holds a place of their own: the places are exactly 1..k.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enters_queued_behind_a_hung_batch_are_answered_within_one_deadline() {
    let cluster = RedisProcs::cluster(7180);
    let (app, ev) = numbered_event(&cluster, json!({"admit_per_second": 0}), |_| {}).await;
    let early = line(&app, &ev, "u", 20).await;
    let victim = cluster.primary_for_slot(slot(&app.keys.numbered(&ev).seq));
    cluster.no_failover(cluster.replica_of(victim));
    cluster.pause(victim);
    let seen = enter_through(&app, &ev, || cluster.resume(victim)).await;
    // A batch sent straight to its primary (the default) is bounded by the response timeout of
    // the connections kept for waits (3 s here: 6.0 s measured for the enters queued behind it
    // before they got its failure, 3.0 s after); through the cluster client, by the command
    // deadline (6.5 s).
    let redis = crate::common::test_config("x").redis;
    let one = match redis.direct {
        true => Duration::from_millis(redis.response_timeout_ms.max(redis.booking_wait_ms + 500)),
        false => command_deadline(&redis),
    };
    assert_within_one(&app, &ev, early, seen, one, "a hung batch").await;
}

/// The same with the primary answering and its replica frozen, its link cut: no batch reaches
/// a replica, so each waits out its `WAIT` (`WAITROOM_BOOKING_WAIT_MS`, 3 s here) and its
/// enters answer 503. The enters queued behind it get that answer with it, instead of waiting
/// a `WAIT` of their own (6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enters_queued_behind_an_unconfirmed_batch_are_answered_within_one_wait() {
    let cluster = RedisProcs::cluster(7190);
    let wait = Duration::from_secs(3);
    let (app, ev) = numbered_event(&cluster, json!({"admit_per_second": 0}), |c| {
        c.redis.booking_wait_ms = wait.as_millis() as u64
    })
    .await;
    let early = line(&app, &ev, "u", 20).await;
    let primary = cluster.primary_for_slot(slot(&app.keys.numbered(&ev).seq));
    let replica = cluster.replica_of(primary);
    let counted_before = app.metric(NOT_REPLICATED).await;
    cluster.pause(replica);
    cluster.cut_replicas(primary);
    let seen = enter_through(&app, &ev, || cluster.resume(replica)).await;
    // Every refusal here is a shortfall of the replica's acknowledgement (the primary answers),
    // and each is counted: the series WaitroomEntersNotReplicated watches. At least, not
    // exactly: the counter is the process's, shared by tests run in one process.
    let refused = seen.iter().filter(|(t, _)| t.is_none()).count() as f64;
    let counted = app.metric(NOT_REPLICATED).await - counted_before;
    assert!(
        refused > 0.0 && counted >= refused,
        "{refused} enters answered 503, {counted} counted as not replicated"
    );
    assert_within_one(&app, &ev, early, seen, wait, "an unconfirmed batch").await;
}

/// Numbered enters refused for want of a replica's acknowledgement.
const NOT_REPLICATED: &str = "waitroom_numbers_not_replicated_total";

/// What one client saw of one enter: the ticket of a 200 (None for a 503), and how long the
/// answer took.
type Entered = (Option<String>, Duration);

/// 20 clients enter people into `ev` one after another, each again after a 503 until 200 (as a
/// client does: a batch that failed may still have written the place, and it is kept), for
/// 15 s of a fault that `end` ends, then until each has a 200 after it, or a minute. Returns
/// every answer.
async fn enter_through(app: &Arc<TestApp>, ev: &str, end: impl FnOnce()) -> Vec<Entered> {
    let began = Instant::now();
    let fault = Duration::from_secs(15);
    let clients: Vec<_> = (0..20)
        .map(|c| {
            let (app, ev) = (app.clone(), ev.to_owned());
            tokio::spawn(async move {
                let mut seen: Vec<Entered> = Vec::new();
                let mut i = 0;
                while began.elapsed() < Duration::from_secs(60) {
                    let sent = Instant::now();
                    let r = app.enter(&ev, &format!("c{c}-{i}")).await;
                    let took = sent.elapsed();
                    match r.status() {
                        StatusCode::OK => {
                            i += 1;
                            let b: Value = r.json().await.unwrap();
                            let ticket = b["ticket"].as_str().unwrap().to_owned();
                            seen.push((Some(ticket), took));
                            if began.elapsed() > fault {
                                break;
                            }
                        }
                        StatusCode::SERVICE_UNAVAILABLE => {
                            assert!(
                                r.headers().contains_key("retry-after"),
                                "a 503 says when to come back"
                            );
                            seen.push((None, took));
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        s => panic!("an enter answered {s} during the fault"),
                    }
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(fault).await;
    end();
    let mut seen = Vec::new();
    for client in clients {
        seen.extend(client.await.unwrap());
    }
    seen
}

/// The enters of [`enter_through`] felt the fault (a 503), each answer came within `one` (one
/// deadline or wait) and 2 s for two debug builds on 2 cores to answer, and nobody answered 200
/// (`early`, then the clients') was lost or shares a place: the places are exactly 1..k.
async fn assert_within_one(
    app: &TestApp,
    ev: &str,
    early: Vec<String>,
    seen: Vec<Entered>,
    one: Duration,
    what: &str,
) {
    let refused = seen.iter().filter(|(t, _)| t.is_none()).count();
    let slowest = seen.iter().map(|(_, took)| *took).max().unwrap_or_default();
    eprintln!(
        "{what}: {} enters answered, {refused} with 503, slowest {slowest:?}",
        seen.len()
    );
    assert!(refused > 0, "the enters felt the fault");
    let bound = one + Duration::from_secs(2);
    assert!(
        slowest < bound,
        "an enter took {slowest:?} (bound {bound:?}) behind {what}: the enters queued behind \
         it waited for a batch of their own"
    );
    let everyone: Vec<String> = early
        .into_iter()
        .chain(seen.into_iter().filter_map(|(t, _)| t))
        .collect();
    let mut positions = Vec::new();
    for t in &everyone {
        let r = app.poll_ok(ev, t).await;
        positions.push(r["position"].as_u64().expect("waiting, with a position"));
    }
    positions.sort_unstable();
    assert_eq!(positions, (1..=everyone.len() as u64).collect::<Vec<_>>());
}

/// Admitted so far on a numbered event, from the admin API's figures.
async fn admitted_total(app: &TestApp, ev: &str) -> u64 {
    app.get_event(ev).await["stats"]["admitted_total"]
        .as_u64()
        .expect("admitted_total")
}

/// Enters `user` as a client does: after a 503 (with its Retry-After), the same enter again,
/// until 200. Returns the ticket and the number of 503s on the way.
async fn enter_until_ok(app: &TestApp, ev: &str, user: &str) -> (String, usize) {
    let started = Instant::now();
    let mut refused = 0;
    loop {
        let r = app.enter(ev, user).await;
        match r.status() {
            StatusCode::OK => {
                let b: Value = r.json().await.unwrap();
                return (b["ticket"].as_str().unwrap().to_owned(), refused);
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(
                    r.headers().contains_key("retry-after"),
                    "a 503 says when to come back"
                );
                refused += 1;
            }
            s => panic!("an enter of {user} answered {s}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{user} was refused for a minute"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A service on `cluster` (its configuration changed by `tweak`) with a numbered event of 4
/// shards, nobody judged abandoned during the test, and the rest of the event's configuration
/// from `config`.
async fn numbered_event(
    cluster: &RedisProcs,
    config: Value,
    tweak: impl FnOnce(&mut Config),
) -> (Arc<TestApp>, String) {
    let urls = cluster.urls();
    let app = Arc::new(
        spawn_app_with(|c| {
            c.redis.nodes = urls;
            tweak(c);
        })
        .await,
    );
    let ev = unique("e");
    let mut body = json!({"line_form": "numbered", "shards": 4, "abandon_after_seconds": 3600});
    if let (Some(body), Value::Object(rest)) = (body.as_object_mut(), config) {
        body.extend(rest);
    }
    app.create_event(&ev, body).await;
    (app, ev)
}

/// A service on `cluster` with a numbered event: 300 people entered one after another, admitted
/// 10 a second with room for all, nobody judged abandoned during the test. Returns the
/// service, the event, the 300 tickets in order, and the number admitted once at least 10 are.
async fn numbered_sale(cluster: &RedisProcs) -> (Arc<TestApp>, String, Vec<String>, u64) {
    let (app, ev) = numbered_event(
        cluster,
        json!({"admit_per_second": 10, "active_capacity": 100000, "active_ttl_seconds": 3600}),
        |_| {},
    )
    .await;
    let early = line(&app, &ev, "u", 300).await;
    let admitted = eventually(Duration::from_secs(20), "admission flows", || async {
        let n = admitted_total(&app, &ev).await;
        (n >= 10).then_some(n)
    })
    .await;
    (app, ev, early, admitted)
}

/// Enters `late0`, `late1`, … one after another, each until 200 ([`enter_until_ok`]), until
/// `stop`. Yields the tickets in order and the 503s met on the way.
fn enters_until(
    app: &Arc<TestApp>,
    ev: &str,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<String>, usize)> {
    let (app, ev, stop) = (app.clone(), ev.to_owned(), stop.clone());
    tokio::spawn(async move {
        let (mut answered, mut refused) = (Vec::new(), 0);
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let (t, r) = enter_until_ok(&app, &ev, &format!("late{i}")).await;
            answered.push(t);
            refused += r;
            i += 1;
        }
        (answered, refused)
    })
}

/// Stops the enters of [`enters_until`] (`stop`, `late`), checks they met the fault (a 503 on
/// the way), and checks the whole line, `early` then the late enters
/// ([`assert_numbered_line`]).
async fn end_numbered_sale(
    app: &TestApp,
    ev: &str,
    early: &[String],
    (stop, late): (
        Arc<AtomicBool>,
        tokio::task::JoinHandle<(Vec<String>, usize)>,
    ),
    admitted_before: u64,
    what: &str,
) {
    stop.store(true, Ordering::Relaxed);
    let (late, refused) = late.await.unwrap();
    eprintln!(
        "{what} {} late enters answered 200 ({refused} answers 503 on the way), {admitted_before} admitted before the fault",
        late.len()
    );
    assert!(refused > 0, "the enters felt the fault");
    let everyone: Vec<&String> = early.iter().chain(&late).collect();
    assert_numbered_line(app, ev, &everyone, admitted_before).await;
}

/// The end of a numbered failover: admission goes on (10 more than `before`), then, admission
/// held, everyone answered 200 (`everyone`, in the order they entered) is still known (no 404)
/// and the line is one admitted prefix, longer than `before`, then places 1..k in that order:
/// nobody lost, nobody sharing a place.
async fn assert_numbered_line(app: &TestApp, ev: &str, everyone: &[&String], before: u64) {
    eventually(Duration::from_secs(20), "admission resumed", || async {
        (admitted_total(app, ev).await > before + 10).then_some(())
    })
    .await;
    app.update_event(ev, json!({"admit_per_second": 0})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut statuses = Vec::new();
    for t in everyone {
        let r = app.poll(ev, t).await;
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "{t}, answered 200, is still known"
        );
        let b: Value = r.json().await.unwrap();
        statuses.push((
            b["status"].as_str().unwrap().to_owned(),
            b["position"].as_u64(),
        ));
    }
    let admitted = statuses.iter().take_while(|(s, _)| s == "admitted").count();
    let expected: Vec<(String, Option<u64>)> = (0..everyone.len())
        .map(|i| match i < admitted {
            true => ("admitted".to_owned(), None),
            false => ("waiting".to_owned(), Some((i - admitted) as u64 + 1)),
        })
        .collect();
    let wrong: Vec<usize> = (0..everyone.len())
        .filter(|&i| statuses[i] != expected[i])
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} answered 200 are not an admitted prefix ({admitted}) then 1..k in entering order; \
         the first (index, answer, expected): {:?}",
        wrong.len(),
        everyone.len(),
        wrong
            .iter()
            .take(5)
            .map(|&i| (i, &statuses[i], &expected[i]))
            .collect::<Vec<_>>()
    );
    assert!(
        admitted as u64 > before,
        "admitted after the failover: {admitted}, before: {before}"
    );
}

/// The numbered line's own failover: its counter, index, figures and admission all live in the
/// event's slot, so this kills the one primary that serves all of them, mid-sale, with enters
/// going on up to the kill, admission flowing, and its replica 300 ms behind (frozen). Clients
/// see 200 or 503 with Retry-After; polls come back with the failover, enters once the promoted
/// primary has a replica again. Unlike the sorted-set line, where the last moment's entries may
/// be lost, no enter answered 200 is lost: an enter is answered only once a replica holds its
/// number ([`assert_numbered_line`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_numbered_events_primary_mid_sale_loses_no_enter_answered_200() {
    let mut cluster = RedisProcs::cluster(7150);
    let (app, ev, early, admitted_before) = numbered_sale(&cluster).await;
    let stop = Arc::new(AtomicBool::new(false));
    let late = enters_until(&app, &ev, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = cluster.primary_for_slot(slot(&app.keys.numbered(&ev).seq));
    let replica = cluster.replica_of(victim);
    // The replica falls behind: frozen and its link cut, while enters and ticks go on against
    // the primary alone for 300 ms; then the primary dies, and the replica wakes to take over.
    cluster.pause(replica);
    cluster.cut_replicas(victim);
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(victim);
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.resume(replica);
    let polled = killed_at.elapsed();
    let seen = poll_through(&app, &ev, &early, Duration::from_secs(40)).await;
    assert_clean(&seen);
    report("numbered failover: polls back", polled, &seen);
    // The promoted replica has no replica of its own, so it cannot hold a number twice: every
    // enter answers 503 until the operator gives it one (the dead node replaced by a fresh
    // replica, as in the counter's failover test).
    tokio::task::block_in_place(|| {
        cluster.wait_primary(replica, Duration::from_secs(30));
        cluster.replace_as_replica(victim, replica);
    });
    eprintln!(
        "numbered failover: a replica again {:?} after the kill",
        killed_at.elapsed()
    );
    // Enters answered 200 again before the end (the loop enters until 200, a minute at most).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let numbered = "numbered failover:";
    end_numbered_sale(&app, &ev, &early, (stop, late), admitted_before, numbered).await;
}

/// The frozen-primary test on a numbered event: the event's primary stopped (SIGSTOP) for 10 s
/// mid-sale, longer than the node timeout, so its replica takes over and the old primary wakes
/// demoted, as the new primary's replica. Every answer comes within the Redis bound (no hang),
/// as 200 or 503 with Retry-After; enters come back without an operator (the woken node is the
/// replica that acknowledges), and the line afterwards is exact ([`assert_numbered_line`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_numbered_primary_gives_503_not_a_hang_and_enters_resume_when_it_thaws() {
    let cluster = RedisProcs::cluster(7160);
    let (app, ev, early, admitted_before) = numbered_sale(&cluster).await;
    let stop = Arc::new(AtomicBool::new(false));
    let late = enters_until(&app, &ev, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = cluster.primary_for_slot(slot(&app.keys.numbered(&ev).seq));
    let frozen_at = freeze_through(
        &cluster,
        victim,
        &app,
        &ev,
        &early,
        "frozen numbered primary: polls back",
    )
    .await;
    // Enters come back once the woken node replicates the promoted one.
    let entered = enters_back_after(&app, &ev, frozen_at).await;
    eprintln!("frozen numbered primary: enters back {entered:?} after the freeze began");
    let frozen = "frozen numbered primary:";
    end_numbered_sale(&app, &ev, &early, (stop, late), admitted_before, frozen).await;
}

/// Waits (30 s at most) until an enter answers 200 again; returns how long after `since` that
/// was. The enter is the last early user's again: it takes the batch's path (script and `WAIT`)
/// and keeps that user's place, so the line does not grow.
async fn enters_back_after(app: &TestApp, ev: &str, since: Instant) -> Duration {
    eventually(Duration::from_secs(30), "enters answered again", || async {
        let r = app.enter(ev, "u299").await;
        (r.status() == StatusCode::OK).then(|| since.elapsed())
    })
    .await
}
