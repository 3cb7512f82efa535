//! The load generator's HTTP client for the sale's own requests: hyper's pooled HTTP/1 client,
//! without reqwest's layers.
//!
//! reqwest wraps every request in a redirect follower, a retry layer and a timeout, takes its URL
//! as a `url::Url` (a string is parsed, host and all, for each request) and parses the final URL
//! again from each response. On these 2 cores the load generator shares the machine with the
//! service and Redis, so what it spends per request is taken from them: the profile of its enters
//! put URL parsing alone at 6.8–8.3 % of its CPU (docs/benchmarks.md, "An Intel machine, the
//! broker's idle cost, and the load generator's client"). The routes it plays need none of those layers: one request, one answer, a deadline.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// One request's outcome: the status and the whole body, or why there is none.
pub type Answer = Result<(u16, Bytes), Failure>;

/// Why a request has no answer.
#[derive(Debug)]
pub enum Failure {
    /// No connection, or the connection broke.
    Transport(String),
    /// No whole answer within the deadline.
    TimedOut,
}

/// A pooled HTTP/1 client with a deadline per request (connect, send and the whole body).
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    deadline: Duration,
}

impl Http {
    /// A client keeping up to `idle` connections per host open between requests.
    pub fn new(idle: usize, deadline: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Http {
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(idle)
                .build(connector),
            deadline,
        }
    }

    /// Sends `req` and reads its whole answer.
    pub async fn send(&self, req: Request<Full<Bytes>>) -> Answer {
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| Failure::Transport(e.to_string()))?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| Failure::Transport(e.to_string()))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.deadline, exchange)
            .await
            .unwrap_or(Err(Failure::TimedOut))
    }
}

/// A request to `uri`: a JSON body when given, a bearer token when given.
pub fn request(
    method: Method,
    uri: Uri,
    token: Option<&str>,
    json: Option<String>,
) -> Request<Full<Bytes>> {
    let has_json = json.is_some();
    let mut req = Request::new(Full::new(json.map(Bytes::from).unwrap_or_default()));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    if has_json {
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
    }
    if let Some(token) = token {
        if let Ok(v) = header::HeaderValue::from_str(&format!("Bearer {token}")) {
            headers.insert(header::AUTHORIZATION, v);
        }
    }
    req
}

/// `base` and `path` as one URI (http's own parser: no host normalisation, no IDNA), or the
/// reason it is not one.
pub fn uri(base: &str, path: &str) -> Result<Uri, http::uri::InvalidUri> {
    format!("{base}{path}").parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_carries_its_method_uri_body_and_headers() {
        let uri = uri("http://127.0.0.1:8095", "/v1/events/e/queue").expect("uri");
        let req = request(
            Method::POST,
            uri,
            Some("tok"),
            Some(r#"{"user_id":"lg1"}"#.into()),
        );
        assert_eq!(req.method(), Method::POST);
        assert_eq!(req.uri().path(), "/v1/events/e/queue");
        assert_eq!(
            req.uri().authority().map(|a| a.as_str()),
            Some("127.0.0.1:8095")
        );
        assert_eq!(req.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(req.headers()[header::AUTHORIZATION], "Bearer tok");
        let plain = request(Method::GET, uri_of("/x"), None, None);
        assert!(plain.headers().get(header::CONTENT_TYPE).is_none());
        assert!(plain.headers().get(header::AUTHORIZATION).is_none());
    }

    fn uri_of(path: &str) -> Uri {
        uri("http://127.0.0.1:1", path).expect("uri")
    }

    #[tokio::test]
    async fn an_answer_that_does_not_come_in_time_is_a_timeout_and_a_refused_connection_a_transport_failure(
    ) {
        // A listener that takes the connection and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let held = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.expect("accept");
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(socket);
        });
        let http = Http::new(1, Duration::from_millis(200));
        let started = std::time::Instant::now();
        let silent = uri(&format!("http://{addr}"), "/x").expect("uri");
        let answer = http.send(request(Method::GET, silent, None, None)).await;
        assert!(matches!(answer, Err(Failure::TimedOut)), "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        held.abort();

        // A port nobody listens on: the listener above is gone.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let gone = closed.local_addr().expect("addr");
        drop(closed);
        let refused = uri(&format!("http://{gone}"), "/x").expect("uri");
        let answer = http.send(request(Method::GET, refused, None, None)).await;
        assert!(matches!(answer, Err(Failure::Transport(_))), "{answer:?}");
    }

    #[test]
    fn a_base_that_is_not_a_uri_is_refused() {
        assert!(uri("http://exa mple", "/x").is_err());
    }
}
