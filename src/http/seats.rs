//! Seat endpoints: the seat map, holds, bookings.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::openapi::{ErrorBody, Limited};
use super::{ApiError, ApiJson, AppState};
use crate::booking::BookingOut;
use crate::ids::{EventId, ShowId};
use crate::seats::{HoldOut, HoldRequest, MapSource, SeatError, SeatMap, ShowSummary};
use crate::telemetry;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/{event}/shows", get(get_event_shows))
        .route("/v1/shows/{show}/seats", get(get_seats))
        .route("/v1/shows/{show}/holds", post(create_hold))
        .route("/v1/shows/{show}/holds/{hold_id}", delete(release_hold))
        .route("/v1/shows/{show}/bookings", post(create_booking))
        .route("/v1/bookings/{booking_id}", get(get_booking))
}

/// `GET /v1/events/{event}/shows`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventShows {
    /// The event.
    pub event: String,
    /// Its shows, by id.
    pub shows: Vec<ShowSummary>,
}

/// The bearer token of a request, if any (its checks are the domain's).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The shows of an event, for the waiting-room page.
#[utoipa::path(
    get,
    path = "/v1/events/{event}/shows",
    tag = "seats",
    params(("event" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "event id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    responses(
        (status = 200, description = "the event's shows", body = EventShows),
        (status = 400, description = "malformed id", body = ErrorBody),
        (status = 404, description = "no such event", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(event = %event))]
pub(crate) async fn get_event_shows(
    State(state): State<AppState>,
    Path(event): Path<String>,
) -> Result<Json<EventShows>, ApiError> {
    let event = EventId::parse(&event)?;
    // An unknown event is a 404, not an empty list.
    state.queue.event(&event).await?;
    let shows = state.seats.event_shows(&event).await?;
    Ok(Json(EventShows {
        event: event.as_str().to_owned(),
        shows,
    }))
}

/// The seat map, from this instance's snapshot of the show (at most
/// `WAITROOM_SEAT_MAP_MAX_AGE_MS` old): a flood of map reads costs Redis one read per show per
/// instance and interval. `If-None-Match` with the current `ETag` answers 304 without a body.
#[utoipa::path(
    get,
    path = "/v1/shows/{show}/seats",
    tag = "seats",
    params(("show" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "show id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit"),
        ("If-None-Match" = Option<String>, Header, description = "the ETag of a copy the client has")),
    responses(
        (status = 200, description = "the seat map", body = SeatMap,
            headers(("ETag" = String, description = "validator of this copy"))),
        (status = 304, description = "the client's copy is current"),
        (status = 400, description = "malformed id", body = ErrorBody),
        (status = 404, description = "no such show", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(show = %show))]
pub(crate) async fn get_seats(
    State(state): State<AppState>,
    Path(show): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let show = ShowId::parse(&show)?;
    let (snapshot, source) = state.seats.seat_map_snapshot(&show).await?;
    let snapshot = snapshot.as_ref().as_ref().ok_or(SeatError::UnknownShow)?;
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim() == snapshot.etag || t.trim() == "*")
        });
    let label = match (matches, source) {
        (true, _) => "not_modified",
        (false, MapSource::Snapshot) => "snapshot",
        (false, MapSource::Redis) => "redis",
    };
    metrics::counter!(telemetry::SEAT_MAP_READS, "source" => label).increment(1);
    let cache = [
        (header::ETAG, snapshot.etag.clone()),
        (header::CACHE_CONTROL, "no-cache".to_owned()),
    ];
    if matches {
        return Ok((StatusCode::NOT_MODIFIED, cache).into_response());
    }
    Ok((
        cache,
        [(header::CONTENT_TYPE, "application/json".to_owned())],
        snapshot.json.clone(),
    )
        .into_response())
}

/// Hold seats, all or nothing (or a general-admission quantity).
#[utoipa::path(
    post,
    path = "/v1/shows/{show}/holds",
    tag = "seats",
    params(("show" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "show id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    request_body = HoldRequest,
    security(("access_token" = [])),
    responses(
        (status = 201, description = "held", body = HoldOut),
        (status = 400, description = "malformed body, unknown or duplicate seats, more than max_seats_per_hold", body = ErrorBody),
        (status = 401, description = "missing, malformed, forged or expired access token", body = ErrorBody),
        (status = 403, description = "the token is for another event, or its session has ended", body = ErrorBody),
        (status = 404, description = "no such show", body = ErrorBody),
        (status = 409, description = "seat_unavailable (with seats), sold_out, or conflict: the ticket already holds seats here or is at its cap", body = ErrorBody),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(show = %show))]
pub(crate) async fn create_hold(
    State(state): State<AppState>,
    Path(show): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<HoldRequest>,
) -> Result<(StatusCode, Json<HoldOut>), ApiError> {
    let show = ShowId::parse(&show)?;
    let hold = state.seats.hold(&show, bearer(&headers), &body).await?;
    Ok((StatusCode::CREATED, Json(hold)))
}

/// Release a hold before it lapses.
#[utoipa::path(
    delete,
    path = "/v1/shows/{show}/holds/{hold_id}",
    tag = "seats",
    params(("show" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "show id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit"), ("hold_id" = String, Path, pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "the hold id (a UUID)")),
    security(("access_token" = [])),
    responses(
        (status = 204, description = "released"),
        (status = 400, description = "malformed id", body = ErrorBody),
        (status = 401, description = "missing, malformed, forged or expired access token", body = ErrorBody),
        (status = 403, description = "another ticket's hold, another event's token, or the session has ended", body = ErrorBody),
        (status = 404, description = "no such show or hold", body = ErrorBody),
        (status = 409, description = "the hold is booked", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(show = %show))]
pub(crate) async fn release_hold(
    State(state): State<AppState>,
    Path((show, hold_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let show = ShowId::parse(&show)?;
    state
        .seats
        .release(&show, &hold_id, bearer(&headers))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Body of a booking request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BookingRequest {
    /// The hold to confirm.
    hold_id: String,
}

/// Confirm a hold: a 201 is a promise.
#[utoipa::path(
    post,
    path = "/v1/shows/{show}/bookings",
    tag = "seats",
    params(("show" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "show id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    request_body = BookingRequest,
    security(("access_token" = [])),
    responses(
        (status = 201, description = "booked (pending until the ledger confirms)", body = BookingOut),
        (status = 400, description = "malformed body or id", body = ErrorBody),
        (status = 401, description = "missing, malformed, forged or expired access token", body = ErrorBody),
        (status = 403, description = "another ticket's hold, another event's token, or the session has ended", body = ErrorBody),
        (status = 404, description = "no such show", body = ErrorBody),
        (status = 409, description = "hold_expired", body = ErrorBody),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(show = %show))]
pub(crate) async fn create_booking(
    State(state): State<AppState>,
    Path(show): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<BookingRequest>,
) -> Result<(StatusCode, Json<BookingOut>), ApiError> {
    let show = ShowId::parse(&show)?;
    let booking = state
        .bookings
        .book(&show, bearer(&headers), &body.hold_id)
        .await?;
    Ok((StatusCode::CREATED, Json(booking)))
}

/// A booking's status.
#[utoipa::path(
    get,
    path = "/v1/bookings/{booking_id}",
    tag = "seats",
    params(("booking_id" = String, Path, pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "the booking id (a UUID)")),
    responses(
        (status = 200, description = "the booking", body = BookingOut),
        (status = 400, description = "malformed id", body = ErrorBody),
        (status = 404, description = "no such booking", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all)]
pub(crate) async fn get_booking(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<BookingOut>, ApiError> {
    Ok(Json(state.bookings.booking(&id).await?))
}
