//! Seats: shows and their seat maps, and holds (all or nothing, lapsing by TTL).
//!
//! Redis holds the fast, atomic view (one Lua script per step, all of a show's keys under one
//! hash tag); PostgreSQL, fed through Kafka, is the truth. The invariant this module keeps: a
//! seat is held by at most one live hold, and a hold takes all its seats or none. Turning a
//! hold into a booking is the `booking` module's.

pub mod repo;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use futures::future::{try_join_all, BoxFuture};
use moka::future::Cache;
use redis::{AsyncCommands as _, RedisError};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::auth::TokenError;
use crate::ids::{parse_uuid, BadId, EventId, SeatId, ShowId, Ticket};
use crate::queue::admission::Housekeeping;
use crate::queue::{now_ms, Queue, QueueError};
use crate::redis::keys::{stats, ShowKeys};
use crate::redis::replies::{HoldReply, MaybeShow, ReleaseReply, ShowSetup, Swept};
use crate::redis::scripts::with_show_keys;
use crate::redis::Store;
use crate::telemetry;
/// Most seats one show may have.
pub const MAX_SEATS: usize = 100_000;

/// What can go wrong with seats and bookings.
#[derive(Debug, thiserror::Error)]
pub enum SeatError {
    /// No such show.
    #[error("no such show")]
    UnknownShow,
    /// No such hold.
    #[error("no such hold")]
    UnknownHold,
    /// The request is malformed for this show.
    #[error("{0}")]
    Invalid(String),
    /// Some seats are held or sold: nothing was held.
    #[error("some seats are no longer available")]
    Taken(Vec<String>),
    /// General admission: fewer places left than asked for.
    #[error("not enough places left")]
    SoldOut,
    /// The change conflicts with what exists.
    #[error("{0}")]
    Conflict(String),
    /// No valid token.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// A valid token that does not grant this.
    #[error("{0}")]
    Forbidden(&'static str),
    /// The waiting room (Redis) failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// PostgreSQL failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<RedisError> for SeatError {
    fn from(e: RedisError) -> Self {
        SeatError::Queue(QueueError::from(e))
    }
}

impl From<redis::ParsingError> for SeatError {
    fn from(e: redis::ParsingError) -> Self {
        SeatError::Queue(QueueError::from(RedisError::from(e)))
    }
}

impl From<BadId> for SeatError {
    fn from(e: BadId) -> Self {
        SeatError::Invalid(e.to_string())
    }
}

/// The body of `PUT /admin/v1/shows/{show}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShowSpec {
    /// The event the show belongs to.
    pub event: String,
    /// Seat ids, in display order.
    pub seats: Option<Vec<String>>,
    /// A row range such as `A-J` (with `seats_per_row`): seats `A-1` … `J-20`.
    pub rows: Option<String>,
    /// Seats in each row.
    pub seats_per_row: Option<u32>,
    /// General admission: places without seat numbers.
    pub quantity: Option<u32>,
}

/// A show as created.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ShowOut {
    /// Show id.
    pub show: String,
    /// Event id.
    pub event: String,
    /// Seats, or places for general admission.
    pub seat_count: u64,
    /// `seated` or `ga`.
    #[schema(value_type = String)]
    pub kind: &'static str,
}

/// A show as the waiting-room page lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ShowSummary {
    /// Show id.
    pub show: String,
    /// True for general admission (a quantity, no seat map).
    pub general_admission: bool,
    /// Seats, or places for general admission.
    pub seats: u64,
}

/// One seat's state.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SeatState {
    /// Seat id.
    pub id: String,
    /// `available`, `held` or `sold`.
    #[schema(value_type = String)]
    pub state: &'static str,
}

/// `GET /v1/shows/{show}/seats`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SeatMap {
    /// Show id.
    pub show: String,
    /// Event id.
    pub event: String,
    /// Seats (or places) neither held nor sold.
    pub available: u64,
    /// Seats in display order (empty for general admission).
    pub seats: Vec<SeatState>,
    /// General admission: all places.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantity: Option<u64>,
}

/// The body of a hold request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// Seats to hold (seated show).
    pub seats: Option<Vec<String>>,
    /// Places to hold (general admission).
    pub quantity: Option<u32>,
}

/// A hold made.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HoldOut {
    /// Hold id.
    pub hold_id: String,
    /// Show id.
    pub show: String,
    /// Seats held (seated show).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats: Option<Vec<String>>,
    /// Places held (general admission).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantity: Option<u32>,
    /// When the hold lapses (RFC 3339).
    pub expires_at: String,
}

/// What a hold request asks for, checked against the event's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    /// These seats (seated show), unique, at most the event's maximum.
    Seats(Vec<String>),
    /// This many places (general admission).
    Quantity(u32),
}

impl Wanted {
    fn parse(req: &HoldRequest, max: u32) -> Result<Self, SeatError> {
        match (&req.seats, req.quantity) {
            (Some(seats), None) => {
                let ids = seats
                    .iter()
                    .map(|s| SeatId::parse(s).map(SeatId::into_string))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut uniq = ids.clone();
                uniq.sort();
                uniq.dedup();
                if ids.is_empty() || uniq.len() != ids.len() {
                    return Err(SeatError::Invalid(
                        "seats must be a non-empty list without duplicates".into(),
                    ));
                }
                if ids.len() > max as usize {
                    return Err(SeatError::Invalid(format!("at most {max} seats per hold")));
                }
                Ok(Wanted::Seats(ids))
            }
            (None, Some(q)) if (1..=max).contains(&q) => Ok(Wanted::Quantity(q)),
            (None, Some(_)) => Err(SeatError::Invalid(format!("quantity must be 1..={max}"))),
            _ => Err(SeatError::Invalid("give either seats or quantity".into())),
        }
    }
}

/// A seat map as served: its JSON and an `ETag` over it.
#[derive(Debug)]
pub struct SeatMapSnapshot {
    /// The body of `GET /v1/shows/{show}/seats`.
    pub json: Vec<u8>,
    /// A strong validator of `json` (quoted, as the header carries it).
    pub etag: String,
}

impl SeatMapSnapshot {
    fn of(map: &SeatMap) -> Self {
        let json = serde_json::to_vec(map).expect("a seat map serializes");
        let digest = Sha256::digest(&json);
        let etag = format!(
            "\"{}\"",
            digest[..12]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        SeatMapSnapshot { json, etag }
    }
}

/// Where a seat map read was answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapSource {
    /// This instance's copy, at most the configured age old.
    Snapshot,
    /// Read from Redis for this request (the copy was missing or too old).
    Redis,
}

/// The terms of one hold: when it is made, how long it lasts (already cut to the session's end)
/// and the ticket's seat cap in the show.
#[derive(Debug, Clone, Copy)]
struct HoldTerms {
    now: u64,
    ttl_ms: u64,
    cap: u32,
}

/// Most shows whose seat map one instance keeps a copy of.
const SNAPSHOT_SHOWS: u64 = 10_000;

/// Shows, seat maps and holds. Bookings are the `booking` module's.
pub struct Seats {
    store: Arc<Store>,
    queue: Arc<Queue>,
    db: PgPool,
    /// Seat maps served to the public, per show (`None`: no such show), at most `max_age` old;
    /// absent when `max_age` is 0 (every read goes to Redis).
    snapshots: Option<Cache<String, Arc<Option<SeatMapSnapshot>>>>,
}

impl Seats {
    /// Seats on `store`, with access checked by `queue` and shows recorded in `db`; public
    /// seat maps are copies at most `map_max_age` old (0: always read from Redis).
    pub fn new(store: Arc<Store>, queue: Arc<Queue>, db: PgPool, map_max_age: Duration) -> Self {
        let snapshots = (!map_max_age.is_zero()).then(|| {
            Cache::builder()
                .max_capacity(SNAPSHOT_SHOWS)
                .time_to_live(map_max_age)
                .build()
        });
        Seats {
            store,
            queue,
            db,
            snapshots,
        }
    }

    /// The public seat map of `show`: one read of Redis per show and instance per `max_age`
    /// however many ask (concurrent askers wait for the one read), unknown shows included.
    pub async fn seat_map_snapshot(
        &self,
        show: &ShowId,
    ) -> Result<(Arc<Option<SeatMapSnapshot>>, MapSource), SeatError> {
        let read = async {
            match self.seats(show).await {
                Ok(map) => Ok(Arc::new(Some(SeatMapSnapshot::of(&map)))),
                Err(SeatError::UnknownShow) => Ok(Arc::new(None)),
                Err(e) => Err(e),
            }
        };
        let Some(cache) = &self.snapshots else {
            return Ok((read.await?, MapSource::Redis));
        };
        let entry = cache
            .entry(show.as_str().to_owned())
            .or_try_insert_with(read)
            .await
            .map_err(|e| match Arc::try_unwrap(e) {
                Ok(e) => e,
                // Others waited on the same failed read: each answers as Redis failing.
                Err(shared) => SeatError::from(RedisError::from((
                    redis::ErrorKind::Io,
                    "seat map read failed",
                    shared.to_string(),
                ))),
            })?;
        let source = if entry.is_fresh() {
            MapSource::Redis
        } else {
            MapSource::Snapshot
        };
        Ok((entry.into_value(), source))
    }

    fn show_keys(&self, show: &ShowId) -> ShowKeys {
        self.store.keys().show(show.as_str())
    }

    /// Creates a show and its seats, in PostgreSQL and Redis. Returns whether it was new.
    pub async fn put_show(
        &self,
        show: &ShowId,
        spec: &ShowSpec,
    ) -> Result<(ShowOut, bool), SeatError> {
        let event = EventId::parse(&spec.event)?;
        self.queue.event_config(&event).await.map_err(|e| match e {
            QueueError::UnknownEvent => SeatError::Invalid(format!("no event {event}")),
            e => e.into(),
        })?;
        let (seats, quantity) = seat_list(spec)?;
        let kind = if quantity.is_some() { "ga" } else { "seated" };
        let total = quantity.map(u64::from).unwrap_or(seats.len() as u64);
        let owner = repo::upsert_show(
            &self.db,
            show.as_str(),
            event.as_str(),
            &seats,
            quantity.map(|q| q as i32),
        )
        .await?;
        if owner != event.as_str() {
            return Err(SeatError::Conflict(format!(
                "show {show} belongs to event {owner}"
            )));
        }
        let k = self.show_keys(show);
        let mut call = with_show_keys(&self.store.scripts().show_setup, &k);
        call.key(&k.order).arg(event.as_str()).arg(kind).arg(total);
        for s in &seats {
            call.arg(s);
        }
        let setup: ShowSetup = call.invoke_async(&mut self.store.conn()).await?;
        let _: i64 = self
            .store
            .conn()
            .sadd(self.store.keys().event_shows(event.as_str()), show.as_str())
            .await?;
        let created = setup == ShowSetup::Created;
        if created && total > 0 {
            self.set_sold_out(&event, false).await?;
        }
        Ok((
            ShowOut {
                show: show.to_string(),
                event: event.to_string(),
                seat_count: total,
                kind,
            },
            created,
        ))
    }

    /// The seat map, from Redis.
    pub async fn seats(&self, show: &ShowId) -> Result<SeatMap, SeatError> {
        let k = self.show_keys(show);
        let mut call = with_show_keys(&self.store.scripts().show_view, &k);
        let MaybeShow(view) = call
            .key(&k.order)
            .arg(now_ms())
            .invoke_async(&mut self.store.conn())
            .await?;
        let view = view.ok_or(SeatError::UnknownShow)?;
        let seats = view
            .seats
            .into_iter()
            .map(|(id, state)| SeatState {
                id,
                state: match state.as_str() {
                    "" => "available",
                    s if s.starts_with("s:") => "sold",
                    _ => "held",
                },
            })
            .collect();
        Ok(SeatMap {
            show: show.to_string(),
            event: view.event,
            available: view.available,
            seats,
            quantity: view.general_admission.then_some(view.total),
        })
    }

    /// The shows of an event, by id, with their kind and size (for the waiting-room page).
    pub async fn event_shows(&self, event: &EventId) -> Result<Vec<ShowSummary>, SeatError> {
        let mut ids: Vec<String> = self
            .store
            .conn()
            .smembers(self.store.keys().event_shows(event.as_str()))
            .await?;
        ids.sort();
        let reads = ids.iter().map(|id| {
            let mut conn = self.store.conn();
            let key = self.store.keys().show(id).info;
            async move {
                conn.hmget::<_, _, (Option<String>, Option<u64>)>(key, &["kind", "total"])
                    .await
            }
        });
        let infos = try_join_all(reads).await?;
        Ok(ids
            .into_iter()
            .zip(infos)
            .filter_map(|(show, (kind, total))| {
                Some(ShowSummary {
                    show,
                    general_admission: kind? == "ga",
                    seats: total.unwrap_or(0),
                })
            })
            .collect())
    }

    /// The show's event, or UnknownShow.
    pub async fn show_event(&self, show: &ShowId) -> Result<EventId, SeatError> {
        let event: Option<String> = self
            .store
            .conn()
            .hget(self.show_keys(show).info, "event")
            .await?;
        let event = event.ok_or(SeatError::UnknownShow)?;
        Ok(EventId::parse(&event)?)
    }

    /// Checks the bearer token: signed by us, not expired, for this show's event, and its
    /// session still active. Returns the ticket.
    pub async fn authorize(
        &self,
        token: Option<&str>,
        event: &EventId,
    ) -> Result<Ticket, SeatError> {
        Ok(self.authorize_access(token, event).await?.0)
    }

    /// [`Seats::authorize`], with when the session ends (Unix ms).
    async fn authorize_access(
        &self,
        token: Option<&str>,
        event: &EventId,
    ) -> Result<(Ticket, u64), SeatError> {
        let (ticket, session_end) = self.token_access(token, event)?;
        if !self.queue.is_active(event, &ticket).await? {
            return Err(SeatError::Forbidden("the active session has ended"));
        }
        Ok((ticket, session_end))
    }

    /// The ticket of a valid token for this event (signature, expiry, event; not the session).
    pub fn token_ticket(&self, token: Option<&str>, event: &EventId) -> Result<Ticket, SeatError> {
        Ok(self.token_access(token, event)?.0)
    }

    /// The ticket of a valid token for this event and when its session ends, Unix ms.
    fn token_access(
        &self,
        token: Option<&str>,
        event: &EventId,
    ) -> Result<(Ticket, u64), SeatError> {
        let token = token.ok_or(SeatError::Unauthorized("an access token is required"))?;
        let now = now_ms() / 1000;
        let claims = self
            .queue
            .signer()
            .verify(token, now)
            .map_err(|e| match e {
                TokenError::Invalid => SeatError::Unauthorized("the access token is not valid"),
                TokenError::Expired => SeatError::Unauthorized("the access token has expired"),
            })?;
        if claims.ev != event.as_str() {
            return Err(SeatError::Forbidden(
                "the access token is for another event",
            ));
        }
        let ticket = Ticket::parse(&claims.tkt)
            .map_err(|_| SeatError::Unauthorized("the access token is not valid"))?;
        Ok((ticket, claims.exp.saturating_mul(1000)))
    }

    /// Holds seats (all or nothing) or a general-admission quantity.
    #[tracing::instrument(skip_all, fields(show = %show))]
    pub async fn hold(
        &self,
        show: &ShowId,
        token: Option<&str>,
        req: &HoldRequest,
    ) -> Result<HoldOut, SeatError> {
        let event = self.show_event(show).await?;
        let (ticket, session_end) = self.authorize_access(token, &event).await?;
        let cfg = self.queue.event_config(&event).await?;
        let wanted = Wanted::parse(req, cfg.max_seats_per_hold)?;
        let hold_id = Uuid::new_v4();
        let now = now_ms();
        // A hold ends with the session that made it, at the latest.
        let ttl_ms = (cfg.hold_ttl_seconds * 1000).min(session_end.saturating_sub(now).max(1));
        let cap = cfg.seats_per_ticket();
        let reply = self
            .run_hold(
                show,
                &hold_id,
                &ticket,
                HoldTerms { now, ttl_ms, cap },
                &wanted,
            )
            .await?;
        let available = match reply {
            HoldReply::Held { available } => available,
            HoldReply::Taken(seats) => {
                metrics::counter!(telemetry::HOLDS, "result" => "conflict").increment(1);
                return Err(SeatError::Taken(seats));
            }
            HoldReply::UnknownSeats(seats) => {
                return Err(SeatError::Invalid(format!(
                    "unknown seats: {}",
                    seats.join(", ")
                )))
            }
            HoldReply::NotEnough => {
                metrics::counter!(telemetry::HOLDS, "result" => "sold_out").increment(1);
                return Err(SeatError::SoldOut);
            }
            HoldReply::WrongKind => {
                return Err(SeatError::Invalid(
                    "this show takes the other kind of hold (seats or quantity)".into(),
                ))
            }
            HoldReply::AlreadyHolding(hold) => {
                metrics::counter!(telemetry::HOLDS, "result" => "capped").increment(1);
                return Err(SeatError::Conflict(format!(
                    "this ticket already holds seats in this show (hold {hold}): book or release that hold first"
                )));
            }
            HoldReply::OverCap(left) => {
                metrics::counter!(telemetry::HOLDS, "result" => "capped").increment(1);
                return Err(SeatError::Conflict(format!(
                    "one ticket may take at most {cap} seats of this show; {left} more allowed"
                )));
            }
        };
        metrics::counter!(telemetry::HOLDS, "result" => "held").increment(1);
        if available == 0 {
            self.refresh_sold_out(&event).await?;
        }
        let (seats, quantity) = match wanted {
            Wanted::Seats(seats) => (Some(seats), None),
            Wanted::Quantity(q) => (None, Some(q)),
        };
        Ok(HoldOut {
            hold_id: hold_id.to_string(),
            show: show.to_string(),
            seats,
            quantity,
            expires_at: rfc3339(now + ttl_ms),
        })
    }

    /// Runs `hold.lua` for one request.
    async fn run_hold(
        &self,
        show: &ShowId,
        hold_id: &Uuid,
        ticket: &Ticket,
        terms: HoldTerms,
        wanted: &Wanted,
    ) -> Result<HoldReply, SeatError> {
        let HoldTerms { now, ttl_ms, cap } = terms;
        let k = self.show_keys(show);
        let mut call = with_show_keys(&self.store.scripts().hold, &k);
        call.arg(hold_id.to_string())
            .arg(ticket.to_member())
            .arg(now)
            .arg(ttl_ms);
        match wanted {
            Wanted::Quantity(q) => {
                call.arg(q.to_string()).arg(cap);
            }
            Wanted::Seats(seats) => {
                call.arg("").arg(cap);
                for s in seats {
                    call.arg(s);
                }
            }
        }
        Ok(call.invoke_async(&mut self.store.conn()).await?)
    }

    /// Releases a hold before it lapses.
    #[tracing::instrument(skip_all, fields(show = %show))]
    pub async fn release(
        &self,
        show: &ShowId,
        hold: &str,
        token: Option<&str>,
    ) -> Result<(), SeatError> {
        let hold = parse_uuid("hold id", hold)?;
        let event = self.show_event(show).await?;
        let ticket = self.authorize(token, &event).await?;
        let k = self.show_keys(show);
        let mut call = with_show_keys(&self.store.scripts().release_hold, &k);
        let reply: ReleaseReply = call
            .arg(hold.to_string())
            .arg(ticket.to_member())
            .arg(now_ms())
            .invoke_async(&mut self.store.conn())
            .await?;
        match reply {
            ReleaseReply::Released => self.set_sold_out(&event, false).await,
            ReleaseReply::OtherTicket => {
                Err(SeatError::Forbidden("this hold belongs to another ticket"))
            }
            ReleaseReply::Booked => Err(SeatError::Conflict(
                "this hold is booked; it cannot be released".into(),
            )),
            ReleaseReply::NoHold => Err(SeatError::UnknownHold),
        }
    }

    /// Lapses expired holds of every show of `event` and updates its sold-out flag (run by the
    /// admission leader about once a second, see [`Housekeeping`]).
    pub async fn sweep_event(&self, event: &EventId) -> Result<bool, SeatError> {
        let shows: Vec<String> = self
            .store
            .conn()
            .smembers(self.store.keys().event_shows(event.as_str()))
            .await?;
        if shows.is_empty() {
            return Ok(false);
        }
        let now = now_ms();
        let sweeps = shows.iter().map(|s| {
            let k = self.store.keys().show(s);
            let mut conn = self.store.conn();
            let script = &self.store.scripts().show_sweep;
            async move {
                let mut call = with_show_keys(script, &k);
                call.arg(now).invoke_async::<Swept>(&mut conn).await
            }
        });
        let results = try_join_all(sweeps).await?;
        let sold_out = results.iter().all(|s| s.available == 0);
        self.set_sold_out(event, sold_out).await?;
        Ok(sold_out)
    }

    /// Sets the event's sold-out flag when every show has nothing available.
    async fn refresh_sold_out(&self, event: &EventId) -> Result<(), SeatError> {
        let shows: Vec<String> = self
            .store
            .conn()
            .smembers(self.store.keys().event_shows(event.as_str()))
            .await?;
        let reads = shows.iter().map(|s| {
            let mut conn = self.store.conn();
            let key = self.store.keys().show(s).info;
            async move { conn.hget::<_, _, Option<u64>>(key, "available").await }
        });
        let left: u64 = try_join_all(reads)
            .await?
            .into_iter()
            .map(|a| a.unwrap_or(0))
            .sum();
        self.set_sold_out(event, left == 0 && !shows.is_empty())
            .await
    }

    /// Sets or clears the event's sold-out flag (the line stops while it is set).
    pub async fn set_sold_out(&self, event: &EventId, sold_out: bool) -> Result<(), SeatError> {
        let () = self
            .store
            .conn()
            .hset(
                self.store.keys().event_stats(event.as_str()),
                stats::SOLD_OUT,
                if sold_out { "1" } else { "0" },
            )
            .await?;
        Ok(())
    }
}

impl Housekeeping for Seats {
    fn sweep<'a>(&'a self, event: &'a EventId) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move { Ok(self.sweep_event(event).await?) })
    }
}

/// A time in Unix ms as RFC 3339 with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The seat ids of a show spec, or the general-admission quantity.
pub fn seat_list(spec: &ShowSpec) -> Result<(Vec<String>, Option<u32>), SeatError> {
    let seats = match (&spec.seats, &spec.rows, spec.seats_per_row, spec.quantity) {
        (Some(seats), None, None, None) => seats.clone(),
        (None, Some(_), Some(per_row), None) if per_row as usize > MAX_SEATS => {
            return Err(SeatError::Invalid(format!(
                "a show has 1..={MAX_SEATS} seats"
            )));
        }
        (None, Some(rows), Some(per_row), None) => {
            let (first, last) = match rows.split_once('-') {
                Some((a, b)) => (a, b),
                None => (rows.as_str(), rows.as_str()),
            };
            let letter = |s: &str| -> Option<u8> {
                (s.len() == 1 && s.as_bytes()[0].is_ascii_uppercase()).then(|| s.as_bytes()[0])
            };
            let (Some(a), Some(b)) = (letter(first), letter(last)) else {
                return Err(SeatError::Invalid("rows must look like \"A-J\"".into()));
            };
            if a > b || per_row == 0 {
                return Err(SeatError::Invalid(
                    "rows must run forward and seats_per_row be at least 1".into(),
                ));
            }
            (a..=b)
                .flat_map(|r| (1..=per_row).map(move |n| format!("{}-{n}", r as char)))
                .collect()
        }
        (None, None, None, Some(q)) if (1..=MAX_SEATS as u32).contains(&q) => {
            return Ok((Vec::new(), Some(q)))
        }
        (None, None, None, Some(_)) => {
            return Err(SeatError::Invalid(format!(
                "quantity must be 1..={MAX_SEATS}"
            )))
        }
        _ => {
            return Err(SeatError::Invalid(
                "give seats, or rows with seats_per_row, or quantity".into(),
            ))
        }
    };
    if seats.is_empty() || seats.len() > MAX_SEATS {
        return Err(SeatError::Invalid(format!(
            "a show has 1..={MAX_SEATS} seats"
        )));
    }
    let mut uniq = Vec::with_capacity(seats.len());
    for s in &seats {
        uniq.push(SeatId::parse(s)?.into_string());
    }
    uniq.sort();
    uniq.dedup();
    if uniq.len() != seats.len() {
        return Err(SeatError::Invalid("seat ids must be unique".into()));
    }
    Ok((seats, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> ShowSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn rows_name_seats_row_dash_number() {
        let (seats, q) = seat_list(&spec(
            serde_json::json!({"event": "e", "rows": "A-B", "seats_per_row": 2}),
        ))
        .unwrap();
        assert_eq!(seats, vec!["A-1", "A-2", "B-1", "B-2"]);
        assert_eq!(q, None);
        let (seats, _) = seat_list(&spec(
            serde_json::json!({"event": "e", "rows": "C", "seats_per_row": 1}),
        ))
        .unwrap();
        assert_eq!(seats, vec!["C-1"]);
    }

    #[test]
    fn bad_show_specs_are_refused() {
        for bad in [
            serde_json::json!({"event": "e", "rows": "J-A", "seats_per_row": 2}),
            serde_json::json!({"event": "e", "rows": "a-b", "seats_per_row": 2}),
            serde_json::json!({"event": "e", "seats": ["A-1", "A-1"]}),
            serde_json::json!({"event": "e", "seats": []}),
            serde_json::json!({"event": "e", "seats": ["A_1"]}),
            serde_json::json!({"event": "e", "seats": ["A-1"], "quantity": 3}),
            serde_json::json!({"event": "e"}),
            serde_json::json!({"event": "e", "quantity": 0}),
            serde_json::json!({"event": "e", "quantity": 4_000_000_000u64}),
            serde_json::json!({"event": "e", "rows": "A-Z", "seats_per_row": 4_000_000_000u64}),
        ] {
            assert!(seat_list(&spec(bad.clone())).is_err(), "{bad} accepted");
        }
        assert_eq!(
            seat_list(&spec(serde_json::json!({"event": "e", "quantity": 50})))
                .unwrap()
                .1,
            Some(50)
        );
    }

    #[test]
    fn expiry_is_rfc3339_with_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }
}
