//! `waitroom-bench loadgen`: a sale played against a running service over HTTP.
//!
//! Users arrive on a profile (all at the opening, a ramp, or steady) — open loop: a user starts
//! at its arrival time whatever the service answered others — enter, poll as the service
//! advises (`next_poll_ms`, divided by a time-compression factor for long sales), and when
//! admitted a share of them hold one or two random seats and book; the others leave, giving
//! their slot back. In-flight requests are bounded: `--concurrency` workers play every user from
//! one timer heap, where a user between requests is a small record ([`Visit`]), not a task, so
//! a run of millions fits in memory (the report's `loadgen_bytes_per_user`).
//!
//! It reports request counts and latency percentiles per route, answers by status, the
//! admission rate achieved against the configured one, admission-order inversions, Redis
//! commands and memory, the position error the service sampled, and the sale audit: every 201
//! booking followed to its final status, and seats sold more than once (must be 0).
//!
//! Admission is held back until everyone has entered, so the line's memory is read with all of
//! them in it. With `--poll-phase-seconds`, a poll benchmark runs at that point too (nobody is
//! admitted meanwhile): at `--poll-rate` polls per second, open loop with latency measured from
//! each poll's intended start, or closed loop at full speed when the rate is 0.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Args, ValueEnum};
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use http::{Method, Request, Uri};
use http_body_util::Full;
use rand::Rng as _;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::{Notify, Semaphore};

use crate::client::request;

use waitroom::config::DEV_ADMIN_TOKEN;

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

/// Options of `waitroom-bench loadgen`.
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
    /// How the event keeps its line: `sorted_sets` or `numbered` (docs/numbered-line.md; its
    /// strategy is `global_counter`, whatever `--strategy` says). Always sent: the service
    /// gives an event created without one the numbered line, and this default stays the sorted
    /// sets so the commands docs/benchmarks.md quotes measure what they measured.
    #[arg(long, default_value = "sorted_sets")]
    pub line_form: String,
    /// Seats of the show (rows of 50).
    #[arg(long, default_value_t = 1000)]
    pub seats: usize,
    /// Give up on users still waiting after this long, seconds.
    #[arg(long, default_value_t = 300)]
    pub max_seconds: u64,
    /// The event's `abandon_after_seconds`. Longer than the service's default (60): these users
    /// never walk away, but their polls wait while the line fills (with admission held back) or
    /// queue behind the in-flight bound, and they must not be taken for gone meanwhile.
    #[arg(long, default_value_t = 600)]
    pub abandon_after_seconds: u64,
    /// Redis nodes to read INFO from (ops/s and memory of the primaries during the run).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003,redis://127.0.0.1:7004,redis://127.0.0.1:7005"
    )]
    pub redis_nodes: Vec<String>,
    /// Length of the poll benchmark run with everyone waiting, before admission opens (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub poll_phase_seconds: f64,
    /// Polls per second in the poll benchmark, open loop; 0 polls as fast as `--concurrency`
    /// requests in flight allow.
    #[arg(long, default_value_t = 0.0)]
    pub poll_rate: f64,
    /// Process id of the service, when it runs on this machine: its CPU time is reported.
    #[arg(long)]
    pub service_pid: Option<u32>,
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
    /// Admissions per second by the service's own admission times, over the middle 90 % of the
    /// admissions (people were waiting all along; the first and last 5 % are left out: the
    /// opening tick and the line running dry).
    pub admitted_per_second_server: f64,
    /// `admitted_per_second_server` ÷ configured − 1.
    pub admission_rate_error: f64,
    /// How the `eta_seconds` waiting people were shown compares with the wait that followed
    /// (see [`EtaError`]).
    pub eta_error: EtaError,
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
    /// Time from 201 to `confirmed` as buyers saw it (see [`ConfirmLatency`]).
    pub confirm_latency: ConfirmLatency,
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
    /// Highest `used_memory` summed over the primaries, sampled every second.
    pub redis_peak_memory_bytes: u64,
    /// The poll benchmark, when one ran (route `poll-phase`, per second over its own length).
    pub poll_phase: Option<PollPhaseReport>,
    /// Admission-order inversions among admitted users (see [`inversions`]).
    pub inversions: Inversions,
    /// Position error the service's sampler recorded during the run, per strategy.
    pub position_error: Vec<PositionError>,
    /// CPU seconds spent during the run, per process group: where the machine's time went.
    pub cpu: CpuSeconds,
    /// The load generator's own peak resident memory (`VmHWM`), bytes; `None` off Linux.
    pub loadgen_peak_rss_bytes: Option<u64>,
    /// That peak divided by the users played: an upper bound of the memory one simulated
    /// user costs (the process's fixed part included).
    pub loadgen_bytes_per_user: Option<f64>,
}

/// The ETA's truth: for each admitted user, the first `eta_seconds` it was shown at least
/// [`ETA_SETTLE`] after admission opened, divided by the wait from that answer to its admission
/// (the service's `admitted_at_ms`; same machine, same clock). Waits under a second are left out.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EtaError {
    /// Users measured.
    pub samples: usize,
    /// Median of ETA ÷ actual wait.
    pub median_ratio: f64,
    /// Median of |ETA ÷ actual − 1|.
    pub median_abs_error: f64,
    /// 90th percentile of |ETA ÷ actual − 1|.
    pub p90_abs_error: f64,
}

/// How often a buyer's page asks for its booking's status after the 201.
const FOLLOW_EVERY: Duration = Duration::from_millis(25);
/// How long it asks before giving up (the audit then counts the booking as not confirmed).
const FOLLOW_FOR: Duration = Duration::from_secs(30);

/// How long the audit after the run waits for every booking's decision, all together.
const AUDIT_FOR: Duration = Duration::from_secs(60);

/// Time from a booking's 201 to its `confirmed`, as the buyer saw it (polled every 25 ms).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ConfirmLatency {
    /// Bookings confirmed while followed.
    pub samples: usize,
    /// Median, ms.
    pub p50_ms: u64,
    /// 99th percentile, ms.
    pub p99_ms: u64,
    /// Longest, ms.
    pub max_ms: u64,
}

fn confirm_latency(ms: &[u64]) -> ConfirmLatency {
    if ms.is_empty() {
        return ConfirmLatency::default();
    }
    let mut v = ms.to_vec();
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    ConfirmLatency {
        samples: v.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: v[v.len() - 1],
    }
}

/// How long after admission opens before ETAs are judged: the service measures its rate over
/// a window, and a rate that just changed is not yet steady.
pub const ETA_SETTLE: Duration = Duration::from_secs(5);

fn eta_error(ratios: &[f64]) -> EtaError {
    if ratios.is_empty() {
        return EtaError::default();
    }
    let mut r = ratios.to_vec();
    r.sort_by(f64::total_cmp);
    let mut abs: Vec<f64> = r.iter().map(|x| (x - 1.0).abs()).collect();
    abs.sort_by(f64::total_cmp);
    let at = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    EtaError {
        samples: r.len(),
        median_ratio: at(&r, 0.5),
        median_abs_error: at(&abs, 0.5),
        p90_abs_error: at(&abs, 0.9),
    }
}

/// Admissions per second over the middle 90 % of the service's admission times (ms).
fn server_rate(mut admitted_at_ms: Vec<u64>) -> f64 {
    if admitted_at_ms.len() < 20 {
        return 0.0;
    }
    admitted_at_ms.sort_unstable();
    let n = admitted_at_ms.len();
    let (lo, hi) = (n / 20, n - 1 - n / 20);
    let span_ms = admitted_at_ms[hi].saturating_sub(admitted_at_ms[lo]);
    if span_ms == 0 {
        return 0.0;
    }
    (hi - lo) as f64 * 1000.0 / span_ms as f64
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// CPU seconds (user + system) used during the run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuSeconds {
    /// The load generator itself.
    pub loadgen: Option<f64>,
    /// The service (`--service-pid`).
    pub service: Option<f64>,
    /// Every Redis node listed (INFO `used_cpu_user` + `used_cpu_sys`), replicas included.
    pub redis: Option<f64>,
}

/// The poll benchmark's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PollPhaseReport {
    /// Polls per second asked for (0: as fast as possible).
    pub target_per_second: f64,
    /// Latency and answers; latency counts from each poll's intended start.
    pub route: RouteReport,
}

/// Position error sampled by the service (`waitroom_position_error`), the run's share.
#[derive(Debug, Clone, Serialize)]
pub struct PositionError {
    /// Strategy label.
    pub strategy: String,
    /// Samples.
    pub samples: u64,
    /// Mean error, places.
    pub mean: f64,
    /// Upper bound of the histogram bucket holding the 99th percentile, places.
    pub p99_at_most: f64,
}

/// Pairs of admitted users where one was surely in line before the other (its enter was
/// answered before the other's was sent) yet was let in by a later admission tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Inversions {
    /// Admitted users compared.
    pub users: u64,
    /// Pairs whose order is certain (one's enter answered before the other's was sent).
    pub known_pairs: u64,
    /// Of those, pairs inverted.
    pub pairs: u64,
    /// Users let in before at least one person who was surely ahead of them.
    pub users_jumped_ahead: u64,
}

/// One admitted user's timeline: enter sent and answered (µs from the start, the load
/// generator's clock) and the admission tick's time (ms, the service's clock).
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    /// Enter request sent.
    pub sent_us: u64,
    /// Enter answer received.
    pub answered_us: u64,
    /// `admitted_at_ms` from the service.
    pub admitted_at_ms: u64,
}

/// Counts inversions in O(n log n): for each user B in order of sending, the users A answered
/// before B was sent whose admission tick is later than B's. Clocks are never compared across
/// machines: enter times with enter times, admission times with admission times.
pub fn inversions(users: &[Admission]) -> Inversions {
    let mut ticks: Vec<u64> = users.iter().map(|u| u.admitted_at_ms).collect();
    ticks.sort_unstable();
    ticks.dedup();
    let rank = |t: u64| ticks.partition_point(|x| *x < t);
    let mut by_answer: Vec<&Admission> = users.iter().collect();
    by_answer.sort_unstable_by_key(|u| u.answered_us);
    let mut by_send: Vec<&Admission> = users.iter().collect();
    by_send.sort_unstable_by_key(|u| u.sent_us);
    // Fenwick tree over tick ranks: how many users already known to be ahead hold each tick.
    let mut tree = vec![0u64; ticks.len() + 1];
    let (mut inserted, mut next) = (0u64, 0usize);
    let mut out = Inversions {
        users: users.len() as u64,
        ..Inversions::default()
    };
    for b in by_send {
        while next < by_answer.len() && by_answer[next].answered_us < b.sent_us {
            let mut i = rank(by_answer[next].admitted_at_ms) + 1;
            while i < tree.len() {
                tree[i] += 1;
                i += i & i.wrapping_neg();
            }
            inserted += 1;
            next += 1;
        }
        // Known to be ahead of B and admitted at or before B's tick.
        let (mut i, mut not_later) = (rank(b.admitted_at_ms) + 1, 0u64);
        while i > 0 {
            not_later += tree[i];
            i -= i & i.wrapping_neg();
        }
        let later = inserted - not_later;
        out.known_pairs += inserted;
        out.pairs += later;
        out.users_jumped_ahead += u64::from(later > 0);
    }
    out
}

/// Where a user stands, as the last status object said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Status {
    #[default]
    Waiting,
    Admitted,
    SoldOut,
}

/// What a user keeps of a status object (not the whole JSON: a million are held at once).
#[derive(Debug, Clone, Default)]
struct Answer {
    status: Status,
    next_poll_ms: u32,
    admitted_at_ms: Option<u64>,
    access_token: Option<String>,
    eta_seconds: Option<f64>,
}

impl Answer {
    fn read(body: Reply) -> Answer {
        Answer {
            status: match body.status.as_deref() {
                Some("admitted") => Status::Admitted,
                Some("sold_out") => Status::SoldOut,
                _ => Status::Waiting,
            },
            next_poll_ms: body
                .next_poll_ms
                .map_or(1000, |ms| ms.min(u64::from(u32::MAX)) as u32),
            admitted_at_ms: body.admitted_at_ms,
            access_token: body.access_token,
            eta_seconds: body.eta_seconds,
        }
    }
}

/// The fields of an answer the load generator reads (a status object, a hold, a booking); the
/// others are skipped while parsing, not built into a JSON tree (issue 16, direction 5). An
/// answer that is not such an object (an error body, no body) reads as all `None`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Reply {
    status: Option<String>,
    next_poll_ms: Option<u64>,
    admitted_at_ms: Option<u64>,
    access_token: Option<String>,
    eta_seconds: Option<f64>,
    ticket: Option<String>,
    hold_id: Option<String>,
    booking_id: Option<String>,
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
    admissions: Vec<Admission>,
    /// Tickets of waiting users, for the poll benchmark.
    tickets: Vec<uuid::Uuid>,
    /// ETA ÷ actual wait, per admitted user measured (see [`EtaError`]).
    eta_ratios: Vec<f64>,
    /// ms from each 201 to the booking's `confirmed`, as its buyer saw it.
    confirm_ms: Vec<u64>,
}

/// All the load generator keeps of one user between two requests: a million are held at once,
/// so no task, future or buffer per user, only this (see [`Ctx::worker`]).
struct Visit {
    /// The user's index: its user id is `lg<i>`.
    i: u32,
    /// The ticket, once the enter was answered 200.
    ticket: Option<uuid::Uuid>,
    /// The last answer.
    answer: Answer,
    /// When the enter was sent and answered, µs from the start.
    sent_us: u64,
    answered_us: u64,
    /// The first ETA shown once admission has run steadily (when, what).
    eta_seen: Option<(u64, f64)>,
}

impl Visit {
    /// User `i` before its enter.
    fn new(i: u32) -> Visit {
        Visit {
            i,
            ticket: None,
            answer: Answer::default(),
            sent_us: 0,
            answered_us: 0,
            eta_seen: None,
        }
    }
}

/// A visit due at `at_us` (µs from the start); ordered by that time, then by user.
struct Due {
    at_us: u64,
    visit: Visit,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.visit.i) == (other.at_us, other.visit.i)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_us, self.visit.i).cmp(&(other.at_us, other.visit.i))
    }
}

/// The users between requests: due ones in a min-heap by time, and, until polling opens (after
/// the poll benchmark), those already entered.
#[derive(Default)]
struct Line {
    due: BinaryHeap<Reverse<Due>>,
    parked: Vec<Visit>,
    open: bool,
}

struct Ctx {
    http: reqwest::Client,
    base: String,
    event: String,
    /// The sale's requests (enters, polls, holds, bookings, leaves): hyper's client without
    /// reqwest's layers (src/client.rs). `http` stays for the rest.
    raw: crate::client::Http,
    /// `/v1/events/{event}/queue`, the line's path under `base`.
    queue_path: String,
    show: String,
    seats: Vec<String>,
    args: LoadgenArgs,
    gate: Semaphore,
    stats: Mutex<Stats>,
    deadline: Instant,
    /// Users whose enter has been answered.
    entered: std::sync::atomic::AtomicUsize,
    start: Instant,
    /// Highest memory of the Redis primaries seen so far.
    peak_memory: std::sync::atomic::AtomicU64,
    /// Users between requests (see [`Line`]).
    line: Mutex<Line>,
    /// Told when an entry becomes the line's earliest, or when the last visit ends.
    pushed: Notify,
    /// Users whose visit has not ended yet.
    remaining: std::sync::atomic::AtomicUsize,
    /// When admission opened, wall-clock ms (u64::MAX before).
    opened_ms: std::sync::atomic::AtomicU64,
}

impl Ctx {
    /// One request: bounded by the gate, timed, counted.
    /// Asks for a booking every [`FOLLOW_EVERY`] until it is `confirmed` (true) or anything
    /// else but `pending`, or [`FOLLOW_FOR`] has passed (false). Not through the gate: a
    /// buyer's page is a client of its own, and queueing behind the load generator's other
    /// users would time the load generator (it put the median at 575 ms when it did).
    async fn follow_booking(&self, id: &str) -> bool {
        let started = Instant::now();
        while started.elapsed() < FOLLOW_FOR {
            tokio::time::sleep(FOLLOW_EVERY).await;
            let got = self
                .http
                .get(format!("{}/v1/bookings/{id}", self.base))
                .send()
                .await;
            let Ok(r) = got else { continue };
            if r.status().as_u16() != 200 {
                continue;
            }
            match r.json::<Value>().await {
                Ok(b) if b["status"] == "confirmed" => return true,
                Ok(b) if b["status"] != "pending" => return false,
                _ => {}
            }
        }
        false
    }

    /// `path` under the service's base URL, as a URI (`client::uri`; the base was checked at
    /// start, and the ids this adds are path characters).
    fn uri(&self, path: &str) -> Uri {
        crate::client::uri(&self.base, path).expect("the base URL was checked at start")
    }

    /// `{queue}/{ticket}`.
    fn ticket_uri(&self, ticket: &uuid::Uuid) -> Uri {
        self.uri(&format!("{}/{ticket}", self.queue_path))
    }

    async fn call(&self, route: &'static str, req: Request<Full<Bytes>>) -> Option<(u16, Reply)> {
        self.call_from(route, move || req, None)
            .await
            .map(|(s, b, _)| (s, b))
    }

    /// One request timed from `since` (its intended start, waiting for the gate included) or,
    /// without it, from when the gate let it through. Also returns when it was sent. The request
    /// is built only once the gate lets it through, so the many users waiting for the gate hold
    /// no request yet.
    async fn call_from(
        &self,
        route: &'static str,
        make: impl FnOnce() -> Request<Full<Bytes>>,
        since: Option<Instant>,
    ) -> Option<(u16, Reply, Instant)> {
        let _permit = self.gate.acquire().await.ok()?;
        let sent = Instant::now();
        let t = since.unwrap_or(sent);
        // Boxed: the HTTP future is large, and only requests through the gate need one.
        let (status, body, micros) = Box::pin(async {
            let answer = self.raw.send(make()).await;
            let micros = t.elapsed().as_micros() as u64;
            match answer {
                Ok((s, body)) => (s, serde_json::from_slice(&body).unwrap_or_default(), micros),
                Err(_) => (599, Reply::default(), micros),
            }
        })
        .await;
        let mut st = self.stats.lock().expect("stats");
        let (h, codes) = st
            .routes
            .entry(route)
            .or_insert_with(|| (Histogram::new(3).expect("histogram"), HashMap::new()));
        let _ = h.record(micros.max(1));
        *codes.entry(status).or_default() += 1;
        Some((status, body, sent))
    }

    /// Plays visits from the line until every user's visit has ended. `--concurrency` workers
    /// run, so that many requests are in flight at most (the gate also counts the buyers').
    async fn worker(self: Arc<Self>) {
        use std::sync::atomic::Ordering::Relaxed;
        while self.remaining.load(Relaxed) > 0 {
            // Registered before the line is read: a push after the read still wakes this one.
            let pushed = self.pushed.notified();
            let now = self.start.elapsed().as_micros() as u64;
            let next = {
                let mut line = self.line.lock().expect("line");
                match line.due.peek() {
                    Some(Reverse(d)) if d.at_us <= now => {
                        line.due.pop().map(|Reverse(d)| Ok(d.visit))
                    }
                    Some(Reverse(d)) => Some(Err(d.at_us - now)),
                    None => None,
                }
            };
            match next {
                Some(Ok(visit)) => self.step(visit).await,
                Some(Err(wait_us)) => {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_micros(wait_us)) => {}
                        () = pushed => {}
                    }
                }
                None => {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(50)) => {}
                        () = pushed => {}
                    }
                }
            }
        }
    }

    /// Puts a visit in the line, due in `wait`.
    fn schedule(&self, visit: Visit, wait: Duration) {
        let at_us = (self.start.elapsed() + wait).as_micros() as u64;
        let mut line = self.line.lock().expect("line");
        let i = visit.i;
        line.due.push(Reverse(Due { at_us, visit }));
        let first = line.due.peek().is_some_and(|Reverse(d)| d.visit.i == i);
        drop(line);
        if first {
            self.pushed.notify_one();
        }
    }

    /// A visit has ended.
    fn done(&self) {
        if self
            .remaining
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed)
            == 1
        {
            self.pushed.notify_waiters();
        }
    }

    /// Lets the users who entered before polling opened go on.
    fn open_line(self: &Arc<Self>) {
        let parked = {
            let mut line = self.line.lock().expect("line");
            line.open = true;
            std::mem::take(&mut line.parked)
        };
        for visit in parked {
            self.next(visit);
        }
    }

    /// The next request of a visit: its enter, or a poll.
    async fn step(self: &Arc<Self>, visit: Visit) {
        match visit.ticket {
            None => self.enter(visit).await,
            Some(ticket) => self.poll(visit, ticket).await,
        }
    }

    async fn enter(self: &Arc<Self>, mut visit: Visit) {
        let i = visit.i;
        let enter = || {
            // The user id is `lg` and digits: nothing in it to escape.
            request(
                Method::POST,
                self.uri(&self.queue_path),
                None,
                Some(format!("{{\"user_id\":\"lg{i}\"}}")),
            )
        };
        // Sent when the request left (not when the user wanted to send it: with everyone
        // arriving at once most wait for the gate, and their order is only known from here).
        let entered = self.call_from("enter", enter, None).await;
        let answered_us = self.start.elapsed().as_micros() as u64;
        let ticket = match &entered {
            Some((200, body, _)) => body
                .ticket
                .as_deref()
                .and_then(|t| uuid::Uuid::parse_str(t).ok()),
            _ => None,
        };
        let (Some(ticket), Some((_, body, sent))) = (ticket, entered) else {
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.done();
            return;
        };
        visit.ticket = Some(ticket);
        visit.answer = Answer::read(body);
        visit.sent_us = sent.duration_since(self.start).as_micros() as u64;
        visit.answered_us = answered_us;
        if self.args.poll_phase_seconds > 0.0 {
            self.stats.lock().expect("stats").tickets.push(ticket);
        }
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut line = self.line.lock().expect("line");
        if !line.open {
            line.parked.push(visit);
            return;
        }
        drop(line);
        self.next(visit);
    }

    async fn poll(self: &Arc<Self>, mut visit: Visit, ticket: uuid::Uuid) {
        let poll = || request(Method::GET, self.ticket_uri(&ticket), None, None);
        match self.call_from("poll", poll, None).await {
            Some((200, s, _)) => visit.answer = Answer::read(s),
            Some((429 | 503 | 599, _, _)) => {}
            _ => {
                self.done();
                return;
            }
        }
        self.next(visit);
    }

    /// What a visit does after an answer: wait for the next poll, or end (admitted: buy or
    /// leave, in a task of its own; sold out; past the deadline).
    fn next(self: &Arc<Self>, mut visit: Visit) {
        if visit.eta_seen.is_none() && visit.answer.status == Status::Waiting {
            let now = wall_ms();
            let opened = self.opened_ms.load(std::sync::atomic::Ordering::Relaxed);
            if now >= opened.saturating_add(ETA_SETTLE.as_millis() as u64) {
                visit.eta_seen = visit.answer.eta_seconds.map(|e| (now, e));
            }
        }
        match visit.answer.status {
            Status::Admitted => {
                tokio::spawn(self.clone().admitted(visit));
                return;
            }
            Status::SoldOut => {
                self.stats.lock().expect("stats").sold_out += 1;
                self.done();
                return;
            }
            Status::Waiting => {}
        }
        if Instant::now() > self.deadline {
            self.stats.lock().expect("stats").gave_up += 1;
            self.done();
            return;
        }
        let wait = f64::from(visit.answer.next_poll_ms) / self.args.time_compression;
        self.schedule(visit, Duration::from_millis(wait.max(10.0) as u64));
    }

    /// An admitted user: recorded, then buys (`--buy-share`) or leaves.
    async fn admitted(self: Arc<Self>, visit: Visit) {
        self.buy_or_leave(visit).await;
        self.done();
    }

    async fn buy_or_leave(&self, visit: Visit) {
        let answer = visit.answer;
        let ticket = visit.ticket.unwrap_or_default();
        {
            let mut st = self.stats.lock().expect("stats");
            st.admitted += 1;
            let now = Instant::now();
            st.first_admit.get_or_insert(now);
            st.last_admit = Some(now);
            if let (Some((shown, eta)), Some(at)) = (visit.eta_seen, answer.admitted_at_ms) {
                let waited_ms = at.saturating_sub(shown);
                if waited_ms >= 1000 {
                    st.eta_ratios.push(eta * 1000.0 / waited_ms as f64);
                }
            }
            if let Some(admitted_at_ms) = answer.admitted_at_ms {
                st.admissions.push(Admission {
                    sent_us: visit.sent_us,
                    answered_us: visit.answered_us,
                    admitted_at_ms,
                });
            }
        }
        let token = answer.access_token.unwrap_or_default();
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
            let hold = request(
                Method::POST,
                self.uri(&format!("/v1/shows/{}/holds", self.show)),
                Some(&token),
                Some(json!({"seats": picks}).to_string()),
            );
            if let Some((201, h)) = Box::pin(self.call("hold", hold)).await {
                let book = request(
                    Method::POST,
                    self.uri(&format!("/v1/shows/{}/bookings", self.show)),
                    Some(&token),
                    Some(json!({"hold_id": h.hold_id}).to_string()),
                );
                if let Some((201, b)) = Box::pin(self.call("book", book)).await {
                    let booked = Instant::now();
                    let id = b.booking_id.unwrap_or_default();
                    let confirmed = b.status.as_deref() == Some("confirmed");
                    // The buyer's page follows the booking until the ledger confirms it.
                    if !confirmed && self.follow_booking(&id).await {
                        let ms = booked.elapsed().as_millis() as u64;
                        self.stats.lock().expect("stats").confirm_ms.push(ms);
                    } else if confirmed {
                        self.stats.lock().expect("stats").confirm_ms.push(0);
                    }
                    self.stats.lock().expect("stats").bookings.push((id, picks));
                    return;
                }
            }
        }
        let leave = request(Method::DELETE, self.ticket_uri(&ticket), None, None);
        Box::pin(self.call("leave", leave)).await;
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
    let seats = crate::create_sale(
        &http,
        &args.url,
        &args.admin_token,
        &event,
        json!({"shards": args.shards, "admit_per_second": 0,
               "active_capacity": 10_000_000, "max_seats_per_hold": 4,
               "strategy": if args.line_form == "numbered" { "global_counter" } else { args.strategy.as_str() },
               "line_form": args.line_form,
               "abandon_after_seconds": args.abandon_after_seconds}),
        &show,
        args.seats,
        50,
    )
    .await?;

    let before = redis_figures(&args.redis_nodes).await;
    let cpu_before = (
        process_cpu("self"),
        args.service_pid.and_then(|p| process_cpu(&p.to_string())),
    );
    let errors_before = position_errors(&http, &args.url).await;
    let start = Instant::now();
    let queue_path = format!("/v1/events/{event}/queue");
    crate::client::uri(&args.url, &queue_path)
        .with_context(|| format!("--url {} does not make a URI", args.url))?;
    let ctx = Arc::new(Ctx {
        http: http.clone(),
        raw: crate::client::Http::new(args.concurrency, Duration::from_secs(30)),
        base: args.url.clone(),
        queue_path,
        event,
        show,
        seats,
        gate: Semaphore::new(args.concurrency),
        stats: Mutex::new(Stats::default()),
        deadline: start + Duration::from_secs(args.max_seconds),
        entered: std::sync::atomic::AtomicUsize::new(0),
        start,
        peak_memory: std::sync::atomic::AtomicU64::new(0),
        line: Mutex::new(Line {
            open: args.poll_phase_seconds <= 0.0,
            ..Line::default()
        }),
        pushed: Notify::new(),
        remaining: std::sync::atomic::AtomicUsize::new(args.users),
        opened_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
        args: args.clone(),
    });
    let stop_watching = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn(watch_run(
        ctx.clone(),
        args.redis_nodes.clone(),
        stop_watching.clone(),
    ));
    {
        let mut line = ctx.line.lock().expect("line");
        for i in 0..args.users {
            let at = arrival(args.arrivals, i, args.users, args.arrival_seconds);
            line.due.push(Reverse(Due {
                at_us: at.as_micros() as u64,
                visit: Visit::new(i as u32),
            }));
        }
    }
    let workers: Vec<_> = (0..args.concurrency.max(1))
        .map(|_| tokio::spawn(ctx.clone().worker()))
        .collect();
    // Admission is held back until everyone has entered (or the run's deadline), so the line's
    // memory is measured with all of them in it; then it opens at the configured rate.
    let opener = {
        let (ctx, args, http, event) = (ctx.clone(), args.clone(), http.clone(), ctx.event.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            while ctx.entered.load(std::sync::atomic::Ordering::Relaxed) < args.users
                && Instant::now() < ctx.deadline
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let enter_phase = t.elapsed();
            let full = redis_figures(&args.redis_nodes).await;
            let phase = if args.poll_phase_seconds > 0.0 {
                Some(poll_phase(&ctx).await)
            } else {
                None
            };
            ctx.open_line();
            ctx.opened_ms
                .store(wall_ms(), std::sync::atomic::Ordering::Relaxed);
            let _ = http
                .put(format!("{}/admin/v1/events/{event}", args.url))
                .bearer_auth(&args.admin_token)
                .json(&json!({"admit_per_second": args.admit_per_second}))
                .send()
                .await;
            (full, enter_phase, phase)
        })
    };
    for w in workers {
        let _ = w.await;
    }
    let (full, enter_phase, phase) = opener.await.unwrap_or((None, Duration::ZERO, None));
    let after = redis_figures(&args.redis_nodes).await;
    let cpu_after = (
        process_cpu("self"),
        args.service_pid.and_then(|p| process_cpu(&p.to_string())),
    );
    let seconds = start.elapsed().as_secs_f64();
    stop_watching.cancel();
    let _ = watcher.await;
    let peak_memory = ctx.peak_memory.load(std::sync::atomic::Ordering::Relaxed);
    let errors_after = position_errors(&http, &args.url).await;

    // The audit: every 201 followed to its decision; seats in two confirmed bookings. One
    // deadline for all of them, followed side by side: a ledger that decides nothing makes the
    // report count them not confirmed within a minute, not a minute per booking.
    let bookings = std::mem::take(&mut ctx.stats.lock().expect("stats").bookings);
    let (mut confirmed, mut not_confirmed) = (0u64, 0u64);
    let mut sold: HashMap<String, u64> = HashMap::new();
    let audit_until = tokio::time::Instant::now() + AUDIT_FOR;
    let decisions: Vec<String> = futures::stream::iter(&bookings)
        .map(|(id, _)| {
            let (http, url) = (&http, &args.url);
            tokio::time::timeout_at(audit_until, async move {
                loop {
                    if let Ok(r) = http.get(format!("{url}/v1/bookings/{id}")).send().await {
                        if let Ok(b) = r.json::<Value>().await {
                            if b["status"] != "pending" {
                                return b["status"].as_str().unwrap_or_default().to_owned();
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .buffered(16)
        .map(|decided| decided.unwrap_or_else(|_| "pending".into()))
        .collect()
        .await;
    for ((_, picks), decided) in bookings.iter().zip(decisions) {
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
        .filter(|(name, _)| **name != POLL_PHASE)
        .map(|(name, (h, codes))| route_report(name, h, codes, seconds))
        .collect();
    routes.sort_by(|a, b| a.route.cmp(&b.route));
    let poll_phase = match (phase, st.routes.get(POLL_PHASE)) {
        (Some(length), Some((h, codes))) => Some(PollPhaseReport {
            target_per_second: args.poll_rate,
            route: route_report(POLL_PHASE, h, codes, length.as_secs_f64()),
        }),
        _ => None,
    };
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
    let server_rate = server_rate(st.admissions.iter().map(|a| a.admitted_at_ms).collect());
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
        admitted_per_second_server: server_rate,
        admission_rate_error: if args.admit_per_second > 0.0 {
            server_rate / args.admit_per_second - 1.0
        } else {
            0.0
        },
        eta_error: eta_error(&st.eta_ratios),
        sold_out: st.sold_out,
        gave_up: st.gave_up,
        bookings: bookings.len() as u64,
        confirmed,
        not_confirmed,
        oversold,
        confirm_latency: confirm_latency(&st.confirm_ms),
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
        redis_peak_memory_bytes: peak_memory,
        poll_phase,
        inversions: inversions(&st.admissions),
        position_error: error_delta(&errors_before, &errors_after),
        cpu: CpuSeconds {
            loadgen: cpu_before.0.zip(cpu_after.0).map(|(b, a)| a - b),
            service: cpu_before.1.zip(cpu_after.1).map(|(b, a)| a - b),
            redis: before.zip(after).map(|(b, a)| a.cpu - b.cpu),
        },
        loadgen_peak_rss_bytes: peak_rss(),
        loadgen_bytes_per_user: peak_rss()
            .filter(|_| args.users > 0)
            .map(|rss| rss as f64 / args.users as f64),
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(report)
}

/// Route name of the poll benchmark.
const POLL_PHASE: &str = "poll-phase";

/// One route's figures from its latency histogram (µs) and answers by status, over `seconds`.
pub(crate) fn route_report(
    name: &str,
    h: &Histogram<u64>,
    codes: &HashMap<u16, u64>,
    seconds: f64,
) -> RouteReport {
    RouteReport {
        route: name.to_owned(),
        requests: h.len(),
        per_second: h.len() as f64 / seconds.max(1e-9),
        p50_ms: h.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: h.value_at_quantile(0.99) as f64 / 1000.0,
        p999_ms: h.value_at_quantile(0.999) as f64 / 1000.0,
        statuses: codes.clone(),
    }
}

/// The poll benchmark: polls of random waiting tickets for `--poll-phase-seconds`. Returns its
/// length.
async fn poll_phase(ctx: &Arc<Ctx>) -> Duration {
    let tickets: Arc<Vec<uuid::Uuid>> = Arc::new(std::mem::take(
        &mut ctx.stats.lock().expect("stats").tickets,
    ));
    let t0 = Instant::now();
    if tickets.is_empty() {
        return Duration::ZERO;
    }
    let end = t0 + Duration::from_secs_f64(ctx.args.poll_phase_seconds);
    let poll = |ctx: Arc<Ctx>, tickets: Arc<Vec<uuid::Uuid>>, since: Option<Instant>| async move {
        let t = &tickets[rand::rng().random_range(0..tickets.len())];
        let req = request(Method::GET, ctx.ticket_uri(t), None, None);
        ctx.call_from(POLL_PHASE, move || req, since).await;
    };
    if ctx.args.poll_rate > 0.0 {
        // Open loop: the k-th poll is due at k / rate whatever happened to the others; its
        // latency counts from then, so a slow service is not hidden by fewer polls.
        crate::rate::open_loop(
            ctx.args.poll_rate,
            end - t0,
            |due| poll(ctx.clone(), tickets.clone(), Some(due)),
            |()| {},
        )
        .await;
    } else {
        let mut tasks = tokio::task::JoinSet::new();
        // Closed loop at full speed: as many pollers as requests may be in flight.
        for _ in 0..ctx.args.concurrency {
            let (ctx, tickets) = (ctx.clone(), tickets.clone());
            tasks.spawn(async move {
                while Instant::now() < end {
                    poll(ctx.clone(), tickets.clone(), None).await;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }
    t0.elapsed()
}

/// Every second: the peak memory of the Redis primaries, and a progress bar on a terminal.
async fn watch_run(ctx: Arc<Ctx>, nodes: Vec<String>, stop: tokio_util::sync::CancellationToken) {
    let bar = indicatif::ProgressBar::new(ctx.args.users as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} entered {pos}/{len} {wide_bar} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    loop {
        if let Some(f) = redis_figures(&nodes).await {
            ctx.peak_memory
                .fetch_max(f.memory, std::sync::atomic::Ordering::Relaxed);
        }
        bar.set_position(ctx.entered.load(std::sync::atomic::Ordering::Relaxed) as u64);
        let (admitted, bookings) = {
            let st = ctx.stats.lock().expect("stats");
            (st.admitted, st.bookings.len())
        };
        bar.set_message(format!("admitted {admitted}, booked {bookings}"));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    bar.finish_and_clear();
}

/// The service's `waitroom_position_error` histogram: per strategy, (bucket bounds with
/// cumulative counts, sum, count). Empty when /metrics cannot be read.
type ErrorHistograms = HashMap<String, (Vec<(f64, u64)>, f64, u64)>;

async fn position_errors(http: &reqwest::Client, base: &str) -> ErrorHistograms {
    let text = match http.get(format!("{base}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return HashMap::new(),
    };
    parse_position_errors(&text)
}

fn parse_position_errors(text: &str) -> ErrorHistograms {
    let mut out: ErrorHistograms = HashMap::new();
    let label = |line: &str, name: &str| -> Option<String> {
        let at = line.find(&format!("{name}=\""))? + name.len() + 2;
        Some(line[at..].split('"').next()?.to_owned())
    };
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(waitroom::telemetry::POSITION_ERROR) else {
            continue;
        };
        let (Some(strategy), Some(value)) = (
            label(line, "strategy"),
            line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()),
        ) else {
            continue;
        };
        let entry = out.entry(strategy).or_default();
        if rest.starts_with("_bucket") {
            let le =
                label(line, "le").map_or(f64::INFINITY, |l| l.parse().unwrap_or(f64::INFINITY));
            entry.0.push((le, value as u64));
        } else if rest.starts_with("_sum") {
            entry.1 = value;
        } else if rest.starts_with("_count") {
            entry.2 = value as u64;
        }
    }
    out
}

/// The run's share of the histograms: after minus before.
fn error_delta(before: &ErrorHistograms, after: &ErrorHistograms) -> Vec<PositionError> {
    let mut out: Vec<PositionError> = after
        .iter()
        .filter_map(|(strategy, (buckets, sum, count))| {
            let (b_buckets, b_sum, b_count) = before.get(strategy).cloned().unwrap_or_default();
            let samples = count.saturating_sub(b_count);
            if samples == 0 {
                return None;
            }
            let mut buckets: Vec<(f64, u64)> = buckets
                .iter()
                .map(|(le, n)| {
                    let was = b_buckets
                        .iter()
                        .find(|(l, _)| l == le)
                        .map_or(0, |(_, n)| *n);
                    (*le, n.saturating_sub(was))
                })
                .collect();
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let need = (samples as f64 * 0.99).ceil() as u64;
            let p99_at_most = buckets
                .iter()
                .find(|(_, n)| *n >= need)
                .map_or(f64::INFINITY, |(le, _)| *le);
            Some(PositionError {
                strategy: strategy.clone(),
                samples,
                mean: (sum - b_sum) / samples as f64,
                p99_at_most,
            })
        })
        .collect();
    out.sort_by(|a, b| a.strategy.cmp(&b.strategy));
    out
}

/// User + system CPU seconds of a process (`self` or a pid) from /proc; None off Linux.
fn process_cpu(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; in clock
    // ticks, 100 per second on Linux.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Totals over the Redis primaries (commands, memory) and over every node (CPU).
#[derive(Debug, Clone, Copy)]
struct RedisFigures {
    commands: u64,
    memory: u64,
    cpu: f64,
}

/// Commands processed and memory used, summed over the primaries (None if Redis cannot be read).
async fn redis_figures(nodes: &[String]) -> Option<RedisFigures> {
    let mut total = RedisFigures {
        commands: 0,
        memory: 0,
        cpu: 0.0,
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
            total.commands += info_field::<u64>(&info, "total_commands_processed:");
            total.memory += info_field::<u64>(&info, "used_memory:");
        }
        total.cpu +=
            info_field::<f64>(&info, "used_cpu_user:") + info_field::<f64>(&info, "used_cpu_sys:");
    }
    Some(total)
}

/// One `name:value` field of an INFO reply (0 when absent).
fn info_field<T: std::str::FromStr + Default>(info: &str, name: &str) -> T {
    info.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_default()
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
    if let (Some(rss), Some(per)) = (r.loadgen_peak_rss_bytes, r.loadgen_bytes_per_user) {
        println!(
            "load generator peak memory {:.1} MiB: {per:.0} B per simulated user",
            rss as f64 / 1_048_576.0
        );
    }
    println!(
        "admitted {} at {:.0}/s (configured {:.0}/s); sold out told {}; gave up {}",
        r.admitted, r.admitted_per_second, r.configured_admit_per_second, r.sold_out, r.gave_up
    );
    println!(
        "admission rate by the service's admission times (middle 90 %): {:.1}/s, {:+.2} % of configured",
        r.admitted_per_second_server,
        r.admission_rate_error * 100.0
    );
    println!(
        "eta (first shown {} s after opening ÷ the wait that followed, {} users): median ratio {:.3}, median |error| {:.1} %, p90 |error| {:.1} %",
        ETA_SETTLE.as_secs(),
        r.eta_error.samples,
        r.eta_error.median_ratio,
        r.eta_error.median_abs_error * 100.0,
        r.eta_error.p90_abs_error * 100.0
    );
    println!(
        "redis primaries: {:.0} commands/s during the run; {} bytes per waiting user",
        r.redis_ops_per_second,
        r.redis_bytes_per_waiting_user
            .map(|b| format!("{b:.0}"))
            .unwrap_or_else(|| "n/a".into())
    );
    if let Some(p) = &r.poll_phase {
        println!(
            "poll benchmark ({}): {} polls at {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms",
            if p.target_per_second > 0.0 {
                format!("open loop, {:.0}/s asked", p.target_per_second)
            } else {
                "closed loop, full speed".to_owned()
            },
            p.route.requests,
            p.route.per_second,
            p.route.p50_ms,
            p.route.p99_ms,
            p.route.p999_ms
        );
    }
    println!(
        "admission order: {} admitted users, {} pairs of known order, {} inverted, {} users let in before someone surely ahead",
        r.inversions.users, r.inversions.known_pairs, r.inversions.pairs, r.inversions.users_jumped_ahead
    );
    for e in &r.position_error {
        println!(
            "position error sampled by the service ({}): {} samples, mean {:.1}, p99 <= {}",
            e.strategy, e.samples, e.mean, e.p99_at_most
        );
    }
    println!(
        "redis primaries: peak memory {} bytes",
        r.redis_peak_memory_bytes
    );
    let secs = |c: Option<f64>| c.map_or_else(|| "n/a".to_owned(), |c| format!("{c:.1} s"));
    println!(
        "cpu during the run: loadgen {}, service {}, redis (all nodes) {}",
        secs(r.cpu.loadgen),
        secs(r.cpu.service),
        secs(r.cpu.redis)
    );
    println!(
        "sale audit: {} bookings answered 201, {} confirmed, {} not confirmed, {} seats oversold; {} answers 5xx",
        r.bookings, r.confirmed, r.not_confirmed, r.oversold, r.server_errors
    );
    let c = &r.confirm_latency;
    println!(
        "201 to confirmed as buyers saw it (polled every {} ms): {} bookings, p50 {} ms, p99 {} ms, max {} ms",
        FOLLOW_EVERY.as_millis(),
        c.samples,
        c.p50_ms,
        c.p99_ms,
        c.max_ms
    );
}

/// This process's peak resident memory (`VmHWM` in /proc/self/status), bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_keeps_the_fields_read_and_an_error_body_reads_as_nothing() {
        let waiting = r#"{"ticket": "0192a4c6-2f7e-8b3c-9d4e-5f6a7b8c9d0e", "status": "waiting",
            "position": 12, "eta_seconds": 3.5, "next_poll_ms": 1234, "access_token": null,
            "strategy": "global_counter"}"#;
        let r: Reply = serde_json::from_str(waiting).expect("a status object");
        assert_eq!(
            r.ticket.as_deref(),
            Some("0192a4c6-2f7e-8b3c-9d4e-5f6a7b8c9d0e")
        );
        let a = Answer::read(r);
        assert_eq!(a.status, Status::Waiting);
        assert_eq!((a.next_poll_ms, a.eta_seconds), (1234, Some(3.5)));
        assert_eq!((a.admitted_at_ms, a.access_token), (None, None));

        let admitted = r#"{"status": "admitted", "position": null, "eta_seconds": null,
            "next_poll_ms": 30000, "access_token": "t.k", "access_expires_at": 1700000300,
            "admitted_at_ms": 1700000000123}"#;
        let a = Answer::read(serde_json::from_str(admitted).expect("admitted"));
        assert_eq!(a.status, Status::Admitted);
        assert_eq!(a.admitted_at_ms, Some(1_700_000_000_123));
        assert_eq!(a.access_token.as_deref(), Some("t.k"));

        let booked: Reply =
            serde_json::from_str(r#"{"booking_id": "b1", "status": "pending", "seats": ["A1"]}"#)
                .expect("a booking");
        assert_eq!(
            (booked.booking_id.as_deref(), booked.status.as_deref()),
            (Some("b1"), Some("pending"))
        );

        let error: Reply = serde_json::from_str(
            r#"{"error": {"code": "not_found", "message": "no such ticket"}}"#,
        )
        .expect("an error body");
        let a = Answer::read(error);
        assert_eq!((a.status, a.next_poll_ms), (Status::Waiting, 1000));
    }

    #[test]
    fn the_line_gives_the_earliest_visit_first_and_ties_by_user() {
        let mut rng = rand::rng();
        let mut heap = BinaryHeap::new();
        let mut want = Vec::new();
        for i in 0..500u32 {
            // Many ties: 20 distinct times for 500 users.
            let at_us = rng.random_range(0..20u64) * 1000;
            want.push((at_us, i));
            heap.push(Reverse(Due {
                at_us,
                visit: Visit::new(i),
            }));
        }
        want.sort_unstable();
        let got: Vec<(u64, u32)> = std::iter::from_fn(|| heap.pop())
            .map(|Reverse(d)| (d.at_us, d.visit.i))
            .collect();
        assert_eq!(got, want);
    }

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

    fn adm(sent_us: u64, answered_us: u64, admitted_at_ms: u64) -> Admission {
        Admission {
            sent_us,
            answered_us,
            admitted_at_ms,
        }
    }

    /// The definition, pair by pair, to check the O(n log n) count against.
    fn inverted_pairs_naive(users: &[Admission]) -> u64 {
        let mut n = 0;
        for a in users {
            for b in users {
                if a.answered_us < b.sent_us && b.admitted_at_ms < a.admitted_at_ms {
                    n += 1;
                }
            }
        }
        n
    }

    #[test]
    fn inversions_count_only_pairs_whose_order_is_certain() {
        // In order: nothing inverted.
        let fair = [adm(0, 10, 100), adm(20, 30, 100), adm(40, 50, 200)];
        assert_eq!(inversions(&fair).pairs, 0);
        // The third came surely after the first two but was let in by an earlier tick.
        let unfair = [adm(0, 10, 200), adm(20, 30, 200), adm(40, 50, 100)];
        let got = inversions(&unfair);
        assert_eq!((got.pairs, got.users_jumped_ahead, got.users), (2, 1, 3));
        assert_eq!(got.known_pairs, 3);
        // Overlapping enters have no certain order: not counted either way.
        let overlapping = [adm(0, 50, 200), adm(10, 60, 100)];
        assert_eq!(inversions(&overlapping).pairs, 0);
    }

    #[test]
    fn inversions_agree_with_the_definition_on_random_timelines() {
        let mut rng = rand::rng();
        for _ in 0..200 {
            let users: Vec<Admission> = (0..rng.random_range(0..60))
                .map(|_| {
                    let sent = rng.random_range(0..1_000);
                    adm(
                        sent,
                        sent + rng.random_range(1..200),
                        rng.random_range(0..20),
                    )
                })
                .collect();
            assert_eq!(inversions(&users).pairs, inverted_pairs_naive(&users));
        }
    }

    #[test]
    fn the_run_share_of_the_position_error_histogram_is_read_from_metrics() {
        let before = parse_position_errors(
            "waitroom_position_error_bucket{strategy=\"statistical\",le=\"10\"} 5\n\
             waitroom_position_error_bucket{strategy=\"statistical\",le=\"100\"} 5\n\
             waitroom_position_error_bucket{strategy=\"statistical\",le=\"+Inf\"} 5\n\
             waitroom_position_error_sum{strategy=\"statistical\"} 20\n\
             waitroom_position_error_count{strategy=\"statistical\"} 5\n",
        );
        let after = parse_position_errors(
            "# TYPE waitroom_position_error histogram\n\
             waitroom_position_error_bucket{strategy=\"statistical\",le=\"10\"} 6\n\
             waitroom_position_error_bucket{strategy=\"statistical\",le=\"100\"} 105\n\
             waitroom_position_error_bucket{strategy=\"statistical\",le=\"+Inf\"} 105\n\
             waitroom_position_error_sum{strategy=\"statistical\"} 5020\n\
             waitroom_position_error_count{strategy=\"statistical\"} 105\n",
        );
        let got = error_delta(&before, &after);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].samples, 100);
        assert_eq!(got[0].mean, 50.0);
        assert_eq!(got[0].p99_at_most, 100.0);
    }
}
