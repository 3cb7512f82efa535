//! `waitroom loadgen`: a sale played against a running service over HTTP.
//!
//! Users arrive on a profile (all at the opening, a ramp, or steady) — open loop: a user starts
//! at its arrival time whatever the service answered others — enter, poll as the service
//! advises (`next_poll_ms`, divided by a time-compression factor for long sales), and when
//! admitted a share of them hold one or two random seats and book; the others leave, giving
//! their slot back. In-flight requests are bounded (a connection pool, not a thread per user).
//!
//! It reports request counts and latency percentiles per route, answers by status, the
//! admission rate achieved against the configured one, and the sale audit: every 201 booking
//! followed to its final status, and seats sold more than once (must be 0).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::Rng as _;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::config::DEV_ADMIN_TOKEN;

/// When users arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// Everyone at the opening second.
    Burst,
    /// Arrivals growing linearly over `--arrival-seconds`.
    Ramp,
    /// Arrivals spread evenly over `--arrival-seconds`.
    Steady,
}

/// Options of `waitroom loadgen`.
#[derive(Debug, Clone, Args)]
pub struct LoadgenArgs {
    /// Base URL of the service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Admin token (to create the event and show).
    #[arg(long, env = "WAITROOM_ADMIN_TOKEN", default_value = DEV_ADMIN_TOKEN)]
    pub admin_token: String,
    /// Users.
    #[arg(long, default_value_t = 10_000)]
    pub users: usize,
    /// Arrival profile.
    #[arg(long, value_enum, default_value_t = Profile::Burst)]
    pub arrivals: Profile,
    /// Length of the arrival period (ramp, steady), seconds.
    #[arg(long, default_value_t = 10.0)]
    pub arrival_seconds: f64,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Polls come this many times sooner than advised.
    #[arg(long, default_value_t = 10.0)]
    pub time_compression: f64,
    /// Share of admitted users who buy.
    #[arg(long, default_value_t = 0.2)]
    pub buy_share: f64,
    /// Shards of the event.
    #[arg(long, default_value_t = 8)]
    pub shards: u32,
    /// Admissions per second configured.
    #[arg(long, default_value_t = 1000.0)]
    pub admit_per_second: f64,
    /// Ordering strategy.
    #[arg(long, default_value = "timestamp")]
    pub strategy: String,
    /// Seats of the show (rows of 50).
    #[arg(long, default_value_t = 1000)]
    pub seats: usize,
    /// Give up on users still waiting after this long, seconds.
    #[arg(long, default_value_t = 300)]
    pub max_seconds: u64,
    /// Redis nodes to read INFO from (ops/s and memory of the primaries during the run).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003,redis://127.0.0.1:7004,redis://127.0.0.1:7005"
    )]
    pub redis_nodes: Vec<String>,
    /// Write the report as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Latency and answers of one route.
#[derive(Debug, Clone, Serialize)]
pub struct RouteReport {
    /// Route name.
    pub route: String,
    /// Requests.
    pub requests: u64,
    /// Requests per second over the run.
    pub per_second: f64,
    /// Latency percentiles, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Answers by HTTP status.
    pub statuses: HashMap<u16, u64>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Users.
    pub users: usize,
    /// Wall time of the run, seconds.
    pub seconds: f64,
    /// Per route.
    pub routes: Vec<RouteReport>,
    /// Users admitted.
    pub admitted: u64,
    /// Admissions per second seen by clients, first to last admission.
    pub admitted_per_second: f64,
    /// Configured admissions per second.
    pub configured_admit_per_second: f64,
    /// Users told the event is sold out.
    pub sold_out: u64,
    /// Users still waiting at the deadline.
    pub gave_up: u64,
    /// Bookings answered 201.
    pub bookings: u64,
    /// Of those, confirmed in the ledger.
    pub confirmed: u64,
    /// Of those, not confirmed (rejected or still pending after 60 s): must be 0.
    pub not_confirmed: u64,
    /// Seats in more than one confirmed booking: must be 0.
    pub oversold: u64,
    /// Answers 5xx.
    pub server_errors: u64,
    /// Seconds from the start until every user's enter was answered.
    pub enter_phase_seconds: f64,
    /// Enters answered per second during that phase (users ÷ enter phase).
    pub enter_per_second: f64,
    /// Commands per second processed by the Redis primaries during the run.
    pub redis_ops_per_second: f64,
    /// Redis memory (primaries) per waiting user, measured with everyone entered and admission
    /// still held back: all keys of the line included.
    pub redis_bytes_per_waiting_user: Option<f64>,
}

#[derive(Default)]
struct Stats {
    routes: HashMap<&'static str, (Histogram<u64>, HashMap<u16, u64>)>,
    admitted: u64,
    first_admit: Option<Instant>,
    last_admit: Option<Instant>,
    sold_out: u64,
    gave_up: u64,
    bookings: Vec<(String, Vec<String>)>,
}

struct Ctx {
    http: reqwest::Client,
    base: String,
    event: String,
    show: String,
    seats: Vec<String>,
    args: LoadgenArgs,
    gate: Semaphore,
    stats: Mutex<Stats>,
    deadline: Instant,
    /// Users whose enter has been answered.
    entered: std::sync::atomic::AtomicUsize,
}

impl Ctx {
    /// One request: bounded by the gate, timed, counted.
    async fn call(
        &self,
        route: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Option<(u16, Value)> {
        let _permit = self.gate.acquire().await.ok()?;
        let t = Instant::now();
        let resp = req.send().await;
        let micros = t.elapsed().as_micros() as u64;
        let (status, body) = match resp {
            Ok(r) => {
                let s = r.status().as_u16();
                (s, r.json::<Value>().await.unwrap_or(Value::Null))
            }
            Err(_) => (599, Value::Null),
        };
        let mut st = self.stats.lock().expect("stats");
        let (h, codes) = st
            .routes
            .entry(route)
            .or_insert_with(|| (Histogram::new(3).expect("histogram"), HashMap::new()));
        let _ = h.record(micros.max(1));
        *codes.entry(status).or_default() += 1;
        Some((status, body))
    }

    async fn user(self: Arc<Self>, i: usize) {
        let enter = self
            .http
            .post(format!("{}/v1/events/{}/queue", self.base, self.event))
            .json(&json!({"user_id": format!("lg{i}")}));
        let entered = self.call("enter", enter).await;
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some((200, mut status)) = entered else {
            return;
        };
        let ticket = status["ticket"].as_str().unwrap_or_default().to_owned();
        loop {
            match status["status"].as_str() {
                Some("admitted") => break,
                Some("sold_out") => {
                    self.stats.lock().expect("stats").sold_out += 1;
                    return;
                }
                _ => {}
            }
            if Instant::now() > self.deadline {
                self.stats.lock().expect("stats").gave_up += 1;
                return;
            }
            let wait =
                status["next_poll_ms"].as_f64().unwrap_or(1000.0) / self.args.time_compression;
            tokio::time::sleep(Duration::from_millis(wait.max(10.0) as u64)).await;
            let poll = self.http.get(format!(
                "{}/v1/events/{}/queue/{ticket}",
                self.base, self.event
            ));
            match self.call("poll", poll).await {
                Some((200, s)) => status = s,
                Some((429 | 503 | 599, _)) => {}
                _ => return,
            }
        }
        {
            let mut st = self.stats.lock().expect("stats");
            st.admitted += 1;
            let now = Instant::now();
            st.first_admit.get_or_insert(now);
            st.last_admit = Some(now);
        }
        let token = status["access_token"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let buys = rand::rng().random_bool(self.args.buy_share.clamp(0.0, 1.0));
        if buys {
            let picks: Vec<String> = {
                let mut rng = rand::rng();
                let n = rng.random_range(1..=2usize);
                (0..n)
                    .map(|_| self.seats[rng.random_range(0..self.seats.len())].clone())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect()
            };
            let hold = self
                .http
                .post(format!("{}/v1/shows/{}/holds", self.base, self.show))
                .bearer_auth(&token)
                .json(&json!({"seats": picks}));
            if let Some((201, h)) = self.call("hold", hold).await {
                let book = self
                    .http
                    .post(format!("{}/v1/shows/{}/bookings", self.base, self.show))
                    .bearer_auth(&token)
                    .json(&json!({"hold_id": h["hold_id"]}));
                if let Some((201, b)) = self.call("book", book).await {
                    let id = b["booking_id"].as_str().unwrap_or_default().to_owned();
                    self.stats.lock().expect("stats").bookings.push((id, picks));
                    return;
                }
            }
        }
        let leave = self.http.delete(format!(
            "{}/v1/events/{}/queue/{ticket}",
            self.base, self.event
        ));
        self.call("leave", leave).await;
    }
}

/// Plays the sale and reports.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<LoadReport> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(30))
        .build()?;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (event, show) = (format!("lg{tag}"), format!("lg{tag}-hall"));
    let admin = |path: String, body: Value| {
        http.put(format!("{}{path}", args.url))
            .bearer_auth(&args.admin_token)
            .json(&body)
            .send()
    };
    let r = admin(
        format!("/admin/v1/events/{event}"),
        json!({"shards": args.shards, "admit_per_second": 0,
               "active_capacity": 10_000_000, "strategy": args.strategy, "max_seats_per_hold": 4}),
    )
    .await
    .context("creating the event")?;
    anyhow::ensure!(
        r.status().is_success(),
        "creating the event: {}",
        r.text().await.unwrap_or_default()
    );
    let rows = args.seats.div_ceil(50).clamp(1, 26);
    let last_row = (b'A' + rows as u8 - 1) as char;
    let r = admin(
        format!("/admin/v1/shows/{show}"),
        json!({"event": event, "rows": format!("A-{last_row}"), "seats_per_row": 50}),
    )
    .await
    .context("creating the show")?;
    anyhow::ensure!(
        r.status().is_success(),
        "creating the show: {}",
        r.text().await.unwrap_or_default()
    );
    let seats: Vec<String> = (0..rows)
        .flat_map(|r| (1..=50).map(move |n| format!("{}-{n}", (b'A' + r as u8) as char)))
        .collect();

    let before = redis_figures(&args.redis_nodes).await;
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        http: http.clone(),
        base: args.url.clone(),
        event,
        show,
        seats,
        gate: Semaphore::new(args.concurrency),
        stats: Mutex::new(Stats::default()),
        deadline: start + Duration::from_secs(args.max_seconds),
        entered: std::sync::atomic::AtomicUsize::new(0),
        args: args.clone(),
    });
    let users: Vec<_> = (0..args.users)
        .map(|i| {
            let at = arrival(args.arrivals, i, args.users, args.arrival_seconds);
            let ctx = ctx.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until((start + at).into()).await;
                ctx.user(i).await;
            })
        })
        .collect();
    // Admission is held back until everyone has entered (or a minute has passed), so the line's
    // memory is measured with all of them in it; then it opens at the configured rate.
    let opener = {
        let (ctx, args, http, event) = (ctx.clone(), args.clone(), http.clone(), ctx.event.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            while ctx.entered.load(std::sync::atomic::Ordering::Relaxed) < args.users
                && t.elapsed() < Duration::from_secs(60)
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let enter_phase = t.elapsed();
            let full = redis_figures(&args.redis_nodes).await;
            let _ = http
                .put(format!("{}/admin/v1/events/{event}", args.url))
                .bearer_auth(&args.admin_token)
                .json(&json!({"admit_per_second": args.admit_per_second}))
                .send()
                .await;
            (full, enter_phase)
        })
    };
    for u in users {
        let _ = u.await;
    }
    let (full, enter_phase) = opener.await.unwrap_or((None, Duration::ZERO));
    let after = redis_figures(&args.redis_nodes).await;
    let seconds = start.elapsed().as_secs_f64();

    // The audit: every 201 followed to its decision; seats in two confirmed bookings.
    let bookings = std::mem::take(&mut ctx.stats.lock().expect("stats").bookings);
    let (mut confirmed, mut not_confirmed) = (0u64, 0u64);
    let mut sold: HashMap<String, u64> = HashMap::new();
    for (id, picks) in &bookings {
        let decided = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if let Ok(r) = http
                    .get(format!("{}/v1/bookings/{id}", args.url))
                    .send()
                    .await
                {
                    if let Ok(b) = r.json::<Value>().await {
                        if b["status"] != "pending" {
                            return b["status"].as_str().unwrap_or_default().to_owned();
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .unwrap_or_else(|_| "pending".into());
        if decided == "confirmed" {
            confirmed += 1;
            for s in picks {
                *sold.entry(s.clone()).or_default() += 1;
            }
        } else {
            not_confirmed += 1;
        }
    }
    let oversold = sold.values().filter(|n| **n > 1).count() as u64;

    let st = ctx.stats.lock().expect("stats");
    let mut routes: Vec<RouteReport> = st
        .routes
        .iter()
        .map(|(name, (h, codes))| RouteReport {
            route: (*name).to_owned(),
            requests: h.len(),
            per_second: h.len() as f64 / seconds,
            p50_ms: h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms: h.value_at_quantile(0.99) as f64 / 1000.0,
            p999_ms: h.value_at_quantile(0.999) as f64 / 1000.0,
            statuses: codes.clone(),
        })
        .collect();
    routes.sort_by(|a, b| a.route.cmp(&b.route));
    let server_errors = routes
        .iter()
        .flat_map(|r| r.statuses.iter())
        .filter(|(s, _)| **s >= 500)
        .map(|(_, n)| n)
        .sum();
    let admit_span = match (st.first_admit, st.last_admit) {
        (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let report = LoadReport {
        users: args.users,
        seconds,
        routes,
        admitted: st.admitted,
        admitted_per_second: if admit_span > 0.0 {
            st.admitted as f64 / admit_span
        } else {
            0.0
        },
        configured_admit_per_second: args.admit_per_second,
        sold_out: st.sold_out,
        gave_up: st.gave_up,
        bookings: bookings.len() as u64,
        confirmed,
        not_confirmed,
        oversold,
        server_errors,
        enter_phase_seconds: enter_phase.as_secs_f64(),
        enter_per_second: args.users as f64 / enter_phase.as_secs_f64().max(1e-9),
        redis_ops_per_second: match (&before, &after) {
            (Some(b), Some(a)) => a.commands.saturating_sub(b.commands) as f64 / seconds,
            _ => 0.0,
        },
        redis_bytes_per_waiting_user: match (&before, &full) {
            (Some(b), Some(f)) if args.users > 0 => {
                Some((f.memory as f64 - b.memory as f64) / args.users as f64)
            }
            _ => None,
        },
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(report)
}

/// Totals over the Redis primaries.
#[derive(Debug, Clone, Copy)]
struct RedisFigures {
    commands: u64,
    memory: u64,
}

/// Commands processed and memory used, summed over the primaries (None if Redis cannot be read).
async fn redis_figures(nodes: &[String]) -> Option<RedisFigures> {
    let mut total = RedisFigures {
        commands: 0,
        memory: 0,
    };
    let field = |info: &str, name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    for url in nodes {
        let client = redis::Client::open(url.as_str()).ok()?;
        let connect = client.get_multiplexed_async_connection();
        let mut c = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .ok()?
            .ok()?;
        let info: String = redis::cmd("INFO")
            .arg("everything")
            .query_async(&mut c)
            .await
            .ok()?;
        if info.contains("role:master") {
            total.commands += field(&info, "total_commands_processed:");
            total.memory += field(&info, "used_memory:");
        }
    }
    Some(total)
}

/// When user `i` of `n` arrives.
fn arrival(profile: Profile, i: usize, n: usize, seconds: f64) -> Duration {
    let u = i as f64 / n.max(1) as f64;
    let at = match profile {
        Profile::Burst => 0.0,
        Profile::Steady => u * seconds,
        // Arrivals per second growing linearly: the i-th arrives at sqrt(u) of the period.
        Profile::Ramp => u.sqrt() * seconds,
    };
    Duration::from_secs_f64(at)
}

fn print_report(r: &LoadReport) {
    println!("\n{} users in {:.1} s\n", r.users, r.seconds);
    println!("| route | requests | req/s | p50 ms | p99 ms | p99.9 ms | answers |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    for x in &r.routes {
        let mut codes: Vec<_> = x.statuses.iter().collect();
        codes.sort();
        let codes: Vec<String> = codes.iter().map(|(c, n)| format!("{c}: {n}")).collect();
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} |",
            x.route,
            x.requests,
            x.per_second,
            x.p50_ms,
            x.p99_ms,
            x.p999_ms,
            codes.join(", ")
        );
    }
    println!(
        "\nall {} entered in {:.2} s ({:.0} enters/s)",
        r.users, r.enter_phase_seconds, r.enter_per_second
    );
    println!(
        "admitted {} at {:.0}/s (configured {:.0}/s); sold out told {}; gave up {}",
        r.admitted, r.admitted_per_second, r.configured_admit_per_second, r.sold_out, r.gave_up
    );
    println!(
        "redis primaries: {:.0} commands/s during the run; {} bytes per waiting user",
        r.redis_ops_per_second,
        r.redis_bytes_per_waiting_user
            .map(|b| format!("{b:.0}"))
            .unwrap_or_else(|| "n/a".into())
    );
    println!(
        "sale audit: {} bookings answered 201, {} confirmed, {} not confirmed, {} seats oversold; {} answers 5xx",
        r.bookings, r.confirmed, r.not_confirmed, r.oversold, r.server_errors
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_profiles_spread_users_as_documented() {
        assert_eq!(arrival(Profile::Burst, 5, 10, 10.0), Duration::ZERO);
        assert_eq!(
            arrival(Profile::Steady, 5, 10, 10.0),
            Duration::from_secs(5)
        );
        // Ramp: half the users arrive in the last 1 − 1/√2 ≈ 29 % of the period.
        assert_eq!(
            arrival(Profile::Ramp, 25, 100, 10.0),
            Duration::from_secs(5)
        );
    }
}
