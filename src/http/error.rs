//! `ApiError`: the one place a domain failure becomes an HTTP status and an error code.
//!
//! Every error body is `{"error": "<code>", "message": "<sentence>"}` (shared/API.md). A 5xx
//! never carries internals: the cause is logged, the body stays opaque.

use axum::extract::rejection::JsonRejection;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::booking::BookingError;
use crate::ids::BadId;
use crate::queue::QueueError;
use crate::seats::SeatError;
use crate::telemetry;

/// Seconds a client should wait before retrying after a 503.
pub const RETRY_AFTER_UNAVAILABLE: u64 = 2;
/// Seconds a person turned away by the memory guard should wait before entering again, at
/// least: memory comes back as people are admitted and leave, not within a second or two, and a
/// crowd at the door should not spend the capacity the sale needs. Each answer adds up to
/// [`RETRY_AFTER_FULL_SPREAD`] at random, so the people turned away in one second do not all
/// come back in one.
pub const RETRY_AFTER_FULL: u64 = 30;
/// See [`RETRY_AFTER_FULL`].
pub const RETRY_AFTER_FULL_SPREAD: u64 = 15;

/// An error answer of the API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `bad_request`.
    #[error("{0}")]
    BadRequest(String),
    /// 401 `unauthorized`.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 403 `forbidden`.
    #[error("{0}")]
    Forbidden(&'static str),
    /// 404 `not_found`.
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed` (added to the contract's table: a known path, another method).
    #[error("this method is not allowed on this path")]
    MethodNotAllowed,
    /// 409 `event_closed`.
    #[error("{0}")]
    EventClosed(String),
    /// 409 `conflict`.
    #[error("{0}")]
    Conflict(String),
    /// 409 `seat_unavailable`, naming the seats that were taken.
    #[error("some seats are no longer available; nothing was held")]
    SeatUnavailable(Vec<String>),
    /// 409 `sold_out`.
    #[error("not enough places are left")]
    SoldOut,
    /// 409 `hold_expired`.
    #[error("the hold has expired or was released")]
    HoldExpired,
    /// 413 `payload_too_large`.
    #[error("the request body is over 64 KiB")]
    PayloadTooLarge,
    /// 429 `rate_limited`, with the seconds to wait.
    #[error("too many requests from this client")]
    RateLimited(u64),
    /// 503 `unavailable`: a back end could not answer; nothing was decided.
    #[error("{0}")]
    Unavailable(&'static str),
    /// 503 `unavailable` with `booking_id`: the booking exists but its outcome is not known yet;
    /// `GET /v1/bookings/{id}` (or the same request again) tells it. Nothing is undone.
    #[error("the booking is not confirmed yet; follow it with GET /v1/bookings/{0}")]
    BookingPending(String),
    /// 503 `unavailable` with a longer Retry-After: the waiting room takes nobody new for now
    /// (the memory guard, [`crate::redis::memory`]).
    #[error("the waiting room is full for now; try again later")]
    Full,
}

impl ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::EventClosed(_)
            | ApiError::Conflict(_)
            | ApiError::SeatUnavailable(_)
            | ApiError::SoldOut
            | ApiError::HoldExpired => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::BookingPending(_) | ApiError::Full => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::EventClosed(_) => "event_closed",
            ApiError::Conflict(_) => "conflict",
            ApiError::SeatUnavailable(_) => "seat_unavailable",
            ApiError::SoldOut => "sold_out",
            ApiError::HoldExpired => "hold_expired",
            ApiError::PayloadTooLarge => "payload_too_large",
            ApiError::RateLimited(_) => "rate_limited",
            ApiError::Unavailable(_) | ApiError::BookingPending(_) | ApiError::Full => {
                "unavailable"
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.code(), "message": self.to_string()});
        if let ApiError::SeatUnavailable(seats) = &self {
            body["seats"] = json!(seats);
        }
        if let ApiError::BookingPending(id) = &self {
            body["booking_id"] = json!(id);
        }
        let body = Json(body);
        let retry_after = match &self {
            ApiError::RateLimited(s) => Some(*s),
            ApiError::Unavailable(_) | ApiError::BookingPending(_) => Some(RETRY_AFTER_UNAVAILABLE),
            ApiError::Full => {
                Some(RETRY_AFTER_FULL + rand::random_range(0..=RETRY_AFTER_FULL_SPREAD))
            }
            _ => None,
        };
        let mut resp = (self.status_code(), body).into_response();
        if let Some(s) = retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, s.into());
        }
        resp
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::UnknownEvent => ApiError::NotFound("no such event".into()),
            QueueError::UnknownTicket => ApiError::NotFound("no such ticket in this event".into()),
            QueueError::EventClosed(state) => {
                ApiError::EventClosed(format!("the event is {state}"))
            }
            QueueError::Invalid(m) => ApiError::BadRequest(m),
            QueueError::Conflict(m) => ApiError::Conflict(m),
            QueueError::CorruptConfig => {
                tracing::error!("event configuration unreadable");
                ApiError::Unavailable("the event's configuration cannot be read; try again later")
            }
            QueueError::WrongType => {
                tracing::error!("queue key of the wrong type persisted after repair");
                ApiError::Unavailable("the waiting line is being repaired; try again shortly")
            }
            QueueError::Full => ApiError::Full,
            QueueError::Redis(e) => {
                metrics::counter!(telemetry::REDIS_UNAVAILABLE).increment(1);
                tracing::error!(error = ?e, "redis unavailable");
                ApiError::Unavailable(
                    "the waiting line cannot be reached right now; try again shortly",
                )
            }
        }
    }
}

impl From<SeatError> for ApiError {
    fn from(e: SeatError) -> Self {
        match e {
            SeatError::UnknownShow => ApiError::NotFound("no such show".into()),
            SeatError::UnknownHold => ApiError::NotFound("no such hold".into()),
            SeatError::Invalid(m) => ApiError::BadRequest(m),
            SeatError::Taken(seats) => ApiError::SeatUnavailable(seats),
            SeatError::SoldOut => ApiError::SoldOut,
            SeatError::Conflict(m) => ApiError::Conflict(m),
            SeatError::Unauthorized(m) => ApiError::Unauthorized(m),
            SeatError::Forbidden(m) => ApiError::Forbidden(m),
            SeatError::Queue(e) => e.into(),
            SeatError::Db(e) => {
                tracing::error!(error = ?e, "postgres unavailable");
                ApiError::Unavailable(
                    "the booking ledger cannot be reached right now; try again shortly",
                )
            }
        }
    }
}

impl From<BookingError> for ApiError {
    fn from(e: BookingError) -> Self {
        match e {
            BookingError::UnknownBooking => ApiError::NotFound("no such booking".into()),
            BookingError::HoldExpired => ApiError::HoldExpired,
            BookingError::Forbidden(m) => ApiError::Forbidden(m),
            BookingError::Invalid(m) => ApiError::BadRequest(m),
            BookingError::Seats(e) => e.into(),
            BookingError::Db(e) => SeatError::Db(e).into(),
            BookingError::Kafka(e) => {
                tracing::error!(error = %e, "kafka did not take a booking");
                ApiError::Unavailable("the booking could not be confirmed as durable; repeat the same request to learn its outcome")
            }
            BookingError::Unknown { booking_id } => ApiError::BookingPending(booking_id),
            BookingError::NotReplicated => ApiError::Unavailable(
                "the booking could not be made safe against a failover; nothing was booked, try again",
            ),
        }
    }
}

impl From<BadId> for ApiError {
    fn from(e: BadId) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge
        } else {
            ApiError::BadRequest(format!("invalid JSON body: {}", r.body_text()))
        }
    }
}
