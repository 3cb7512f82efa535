//! The ledger's SQL. PostgreSQL is the source of truth for what is sold: a seat becomes SOLD
//! only through `UPDATE … WHERE status = 'AVAILABLE'`, so no seat is ever sold twice here,
//! whatever Redis believed.

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
    // 1. Insert them all; the ones already there are redeliveries.
    let fresh: std::collections::HashSet<Uuid> = sqlx::query_scalar(
        "INSERT INTO bookings (booking_id, show_id, ticket, seats, quantity, status) \
         SELECT b.id, b.show, b.ticket, string_to_array(b.seats, ','), b.quantity, 'pending' \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[]) AS b(id, show, ticket, seats, quantity) \
         ON CONFLICT (booking_id) DO NOTHING RETURNING booking_id",
    )
    .bind(&ids)
    .bind(batch.iter().map(|b| b.show.clone()).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.ticket.clone()).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.seats.join(",")).collect::<Vec<_>>())
    .bind(batch.iter().map(|b| b.quantity as i32).collect::<Vec<_>>())
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .collect();
    // 2. Lock every seat the new seated bookings name and read its state.
    let (mut lock_show, mut lock_seat) = (Vec::new(), Vec::new());
    for (b, id) in batch.iter().zip(&ids) {
        if fresh.contains(id) {
            for seat in &b.seats {
                lock_show.push(b.show.clone());
                lock_seat.push(seat.clone());
            }
        }
    }
    let mut state: std::collections::HashMap<(String, String), Option<Uuid>> = sqlx::query(
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
    .collect();
    // 3. Decide in batch order: a booking is accepted when every seat is available (and not
    //    taken by an earlier booking of this batch).
    let mut decisions = Vec::with_capacity(batch.len());
    let (mut sell_show, mut sell_seat, mut sell_booking) = (Vec::new(), Vec::new(), Vec::new());
    let (mut status_id, mut status) = (Vec::new(), Vec::new());
    // A booking can appear twice in one batch (a repeated confirmation publishes again): only
    // its first copy is decided; the others are duplicates like any redelivery.
    let mut seen_in_batch = std::collections::HashSet::new();
    for (b, id) in batch.iter().zip(&ids) {
        if !fresh.contains(id) || !seen_in_batch.insert(*id) {
            decisions.push(Decision::Duplicate);
            continue;
        }
        let ok = if b.seats.is_empty() {
            sqlx::query(
                "UPDATE shows SET ga_sold = ga_sold + $2 \
                 WHERE show_id = $1 AND ga_quantity IS NOT NULL AND ga_sold + $2 <= ga_quantity",
            )
            .bind(&b.show)
            .bind(b.quantity as i32)
            .execute(&mut **tx)
            .await?
            .rows_affected()
                == 1
        } else {
            let keys: Vec<(String, String)> = b
                .seats
                .iter()
                .map(|s| (b.show.clone(), s.clone()))
                .collect();
            let free = keys.iter().all(|k| matches!(state.get(k), Some(None)));
            if free {
                for k in keys {
                    state.insert(k.clone(), Some(*id));
                    sell_show.push(k.0);
                    sell_seat.push(k.1);
                    sell_booking.push(*id);
                }
            }
            free
        };
        status_id.push(*id);
        status.push(if ok { "confirmed" } else { "rejected" });
        decisions.push(if ok {
            Decision::Confirmed
        } else {
            Decision::Rejected(
                b.seats
                    .iter()
                    .map(|s| {
                        (
                            s.clone(),
                            state.get(&(b.show.clone(), s.clone())).copied().flatten(),
                        )
                    })
                    .collect(),
            )
        });
    }
    // 4. One conditional UPDATE sells every accepted seat: the last line against double selling.
    let sold = sqlx::query(
        "UPDATE seats SET status = 'SOLD', booking_id = v.booking \
         FROM unnest($1::text[], $2::text[], $3::uuid[]) AS v(show, seat, booking) \
         WHERE seats.show_id = v.show AND seats.seat_id = v.seat AND seats.status = 'AVAILABLE'",
    )
    .bind(&sell_show)
    .bind(&sell_seat)
    .bind(&sell_booking)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if sold != sell_seat.len() as u64 {
        // Under the row locks this cannot happen; if it does, refuse the whole batch (the
        // transaction rolls back and the batch is tried again) rather than guess.
        return Err(sqlx::Error::Protocol(format!(
            "sold {sold} of {} locked seats",
            sell_seat.len()
        )));
    }
    sqlx::query(
        "UPDATE bookings SET status = v.status, decided_at = now() \
         FROM unnest($1::uuid[], $2::text[]) AS v(id, status) WHERE bookings.booking_id = v.id",
    )
    .bind(&status_id)
    .bind(&status)
    .execute(&mut **tx)
    .await?;
    Ok(decisions)
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

/// Records a show and its seats (idempotent). Returns the event the show belongs to, which
/// differs from `event` when the show existed under another event.
pub async fn upsert_show(
    db: &PgPool,
    show: &str,
    event: &str,
    seats: &[String],
    ga_quantity: Option<i32>,
) -> Result<String, sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO events (event_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(event)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO shows (show_id, event_id, ga_quantity) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
        .bind(show)
        .bind(event)
        .bind(ga_quantity)
        .execute(&mut *tx)
        .await?;
    let owner: String = sqlx::query_scalar("SELECT event_id FROM shows WHERE show_id = $1")
        .bind(show)
        .fetch_one(&mut *tx)
        .await?;
    if owner == event && !seats.is_empty() {
        sqlx::query("INSERT INTO seats (show_id, seat_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING")
            .bind(show)
            .bind(seats)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(owner)
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

/// Every show of the ledger.
pub async fn shows(db: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT show_id FROM shows ORDER BY show_id")
        .fetch_all(db)
        .await
}
