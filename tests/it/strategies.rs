//! Ordering strategies on the real cluster: statistical accuracy and admission drift, runtime
//! switching in every direction, and the hybrid policy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands as _;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::common::{eventually, member, members, spawn_app, unique, TestApp, ADMIN_TOKEN};

/// Exact 1-based positions by line member, indexed by ticket (or by member: see [`member`]).
pub struct Positions(HashMap<String, u64>);

impl Positions {
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<T: AsRef<str> + ?Sized> std::ops::Index<&T> for Positions {
    type Output = u64;

    fn index(&self, ticket: &T) -> &u64 {
        let m = member(ticket.as_ref());
        self.0
            .get(&m)
            .unwrap_or_else(|| panic!("{} ({m}) is not waiting", ticket.as_ref()))
    }
}

/// Every waiting ticket with its exact 1-based position, computed from Redis directly.
pub async fn exact_positions(app: &TestApp, ev: &str) -> Positions {
    let mut keyed = Vec::new();
    for (shard, tag) in app.shard_tags(ev).await.iter().enumerate() {
        let members: Vec<(String, f64)> = app
            .redis
            .clone()
            .zrange_withscores(app.keys.shard(tag).waiting, 0, -1)
            .await
            .unwrap();
        keyed.extend(members.into_iter().map(|(m, s)| (s, shard, m)));
    }
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    Positions(
        keyed
            .into_iter()
            .enumerate()
            .map(|(i, (_, _, m))| (m, i as u64 + 1))
            .collect(),
    )
}

/// Enters `n` users concurrently (200 at a time); returns their tickets.
async fn enter_many(app: &Arc<TestApp>, ev: &str, prefix: &str, n: usize) -> Vec<String> {
    let gate = Arc::new(Semaphore::new(200));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (app, ev, gate, user) = (
                app.clone(),
                ev.to_owned(),
                gate.clone(),
                format!("{prefix}{i}"),
            );
            tokio::spawn(async move {
                let _p = gate.acquire().await.unwrap();
                app.enter_ok(&ev, &user).await["ticket"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Switches `ev` to `strategy` through the admin API; the answer is 200.
pub async fn set_strategy(app: &TestApp, ev: &str, strategy: &str) {
    let r = app
        .http
        .put(format!("{}/admin/v1/events/{ev}/strategy", app.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"strategy": strategy}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "switch to {strategy}");
}

/// An Eulerian circuit over the 4 strategies from `timestamp`: every one of the 12 ordered
/// pairs once. T=timestamp, S=statistical, H=hybrid, G=global_counter:
/// T->S->H->G->T->H->S->G->H->T->G->S->T
pub const EVERY_DIRECTION: [&str; 12] = [
    "statistical",
    "hybrid",
    "global_counter",
    "timestamp",
    "hybrid",
    "statistical",
    "global_counter",
    "hybrid",
    "timestamp",
    "global_counter",
    "statistical",
    "timestamp",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statistical_positions_and_admission_stay_within_their_documented_bounds() {
    let app = Arc::new(spawn_app().await);
    let ev = unique("e");
    app.create_event(&ev, json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0, "strategy": "statistical", "active_capacity": 800,
                  // Nobody polls while 20,000 enter: the default 60 s would take the first for
                  // gone were the enters slower than ~270/s.
                  "abandon_after_seconds": 600}))
        .await;
    let tickets = enter_many(&app, &ev, "u", 20_000).await;
    // The leader publishes the line's total with each tick: wait until it has published all
    // 20,000 (a fixed 2.5 s once stood here, which a loaded machine's leader can outlast),
    // then let the instance's 500 ms event cache let go of older figures.
    whole_line_published(&app, &ev, 20_000).await;

    let exact = exact_positions(&app, &ev).await;
    let w = exact.len() as f64;
    assert_eq!(exact.len(), 20_000);
    let mut worst = 0f64;
    for t in tickets.iter().step_by(50) {
        let s = app.poll_ok(&ev, t).await;
        assert_eq!(s["strategy"], "statistical");
        let shown = s["position"].as_u64().unwrap() as f64;
        let truth = exact[t] as f64;
        // Documented bound (strategies/src/statistical.rs): |error| <= 5 sigma + (N-1)/2 + 1
        // with sigma = sqrt(W * q(1-q) * (N-1)), q = truth/W, N = 8 shards; (N-1)/2 is the
        // half rank's bias at the ends of the line, where sigma vanishes.
        let q = truth / w;
        let bound = 5.0 * (w * q * (1.0 - q) * 7.0).sqrt() + 3.5 + 1.0;
        assert!(
            (shown - truth).abs() <= bound,
            "ticket at {truth} shown {shown} (bound {bound:.0})"
        );
        worst = worst.max((shown - truth).abs());
    }
    eprintln!("statistical: worst error over 400 samples at W=20000, 8 shards: {worst}");

    // Admission: round-robin. Admit 800; each shard admits its own front, in near-equal numbers.
    app.update_event(&ev, json!({"admit_per_second": 4000}))
        .await;
    eventually(Duration::from_secs(20), "800 admitted", || async {
        (app.active_tickets(&ev).await.len() == 800).then_some(())
    })
    .await;
    let tags = app.shard_tags(&ev).await;
    let mut per_shard = Vec::new();
    for tag in &tags {
        per_shard.push(
            app.redis
                .clone()
                .zcard::<_, u64>(app.keys.shard(tag).active)
                .await
                .unwrap(),
        );
    }
    let (lo, hi) = (
        per_shard.iter().min().unwrap(),
        per_shard.iter().max().unwrap(),
    );
    assert!(
        hi - lo <= 1,
        "round-robin drift between shards: {per_shard:?}"
    );
    // Drift from global order: every admitted person was among the first k + 5*sqrt(k*N).
    let k = 800f64;
    let bound = (k + 5.0 * (k * 8.0).sqrt()) as u64;
    let active = app.active_tickets(&ev).await;
    let worst_rank = active.iter().map(|t| exact[t]).max().unwrap();
    assert!(
        worst_rank <= bound,
        "an admitted person was at {worst_rank} > {bound}"
    );
    eprintln!("statistical admission: last admitted had global rank {worst_rank} of k=800");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn switching_strategy_in_every_direction_loses_nobody_and_reaches_other_instances_within_a_second(
) {
    let app = Arc::new(spawn_app().await);
    let other = app.another_instance().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0}),
    )
    .await;
    let mut tickets = enter_many(&app, &ev, "u", 300).await;
    // The admission leader publishes the line's figures (statistical positions need the total).
    eventually(
        Duration::from_secs(10),
        "leader figures published",
        || async {
            (!app.get_event(&ev).await["stats"]["measured_admit_per_second"].is_null())
                .then_some(())
        },
    )
    .await;

    let mut rounds: Vec<Vec<String>> = vec![tickets.clone()];
    for (round, strategy) in EVERY_DIRECTION.iter().enumerate() {
        let switched = Instant::now();
        set_strategy(&app, &ev, strategy).await;
        // The other instance answers with the new strategy within a second (hybrid under 10,000
        // waiting is exact: it shows timestamp).
        let shown = if *strategy == "hybrid" {
            "timestamp"
        } else {
            strategy
        };
        let probe = tickets[0].clone();
        eventually(
            Duration::from_secs(5),
            "switch seen by the other instance",
            || async { (other.poll_ok(&ev, &probe).await["strategy"] == shown).then_some(()) },
        )
        .await;
        assert!(
            switched.elapsed() < Duration::from_secs(1),
            "seen after {:?}",
            switched.elapsed()
        );

        // Past the switch instant, new arrivals get the new strategy's order key.
        tokio::time::sleep(Duration::from_millis(1100).saturating_sub(switched.elapsed())).await;
        let newcomers = enter_many(&app, &ev, &format!("r{round}-"), 20).await;
        tickets.extend(newcomers.iter().cloned());
        rounds.push(newcomers);
        let exact = exact_positions(&app, &ev).await;
        assert_eq!(
            exact.len(),
            tickets.len(),
            "nobody lost or duplicated after switching to {strategy}"
        );
        // Nobody moved behind someone who arrived later: each round's people stand after every
        // earlier round's people, whichever order key each round got.
        for pair in rounds.windows(2) {
            let last_before = pair[0].iter().map(|t| exact[t]).max().unwrap();
            let first_after = pair[1].iter().map(|t| exact[t]).min().unwrap();
            assert!(
                last_before < first_after,
                "after switching to {strategy}: a later arrival stands ahead ({first_after} <= {last_before})"
            );
        }
        let w = tickets.len() as u64;
        for t in &tickets {
            let s = other.poll_ok(&ev, t).await;
            let p = s["position"].as_u64().unwrap();
            if shown == "timestamp" || shown == "global_counter" {
                assert_eq!(
                    p, exact[t],
                    "exact strategy stays exact after switching to {strategy}"
                );
            } else {
                // An estimate: at least 1, and beyond the line's end by no more than the noise
                // of the live line size (5 √(N · W), see statistical::live_total).
                let slack = (5.0 * (8.0 * w as f64).sqrt()).ceil() as u64;
                assert!(
                    (1..=w + slack).contains(&p),
                    "estimate {p} of a line of {w}"
                );
            }
        }
    }
}

/// For the exact strategies: concurrent arrivals get positions exactly 1..W, and admission
/// follows that order with no inversion (the admitted are always a prefix of the line).
async fn exact_strategy_orders_and_admits_in_arrival_order(strategy: &str) {
    let app = Arc::new(spawn_app().await);
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0, "strategy": strategy, "active_capacity": 100000}),
    )
    .await;
    let tickets = enter_many(&app, &ev, "u", 2000).await;
    // global_counter reads the leader's per-tick figures: let one tick pass.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let exact = exact_positions(&app, &ev).await;
    let mut shown = Vec::new();
    for t in &tickets {
        let s = app.poll_ok(&ev, t).await;
        assert_eq!(s["strategy"], strategy);
        let p = s["position"].as_u64().unwrap();
        assert_eq!(p, exact[t], "{strategy}: shown position is the exact one");
        shown.push(p);
    }
    shown.sort();
    assert_eq!(shown, (1..=2000).collect::<Vec<_>>());

    app.update_event(&ev, json!({"admit_per_second": 800}))
        .await;
    eventually(Duration::from_secs(30), "everyone admitted", || async {
        (app.active_tickets(&ev).await.len() == 2000).then_some(())
    })
    .await;
    // Each active member's score is its admission time (ms; one value per tick). Admission
    // order equals arrival order when every tick admitted people who all stood before everyone
    // admitted by a later tick: count the pairs that break that.
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    for tag in app.shard_tags(&ev).await {
        let members: Vec<(String, f64)> = app
            .redis
            .clone()
            .zrange_withscores(app.keys.shard(&tag).active, 0, -1)
            .await
            .unwrap();
        admitted.extend(members.into_iter().map(|(t, at)| (at as u64, exact[&t])));
    }
    admitted.sort();
    let ticks = admitted.chunk_by(|a, b| a.0 == b.0).count();
    assert!(ticks > 5, "admission ran over several ticks ({ticks})");
    let mut inversions = 0u64;
    let mut best_before = 0u64;
    for group in admitted.chunk_by(|a, b| a.0 == b.0) {
        inversions += group.iter().filter(|(_, p)| *p < best_before).count() as u64;
        best_before = best_before.max(group.iter().map(|(_, p)| *p).max().unwrap());
    }
    assert_eq!(
        inversions, 0,
        "{strategy}: admission order inverted arrival order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timestamp_orders_and_admits_exactly_in_arrival_order() {
    exact_strategy_orders_and_admits_in_arrival_order("timestamp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn global_counter_orders_and_admits_exactly_in_arrival_order() {
    exact_strategy_orders_and_admits_in_arrival_order("global_counter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn people_who_stop_polling_are_skipped_and_those_who_poll_are_admitted() {
    let app = Arc::new(spawn_app().await);
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 2, "admit_per_second": 0, "abandon_after_seconds": 2}),
    )
    .await;
    // Ten people; the even ones walk away without leaving, the odd ones keep polling.
    let tickets: Vec<String> = {
        let mut v = Vec::new();
        for i in 0..10 {
            v.push(
                app.enter_ok(&ev, &format!("u{i}")).await["ticket"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        v
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2600) {
        for t in tickets.iter().skip(1).step_by(2) {
            app.poll_ok(&ev, t).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    app.update_event(&ev, json!({"admit_per_second": 1000}))
        .await;
    let stayers = members(tickets.iter().skip(1).step_by(2));
    eventually(
        Duration::from_secs(10),
        "the five who kept polling admitted",
        || async {
            // They go on polling until they are in, as a waiting page does.
            for t in tickets.iter().skip(1).step_by(2) {
                app.poll_ok(&ev, t).await;
            }
            (app.active_tickets(&ev).await == stayers).then_some(())
        },
    )
    .await;
    for t in tickets.iter().step_by(2) {
        assert_eq!(
            app.poll(&ev, t).await.status(),
            StatusCode::NOT_FOUND,
            "abandoned place removed"
        );
    }
    let stats = app.get_event(&ev).await["stats"].clone();
    assert_eq!(stats["waiting"], 0);
    assert_eq!(stats["admitted_total"], 5);
    let metric = format!(r#"waitroom_abandoned_total{{event="{ev}"}} 5"#);
    assert!(app.metrics().await.contains(&metric), "missing {metric}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hybrid_estimates_when_the_line_is_large_and_goes_exact_when_it_shrinks() {
    let app = Arc::new(spawn_app().await);
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 4, "admit_per_second": 0, "strategy": "hybrid", "hybrid_min_waiting": 300, "hybrid_max_error": 0.5}),
    )
    .await;
    // The first in line enters alone: the 400 after it enter 200 at a time, in no set order.
    let first = app.enter_ok(&ev, "first").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let tickets = enter_many(&app, &ev, "u", 400).await;
    eventually(Duration::from_secs(15), "hybrid estimates", || async {
        let s = app.get_event(&ev).await["stats"].clone();
        (s["effective_strategy"] == "statistical").then_some(())
    })
    .await;
    assert_eq!(app.get_event(&ev).await["stats"]["strategy"], "hybrid");
    let gauge = format!(r#"waitroom_hybrid_estimated{{event="{ev}"}} 1"#);
    let metrics = app.metrics().await;
    assert!(metrics.contains(&gauge), "missing {gauge}");
    assert!(metrics.contains(r#"waitroom_position_error_bucket{strategy="statistical""#));
    // At the back of the line the estimate is narrow enough for the budget; at the very front
    // one rank is four places, and hybrid counts those exactly.
    eventually(Duration::from_secs(5), "polls show estimates", || async {
        (app.poll_ok(&ev, &tickets[399]).await["strategy"] == "statistical").then_some(())
    })
    .await;
    assert_eq!(app.poll_ok(&ev, &first).await["strategy"], "timestamp");

    // 300 leave: 100 waiting is under 80 % of the threshold, so positions become exact again.
    for t in &tickets[..300] {
        assert_eq!(app.leave(&ev, t).await.status(), StatusCode::NO_CONTENT);
    }
    eventually(Duration::from_secs(15), "hybrid exact again", || async {
        let s = app.get_event(&ev).await["stats"].clone();
        (s["effective_strategy"] == "timestamp").then_some(())
    })
    .await;
    let exact = exact_positions(&app, &ev).await;
    eventually(Duration::from_secs(5), "polls exact again", || async {
        (app.poll_ok(&ev, &tickets[399]).await["strategy"] == "timestamp").then_some(())
    })
    .await;
    assert_eq!(
        app.poll_ok(&ev, &tickets[399]).await["position"]
            .as_u64()
            .unwrap(),
        exact[&tickets[399]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ordering_bench_measures_exact_strategies_as_exact_and_counts_commands() {
    use clap::Parser as _;
    use waitroom_bench::ordering::{run, OrderingBenchArgs};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: OrderingBenchArgs,
    }
    // A private cluster: the bench counts commands on the servers, which other tests running
    // at the same time on the shared stack would add to.
    let cluster = crate::common::procs::RedisProcs::cluster(7200);
    let nodes = cluster.urls().join(",");
    let args = Cli::try_parse_from([
        "bench",
        "--sizes",
        "3000",
        "--shards",
        "4",
        "--samples",
        "300",
        "--enters",
        "200",
        "--redis-response-timeout-ms",
        "3000",
        "--redis-nodes",
        &nodes,
    ])
    .unwrap()
    .args;
    let report = run(args).await.unwrap();
    assert_eq!(
        report.errors.len(),
        10,
        "uniform and bursty x 2 strategies, numbered x 1, each before and after leavers"
    );
    for row in &report.errors {
        match (row.strategy.as_str(), row.left_share > 0.0) {
            ("timestamp", _) | ("global_counter", false) => {
                assert_eq!(row.max_error, 0, "{row:?}")
            }
            // The bench takes people out of the line behind the service's back (no leave, so no
            // gap recorded): with 1 % gone, 30 places at most.
            ("global_counter", true) => assert!(row.max_error <= 30, "{row:?}"),
            // An estimate: never exact, and off by about √W — 137 places at the p99 for 10,000
            // waiting over 4 shards (docs/ordering.md), so about 75 at 3,000. A broken estimate
            // (a wrong shard count, a stale total) is off by hundreds to thousands.
            ("statistical", _) => assert!(row.max_error > 0 && row.p99_error < 250, "{row:?}"),
            other => panic!("unexpected row {other:?}"),
        }
        match row.strategy.as_str() {
            "timestamp" => assert!((row.commands_per_poll - 4.0).abs() < 0.1, "{row:?}"),
            // The shard's read and the gaps' count, and a share of the figures' HMGET: one per
            // batch of the polls read together (src/queue/counted.rs), one per poll at worst.
            "global_counter" => assert!(
                row.commands_per_poll > 2.0 && row.commands_per_poll < 3.1,
                "{row:?}"
            ),
            _ => assert!((row.commands_per_poll - 1.0).abs() < 0.1, "{row:?}"),
        }
    }
    let replica = report.replica.expect("the stack is a cluster");
    assert!(replica.replica_share_of_counts > 0.99, "{replica:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn global_counter_positions_skip_leavers_and_re_entries_and_the_sampler_finds_them_exact() {
    let app = Arc::new(spawn_app().await);
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0, "strategy": "global_counter"}),
    )
    .await;
    let ticket = |v: Value| v["ticket"].as_str().unwrap().to_owned();
    let mut tickets = Vec::new();
    for i in 0..100 {
        tickets.push(ticket(app.enter_ok(&ev, &format!("u{i}")).await));
    }
    // Ten people from the middle of the line leave, and twenty further back press "enter" again:
    // each of those enters takes a counter number before it finds them in the line. Thirty
    // numbers wait nowhere; five people arrive after them.
    for t in &tickets[40..50] {
        assert_eq!(app.leave(&ev, t).await.status(), StatusCode::NO_CONTENT);
    }
    for (i, t) in tickets.iter().enumerate().take(80).skip(60) {
        let again = app.enter_ok(&ev, &format!("u{i}")).await;
        assert_eq!(&ticket(again), t, "the same place");
    }
    for i in 100..105 {
        tickets.push(ticket(app.enter_ok(&ev, &format!("u{i}")).await));
    }
    let cfg: Value = {
        let raw: String = app
            .redis
            .clone()
            .get(app.keys.event_config(&ev))
            .await
            .unwrap();
        serde_json::from_str(&raw).unwrap()
    };
    let start = cfg["counter_start"].as_u64().unwrap();
    let counter: u64 = app.redis.clone().get(app.keys.counter(&ev)).await.unwrap();
    assert_eq!(counter, start + 124, "125 numbers handed out");
    let gaps: Vec<u64> = app
        .redis
        .clone()
        .zrange(app.keys.counter_gaps(&ev), 0, -1)
        .await
        .unwrap();
    let mut expected_gaps: Vec<u64> = (start + 40..start + 50).collect();
    expected_gaps.extend(start + 100..start + 120);
    assert_eq!(
        gaps, expected_gaps,
        "leavers' numbers, then the re-entries'"
    );
    // Once the admission leader has published the counter figures, counted positions are used.
    eventually(
        Duration::from_secs(10),
        "counter figures published",
        || async {
            let stats: Option<String> = app
                .redis
                .clone()
                .hget(app.keys.event_stats(&ev), "gc_first")
                .await
                .unwrap();
            stats.filter(|f| !f.is_empty()).map(|_| ())
        },
    )
    .await;
    // Everyone, ahead of the gaps and behind them, sees their exact place.
    let exact = exact_positions(&app, &ev).await;
    let staying = tickets[..40].iter().chain(&tickets[50..]);
    for t in staying {
        let shown = app.poll_ok(&ev, t).await;
        assert_eq!(shown["strategy"], "global_counter");
        assert_eq!(shown["position"].as_u64().unwrap(), exact[t], "{t}");
    }
    assert_eq!(exact[&tickets[104]], 95);
    // The leader's sampler compares counted positions with exact ones: no error now.
    let read = || async {
        let text = app.metrics().await;
        let value = |suffix: &str| {
            let prefix =
                format!(r#"waitroom_position_error_{suffix}{{strategy="global_counter"}} "#);
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(|v| v.trim().parse::<f64>().unwrap())
                .unwrap_or(0.0)
        };
        (value("sum"), value("count"))
    };
    let (sum0, count0) = read().await;
    let (sum1, _) = eventually(Duration::from_secs(10), "counter error sampled", || async {
        let (sum, count) = read().await;
        (count >= count0 + 8.0).then_some((sum, count))
    })
    .await;
    assert_eq!(sum1, sum0, "counted positions differ from exact ones");
}

/// A place removed as abandoned while it is the head of its own shard only (the line's head is
/// someone else) stops counting in the positions behind it with the leader's next publication,
/// not when the head passes its number: with the capacity full here, the head never would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn global_counter_stops_counting_a_place_removed_as_abandoned_behind_the_head() {
    let app = Arc::new(spawn_app().await);
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 4, "admit_per_second": 0, "active_capacity": 1,
               "strategy": "global_counter", "abandon_after_seconds": 3}),
    )
    .await;
    let ticket = |v: Value| v["ticket"].as_str().unwrap().to_owned();
    let mut tickets = Vec::new();
    for i in 0..10 {
        tickets.push(ticket(app.enter_ok(&ev, &format!("u{i}")).await));
    }
    for t in &tickets {
        app.poll_ok(&ev, t).await;
    }
    // The first is admitted and fills the capacity: from here on nobody is admitted.
    app.update_event(&ev, json!({"admit_per_second": 1000}))
        .await;
    eventually(Duration::from_secs(10), "the first admitted", || async {
        (app.poll_ok(&ev, &tickets[0]).await["status"] == "admitted").then_some(())
    })
    .await;
    // The figures of the tick that admitted them describe the line before it: the next tick's
    // count the admitted one out.
    eventually(Duration::from_secs(10), "the tenth at 9", || async {
        (app.poll_ok(&ev, &tickets[9]).await["position"] == 9).then_some(())
    })
    .await;
    // Everyone keeps polling but the fifth, who walks away without leaving: the line's head is
    // the second, so the fifth is removed as the head of its shard at most.
    let silent = &tickets[4];
    let started = Instant::now();
    while exact_positions(&app, &ev)
        .await
        .0
        .contains_key(&member(silent))
    {
        for t in tickets.iter().filter(|t| *t != silent) {
            app.poll_ok(&ev, t).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the silent place was never removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let exact = exact_positions(&app, &ev).await;
    assert_eq!(exact.len(), 8, "nine waited; one was removed");
    assert_eq!(exact[&tickets[9]], 8);
    // Within a tick or two (100 ms each) everyone behind the removed place sees it gone.
    eventually(
        Duration::from_secs(3),
        "counted positions behind the removed place exact",
        || async {
            for t in &tickets[5..] {
                let shown = app.poll_ok(&ev, t).await;
                if shown["position"].as_u64() != Some(exact[t]) {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    for t in &tickets[1..4] {
        assert_eq!(
            app.poll_ok(&ev, t).await["position"].as_u64(),
            Some(exact[t])
        );
    }
}

/// Polls every ticket (100 at a time), with `last=` the position shown before when given;
/// returns each one's shown position.
async fn poll_all(
    app: &Arc<TestApp>,
    ev: &str,
    tickets: &[String],
    last: Option<&HashMap<String, u64>>,
) -> HashMap<String, u64> {
    let gate = Arc::new(Semaphore::new(100));
    let tasks: Vec<_> = tickets
        .iter()
        .map(|t| {
            let (app, ev, gate, t) = (app.clone(), ev.to_owned(), gate.clone(), t.clone());
            let query = last
                .and_then(|l| l.get(&t))
                .map(|p| format!("?last={p}"))
                .unwrap_or_default();
            tokio::spawn(async move {
                let _p = gate.acquire().await.unwrap();
                let r = app.get(&format!("/v1/events/{ev}/queue/{t}{query}")).await;
                assert_eq!(r.status(), StatusCode::OK);
                let s: serde_json::Value = r.json().await.unwrap();
                (t, s["position"].as_u64().expect("waiting"))
            })
        })
        .collect();
    let mut out = HashMap::new();
    for task in tasks {
        let (t, p) = task.await.unwrap();
        out.insert(t, p);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statistical_positions_in_a_surge_are_unbiased_and_never_move_back_beyond_the_budget() {
    // 6,000 people in 60 ordered batches of 100 into 16 shards, admission held back: a surge
    // that the leader's published line size lags behind. The first number each person sees is
    // the one their enter answered, in the middle of the surge.
    let app = Arc::new(spawn_app().await);
    let ev = unique("surge");
    let budget = 0.05;
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 16, "admit_per_second": 0, "strategy": "statistical",
               "hybrid_max_error": budget}),
    )
    .await;
    let mut seen: HashMap<String, u64> = HashMap::new();
    let gate = Arc::new(Semaphore::new(100));
    for batch in 0..60 {
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let (app, ev, gate) = (app.clone(), ev.clone(), gate.clone());
                tokio::spawn(async move {
                    let _p = gate.acquire().await.unwrap();
                    let s = app.enter_ok(&ev, &format!("b{batch}-{i}")).await;
                    let ticket = s["ticket"].as_str().unwrap().to_owned();
                    (ticket, s["position"].as_u64().expect("waiting"))
                })
            })
            .collect();
        for t in tasks {
            let (ticket, position) = t.await.unwrap();
            seen.insert(ticket, position);
        }
    }
    // Nobody leaves and later arrivals queue behind: each person's exact position now is the
    // one they had when they entered.
    let exact = exact_positions(&app, &ev).await;
    let n = 16.0_f64;
    let mut signed: Vec<f64> = Vec::new();
    for (t, shown) in &seen {
        let (shown, truth) = (*shown as f64, exact[t] as f64);
        signed.push((shown - truth) / truth);
        // The estimate's own spread (σ of a rank scaled over the other shards, see
        // statistical.rs, for the line as it was) plus that of the live line size.
        let w = truth;
        let sigma = (w * 0.25 * (n - 1.0)).sqrt() + (n * w).sqrt();
        assert!(
            (shown - truth).abs() <= 5.0 * sigma + 2.0,
            "entered at {truth}, shown {shown}: beyond 5σ = {:.0}",
            5.0 * sigma
        );
    }
    signed.sort_by(f64::total_cmp);
    let median = signed[signed.len() / 2];
    assert!(
        median.abs() <= 0.02,
        "median signed error of the positions shown on entering {:.1} %, more than ±2 %",
        median * 100.0
    );

    // Polled once the surge is over, then 3 s later with the position on screen: no one is
    // shown further back by more than the budget. "Over" means the leader has published the
    // whole line (and the instance's 500 ms event cache has let go of older figures): while its
    // figures lag by ΔW arrivals, the live correction of the total carries its own noise,
    // √(N·ΔW) (statistical.rs), and a lag of thousands under a loaded test machine moved a
    // whole shard's estimates back by 11 % once — that is the estimate's known spread in a
    // surge, checked above with the positions shown on entering, not the steady state this
    // part is about.
    whole_line_published(&app, &ev, 6000).await;
    let tickets: Vec<String> = seen.keys().cloned().collect();
    let first = poll_all(&app, &ev, &tickets, None).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = poll_all(&app, &ev, &tickets, Some(&first)).await;
    let worst = tickets
        .iter()
        .map(|t| second[t] as f64 / first[t] as f64 - 1.0)
        .fold(f64::MIN, f64::max);
    assert!(
        worst <= budget,
        "a shown position moved back by {:.1} %, beyond the {:.0} % budget",
        worst * 100.0,
        budget * 100.0
    );
}

/// Waits until the admission leader has published `waiting` people waiting in `ev`, then past
/// the instance's 500 ms event cache, so polls use those figures.
async fn whole_line_published(app: &TestApp, ev: &str, waiting: u64) {
    let stats_key = app.keys.event_stats(ev);
    eventually(Duration::from_secs(20), "the whole line published", || {
        let (mut conn, key) = (app.redis.clone(), stats_key.clone());
        async move {
            let published: Option<u64> = redis::AsyncCommands::hget(&mut conn, key, "waiting")
                .await
                .ok()?;
            (published == Some(waiting)).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
}
