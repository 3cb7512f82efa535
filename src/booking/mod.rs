//! Bookings: from a held seat to a row in PostgreSQL.
//!
//! - [`service`]: [`Bookings`] — a hold becoming a booking (authorize, mark sold, publish or
//!   undo, finish), a booking's status, rejected bookings settled into Redis, reconcile.
//! - [`producer`]: publishes a confirmed booking to Kafka and waits for the broker's
//!   acknowledgement (`acks=all`, keyed by booking id so a sale spreads over every partition
//!   and the copies of one booking share one). The HTTP 201 is sent only after that
//!   acknowledgement.
//! - [`consumer`]: the ledger — appliers in a consumer group, each applying its partitions to
//!   PostgreSQL in batches with a conditional update under row locks, committing offsets only
//!   after the transaction commits (at-least-once delivery, made harmless by the booking id:
//!   a booking leaves `pending` once).
//! - [`repo`]: the SQL.

pub mod consumer;
pub mod producer;
pub mod repo;
pub mod service;

pub use service::{BookingOut, Bookings, Drift};

use redis::RedisError;
use serde::{Deserialize, Serialize};

use crate::auth::Signer;
use crate::ids::{BadId, EventId, SeatId, ShowId, Ticket};
use crate::queue::QueueError;
use crate::seats::SeatError;

/// The message on the bookings topic (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookingMessage {
    /// Booking id (UUID).
    pub booking_id: String,
    /// Show id.
    pub show: String,
    /// Event id.
    pub event: String,
    /// Ticket of the buyer.
    pub ticket: String,
    /// Seat ids (seated show), empty for general admission.
    #[serde(default)]
    pub seats: Vec<String>,
    /// Places (general admission), 0 for a seated show.
    #[serde(default)]
    pub quantity: u32,
    /// HMAC of the fields above under the service's secret: only the service sells
    /// ([`BookingMessage::signed`]); the ledger sets aside a message without a valid one.
    #[serde(default)]
    pub mac: String,
}

/// Most seats or places in one booking the ledger accepts.
pub const MAX_BOOKING_SEATS: usize = 100;

const MAC_DOMAIN: &[u8] = b"waitroom-booking-message-v1";

impl BookingMessage {
    fn mac_parts(&self) -> Vec<Vec<u8>> {
        vec![
            self.booking_id.as_bytes().to_vec(),
            self.show.as_bytes().to_vec(),
            self.event.as_bytes().to_vec(),
            self.ticket.as_bytes().to_vec(),
            self.seats.join("\n").into_bytes(),
            self.quantity.to_string().into_bytes(),
        ]
    }

    /// The message with its MAC set.
    pub fn signed(mut self, signer: &Signer) -> Self {
        let parts = self.mac_parts();
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        self.mac = signer.tag(MAC_DOMAIN, &refs);
        self
    }

    /// Why the ledger must not apply this message, if it must not: a field out of form or
    /// bounds, or a MAC that is not the service's.
    pub fn refusal(&self, signer: &Signer) -> Option<String> {
        if uuid::Uuid::parse_str(&self.booking_id).is_err() {
            return Some("booking_id is not a UUID".into());
        }
        if ShowId::parse(&self.show).is_err() || EventId::parse(&self.event).is_err() {
            return Some("show or event id out of form".into());
        }
        if Ticket::parse(&self.ticket).is_err() {
            return Some("ticket is not a UUID".into());
        }
        let seated = !self.seats.is_empty();
        if seated == (self.quantity > 0) {
            return Some("a booking names seats or a quantity, one of the two".into());
        }
        if self.seats.len() > MAX_BOOKING_SEATS || self.quantity as usize > MAX_BOOKING_SEATS {
            return Some(format!("more than {MAX_BOOKING_SEATS} seats"));
        }
        if self.seats.iter().any(|s| SeatId::parse(s).is_err()) {
            return Some("a seat id out of form".into());
        }
        let unique: std::collections::HashSet<&String> = self.seats.iter().collect();
        if unique.len() != self.seats.len() {
            return Some("a seat named twice".into());
        }
        let parts = self.mac_parts();
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        if !signer.check_tag(MAC_DOMAIN, &refs, &self.mac) {
            return Some("not signed by the service".into());
        }
        None
    }
}

/// Errors of the booking pipeline.
#[derive(Debug, thiserror::Error)]
pub enum BookingError {
    /// No such booking.
    #[error("no such booking")]
    UnknownBooking,
    /// The hold lapsed or was released.
    #[error("the hold has expired or was released")]
    HoldExpired,
    /// A valid token that does not grant this.
    #[error("{0}")]
    Forbidden(&'static str),
    /// The request or a stored record is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The show, the token or Redis failed (see [`SeatError`]).
    #[error(transparent)]
    Seats(#[from] SeatError),
    /// Kafka did not acknowledge in time, or refused.
    #[error("kafka: {0}")]
    Kafka(String),
    /// The booking exists in Redis and its publication was attempted, but whether Kafka has it
    /// is not known yet: the answer is 503 with the booking id; the ledger decides it.
    #[error("the outcome of booking {booking_id} is not known yet")]
    Unknown {
        /// The booking the buyer can follow.
        booking_id: String,
    },
    /// The seats' sold mark did not reach a replica: the booking was undone, nothing sold.
    #[error("the booking could not be made safe against a failover; nothing was booked")]
    NotReplicated,
    /// PostgreSQL failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<RedisError> for BookingError {
    fn from(e: RedisError) -> Self {
        BookingError::Seats(SeatError::from(e))
    }
}

impl From<QueueError> for BookingError {
    fn from(e: QueueError) -> Self {
        BookingError::Seats(SeatError::Queue(e))
    }
}

impl From<BadId> for BookingError {
    fn from(e: BadId) -> Self {
        BookingError::Invalid(e.to_string())
    }
}
