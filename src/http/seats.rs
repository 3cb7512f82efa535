//! Seat endpoints: the seat map, holds, bookings.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{ApiError, ApiJson, AppState};
use crate::booking::BookingOut;
use crate::ids::{EventId, ShowId};
use crate::seats::{HoldOut, HoldRequest, SeatMap};

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

/// The bearer token of a request, if any (its checks are the domain's).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

#[tracing::instrument(skip_all, fields(event = %event))]
async fn get_event_shows(
    State(state): State<AppState>,
    Path(event): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let event = EventId::parse(&event)?;
    // An unknown event is a 404, not an empty list.
    state.queue.event(&event).await?;
    let shows = state.seats.event_shows(&event).await?;
    Ok(Json(json!({"event": event.as_str(), "shows": shows})))
}

#[tracing::instrument(skip_all, fields(show = %show))]
async fn get_seats(
    State(state): State<AppState>,
    Path(show): Path<String>,
) -> Result<Json<SeatMap>, ApiError> {
    let show = ShowId::parse(&show)?;
    Ok(Json(state.seats.seats(&show).await?))
}

#[tracing::instrument(skip_all, fields(show = %show))]
async fn create_hold(
    State(state): State<AppState>,
    Path(show): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<HoldRequest>,
) -> Result<(StatusCode, Json<HoldOut>), ApiError> {
    let show = ShowId::parse(&show)?;
    let hold = state.seats.hold(&show, bearer(&headers), &body).await?;
    Ok((StatusCode::CREATED, Json(hold)))
}

#[tracing::instrument(skip_all, fields(show = %show))]
async fn release_hold(
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookingRequest {
    hold_id: String,
}

#[tracing::instrument(skip_all, fields(show = %show))]
async fn create_booking(
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

#[tracing::instrument(skip_all)]
async fn get_booking(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<BookingOut>, ApiError> {
    Ok(Json(state.bookings.booking(&id).await?))
}
