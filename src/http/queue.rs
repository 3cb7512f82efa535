//! Waiting-room endpoints: enter, poll, leave.

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use utoipa::ToSchema;

use super::openapi::{ErrorBody, Limited};
use super::{ApiError, ApiJson, AppState};
use crate::auth::verify_entry;
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
#[derive(Debug, Deserialize, ToSchema)]
pub struct EnterRequest {
    /// The person's id at the selling site: 1–128 of A-Z, a-z, 0-9 and `._:@-`.
    #[schema(pattern = "^[A-Za-z0-9._:@-]{1,128}$")]
    user_id: String,
    /// Verified entry: the selling site's signature of `user_id` (docs/api.md).
    #[serde(default)]
    entry_token: Option<String>,
}

/// Enter the line (or learn where you stand: entering again never moves anyone back).
///
/// While a Redis node is near its memory limit, someone not yet in the line gets 503 with
/// `Retry-After` of 30–45 s (the memory guard); those already in it get their status as always.
#[utoipa::path(
    post,
    path = "/v1/events/{event}/queue",
    tag = "waiting room",
    params(("event" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "event id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    request_body = EnterRequest,
    responses(
        (status = 200, description = "the queue status", body = QueueStatus),
        (status = 400, description = "malformed body or id", body = ErrorBody),
        (status = 401, description = "verified entry: missing, invalid or expired entry_token", body = ErrorBody),
        (status = 404, description = "no such event", body = ErrorBody),
        (status = 409, description = "event_closed: the event is paused or closed", body = ErrorBody),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(event = %event))]
pub(crate) async fn enter_queue(
    State(state): State<AppState>,
    Path(event): Path<String>,
    ApiJson(body): ApiJson<EnterRequest>,
) -> Result<StatusJson, ApiError> {
    let event = EventId::parse(&event)?;
    let user = UserId::parse(&body.user_id)?;
    let ev = state.queue.event(&event).await?;
    if let Some(key) = &ev.config.entry_key {
        let now = crate::queue::now_ms() / 1000;
        verify_entry(
            key.as_bytes(),
            event.as_str(),
            user.as_str(),
            body.entry_token.as_deref(),
            now,
        )
        .map_err(|e| ApiError::Unauthorized(e.message()))?;
    }
    // After verification: bad tokens for someone's user id cannot spend that user's budget.
    state.limit(user.as_str(), "user")?;
    Ok(StatusJson(
        state.queue.enter_event(&event, &ev, &user).await?,
    ))
}

/// Where a ticket stands now.
#[utoipa::path(
    get,
    path = "/v1/events/{event}/queue/{ticket}",
    tag = "waiting room",
    params(("event" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "event id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit"), ("ticket" = String, Path, pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "the ticket (a UUID) the enter answer gave"),
        ("last" = Option<u64>, Query, minimum = 1, description = "the position the client shows now (estimated strategies keep it from moving back)")),
    responses(
        (status = 200, description = "the queue status", body = QueueStatus),
        (status = 400, description = "malformed id or last", body = ErrorBody),
        (status = 404, description = "no such event, or the ticket is unknown or has left", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(event = %event))]
pub(crate) async fn poll_queue(
    State(state): State<AppState>,
    Path((event, ticket)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<StatusJson, ApiError> {
    let event = EventId::parse(&event)?;
    let ticket = Ticket::parse(&ticket)?;
    let last = last_shown(query.as_deref())?;
    state.limit(&ticket.to_member(), "ticket")?;
    Ok(StatusJson(
        state.queue.poll_since(&event, &ticket, last).await?,
    ))
}

/// A queue status answer: what `Json(status)` sends (`content-type: application/json`, the same
/// bytes), written by [`QueueStatus::to_json`] instead of the derived serializer.
pub(crate) struct StatusJson(QueueStatus);

impl IntoResponse for StatusJson {
    fn into_response(self) -> Response {
        let mut r = Response::new(axum::body::Body::from(self.0.to_json()));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }
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

/// Leave the line, or give an active slot back.
#[utoipa::path(
    delete,
    path = "/v1/events/{event}/queue/{ticket}",
    tag = "waiting room",
    params(("event" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "event id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit"), ("ticket" = String, Path, pattern = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", description = "the ticket (a UUID) the enter answer gave")),
    responses(
        (status = 204, description = "left"),
        (status = 400, description = "malformed id", body = ErrorBody),
        (status = 404, description = "no such event or ticket", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(event = %event))]
pub(crate) async fn leave_queue(
    State(state): State<AppState>,
    Path((event, ticket)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let event = EventId::parse(&event)?;
    let ticket = Ticket::parse(&ticket)?;
    state.limit(&ticket.to_member(), "ticket")?;
    state.queue.leave(&event, &ticket).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn last_is_read_from_the_query() {
        assert_eq!(last_shown(None).unwrap(), None);
        assert_eq!(last_shown(Some("last=42")).unwrap(), Some(42));
        assert_eq!(last_shown(Some("t=1&last=7&x")).unwrap(), Some(7));
        for bad in ["last=0", "last=-1", "last=x", "last=", "last=1e3"] {
            assert!(last_shown(Some(bad)).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn any_query_is_a_position_a_400_or_nothing(q in "\\PC{0,80}") {
            match last_shown(Some(&q)) {
                Ok(Some(n)) => {
                    let pair = format!("last={}", n);
                    prop_assert!(n >= 1 && q.contains(&pair));
                }
                Ok(None) => prop_assert!(!q.split('&').any(|p| p.starts_with("last="))),
                Err(e) => prop_assert!(matches!(e, ApiError::BadRequest(_))),
            }
        }

        #[test]
        fn any_positive_last_round_trips(n in 1u64.., noise in "[a-z]{0,5}=[0-9]{0,3}") {
            let q = format!("{noise}&last={n}");
            prop_assert_eq!(last_shown(Some(&q)).unwrap(), Some(n));
        }

        #[test]
        fn enter_bodies_never_panic(body in "\\PC{0,120}") {
            let _ = serde_json::from_str::<EnterRequest>(&body);
        }

        #[test]
        fn entry_tokens_never_panic_and_forgeries_fail(token in "\\PC{0,100}") {
            let key = b"an entry key of at least thirty-two bytes";
            let r = crate::auth::verify_entry(key, "ev", "alice", Some(&token), 1_000);
            prop_assert!(r.is_err());
        }
    }
}
