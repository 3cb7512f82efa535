//! Per-client limits (GCRA, the `governor` crate), keyed by what a client cannot choose freely.
//!
//! - **address**: every request, keyed by the client's address — the peer, or, when the peer is
//!   a configured trusted proxy, the right-most address in `X-Forwarded-For` that is not one
//!   (an IPv6 client is keyed by its /64, what one subscriber usually gets);
//! - **admin**: a tighter limit on `/admin` routes, by address;
//! - **ticket** / **user**: polls and leaves per ticket, enters per user id, so one client cannot
//!   poll in a tight loop even from many addresses.
//!
//! Each limit is per instance: with N instances behind a balancer a client gets up to N times
//! the rate (docs/security.md sizes it). `WAITROOM_CLIENT_RATE_PER_SECOND=0` turns all off.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

use axum::extract::Request;
use axum::http::HeaderMap;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ipnet::IpNet;

use super::{ApiError, AppState};
use crate::config::HttpConfig;
use crate::telemetry;

/// The limiters of one instance.
pub struct ClientLimits {
    address: Option<DefaultKeyedRateLimiter<IpAddr>>,
    admin: Option<DefaultKeyedRateLimiter<IpAddr>>,
    key: Option<DefaultKeyedRateLimiter<String>>,
    trusted: Vec<IpNet>,
}

fn limiter<K: std::hash::Hash + Eq + Clone>(
    rate: u32,
    burst: u32,
) -> Option<DefaultKeyedRateLimiter<K>> {
    let rate = NonZeroU32::new(rate)?;
    let burst = NonZeroU32::new(burst).unwrap_or(rate);
    Some(RateLimiter::keyed(
        Quota::per_second(rate).allow_burst(burst),
    ))
}

/// Parses `WAITROOM_TRUSTED_PROXIES`: CIDRs or single addresses.
pub fn parse_trusted(list: &[String]) -> Result<Vec<IpNet>, String> {
    list.iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| {
            IpNet::from_str(s)
                .or_else(|_| IpAddr::from_str(s).map(IpNet::from))
                .map_err(|_| format!("not an address or CIDR: {s}"))
        })
        .collect()
}

impl ClientLimits {
    /// The limits `http` asks for; every one off when `client_rate_per_second` is 0.
    pub fn new(http: &HttpConfig) -> Result<Self, String> {
        let trusted = parse_trusted(&http.trusted_proxies)?;
        if http.client_rate_per_second == 0 {
            return Ok(ClientLimits {
                address: None,
                admin: None,
                key: None,
                trusted,
            });
        }
        Ok(ClientLimits {
            address: limiter(http.address_rate_per_second, http.address_burst),
            admin: limiter(
                http.admin_rate_per_second,
                http.admin_rate_per_second.saturating_mul(2),
            ),
            key: limiter(http.client_rate_per_second, http.client_burst),
            trusted,
        })
    }

    /// Forgets clients not seen lately (run every few seconds; keeps memory bounded).
    pub fn retain_recent(&self) {
        for l in [&self.address, &self.admin].into_iter().flatten() {
            l.retain_recent();
        }
        if let Some(l) = &self.key {
            l.retain_recent();
        }
    }

    /// The address a request is counted against (see the module doc).
    pub fn client_address(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer;
        if !self.is_trusted(peer) {
            return key_of(client);
        }
        // Right to left: each hop appended the address it saw; the first untrusted one is the
        // client as far as we can know it. Everything left of it could be forged.
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) => {
                    client = ip;
                    if !self.is_trusted(ip) {
                        break;
                    }
                }
                // A malformed hop: stop at the last address we could trust to be what it says.
                Err(_) => break,
            }
        }
        key_of(client)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// Counts one request by `client` against the address limit (and the admin one).
    pub fn check_address(&self, client: IpAddr, admin: bool) -> Result<(), ApiError> {
        if let Some(l) = &self.address {
            check(l, &client, "address")?;
        }
        match (&self.admin, admin) {
            (Some(l), true) => check(l, &client, "admin"),
            _ => Ok(()),
        }
    }

    /// Counts one request of a ticket or user id (`kind` names it in the metric and keeps the
    /// two apart: a user id spelled like someone's ticket does not share its budget).
    pub fn check_key(&self, key: &str, kind: &'static str) -> Result<(), ApiError> {
        match &self.key {
            Some(l) => check(l, &format!("{kind}:{key}"), kind),
            None => Ok(()),
        }
    }
}

/// IPv4 as is; IPv6 by its /64.
fn key_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

fn check<K: std::hash::Hash + Eq + Clone>(
    l: &DefaultKeyedRateLimiter<K>,
    key: &K,
    kind: &'static str,
) -> Result<(), ApiError> {
    l.check_key(key).map_err(|not_until| {
        metrics::counter!(telemetry::RATE_LIMITED, "limit" => kind).increment(1);
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        ApiError::RateLimited(retry_after(wait))
    })
}

/// Whole seconds to wait, at least 1 (`Retry-After` takes whole seconds).
fn retry_after(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

/// The address limit on every request (the admin limit on `/admin`); run by `http::edge`.
pub fn by_address(state: &AppState, req: &Request) -> Result<(), ApiError> {
    let limits = &state.limits;
    if limits.address.is_some() || limits.admin.is_some() {
        let peer = super::server::peer(req)
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
            .ip();
        let client = limits.client_address(peer, req.headers());
        let admin = req.uri().path().starts_with("/admin/");
        limits.check_address(client, admin)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn limits(trusted: &[&str]) -> ClientLimits {
        ClientLimits {
            address: limiter(1, 2),
            admin: limiter(1, 1),
            key: limiter(1, 1),
            trusted: parse_trusted(&trusted.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap(),
        }
    }

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn forwarded_for_counts_only_from_a_trusted_proxy() {
        let l = limits(&["10.0.0.0/8"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // From the proxy: the right-most untrusted hop, not the forgeable left-most one.
        assert_eq!(
            l.client_address(ip("10.1.2.3"), &xff("6.6.6.6, 203.0.113.9, 10.9.9.9")),
            ip("203.0.113.9")
        );
        // From anyone else: the header is ignored.
        assert_eq!(
            l.client_address(ip("198.51.100.7"), &xff("203.0.113.9")),
            ip("198.51.100.7")
        );
        // A proxy without the header is the client itself.
        assert_eq!(
            l.client_address(ip("10.1.2.3"), &HeaderMap::new()),
            ip("10.1.2.3")
        );
        // A malformed hop stops the walk at the last good one.
        assert_eq!(
            l.client_address(ip("10.1.2.3"), &xff("203.0.113.9, nonsense")),
            ip("10.1.2.3")
        );
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        let l = limits(&[]);
        let a = l.client_address("2001:db8:1:2::1".parse().unwrap(), &HeaderMap::new());
        let b = l.client_address("2001:db8:1:2:ffff::9".parse().unwrap(), &HeaderMap::new());
        assert_eq!(a, b);
        let c = l.client_address("2001:db8:1:3::1".parse().unwrap(), &HeaderMap::new());
        assert_ne!(a, c);
    }

    #[test]
    fn an_address_over_its_burst_is_refused_with_a_wait() {
        let l = limits(&[]);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(l.check_address(ip, false).is_ok());
        assert!(l.check_address(ip, false).is_ok());
        match l.check_address(ip, false) {
            Err(ApiError::RateLimited(s)) => assert_eq!(s, 1),
            other => panic!("expected 429, got {other:?}"),
        }
        // Another address is not affected.
        assert!(l.check_address("192.0.2.2".parse().unwrap(), false).is_ok());
        // The admin limit is tighter: one, then refused.
        let admin: IpAddr = "192.0.2.3".parse().unwrap();
        assert!(l.check_address(admin, true).is_ok());
        assert!(l.check_address(admin, true).is_err());
    }

    #[test]
    fn bad_trusted_proxies_are_refused() {
        assert!(parse_trusted(&["10.0.0.0/8".into(), "::1".into(), " ".into()]).is_ok());
        assert!(parse_trusted(&["10.0.0.0/33".into()]).is_err());
        assert!(parse_trusted(&["proxy.example".into()]).is_err());
    }
}
