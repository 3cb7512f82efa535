//! The ledger's SQL. PostgreSQL is the source of truth for what is sold: a seat becomes SOLD
//! only through `UPDATE … WHERE status = 'AVAILABLE'`, so no seat is ever sold twice here,
//! whatever Redis believed.

use std::collections::{HashMap, HashSet};

use sqlx::{PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use super::BookingMessage;

/// How the ledger decided a booking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Applied now: every seat (or the quantity) was available.
    Confirmed,
    /// Not applied: some seat was already sold (or too few places were left). The seats'
    /// states in the ledger are returned so Redis can be aligned: (seat, Some(booking) if sold).
    Rejected(Vec<(String, Option<Uuid>)>),
    /// Seen before (a redelivery): nothing done.
    Duplicate,
}

/// The row-locked states of the seats a batch names: (show, seat) → the booking holding it.
type SeatStates = HashMap<(String, String), Option<Uuid>>;

/// What a batch decided, ready to write.
#[derive(Default)]
struct Decided {
    decisions: Vec<Decision>,
    /// Seats to sell: show, seat, booking.
    sell: (Vec<String>, Vec<String>, Vec<Uuid>),
    /// Bookings decided now and their status.
    status: (Vec<Uuid>, Vec<&'static str>),
}

/// Applies a batch of bookings inside `tx`, set-based: a handful of statements per batch, not
/// per booking. Decisions are made in batch order under row locks, then one conditional UPDATE
/// sells every seat of the accepted bookings. Returns one decision per input booking.
pub async fn apply_batch(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[BookingMessage],
) -> Result<Vec<Decision>, sqlx::Error> {
    let ids: Vec<Uuid> = batch
        .iter()
        .map(|b| Uuid::parse_str(&b.booking_id).map_err(|e| sqlx::Error::Decode(Box::new(e))))
        .collect::<Result<_, _>>()?;
    let fresh = insert_new(tx, batch, &ids).await?;
    let mut states = lock_seats(tx, batch, &ids, &fresh).await?;
    let decided = decide(tx, batch, &ids, &fresh, &mut states).await?;
    sell(tx, &decided.sell).await?;
    record(tx, &decided.status).await?;
    Ok(decided.decisions)
}

/// Step 1: insert every booking as pending; returns the ids that were new (the others are
/// redeliveries).
async fn insert_new(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[BookingMessage],
    ids: &[Uuid],
) -> Result<HashSet<Uuid>, sqlx::Error> {
    Ok(sqlx::query_scalar(
        "INSERT INTO bookings (booking_id, show_id, ticket, seats, quantity, status) \
         SELECT b.id, b.show, b.ticket, string_to_array(b.seats, ','), b.quantity, 'pending' \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[]) AS b(id, show, ticket, seats, quantity) \
         ON CONFLICT (booking_id) DO NOTHING RETURNING booking_id",
    )
    .bind(ids)
    .bind(batch.iter().map(|b| b.show.clone()).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.ticket.clone()).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.seats.join(",")).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.quantity as i32).collect::<Vec<_>>())
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .collect())
}

/// Step 2: lock every seat the new seated bookings name (in a stable order) and read its state.
async fn lock_seats(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[BookingMessage],
    ids: &[Uuid],
    fresh: &HashSet<Uuid>,
) -> Result<SeatStates, sqlx::Error> {
    let (mut lock_show, mut lock_seat) = (Vec::new(), Vec::new());
    for (b, id) in batch.iter().zip(ids) {
        if fresh.contains(id) {
            for seat in &b.seats {
                lock_show.push(b.show.clone());
                lock_seat.push(seat.clone());
            }
        }
    }
    Ok(sqlx::query(
        "SELECT s.show_id, s.seat_id, s.booking_id FROM seats s \
         JOIN unnest($1::text[], $2::text[]) AS w(show, seat) ON s.show_id = w.show AND s.seat_id = w.seat \
         ORDER BY s.show_id, s.seat_id FOR UPDATE OF s",
    )
    .bind(&lock_show)
    .bind(&lock_seat)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| ((r.get::<String, _>(0), r.get::<String, _>(1)), r.get::<Option<Uuid>, _>(2)))
    .collect())
}

/// Step 3: decide in batch order. A seated booking is accepted when every seat is available
/// (and not taken by an earlier booking of this batch); a general-admission one when its
/// conditional count update succeeds. A booking can appear twice in one batch (a repeated
/// confirmation publishes again): only its first copy is decided.
async fn decide(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[BookingMessage],
    ids: &[Uuid],
    fresh: &HashSet<Uuid>,
    states: &mut SeatStates,
) -> Result<Decided, sqlx::Error> {
    let mut out = Decided::default();
    let mut seen_in_batch = HashSet::new();
    for (b, id) in batch.iter().zip(ids) {
        if !fresh.contains(id) || !seen_in_batch.insert(*id) {
            out.decisions.push(Decision::Duplicate);
            continue;
        }
        let ok = if b.seats.is_empty() {
            sell_places(tx, b).await?
        } else {
            take_seats(b, *id, states, &mut out.sell)
        };
        out.status.0.push(*id);
        out.status.1.push(if ok { "confirmed" } else { "rejected" });
        out.decisions.push(if ok {
            Decision::Confirmed
        } else {
            Decision::Rejected(
                b.seats
                    .iter()
                    .map(|s| {
                        (
                            s.clone(),
                            states.get(&(b.show.clone(), s.clone())).copied().flatten(),
                        )
                    })
                    .collect(),
            )
        });
    }
    Ok(out)
}

/// General admission: sells `quantity` places if that many are left (one conditional update).
async fn sell_places(
    tx: &mut Transaction<'_, Postgres>,
    b: &BookingMessage,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE shows SET ga_sold = ga_sold + $2 \
         WHERE show_id = $1 AND ga_quantity IS NOT NULL AND ga_sold + $2 <= ga_quantity",
    )
    .bind(&b.show)
    .bind(b.quantity as i32)
    .execute(&mut **tx)
    .await?
    .rows_affected()
        == 1)
}

/// A seated booking: takes its seats in `states` (and queues them to sell) when all are free.
fn take_seats(
    b: &BookingMessage,
    id: Uuid,
    states: &mut SeatStates,
    sell: &mut (Vec<String>, Vec<String>, Vec<Uuid>),
) -> bool {
    let keys: Vec<(String, String)> = b
        .seats
        .iter()
        .map(|s| (b.show.clone(), s.clone()))
        .collect();
    let free = keys.iter().all(|k| matches!(states.get(k), Some(None)));
    if free {
        for k in keys {
            states.insert(k.clone(), Some(id));
            sell.0.push(k.0);
            sell.1.push(k.1);
            sell.2.push(id);
        }
    }
    free
}

/// Step 4: one conditional UPDATE sells every accepted seat — the last line against double
/// selling. Under the row locks every seat must sell; if one does not, the whole batch is
/// refused (the transaction rolls back and the batch is tried again) rather than guessed.
async fn sell(
    tx: &mut Transaction<'_, Postgres>,
    (shows, seats, bookings): &(Vec<String>, Vec<String>, Vec<Uuid>),
) -> Result<(), sqlx::Error> {
    let sold = sqlx::query(
        "UPDATE seats SET status = 'SOLD', booking_id = v.booking \
         FROM unnest($1::text[], $2::text[], $3::uuid[]) AS v(show, seat, booking) \
         WHERE seats.show_id = v.show AND seats.seat_id = v.seat AND seats.status = 'AVAILABLE'",
    )
    .bind(shows)
    .bind(seats)
    .bind(bookings)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if sold != seats.len() as u64 {
        return Err(sqlx::Error::Protocol(format!(
            "sold {sold} of {} locked seats",
            seats.len()
        )));
    }
    Ok(())
}

/// Step 5: record each decided booking's status.
async fn record(
    tx: &mut Transaction<'_, Postgres>,
    (ids, status): &(Vec<Uuid>, Vec<&'static str>),
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE bookings SET status = v.status, decided_at = now() \
         FROM unnest($1::uuid[], $2::text[]) AS v(id, status) WHERE bookings.booking_id = v.id",
    )
    .bind(ids)
    .bind(status)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A booking as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookingRow {
    /// Show id.
    pub show: String,
    /// Seats.
    pub seats: Vec<String>,
    /// Places (general admission).
    pub quantity: i32,
    /// `pending`, `confirmed` or `rejected`.
    pub status: String,
}

/// Reads a booking.
pub async fn find(db: &PgPool, id: Uuid) -> Result<Option<BookingRow>, sqlx::Error> {
    let row =
        sqlx::query("SELECT show_id, seats, quantity, status FROM bookings WHERE booking_id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|r| BookingRow {
        show: r.get(0),
        seats: r.get(1),
        quantity: r.get(2),
        status: r.get(3),
    }))
}

/// Every sold seat of a show in the ledger: (seat, booking).
pub async fn sold_seats(db: &PgPool, show: &str) -> Result<Vec<(String, Uuid)>, sqlx::Error> {
    Ok(
        sqlx::query("SELECT seat_id, booking_id FROM seats WHERE show_id = $1 AND status = 'SOLD'")
            .bind(show)
            .fetch_all(db)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
    )
}

/// Of `ids`, the bookings the ledger has decided (confirmed or rejected).
pub async fn decided(db: &PgPool, ids: &[Uuid]) -> Result<HashSet<Uuid>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    Ok(sqlx::query(
        "SELECT booking_id FROM bookings WHERE booking_id = ANY($1) AND status IN ('confirmed', 'rejected')",
    )
    .bind(ids)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| r.get(0))
    .collect())
}

/// Places of a general-admission show sold in the ledger.
pub async fn ga_sold(db: &PgPool, show: &str) -> Result<i64, sqlx::Error> {
    let n: Option<i32> = sqlx::query_scalar("SELECT ga_sold FROM shows WHERE show_id = $1")
        .bind(show)
        .fetch_optional(db)
        .await?;
    Ok(i64::from(n.unwrap_or(0)))
}

/// Of `ids`, the bookings the ledger set aside as dead letters (an operator decides them).
pub async fn dead_lettered(db: &PgPool, ids: &[Uuid]) -> Result<HashSet<Uuid>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    Ok(
        sqlx::query("SELECT DISTINCT booking_id FROM dead_letters WHERE booking_id = ANY($1)")
            .bind(&texts)
            .fetch_all(db)
            .await?
            .into_iter()
            .filter_map(|r| r.get::<Option<String>, _>(0))
            .filter_map(|s| Uuid::parse_str(&s).ok())
            .collect(),
    )
}
