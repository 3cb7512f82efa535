//! `waitroom-bench poll-rate`: polls of random tickets at a fixed rate, open loop, against any
//! server with waitroom's poll route (the service, or the naive one-set server beside it).
//!
//! Issue 16 asks for a poll p99 of at most 5 ms at 10,000 polls/s. wrk measures a closed loop
//! (50 connections as fast as they go), which says nothing about a fixed rate, and the load
//! generator's poll phase drives only the service. This command drives both servers with the
//! same client at the same rate, so `scripts/bench-pair` can put their p99s side by side: what
//! the naive design reaches on the same cores is the floor the service is compared with.
//!
//! The k-th poll is due at k / rate from the start whatever happened to the others; its latency
//! counts from then, so a stall is not hidden by fewer polls (the loadgen's poll phase uses the
//! same loop, [`open_loop`]). How late the client itself started each poll (its timer and its
//! scheduler on the shared cores) is reported apart, so the reader can tell the two tails apart.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use rand::Rng as _;
use tokio::sync::Semaphore;

use crate::loadgen::{route_report, RouteReport};

/// Options of `waitroom-bench poll-rate`.
#[derive(Debug, Clone, Args)]
pub struct PollRateArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The event polled.
    #[arg(long)]
    pub event: String,
    /// A file of tickets, one per line (`waitroom-bench tickets`); each poll picks one at random.
    #[arg(long)]
    pub tickets: PathBuf,
    /// Polls per second asked.
    #[arg(long, default_value_t = 10_000.0)]
    pub rate: f64,
    /// How long to poll.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Polls in flight at most (the connections used); a poll waiting for one counts from its
    /// due time all the same.
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
}

/// Runs `one(due)` in a task of its own for every due time k / `rate` from now until `length`
/// has passed, without waiting for the tasks before it (open loop), and hands each task's output
/// to `done` as it finishes. Returns the time from the first due time to the last answer.
///
/// tokio's timer wakes with a granularity of a millisecond, so the polls of one millisecond
/// start together; each counts from its own due time, so that lateness is in its figure.
pub async fn open_loop<T, Fut>(
    rate: f64,
    length: Duration,
    mut one: impl FnMut(Instant) -> Fut,
    mut done: impl FnMut(T),
) -> Duration
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let t0 = Instant::now();
    let end = t0 + length;
    let mut tasks = tokio::task::JoinSet::new();
    if rate > 0.0 {
        for k in 0u64.. {
            let due = t0 + Duration::from_secs_f64(k as f64 / rate);
            if due >= end {
                break;
            }
            tokio::time::sleep_until(due.into()).await;
            tasks.spawn(one(due));
            while let Some(r) = tasks.try_join_next() {
                if let Ok(v) = r {
                    done(v);
                }
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        if let Ok(v) = r {
            done(v);
        }
    }
    t0.elapsed()
}

/// What one poll came to.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    /// HTTP status, 599 when no answer came.
    status: u16,
    /// From the due time to the answer's last byte, µs.
    micros: u64,
    /// From the due time to when the client started the poll's task, µs.
    late_micros: u64,
}

/// The figures of a run.
#[derive(Debug, Clone)]
pub struct PollRateReport {
    /// The polls as loadgen reports a route: count, rate, latency from the due time, statuses
    /// (599: no answer).
    pub polls: RouteReport,
    /// How late the client started its polls, p99, ms.
    pub late_p99_ms: f64,
}

/// Reads the tickets, polls at the rate and prints the report: `Requests/sec:`, `P99_MS` and
/// `NON2XX` lines as the wrk scripts print them, so `scripts/bench-pair` reads both alike.
pub async fn run(args: PollRateArgs) -> anyhow::Result<PollRateReport> {
    let text = std::fs::read_to_string(&args.tickets)?;
    // Parsed here, once, and sent with the load generator's own client (src/client.rs): the
    // client's cost per poll is taken from the service on these cores, and its lateness is
    // reported beside the p99.
    let urls: Arc<Vec<http::Uri>> = Arc::new(
        text.lines()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| crate::client::uri(&args.url, &format!("/v1/events/{}/queue/{t}", args.event)))
            .collect::<Result<_, _>>()?,
    );
    anyhow::ensure!(!urls.is_empty(), "no tickets in {}", args.tickets.display());
    anyhow::ensure!(args.rate > 0.0, "--rate must be above 0");
    let http = crate::client::Http::new(args.connections, Duration::from_secs(30));
    let gate = Arc::new(Semaphore::new(args.connections.max(1)));
    let mut all = Histogram::<u64>::new(3)?;
    let mut late = Histogram::<u64>::new(3)?;
    let mut codes = std::collections::HashMap::new();
    let length = open_loop(
        args.rate,
        Duration::from_secs_f64(args.seconds),
        |due| {
            let (http, urls, gate) = (http.clone(), urls.clone(), gate.clone());
            async move {
                let late_micros = due.elapsed().as_micros() as u64;
                let _permit = gate.acquire_owned().await;
                let url = &urls[rand::rng().random_range(0..urls.len())];
                // The whole body is read, so the connection goes back to the pool.
                let req = crate::client::request(http::Method::GET, url.clone(), None, None);
                let status = match http.send(req).await {
                    Ok((s, _)) => s,
                    Err(_) => 599,
                };
                Outcome {
                    status,
                    micros: due.elapsed().as_micros() as u64,
                    late_micros,
                }
            }
        },
        |o: Outcome| {
            let _ = all.record(o.micros.max(1));
            let _ = late.record(o.late_micros.max(1));
            *codes.entry(o.status).or_insert(0u64) += 1;
        },
    )
    .await;
    let polls = route_report("poll", &all, &codes, length.as_secs_f64());
    let not_2xx: u64 = codes
        .iter()
        .filter(|(s, _)| !(200..300).contains(*s))
        .map(|(_, n)| n)
        .sum();
    let report = PollRateReport {
        late_p99_ms: late.value_at_quantile(0.99) as f64 / 1000.0,
        polls,
    };
    let p = &report.polls;
    println!(
        "{} polls asked at {}/s for {} s, {} connections",
        p.requests, args.rate, args.seconds, args.connections
    );
    println!("Requests/sec: {:.1}", p.per_second);
    println!("P50_MS {:.2}", p.p50_ms);
    println!("P99_MS {:.2}", p.p99_ms);
    println!("P999_MS {:.2}", p.p999_ms);
    println!("LATE_P99_MS {:.2}", report.late_p99_ms);
    println!("NON2XX {not_2xx}");
    Ok(report)
}
