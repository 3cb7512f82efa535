//! [`Bookings`]: a hold becoming a booking — authorize, mark sold in Redis, publish to Kafka or
//! undo, finish — and what follows from the ledger: settling rejected bookings into Redis,
//! answering a booking's status, and reconciling Redis with PostgreSQL.
//!
//! The invariant this module keeps: a 201 for a booking is sent only after Kafka acknowledged
//! it — if that fails, the Redis step is undone and the answer is 503, so nothing is sold that
//! is not on its way to the ledger.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands as _;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::producer::BookingProducer;
use super::{repo, BookingError, BookingMessage};
use crate::ids::{parse_uuid, EventId, ShowId, Ticket};
use crate::queue::{now_ms, Queue};
use crate::redis::replies::BookReply;
use crate::redis::scripts::with_show_keys;
use crate::redis::Store;
use crate::seats::{self, Seats};
use crate::telemetry;

/// How long a booking's pending record stays in Redis (it only answers GET until the ledger has
/// the booking; the ledger normally takes milliseconds).
const PENDING_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// A booking as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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

/// A hold's record in Redis (see lua/show_lib.lua).
#[derive(Debug, Clone, Deserialize)]
struct HoldRec {
    ticket: String,
    #[serde(default)]
    seats: Option<Vec<String>>,
    #[serde(default)]
    quantity: Option<u32>,
    #[serde(default)]
    booking: Option<String>,
}

impl HoldRec {
    fn parse(raw: &str) -> Result<Self, BookingError> {
        serde_json::from_str(raw).map_err(|e| BookingError::Invalid(e.to_string()))
    }
}

/// A booking's pending record in Redis.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    show: String,
    seats: Vec<String>,
    quantity: u32,
}

/// Who books what: the checked request.
struct Request {
    show: ShowId,
    event: EventId,
    ticket: Ticket,
    hold: Uuid,
    booking_id: Uuid,
}

/// Bookings: from a hold to Kafka, and back from the ledger to Redis.
pub struct Bookings {
    store: Arc<Store>,
    queue: Arc<Queue>,
    seats: Arc<Seats>,
    db: PgPool,
    producer: BookingProducer,
}

impl Bookings {
    /// The booking service over the shared store, the waiting room, the seats, the ledger's
    /// database and the bookings topic.
    pub fn new(
        store: Arc<Store>,
        queue: Arc<Queue>,
        seats: Arc<Seats>,
        db: PgPool,
        producer: BookingProducer,
    ) -> Self {
        Bookings {
            store,
            queue,
            seats,
            db,
            producer,
        }
    }

    /// The ledger's database.
    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// Confirms a hold: marks its seats sold in Redis, makes the booking durable in Kafka, then
    /// answers. If Kafka does not acknowledge, the Redis step is undone and the caller gets 503.
    #[tracing::instrument(skip_all, fields(show = %show))]
    pub async fn book(
        &self,
        show: &ShowId,
        token: Option<&str>,
        hold: &str,
    ) -> Result<BookingOut, BookingError> {
        let req = self.authorize(show, token, hold).await?;
        let (rec, fresh) = self.mark_sold(&req).await?;
        let msg = BookingMessage {
            booking_id: req.booking_id.to_string(),
            show: show.to_string(),
            event: req.event.to_string(),
            ticket: rec.ticket.clone(),
            seats: rec.seats.clone().unwrap_or_default(),
            quantity: rec.quantity.unwrap_or(0),
        };
        self.publish_or_undo(&req, &msg, fresh).await?;
        self.finish(&req, msg, rec.quantity, fresh).await
    }

    /// Step 1: the hold id, the show's event, and a token for it. A new booking needs a live
    /// session; repeating a booking already made does not (the purchase ended the session), so
    /// the retry gets the same booking back.
    async fn authorize(
        &self,
        show: &ShowId,
        token: Option<&str>,
        hold: &str,
    ) -> Result<Request, BookingError> {
        let hold = parse_uuid("hold_id", hold)?;
        let event = self.seats.show_event(show).await?;
        let ticket = self.seats.token_ticket(token, &event)?;
        if !self.queue.is_active(&event, &ticket).await? {
            let raw: Option<String> = self
                .store
                .conn()
                .hget(
                    self.store.keys().show(show.as_str()).holdrec,
                    hold.to_string(),
                )
                .await?;
            let booked_by_me = raw
                .and_then(|r| HoldRec::parse(&r).ok())
                .is_some_and(|h| h.ticket == ticket.to_member() && h.booking.is_some());
            if !booked_by_me {
                return Err(BookingError::Forbidden("the active session has ended"));
            }
        }
        Ok(Request {
            show: show.clone(),
            booking_id: self.queue.signer().booking_id(&hold),
            event,
            ticket,
            hold,
        })
    }

    /// Step 2: `book.lua` marks the hold's seats sold. Returns the hold record and whether it
    /// was marked now (false: booked before, the same booking again).
    async fn mark_sold(&self, req: &Request) -> Result<(HoldRec, bool), BookingError> {
        let k = self.store.keys().show(req.show.as_str());
        let mut call = with_show_keys(&self.store.scripts().book, &k);
        let reply: BookReply = call
            .arg(req.hold.to_string())
            .arg(req.ticket.to_member())
            .arg(now_ms())
            .arg(req.booking_id.to_string())
            .invoke_async(&mut self.store.conn())
            .await?;
        match reply {
            BookReply::Marked(raw) => Ok((HoldRec::parse(&raw)?, true)),
            BookReply::AlreadyBooked(raw) => Ok((HoldRec::parse(&raw)?, false)),
            BookReply::OtherTicket => Err(BookingError::Forbidden(
                "this hold belongs to another ticket",
            )),
            BookReply::NoHold => {
                metrics::counter!(telemetry::BOOKINGS_API, "status" => "expired").increment(1);
                Err(BookingError::HoldExpired)
            }
        }
    }

    /// Step 3: publish, and wait for the broker's acknowledgement. A replay publishes again:
    /// the first attempt may have died before Kafka had it; the ledger applies a booking id
    /// once, so a second copy is harmless. When Kafka does not acknowledge a booking marked
    /// now, the mark is undone.
    async fn publish_or_undo(
        &self,
        req: &Request,
        msg: &BookingMessage,
        fresh: bool,
    ) -> Result<(), BookingError> {
        let started = Instant::now();
        let Err(e) = self.producer.publish(msg).await else {
            metrics::histogram!(telemetry::KAFKA_PRODUCE_LATENCY)
                .record(started.elapsed().as_secs_f64());
            return Ok(());
        };
        if fresh {
            let k = self.store.keys().show(req.show.as_str());
            let mut undo = with_show_keys(&self.store.scripts().unbook, &k);
            let undone: Result<i64, _> = undo
                .arg(req.hold.to_string())
                .arg(req.booking_id.to_string())
                .invoke_async(&mut self.store.conn())
                .await;
            if let Err(re) = undone {
                tracing::error!(error = %re, booking = %req.booking_id,
                    "booking neither durable nor undone in Redis; reconcile will free its seats");
            }
        }
        metrics::counter!(telemetry::BOOKINGS_API, "status" => "unavailable").increment(1);
        Err(e)
    }

    /// Step 4: record the booking as pending (answers GET until the ledger has it), end the
    /// buyer's session so the slot goes to the next person, and answer.
    async fn finish(
        &self,
        req: &Request,
        msg: BookingMessage,
        quantity: Option<u32>,
        fresh: bool,
    ) -> Result<BookingOut, BookingError> {
        let pending = Pending {
            show: msg.show.clone(),
            seats: msg.seats.clone(),
            quantity: msg.quantity,
        };
        let () = self
            .store
            .conn()
            .set_ex(
                self.store.keys().booking(&msg.booking_id),
                serde_json::to_string(&pending).expect("json"),
                PENDING_TTL.as_secs(),
            )
            .await?;
        self.queue.end_session(&req.event, &req.ticket).await?;
        metrics::counter!(telemetry::BOOKINGS_API, "status" => if fresh { "pending" } else { "replayed" })
            .increment(1);
        let status = match repo::find(&self.db, req.booking_id).await {
            Ok(Some(row)) => row.status,
            _ => "pending".to_owned(),
        };
        Ok(BookingOut {
            booking_id: msg.booking_id,
            show: msg.show,
            seats: msg.seats,
            quantity,
            status,
        })
    }

    /// A booking: from the ledger when it has it, else pending when Kafka has it.
    pub async fn booking(&self, id: &str) -> Result<BookingOut, BookingError> {
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
            .store
            .conn()
            .get(self.store.keys().booking(&uuid.to_string()))
            .await?;
        let p: Pending = raw
            .and_then(|r| serde_json::from_str(&r).ok())
            .ok_or(BookingError::UnknownBooking)?;
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
    ) -> Result<(), BookingError> {
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
        Ok(self
            .seats
            .set_sold_out(&EventId::parse(&b.event)?, false)
            .await?)
    }

    /// Runs `settle.lua` with (seat, state) pairs.
    async fn settle(&self, show: &ShowId, pairs: &[String]) -> Result<u64, BookingError> {
        let k = self.store.keys().show(show.as_str());
        let mut call = with_show_keys(&self.store.scripts().settle, &k);
        call.arg(now_ms());
        for a in pairs {
            call.arg(a);
        }
        Ok(call.invoke_async(&mut self.store.conn()).await?)
    }

    /// Compares Redis's sold marks with the ledger for every show; with `repair`, rewrites Redis
    /// from the ledger (the source of truth). Returns the drift found: (show, seat, redis, ledger).
    pub async fn reconcile(&self, repair: bool) -> Result<Vec<Drift>, BookingError> {
        let mut drift = Vec::new();
        for show in seats::repo::shows(&self.db).await? {
            let show = ShowId::parse(&show)?;
            let Some(states) = self.raw_states(&show).await? else {
                continue;
            };
            let ledger: HashMap<String, Uuid> = repo::sold_seats(&self.db, show.as_str())
                .await?
                .into_iter()
                .collect();
            let (found, pairs) = compare(&show, states, &ledger);
            drift.extend(found);
            if repair && !pairs.is_empty() {
                self.settle(&show, &pairs).await?;
            }
        }
        Ok(drift)
    }

    /// Every seat's raw state in Redis; empty for general admission, `None` for a show Redis
    /// does not know.
    async fn raw_states(
        &self,
        show: &ShowId,
    ) -> Result<Option<Vec<(String, String)>>, BookingError> {
        let k = self.store.keys().show(show.as_str());
        let kind: Option<String> = self.store.conn().hget(&k.info, "kind").await?;
        match kind.as_deref() {
            None => Ok(None),
            Some("ga") => Ok(Some(Vec::new())),
            Some(_) => Ok(Some(
                self.store
                    .conn()
                    .hgetall::<_, Vec<(String, String)>>(&k.seats)
                    .await?,
            )),
        }
    }
}

/// The seats whose Redis state differs from the ledger's, and the (seat, state) pairs that
/// would write the ledger's state into Redis.
fn compare(
    show: &ShowId,
    states: Vec<(String, String)>,
    ledger: &HashMap<String, Uuid>,
) -> (Vec<Drift>, Vec<String>) {
    let (mut drift, mut pairs) = (Vec::new(), Vec::new());
    for (seat, state) in states {
        let redis_sold = state.strip_prefix("s:").map(str::to_owned);
        let ledger_sold = ledger.get(&seat).map(Uuid::to_string);
        if redis_sold == ledger_sold {
            continue;
        }
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
    (drift, pairs)
}
