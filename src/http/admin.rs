//! Admin endpoints: create, update and inspect events. Bearer admin token required.

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;
use waitroom_strategies::StrategyKind;

use super::openapi::{ErrorBody, Limited};
use super::{ApiError, ApiJson, AppState};
use crate::auth::constant_time_eq;
use crate::ids::{EventId, ShowId};
use crate::queue::event::EventPatch;
use crate::queue::QueueError;
use crate::seats::{ShowOut, ShowSpec};

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/v1/events", get(list_events))
        .route("/admin/v1/events/{event}", put(put_event).get(get_event))
        .route("/admin/v1/events/{event}/strategy", put(put_strategy))
        .route("/admin/v1/shows/{show}", put(put_show))
}

/// 201 for a PUT that created the resource, 200 for one that updated it.
fn created_or_ok(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

/// Proof that the request carried the admin token.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(ApiError::Unauthorized("an admin bearer token is required"))?;
        if constant_time_eq(token.as_bytes(), state.admin_token.as_bytes()) {
            Ok(Admin)
        } else {
            Err(ApiError::Unauthorized("the admin token is not valid"))
        }
    }
}

/// Create or update an event.
#[utoipa::path(
    put,
    path = "/admin/v1/events/{event}",
    tag = "admin",
    params(("event" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "event id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    request_body = EventPatch,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "updated: the event and its configuration", body = Object),
        (status = 201, description = "created: the event and its configuration", body = Object),
        (status = 400, description = "malformed body, id or value out of range", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 409, description = "conflict: the change would lose people", body = ErrorBody),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(event = %event))]
pub(crate) async fn put_event(
    _: Admin,
    State(state): State<AppState>,
    Path(event): Path<String>,
    ApiJson(patch): ApiJson<EventPatch>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let event = EventId::parse(&event)?;
    let (config, created) = state.queue.put_event(&event, &patch).await?;
    let status = created_or_ok(created);
    Ok((
        status,
        Json(json!({"event": event.as_str(), "config": config.shown()})),
    ))
}

/// An event's configuration and live figures.
#[utoipa::path(
    get,
    path = "/admin/v1/events/{event}",
    tag = "admin",
    params(("event" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "event id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "configuration and stats", body = Object),
        (status = 400, description = "malformed id", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "no such event", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(event = %event))]
pub(crate) async fn get_event(
    _: Admin,
    State(state): State<AppState>,
    Path(event): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let event = EventId::parse(&event)?;
    let config = state.queue.event_config(&event).await?;
    let stats = state.queue.stats(&event, &config).await?;
    Ok(Json(
        json!({"event": event.as_str(), "config": config.shown(), "stats": stats}),
    ))
}

/// Every registered event with its configuration and live figures, by id.
#[utoipa::path(
    get,
    path = "/admin/v1/events",
    tag = "admin",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "every event with configuration and stats", body = Object),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all)]
pub(crate) async fn list_events(
    _: Admin,
    State(state): State<AppState>,
) -> Result<Json<Value>, ApiError> {
    let mut ids = state.queue.registered_events().await?;
    ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    let mut events = Vec::with_capacity(ids.len());
    for event in ids {
        let config = match state.queue.event_config(&event).await {
            Ok(c) => c,
            // Registered but gone or unreadable: listed by the single GET, not here.
            Err(QueueError::UnknownEvent | QueueError::CorruptConfig) => continue,
            Err(e) => return Err(e.into()),
        };
        let stats = state.queue.stats(&event, &config).await?;
        events.push(json!({"event": event.as_str(), "config": config.shown(), "stats": stats}));
    }
    Ok(Json(json!({ "events": events })))
}

/// Body of a strategy change.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StrategyRequest {
    /// The new strategy.
    #[schema(value_type = super::openapi::Strategy)]
    strategy: StrategyKind,
}

/// Switch an event's ordering strategy (every instance within a second).
#[utoipa::path(
    put,
    path = "/admin/v1/events/{event}/strategy",
    tag = "admin",
    params(("event" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "event id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    request_body = StrategyRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "the strategy now", body = Object),
        (status = 400, description = "malformed body or id", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "no such event", body = ErrorBody),
        (status = 409, description = "conflict", body = ErrorBody),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(event = %event))]
pub(crate) async fn put_strategy(
    _: Admin,
    State(state): State<AppState>,
    Path(event): Path<String>,
    ApiJson(body): ApiJson<StrategyRequest>,
) -> Result<Json<Value>, ApiError> {
    let event = EventId::parse(&event)?;
    state.queue.event_config(&event).await?;
    let patch = EventPatch {
        strategy: Some(body.strategy),
        ..Default::default()
    };
    let (config, _) = state.queue.put_event(&event, &patch).await?;
    Ok(Json(
        json!({"event": event.as_str(), "strategy": config.strategy}),
    ))
}

/// Create a show and its seats.
#[utoipa::path(
    put,
    path = "/admin/v1/shows/{show}",
    tag = "admin",
    params(("show" = String, Path, pattern = "^[a-z0-9][a-z0-9_-]{0,63}$", description = "show id: 1–64 of a-z, 0-9, _ and -, starting with a letter or digit")),
    request_body = ShowSpec,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "the show existed with these seats", body = ShowOut),
        (status = 201, description = "created", body = ShowOut),
        (status = 400, description = "malformed body or id, bad seat list", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "no such event", body = ErrorBody),
        (status = 409, description = "conflict: the show exists with other seats or another event", body = ErrorBody),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        Limited
    )
)]
#[tracing::instrument(skip_all, fields(show = %show))]
pub(crate) async fn put_show(
    _: Admin,
    State(state): State<AppState>,
    Path(show): Path<String>,
    ApiJson(spec): ApiJson<ShowSpec>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let show = ShowId::parse(&show)?;
    let (out, created) = state.seats.put_show(&show, &spec).await?;
    let status = created_or_ok(created);
    Ok((
        status,
        Json(serde_json::to_value(out).expect("show serializes")),
    ))
}
