//! Waiting-room endpoints: enter, poll, leave.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;

use super::{ApiError, ApiJson, AppState};
use crate::ids::{EventId, Ticket, UserId};
use crate::queue::QueueStatus;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/{event}/queue", post(enter_queue))
        .route(
            "/v1/events/{event}/queue/{ticket}",
            axum::routing::get(poll_queue).delete(leave_queue),
        )
}

/// Body of an enter request.
#[derive(Debug, Deserialize)]
pub struct EnterRequest {
    user_id: String,
}

#[tracing::instrument(skip_all, fields(event = %event))]
async fn enter_queue(
    State(state): State<AppState>,
    Path(event): Path<String>,
    ApiJson(body): ApiJson<EnterRequest>,
) -> Result<Json<QueueStatus>, ApiError> {
    let event = EventId::parse(&event)?;
    let user = UserId::parse(&body.user_id)?;
    state.limit(user.as_str())?;
    Ok(Json(state.queue.enter(&event, &user).await?))
}

#[tracing::instrument(skip_all, fields(event = %event))]
async fn poll_queue(
    State(state): State<AppState>,
    Path((event, ticket)): Path<(String, String)>,
) -> Result<Json<QueueStatus>, ApiError> {
    let event = EventId::parse(&event)?;
    let ticket = Ticket::parse(&ticket)?;
    state.limit(&ticket.to_member())?;
    Ok(Json(state.queue.poll(&event, &ticket).await?))
}

#[tracing::instrument(skip_all, fields(event = %event))]
async fn leave_queue(
    State(state): State<AppState>,
    Path((event, ticket)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let event = EventId::parse(&event)?;
    let ticket = Ticket::parse(&ticket)?;
    state.limit(&ticket.to_member())?;
    state.queue.leave(&event, &ticket).await?;
    Ok(StatusCode::NO_CONTENT)
}
