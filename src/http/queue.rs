//! Waiting-room endpoints: enter, poll, leave.

use axum::extract::{Path, RawQuery, State};
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
    RawQuery(query): RawQuery,
) -> Result<Json<QueueStatus>, ApiError> {
    let event = EventId::parse(&event)?;
    let ticket = Ticket::parse(&ticket)?;
    let last = last_shown(query.as_deref())?;
    state.limit(&ticket.to_member())?;
    Ok(Json(state.queue.poll_since(&event, &ticket, last).await?))
}

/// The optional `last=<position>` of a poll: the position the client shows now (docs/api.md).
fn last_shown(query: Option<&str>) -> Result<Option<u64>, ApiError> {
    let Some(query) = query else { return Ok(None) };
    let mut last = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        // Other parameters (cache busters) are ignored.
        if let Some(("last", v)) = pair.split_once('=') {
            let n: u64 = v.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                ApiError::BadRequest("last must be a position of 1 or more".into())
            })?;
            last = Some(n);
        }
    }
    Ok(last)
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
