//! Seats: shows and their seat maps, holds, and confirming a hold into a booking.
//!
//! Redis holds the fast, atomic view (one Lua script per step, all of a show's keys under one
//! hash tag); PostgreSQL, fed through Kafka, is the truth. The invariant this module keeps: a
//! 201 for a booking is sent only after Kafka acknowledged it — if that fails, the Redis step is
//! undone and the answer is 503, so nothing is sold that is not on its way to the ledger.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use futures::future::try_join_all;
use redis::{AsyncCommands as _, RedisError, Value};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::auth::TokenError;
use crate::booking::producer::BookingProducer;
use crate::booking::{repo, BookingError, BookingMessage};
use crate::ids::{parse_uuid, BadId, EventId, SeatId, ShowId, Ticket};
use crate::queue::{now_ms, Queue, QueueError};
use crate::redis::keys::ShowKeys;
use crate::redis::scripts::with_show_keys;
use crate::telemetry;

/// How long a booking's pending record stays in Redis (it only answers GET until the ledger has
/// the booking; the ledger normally takes milliseconds).
const PENDING_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
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
    /// No such booking.
    #[error("no such booking")]
    UnknownBooking,
    /// The request is malformed for this show.
    #[error("{0}")]
    Invalid(String),
    /// Some seats are held or sold: nothing was held.
    #[error("some seats are no longer available")]
    Taken(Vec<String>),
    /// General admission: fewer places left than asked for.
    #[error("not enough places left")]
    SoldOut,
    /// The hold lapsed or was released.
    #[error("the hold has expired or was released")]
    HoldExpired,
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
    /// Kafka did not take the booking.
    #[error("{0}")]
    Kafka(String),
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
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Serialize)]
pub struct ShowOut {
    /// Show id.
    pub show: String,
    /// Event id.
    pub event: String,
    /// Seats, or places for general admission.
    pub seat_count: u64,
    /// `seated` or `ga`.
    pub kind: &'static str,
}

/// One seat's state.
#[derive(Debug, Clone, Serialize)]
pub struct SeatState {
    /// Seat id.
    pub id: String,
    /// `available`, `held` or `sold`.
    pub state: &'static str,
}

/// `GET /v1/shows/{show}/seats`.
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// Seats to hold (seated show).
    pub seats: Option<Vec<String>>,
    /// Places to hold (general admission).
    pub quantity: Option<u32>,
}

/// A hold made.
#[derive(Debug, Clone, Serialize)]
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

/// A booking as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct BookingOut {
    /// Booking id.
    pub booking_id: String,
    /// Show id.
    pub show: String,
    /// Seats (seated show).
    pub seats: Vec<String>,
    /// Places (general admission).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantity: Option<u32>,
    /// `pending`, `confirmed` or `rejected`.
    pub status: String,
}

/// A hold's record in Redis (see lua/show_lib.lua).
#[derive(Debug, Clone, Deserialize)]
struct HoldRec {
    ticket: String,
    #[serde(default)]
    seats: Option<Vec<String>>,
    #[serde(default)]
    quantity: Option<u32>,
}

/// A booking's pending record in Redis.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    show: String,
    seats: Vec<String>,
    quantity: u32,
}

/// Seats, holds and bookings.
pub struct Sales {
    /// The waiting room (Redis handles, scripts, events, signer).
    pub queue: Arc<Queue>,
    /// The ledger.
    pub db: PgPool,
    /// Kafka.
    pub producer: BookingProducer,
}

impl Sales {
    fn show_keys(&self, show: &ShowId) -> ShowKeys {
        self.queue.keys.show(show.as_str())
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
        let mut call = with_show_keys(&self.queue.scripts.show_setup, &k);
        call.key(&k.order).arg(event.as_str()).arg(kind).arg(total);
        for s in &seats {
            call.arg(s);
        }
        let (created, _): (i64, Value) = call.invoke_async(&mut self.queue.conn.clone()).await?;
        let _: i64 = self
            .queue
            .conn
            .clone()
            .sadd(self.queue.keys.event_shows(event.as_str()), show.as_str())
            .await?;
        if created == 1 && total > 0 {
            self.set_sold_out(&event, false).await?;
        }
        Ok((
            ShowOut {
                show: show.to_string(),
                event: event.to_string(),
                seat_count: total,
                kind,
            },
            created == 1,
        ))
    }

    /// The seat map, from Redis.
    pub async fn seats(&self, show: &ShowId) -> Result<SeatMap, SeatError> {
        let k = self.show_keys(show);
        let mut call = with_show_keys(&self.queue.scripts.show_view, &k);
        let (event, kind, total, available, _sold, flat): (
            String,
            String,
            u64,
            u64,
            u64,
            Vec<String>,
        ) = call
            .key(&k.order)
            .arg(now_ms())
            .invoke_async(&mut self.queue.conn.clone())
            .await?;
        if event.is_empty() {
            return Err(SeatError::UnknownShow);
        }
        let seats = flat
            .chunks(2)
            .map(|c| SeatState {
                id: c[0].clone(),
                state: match c.get(1).map(String::as_str) {
                    Some("") | None => "available",
                    Some(s) if s.starts_with("s:") => "sold",
                    Some(_) => "held",
                },
            })
            .collect();
        Ok(SeatMap {
            show: show.to_string(),
            event,
            available,
            seats,
            quantity: (kind == "ga").then_some(total),
        })
    }

    /// The show's event, or UnknownShow.
    async fn show_event(&self, show: &ShowId) -> Result<EventId, SeatError> {
        let event: Option<String> = self
            .queue
            .conn
            .clone()
            .hget(self.show_keys(show).info, "event")
            .await?;
        let event = event.ok_or(SeatError::UnknownShow)?;
        Ok(EventId::parse(&event)?)
    }

    /// Checks the bearer token: signed by us, not expired, for this show's event, and its
    /// session still active. Returns the ticket.
    async fn authorize(&self, token: Option<&str>, event: &EventId) -> Result<Ticket, SeatError> {
        let ticket = self.token_ticket(token, event)?;
        if !self.queue.is_active(event, &ticket).await? {
            return Err(SeatError::Forbidden("the active session has ended"));
        }
        Ok(ticket)
    }

    /// The ticket of a valid token for this event (signature, expiry, event; not the session).
    fn token_ticket(&self, token: Option<&str>, event: &EventId) -> Result<Ticket, SeatError> {
        let token = token.ok_or(SeatError::Unauthorized("an access token is required"))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let claims = self.queue.signer.verify(token, now).map_err(|e| match e {
            TokenError::Invalid => SeatError::Unauthorized("the access token is not valid"),
            TokenError::Expired => SeatError::Unauthorized("the access token has expired"),
        })?;
        if claims.ev != event.as_str() {
            return Err(SeatError::Forbidden(
                "the access token is for another event",
            ));
        }
        Ticket::parse(&claims.tkt)
            .map_err(|_| SeatError::Unauthorized("the access token is not valid"))
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
        let ticket = self.authorize(token, &event).await?;
        let cfg = self.queue.event_config(&event).await?;
        let max = cfg.max_seats_per_hold as usize;
        let (seats, quantity) = match (&req.seats, req.quantity) {
            (Some(seats), None) => {
                let mut ids = Vec::with_capacity(seats.len());
                for s in seats {
                    ids.push(SeatId::parse(s)?.into_string());
                }
                let mut uniq = ids.clone();
                uniq.sort();
                uniq.dedup();
                if ids.is_empty() || uniq.len() != ids.len() {
                    return Err(SeatError::Invalid(
                        "seats must be a non-empty list without duplicates".into(),
                    ));
                }
                if ids.len() > max {
                    return Err(SeatError::Invalid(format!("at most {max} seats per hold")));
                }
                (ids, None)
            }
            (None, Some(q)) if (1..=max as u32).contains(&q) => (Vec::new(), Some(q)),
            (None, Some(_)) => {
                return Err(SeatError::Invalid(format!("quantity must be 1..={max}")))
            }
            _ => return Err(SeatError::Invalid("give either seats or quantity".into())),
        };
        let hold_id = Uuid::new_v4();
        let now = now_ms();
        let ttl_ms = cfg.hold_ttl_seconds * 1000;
        let k = self.show_keys(show);
        let mut call = with_show_keys(&self.queue.scripts.hold, &k);
        call.arg(hold_id.to_string())
            .arg(ticket.to_member())
            .arg(now)
            .arg(ttl_ms)
            .arg(quantity.map(|q| q.to_string()).unwrap_or_default());
        for s in &seats {
            call.arg(s);
        }
        let reply: Vec<Value> = call.invoke_async(&mut self.queue.conn.clone()).await?;
        let code: i64 = reply
            .first()
            .map(|v| redis::from_redis_value(v.clone()))
            .transpose()?
            .unwrap_or(-9);
        let rest = || -> Vec<String> {
            reply[1..]
                .iter()
                .filter_map(|v| redis::from_redis_value(v.clone()).ok())
                .collect()
        };
        let result = match code {
            1 => "held",
            0 => {
                metrics::counter!(telemetry::HOLDS, "result" => "conflict").increment(1);
                return Err(SeatError::Taken(rest()));
            }
            -1 => {
                return Err(SeatError::Invalid(format!(
                    "unknown seats: {}",
                    rest().join(", ")
                )))
            }
            -2 => {
                metrics::counter!(telemetry::HOLDS, "result" => "sold_out").increment(1);
                return Err(SeatError::SoldOut);
            }
            _ => {
                return Err(SeatError::Invalid(
                    "this show takes the other kind of hold (seats or quantity)".into(),
                ))
            }
        };
        metrics::counter!(telemetry::HOLDS, "result" => result).increment(1);
        let available: u64 = reply
            .get(1)
            .map(|v| redis::from_redis_value(v.clone()))
            .transpose()?
            .unwrap_or(0);
        if available == 0 {
            self.refresh_sold_out(&event).await?;
        }
        Ok(HoldOut {
            hold_id: hold_id.to_string(),
            show: show.to_string(),
            seats: quantity.is_none().then_some(seats),
            quantity,
            expires_at: rfc3339(now + ttl_ms),
        })
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
        let mut call = with_show_keys(&self.queue.scripts.release_hold, &k);
        let reply: Vec<i64> = call
            .arg(hold.to_string())
            .arg(ticket.to_member())
            .arg(now_ms())
            .invoke_async(&mut self.queue.conn.clone())
            .await?;
        match reply.first().copied() {
            Some(1) => {
                self.set_sold_out(&event, false).await?;
                Ok(())
            }
            Some(-1) => Err(SeatError::Forbidden("this hold belongs to another ticket")),
            Some(-2) => Err(SeatError::Conflict(
                "this hold is booked; it cannot be released".into(),
            )),
            _ => Err(SeatError::UnknownHold),
        }
    }

    /// Confirms a hold: marks its seats sold in Redis, makes the booking durable in Kafka, then
    /// answers. If Kafka does not acknowledge, the Redis step is undone and the caller gets 503.
    #[tracing::instrument(skip_all, fields(show = %show))]
    pub async fn book(
        &self,
        show: &ShowId,
        token: Option<&str>,
        hold: &str,
    ) -> Result<BookingOut, SeatError> {
        let hold = parse_uuid("hold_id", hold)?;
        let event = self.show_event(show).await?;
        let ticket = self.token_ticket(token, &event)?;
        let booking_id = self.queue.signer.booking_id(&hold);
        let k = self.show_keys(show);
        // A new booking needs a live session; repeating a booking already made does not (the
        // purchase ended the session), so the retry gets the same booking back.
        if !self.queue.is_active(&event, &ticket).await? {
            let raw: Option<String> = self
                .queue
                .conn
                .clone()
                .hget(&k.holdrec, hold.to_string())
                .await?;
            let booked_by_me = raw
                .and_then(|r| serde_json::from_str::<serde_json::Value>(&r).ok())
                .is_some_and(|h| {
                    h["ticket"] == ticket.to_member().as_str() && h["booking"].is_string()
                });
            if !booked_by_me {
                return Err(SeatError::Forbidden("the active session has ended"));
            }
        }
        let mut call = with_show_keys(&self.queue.scripts.book, &k);
        let reply: Vec<Value> = call
            .arg(hold.to_string())
            .arg(ticket.to_member())
            .arg(now_ms())
            .arg(booking_id.to_string())
            .invoke_async(&mut self.queue.conn.clone())
            .await?;
        let code: i64 = reply
            .first()
            .map(|v| redis::from_redis_value(v.clone()))
            .transpose()?
            .unwrap_or(0);
        match code {
            1 | 2 => {}
            -1 => return Err(SeatError::Forbidden("this hold belongs to another ticket")),
            _ => {
                metrics::counter!(telemetry::BOOKINGS_API, "status" => "expired").increment(1);
                return Err(SeatError::HoldExpired);
            }
        }
        let raw: String = redis::from_redis_value(reply[1].clone())?;
        let rec: HoldRec =
            serde_json::from_str(&raw).map_err(|e| SeatError::Invalid(e.to_string()))?;
        let msg = BookingMessage {
            booking_id: booking_id.to_string(),
            show: show.to_string(),
            event: event.to_string(),
            ticket: rec.ticket.clone(),
            seats: rec.seats.clone().unwrap_or_default(),
            quantity: rec.quantity.unwrap_or(0),
        };
        // A replay (code 2) publishes again: the first attempt may have died before Kafka had it.
        // The ledger applies a booking id once, so a second copy is harmless.
        let started = std::time::Instant::now();
        if let Err(e) = self.producer.publish(&msg).await {
            if code == 1 {
                let mut undo = with_show_keys(&self.queue.scripts.unbook, &k);
                let undone: Result<i64, _> = undo
                    .arg(hold.to_string())
                    .arg(booking_id.to_string())
                    .invoke_async(&mut self.queue.conn.clone())
                    .await;
                if let Err(re) = undone {
                    tracing::error!(error = %re, booking = %booking_id,
                        "booking neither durable nor undone in Redis; reconcile will free its seats");
                }
            }
            metrics::counter!(telemetry::BOOKINGS_API, "status" => "unavailable").increment(1);
            let BookingError::Kafka(reason) = e else {
                unreachable!("publish fails only with Kafka")
            };
            return Err(SeatError::Kafka(reason));
        }
        metrics::histogram!(telemetry::KAFKA_PRODUCE_LATENCY)
            .record(started.elapsed().as_secs_f64());
        let pending = Pending {
            show: msg.show.clone(),
            seats: msg.seats.clone(),
            quantity: msg.quantity,
        };
        let () = self
            .queue
            .conn
            .clone()
            .set_ex(
                self.queue.keys.booking(&msg.booking_id),
                serde_json::to_string(&pending).expect("json"),
                PENDING_TTL.as_secs(),
            )
            .await?;
        // The sale is made: the buyer's slot goes to the next person in line.
        self.queue.end_session(&event, &ticket).await?;
        metrics::counter!(telemetry::BOOKINGS_API, "status" => if code == 1 { "pending" } else { "replayed" }).increment(1);
        let status = match repo::find(&self.db, booking_id).await {
            Ok(Some(row)) => row.status,
            _ => "pending".to_owned(),
        };
        Ok(BookingOut {
            booking_id: msg.booking_id,
            show: msg.show,
            seats: msg.seats,
            quantity: rec.quantity,
            status,
        })
    }

    /// A booking: from the ledger when it has it, else pending when Kafka has it.
    pub async fn booking(&self, id: &str) -> Result<BookingOut, SeatError> {
        let uuid = parse_uuid("booking id", id)?;
        if let Some(row) = repo::find(&self.db, uuid).await? {
            return Ok(BookingOut {
                booking_id: uuid.to_string(),
                show: row.show,
                seats: row.seats,
                quantity: (row.quantity > 0).then_some(row.quantity as u32),
                status: row.status,
            });
        }
        let raw: Option<String> = self
            .queue
            .conn
            .clone()
            .get(self.queue.keys.booking(&uuid.to_string()))
            .await?;
        let p: Pending = raw
            .and_then(|r| serde_json::from_str(&r).ok())
            .ok_or(SeatError::UnknownBooking)?;
        Ok(BookingOut {
            booking_id: uuid.to_string(),
            show: p.show,
            seats: p.seats,
            quantity: (p.quantity > 0).then_some(p.quantity),
            status: "pending".into(),
        })
    }

    /// Aligns Redis with the ledger after it rejected a booking.
    pub async fn settle_rejected(
        &self,
        b: &BookingMessage,
        truth: &[(String, Option<Uuid>)],
    ) -> Result<(), SeatError> {
        let show = ShowId::parse(&b.show)?;
        let mut args: Vec<String> = Vec::new();
        if b.seats.is_empty() {
            args.extend(["#ga".to_owned(), b.quantity.to_string()]);
        } else {
            for (seat, sold_by) in truth {
                args.push(seat.clone());
                args.push(sold_by.map(|id| format!("s:{id}")).unwrap_or_default());
            }
        }
        self.settle(&show, &args).await?;
        self.set_sold_out(&EventId::parse(&b.event)?, false).await
    }

    async fn settle(&self, show: &ShowId, pairs: &[String]) -> Result<u64, SeatError> {
        let k = self.show_keys(show);
        let mut call = with_show_keys(&self.queue.scripts.settle, &k);
        call.arg(now_ms());
        for a in pairs {
            call.arg(a);
        }
        Ok(call.invoke_async(&mut self.queue.conn.clone()).await?)
    }

    /// Compares Redis's sold marks with the ledger for every show; with `repair`, rewrites Redis
    /// from the ledger (the source of truth). Returns the drift found: (show, seat, redis, ledger).
    pub async fn reconcile(&self, repair: bool) -> Result<Vec<Drift>, SeatError> {
        let mut drift = Vec::new();
        for show in repo::shows(&self.db).await? {
            let show = ShowId::parse(&show)?;
            let map = match self.raw_states(&show).await {
                Ok(m) => m,
                Err(SeatError::UnknownShow) => continue,
                Err(e) => return Err(e),
            };
            let ledger: std::collections::HashMap<String, Uuid> =
                repo::sold_seats(&self.db, show.as_str())
                    .await?
                    .into_iter()
                    .collect();
            let mut pairs = Vec::new();
            for (seat, state) in map {
                let redis_sold = state.strip_prefix("s:").map(str::to_owned);
                let ledger_sold = ledger.get(&seat).map(Uuid::to_string);
                if redis_sold != ledger_sold {
                    drift.push(Drift {
                        show: show.to_string(),
                        seat: seat.clone(),
                        redis: if state.is_empty() {
                            "available".into()
                        } else {
                            state.clone()
                        },
                        ledger: ledger_sold
                            .clone()
                            .map(|b| format!("sold:{b}"))
                            .unwrap_or_else(|| "available".into()),
                    });
                    pairs.push(seat);
                    pairs.push(ledger_sold.map(|b| format!("s:{b}")).unwrap_or_default());
                }
            }
            if repair && !pairs.is_empty() {
                self.settle(&show, &pairs).await?;
            }
        }
        Ok(drift)
    }

    async fn raw_states(&self, show: &ShowId) -> Result<Vec<(String, String)>, SeatError> {
        let k = self.show_keys(show);
        let kind: Option<String> = self.queue.conn.clone().hget(&k.info, "kind").await?;
        match kind.as_deref() {
            None => Err(SeatError::UnknownShow),
            Some("ga") => Ok(Vec::new()),
            Some(_) => Ok(self
                .queue
                .conn
                .clone()
                .hgetall::<_, Vec<(String, String)>>(&k.seats)
                .await?),
        }
    }

    /// Lapses expired holds of every show of `event` and updates its sold-out flag (run by the
    /// admission leader about once a second).
    pub async fn sweep_event(&self, event: &EventId) -> Result<bool, SeatError> {
        let shows: Vec<String> = self
            .queue
            .conn
            .clone()
            .smembers(self.queue.keys.event_shows(event.as_str()))
            .await?;
        if shows.is_empty() {
            return Ok(false);
        }
        let now = now_ms();
        let sweeps = shows.iter().map(|s| {
            let k = self.queue.keys.show(s);
            let mut conn = self.queue.conn.clone();
            let script = &self.queue.scripts.show_sweep;
            async move {
                let mut call = with_show_keys(script, &k);
                call.arg(now).invoke_async::<(u64, u64)>(&mut conn).await
            }
        });
        let results = try_join_all(sweeps).await?;
        let sold_out = results.iter().all(|(_, available)| *available == 0);
        self.set_sold_out(event, sold_out).await?;
        Ok(sold_out)
    }

    /// Sets the event's sold-out flag when every show has nothing available.
    async fn refresh_sold_out(&self, event: &EventId) -> Result<(), SeatError> {
        let shows: Vec<String> = self
            .queue
            .conn
            .clone()
            .smembers(self.queue.keys.event_shows(event.as_str()))
            .await?;
        let reads = shows.iter().map(|s| {
            let mut conn = self.queue.conn.clone();
            let key = self.queue.keys.show(s).info;
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

    async fn set_sold_out(&self, event: &EventId, sold_out: bool) -> Result<(), SeatError> {
        let () = self
            .queue
            .conn
            .clone()
            .hset(
                self.queue.keys.event_stats(event.as_str()),
                "sold_out",
                if sold_out { "1" } else { "0" },
            )
            .await?;
        Ok(())
    }
}

/// A seat whose state differs between Redis and the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drift {
    /// Show.
    pub show: String,
    /// Seat.
    pub seat: String,
    /// Redis's state.
    pub redis: String,
    /// The ledger's state.
    pub ledger: String,
}

fn rfc3339(ms: u64) -> String {
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
