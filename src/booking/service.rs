//! [`Bookings`]: a hold becoming a booking — authorize, mark sold in Redis, publish to Kafka or
//! undo, finish — and what follows from the ledger: settling rejected bookings into Redis,
//! answering a booking's status, and reconciling Redis with PostgreSQL.
//!
//! The promises this module keeps (docs/reliability.md):
//! - a 201 is sent only after the sold mark reached a replica (`WAIT`) and Kafka acknowledged
//!   the booking;
//! - nothing is undone on a guess: once publication was attempted, the outcome is the ledger's.
//!   An unknown outcome answers 503 with the booking id, and the booking's intent record makes
//!   the admission leader's sweeper publish it again until Kafka has it;
//! - the critical section (mark, wait, publish) runs in its own task: a dropped request does not
//!   cut it short, and a crashed process leaves an intent the sweeper resolves.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redis::AsyncCommands as _;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::producer::BookingProducer;
use super::{repo, BookingError, BookingMessage};
use crate::ids::{parse_uuid, EventId, ShowId, Ticket};
use crate::queue::admission::Housekeeping;
use crate::queue::{now_ms, Queue};
use crate::redis::replies::BookReply;
use crate::redis::scripts::with_show_keys;
use crate::redis::Store;
use crate::seats::{self, Seats};
use crate::telemetry;

/// How long a booking's pending record stays in Redis (it only answers GET until the ledger has
/// the booking; the ledger normally takes milliseconds).
const PENDING_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How old a booking's intent must be before the sweeper publishes it again (the request that
/// made it has had its chance: the Kafka ack timeout is below this by default).
pub const INTENT_GRACE: Duration = Duration::from_secs(10);

/// What a 201 waits for besides Kafka: `replicas` replicas of the show's primary acknowledging
/// the sold mark, within `wait` (`WAITROOM_BOOKING_REPLICAS`, `WAITROOM_BOOKING_WAIT_MS`).
#[derive(Debug, Clone, Copy)]
pub struct Durability {
    /// Replicas that must have the mark (0: do not wait, for a Redis without replicas).
    pub replicas: u32,
    /// How long to wait for them.
    pub wait: Duration,
}

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
    /// What reconcile did or would do: `would repair`, `repaired`, or `left: <why>`.
    pub action: String,
}

/// How long one sweep may spend publishing intents again (it runs in the admission tick).
const INTENT_SWEEP_BUDGET: Duration = Duration::from_millis(250);

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
    /// The attempt whose mark this is, until a repeat or the sweeper adopts it (book.lua).
    #[serde(default)]
    attempt: Option<String>,
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
    durability: Durability,
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
        durability: Durability,
    ) -> Self {
        Bookings {
            store,
            queue,
            seats,
            db,
            producer,
            durability,
        }
    }

    /// The ledger's database.
    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// The signer of booking messages (the ledger checks them with it).
    pub fn signer(&self) -> &crate::auth::Signer {
        self.queue.signer()
    }

    /// Writes the confirmed bookings' sold marks into Redis again: a no-op normally, and the
    /// repair when a failover promoted a replica that had not received a mark (a hold that took
    /// such a seat meanwhile loses it, and its booking answers 409 `hold_expired`).
    /// At most `chunk` seats per script run.
    pub async fn mark_confirmed(
        &self,
        confirmed: &[BookingMessage],
        chunk: usize,
    ) -> Result<(), BookingError> {
        let mut by_show: HashMap<&str, Vec<String>> = HashMap::new();
        for b in confirmed.iter().filter(|b| !b.seats.is_empty()) {
            let pairs = by_show.entry(b.show.as_str()).or_default();
            for seat in &b.seats {
                pairs.push(seat.clone());
                pairs.push(format!("s:{}", b.booking_id));
            }
        }
        for (show, pairs) in by_show {
            let show = ShowId::parse(show)?;
            for part in pairs.chunks(chunk.max(1) * 2) {
                self.settle(&show, part).await?;
            }
        }
        Ok(())
    }

    /// Confirms a hold. The request checks the token; the rest runs in a task of its own that
    /// the request only awaits (see the module's promises).
    #[tracing::instrument(skip_all, fields(show = %show))]
    pub async fn book(
        self: &Arc<Self>,
        show: &ShowId,
        token: Option<&str>,
        hold: &str,
    ) -> Result<BookingOut, BookingError> {
        let req = self.authorize(show, token, hold).await?;
        let booking_id = req.booking_id.to_string();
        let this = Arc::clone(self);
        match tokio::spawn(async move { this.commit(req).await }).await {
            Ok(done) => done,
            // The task panicked: whatever it did is in Redis, and the sweeper finishes it.
            Err(e) => {
                tracing::error!(error = %e, booking = %booking_id, "booking task failed");
                Err(BookingError::Unknown { booking_id })
            }
        }
    }

    /// The critical section: mark sold, make the mark survive a failover, record the booking as
    /// pending, publish, drop the intent, finish.
    async fn commit(&self, req: Request) -> Result<BookingOut, BookingError> {
        // This attempt's own id: an undo undoes this attempt's mark only (see unbook.lua).
        let attempt = uuid::Uuid::new_v4().simple().to_string();
        let (rec, fresh) = self.mark_sold(&req, &attempt).await?;
        let msg = BookingMessage {
            booking_id: req.booking_id.to_string(),
            show: req.show.to_string(),
            event: req.event.to_string(),
            ticket: rec.ticket.clone(),
            seats: rec.seats.clone().unwrap_or_default(),
            quantity: rec.quantity.unwrap_or(0),
            mac: String::new(),
        }
        .signed(self.queue.signer());
        // A repeat (the hold was booked before) waits for replicas too: the earlier attempt may
        // have ended before its mark was durable (an undo that could not run). It is never
        // undone, though: that attempt or the sweeper may have published it.
        self.replicated(&req, fresh, &attempt).await?;
        let unknown = || BookingError::Unknown {
            booking_id: msg.booking_id.clone(),
        };
        // Pending before publishing: while the outcome is unknown, the buyer can follow it.
        if let Err(e) = self.record_pending(&msg).await {
            tracing::warn!(error = %e, booking = %msg.booking_id, "pending record not written; the sweeper publishes");
            return Err(unknown());
        }
        let started = Instant::now();
        if let Err(e) = self.producer.publish(&msg).await {
            metrics::counter!(telemetry::BOOKINGS_API, "status" => "unknown").increment(1);
            tracing::warn!(error = %e, booking = %msg.booking_id,
                "kafka did not acknowledge; the booking stays sold and the sweeper publishes it again");
            return Err(unknown());
        }
        metrics::histogram!(telemetry::KAFKA_PRODUCE_LATENCY)
            .record(started.elapsed().as_secs_f64());
        // Kafka has it: the ledger will decide. A failure here only leaves work for the sweeper.
        let _: Result<i64, _> = self
            .store
            .conn()
            .zrem(
                self.store.keys().show(req.show.as_str()).intents,
                req.hold.to_string(),
            )
            .await;
        self.finish(&req, msg, rec.quantity, fresh).await
    }

    /// Step 2b: the sold mark has reached `replicas` replicas of the show's primary, or the
    /// answer is 503: a 201 must not rest on a mark a failover can forget. A fresh mark is undone
    /// (it was never published, so nothing else can know of it); a repeated one is not (an
    /// earlier attempt or the sweeper may have published it): its outcome is the ledger's.
    async fn replicated(
        &self,
        req: &Request,
        fresh: bool,
        attempt: &str,
    ) -> Result<(), BookingError> {
        let Durability { replicas, wait } = self.durability;
        if replicas == 0 {
            return Ok(());
        }
        let k = self.store.keys().show(req.show.as_str());
        let acked = self
            .store
            .waits()
            .wait_replicated(
                &format!("{}:replicated", k.info),
                (&k.holdrec, &req.hold.to_string()),
                replicas,
                wait.as_millis() as u64,
            )
            .await;
        // The mark must be on the node that acknowledged: the hold record there names this
        // booking, and for a fresh mark this attempt.
        let booking_id = req.booking_id.to_string();
        let ours = |raw: &Option<String>| {
            raw.as_deref()
                .and_then(|r| HoldRec::parse(r).ok())
                .is_some_and(|h| {
                    h.booking.as_deref() == Some(booking_id.as_str())
                        && (!fresh || h.attempt.as_deref() == Some(attempt))
                })
        };
        match acked.map(|(raw, n)| (ours(&raw), n)) {
            Ok((true, n)) if n >= replicas => return Ok(()),
            Ok((false, n)) => {
                tracing::warn!(booking = %req.booking_id, acked = n, "the node that answered WAIT does not have the sold mark (a failover); undoing")
            }
            Ok((_, n)) => {
                tracing::warn!(booking = %req.booking_id, acked = n, "sold mark not replicated in time; undoing")
            }
            Err(e) => tracing::warn!(booking = %req.booking_id, error = %e, "WAIT failed; undoing"),
        }
        metrics::counter!(telemetry::BOOKINGS_API, "status" => "not_replicated").increment(1);
        if !fresh {
            return Err(BookingError::Unknown {
                booking_id: req.booking_id.to_string(),
            });
        }
        let mut undo = with_show_keys(&self.store.scripts().unbook, &k);
        let undone: Result<i64, _> = undo
            .key(&k.intents)
            .arg(req.hold.to_string())
            .arg(req.booking_id.to_string())
            .arg(attempt)
            .invoke_async(&mut self.store.conn())
            .await;
        match undone {
            // Undone, or nothing to undo (the mark died with a failed primary): nothing booked.
            Ok(0 | 1) => Err(BookingError::NotReplicated),
            // Not undone: a repeated confirmation of the hold, or the sweeper, adopted the mark
            // (and may have been answered 201 on it, or published it). The ledger decides.
            Ok(_) => {
                tracing::warn!(booking = %req.booking_id, "not undone: the mark is no longer this attempt's (a repeated confirmation or the sweeper adopted it)");
                Err(BookingError::Unknown {
                    booking_id: req.booking_id.to_string(),
                })
            }
            // Not undone (the undo did not run): the intent stays, the sweeper publishes it, the
            // ledger decides it.
            Err(_) => Err(BookingError::Unknown {
                booking_id: req.booking_id.to_string(),
            }),
        }
    }

    /// The pending record that answers `GET /v1/bookings/{id}` until the ledger has it.
    async fn record_pending(&self, msg: &BookingMessage) -> Result<(), BookingError> {
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
        Ok(())
    }

    /// Publishes again every booking marked sold at least [`INTENT_GRACE`] ago whose
    /// publication is not known to have succeeded (its request failed, timed out, or its process
    /// died), until Kafka acknowledges it or the ledger has decided it. Run by the admission
    /// leader for each event (see [`Housekeeping`]). Returns how many were resolved.
    pub async fn resolve_intents(&self, event: &EventId) -> Result<usize, BookingError> {
        let shows: Vec<String> = self
            .store
            .conn()
            .smembers(self.store.keys().event_shows(event.as_str()))
            .await?;
        let before = now_ms().saturating_sub(INTENT_GRACE.as_millis() as u64);
        let mut resolved = 0;
        // Within a budget: this runs inside the admission leader's tick, and a Kafka that does
        // not answer must not stall admission (each publish may wait for the ack timeout).
        // What is left is resolved on the next sweep; each intent is dropped as it is resolved.
        let started = Instant::now();
        'shows: for show in shows {
            let k = self.store.keys().show(&show);
            let holds: Vec<String> = match self
                .store
                .conn()
                .zrangebyscore_limit(&k.intents, "-inf", before, 0, 100)
                .await
            {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(show = %show, error = %e, "sweeper: intents not read");
                    continue;
                }
            };
            for hold in holds {
                if started.elapsed() > INTENT_SWEEP_BUDGET {
                    break 'shows;
                }
                let left = INTENT_SWEEP_BUDGET.saturating_sub(started.elapsed());
                match tokio::time::timeout(left, self.resolve_intent(event, &show, &hold)).await {
                    Ok(Ok(true)) => {
                        let _: i64 = self.store.conn().zrem(&k.intents, &hold).await?;
                        resolved += 1;
                    }
                    Ok(Ok(false)) | Err(_) => {}
                    // One bad intent does not stop the others.
                    Ok(Err(e)) => {
                        tracing::warn!(show = %show, hold = %hold, error = %e, "sweeper: intent not resolved")
                    }
                }
            }
        }
        if resolved > 0 {
            metrics::counter!(telemetry::BOOKING_INTENTS_RESOLVED).increment(resolved as u64);
            tracing::info!(event = %event, resolved, "bookings of unknown outcome published again");
        }
        Ok(resolved)
    }

    /// One intent: true when it needs nothing more (Kafka has it, the ledger decided it, or the
    /// hold is no longer booked).
    async fn resolve_intent(
        &self,
        event: &EventId,
        show: &str,
        hold: &str,
    ) -> Result<bool, BookingError> {
        let k = self.store.keys().show(show);
        // Adopted, not just read: the attempt that marked the seats may still be running, and
        // once this publishes, its undo must not take the seats back (lua/adopt.lua).
        let raw: Option<String> = self
            .store
            .scripts()
            .adopt
            .key(&k.holdrec)
            .arg(hold)
            .invoke_async(&mut self.store.conn())
            .await?;
        let Some(rec) = raw.and_then(|r| HoldRec::parse(&r).ok()) else {
            return Ok(true);
        };
        let Some(booking_id) = rec.booking else {
            return Ok(true);
        };
        let id = parse_uuid("booking id", &booking_id)?;
        if repo::find(&self.db, id).await?.is_some() {
            return Ok(true);
        }
        let msg = BookingMessage {
            booking_id,
            show: show.to_owned(),
            event: event.to_string(),
            ticket: rec.ticket,
            seats: rec.seats.unwrap_or_default(),
            quantity: rec.quantity.unwrap_or(0),
            mac: String::new(),
        }
        .signed(self.queue.signer());
        self.record_pending(&msg).await?;
        match self.producer.publish(&msg).await {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(error = %e, booking = %msg.booking_id, "sweeper: kafka still not acknowledging");
                Ok(false)
            }
        }
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
    async fn mark_sold(
        &self,
        req: &Request,
        attempt: &str,
    ) -> Result<(HoldRec, bool), BookingError> {
        let k = self.store.keys().show(req.show.as_str());
        let mut call = with_show_keys(&self.store.scripts().book, &k);
        let reply: BookReply = call
            .key(&k.intents)
            .arg(req.hold.to_string())
            .arg(req.ticket.to_member())
            .arg(now_ms())
            .arg(req.booking_id.to_string())
            .arg(attempt)
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

    /// Step 4: end the buyer's session so the slot goes to the next person, and answer.
    async fn finish(
        &self,
        req: &Request,
        msg: BookingMessage,
        quantity: Option<u32>,
        fresh: bool,
    ) -> Result<BookingOut, BookingError> {
        self.queue.end_session(&req.event, &req.ticket).await?;
        metrics::counter!(telemetry::BOOKINGS_API, "status" => if fresh { "pending" } else { "replayed" })
            .increment(1);
        // No PostgreSQL read on a fresh booking's path: it was published a moment ago and is
        // `pending` (it resolves through GET /v1/bookings/{id}). A repeat tells what the ledger
        // decided, when it can within a moment.
        let status = if fresh {
            None
        } else {
            tokio::time::timeout(
                Duration::from_millis(500),
                repo::find(&self.db, req.booking_id),
            )
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
            .map(|row| row.status)
        };
        let status = status.unwrap_or_else(|| "pending".to_owned());
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
            // Freed only while still marked for this booking: another applier may have sold a
            // seat the ledger saw available since (its mark must stay).
            args.extend(["#rejected".to_owned(), b.booking_id.clone()]);
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

    /// Compares Redis's sold marks with the ledger for every show, seated and general
    /// admission; with `repair`, aligns Redis where that is sure to be right. The ledger's lag
    /// on the bookings topic is read from the broker `kafka` names, per show.
    ///
    /// Writing the ledger's own sold marks into Redis is always right (the ledger is the truth).
    /// Freeing a seat Redis shows sold by a booking the ledger has not decided is right only
    /// when that booking can no longer reach the ledger: it has no intent (the sweeper is not
    /// publishing it) and the ledger has read everything on the topic. Otherwise it is left as
    /// it is, with the reason: the ledger or the sweeper will decide it.
    pub async fn reconcile(
        &self,
        repair: bool,
        kafka: &crate::config::KafkaConfig,
    ) -> Result<Vec<Drift>, BookingError> {
        let mut drift = Vec::new();
        for show in seats::repo::shows(&self.db).await? {
            let show = ShowId::parse(&show)?;
            let k = self.store.keys().show(show.as_str());
            let kind: Option<String> = self.store.conn().hget(&k.info, "kind").await?;
            match kind.as_deref() {
                None => continue,
                Some("ga") => {
                    drift.extend(self.reconcile_ga(&show, repair, kafka).await?);
                    continue;
                }
                Some(_) => {}
            }
            // Order matters: states, then intents, then the lag, then the ledger. A booking marked in the states read either still has its intent at
            // the second read, or Kafka acknowledged it before: then the ledger has read it
            // (lag 0) and decided it by the last read.
            let states: Vec<(String, String)> = self.store.conn().hgetall(&k.seats).await?;
            let in_flight = self.in_flight(&show).await?;
            let ledger_lag = super::consumer::ledger_lag(kafka).await;
            let ledger: HashMap<String, Uuid> = repo::sold_seats(&self.db, show.as_str())
                .await?
                .into_iter()
                .collect();
            let marked: Vec<Uuid> = states
                .iter()
                .filter_map(|(_, st)| st.strip_prefix("s:"))
                .filter_map(|b| Uuid::parse_str(b).ok())
                .collect();
            let decided = repo::decided(&self.db, &marked).await?;
            let set_aside = repo::dead_lettered(&self.db, &marked).await?;
            let (mut found, pairs) =
                compare(&show, states, &ledger, |booking| {
                    match Uuid::parse_str(booking) {
                    Ok(id) if decided.contains(&id) => Verdict::Decided,
                    Ok(id) if set_aside.contains(&id) => Verdict::InFlight(
                        "the ledger set its message aside (dead_letters): an operator decides it",
                    ),
                    _ if in_flight.contains(booking) => {
                        Verdict::InFlight("its intent is live: the sweeper is still publishing it")
                    }
                    _ => match ledger_lag {
                        Some(0) => Verdict::Lost,
                        Some(_) => Verdict::InFlight(
                            "the ledger has not read the whole topic yet (lag > 0)",
                        ),
                        None => Verdict::InFlight("the ledger's lag could not be read"),
                    },
                }
                });
            if repair && !pairs.is_empty() {
                self.settle(&show, &pairs).await?;
                for d in &mut found {
                    if d.action == "would repair" {
                        d.action = "repaired".into();
                    }
                }
            }
            drift.extend(found);
        }
        Ok(drift)
    }

    /// Booking ids of a show's live intents.
    async fn in_flight(&self, show: &ShowId) -> Result<HashSet<String>, BookingError> {
        let k = self.store.keys().show(show.as_str());
        let holds: Vec<String> = self.store.conn().zrange(&k.intents, 0, -1).await?;
        let mut out = HashSet::new();
        for hold in holds {
            let raw: Option<String> = self.store.conn().hget(&k.holdrec, &hold).await?;
            if let Some(b) = raw
                .and_then(|r| HoldRec::parse(&r).ok())
                .and_then(|r| r.booking)
            {
                out.insert(b);
            }
        }
        Ok(out)
    }

    /// General admission: Redis's `sold` against the ledger's. Aligned only with no booking in
    /// flight (no intent, lag 0), and atomically: `settle.lua` refuses when `sold` moved since
    /// it was read or an intent appeared.
    async fn reconcile_ga(
        &self,
        show: &ShowId,
        repair: bool,
        kafka: &crate::config::KafkaConfig,
    ) -> Result<Vec<Drift>, BookingError> {
        let k = self.store.keys().show(show.as_str());
        let sold: Option<i64> = self.store.conn().hget(&k.info, "sold").await?;
        let sold = sold.unwrap_or(0);
        let intents: u64 = self.store.conn().zcard(&k.intents).await?;
        let ledger_lag = super::consumer::ledger_lag(kafka).await;
        let truth = repo::ga_sold(&self.db, show.as_str()).await?;
        if sold == truth {
            return Ok(Vec::new());
        }
        let mut d = Drift {
            show: show.to_string(),
            seat: "#ga".into(),
            redis: format!("sold:{sold}"),
            ledger: format!("sold:{truth}"),
            action: "would repair".into(),
        };
        if intents > 0 || ledger_lag != Some(0) {
            d.action = format!(
                "left: bookings in flight ({intents} intents, ledger lag {})",
                ledger_lag.map_or("unknown".into(), |l| l.to_string())
            );
        } else if repair {
            let mut call = with_show_keys(&self.store.scripts().settle, &k);
            call.key(&k.intents)
                .arg(now_ms())
                .arg("#ga-sold")
                .arg(sold)
                .arg(truth);
            let done: i64 = call.invoke_async(&mut self.store.conn()).await?;
            d.action = if done == 1 {
                "repaired".into()
            } else {
                "left: a booking came in while reconciling; run it again".into()
            };
        }
        Ok(vec![d])
    }
}

/// What the ledger knows of a booking Redis shows a seat sold by.
enum Verdict {
    /// Confirmed or rejected: the ledger's seat state is the truth.
    Decided,
    /// Not decided and it may still be (the reason).
    InFlight(&'static str),
    /// Not decided, no intent, and the ledger has read the whole topic: it never will be.
    Lost,
}

/// The seats whose Redis state differs from the ledger's, each with what reconcile does about
/// it, and the (seat, state) pairs that would write the ledger's state into Redis where that is
/// sure to be right.
fn compare(
    show: &ShowId,
    states: Vec<(String, String)>,
    ledger: &HashMap<String, Uuid>,
    verdict: impl Fn(&str) -> Verdict,
) -> (Vec<Drift>, Vec<String>) {
    let (mut drift, mut pairs) = (Vec::new(), Vec::new());
    for (seat, state) in states {
        let redis_sold = state.strip_prefix("s:").map(str::to_owned);
        let ledger_sold = ledger.get(&seat).map(Uuid::to_string);
        if redis_sold == ledger_sold {
            continue;
        }
        // The ledger sold it: always written. Redis alone sold it: only when that booking is
        // decided or can never be.
        let action = match (&ledger_sold, &redis_sold) {
            (Some(_), _) | (None, None) => Ok(()),
            (None, Some(b)) => match verdict(b) {
                Verdict::Decided => Ok(()),
                Verdict::Lost => Ok(()),
                Verdict::InFlight(why) => Err(why),
            },
        };
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
            action: match action {
                Ok(()) => "would repair".into(),
                Err(why) => format!("left: {why}"),
            },
        });
        if action.is_ok() {
            pairs.push(seat);
            pairs.push(ledger_sold.map(|b| format!("s:{b}")).unwrap_or_default());
        }
    }
    (drift, pairs)
}

/// The admission leader's housekeeping for an event: holds lapse (seats), then bookings of
/// unknown outcome are published again.
impl Housekeeping for Bookings {
    fn sweep<'a>(&'a self, event: &'a EventId) -> BoxFuture<'a, anyhow::Result<bool>> {
        Box::pin(async move {
            let sold_out = self.seats.sweep_event(event).await?;
            if let Err(e) = self.resolve_intents(event).await {
                tracing::warn!(event = %event, error = %e, "sweeper: booking intents not resolved this time");
            }
            Ok(sold_out)
        })
    }
}
