//! Bookings: from a held seat to a row in PostgreSQL.
//!
//! - [`service`]: [`Bookings`] — a hold becoming a booking (authorize, mark sold, publish or
//!   undo, finish), a booking's status, rejected bookings settled into Redis, reconcile.
//! - [`producer`]: publishes a confirmed booking to Kafka and waits for the broker's
//!   acknowledgement (idempotent producer, `acks=all`, keyed by show so a show's bookings stay
//!   ordered). The HTTP 201 is sent only after that acknowledgement.
//! - [`consumer`]: the ledger — reads the topic in a consumer group, applies bookings to
//!   PostgreSQL in batches with a conditional update, and commits offsets only after the
//!   transaction commits (at-least-once delivery, made harmless by the booking id key).
//! - [`repo`]: the SQL.

pub mod consumer;
pub mod producer;
pub mod repo;
pub mod service;

pub use service::{BookingOut, Bookings, Drift};

use redis::RedisError;
use serde::{Deserialize, Serialize};

use crate::ids::BadId;
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
