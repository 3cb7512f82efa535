//! `/openapi.json` against the contract (shared/API.md): every route of the contract with its
//! methods and the status codes the contract names, the error body, `Retry-After` on 429 and
//! 503, and every path of the description really routed by the service.

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::common::{spawn_app, ADMIN_TOKEN};

/// (method, path, status codes the contract names for it).
const CONTRACT: &[(&str, &str, &[u16])] = &[
    (
        "post",
        "/v1/events/{event}/queue",
        &[200, 400, 404, 409, 413, 429, 503],
    ),
    (
        "get",
        "/v1/events/{event}/queue/{ticket}",
        &[200, 404, 429, 503],
    ),
    ("delete", "/v1/events/{event}/queue/{ticket}", &[204, 404]),
    ("get", "/v1/shows/{show}/seats", &[200, 404]),
    (
        "post",
        "/v1/shows/{show}/holds",
        &[201, 400, 401, 403, 409, 413, 429, 503],
    ),
    (
        "delete",
        "/v1/shows/{show}/holds/{hold_id}",
        &[204, 401, 403],
    ),
    (
        "post",
        "/v1/shows/{show}/bookings",
        &[201, 401, 403, 409, 503],
    ),
    ("get", "/v1/bookings/{booking_id}", &[200, 404]),
    (
        "put",
        "/admin/v1/events/{event}",
        &[200, 201, 400, 401, 409],
    ),
    ("get", "/admin/v1/events/{event}", &[200, 401, 404]),
    ("put", "/admin/v1/events/{event}/strategy", &[200, 400, 401]),
    ("put", "/admin/v1/shows/{show}", &[200, 201, 400, 401]),
    ("get", "/metrics", &[200]),
    ("get", "/healthz", &[200]),
    ("get", "/readyz", &[200, 503]),
    ("get", "/openapi.json", &[200]),
    ("get", "/events/{event}", &[200]),
    ("get", "/", &[200]),
    ("get", "/admin", &[200]),
];

#[tokio::test]
async fn the_served_description_covers_the_contract() {
    let app = spawn_app().await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let spec: Value = r.json().await.unwrap();
    assert!(
        spec["openapi"].as_str().unwrap().starts_with('3'),
        "OpenAPI 3"
    );
    for (method, path, codes) in CONTRACT {
        let op = &spec["paths"][path][method];
        assert!(
            op.is_object(),
            "{method} {path} is missing from the description"
        );
        for code in *codes {
            let resp = &op["responses"][code.to_string()];
            assert!(
                resp.is_object(),
                "{method} {path}: status {code} is not described"
            );
            if [429, 503].contains(code) {
                assert!(
                    resp["headers"]["Retry-After"].is_object(),
                    "{method} {path} {code}: Retry-After is not described"
                );
            }
            if *code >= 400 {
                let schema = &resp["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(
                    schema, "#/components/schemas/ErrorBody",
                    "{method} {path} {code}: not the contract's error body"
                );
            }
        }
    }
    let err = &spec["components"]["schemas"]["ErrorBody"];
    let required: Vec<&str> = err["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        required.contains(&"error") && required.contains(&"message"),
        "{err}"
    );
    let strategies = &spec["components"]["schemas"]["Strategy"]["enum"];
    for s in ["global_counter", "timestamp", "statistical", "hybrid"] {
        assert!(
            strategies.as_array().unwrap().contains(&Value::from(s)),
            "{strategies}"
        );
    }
}

#[tokio::test]
async fn every_described_route_is_served() {
    let app = spawn_app().await;
    let spec: Value = app.get("/openapi.json").await.json().await.unwrap();
    let paths = spec["paths"].as_object().unwrap();
    assert!(paths.len() >= 20, "{} paths", paths.len());
    for (path, ops) in paths {
        // Parameters filled with well-formed values that name nothing.
        let concrete = path
            .replace("{event}", "no-such-event")
            .replace("{show}", "no-such-show")
            .replace("{ticket}", "7c0d7d0e-8c0a-4a43-9d7e-3f5cf1f0b2a1")
            .replace("{hold_id}", "7c0d7d0e-8c0a-4a43-9d7e-3f5cf1f0b2a1")
            .replace("{booking_id}", "7c0d7d0e-8c0a-4a43-9d7e-3f5cf1f0b2a1")
            .replace("{file}", "app.js");
        for method in ops.as_object().unwrap().keys() {
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut req = app
                .http
                .request(m.clone(), format!("{}{concrete}", app.base))
                .bearer_auth(ADMIN_TOKEN);
            if m == Method::POST || m == Method::PUT {
                req = req.json(&serde_json::json!({}));
            }
            let r = req.send().await.unwrap();
            let status = r.status();
            let body = r.text().await.unwrap();
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert!(
                !body.contains("no such route"),
                "{method} {path} is described but not routed"
            );
            assert!(status.as_u16() < 500, "{method} {path}: {status} {body}");
        }
    }
}
