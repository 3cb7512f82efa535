//! `waitroom-bench ordering-bench`: how wrong each strategy's positions are, and what they cost.
//!
//! For each line size, shard count and arrival pattern it fills a real line in Redis (the same
//! keys and scores the service writes, via pipelined ZADD: entering a million people through
//! the position-computing enter path would measure enter, not ordering), publishes the figures
//! the admission leader would publish, then polls a random sample through the service's own
//! poll path ([`Queue::poll`]) and compares each shown position with the exact one computed
//! here from the generated line. It repeats after a share of the line has left without saying
//! so (people leaving are what makes counters and estimates drift).
//!
//! Besides the error it measures, from the servers' own `INFO commandstats`: Redis commands per
//! poll, commands per enter and how much of that lands on the busiest primary (the
//! `global_counter` hot key), and, with replica reads, the share of poll reads the replicas
//! serve and how stale a replica read is.
//!
//! Last, admission: the Redis time of one admission tick letting in `--admit` people (5,000 by
//! default) from each line, per strategy: the scripts' time from the servers' `INFO
//! commandstats`, the slowest command from their SLOWLOG (commands over 100 µs logged for the
//! length of the tick). `--admission-only` skips the other sections.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::{stream, StreamExt as _, TryStreamExt as _};
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use redis::AsyncCommands as _;
use serde::Serialize;
use waitroom_strategies::{OrderKey, StrategyKind};

use waitroom::auth::Signer;
use waitroom::config::RedisConfig;
use waitroom::ids::{EventId, Ticket, UserId};
use waitroom::queue::event::{EventConfig, EventPatch, EventState, LineForm};
use waitroom::queue::Queue;
use waitroom::redis::keys::stats;
use waitroom::redis::{connect_reads, RedisConn, Store};

/// Options of `waitroom-bench ordering-bench`.
#[derive(Debug, Clone, Args)]
pub struct OrderingBenchArgs {
    /// Redis to measure on (the local stack's cluster by default).
    #[command(flatten)]
    pub redis: RedisConfig,
    /// Line sizes (people waiting).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    pub sizes: Vec<usize>,
    /// Shard counts.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    pub shards: Vec<u32>,
    /// Polls sampled per measurement.
    #[arg(long, default_value_t = 1000)]
    pub samples: usize,
    /// Share of the line that leaves silently before the second measurement.
    #[arg(long, default_value_t = 0.01)]
    pub leave_share: f64,
    /// Enters per strategy for the enter-cost and hot-key measurement.
    #[arg(long, default_value_t = 3000)]
    pub enters: usize,
    /// People let in by the measured admission tick (0: no admission measurement).
    #[arg(long, default_value_t = 5000)]
    pub admit: usize,
    /// Measure admission only (skip position errors, enter cost and replica reads).
    #[arg(long, default_value_t = false)]
    pub admission_only: bool,
    /// Measure only the surge: per strategy, people entering in ordered batches into a fresh
    /// event with a live admission leader, polled at once and again 3 s later.
    #[arg(long, default_value_t = false)]
    pub surge: bool,
    /// People in the surge.
    #[arg(long, default_value_t = 6000)]
    pub surge_people: usize,
    /// People per ordered batch of the surge (entered concurrently, batches one after another).
    #[arg(long, default_value_t = 100)]
    pub surge_batch: usize,
    /// Shards of the surge's events.
    #[arg(long, default_value_t = 16)]
    pub surge_shards: u32,
    /// Write the report as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// One strategy's shown positions right after a surge (signed errors relative to the exact
/// position; a move back is the second poll's rise over the first, relative to the first).
#[derive(Debug, Clone, Serialize)]
pub struct SurgeRow {
    /// The configured strategy.
    pub strategy: String,
    /// The strategy that computed most first polls (differs under `hybrid`).
    pub shown_by: String,
    /// People who entered.
    pub people: usize,
    /// Shards.
    pub shards: u32,
    /// Median of (shown − exact) / exact over the first polls.
    pub median_signed_error: f64,
    /// The first poll's signed error of largest size.
    pub worst_signed_error: f64,
    /// 99th percentile of |shown − exact| / exact over the first polls.
    pub p99_relative_error: f64,
    /// Largest rise of a shown position between the first poll and the one 3 s later (with
    /// `last=` the first), relative to the first; 0 when nobody moved back.
    pub largest_move_back: f64,
    /// How many moved back at all.
    pub moved_back: usize,
    /// Seconds the surge took to enter.
    pub enter_seconds: f64,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorRow {
    /// People waiting when sampled.
    pub waiting: usize,
    /// Shards.
    pub shards: u32,
    /// `uniform`, `bursty`, or `numbered` (global_counter: the counter orders arrivals).
    pub arrivals: &'static str,
    /// Share of the line that had left silently.
    pub left_share: f64,
    /// Strategy that computed the shown positions.
    pub strategy: String,
    /// Polls sampled.
    pub samples: usize,
    /// Median |shown − exact|.
    pub median_error: u64,
    /// 99th percentile |shown − exact|.
    pub p99_error: u64,
    /// Largest |shown − exact|.
    pub max_error: u64,
    /// 99th percentile of |shown − exact| / exact.
    pub p99_relative_error: f64,
    /// Redis commands per poll, counted by the servers.
    pub commands_per_poll: f64,
}

/// The cost of entering, per strategy.
#[derive(Debug, Clone, Serialize)]
pub struct EnterRow {
    /// Strategy.
    pub strategy: String,
    /// Shards.
    pub shards: u32,
    /// Commands processed per enter, all primaries.
    pub commands_per_enter: f64,
    /// Share of those commands processed by the busiest primary (1/3 is even on 3 primaries).
    pub busiest_primary_share: f64,
}

/// Replica reads: share of poll reads served by replicas, and replica staleness.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaRow {
    /// People waiting, shards.
    pub waiting: usize,
    /// Shards.
    pub shards: u32,
    /// Share of ZCOUNT calls that replicas served during the polls.
    pub replica_share_of_counts: f64,
    /// Share of all poll commands that still reached primaries.
    pub primary_share_of_poll_commands: f64,
    /// Time from a write acknowledged by a primary until a replica read shows it: median, ms.
    pub staleness_median_ms: f64,
    /// The same, 99th percentile, ms.
    pub staleness_p99_ms: f64,
}

/// One admission tick, timed by the Redis servers.
#[derive(Debug, Clone, Serialize)]
pub struct AdmitRow {
    /// People waiting before the tick.
    pub waiting: usize,
    /// Shards.
    pub shards: u32,
    /// Strategy.
    pub strategy: String,
    /// People admitted by the tick.
    pub admitted: usize,
    /// Wall time of the tick as the service sees it (round trips included), ms.
    pub wall_ms: f64,
    /// Redis execution time of the tick's scripts (reading the shard heads, moving people),
    /// summed over the primaries (`INFO commandstats`, `cmdstat_evalsha` usec), ms. The few
    /// plain reads of a tick (the position-error sample) are not in it.
    pub scripts_ms: f64,
    /// Scripts the tick ran.
    pub scripts: usize,
    /// The slowest single command of the tick, ms (from the SLOWLOG, which logs commands over
    /// 100 µs here: 0 when none was).
    pub slowest_ms: f64,
    /// Name of the slowest command (a script by its file name).
    pub slowest: String,
    /// The SLOWLOG's entries by command (scripts by file name): how many, and their time, ms.
    pub logged: std::collections::BTreeMap<String, (usize, f64)>,
}

/// Commands slower than this are logged (µs) while an admission tick is measured: low enough
/// to catch every script that matters, high enough that the log's own cost (it would log every
/// command a script runs at 0) stays out of the figures.
const SLOWLOG_US: u64 = 100;

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Position errors.
    pub errors: Vec<ErrorRow>,
    /// Enter cost and hot-key load.
    pub enters: Vec<EnterRow>,
    /// Replica reads (cluster only).
    pub replica: Option<ReplicaRow>,
    /// Admission ticks.
    pub admission: Vec<AdmitRow>,
    /// Shown positions right after a surge, per strategy (`--surge`).
    pub surge: Vec<SurgeRow>,
}

#[derive(Clone, Copy, PartialEq)]
enum Arrivals {
    Uniform,
    Bursty,
    Numbered,
}

impl Arrivals {
    fn name(self) -> &'static str {
        match self {
            Arrivals::Uniform => "uniform",
            Arrivals::Bursty => "bursty",
            Arrivals::Numbered => "numbered",
        }
    }
}

/// A generated person: ticket, shard, score.
#[derive(Clone)]
struct Person {
    ticket: Ticket,
    member: String,
    shard: usize,
    score: f64,
}

struct Bench {
    queue: Arc<Queue>,
    replica_queue: Option<Queue>,
    nodes: Vec<Node>,
}

#[derive(Clone)]
struct Node {
    url: String,
    replica: bool,
}

/// Runs the whole measurement and prints the tables.
pub async fn run(args: OrderingBenchArgs) -> anyhow::Result<Report> {
    let mut redis_cfg = args.redis.clone();
    redis_cfg.key_prefix = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    redis_cfg.response_timeout_ms = redis_cfg.response_timeout_ms.max(5000);
    let store = Store::connect(&redis_cfg).await?;
    let conn = store.conn();
    let keys = store.keys().clone();
    let signer = Signer::new(&uuid::Uuid::new_v4().to_string());
    let queue = Arc::new(Queue::new(store.clone(), signer.clone()));
    let replica_queue = if conn.is_cluster() {
        let mut rc = redis_cfg.clone();
        rc.read_from_replicas = true;
        let reads = connect_reads(&rc, &conn).await?;
        Some(Queue::new(
            Arc::new(Store::new(conn.clone(), reads, keys.clone())),
            signer,
        ))
    } else {
        None
    };
    let nodes = nodes(&conn, &redis_cfg).await?;
    let bench = Bench {
        queue,
        replica_queue,
        nodes,
    };

    if args.surge {
        let mut surge = Vec::new();
        for strategy in [
            StrategyKind::Timestamp,
            StrategyKind::GlobalCounter,
            StrategyKind::Statistical,
            StrategyKind::Hybrid,
        ] {
            let row = bench.measure_surge(strategy, &args).await?;
            eprintln!("surge under {strategy}: {row:?}");
            surge.push(row);
        }
        let report = Report {
            errors: Vec::new(),
            enters: Vec::new(),
            replica: None,
            admission: Vec::new(),
            surge,
        };
        print_report(&report);
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(&report)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(report);
    }
    let mut errors = Vec::new();
    let error_shards: &[u32] = if args.admission_only {
        &[]
    } else {
        &args.shards
    };
    for &n in error_shards {
        for &w in &args.sizes {
            for arrivals in [Arrivals::Uniform, Arrivals::Bursty, Arrivals::Numbered] {
                let started = Instant::now();
                let rows = bench.measure_line(w, n, arrivals, &args).await?;
                eprintln!(
                    "measured {w} waiting, {n} shards, {} arrivals in {:.1?}",
                    arrivals.name(),
                    started.elapsed()
                );
                errors.extend(rows);
            }
        }
    }
    let mut enters = Vec::new();
    let enter_shards = args
        .shards
        .get(1)
        .or(args.shards.first())
        .copied()
        .unwrap_or(16);
    for strategy in [StrategyKind::Timestamp, StrategyKind::GlobalCounter] {
        if args.admission_only {
            break;
        }
        enters.push(
            bench
                .measure_enters(strategy, enter_shards, args.enters)
                .await?,
        );
    }
    let replica = match &bench.replica_queue {
        Some(_) if !args.admission_only => Some(
            bench
                .measure_replicas(args.sizes[0].min(100_000), enter_shards, &args)
                .await?,
        ),
        _ => None,
    };
    let mut admission = Vec::new();
    if args.admit > 0 {
        for &n in &args.shards {
            for &w in &args.sizes {
                admission.extend(bench.measure_admission(w, n, args.admit).await?);
            }
        }
    }
    let report = Report {
        errors,
        enters,
        replica,
        admission,
        surge: Vec::new(),
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

impl Bench {
    /// The surge for one strategy: a fresh open event with a live admission leader (admitting
    /// nobody, publishing the line's figures as in production), `surge_people` entering in
    /// ordered batches, every one polled at once, then again 3 s later with `last=`.
    async fn measure_surge(
        &self,
        strategy: StrategyKind,
        args: &OrderingBenchArgs,
    ) -> anyhow::Result<SurgeRow> {
        let (id, _) = self.new_event(args.surge_shards, strategy).await?;
        let patch = EventPatch {
            state: Some(EventState::Open),
            hybrid_min_waiting: Some(2_000),
            hybrid_max_error: Some(0.05),
            ..Default::default()
        };
        let (cfg, _) = self.queue.put_event(&id, &patch).await?;
        let stop = tokio_util::sync::CancellationToken::new();
        let leader = tokio::spawn(waitroom::queue::admission::run(
            self.queue.clone(),
            None,
            waitroom::config::AdmissionConfig {
                tick_ms: 100,
                lease_ms: 3000,
                no_admission: false,
            },
            "surge-bench".into(),
            stop.clone(),
        ));
        // Let the leader take the lease and publish the empty line first.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let started = Instant::now();
        let mut tickets: Vec<Ticket> = Vec::with_capacity(args.surge_people);
        for batch in 0..args.surge_people.div_ceil(args.surge_batch) {
            let users: Vec<UserId> = (0..args.surge_batch)
                .map(|i| UserId::parse(&format!("s{batch}-{i}")))
                .collect::<Result<_, _>>()?;
            let entered: Vec<Ticket> = stream::iter(users)
                .map(|u| {
                    let (q, id) = (self.queue.clone(), id.clone());
                    async move {
                        let s = q.enter(&id, &u).await?;
                        anyhow::Ok(Ticket::parse(&s.ticket)?)
                    }
                })
                .buffer_unordered(args.surge_batch)
                .try_collect()
                .await?;
            tickets.extend(entered);
        }
        let enter_seconds = started.elapsed().as_secs_f64();
        let first = self.poll_all(&id, &tickets, None).await?;
        let exact = self.exact_in_redis(&cfg).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let last: HashMap<String, u64> = first.iter().map(|(t, (p, _))| (t.clone(), *p)).collect();
        let second = self.poll_all(&id, &tickets, Some(&last)).await?;
        stop.cancel();
        let _ = leader.await;

        let mut signed: Vec<f64> = first
            .iter()
            .filter_map(|(t, (shown, _))| {
                let truth = *exact.get(t)? as f64;
                Some((*shown as f64 - truth) / truth)
            })
            .collect();
        signed.sort_by(f64::total_cmp);
        let mut by: HashMap<String, usize> = HashMap::new();
        for (_, kind) in first.values() {
            *by.entry(kind.clone()).or_default() += 1;
        }
        let moves: Vec<f64> = first
            .iter()
            .filter_map(|(t, (p1, _))| {
                let (p2, _) = second.get(t)?;
                Some((*p2 as f64 - *p1 as f64) / *p1 as f64)
            })
            .filter(|m| *m > 0.0)
            .collect();
        self.drop_event(&id, &cfg).await?;
        Ok(SurgeRow {
            strategy: strategy.to_string(),
            shown_by: by
                .into_iter()
                .max_by_key(|(_, n)| *n)
                .map(|(k, _)| k)
                .unwrap_or_default(),
            people: tickets.len(),
            shards: cfg.shards,
            median_signed_error: signed.get(signed.len() / 2).copied().unwrap_or(0.0),
            worst_signed_error: signed
                .iter()
                .copied()
                .max_by(|a, b| a.abs().total_cmp(&b.abs()))
                .unwrap_or(0.0),
            p99_relative_error: {
                let mut abs: Vec<f64> = signed.iter().map(|e| e.abs()).collect();
                abs.sort_by(f64::total_cmp);
                abs.get((abs.len() * 99 / 100).min(abs.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or(0.0)
            },
            largest_move_back: moves.iter().copied().fold(0.0, f64::max),
            moved_back: moves.len(),
            enter_seconds,
        })
    }

    /// Polls every ticket (100 at a time), as `GET …/queue/{ticket}[?last=]` would: the shown
    /// position and the strategy that computed it, by ticket.
    async fn poll_all(
        &self,
        id: &EventId,
        tickets: &[Ticket],
        last: Option<&HashMap<String, u64>>,
    ) -> anyhow::Result<HashMap<String, (u64, String)>> {
        stream::iter(tickets.iter().copied())
            .map(|t| {
                let (q, id) = (self.queue.clone(), id.clone());
                let before = last.and_then(|l| l.get(&t.to_string()).copied());
                async move {
                    let s = q.poll_since(&id, &t, before).await?;
                    let shown = s.position.context("a surge poll found nobody waiting")?;
                    let by = s.strategy.map(|k| k.to_string()).unwrap_or_default();
                    anyhow::Ok((t.to_string(), (shown, by)))
                }
            })
            .buffer_unordered(100)
            .try_collect()
            .await
    }

    /// Every waiting ticket's exact 1-based position, read from the shards.
    async fn exact_in_redis(&self, cfg: &EventConfig) -> anyhow::Result<HashMap<String, u64>> {
        let mut keyed: Vec<OrderKey> = Vec::new();
        for shard in 0..cfg.shards as usize {
            let members: Vec<(String, f64)> = self
                .queue
                .store()
                .conn()
                .zrange_withscores(self.queue.shard_keys(cfg, shard).waiting, 0, -1)
                .await?;
            keyed.extend(members.into_iter().map(|(m, score)| OrderKey {
                score,
                shard,
                member: m,
            }));
        }
        keyed.sort();
        Ok(keyed
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                let ticket = Ticket::parse(&k.member)
                    .map(|t| t.to_string())
                    .unwrap_or(k.member);
                (ticket, i as u64 + 1)
            })
            .collect())
    }

    async fn new_event(
        &self,
        shards: u32,
        strategy: StrategyKind,
    ) -> anyhow::Result<(EventId, EventConfig)> {
        self.new_event_of(shards, strategy, LineForm::SortedSets)
            .await
    }

    /// A paused event, admission held back and room for everyone, its line kept as `form`.
    async fn new_event_of(
        &self,
        shards: u32,
        strategy: StrategyKind,
        form: LineForm,
    ) -> anyhow::Result<(EventId, EventConfig)> {
        let id = EventId::parse(&format!(
            "b{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ))?;
        let patch = EventPatch {
            shards: Some(shards),
            admit_per_second: Some(0.0),
            active_capacity: Some(10_000_000),
            strategy: Some(strategy),
            state: Some(EventState::Paused),
            line_form: Some(form),
            ..Default::default()
        };
        let (cfg, _) = self.queue.put_event(&id, &patch).await?;
        Ok((id, cfg))
    }

    /// Switches the event's strategy and drops the cached configuration, so the next read sees it.
    async fn set_strategy(
        &self,
        id: &EventId,
        strategy: StrategyKind,
    ) -> anyhow::Result<EventConfig> {
        let patch = EventPatch {
            strategy: Some(strategy),
            ..Default::default()
        };
        let (cfg, _) = self.queue.put_event(id, &patch).await?;
        forget_cached().await;
        Ok(cfg)
    }

    /// Fills one line, measures the strategies that apply, lets a share leave, measures again.
    async fn measure_line(
        &self,
        w: usize,
        n: u32,
        arrivals: Arrivals,
        args: &OrderingBenchArgs,
    ) -> anyhow::Result<Vec<ErrorRow>> {
        let first = if arrivals == Arrivals::Numbered {
            StrategyKind::GlobalCounter
        } else {
            StrategyKind::Timestamp
        };
        let (id, cfg) = self.new_event(n, first).await?;
        let mut people = generate(w, &cfg, arrivals);
        self.fill(&cfg, &people).await?;
        let strategies: &[StrategyKind] = if arrivals == Arrivals::Numbered {
            &[StrategyKind::GlobalCounter]
        } else {
            &[StrategyKind::Timestamp, StrategyKind::Statistical]
        };
        let mut rows = Vec::new();
        for (pass, left_share) in [0.0, args.leave_share].into_iter().enumerate() {
            if pass == 1 {
                self.leave_silently(&cfg, &mut people, left_share).await?;
            }
            self.publish(&id, &cfg, &people).await?;
            let exact = exact_positions(&people);
            for &strategy in strategies {
                if strategy != self.queue.event_config(&id).await?.strategy {
                    self.set_strategy(&id, strategy).await?;
                }
                forget_cached().await;
                rows.push(
                    self.sample(
                        &self.queue,
                        &id,
                        &people,
                        &exact,
                        strategy,
                        arrivals,
                        left_share,
                        args.samples,
                    )
                    .await?,
                );
            }
        }
        self.drop_event(&id, &cfg).await?;
        Ok(rows)
    }

    async fn fill(&self, cfg: &EventConfig, people: &[Person]) -> anyhow::Result<()> {
        let mut by_shard: Vec<Vec<(f64, String)>> = vec![Vec::new(); cfg.shards as usize];
        for p in people {
            by_shard[p.shard].push((p.score, p.member.clone()));
        }
        let batches: Vec<(String, Vec<(f64, String)>)> = by_shard
            .into_iter()
            .enumerate()
            .flat_map(|(i, items)| {
                let key = self.queue.shard_keys(cfg, i).waiting;
                items
                    .chunks(2000)
                    .map(|c| (key.clone(), c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        stream::iter(batches)
            .map(|(key, items)| {
                let mut conn = self.queue.store().conn();
                async move { conn.zadd_multiple::<_, _, _, i64>(key, &items).await }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    /// Removes a random share of the line, as people who close the tab without leaving.
    async fn leave_silently(
        &self,
        cfg: &EventConfig,
        people: &mut Vec<Person>,
        share: f64,
    ) -> anyhow::Result<()> {
        let mut rng = rand::rng();
        people.shuffle(&mut rng);
        let gone = ((people.len() as f64) * share).round() as usize;
        let leavers: Vec<Person> = people.drain(..gone).collect();
        for p in &leavers {
            let _: i64 = self
                .queue
                .store()
                .conn()
                .zrem(self.queue.shard_keys(cfg, p.shard).waiting, &p.member)
                .await?;
        }
        Ok(())
    }

    /// Publishes what the admission leader would: the line's total, and the counter figures.
    async fn publish(
        &self,
        id: &EventId,
        cfg: &EventConfig,
        people: &[Person],
    ) -> anyhow::Result<()> {
        let key = self.queue.store().keys().event_stats(id.as_str());
        let mut pipe = redis::pipe();
        pipe.hset(&key, stats::WAITING, people.len());
        if cfg.counter_start > 0 {
            let first = people.iter().map(|p| p.score as u64).min().unwrap_or(0);
            pipe.hset(&key, stats::GC_START, cfg.counter_start)
                .hset(&key, stats::GC_CARRIED, 0)
                .hset(&key, stats::GC_FIRST, first);
        }
        let () = pipe.query_async(&mut self.queue.store().conn()).await?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn sample(
        &self,
        queue: &Queue,
        id: &EventId,
        people: &[Person],
        exact: &HashMap<String, u64>,
        strategy: StrategyKind,
        arrivals: Arrivals,
        left_share: f64,
        samples: usize,
    ) -> anyhow::Result<ErrorRow> {
        let picks: Vec<&Person> = people.choose_multiple(&mut rand::rng(), samples).collect();
        let before = self.command_calls().await?;
        let shown: Vec<(u64, u64)> = stream::iter(picks)
            .map(|p| async move {
                let status = queue.poll(id, &p.ticket).await?;
                anyhow::ensure!(
                    status.strategy == Some(strategy),
                    "poll used {:?}, not {strategy}",
                    status.strategy
                );
                let pos = status.position.context("a waiting person has a position")?;
                anyhow::Ok((pos, exact[&p.member]))
            })
            .buffer_unordered(32)
            .try_collect()
            .await?;
        let after = self.command_calls().await?;
        // Every ZRANK is a shard's read. The only script that runs while these polls are
        // answered is `seen.lua`, a poll's first record inside the horizon: a write, not a read
        // for the position, left out as the service's commands-per-poll metric leaves it out.
        let commands: u64 = after
            .iter()
            .zip(&before)
            .map(|(a, b)| (a.total + a.zrank - a.evalsha) - (b.total + b.zrank - b.evalsha))
            .sum();
        let mut errors: Vec<u64> = shown.iter().map(|(s, e)| s.abs_diff(*e)).collect();
        let mut relative: Vec<f64> = shown
            .iter()
            .map(|(s, e)| s.abs_diff(*e) as f64 / *e as f64)
            .collect();
        errors.sort_unstable();
        relative.sort_by(f64::total_cmp);
        Ok(ErrorRow {
            waiting: people.len(),
            shards: self.queue.event_config(id).await?.shards,
            arrivals: arrivals.name(),
            left_share,
            strategy: strategy.to_string(),
            samples: shown.len(),
            median_error: percentile(&errors, 0.5),
            p99_error: percentile(&errors, 0.99),
            max_error: errors.last().copied().unwrap_or(0),
            p99_relative_error: relative
                .get(
                    ((relative.len() as f64 * 0.99) as usize).min(relative.len().saturating_sub(1)),
                )
                .copied()
                .unwrap_or(0.0),
            commands_per_poll: commands as f64 / shown.len().max(1) as f64,
        })
    }

    /// Enters `count` people through the service's enter path; counts commands per primary.
    async fn measure_enters(
        &self,
        strategy: StrategyKind,
        shards: u32,
        count: usize,
    ) -> anyhow::Result<EnterRow> {
        let (id, cfg) = self.new_event(shards, strategy).await?;
        self.queue
            .put_event(
                &id,
                &EventPatch {
                    state: Some(EventState::Open),
                    ..Default::default()
                },
            )
            .await?;
        if strategy == StrategyKind::GlobalCounter {
            // What the admission leader publishes for an empty counted line: nobody carried, the
            // first number to be handed out is the first waiting. (No scheduler runs here: its
            // own commands would blur the count.)
            let key = self.queue.store().keys().event_stats(id.as_str());
            let () = redis::pipe()
                .hset(&key, stats::GC_START, cfg.counter_start)
                .hset(&key, stats::GC_CARRIED, 0)
                .hset(&key, stats::GC_FIRST, cfg.counter_start)
                .query_async(&mut self.queue.store().conn())
                .await?;
        }
        forget_cached().await;
        let before = self.command_calls().await?;
        stream::iter(0..count)
            .map(|i| {
                let (q, id) = (&self.queue, &id);
                async move {
                    q.enter(id, &UserId::parse(&format!("u{i}"))?)
                        .await
                        .map_err(anyhow::Error::from)
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await?;
        let after = self.command_calls().await?;
        let per_primary: Vec<u64> = after
            .iter()
            .zip(&before)
            .zip(&self.nodes)
            .filter(|(_, n)| !n.replica)
            .map(|((a, b), _)| (a.total + a.zrank) - (b.total + b.zrank))
            .collect();
        // Each new arrival ran `enter.lua` once, whose own ZRANK is not a round trip.
        let total: u64 = per_primary.iter().sum::<u64>().saturating_sub(count as u64);
        self.drop_event(&id, &cfg).await?;
        Ok(EnterRow {
            strategy: strategy.to_string(),
            shards,
            commands_per_enter: total as f64 / count as f64,
            busiest_primary_share: per_primary.iter().copied().max().unwrap_or(0) as f64
                / total.max(1) as f64,
        })
    }

    /// Polls with reads sent to replicas; measures who served them, and replica staleness.
    async fn measure_replicas(
        &self,
        w: usize,
        n: u32,
        args: &OrderingBenchArgs,
    ) -> anyhow::Result<ReplicaRow> {
        let rq = self
            .replica_queue
            .as_ref()
            .context("replica reads need a cluster")?;
        let (id, cfg) = self.new_event(n, StrategyKind::Timestamp).await?;
        let people = generate(w, &cfg, Arrivals::Uniform);
        self.fill(&cfg, &people).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let exact = exact_positions(&people);
        let before = self.command_calls().await?;
        self.sample(
            rq,
            &id,
            &people,
            &exact,
            StrategyKind::Timestamp,
            Arrivals::Uniform,
            0.0,
            args.samples,
        )
        .await?;
        let after = self.command_calls().await?;
        let delta = |replica: bool, f: fn(&Calls) -> u64| -> u64 {
            after
                .iter()
                .zip(&before)
                .zip(&self.nodes)
                .filter(|(_, n)| n.replica == replica)
                .map(|((a, b), _)| f(a) - f(b))
                .sum()
        };
        let counts_on_replicas = delta(true, |c| c.zcount);
        let counts_on_primaries = delta(false, |c| c.zcount);
        let poll_on_primaries = delta(false, |c| c.total);
        let poll_on_replicas = delta(true, |c| c.total);
        self.drop_event(&id, &cfg).await?;

        // Staleness: write on the primary, read through the replica connection until it shows.
        let mut lags = Vec::new();
        let key = format!(
            "{}:staleness",
            self.queue.store().keys().event_stats("bench")
        );
        for i in 0..300u64 {
            let () = self.queue.store().conn().set(&key, i).await?;
            let t = Instant::now();
            loop {
                let seen: Option<u64> = rq.store().reads().get(&key).await?;
                if seen == Some(i) {
                    break;
                }
                anyhow::ensure!(
                    t.elapsed() < Duration::from_secs(5),
                    "replica never caught up"
                );
            }
            lags.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let _: i64 = self.queue.store().conn().del(&key).await?;
        lags.sort_by(f64::total_cmp);
        Ok(ReplicaRow {
            waiting: w,
            shards: n,
            replica_share_of_counts: counts_on_replicas as f64
                / (counts_on_replicas + counts_on_primaries).max(1) as f64,
            primary_share_of_poll_commands: poll_on_primaries as f64
                / (poll_on_primaries + poll_on_replicas).max(1) as f64,
            staleness_median_ms: lags[lags.len() / 2],
            staleness_p99_ms: lags[(lags.len() * 99) / 100],
        })
    }

    /// Fills a line of `w` and lets `count` in with one admission tick per strategy, each timed
    /// by the servers' SLOWLOG.
    async fn measure_admission(
        &self,
        w: usize,
        n: u32,
        count: usize,
    ) -> anyhow::Result<Vec<AdmitRow>> {
        let (id, cfg) = self.new_event(n, StrategyKind::Timestamp).await?;
        let people = generate(w, &cfg, Arrivals::Uniform);
        self.fill(&cfg, &people).await?;
        let mut rows = Vec::new();
        let mut waiting = w;
        for strategy in [
            StrategyKind::Timestamp,
            StrategyKind::GlobalCounter,
            StrategyKind::Statistical,
        ] {
            let cfg = self.set_strategy(&id, strategy).await?;
            let row = self
                .measure_tick(&id, &cfg, count, waiting, strategy.to_string())
                .await?;
            waiting -= row.admitted;
            rows.push(row);
        }
        self.drop_event(&id, &cfg).await?;
        rows.push(self.measure_numbered_admission(w, n, count).await?);
        eprintln!("measured admission from {w} waiting over {n} shards");
        Ok(rows)
    }

    /// The same tick on a numbered line (docs/numbered-line.md) of `w` people: numbers 1..=w
    /// handed out, the first `2 × count` with a last-seen record of just now (as a live line's
    /// front has), the boundary at 1. A tick reads no index, so none is written here.
    async fn measure_numbered_admission(
        &self,
        w: usize,
        n: u32,
        count: usize,
    ) -> anyhow::Result<AdmitRow> {
        let (id, cfg) = self
            .new_event_of(n, StrategyKind::GlobalCounter, LineForm::Numbered)
            .await?;
        let keys = self.queue.store().keys().numbered(id.as_str());
        let mut conn = self.queue.store().conn();
        let () = conn.set(&keys.seq, w).await?;
        // Records as lua/numbered_lib.lua writes them: polled, in this period.
        let span = waitroom::queue::seen_refresh_ms(&cfg).max(1);
        let v = 32_768 + (waitroom::queue::now_ms() / span) % 32_767 + 1;
        let front = (count * 2).min(w);
        let cells: Vec<u8> = (0..front)
            .flat_map(|_| [(v >> 8) as u8, (v & 0xff) as u8])
            .collect();
        let _: i64 = redis::cmd("SETRANGE")
            .arg(&keys.seen)
            .arg(2)
            .arg(cells)
            .query_async(&mut conn)
            .await?;
        let row = self
            .measure_tick(&id, &cfg, count, w, "global_counter, numbered line".into())
            .await?;
        for key in keys.all() {
            let _: i64 = redis::cmd("UNLINK").arg(key).query_async(&mut conn).await?;
        }
        self.drop_event(&id, &cfg).await?;
        Ok(row)
    }

    /// One admission tick of `count` with the scheduler's own code: its wall time, the scripts'
    /// time (`cmdstat_evalsha`) and the slowest command in the SLOWLOG.
    async fn measure_tick(
        &self,
        id: &EventId,
        cfg: &EventConfig,
        count: usize,
        waiting: usize,
        label: String,
    ) -> anyhow::Result<AdmitRow> {
        let primaries: Vec<&Node> = self.nodes.iter().filter(|n| !n.replica).collect();
        let mut saved = Vec::new();
        for node in &primaries {
            let mut c = node_conn(node).await?;
            let (_, threshold): (String, String) = redis::cmd("CONFIG")
                .arg("GET")
                .arg("slowlog-log-slower-than")
                .query_async(&mut c)
                .await?;
            saved.push(threshold);
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-log-slower-than")
                .arg(SLOWLOG_US)
                .query_async(&mut c)
                .await?;
            let () = redis::cmd("SLOWLOG")
                .arg("RESET")
                .query_async(&mut c)
                .await?;
        }
        let scripts_before = self.command_calls().await?;
        let started = Instant::now();
        let admitted =
            waitroom::queue::admission::admit_once(self.queue.clone(), id, cfg, count).await?;
        let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
        let names: HashMap<String, &str> = [
            (
                self.queue.store().scripts().shard_heads.get_hash(),
                "shard_heads.lua",
            ),
            (self.queue.store().scripts().admit.get_hash(), "admit.lua"),
            (
                self.queue.store().scripts().nl_tick.get_hash(),
                "nl_tick.lua",
            ),
        ]
        .into_iter()
        .map(|(h, n)| (h.to_owned(), n))
        .collect();
        let mut row = AdmitRow {
            waiting,
            shards: cfg.shards,
            strategy: label,
            admitted,
            wall_ms,
            scripts_ms: 0.0,
            scripts: 0,
            slowest_ms: 0.0,
            slowest: format!("none over {SLOWLOG_US} µs"),
            logged: Default::default(),
        };
        let scripts_after = self.command_calls().await?;
        for (node, threshold) in primaries.iter().zip(saved) {
            let mut c = node_conn(node).await?;
            let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
                .arg("GET")
                .arg(-1)
                .query_async(&mut c)
                .await?;
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-log-slower-than")
                .arg(threshold)
                .query_async(&mut c)
                .await?;
            for (micros, argv) in log.iter().filter_map(slowlog_entry) {
                let command = argv.first().map(|c| c.to_ascii_lowercase());
                let name = match command.as_deref() {
                    // This measurement's own and the client's housekeeping.
                    Some(
                        "config" | "slowlog" | "cluster" | "info" | "ping" | "client" | "hello"
                        | "readonly",
                    )
                    | None => continue,
                    Some("evalsha") => argv
                        .get(1)
                        .and_then(|h| names.get(h).copied())
                        .unwrap_or("evalsha (other script)")
                        .to_owned(),
                    Some(other) => other.to_owned(),
                };
                let ms = micros as f64 / 1000.0;
                let entry = row.logged.entry(name.clone()).or_default();
                entry.0 += 1;
                entry.1 += ms;
                if ms > row.slowest_ms {
                    row.slowest_ms = ms;
                    row.slowest = name;
                }
            }
        }
        // Replicas run no EVALSHA (Redis 7 replicates a script's effects), so every node's
        // count can be summed.
        let delta = |f: fn(&Calls) -> u64| -> u64 {
            let sum = |calls: &[Calls]| calls.iter().map(f).sum::<u64>();
            sum(&scripts_after).saturating_sub(sum(&scripts_before))
        };
        row.scripts = delta(|c| c.evalsha) as usize;
        row.scripts_ms = delta(|c| c.evalsha_usec) as f64 / 1000.0;
        Ok(row)
    }

    async fn drop_event(&self, id: &EventId, cfg: &EventConfig) -> anyhow::Result<()> {
        let mut conn = self.queue.store().conn();
        for i in 0..cfg.shards as usize {
            let k = self.queue.shard_keys(cfg, i);
            for key in [k.waiting, k.active, k.admitted, k.seen] {
                let _: i64 = redis::cmd("UNLINK")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await?;
            }
        }
        let k = self.queue.store().keys();
        for key in [
            k.event_config(id.as_str()),
            k.event_stats(id.as_str()),
            k.counter(id.as_str()),
            k.counter_gaps(id.as_str()),
            k.lease(id.as_str()),
        ] {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&key)
                .query_async(&mut conn)
                .await?;
        }
        let _: i64 = conn.srem(k.registry(), id.as_str()).await?;
        Ok(())
    }

    /// Per node: client commands processed (scripts count once; replication traffic excluded),
    /// ZCOUNT calls, and scripts run with their time.
    async fn command_calls(&self) -> anyhow::Result<Vec<Calls>> {
        let mut out = Vec::new();
        for node in &self.nodes {
            let client = redis::Client::open(node.url.as_str())?;
            let mut c = client.get_multiplexed_async_connection().await?;
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut c)
                .await?;
            out.push(parse_calls(&info));
        }
        Ok(out)
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Calls {
    total: u64,
    zrank: u64,
    zcount: u64,
    evalsha: u64,
    evalsha_usec: u64,
}

/// The commands a poll or an enter sends as round trips: EVALSHA and the plain reads the service
/// issues outside scripts. Commands run inside scripts are counted by Redis under their own
/// names (the counter's INCR, the enter script's ZSCORE/ZRANK/ZCARD/ZADD), and replicas apply
/// replicated writes as ZADD/ZREM: none of those are in this list, so each round trip counts once.
/// The shard's read of a poll is a pipeline of plain reads (`Queue::read_shard`) with one `ZRANK`:
/// [`Calls::zrank`] counts it, less the one `ZRANK` inside each `enter.lua` on the enter path.
const CLIENT_COMMANDS: [&str; 4] = ["evalsha", "zcount", "hmget", "get"];

fn parse_calls(info: &str) -> Calls {
    let mut calls = Calls::default();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| -> u64 {
            rest.split(',')
                .find_map(|f| f.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let n = field("calls=");
        if CLIENT_COMMANDS.contains(&name) {
            calls.total += n;
        }
        match name {
            "zcount" => calls.zcount += n,
            "zrank" => calls.zrank += n,
            "evalsha" => {
                calls.evalsha += n;
                calls.evalsha_usec += field("usec=");
            }
            _ => {}
        }
    }
    calls
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// `w` people with random tickets. Uniform: one arrival every 100 µs. Bursty: arrival times
/// bunched at the opening (time ∝ u³), so many share a microsecond. Numbered: counter numbers.
fn generate(w: usize, cfg: &EventConfig, arrivals: Arrivals) -> Vec<Person> {
    let t0 = waitroom::queue::now_us() as f64;
    let span = w as f64 * 100.0;
    (0..w)
        .map(|i| {
            let ticket = Ticket::from_uuid(uuid::Uuid::new_v4());
            let u = i as f64 / w as f64;
            let score = match arrivals {
                Arrivals::Uniform => t0 + i as f64 * 100.0,
                Arrivals::Bursty => t0 + (u * u * u * span).floor(),
                Arrivals::Numbered => (cfg.counter_start + i as u64) as f64,
            };
            Person {
                member: cfg.member(&ticket),
                shard: Queue::shard_of(cfg, &ticket),
                ticket,
                score,
            }
        })
        .collect()
}

/// Exact 1-based positions in the global order (score, shard, member).
fn exact_positions(people: &[Person]) -> HashMap<String, u64> {
    let mut keys: Vec<OrderKey> = people
        .iter()
        .map(|p| OrderKey {
            score: p.score,
            shard: p.shard,
            member: p.member.clone(),
        })
        .collect();
    keys.sort();
    keys.into_iter()
        .enumerate()
        .map(|(i, k)| (k.member, i as u64 + 1))
        .collect()
}

async fn node_conn(node: &Node) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(node.url.as_str())?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// A SLOWLOG entry's duration (µs) and command line. Commands a script ran are logged too, with
/// the client address `?:0`: they are part of their script's time, so they are left out here.
fn slowlog_entry(entry: &redis::Value) -> Option<(u64, Vec<String>)> {
    let redis::Value::Array(fields) = entry else {
        return None;
    };
    let micros = match fields.get(2)? {
        redis::Value::Int(n) => u64::try_from(*n).ok()?,
        _ => return None,
    };
    let redis::Value::Array(args) = fields.get(3)? else {
        return None;
    };
    if matches!(fields.get(4), Some(redis::Value::BulkString(a)) if a.as_slice() == b"?:0") {
        return None;
    }
    let argv = args
        .iter()
        .map(|a| match a {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            redis::Value::SimpleString(s) => s.clone(),
            _ => String::new(),
        })
        .collect();
    Some((micros, argv))
}

async fn nodes(conn: &RedisConn, cfg: &RedisConfig) -> anyhow::Result<Vec<Node>> {
    if !conn.is_cluster() {
        return Ok(vec![Node {
            url: cfg.nodes[0].clone(),
            replica: false,
        }]);
    }
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn.clone())
        .await?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for line in nodes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 3 || f[2].contains("fail") {
            continue;
        }
        let addr = f[1].split('@').next().unwrap_or_default().to_owned();
        if seen.insert(addr.clone()) {
            out.push(Node {
                url: format!("redis://{addr}"),
                replica: f[2].contains("slave"),
            });
        }
    }
    Ok(out)
}

fn print_report(r: &Report) {
    if !r.surge.is_empty() {
        print_surge(r);
        return;
    }
    print_tables(r);
}

fn print_surge(r: &Report) {
    {
        println!("\nRight after a surge: first polls and a poll 3 s later (signed = shown − exact, relative)\n");
        println!("| strategy | shown by | people | shards | median signed error | p99 |error| | worst | largest move back | moved back | enter time |");
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for s in &r.surge {
            println!(
                "| {} | {} | {} | {} | {:+.2} % | {:.2} % | {:+.2} % | {:.2} % | {} | {:.1} s |",
                s.strategy,
                s.shown_by,
                s.people,
                s.shards,
                s.median_signed_error * 100.0,
                s.p99_relative_error * 100.0,
                s.worst_signed_error * 100.0,
                s.largest_move_back * 100.0,
                s.moved_back,
                s.enter_seconds
            );
        }
    }
}

fn print_tables(r: &Report) {
    println!("\nPosition error (|shown - exact|, in places)\n");
    println!("| waiting | shards | arrivals | left | strategy | median | p99 | max | p99 relative | commands/poll |");
    println!("|---:|---:|---|---:|---|---:|---:|---:|---:|---:|");
    for e in &r.errors {
        println!(
            "| {} | {} | {} | {:.0} % | {} | {} | {} | {} | {:.3} % | {:.2} |",
            e.waiting,
            e.shards,
            e.arrivals,
            e.left_share * 100.0,
            e.strategy,
            e.median_error,
            e.p99_error,
            e.max_error,
            e.p99_relative_error * 100.0,
            e.commands_per_poll
        );
    }
    println!("\nEnter cost\n");
    println!("| strategy | shards | commands/enter | busiest primary's share |");
    println!("|---|---:|---:|---:|");
    for e in &r.enters {
        println!(
            "| {} | {} | {:.2} | {:.0} % |",
            e.strategy,
            e.shards,
            e.commands_per_enter,
            e.busiest_primary_share * 100.0
        );
    }
    if !r.admission.is_empty() {
        println!("\nOne admission tick, timed by Redis (commandstats, SLOWLOG)\n");
        println!("| waiting | shards | strategy | admitted | Redis ms (scripts) | scripts | slowest command | wall ms |");
        println!("|---:|---:|---|---:|---:|---:|---|---:|");
        for a in &r.admission {
            println!(
                "| {} | {} | {} | {} | {:.2} | {} | {} {:.2} ms | {:.1} |",
                a.waiting,
                a.shards,
                a.strategy,
                a.admitted,
                a.scripts_ms,
                a.scripts,
                a.slowest,
                a.slowest_ms,
                a.wall_ms
            );
        }
    }
    if let Some(x) = &r.replica {
        println!(
            "\nReplica reads ({} waiting, {} shards, timestamp)\n",
            x.waiting, x.shards
        );
        println!("| ZCOUNTs served by replicas | poll commands still on primaries | staleness median | staleness p99 |");
        println!("|---:|---:|---:|---:|");
        println!(
            "| {:.0} % | {:.0} % | {:.2} ms | {:.2} ms |",
            x.replica_share_of_counts * 100.0,
            x.primary_share_of_poll_commands * 100.0,
            x.staleness_median_ms,
            x.staleness_p99_ms
        );
    }
}

/// Waits until every event configuration this process cached has expired, so the next read
/// sees what was just written to Redis behind the cache's back.
async fn forget_cached() {
    tokio::time::sleep(waitroom::queue::event::CACHE_TTL + Duration::from_millis(20)).await;
}
