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
//! Rate: ticks start every `tick_ms` (not `tick_ms` after the last one's work), and a token
//! bucket is refilled at `admit_per_second` for the time since the last refill, carrying at most
//! one tick's worth plus one over: the admitted total never runs ahead of
//! `rate × elapsed + rate × tick + 1`, and a slow tick does not throw away what it earned.
//!
//! Fencing: `lua/lease.lua` answers when the lease lapses by the lease node's clock, and every
//! `lua/admit.lua` of the tick carries that time minus [`fence_margin`]: a shard whose clock has
//! passed it admits nobody. So a leader paused past its lease (a GC-like stall, a failover that
//! held its requests) cannot admit beside its successor, as long as the nodes' clocks differ by
//! less than the margin. Each move also carries an operation id, so a client retry of a move
//! that went through changes nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{try_join_all, BoxFuture};
use redis::AsyncCommands as _;
use tokio_util::sync::CancellationToken;
use waitroom_strategies::hybrid::{HybridInputs, HybridPolicy};
use waitroom_strategies::merge::{group_by_shard, merge_heads, ShardHeads, ShardPick};
use waitroom_strategies::{global_counter, round_robin, statistical, timestamp, StrategyKind};

use super::event::{EventConfig, EventState, LineForm};
use super::{horizon, now_ms, seen_refresh_ms, Queue, QueueError};
use crate::config::AdmissionConfig;
use crate::ids::EventId;
use crate::redis::keys::stats;
use crate::redis::replies::{AdmitRefusal, Admitted, Granted, Lease, ShardRead};
use crate::redis::scripts::with_numbered_keys;

/// People one `lua/nl_tick.lua` call admits at most, so that no script holds the event's
/// primary for long: steps of 700 took 0.9–1.5 ms of Redis each on this project's machine, under
/// the 2 ms a script may hold it (docs/numbered-line.md, "Figures of the built line").
const NUMBERED_STEP: usize = 700;

/// `lua/nl_tick.lua`'s reply: admitted, abandoned, active after, waiting after, status, guard,
/// boundary after.
type NumberedTick = (u64, u64, u64, u64, i64, i64, u64);
use crate::telemetry;

/// What the admission leader does for the seats of its event, about once a second: lapse
/// expired holds and tell whether every show is sold out (then the line stops). The seats
/// module implements it; the scheduler knows nothing else of seats.
pub trait Housekeeping: Send + Sync {
    /// Lapses the event's expired holds; returns true when every show is sold out.
    fn sweep<'a>(&'a self, event: &'a EventId) -> BoxFuture<'a, anyhow::Result<bool>>;
}

/// Runs admission for every registered event until `shutdown` is cancelled.
pub async fn run(
    queue: Arc<Queue>,
    housekeeping: Option<Arc<dyn Housekeeping>>,
    cfg: AdmissionConfig,
    instance: String,
    shutdown: CancellationToken,
) {
    let mut tasks: HashMap<EventId, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        match queue.registered_events().await {
            Ok(events) => {
                tasks.retain(|_, t| !t.is_finished());
                for event in events {
                    tasks.entry(event.clone()).or_insert_with(|| {
                        let task = EventAdmission::new(
                            queue.clone(),
                            housekeeping.clone(),
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
    /// Seats, when this process sells them: the leader lapses holds and tracks sold-out.
    housekeeping: Option<Arc<dyn Housekeeping>>,
    /// The event's sold-out flag as last seen.
    sold_out: bool,
    cfg: AdmissionConfig,
    instance: String,
    event: EventId,
    tokens: f64,
    last_refill: Option<Instant>,
    recent: VecDeque<(Instant, u64)>,
    last_report: Instant,
    /// Round-robin position (statistical admission).
    cursor: usize,
    /// Waiting per shard at the last tick.
    shard_waiting: Vec<u64>,
    /// Moving average of the statistical estimate's relative error (sampled).
    estimate_error: Option<f64>,
    /// What `hybrid` uses now.
    hybrid_mode: StrategyKind,
    /// The `global_counter` figures this leader last published: (carried, first number waiting).
    counter_figures: Option<(u64, u64)>,
    /// The overload guard's state at the last tick (to log its changes).
    abandonment_suspended: bool,
    /// The line's figures this leader published lately: (when, total, per shard).
    published: VecDeque<(Instant, u64, Vec<u64>)>,
    /// The mean relative error of the last report's samples (the moving average lags a surge).
    last_sample_error: Option<f64>,
    /// Multiplier of the heads read per shard (see [`heads_per_shard`]); doubled when a short
    /// prefix cut a tick short, back down by one per tick that was not.
    head_factor: usize,
    /// No move may run on a shard whose clock has reached this (ms): the lease's lapse minus
    /// [`fence_margin`]. None: not fenced (a one-off tick outside the leader loop).
    fence_ms: Option<u64>,
    /// Ticks run, for each move's operation id.
    ticks: u64,
    /// The configured rate the admissions in `recent` were made at.
    rate_measured_for: f64,
    /// This task's part of the operation ids (an instance id may be configured, and so reused
    /// by a restarted process).
    run_id: String,
}

/// How long before its lease lapses a leader stops admitting: room for the clocks of the lease's
/// node and the shards' nodes to differ (NTP keeps them within milliseconds; this allows a
/// quarter of the lease, 750 ms at the default 3 s).
pub fn fence_margin(lease_ms: u64) -> u64 {
    lease_ms / 4
}

/// The multiplier of [`heads_per_shard`] at rest.
const HEAD_FACTOR_MIN: usize = 1;

/// How many heads to read from each of `shards` shards to admit `budget` people, never more than
/// the budget. Reading the whole budget from every shard is always enough but costs N times the
/// picks (320,000 members read to admit 5,000 over 64 shards). Tickets hash evenly over shards,
/// so among the first `budget` people a shard holds a binomial count: mean `share`, standard
/// deviation under √share. Reading share + 6·√share + 16 (times `factor`) covers it but for a
/// vanishing chance; when a shard's prefix does run out early the merge stops there (admitting
/// fewer, never out of order) and the factor doubles for the next tick.
fn heads_per_shard(budget: usize, shards: usize, factor: usize) -> usize {
    let share = budget as f64 / shards.max(1) as f64;
    let wanted = factor as f64 * (share + 6.0 * share.sqrt()) + 16.0;
    (wanted.ceil() as usize).min(budget)
}

/// Runs one admission tick for `event` outside the leader loop, letting in up to `n` people
/// (capacity permitting): the same Redis work as a tick of the scheduler, without the lease (the
/// caller must know nobody else admits for the event, e.g. a paused event being drained by
/// hand, or a measurement). Returns how many were admitted.
pub async fn admit_once(
    queue: Arc<Queue>,
    event: &EventId,
    cfg: &EventConfig,
    n: usize,
) -> Result<usize, QueueError> {
    let admission = AdmissionConfig {
        tick_ms: 1000,
        lease_ms: 3000,
        no_admission: false,
    };
    let mut task = EventAdmission::new(queue, None, admission, "bench".into(), event.clone());
    // A one-second tick at n per second: a budget of exactly n.
    let mut cfg = cfg.clone();
    cfg.admit_per_second = n as f64;
    task.tick(&cfg, Duration::from_secs(1)).await
}

/// People sampled per report to measure the position error of the estimate.
const ERROR_SAMPLES: usize = 8;

/// True when the event numbers arrivals from its counter (`global_counter` with a range).
fn counting(cfg: &EventConfig) -> bool {
    cfg.strategy == StrategyKind::GlobalCounter && cfg.counter_start > 0
}

/// How long published line figures are kept for judging the estimate.
const PUBLISHED_KEPT: Duration = Duration::from_secs(3);

/// Window over which the admission rate is measured for ETAs.
const RATE_WINDOW: Duration = Duration::from_secs(10);

impl EventAdmission {
    fn new(
        queue: Arc<Queue>,
        housekeeping: Option<Arc<dyn Housekeeping>>,
        cfg: AdmissionConfig,
        instance: String,
        event: EventId,
    ) -> Self {
        EventAdmission {
            queue,
            housekeeping,
            sold_out: false,
            cfg,
            instance,
            event,
            tokens: 0.0,
            last_refill: None,
            recent: VecDeque::new(),
            // Report on the first tick: statistical positions need the line's total at once.
            last_report: Instant::now()
                .checked_sub(Duration::from_secs(1))
                .unwrap_or_else(Instant::now),
            cursor: 0,
            shard_waiting: Vec::new(),
            estimate_error: None,
            hybrid_mode: StrategyKind::Timestamp,
            counter_figures: None,
            head_factor: HEAD_FACTOR_MIN,
            published: VecDeque::new(),
            last_sample_error: None,
            abandonment_suspended: false,
            fence_ms: None,
            ticks: 0,
            run_id: uuid::Uuid::new_v4().simple().to_string(),
            rate_measured_for: 0.0,
        }
    }

    async fn run(mut self, shutdown: CancellationToken) {
        // Exported at 0 from the start, so an alert on its increase has a series to watch.
        metrics::counter!(telemetry::ADMISSION_ERRORS, "event" => self.event.to_string())
            .increment(0);
        let tick = Duration::from_millis(self.cfg.tick_ms.max(10));
        // Ticks start every `tick` (a tick's own work does not push the next one back); one
        // that ran late is not followed by a burst of catch-up ticks.
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leading = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
            }
            let cfg = match self.queue.event(&self.event).await {
                Ok(ev) => {
                    self.sold_out = ev.sold_out;
                    ev.config.clone()
                }
                Err(QueueError::UnknownEvent) => break,
                Err(e) => {
                    tracing::warn!(event = %self.event, error = %e, "admission: cannot read the event");
                    continue;
                }
            };
            let enabled =
                cfg.state == EventState::Open && !self.sold_out && cfg.admit_per_second > 0.0;
            metrics::gauge!(telemetry::ADMISSION_ENABLED, "event" => self.event.to_string())
                .set(if enabled { 1.0 } else { 0.0 });
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
                Ok(_) => {}
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

    /// Takes or renews the lease; while held, fences this tick's moves by its lapse.
    async fn hold_lease(&mut self) -> Result<bool, QueueError> {
        self.fence_ms = Some(0);
        let store = self.queue.store();
        let lease: Lease = store
            .scripts()
            .lease
            .key(store.keys().lease(self.event.as_str()))
            .arg(&self.instance)
            .arg(self.cfg.lease_ms)
            .invoke_async(&mut store.conn())
            .await?;
        if lease.held {
            self.fence_ms = Some(
                lease
                    .lapses_at_ms
                    .saturating_sub(fence_margin(self.cfg.lease_ms)),
            );
        }
        Ok(lease.held)
    }

    async fn release(&self) {
        let store = self.queue.store();
        let released: Result<Granted, _> = store
            .scripts()
            .lease_release
            .key(store.keys().lease(self.event.as_str()))
            .arg(&self.instance)
            .invoke_async(&mut store.conn())
            .await;
        if let Err(e) = released {
            tracing::warn!(event = %self.event, error = %e, "admission: could not release the lease");
        }
    }

    /// One tick: reads the shards, picks whom to admit within the budget and capacity, moves
    /// them, records, reports. Returns how many were admitted.
    async fn tick(&mut self, cfg: &EventConfig, tick: Duration) -> Result<usize, QueueError> {
        if cfg.line_form == LineForm::Numbered {
            return self.tick_numbered(cfg, tick).await;
        }
        let budget = self.refill(cfg, tick);
        let now_ms = now_ms();
        let abandon_before = abandon_bound(now_ms, cfg);
        let shards = self.read_shards(cfg, budget, now_ms).await?;
        let suspended = self.watch_guard(&shards);
        if counting(cfg) {
            self.counter_figures = self.publish_counter_figures(cfg, &shards).await?;
        }
        let active: u64 = shards.iter().map(|s| s.active).sum();
        let waiting: u64 = shards.iter().map(|s| s.waiting).sum();
        let take = budget.min(cfg.active_capacity.saturating_sub(active) as usize);
        self.shard_waiting = shards.iter().map(|s| s.waiting).collect();
        let abandoned_read: u64 = shards.iter().map(|s| s.abandoned).sum();
        let picks = self.pick(cfg, shards, take, waiting as usize);
        let picked: Vec<usize> = picks.iter().map(|p| p.shard).collect();
        // The lease check, one read per shard, the counter figures, one move per shard picked.
        let commands = 1 + u64::from(cfg.shards) + u64::from(counting(cfg)) + picks.len() as u64;
        // While the guard holds, people who have polled are taken for gone only past the longer
        // bound (lua/shard_heads.lua); entries that never polled always at the normal one.
        let polled_before = if suspended {
            guarded_bound(now_ms, cfg)
        } else {
            abandon_before
        };
        self.ticks += 1;
        let moved = self
            .admit(cfg, picks, now_ms, polled_before, abandon_before)
            .await?;
        let fenced = moved
            .iter()
            .filter(|m| m.refused == Some(AdmitRefusal::Fenced))
            .count();
        if fenced > 0 {
            metrics::counter!(telemetry::ADMISSION_FENCED, "event" => self.event.to_string())
                .increment(fenced as u64);
            tracing::warn!(event = %self.event, shards = fenced,
                "admission: this tick outlived its lease; its moves were refused by the fence");
        }
        let admitted: usize = moved.iter().map(|m| m.members.len()).sum();
        let abandoned = abandoned_read + moved.iter().map(|m| m.abandoned).sum::<u64>();
        self.tokens -= admitted as f64;
        for (shard, m) in picked.iter().zip(&moved) {
            let w = &mut self.shard_waiting[*shard];
            *w = w.saturating_sub(m.members.len() as u64 + m.abandoned);
        }
        self.publish_line().await?;
        self.record(
            suspended,
            abandoned,
            commands,
            admitted as u64,
            waiting,
            active,
        );
        self.report(cfg, admitted as u64).await?;
        Ok(admitted)
    }

    /// One tick of a numbered line: the boundary moves past the next people still there
    /// (`lua/nl_tick.lua`); nobody is moved. The budget goes in steps of at most
    /// [`NUMBERED_STEP`] people, one script each, so no script holds the event's primary (and
    /// every poll of the event waiting behind it) for long.
    async fn tick_numbered(
        &mut self,
        cfg: &EventConfig,
        tick: Duration,
    ) -> Result<usize, QueueError> {
        let budget = self.refill(cfg, tick);
        let now_ms = now_ms();
        let abandon_before = abandon_bound(now_ms, cfg);
        let fence = self.fence_ms.map(|f| f.to_string()).unwrap_or_default();
        self.ticks += 1;
        let store = self.queue.store();
        let keys = store.keys().numbered(self.event.as_str());
        let (mut admitted, mut abandoned, mut steps) = (0u64, 0u64, 0u64);
        let mut left = budget;
        // The first step judges the overload guard; the others take its finding.
        let mut guard = String::new();
        let reply = loop {
            steps += 1;
            let step = left.min(NUMBERED_STEP);
            let op = format!("{}:{}:{steps}", self.run_id, self.ticks);
            let reply: Result<NumberedTick, _> =
                with_numbered_keys(&store.scripts().nl_tick, &keys)
                    .arg(step)
                    .arg(cfg.active_capacity)
                    .arg(now_ms)
                    .arg(cfg.active_ttl_seconds * 1000)
                    .arg(abandon_before)
                    .arg(abandon_before)
                    .arg(guarded_bound(now_ms, cfg))
                    .arg(super::numbered::numbered_horizon(cfg))
                    .arg(&fence)
                    .arg(op)
                    .arg(cfg.record_period_ms())
                    .arg(&guard)
                    .invoke_async(&mut store.conn())
                    .await;
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    // Earlier steps may have moved the boundary.
                    self.queue.numbered_changed(&keys.line);
                    return Err(e.into());
                }
            };
            guard = reply.5.to_string();
            admitted += reply.0;
            abandoned += reply.1;
            // Done: the budget is spent, the line or the room ran out, or the fence refused.
            if reply.4 != 0 || reply.0 < step as u64 || left <= step {
                break reply;
            }
            left -= step;
        };
        if admitted + abandoned > 0 {
            // This instance's next positions read the moved line afresh.
            self.queue.numbered_changed(&keys.line);
        }
        let (_, _, active, waiting, status, suspended, _boundary) = reply;
        if status == 1 {
            metrics::counter!(telemetry::ADMISSION_FENCED, "event" => self.event.to_string())
                .increment(1);
            tracing::warn!(event = %self.event,
                "admission: this tick outlived its lease; its move was refused by the fence");
        }
        let suspended = self.note_guard(suspended == 1);
        self.tokens -= admitted as f64;
        self.shard_waiting = vec![waiting];
        self.publish_line().await?;
        // The lease check and the tick's scripts.
        self.record(
            suspended,
            abandoned,
            1 + steps,
            admitted,
            waiting + admitted,
            active.saturating_sub(admitted),
        );
        self.report(cfg, admitted).await?;
        Ok(admitted as usize)
    }

    /// Publishes the line's size and its size per shard after this tick's moves, every tick:
    /// `statistical` polls correct these by their own shard's change since (see
    /// `statistical::live_total`), and the error samples judge the estimate on figures as old
    /// as the ones polls see.
    async fn publish_line(&mut self) -> Result<(), QueueError> {
        let total: u64 = self.shard_waiting.iter().sum();
        let list = self
            .shard_waiting
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let store = self.queue.store();
        let () = store
            .conn()
            .hset_multiple(
                store.keys().event_stats(self.event.as_str()),
                &[
                    (stats::WAITING, total.to_string()),
                    (stats::SHARD_WAITING, list),
                ],
            )
            .await?;
        let now = Instant::now();
        self.published
            .push_back((now, total, self.shard_waiting.clone()));
        while self
            .published
            .front()
            .is_some_and(|(t, ..)| now - *t > PUBLISHED_KEPT)
        {
            self.published.pop_front();
        }
        Ok(())
    }

    /// The figures a poll sees now: published at least one event-cache lifetime ago (an
    /// instance may hold them that long), else the oldest kept.
    fn figures_as_polls_see_them(&self) -> Option<(u64, &[u64])> {
        let now = Instant::now();
        self.published
            .iter()
            .rev()
            .find(|(t, ..)| now - *t >= super::event::CACHE_TTL)
            .or(self.published.front())
            .map(|(_, total, shards)| (*total, shards.as_slice()))
    }

    /// Refills the token bucket for the time since the last tick (keeping at most one tick's
    /// worth plus one beyond that) and returns the budget: how many may be admitted now. A sold-out line admits nobody:
    /// there is nothing left to buy.
    fn refill(&mut self, cfg: &EventConfig, tick: Duration) -> usize {
        let now = Instant::now();
        let dt = self.last_refill.map(|t| now - t).unwrap_or(tick);
        self.last_refill = Some(now);
        // Everything earned since the last refill, plus at most one tick's worth carried over
        // (what a tick could not use: capacity, a short prefix); never a burst after an idle spell.
        let cap = cfg.admit_per_second * (dt + tick).as_secs_f64() + 1.0;
        self.tokens = (self.tokens + cfg.admit_per_second * dt.as_secs_f64()).min(cap);
        if self.sold_out {
            0
        } else {
            self.tokens.floor() as usize
        }
    }

    /// Step 1: per shard, concurrently, end lapsed sessions and read the counts and the first
    /// heads (`lua/shard_heads.lua`). Round-robin admits each shard's own front: it needs the
    /// counts, not the heads.
    async fn read_shards(
        &self,
        cfg: &EventConfig,
        budget: usize,
        now_ms: u64,
    ) -> Result<Vec<ShardRead>, QueueError> {
        let store = self.queue.store();
        let expire_before = now_ms.saturating_sub(cfg.active_ttl_seconds * 1000);
        let abandon_before = abandon_bound(now_ms, cfg);
        let guarded_before = guarded_bound(now_ms, cfg);
        let counter_start = if counting(cfg) {
            cfg.counter_start.to_string()
        } else {
            String::new()
        };
        let heads_wanted = if cfg.strategy == StrategyKind::Statistical {
            0
        } else {
            heads_per_shard(budget, cfg.shards as usize, self.head_factor)
        };
        let counter_start = &counter_start;
        let horizon = horizon(cfg);
        let reads = (0..cfg.shards as usize).map(|i| {
            let mut conn = store.conn();
            let k = store.keys().shard(&cfg.shard_tags[i]);
            async move {
                store
                    .scripts()
                    .shard_heads
                    .key(&k.waiting)
                    .key(&k.active)
                    .key(&k.seen)
                    .key(&k.horizon)
                    .arg(expire_before)
                    .arg(heads_wanted)
                    .arg(abandon_before)
                    .arg(counter_start)
                    .arg(guarded_before)
                    .arg(horizon)
                    .arg(now_ms)
                    .invoke_async::<ShardRead>(&mut conn)
                    .await
            }
        });
        Ok(try_join_all(reads).await?)
    }

    /// The overload guard: fewer than half of a shard's line seen lately means polls are not
    /// reaching us, so nobody is taken for gone. Logs when it changes; returns whether it holds.
    fn watch_guard(&mut self, shards: &[ShardRead]) -> bool {
        self.note_guard(shards.iter().any(|s| s.abandonment_suspended))
    }

    /// Logs a change of the overload guard; returns whether it holds.
    fn note_guard(&mut self, suspended: bool) -> bool {
        if suspended != self.abandonment_suspended {
            self.abandonment_suspended = suspended;
            if suspended {
                tracing::warn!(event = %self.event, "admission: most of the line has not been seen for abandon_after_seconds; not removing anyone as abandoned until polls come back");
            } else {
                tracing::info!(event = %self.event, "admission: polls are back; abandoned places are removed again");
            }
        }
        suspended
    }

    /// Step 2: whom to admit from each shard. Round-robin deals `take` over the shards'
    /// counts (statistical: no cross-shard order); otherwise a K-way merge of the heads picks
    /// the next `take` in global order, and the head factor adapts when a prefix ran out.
    fn pick(
        &mut self,
        cfg: &EventConfig,
        shards: Vec<ShardRead>,
        take: usize,
        waiting: usize,
    ) -> Vec<ShardPick> {
        if cfg.strategy == StrategyKind::Statistical {
            return round_robin::deal(&self.shard_waiting, take as u64, &mut self.cursor)
                .into_iter()
                .enumerate()
                .filter(|(_, k)| *k > 0)
                .map(|(shard, k)| ShardPick {
                    shard,
                    count: k as usize,
                    last: None,
                })
                .collect();
        }
        let heads: Vec<ShardHeads> = shards
            .into_iter()
            .map(|s| ShardHeads {
                complete: s.heads.len() as u64 >= s.waiting,
                heads: s.heads.into_iter().map(|(m, score)| (score, m)).collect(),
            })
            .collect();
        let merged = merge_heads(&heads, take);
        // Cut short by a prefix that ran out (not by the line's end): read more next time.
        self.head_factor = if merged.len() < take.min(waiting) {
            (self.head_factor * 2)
                .min(cfg.shards as usize)
                .max(HEAD_FACTOR_MIN)
        } else {
            (self.head_factor - 1).max(HEAD_FACTOR_MIN)
        };
        group_by_shard(&heads, &merged)
    }

    /// Step 3: per shard picked, concurrently, move exactly those people (`lua/admit.lua`).
    async fn admit(
        &self,
        cfg: &EventConfig,
        picks: Vec<ShardPick>,
        now_ms: u64,
        polled_before: u64,
        entered_before: u64,
    ) -> Result<Vec<Admitted>, QueueError> {
        let store = self.queue.store();
        let fence = self.fence_ms.map(|f| f.to_string()).unwrap_or_default();
        let op = format!("{}:{}", self.run_id, self.ticks);
        let (fence, op) = (&fence, &op);
        let moves = picks.into_iter().map(|p| {
            let mut conn = store.conn();
            let k = store.keys().shard(&cfg.shard_tags[p.shard]);
            // No bound (round-robin): the script takes the first `count`, whoever they are.
            let (score, member) = match p.last {
                Some((score, member)) => (score.to_string(), member),
                None => (String::new(), String::new()),
            };
            async move {
                store
                    .scripts()
                    .admit
                    .key(&k.waiting)
                    .key(&k.active)
                    .key(&k.admitted)
                    .key(&k.seen)
                    .key(&k.op)
                    .key(&k.horizon)
                    .arg(p.count)
                    .arg(score)
                    .arg(member)
                    .arg(now_ms)
                    .arg(polled_before)
                    .arg(entered_before)
                    .arg(fence)
                    .arg(op)
                    .invoke_async::<Admitted>(&mut conn)
                    .await
            }
        });
        Ok(try_join_all(moves).await?)
    }

    /// Step 4: the tick's metrics.
    fn record(
        &self,
        suspended: bool,
        abandoned: u64,
        commands: u64,
        admitted: u64,
        waiting: u64,
        active: u64,
    ) {
        let ev = self.event.to_string();
        metrics::gauge!(telemetry::ABANDONMENT_SUSPENDED, "event" => ev.clone())
            .set(if suspended { 1.0 } else { 0.0 });
        metrics::counter!(telemetry::ABANDONED_TOTAL, "event" => ev.clone()).increment(abandoned);
        metrics::counter!(telemetry::ADMISSION_COMMANDS, "event" => ev.clone()).increment(commands);
        metrics::counter!(telemetry::ADMITTED_TOTAL, "event" => ev.clone()).increment(admitted);
        metrics::gauge!(telemetry::QUEUE_WAITING, "event" => ev.clone())
            .set(waiting.saturating_sub(admitted) as f64);
        metrics::gauge!(telemetry::QUEUE_ACTIVE, "event" => ev.clone())
            .set((active + admitted) as f64);
        metrics::gauge!(telemetry::ADMISSION_LAST_TICK, "event" => ev)
            .set(now_ms() as f64 / 1000.0);
    }

    /// The event's figures for dashboards, about once a second: waiting per shard, the admission
    /// rate configured and measured, the strategy in use and the error budget.
    fn publish_gauges(&self, cfg: &EventConfig, measured_rate: f64) {
        let ev = self.event.to_string();
        for (shard, waiting) in self.shard_waiting.iter().enumerate() {
            metrics::gauge!(telemetry::QUEUE_SHARD_WAITING, "event" => ev.clone(), "shard" => shard.to_string())
                .set(*waiting as f64);
        }
        metrics::gauge!(telemetry::ADMIT_RATE_CONFIGURED, "event" => ev.clone())
            .set(cfg.admit_per_second);
        metrics::gauge!(telemetry::ADMIT_RATE_MEASURED, "event" => ev.clone()).set(measured_rate);
        let effective = cfg.positions_by(Some(self.hybrid_mode));
        for kind in [
            StrategyKind::GlobalCounter,
            StrategyKind::Timestamp,
            StrategyKind::Statistical,
        ] {
            metrics::gauge!(telemetry::EFFECTIVE_STRATEGY, "event" => ev.clone(), "strategy" => kind.as_str())
                .set(if kind == effective { 1.0 } else { 0.0 });
        }
        metrics::gauge!(telemetry::POSITION_ERROR_BUDGET, "event" => ev.clone())
            .set(cfg.hybrid_max_error);
        metrics::gauge!(telemetry::ACTIVE_CAPACITY, "event" => ev.clone())
            .set(cfg.active_capacity as f64);
        // 0 while nothing is estimated (exact strategies show exact positions).
        metrics::gauge!(telemetry::POSITION_RELATIVE_ERROR, "event" => ev)
            .set(self.estimate_error.unwrap_or(0.0));
    }

    /// Publishes, every tick, what `global_counter` positions need: how many wait from before the
    /// counter range, and the first number still waiting (absent when nobody numbered waits).
    async fn publish_counter_figures(
        &self,
        cfg: &EventConfig,
        shards: &[ShardRead],
    ) -> Result<Option<(u64, u64)>, QueueError> {
        let carried: u64 = shards.iter().map(|s| s.carried).sum();
        let first = shards
            .iter()
            .filter_map(|s| s.first_counted)
            .reduce(f64::min)
            .map(|f| f as u64);
        let keys = self.queue.store().keys();
        // One script (lua/publish_counter.lua): a poll never reads half of an update, and the
        // gaps behind the new first number leave with its publication. Tagged with the range the
        // figures describe: figures of an earlier range are never used. No first number: "".
        // The numbers of places this tick's read removed as abandoned become gaps in the same
        // step: they were among the first of their shard, not always ahead of everyone.
        let mut publish = self
            .queue
            .store()
            .scripts()
            .publish_counter
            .prepare_invoke();
        publish
            .key(keys.event_stats(self.event.as_str()))
            .key(keys.counter_gaps(self.event.as_str()))
            .arg(cfg.counter_start)
            .arg(carried)
            .arg(first.map(|f| f.to_string()).unwrap_or_default());
        for s in shards {
            publish.arg(&s.abandoned_numbers);
        }
        let _: i64 = publish.invoke_async(&mut self.queue.store().conn()).await?;
        Ok(first.map(|f| (carried, f)))
    }

    /// About once a second: publishes the measured admission rate (for everyone's ETA) and the
    /// line's total (for statistical positions), measures the estimate's error on a sample, and
    /// decides the `hybrid` mode.
    async fn report(&mut self, cfg: &EventConfig, admitted: u64) -> Result<(), QueueError> {
        let now = Instant::now();
        // A new configured rate starts a new measurement: admissions at the old rate would
        // drag everyone's ETA for the whole window (measured: ETAs 1.41× the wait 4 s after
        // going from 1/s to 200/s).
        if cfg.admit_per_second != self.rate_measured_for {
            self.rate_measured_for = cfg.admit_per_second;
            self.recent.clear();
        }
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
        let waiting: u64 = self.shard_waiting.iter().sum();
        // Estimates and counted positions can be wrong; `timestamp` is exact by construction.
        // A numbered line's positions are exact arithmetic on its figures: nothing to sample.
        if cfg.strategy != StrategyKind::Timestamp && cfg.line_form == LineForm::SortedSets {
            self.sample_error(cfg).await?;
        }
        // An event switched to an exact strategy keeps no estimate error from before.
        if !matches!(
            cfg.strategy,
            StrategyKind::Statistical | StrategyKind::Hybrid
        ) {
            self.estimate_error = None;
            self.last_sample_error = None;
        }
        // Lapse the shows' expired holds and keep the sold-out flag true (seats come back).
        if let Some(housekeeping) = &self.housekeeping {
            match housekeeping.sweep(&self.event).await {
                Ok(sold_out) => self.sold_out = sold_out,
                Err(e) => {
                    tracing::warn!(event = %self.event, error = %e, "admission: show sweep failed")
                }
            }
        }
        let before = self.hybrid_mode;
        self.hybrid_mode = HybridPolicy {
            min_waiting: cfg.hybrid_min_waiting,
            max_relative_error: cfg.hybrid_max_error,
        }
        .decide(
            self.hybrid_mode,
            HybridInputs {
                waiting,
                // The worse of the moving average and the last samples: a surge that spoils the
                // estimate sends hybrid back to exact within one report, not after several.
                relative_error: match (self.estimate_error, self.last_sample_error) {
                    (Some(avg), Some(last)) => Some(avg.max(last)),
                    (avg, last) => avg.or(last),
                },
                exact_cost: cfg.shards,
            },
        );
        let ev = self.event.to_string();
        if cfg.strategy == StrategyKind::Hybrid && before != self.hybrid_mode {
            tracing::info!(event = %self.event, from = %before, to = %self.hybrid_mode, waiting,
                error = ?self.estimate_error, "hybrid: switching mode");
            metrics::counter!(telemetry::HYBRID_SWITCHES, "event" => ev.clone(), "to" => self.hybrid_mode.as_str())
                .increment(1);
        }
        let estimated = cfg.strategy == StrategyKind::Hybrid
            && cfg.positions_by(Some(self.hybrid_mode)) == StrategyKind::Statistical;
        metrics::gauge!(telemetry::HYBRID_ESTIMATED, "event" => ev).set(if estimated {
            1.0
        } else {
            0.0
        });
        self.publish_gauges(cfg, rate);
        let store = self.queue.store();
        let () = store
            .conn()
            .hset_multiple(
                store.keys().event_stats(self.event.as_str()),
                &[
                    (stats::RATE, rate.to_string()),
                    (stats::HYBRID_MODE, self.hybrid_mode.to_string()),
                    (
                        stats::POSITION_ERROR,
                        self.estimate_error
                            .map(|e| e.to_string())
                            .unwrap_or_default(),
                    ),
                ],
            )
            .await?;
        Ok(())
    }

    /// Picks a few waiting people at random, computes their exact position and the statistical
    /// estimate, and records the error (histogram by strategy, moving average for `hybrid`).
    async fn sample_error(&mut self, cfg: &EventConfig) -> Result<(), QueueError> {
        let total: u64 = self.shard_waiting.iter().sum();
        if total == 0 {
            return Ok(());
        }
        let q = self.queue.clone();
        let store = q.store();
        let keys = store.keys().shards(&cfg.shard_tags);
        let mut batch = Vec::with_capacity(ERROR_SAMPLES);
        for _ in 0..ERROR_SAMPLES {
            // A shard chosen in proportion to its size, then a member uniformly: a uniform person.
            let mut pick = rand::random_range(0..total);
            let shard = self
                .shard_waiting
                .iter()
                .position(|w| {
                    if pick < *w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .unwrap_or(0);
            let k = &keys[shard];
            let mut conn = store.conn();
            let sampled: Vec<(String, f64)> = redis::cmd("ZRANDMEMBER")
                .arg(&k.waiting)
                .arg(1)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            let Some((member, score)) = sampled.into_iter().next() else {
                continue;
            };
            let (rank, size): (Option<u64>, u64) = redis::pipe()
                .zrank(&k.waiting, &member)
                .zcard(&k.waiting)
                .query_async(&mut conn)
                .await?;
            let Some(rank) = rank else { continue };
            // The reference is read from the primaries: the exact position as of now.
            let ahead = q
                .ahead_in_other_shards(&store.conn(), &keys, shard, score)
                .await?;
            let exact = timestamp::position(rank, &ahead);
            if cfg.strategy == StrategyKind::GlobalCounter {
                // What a poll shows: the counted position, for numbered people, from the
                // figures this leader published and the gaps recorded ahead; a number whose gap
                // went unrecorded, or figures a tick old, make it differ.
                if let (true, Some((carried, first))) =
                    (score >= cfg.counter_start as f64, self.counter_figures)
                {
                    let gaps: u64 = conn
                        .zcount(
                            store.keys().counter_gaps(self.event.as_str()),
                            "-inf",
                            format!("({}", score as u64),
                        )
                        .await?;
                    let shown = global_counter::position(carried, score as u64, first, gaps);
                    metrics::histogram!(telemetry::POSITION_ERROR, "strategy" => "global_counter")
                        .record(shown.abs_diff(exact) as f64);
                }
                continue;
            }
            // What a poll shows: the figures as cached by instances, corrected by the own
            // shard's live size, exactly as `Queue::poll` computes it.
            let line = match self.figures_as_polls_see_them() {
                Some((published, per_shard)) if per_shard.len() == cfg.shards as usize => {
                    statistical::live_total(published, per_shard[shard], size, cfg.shards)
                }
                _ => total,
            };
            let estimate = statistical::position(rank, size, line);
            // Under `hybrid`, someone whose estimate is too wide is shown the exact position.
            let shown = if cfg.strategy == StrategyKind::Hybrid
                && !statistical::fits_budget(estimate, line, cfg.shards, cfg.hybrid_max_error)
            {
                exact
            } else {
                estimate
            };
            let error = shown.abs_diff(exact);
            metrics::histogram!(telemetry::POSITION_ERROR, "strategy" => "statistical")
                .record(error as f64);
            let relative = error as f64 / exact as f64;
            batch.push(relative);
            self.estimate_error = Some(match self.estimate_error {
                Some(avg) => 0.8 * avg + 0.2 * relative,
                None => relative,
            });
        }
        if !batch.is_empty() {
            self.last_sample_error = Some(batch.iter().sum::<f64>() / batch.len() as f64);
        }
        Ok(())
    }
}

/// While the overload guard holds, how many abandonment windows someone who has polled keeps
/// their place without being seen: the benefit of the doubt, bounded, so that a crowd that polls
/// once and stops cannot keep abandonment off for good.
pub const GUARD_GRACE_WINDOWS: u64 = 5;

/// The abandon bound, ms: people last seen at or before it have left without saying so. A poll
/// records itself only when its last record is older than [`seen_refresh_ms`], so the bound lies
/// that much further back: whoever polled within `abandon_after_seconds` is newer than it.
fn abandon_bound(now_ms: u64, cfg: &EventConfig) -> u64 {
    now_ms.saturating_sub(cfg.abandon_after_seconds * 1000 + seen_refresh_ms(cfg))
}

/// The abandon bound for people who have polled while the guard holds, ms.
fn guarded_bound(now_ms: u64, cfg: &EventConfig) -> u64 {
    now_ms.saturating_sub(
        GUARD_GRACE_WINDOWS * cfg.abandon_after_seconds * 1000 + seen_refresh_ms(cfg),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_read_per_shard_are_a_multiple_of_an_even_share_capped_by_the_budget() {
        // 5,000 over 64 shards: 78.1 + 6 × 8.8 + 16 instead of 5,000 from each.
        assert_eq!(heads_per_shard(5000, 64, HEAD_FACTOR_MIN), 148);
        assert_eq!(heads_per_shard(5000, 8, HEAD_FACTOR_MIN), 791);
        assert_eq!(heads_per_shard(5000, 8, 2), 1566);
        // The factor at its ceiling (the shard count) reads the whole budget: always enough.
        assert_eq!(heads_per_shard(5000, 64, 64), 5000);
        // Small budgets read the budget itself.
        assert_eq!(heads_per_shard(10, 4, HEAD_FACTOR_MIN), 10);
        assert_eq!(heads_per_shard(0, 4, HEAD_FACTOR_MIN), 0);
    }
}
