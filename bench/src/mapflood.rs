//! `waitroom-bench map-flood`: does a flood of seat-map reads slow the line?
//!
//! Against a running service it creates an event (admission off, so everyone stays in line) and
//! a show, then plays three phases of `--phase-seconds` each:
//!
//! 1. **line alone**: enters and polls at a fixed rate (`--line-rate` requests per second, one
//!    enter for every `--polls-per-enter` polls), open loop: each request's latency runs from
//!    its intended start, so a server that falls behind shows it in the latency, not in a lower
//!    request count;
//! 2. **line + map flood**: the same line traffic, plus `--map-rate` reads per second of
//!    `GET /v1/shows/{show}/seats` (no `If-None-Match`: a flood does not play nice);
//! 3. **line alone** again, to show the service recovered and to bound the run-to-run noise.
//!
//! For each phase it reports the achieved rates, p50/p99 latency of enters and polls, and how many
//! map reads went to Redis (`waitroom_seat_map_reads_total{source="redis"}` from the service's
//! `/metrics`). Run it once against a service with the snapshot (the default
//! `WAITROOM_SEAT_MAP_MAX_AGE_MS=1000`) and once with `WAITROOM_SEAT_MAP_MAX_AGE_MS=0` (every read
//! runs the map script on the show's primary): `scripts/bench-map-flood` does both.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use waitroom::config::DEV_ADMIN_TOKEN;

/// Options of `waitroom-bench map-flood`.
#[derive(Debug, Clone, Args)]
pub struct MapFloodArgs {
    /// Base URL of the service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Admin token (to create the event and show).
    #[arg(long, env = "WAITROOM_ADMIN_TOKEN", default_value = DEV_ADMIN_TOKEN)]
    pub admin_token: String,
    /// Length of each of the three phases, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub phase_seconds: f64,
    /// Line requests (enters and polls) per second, in every phase.
    #[arg(long, default_value_t = 2000.0)]
    pub line_rate: f64,
    /// Polls for each enter.
    #[arg(long, default_value_t = 3)]
    pub polls_per_enter: u32,
    /// Seat-map reads per second in the flood phase.
    #[arg(long, default_value_t = 500.0)]
    pub map_rate: f64,
    /// Seats of the show (rows of 100, at most 26 rows).
    #[arg(long, default_value_t = 2000)]
    pub seats: usize,
    /// Requests in flight at most (line and map each have their own bound).
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// A label for the report (e.g. "snapshot" or "no snapshot").
    #[arg(long, default_value = "")]
    pub label: String,
    /// Write the report as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Figures of one phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    /// What ran.
    pub phase: String,
    /// Enters answered 200 per second.
    pub enters_per_second: f64,
    /// Enter latency from its intended start, ms.
    pub enter_p50_ms: f64,
    /// 99th percentile.
    pub enter_p99_ms: f64,
    /// Polls answered 200 per second.
    pub polls_per_second: f64,
    /// Poll latency from its intended start, ms.
    pub poll_p50_ms: f64,
    /// 99th percentile.
    pub poll_p99_ms: f64,
    /// Line answers other than 200 (429, 5xx, transport errors).
    pub line_errors: u64,
    /// Seat-map reads answered 200 per second.
    pub map_reads_per_second: f64,
    /// Seat-map read latency p99, ms.
    pub map_p99_ms: f64,
    /// Map reads that ran the map script on Redis, from the service's counter.
    pub map_reads_from_redis: u64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct MapFloodReport {
    /// The run's label.
    pub label: String,
    /// Seats of the show.
    pub seats: usize,
    /// Bytes of one seat-map answer.
    pub map_bytes: usize,
    /// The phases in order.
    pub phases: Vec<PhaseReport>,
}

#[derive(Default)]
struct Recorder {
    enter: Option<Histogram<u64>>,
    poll: Option<Histogram<u64>>,
    map: Option<Histogram<u64>>,
    line_errors: u64,
}

impl Recorder {
    fn record(slot: &mut Option<Histogram<u64>>, micros: u64) {
        let h = slot.get_or_insert_with(|| Histogram::new(3).expect("histogram"));
        let _ = h.record(micros.max(1));
    }
}

fn quantile_ms(h: &Option<Histogram<u64>>, q: f64) -> f64 {
    h.as_ref()
        .map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1000.0)
}

fn count(h: &Option<Histogram<u64>>) -> u64 {
    h.as_ref().map_or(0, Histogram::len)
}

/// `waitroom_seat_map_reads_total{source="redis"}` from the service's `/metrics`.
async fn redis_map_reads(http: &reqwest::Client, base: &str) -> u64 {
    let Ok(r) = http.get(format!("{base}/metrics")).send().await else {
        return 0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.starts_with("waitroom_seat_map_reads_total") && l.contains("source=\"redis\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

struct Line {
    http: reqwest::Client,
    base: String,
    event: String,
    show: String,
    tickets: Mutex<Vec<String>>,
    next_user: AtomicUsize,
    gate: Semaphore,
    map_gate: Semaphore,
    rec: Mutex<Recorder>,
}

impl Line {
    async fn enter(&self, since: Instant) {
        let Ok(_permit) = self.gate.acquire().await else {
            return;
        };
        let i = self.next_user.fetch_add(1, Ordering::Relaxed);
        let r = self
            .http
            .post(format!("{}/v1/events/{}/queue", self.base, self.event))
            .json(&json!({"user_id": format!("mf{i}")}))
            .send()
            .await;
        let micros = since.elapsed().as_micros() as u64;
        let ticket = match r {
            Ok(r) if r.status().is_success() => r
                .json::<Value>()
                .await
                .ok()
                .and_then(|b| b["ticket"].as_str().map(str::to_owned)),
            _ => None,
        };
        let mut rec = self.rec.lock().expect("recorder");
        match ticket {
            Some(t) => {
                Recorder::record(&mut rec.enter, micros);
                drop(rec);
                self.tickets.lock().expect("tickets").push(t);
            }
            None => rec.line_errors += 1,
        }
    }

    async fn poll(&self, since: Instant, pick: usize) {
        let ticket = {
            let t = self.tickets.lock().expect("tickets");
            if t.is_empty() {
                return;
            }
            t[pick % t.len()].clone()
        };
        let Ok(_permit) = self.gate.acquire().await else {
            return;
        };
        let r = self
            .http
            .get(format!(
                "{}/v1/events/{}/queue/{ticket}",
                self.base, self.event
            ))
            .send()
            .await;
        let micros = since.elapsed().as_micros() as u64;
        let ok = match r {
            Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
            _ => false,
        };
        let mut rec = self.rec.lock().expect("recorder");
        if ok {
            Recorder::record(&mut rec.poll, micros);
        } else {
            rec.line_errors += 1;
        }
    }

    async fn read_map(&self, since: Instant) -> usize {
        let Ok(_permit) = self.map_gate.acquire().await else {
            return 0;
        };
        let r = self
            .http
            .get(format!("{}/v1/shows/{}/seats", self.base, self.show))
            .send()
            .await;
        let micros = since.elapsed().as_micros() as u64;
        let bytes = match r {
            Ok(r) if r.status().is_success() => r.bytes().await.map_or(0, |b| b.len()),
            _ => 0,
        };
        if bytes > 0 {
            Recorder::record(&mut self.rec.lock().expect("recorder").map, micros);
        }
        bytes
    }
}

/// Sends `rate` requests per second for `seconds`, each spawned at its intended start.
async fn paced<F, Fut>(rate: f64, seconds: f64, mut one: F)
where
    F: FnMut(u64, Instant) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if rate <= 0.0 {
        return;
    }
    let start = Instant::now();
    let total = (rate * seconds) as u64;
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let at = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        tasks.push(tokio::spawn(one(i, at)));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Plays the three phases and reports.
pub async fn run(args: MapFloodArgs) -> anyhow::Result<MapFloodReport> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(2 * args.concurrency)
        .timeout(Duration::from_secs(30))
        .build()?;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (event, show) = (format!("mf{tag}"), format!("mf{tag}-hall"));
    let seat_ids = crate::create_sale(
        &http,
        &args.url,
        &args.admin_token,
        &event,
        json!({"shards": 8, "admit_per_second": 0, "active_capacity": 1000,
               "abandon_after_seconds": 600}),
        &show,
        args.seats,
        100,
    )
    .await?;
    let map_bytes = http
        .get(format!("{}/v1/shows/{show}/seats", args.url))
        .send()
        .await?
        .bytes()
        .await?
        .len();
    let line = Arc::new(Line {
        http: http.clone(),
        base: args.url.clone(),
        event,
        show,
        tickets: Mutex::new(Vec::new()),
        next_user: AtomicUsize::new(0),
        gate: Semaphore::new(args.concurrency),
        map_gate: Semaphore::new(args.concurrency),
        rec: Mutex::new(Recorder::default()),
    });
    // A line to poll before the first phase is measured.
    paced(500.0, 1.0, |_, at| {
        let line = line.clone();
        async move { line.enter(at).await }
    })
    .await;
    *line.rec.lock().expect("recorder") = Recorder::default();

    let mut phases = Vec::new();
    for (name, flood) in [
        ("line alone", false),
        ("line + map flood", true),
        ("line alone again", false),
    ] {
        let redis_before = redis_map_reads(&http, &args.url).await;
        let started = Instant::now();
        let every = u64::from(args.polls_per_enter) + 1;
        let line_traffic = paced(args.line_rate, args.phase_seconds, |i, at| {
            let line = line.clone();
            async move {
                if i % every == 0 {
                    line.enter(at).await;
                } else {
                    line.poll(at, (i as usize).wrapping_mul(2_654_435_761))
                        .await;
                }
            }
        });
        let map_rate = if flood { args.map_rate } else { 0.0 };
        let map_traffic = paced(map_rate, args.phase_seconds, |_, at| {
            let line = line.clone();
            async move {
                line.read_map(at).await;
            }
        });
        tokio::join!(line_traffic, map_traffic);
        let secs = started.elapsed().as_secs_f64();
        let redis_after = redis_map_reads(&http, &args.url).await;
        let rec = std::mem::take(&mut *line.rec.lock().expect("recorder"));
        phases.push(PhaseReport {
            phase: name.to_owned(),
            enters_per_second: count(&rec.enter) as f64 / secs,
            enter_p50_ms: quantile_ms(&rec.enter, 0.5),
            enter_p99_ms: quantile_ms(&rec.enter, 0.99),
            polls_per_second: count(&rec.poll) as f64 / secs,
            poll_p50_ms: quantile_ms(&rec.poll, 0.5),
            poll_p99_ms: quantile_ms(&rec.poll, 0.99),
            line_errors: rec.line_errors,
            map_reads_per_second: count(&rec.map) as f64 / secs,
            map_p99_ms: quantile_ms(&rec.map, 0.99),
            map_reads_from_redis: redis_after.saturating_sub(redis_before),
        });
    }
    let report = MapFloodReport {
        label: args.label.clone(),
        seats: seat_ids.len(),
        map_bytes,
        phases,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(report)
}

fn print_report(r: &MapFloodReport) {
    println!(
        "map-flood {}: show of {} seats, {} bytes per map",
        r.label, r.seats, r.map_bytes
    );
    println!(
        "| phase | enters/s | enter p50 / p99 ms | polls/s | poll p50 / p99 ms | line errors | map reads/s | map p99 ms | map reads from Redis |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in &r.phases {
        println!(
            "| {} | {:.0} | {:.2} / {:.2} | {:.0} | {:.2} / {:.2} | {} | {:.0} | {:.2} | {} |",
            p.phase,
            p.enters_per_second,
            p.enter_p50_ms,
            p.enter_p99_ms,
            p.polls_per_second,
            p.poll_p50_ms,
            p.poll_p99_ms,
            p.line_errors,
            p.map_reads_per_second,
            p.map_p99_ms,
            p.map_reads_from_redis
        );
    }
}
