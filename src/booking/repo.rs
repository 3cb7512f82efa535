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

/// Applies one booking inside `tx`: insert it, then sell its seats conditionally.
pub async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    b: &BookingMessage,
) -> Result<Decision, sqlx::Error> {
    let id = Uuid::parse_str(&b.booking_id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    let inserted = sqlx::query(
        "INSERT INTO bookings (booking_id, show_id, ticket, seats, quantity, status) \
         VALUES ($1, $2, $3, $4, $5, 'pending') ON CONFLICT (booking_id) DO NOTHING",
    )
    .bind(id)
    .bind(&b.show)
    .bind(&b.ticket)
    .bind(&b.seats)
    .bind(b.quantity as i32)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(Decision::Duplicate);
    }
    sqlx::query("SAVEPOINT sell").execute(&mut **tx).await?;
    let sold = if b.seats.is_empty() {
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
        let n = sqlx::query(
            "UPDATE seats SET status = 'SOLD', booking_id = $1 \
             WHERE show_id = $2 AND seat_id = ANY($3) AND status = 'AVAILABLE'",
        )
        .bind(id)
        .bind(&b.show)
        .bind(&b.seats)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        n == b.seats.len() as u64
    };
    if sold {
        sqlx::query(
            "UPDATE bookings SET status = 'confirmed', decided_at = now() WHERE booking_id = $1",
        )
        .bind(id)
        .execute(&mut **tx)
        .await?;
        return Ok(Decision::Confirmed);
    }
    // Some seat was taken: undo this booking's partial sale, keep the others of the batch.
    sqlx::query("ROLLBACK TO SAVEPOINT sell")
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "UPDATE bookings SET status = 'rejected', decided_at = now() WHERE booking_id = $1",
    )
    .bind(id)
    .execute(&mut **tx)
    .await?;
    let truth = sqlx::query(
        "SELECT seat_id, booking_id FROM seats WHERE show_id = $1 AND seat_id = ANY($2)",
    )
    .bind(&b.show)
    .bind(&b.seats)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| (r.get::<String, _>(0), r.get::<Option<Uuid>, _>(1)))
    .collect();
    Ok(Decision::Rejected(truth))
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
