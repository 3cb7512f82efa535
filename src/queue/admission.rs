//! The admission scheduler: moves people from the front of each line into its active set.
//!
//! Every instance runs a supervisor that walks the event registry and keeps one task per event.
//! A task admits only while it holds the event's lease (`<p>:{event}:lease`, renewed every
//! tick, lost `lease_ms` after its holder stops renewing) — so exactly one instance admits for
//! an event at a time, and another takes over within `lease_ms` when the holder dies.
//!
//! One tick of the leader, for one event:
//! 1. per shard, concurrently: end lapsed sessions, read active/waiting counts and the first
//!    `budget` heads (`lua/shard_heads.lua`);
//! 2. pick the next `min(budget, capacity − active)` people by K-way merge of the heads
//!    (`waitroom_strategies::merge`);
//! 3. per shard, concurrently: move exactly those people (`lua/admit.lua`).
//!
//! Rate: a token bucket refilled at `admit_per_second`, holding at most one tick's worth plus
//! one, so the admitted total never runs ahead of `rate × elapsed + rate × tick + 1`.
//! A leader whose lease lapsed mid-tick (a pause longer than `lease_ms`) could overlap with its
//! successor for one tick; each admission is still atomic per person, so nobody is admitted
//! twice — only the capacity bound could be exceeded by one tick's admissions.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use redis::AsyncCommands as _;
use tokio_util::sync::CancellationToken;
use waitroom_strategies::merge::{group_by_shard, merge_heads, ShardHeads};

use super::event::{EventConfig, EventState};
use super::{now_ms, Queue, QueueError};
use crate::config::AdmissionConfig;
use crate::ids::EventId;
use crate::telemetry;

/// Runs admission for every registered event until `shutdown` is cancelled.
pub async fn run(
    queue: Arc<Queue>,
    cfg: AdmissionConfig,
    instance: String,
    shutdown: CancellationToken,
) {
    let mut tasks: HashMap<EventId, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        match queue.events.registered(&mut queue.conn.clone()).await {
            Ok(events) => {
                tasks.retain(|_, t| !t.is_finished());
                for event in events {
                    tasks.entry(event.clone()).or_insert_with(|| {
                        let task = EventAdmission::new(
                            queue.clone(),
                            cfg.clone(),
                            instance.clone(),
                            event,
                        );
                        tokio::spawn(task.run(shutdown.clone()))
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the event registry"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    for (_, t) in tasks {
        let _ = t.await;
    }
}

struct EventAdmission {
    queue: Arc<Queue>,
    cfg: AdmissionConfig,
    instance: String,
    event: EventId,
    tokens: f64,
    last_refill: Option<Instant>,
    recent: VecDeque<(Instant, u64)>,
    last_report: Instant,
}

/// Window over which the admission rate is measured for ETAs.
const RATE_WINDOW: Duration = Duration::from_secs(10);

impl EventAdmission {
    fn new(queue: Arc<Queue>, cfg: AdmissionConfig, instance: String, event: EventId) -> Self {
        EventAdmission {
            queue,
            cfg,
            instance,
            event,
            tokens: 0.0,
            last_refill: None,
            recent: VecDeque::new(),
            last_report: Instant::now(),
        }
    }

    async fn run(mut self, shutdown: CancellationToken) {
        let tick = Duration::from_millis(self.cfg.tick_ms.max(10));
        let mut leading = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(tick) => {}
            }
            let cfg = match self
                .queue
                .events
                .get(&mut self.queue.conn.clone(), &self.event)
                .await
            {
                Ok(ev) => ev.config.clone(),
                Err(QueueError::UnknownEvent) => break,
                Err(e) => {
                    tracing::warn!(event = %self.event, error = %e, "admission: cannot read the event");
                    continue;
                }
            };
            if cfg.state != EventState::Open {
                if leading {
                    self.release().await;
                    leading = false;
                }
                self.last_refill = None;
                continue;
            }
            match self.hold_lease().await {
                Ok(true) => {}
                Ok(false) => {
                    leading = false;
                    self.last_refill = None;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(event = %self.event, error = %e, "admission: lease check failed");
                    self.last_refill = None;
                    continue;
                }
            }
            if !leading {
                tracing::info!(event = %self.event, instance = %self.instance, "admission: took the lease");
                leading = true;
            }
            match self.tick(&cfg, tick).await {
                Ok(()) => {}
                Err(QueueError::WrongType) => {
                    if let Err(e) = self.queue.repair(&self.event, &cfg).await {
                        tracing::error!(event = %self.event, error = %e, "admission: repair failed");
                    }
                }
                Err(e) => {
                    metrics::counter!(telemetry::ADMISSION_ERRORS, "event" => self.event.to_string()).increment(1);
                    tracing::warn!(event = %self.event, error = %e, "admission tick failed");
                }
            }
        }
        if leading {
            self.release().await;
        }
    }

    async fn hold_lease(&self) -> Result<bool, QueueError> {
        let held: i64 = self
            .queue
            .scripts
            .lease
            .key(self.queue.keys.lease(self.event.as_str()))
            .arg(&self.instance)
            .arg(self.cfg.lease_ms)
            .invoke_async(&mut self.queue.conn.clone())
            .await?;
        Ok(held == 1)
    }

    async fn release(&self) {
        let released: Result<i64, _> = self
            .queue
            .scripts
            .release
            .key(self.queue.keys.lease(self.event.as_str()))
            .arg(&self.instance)
            .invoke_async(&mut self.queue.conn.clone())
            .await;
        if let Err(e) = released {
            tracing::warn!(event = %self.event, error = %e, "admission: could not release the lease");
        }
    }

    async fn tick(&mut self, cfg: &EventConfig, tick: Duration) -> Result<(), QueueError> {
        let now = Instant::now();
        let dt = self.last_refill.map(|t| now - t).unwrap_or(tick);
        self.last_refill = Some(now);
        let cap = cfg.admit_per_second * tick.as_secs_f64() + 1.0;
        self.tokens = (self.tokens + cfg.admit_per_second * dt.as_secs_f64()).min(cap);
        let budget = self.tokens.floor() as usize;

        let q = &self.queue;
        let now_ms = now_ms();
        let expire_before = now_ms.saturating_sub(cfg.active_ttl_seconds * 1000);
        let reads = (0..cfg.shards as usize).map(|i| {
            let mut conn = q.conn.clone();
            let k = q.keys.shard(&cfg.shard_tags[i]);
            async move {
                q.scripts
                    .shard_heads
                    .key(&k.waiting)
                    .key(&k.active)
                    .arg(expire_before)
                    .arg(budget)
                    .invoke_async::<(u64, u64, Vec<(String, f64)>)>(&mut conn)
                    .await
            }
        });
        let shards = try_join_all(reads).await?;
        let active: u64 = shards.iter().map(|s| s.0).sum();
        let waiting: u64 = shards.iter().map(|s| s.1).sum();
        let room = cfg.active_capacity.saturating_sub(active) as usize;
        let take = budget.min(room);

        let heads: Vec<ShardHeads> = shards
            .into_iter()
            .map(|(_, waiting, heads)| ShardHeads {
                complete: heads.len() as u64 >= waiting,
                heads: heads.into_iter().map(|(m, s)| (s, m)).collect(),
            })
            .collect();
        let picks = merge_heads(&heads, take);
        let moves = group_by_shard(&picks).into_iter().map(|p| {
            let mut conn = q.conn.clone();
            let k = q.keys.shard(&cfg.shard_tags[p.shard]);
            async move {
                q.scripts
                    .admit
                    .key(&k.waiting)
                    .key(&k.active)
                    .key(&k.admitted)
                    .arg(p.count)
                    .arg(p.last.0)
                    .arg(p.last.1)
                    .arg(now_ms)
                    .invoke_async::<Vec<String>>(&mut conn)
                    .await
            }
        });
        let admitted: usize = try_join_all(moves).await?.iter().map(Vec::len).sum();
        self.tokens -= admitted as f64;

        let ev = self.event.to_string();
        metrics::counter!(telemetry::ADMITTED_TOTAL, "event" => ev.clone())
            .increment(admitted as u64);
        metrics::gauge!(telemetry::QUEUE_WAITING, "event" => ev.clone())
            .set((waiting - admitted as u64) as f64);
        metrics::gauge!(telemetry::QUEUE_ACTIVE, "event" => ev)
            .set((active + admitted as u64) as f64);
        self.report(admitted as u64).await
    }

    /// Publishes the measured admission rate (for everyone's ETA) about once a second.
    async fn report(&mut self, admitted: u64) -> Result<(), QueueError> {
        let now = Instant::now();
        self.recent.push_back((now, admitted));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now - *t > RATE_WINDOW)
        {
            self.recent.pop_front();
        }
        if now - self.last_report < Duration::from_secs(1) {
            return Ok(());
        }
        self.last_report = now;
        let span = self
            .recent
            .front()
            .map(|(t, _)| (now - *t).as_secs_f64())
            .unwrap_or(0.0)
            .max(1.0);
        let rate = self.recent.iter().map(|(_, n)| *n).sum::<u64>() as f64 / span;
        let mut conn = self.queue.conn.clone();
        let () = conn
            .hset_multiple(
                self.queue.keys.event_stats(self.event.as_str()),
                &[
                    ("rate", rate.to_string()),
                    ("leader", self.instance.clone()),
                ],
            )
            .await?;
        Ok(())
    }
}
