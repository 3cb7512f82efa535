//! The SQL of shows and their seats: what exists to be sold. Sales themselves are the
//! ledger's (`booking::repo`).

use sqlx::PgPool;

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

/// Every show of the ledger.
pub async fn shows(db: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT show_id FROM shows ORDER BY show_id")
        .fetch_all(db)
        .await
}
