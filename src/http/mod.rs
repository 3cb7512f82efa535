//! The HTTP layer: shared state, the router, and the pieces every handler uses.
//!
//! Handlers only extract, call a domain function and map the result; each `http/*.rs` exports
//! `router()`, merged here.

pub mod admin;
pub mod error;
pub mod limits;
pub mod openapi;
pub mod ops;
pub mod pages;
pub mod queue;
pub mod seats;
pub mod server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};
use tower_http::trace::TraceLayer;
use tracing::{Level, Span};

use crate::booking::Bookings;
use crate::queue::Queue;
use crate::seats::Seats;
use crate::telemetry;
pub use error::ApiError;
use ops::Readiness;

/// Largest request body accepted (shared/API.md: 413 above 64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// State shared by all handlers: one `Arc`, so that the copy axum makes for each request (and
/// each middleware) is one reference count, not one per part. Six counts touched by every
/// request on every core cost 4.8 % of the service's samples in a poll profile
/// (`drop_in_place<AppState>`, docs/benchmarks.md).
#[derive(Clone)]
pub struct AppState(Arc<AppStateParts>);

impl AppState {
    /// The state over its parts.
    pub fn new(parts: AppStateParts) -> Self {
        AppState(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppStateParts;
    fn deref(&self) -> &AppStateParts {
        &self.0
    }
}

/// The parts of [`AppState`].
pub struct AppStateParts {
    /// The waiting room.
    pub queue: Arc<Queue>,
    /// Shows, seat maps and holds.
    pub seats: Arc<Seats>,
    /// Bookings.
    pub bookings: Arc<Bookings>,
    /// Bearer token for /admin.
    pub admin_token: Arc<str>,
    /// Per-client request limits.
    pub limits: Arc<limits::ClientLimits>,
    /// Back ends checked by /readyz.
    pub readiness: Arc<Readiness>,
    /// Handles of the per-request metrics.
    pub request_metrics: RequestMetrics,
}

/// The handles of `waitroom_http_requests_total` and `waitroom_http_request_duration_seconds`
/// by (route, method, status), registered on the first request of each: a request then adds to
/// its handles instead of allocating two label sets and looking both up in the registry. The
/// labels are interned `&'static str`s ([`intern`]), so the map holds at most a few thousand
/// entries (routes × methods × statuses seen); past [`RequestMetrics::MAX`] a request records
/// through the registry as before.
#[derive(Default)]
pub struct RequestMetrics {
    handles: std::sync::RwLock<std::collections::HashMap<RequestLabels, RequestHandles>>,
}

type RequestLabels = (&'static str, &'static str, &'static str);
type RequestHandles = (metrics::Counter, metrics::Histogram);

impl RequestMetrics {
    /// Most label sets kept.
    const MAX: usize = 4096;

    fn record(&self, labels: RequestLabels, seconds: f64) {
        let record = |(requests, latency): &RequestHandles| {
            requests.increment(1);
            latency.record(seconds);
        };
        // The common case records under the read lock: no handle is cloned.
        if let Some(handles) = self
            .handles
            .read()
            .ok()
            .as_deref()
            .and_then(|m| m.get(&labels))
        {
            record(handles);
            return;
        }
        let (route, method, status) = labels;
        let handles = (
            metrics::counter!(telemetry::HTTP_REQUESTS, "route" => route, "method" => method, "status" => status),
            metrics::histogram!(telemetry::HTTP_LATENCY, "route" => route, "method" => method),
        );
        record(&handles);
        if let Ok(mut m) = self.handles.write() {
            if m.len() < Self::MAX {
                m.insert(labels, handles);
            }
        }
    }
}

impl AppState {
    /// Counts one request of a ticket or user id against its limit: 429 with `Retry-After`
    /// when over.
    pub fn limit(&self, key: &str, kind: &'static str) -> Result<(), ApiError> {
        self.limits.check_key(key, kind)
    }
}

/// A JSON body whose rejections are API errors (400, or 413 over the body limit).
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// The whole API. Every request is bounded by `timeout` (answered 503 with the contract's
/// body when it runs out), reading its body by `body_timeout` (a body not sent in time is a 400),
/// counted against its client's address limit, and traced.
pub fn router(state: AppState, timeout: Duration, body_timeout: Duration) -> Router {
    Router::new()
        .merge(queue::router())
        .merge(admin::router())
        .merge(seats::router())
        .merge(ops::router())
        .merge(pages::router())
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            timeout,
        ))
        .layer(RequestBodyTimeoutLayer::new(body_timeout))
        .layer(middleware::from_fn_with_state(state.clone(), edge))
        .layer(TraceLayer::new_for_http().on_failure(log_failure))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("handler panicked");
            let body =
                axum::Json(serde_json::json!({"error": "internal", "message": "internal error"}));
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
        }))
        .with_state(state)
}

/// How loud a failed answer is in the log. A 503 is the service refusing on purpose: a back end
/// is down (the fault itself is logged at ERROR where it is met, `ApiError::from`), a request ran
/// out of time, or `/readyz` says "not yet" while the service starts. Each is counted in
/// `waitroom_http_requests_total`; a second ERROR line per answer would double an outage's log
/// and page whoever alerts on ERROR at every start-up. Anything else (a 500, a connection
/// error) is an error.
fn failure_level(class: &ServerErrorsFailureClass) -> Level {
    match class {
        ServerErrorsFailureClass::StatusCode(StatusCode::SERVICE_UNAVAILABLE) => Level::WARN,
        _ => Level::ERROR,
    }
}

/// The trace layer's failure log, at [`failure_level`].
fn log_failure(class: ServerErrorsFailureClass, latency: Duration, span: &Span) {
    let ms = latency.as_millis() as u64;
    if failure_level(&class) == Level::WARN {
        tracing::warn!(parent: span, classification = %class, latency_ms = ms, "response failed");
    } else {
        tracing::error!(parent: span, classification = %class, latency_ms = ms, "response failed");
    }
}

/// The per-request work around every route, as one middleware (each `from_fn` layer costs a
/// boxed future and a service clone per request): the request's metrics, the client address
/// limit, and the contract's body for a bare 503.
async fn edge(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| intern(p.as_str()));
    let method = intern(req.method().as_str());
    let resp = match limits::by_address(&state, &req) {
        Ok(()) => contract_errors(next.run(req).await),
        Err(e) => e.into_response(),
    };
    let status = intern(resp.status().as_str());
    state
        .request_metrics
        .record((route, method, status), start.elapsed().as_secs_f64());
    resp
}

/// Gives a bare 503 from a layer below the handlers (the request timeout) the contract's error
/// body and `Retry-After`.
fn contract_errors(resp: Response) -> Response {
    if resp.status() == StatusCode::SERVICE_UNAVAILABLE
        && !resp.headers().contains_key(header::CONTENT_TYPE)
    {
        return ApiError::Unavailable("the request took too long; try again shortly")
            .into_response();
    }
    resp
}

/// A metric label value as a `&'static str`, so recording it allocates nothing. Only for the
/// bounded sets it is used on: route templates, methods and status codes (hyper accepts
/// extension methods, so those fold into one value).
fn intern(value: &str) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{OnceLock, RwLock};
    const METHODS: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE",
    ];
    static SEEN: OnceLock<RwLock<HashSet<&'static str>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(v) = seen.read().ok().and_then(|s| s.get(value).copied()) {
        return v;
    }
    let mut set = match seen.write() {
        Ok(set) => set,
        Err(_) => return "other",
    };
    if let Some(v) = set.get(value) {
        return v;
    }
    // Anything beyond the routes, the standard methods and the status codes is one value.
    let known = METHODS.contains(&value)
        || value.starts_with('/')
        || (value.len() == 3 && value.bytes().all(|b| b.is_ascii_digit()));
    if !known || set.len() > 512 {
        return "other";
    }
    let leaked: &'static str = Box::leak(value.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_503_is_logged_as_a_warning_and_every_other_failure_as_an_error() {
        let status = |s| failure_level(&ServerErrorsFailureClass::StatusCode(s));
        assert_eq!(status(StatusCode::SERVICE_UNAVAILABLE), Level::WARN);
        assert_eq!(status(StatusCode::INTERNAL_SERVER_ERROR), Level::ERROR);
        assert_eq!(status(StatusCode::GATEWAY_TIMEOUT), Level::ERROR);
        assert_eq!(
            failure_level(&ServerErrorsFailureClass::Error("connection reset".into())),
            Level::ERROR
        );
    }
}
