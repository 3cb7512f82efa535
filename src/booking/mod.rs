//! Bookings: from a held seat to a row in PostgreSQL.
//!
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

use serde::{Deserialize, Serialize};

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
    /// Kafka did not acknowledge in time, or refused.
    #[error("kafka: {0}")]
    Kafka(String),
    /// PostgreSQL failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}
