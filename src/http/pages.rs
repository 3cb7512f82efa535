//! The HTML pages: the index (`/`), the waiting room (`/events/{event}`), the operator console
//! (`/admin`) and their assets (`/static/{file}`), embedded in the binary with `include_str!`.
//!
//! The pages are static: they learn everything from the JSON API, the event id from their own
//! path. Every answer carries an `ETag` (a SHA-256 prefix of the file, computed once at first
//! use) and `Cache-Control: public, max-age=300`, so the crowd that reloads the waiting room
//! mostly gets 304s or nothing at all. Only the files listed in [`ASSETS`] are served; any other
//! name is the API's 404.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest as _, Sha256};

use super::openapi::{ErrorBody, Limited};
use super::{ApiError, AppState};

/// One embedded file: its name under `/static/`, its type and its text.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";

/// Every file the pages use; nothing else is served.
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: HTML,
        body: include_str!("static/index.html"),
    },
    Asset {
        name: "event.html",
        content_type: HTML,
        body: include_str!("static/event.html"),
    },
    Asset {
        name: "admin.html",
        content_type: HTML,
        body: include_str!("static/admin.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("static/app.js"),
    },
    Asset {
        name: "admin.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("static/admin.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("static/style.css"),
    },
];

/// The `ETag` of each asset, in the order of [`ASSETS`].
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.body.as_bytes());
            let prefix = u64::from_be_bytes(digest[..8].try_into().expect("SHA-256 has 32 bytes"));
            HeaderValue::from_str(&format!("\"{prefix:016x}\""))
                .expect("hex is a valid header value")
        })
        .collect()
});

/// Five minutes: a new release reaches every open page within that.
const CACHE_CONTROL: &str = "public, max-age=300";

/// The pages load only their own assets and talk only to this origin; nobody may frame them.
const CSP: &str = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(get_index))
        .route("/events/{event}", get(get_event_page))
        .route("/admin", get(get_console))
        .route("/static/{file}", get(get_static))
}

#[utoipa::path(
    get,
    path = "/",
    tag = "pages",
    responses(
        (status = 200, description = "the index page", content_type = "text/html", body = String),
        (status = 304, description = "the client's copy is current"),
        Limited
    )
)]
pub(crate) async fn get_index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// The same page for every event: the script reads the event id from the path.
#[utoipa::path(
    get,
    path = "/events/{event}",
    tag = "pages",
    params(("event" = String, Path, description = "event id (the page reads it from its path)")),
    responses(
        (status = 200, description = "the waiting-room page", content_type = "text/html", body = String),
        (status = 304, description = "the client's copy is current"),
        Limited
    )
)]
pub(crate) async fn get_event_page(headers: HeaderMap) -> Response {
    serve("event.html", &headers)
}

#[utoipa::path(
    get,
    path = "/admin",
    tag = "pages",
    responses(
        (status = 200, description = "the operator console", content_type = "text/html", body = String),
        (status = 304, description = "the client's copy is current"),
        Limited
    )
)]
pub(crate) async fn get_console(headers: HeaderMap) -> Response {
    serve("admin.html", &headers)
}

#[utoipa::path(
    get,
    path = "/static/{file}",
    tag = "pages",
    params(("file" = String, Path, description = "one of the pages' files: app.js, admin.js, style.css, …")),
    responses(
        (status = 200, description = "the file (HTML, JavaScript or CSS)", content_type = "text/plain", body = String),
        (status = 304, description = "the client's copy is current"),
        (status = 404, description = "no such file", body = ErrorBody),
        Limited
    )
)]
pub(crate) async fn get_static(
    Path(file): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if ASSETS.iter().any(|a| a.name == file) {
        Ok(serve(&file, &headers))
    } else {
        Err(ApiError::NotFound("no such file".into()))
    }
}

/// The asset `name` (one of [`ASSETS`]), or 304 when the client's copy is current.
fn serve(name: &str, headers: &HeaderMap) -> Response {
    let i = ASSETS
        .iter()
        .position(|a| a.name == name)
        .expect("only known assets are served");
    let (asset, etag) = (&ASSETS[i], ETAGS[i].clone());
    let mut resp = if client_has(headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let h = resp.headers_mut();
    h.insert(header::ETAG, etag);
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if asset.content_type == HTML {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    resp
}

/// Whether `If-None-Match` names `etag` (weak comparison, lists and `*` included).
fn client_has(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Ok(etag) = etag.to_str() else {
        return false;
    };
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim())
        .any(|t| t == "*" || t.trim_start_matches("W/") == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_inm(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn a_matching_if_none_match_gets_304_with_the_etag() {
        let etag = ETAGS[3].to_str().unwrap().to_owned();
        let inm = HeaderValue::from_str(&format!("\"x\", W/{etag}")).unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, inm);
        let resp = serve("app.js", &h);
        assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(resp.headers()[header::ETAG], etag.as_str());
    }

    #[test]
    fn another_etag_gets_the_file_with_its_type_and_cache_headers() {
        let resp = serve("style.css", &with_inm("\"0000000000000000\""));
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "text/css; charset=utf-8"
        );
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "public, max-age=300");
    }

    #[test]
    fn every_asset_has_a_distinct_etag() {
        let mut tags: Vec<_> = ETAGS.iter().collect();
        tags.sort_by_key(|t| t.as_bytes().to_vec());
        tags.dedup();
        assert_eq!(tags.len(), ASSETS.len());
    }
}
