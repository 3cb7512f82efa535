//! The OpenAPI 3 description of every route, generated from the handlers' `#[utoipa::path]`
//! attributes and the body types' `ToSchema` derives, served at `GET /openapi.json`.
//!
//! tests/it/openapi.rs checks it against shared/API.md (paths, methods, status codes, the error
//! body); `scripts/check-fuzz` lets schemathesis generate requests from it against a live service.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

use super::{admin, ops, pages, queue, seats};

/// The body of every error answer (shared/API.md, "Errors").
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error code: `bad_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `method_not_allowed`, `event_closed`, `conflict`, `seat_unavailable`, `sold_out`,
    /// `hold_expired`, `payload_too_large`, `rate_limited`, `unavailable`, `internal`.
    pub error: String,
    /// A sentence for people.
    pub message: String,
    /// `seat_unavailable`: the seats that were taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats: Option<Vec<String>>,
    /// A booking whose outcome is not known yet (503): follow it with `GET /v1/bookings/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub booking_id: Option<String>,
    /// `/readyz` when not ready: which check failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub checks: Option<serde_json::Value>,
}

/// The ordering strategies (names fixed by the contract).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// One cluster-wide counter.
    GlobalCounter,
    /// Arrival time.
    Timestamp,
    /// Shard rank scaled by the shard count.
    Statistical,
    /// Exact early, estimated when the line is large and stable.
    Hybrid,
}

/// Answers every public route may give.
#[derive(IntoResponses)]
pub enum Limited {
    /// Too many requests from this client.
    #[response(
        status = 429,
        description = "too many requests from this client",
        headers(("Retry-After" = u64, description = "seconds to wait"))
    )]
    RateLimited(ErrorBody),
    /// A back end could not answer; nothing was decided.
    #[response(
        status = 503,
        description = "Redis, Kafka or PostgreSQL could not answer; nothing was decided",
        headers(("Retry-After" = u64, description = "seconds to wait"))
    )]
    Unavailable(ErrorBody),
}

/// The security schemes: the access token of an admitted ticket and the admin token.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        for name in ["access_token", "admin_token"] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "waitroom",
        description = "A virtual waiting room and seat gate for flash ticket sales. The contract is shared/API.md."
    ),
    paths(
        queue::enter_queue,
        queue::poll_queue,
        queue::leave_queue,
        seats::get_event_shows,
        seats::get_seats,
        seats::create_hold,
        seats::release_hold,
        seats::create_booking,
        seats::get_booking,
        admin::list_events,
        admin::put_event,
        admin::get_event,
        admin::put_strategy,
        admin::put_show,
        ops::get_metrics,
        ops::get_health,
        ops::get_ready,
        get_openapi,
        pages::get_index,
        pages::get_event_page,
        pages::get_console,
        pages::get_static,
    ),
    components(schemas(ErrorBody, Strategy)),
    modifiers(&Bearer),
    tags(
        (name = "waiting room", description = "Enter, poll, leave"),
        (name = "seats", description = "Seat maps, holds and bookings"),
        (name = "admin", description = "Events and shows (admin token)"),
        (name = "operations", description = "Health, readiness, metrics, this description"),
        (name = "pages", description = "HTML pages and their assets"),
    )
)]
struct ApiDoc;

/// The description, as JSON (built once).
pub fn spec_json() -> &'static str {
    static SPEC: OnceLock<String> = OnceLock::new();
    SPEC.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("the description serializes")
    })
}

/// The OpenAPI 3 description of this API.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "this description", content_type = "application/json", body = Object), Limited)
)]
pub(crate) async fn get_openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], spec_json())
}
