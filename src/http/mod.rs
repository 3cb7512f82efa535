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

use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::classify::ServerErrorsFailureClass;
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
/// through the registry as before. Hashed with foldhash, as [`intern`]'s set: the keys are the
/// service's own bounded labels, so SipHash's defence against chosen keys buys nothing
/// (docs/benchmarks.md, "Hashing on the request path").
#[derive(Default)]
pub struct RequestMetrics {
    handles: std::sync::RwLock<foldhash::HashMap<RequestLabels, RequestHandles>>,
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
///
/// `Router::layer` wraps each route on its own, and axum clones a route's whole stack of
/// layers (each a boxed service) for every request. So only [`Edge`], which needs the matched
/// route for its metrics, wraps the routes; the layers that do not care which route matched
/// (panics, the body limit, the trace, the body deadline) wrap the router once, outside it.
/// Measured with scripts/bench-instr: 78.7k → 72.9k instructions per numbered enter for the
/// move, 70.4k with `Edge` in place of a `from_fn` middleware and a timeout layer.
pub fn router(
    state: AppState,
    timeout: Duration,
    body_timeout: Duration,
) -> impl tower::Service<
    Request<hyper::body::Incoming>,
    Response = Response,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send,
> + Clone
       + Send
       + 'static {
    let routes = Router::new()
        .merge(queue::router())
        .merge(admin::router())
        .merge(seats::router())
        .merge(ops::router())
        .merge(pages::router())
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(EdgeLayer {
            state: state.clone(),
            timeout,
        })
        .with_state(state);
    around(routes, body_timeout)
}

/// The layers around the whole router (see [`router`]): a panic answered 500 with the
/// contract's body, the body limit, the trace, the body deadline. Generic in the request body
/// so a test can drive it with routes of its own.
fn around<B>(
    routes: Router,
    body_timeout: Duration,
) -> impl tower::Service<
    Request<B>,
    Response = Response,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send,
> + Clone
       + Send
       + 'static
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    tower::ServiceBuilder::new()
        .map_response(|r: axum::http::Response<_>| r.map(axum::body::Body::new))
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("handler panicked");
            let body =
                axum::Json(serde_json::json!({"error": "internal", "message": "internal error"}));
            (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
        }))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http().on_failure(log_failure))
        .map_request(move |r: Request<B>| r.map(|body| DeadlineBody::new(body, body_timeout)))
        .service(routes)
}

pin_project_lite::pin_project! {
    /// A request body that must keep coming: once a read of it waits, its next frame is due
    /// within the deadline, else the read fails (a 400 from the JSON extractor). tower-http's
    /// `TimeoutBody` starts a timer at every read, waiting or not (two per enter: its JSON,
    /// then the end); this one starts it only when a read has to wait, so a body that came
    /// with its headers costs no timer (docs/benchmarks.md, "A body deadline without a timer").
    struct DeadlineBody<B> {
        #[pin]
        body: B,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        deadline: Duration,
    }
}

impl<B> DeadlineBody<B> {
    fn new(body: B, deadline: Duration) -> Self {
        DeadlineBody {
            body,
            sleep: None,
            deadline,
        }
    }
}

/// A request body whose next frame did not come within the body deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTooSlow;

impl<B> hyper::body::Body for DeadlineBody<B>
where
    B: hyper::body::Body,
    B::Error: Into<axum::BoxError>,
{
    type Data = B::Data;
    type Error = axum::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<B::Data>, axum::BoxError>>> {
        use std::future::Future as _;
        use std::task::Poll;
        let mut this = self.project();
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            this.sleep.set(None);
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep(*this.deadline)));
        }
        if let Some(sleep) = this.sleep.as_pin_mut() {
            if sleep.poll(cx).is_ready() {
                return Poll::Ready(Some(Err(BodyTooSlow.into())));
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
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

/// The per-request work around every route (see [`Edge`]).
#[derive(Clone)]
struct EdgeLayer {
    state: AppState,
    timeout: Duration,
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            state: self.state.clone(),
            timeout: self.timeout,
        }
    }
}

/// The per-request work around every route, written as one service: the request's deadline
/// (a 503 with the contract's body and `Retry-After` when it runs out), the request's
/// metrics by matched route, and the client address limit. It wraps each route because only
/// there is the matched route known. A `from_fn` middleware and a timeout layer did the same
/// with a boxed service, a boxed `Next` and a second service clone per request
/// (docs/benchmarks.md, "The HTTP layers").
#[derive(Clone)]
struct Edge<S> {
    inner: S,
    state: AppState,
    timeout: Duration,
}

impl<S> tower::Service<Request> for Edge<S>
where
    S: tower::Service<Request, Response = Response, Error = std::convert::Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let start = Instant::now();
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", |p| intern(p.as_str()));
        let method = method_label(req.method());
        let state = self.state.clone();
        let answer = match limits::by_address(&state, &req) {
            Ok(()) => Ok(tokio::time::timeout(self.timeout, self.inner.call(req))),
            Err(e) => Err(e),
        };
        Box::pin(async move {
            let resp = match answer {
                Ok(running) => match running.await {
                    Ok(Ok(resp)) => resp,
                    Err(_elapsed) => {
                        ApiError::Unavailable("the request took too long; try again shortly")
                            .into_response()
                    }
                },
                Err(e) => e.into_response(),
            };
            let status = intern(resp.status().as_str());
            state
                .request_metrics
                .record((route, method, status), start.elapsed().as_secs_f64());
            Ok(resp)
        })
    }
}

/// A request method as a metric label: the standard ones without a lookup, the rest through
/// [`intern`] (which folds extension methods into one value).
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => intern(method.as_str()),
    }
}

/// A metric label value as a `&'static str`, so recording it allocates nothing. Only for the
/// bounded sets it is used on: route templates, methods and status codes (hyper accepts
/// extension methods, so those fold into one value).
fn intern(value: &str) -> &'static str {
    use foldhash::HashSet;
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

    #[tokio::test]
    async fn a_handler_that_panics_is_a_500_with_the_contract_body_and_the_next_request_is_served()
    {
        use tower::ServiceExt as _;
        let routes = Router::new()
            .route(
                "/boom",
                axum::routing::get(|| async {
                    if std::hint::black_box(true) {
                        panic!("a handler's bug, on purpose");
                    }
                    "unreachable"
                }),
            )
            .route("/fine", axum::routing::get(|| async { "fine" }));
        let app = around::<axum::body::Body>(routes, Duration::from_secs(5));
        let get = |path: &str| {
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let resp = app.clone().oneshot(get("/boom")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "internal", "message": "internal error"})
        );
        let resp = app.oneshot(get("/fine")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"fine");
    }

    #[tokio::test]
    async fn a_body_that_stops_coming_is_a_400_at_its_deadline_and_one_that_keeps_coming_is_read() {
        use futures::StreamExt as _;
        use tower::ServiceExt as _;
        let routes = Router::new().route(
            "/echo",
            axum::routing::post(
                |ApiJson(v): ApiJson<serde_json::Value>| async move { axum::Json(v) },
            ),
        );
        let app = around::<axum::body::Body>(routes, Duration::from_millis(300));
        // Parts sent `ms` after the one before; with `end` false the body then stays open.
        let post = |parts: Vec<(u64, &'static str)>, end: bool| {
            let parts = futures::stream::iter(parts).then(|(ms, s)| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<_, std::io::Error>(axum::body::Bytes::from_static(s.as_bytes()))
            });
            let parts = if end {
                parts.boxed()
            } else {
                parts.chain(futures::stream::pending()).boxed()
            };
            axum::http::Request::post("/echo")
                .header("content-type", "application/json")
                .body(axum::body::Body::from_stream(parts))
                .unwrap()
        };
        // Three parts 200 ms apart: 400 ms in all, each part within the 300 ms deadline.
        let resp = app
            .clone()
            .oneshot(post(vec![(0, "{\"a\":"), (200, "1"), (200, "}")], true))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], br#"{"a":1}"#);
        // Half a body, then nothing: a 400 once the deadline has passed.
        let started = Instant::now();
        let resp = tokio::time::timeout(
            Duration::from_secs(5),
            app.oneshot(post(vec![(0, "{\"a\":")], false)),
        )
        .await
        .expect("the body deadline did not end the read")
        .unwrap();
        let waited = started.elapsed();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert!(
            waited >= Duration::from_millis(290) && waited < Duration::from_secs(3),
            "answered after {waited:?}"
        );
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "bad_request");
    }

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
