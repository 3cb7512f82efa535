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

/// A general-admission show's places as locked for the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Places {
    /// Sold before this batch.
    sold: i32,
    /// The show's quantity.
    quantity: i32,
    /// Taken by this batch so far.
    taken: i32,
}

/// General-admission shows of a batch: show → its places.
type PlaceStates = HashMap<String, Places>;

/// What a batch decided, ready to write.
#[derive(Debug, Default)]
struct Decided {
    decisions: Vec<Decision>,
    /// Seats to sell: show, seat, booking.
    sell: (Vec<String>, Vec<String>, Vec<Uuid>),
    /// Bookings decided now and their status.
    status: (Vec<Uuid>, Vec<&'static str>),
}

/// Applies a batch of bookings inside `tx`, set-based: the same handful of statements whatever
/// the batch's size (seated or general admission). Every row a decision reads is locked first,
/// in a stable order (seats by show and seat, then shows by id), so appliers of several
/// partitions never deadlock and never decide on a stale state; decisions are made in batch
/// order; then one conditional UPDATE sells every accepted seat and one every accepted place —
/// the last line against double selling. Returns one decision per input booking.
pub async fn apply_batch(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[BookingMessage],
) -> Result<Vec<Decision>, sqlx::Error> {
    let ids: Vec<Uuid> = batch
        .iter()
        .map(|b| Uuid::parse_str(&b.booking_id).map_err(|e| sqlx::Error::Decode(Box::new(e))))
        .collect::<Result<_, _>>()?;
    let fresh = insert_new(tx, batch, &ids).await?;
    let mut seats = lock_seats(tx, batch, &ids, &fresh).await?;
    let mut places = lock_places(tx, batch, &ids, &fresh).await?;
    let decided = decide(batch, &ids, &fresh, &mut seats, &mut places);
    sell(tx, &decided.sell).await?;
    sell_places(tx, &places).await?;
    record(tx, &decided.status).await?;
    Ok(decided.decisions)
}

/// Step 1: insert every booking as pending; returns the ids that were new (the others are
/// redeliveries, or bookings another applier inserted first: its transaction decides them).
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
    .bind(
        batch
            .iter()
            .map(|b| i32::try_from(b.quantity).unwrap_or(i32::MAX))
            .collect::<Vec<_>>(),
    )
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
    if lock_seat.is_empty() {
        return Ok(SeatStates::new());
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

/// Step 2b: lock the general-admission shows the new place bookings name (by id) and read
/// their places. `FOR NO KEY UPDATE`, the lock an UPDATE of `ga_sold` takes anyway: it does not
/// wait for the key-share locks other appliers' booking inserts hold on the same show.
async fn lock_places(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[BookingMessage],
    ids: &[Uuid],
    fresh: &HashSet<Uuid>,
) -> Result<PlaceStates, sqlx::Error> {
    let mut shows: Vec<String> = batch
        .iter()
        .zip(ids)
        .filter(|(b, id)| b.seats.is_empty() && fresh.contains(*id))
        .map(|(b, _)| b.show.clone())
        .collect();
    if shows.is_empty() {
        return Ok(PlaceStates::new());
    }
    shows.sort();
    shows.dedup();
    Ok(sqlx::query(
        "SELECT show_id, ga_sold, ga_quantity FROM shows \
         WHERE show_id = ANY($1) AND ga_quantity IS NOT NULL \
         ORDER BY show_id FOR NO KEY UPDATE",
    )
    .bind(&shows)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| {
        let places = Places {
            sold: r.get(1),
            quantity: r.get(2),
            taken: 0,
        };
        (r.get::<String, _>(0), places)
    })
    .collect())
}

/// Step 3 (no I/O): decide in batch order. A seated booking is accepted when every seat is
/// available (and not taken by an earlier booking of this batch); a general-admission one when
/// its places still fit the show's quantity after the earlier ones. A booking can appear twice
/// in one batch (a repeated confirmation publishes again): only its first copy is decided.
fn decide(
    batch: &[BookingMessage],
    ids: &[Uuid],
    fresh: &HashSet<Uuid>,
    seats: &mut SeatStates,
    places: &mut PlaceStates,
) -> Decided {
    let mut out = Decided::default();
    let mut seen_in_batch = HashSet::new();
    for (b, id) in batch.iter().zip(ids) {
        if !fresh.contains(id) || !seen_in_batch.insert(*id) {
            out.decisions.push(Decision::Duplicate);
            continue;
        }
        let ok = if b.seats.is_empty() {
            take_places(b, places)
        } else {
            take_seats(b, *id, seats, &mut out.sell)
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
                            seats.get(&(b.show.clone(), s.clone())).copied().flatten(),
                        )
                    })
                    .collect(),
            )
        });
    }
    out
}

/// General admission: takes `quantity` places when that many are left after the batch's
/// earlier bookings.
fn take_places(b: &BookingMessage, places: &mut PlaceStates) -> bool {
    let Some(p) = places.get_mut(&b.show) else {
        return false;
    };
    let Ok(q) = i32::try_from(b.quantity) else {
        return false;
    };
    let fits = p
        .sold
        .checked_add(p.taken)
        .and_then(|n| n.checked_add(q))
        .is_some_and(|n| n <= p.quantity);
    if fits {
        p.taken += q;
    }
    fits
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
    if seats.is_empty() {
        return Ok(());
    }
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

/// Step 4b: one conditional UPDATE sells every accepted place, show by show — the counterpart
/// of `status = 'AVAILABLE'`: `ga_sold + n <= ga_quantity`. As with seats, a show whose update
/// does not apply refuses the whole batch.
async fn sell_places(
    tx: &mut Transaction<'_, Postgres>,
    places: &PlaceStates,
) -> Result<(), sqlx::Error> {
    let (shows, taken): (Vec<String>, Vec<i32>) = places
        .iter()
        .filter(|(_, p)| p.taken > 0)
        .map(|(s, p)| (s.clone(), p.taken))
        .unzip();
    if shows.is_empty() {
        return Ok(());
    }
    let sold = sqlx::query(
        "UPDATE shows SET ga_sold = ga_sold + v.n \
         FROM unnest($1::text[], $2::int[]) AS v(show, n) \
         WHERE shows.show_id = v.show AND shows.ga_quantity IS NOT NULL \
         AND shows.ga_sold + v.n <= shows.ga_quantity",
    )
    .bind(&shows)
    .bind(&taken)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if sold != shows.len() as u64 {
        return Err(sqlx::Error::Protocol(format!(
            "sold places of {sold} of {} locked shows",
            shows.len()
        )));
    }
    Ok(())
}

/// Step 5: record each decided booking's status — once: a booking leaves `pending` exactly one
/// time, and a batch that would decide one a second time is refused.
async fn record(
    tx: &mut Transaction<'_, Postgres>,
    (ids, status): &(Vec<Uuid>, Vec<&'static str>),
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let recorded = sqlx::query(
        "UPDATE bookings SET status = v.status, decided_at = now() \
         FROM unnest($1::uuid[], $2::text[]) AS v(id, status) \
         WHERE bookings.booking_id = v.id AND bookings.status = 'pending'",
    )
    .bind(ids)
    .bind(status)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if recorded != ids.len() as u64 {
        return Err(sqlx::Error::Protocol(format!(
            "recorded {recorded} of {} decisions",
            ids.len()
        )));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn booking(show: &str, seats: &[&str], quantity: u32) -> (BookingMessage, Uuid) {
        let id = Uuid::new_v4();
        let b = BookingMessage {
            booking_id: id.to_string(),
            show: show.into(),
            event: "e".into(),
            ticket: Uuid::new_v4().to_string(),
            seats: seats.iter().map(|s| s.to_string()).collect(),
            quantity,
            mac: String::new(),
        };
        (b, id)
    }

    fn run(
        batch: &[(BookingMessage, Uuid)],
        seats: &mut SeatStates,
        places: &mut PlaceStates,
    ) -> Decided {
        let msgs: Vec<BookingMessage> = batch.iter().map(|(b, _)| b.clone()).collect();
        let ids: Vec<Uuid> = batch.iter().map(|(_, id)| *id).collect();
        let fresh: HashSet<Uuid> = ids.iter().copied().collect();
        decide(&msgs, &ids, &fresh, seats, places)
    }

    #[test]
    fn the_first_booking_of_a_seat_in_batch_order_wins_and_the_loser_sees_who_has_it() {
        let mut seats: SeatStates = ["A1", "A2", "A3"]
            .iter()
            .map(|s| (("s".to_owned(), s.to_string()), None))
            .collect();
        let first = booking("s", &["A1", "A2"], 0);
        let second = booking("s", &["A2", "A3"], 0);
        let third = booking("s", &["A3"], 0);
        let d = run(
            &[first.clone(), second.clone(), third.clone()],
            &mut seats,
            &mut PlaceStates::new(),
        );
        assert_eq!(d.decisions[0], Decision::Confirmed);
        assert_eq!(
            d.decisions[1],
            Decision::Rejected(vec![("A2".into(), Some(first.1)), ("A3".into(), None)])
        );
        assert_eq!(d.decisions[2], Decision::Confirmed);
        assert_eq!(d.sell.1, vec!["A1", "A2", "A3"]);
        assert_eq!(d.sell.2, vec![first.1, first.1, third.1]);
        assert_eq!(d.status.1, vec!["confirmed", "rejected", "confirmed"]);
    }

    #[test]
    fn a_seat_the_ledger_does_not_have_rejects_its_booking() {
        let mut seats: SeatStates = [(("s".to_owned(), "A1".to_owned()), None)].into();
        let d = run(
            &[booking("s", &["A1", "Z9"], 0)],
            &mut seats,
            &mut PlaceStates::new(),
        );
        assert!(matches!(d.decisions[0], Decision::Rejected(_)));
        assert!(d.sell.0.is_empty());
    }

    #[test]
    fn places_are_taken_in_batch_order_until_the_quantity_is_reached() {
        let mut places: PlaceStates = [(
            "ga".to_owned(),
            Places {
                sold: 6,
                quantity: 10,
                taken: 0,
            },
        )]
        .into();
        let batch = [
            booking("ga", &[], 3),
            booking("ga", &[], 2),
            booking("ga", &[], 1),
            booking("seated", &[], 1),
        ];
        let d = run(&batch, &mut SeatStates::new(), &mut places);
        assert_eq!(
            d.status.1,
            vec!["confirmed", "rejected", "confirmed", "rejected"]
        );
        assert_eq!(places["ga"].taken, 4);
    }

    #[test]
    fn a_booking_twice_in_one_batch_or_not_new_is_decided_once() {
        let (b, id) = booking("ga", &[], 1);
        let mut places: PlaceStates = [(
            "ga".to_owned(),
            Places {
                sold: 0,
                quantity: 5,
                taken: 0,
            },
        )]
        .into();
        let d = run(
            &[(b.clone(), id), (b, id)],
            &mut SeatStates::new(),
            &mut places,
        );
        assert_eq!(d.decisions, vec![Decision::Confirmed, Decision::Duplicate]);
        assert_eq!(places["ga"].taken, 1);
        let (old, old_id) = booking("ga", &[], 1);
        let d = decide(
            &[old],
            &[old_id],
            &HashSet::new(),
            &mut SeatStates::new(),
            &mut places,
        );
        assert_eq!(d.decisions, vec![Decision::Duplicate]);
        assert!(d.status.0.is_empty());
    }
}
