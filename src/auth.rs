//! Signed values: tickets derived from (event, user) and access tokens for admitted people.
//!
//! A ticket is an HMAC-SHA256 of the event and user id under the shared secret, shaped as a
//! UUID (version 8, "custom"). So entering again with the same user id yields the same ticket on
//! every instance without any lookup — Redis stores one sorted-set member per person, nothing
//! else. The ticket is stable per user id: waitroom does not authenticate user ids, so whoever
//! presents a user id gets that user's ticket (authenticating users is the operator's front end).
//!
//! An access token is `base64url(claims JSON) "." base64url(HMAC-SHA256(claims))`, bound to an
//! event and a ticket and expiring with the active session.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use crate::ids::{EventId, Ticket, UserId};

type HmacSha256 = Hmac<Sha256>;

/// What an access token grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessClaims {
    /// Event id.
    pub ev: String,
    /// Ticket.
    pub tkt: String,
    /// Expiry, Unix seconds.
    pub exp: u64,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not of the token form, or its signature does not match.
    #[error("malformed or forged token")]
    Invalid,
    /// Past its expiry.
    #[error("expired token")]
    Expired,
}

/// Signs and checks with the shared secret.
#[derive(Clone)]
pub struct Signer {
    /// The HMAC state after the key: cloned per use, so the key's two blocks are hashed once,
    /// not on every ticket, token and booking id.
    keyed: HmacSha256,
}

impl Signer {
    /// A signer for `secret`.
    pub fn new(secret: &str) -> Self {
        Signer {
            keyed: HmacSha256::new_from_slice(secret.as_bytes())
                .expect("HMAC takes any key length"),
        }
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(domain);
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p);
        }
        mac
    }

    /// The HMAC of `parts` in `domain` (length-prefixed, so no two part lists collide).
    pub fn digest(&self, domain: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        self.mac(domain, parts).finalize().into_bytes().into()
    }

    /// [`Signer::digest`] in hex.
    pub fn tag(&self, domain: &[u8], parts: &[&[u8]]) -> String {
        self.digest(domain, parts)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether `hex` is the tag of `parts` in `domain` (compared in constant time).
    pub fn check_tag(&self, domain: &[u8], parts: &[&[u8]], hex: &str) -> bool {
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        let tag: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex"))
            .collect();
        self.mac(domain, parts).verify_slice(&tag).is_ok()
    }

    /// The ticket of `user` in `event`: the same on every call and every instance.
    pub fn ticket(&self, event: &EventId, user: &UserId) -> Ticket {
        let digest = self
            .mac(
                b"waitroom-ticket-v1",
                &[event.as_str().as_bytes(), user.as_str().as_bytes()],
            )
            .finalize()
            .into_bytes();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        Ticket::from_uuid(Uuid::new_v8(bytes))
    }

    /// The booking id of a hold: the same for every retry of the same confirmation, so a
    /// repeated request can never create a second booking.
    pub fn booking_id(&self, hold: &Uuid) -> Uuid {
        let digest = self
            .mac(b"waitroom-booking-v1", &[hold.as_bytes()])
            .finalize()
            .into_bytes();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        Uuid::new_v8(bytes)
    }

    /// An access token for `claims`.
    pub fn sign(&self, claims: &AccessClaims) -> String {
        let body = B64.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let sig = self
            .mac(b"waitroom-access-v1", &[body.as_bytes()])
            .finalize()
            .into_bytes();
        format!("{body}.{}", B64.encode(sig))
    }

    /// Checks a token's signature and expiry (`now` in Unix seconds).
    pub fn verify(&self, token: &str, now: u64) -> Result<AccessClaims, TokenError> {
        let (body, sig) = token.split_once('.').ok_or(TokenError::Invalid)?;
        let sig = B64.decode(sig).map_err(|_| TokenError::Invalid)?;
        self.mac(b"waitroom-access-v1", &[body.as_bytes()])
            .verify_slice(&sig)
            .map_err(|_| TokenError::Invalid)?;
        let raw = B64.decode(body).map_err(|_| TokenError::Invalid)?;
        let claims: AccessClaims = serde_json::from_slice(&raw).map_err(|_| TokenError::Invalid)?;
        if claims.exp <= now {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

/// Shortest per-event entry key accepted (bytes).
pub const MIN_ENTRY_KEY_BYTES: usize = 32;

/// Longest an entry token may be valid ahead, seconds: a site signs per visit, not per season.
pub const MAX_ENTRY_TOKEN_SECONDS: u64 = 24 * 3600;

/// The entry token a selling site gives its signed-in user for a verified-entry event (see
/// docs/api.md, "Verified entry"): `<expires, Unix seconds>.<hex HMAC-SHA256>` of
/// `waitroom-entry-v1\n<event>\n<user id>\n<expires>` under the event's entry key.
pub fn entry_token(key: &[u8], event: &str, user: &str, expires: u64) -> String {
    let mac = entry_mac(key, event, user, expires).finalize().into_bytes();
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("{expires}.{hex}")
}

fn entry_mac(key: &[u8], event: &str, user: &str, expires: u64) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(format!("waitroom-entry-v1\n{event}\n{user}\n{expires}").as_bytes());
    mac
}

/// Why an entry token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The event requires one and none came.
    #[error("this event requires an entry_token signed by the selling site")]
    Missing,
    /// Not of the form, or not signed for this event and user id.
    #[error("the entry_token is not valid for this event and user_id")]
    Invalid,
    /// Past its expiry.
    #[error("the entry_token has expired")]
    Expired,
    /// Valid for longer than allowed ahead.
    #[error("the entry_token is valid too far ahead (at most 24 hours)")]
    TooLong,
}

impl EntryError {
    /// The message of the 401 (the `Display` text, as a static string).
    pub fn message(self) -> &'static str {
        match self {
            EntryError::Missing => "this event requires an entry_token signed by the selling site",
            EntryError::Invalid => "the entry_token is not valid for this event and user_id",
            EntryError::Expired => "the entry_token has expired",
            EntryError::TooLong => "the entry_token is valid too far ahead (at most 24 hours)",
        }
    }
}

/// Checks an entry token for `event` and `user` at `now` (Unix seconds); the MAC is compared
/// in constant time.
pub fn verify_entry(
    key: &[u8],
    event: &str,
    user: &str,
    token: Option<&str>,
    now: u64,
) -> Result<(), EntryError> {
    let token = token.ok_or(EntryError::Missing)?;
    let (expires, hex) = token.split_once('.').ok_or(EntryError::Invalid)?;
    let expires: u64 = expires.parse().map_err(|_| EntryError::Invalid)?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(EntryError::Invalid);
    }
    let tag: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex"))
        .collect();
    entry_mac(key, event, user, expires)
        .verify_slice(&tag)
        .map_err(|_| EntryError::Invalid)?;
    if expires <= now {
        return Err(EntryError::Expired);
    }
    if expires - now > MAX_ENTRY_TOKEN_SECONDS {
        return Err(EntryError::TooLong);
    }
    Ok(())
}

/// Compares a presented secret with the expected one in time independent of where they differ
/// and of their lengths: both are hashed to 32 bytes first, then compared with `subtle`.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::Digest as _;
    use subtle::ConstantTimeEq as _;
    let (ha, hb) = (sha2::Sha256::digest(a), sha2::Sha256::digest(b));
    ha[..].ct_eq(&hb[..]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(s: &str) -> EventId {
        EventId::parse(s).unwrap()
    }
    fn user(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn a_user_gets_one_ticket_per_event() {
        let s = Signer::new("k");
        assert_eq!(
            s.ticket(&ev("e1"), &user("alice")),
            s.ticket(&ev("e1"), &user("alice"))
        );
        assert_ne!(
            s.ticket(&ev("e1"), &user("alice")),
            s.ticket(&ev("e2"), &user("alice"))
        );
        assert_ne!(
            s.ticket(&ev("e1"), &user("alice")),
            s.ticket(&ev("e1"), &user("bob"))
        );
        assert_ne!(
            s.ticket(&ev("e1"), &user("alice")),
            Signer::new("k2").ticket(&ev("e1"), &user("alice"))
        );
        // Length-prefixing: ("ab","c") and ("a","bc") must not collide.
        assert_ne!(
            s.ticket(&ev("ab"), &user("c")),
            s.ticket(&ev("a"), &user("bc"))
        );
    }

    /// Every instance, of this version or another, must derive the same ticket: it is the
    /// documented HMAC (docs/architecture.md, "Tickets and access tokens"), computed afresh
    /// here, and no call carries state into the next.
    #[test]
    fn a_ticket_is_the_documented_hmac_whatever_was_signed_before() {
        let s = Signer::new("a secret of the test");
        let expected = |e: &str, u: &str| {
            let mut m = HmacSha256::new_from_slice(b"a secret of the test").unwrap();
            m.update(b"waitroom-ticket-v1");
            for p in [e, u] {
                m.update(&(p.len() as u64).to_be_bytes());
                m.update(p.as_bytes());
            }
            let mut bytes = [0u8; 16];
            bytes.copy_from_slice(&m.finalize().into_bytes()[..16]);
            Ticket::from_uuid(Uuid::new_v8(bytes))
        };
        for (e, u) in [
            ("e1", "alice"),
            ("e1", "bob"),
            ("e2", "alice"),
            ("e1", "alice"),
        ] {
            assert_eq!(s.ticket(&ev(e), &user(u)), expected(e, u), "{e} {u}");
            let _ = s.sign(&AccessClaims {
                ev: e.into(),
                tkt: u.into(),
                exp: 1,
            });
        }
    }

    #[test]
    fn tokens_verify_and_refuse_forgery_and_expiry() {
        let s = Signer::new("k");
        let claims = AccessClaims {
            ev: "e1".into(),
            tkt: "t".into(),
            exp: 100,
        };
        let token = s.sign(&claims);
        assert_eq!(s.verify(&token, 99), Ok(claims.clone()));
        assert_eq!(s.verify(&token, 100), Err(TokenError::Expired));
        assert_eq!(
            Signer::new("other").verify(&token, 1),
            Err(TokenError::Invalid)
        );
        let forged_body = B64.encode(br#"{"ev":"e2","tkt":"t","exp":100}"#);
        let sig = token.split_once('.').unwrap().1;
        assert_eq!(
            s.verify(&format!("{forged_body}.{sig}"), 1),
            Err(TokenError::Invalid)
        );
        assert_eq!(s.verify("garbage", 1), Err(TokenError::Invalid));
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn entry_tokens_bind_event_user_and_expiry() {
        let key = b"an entry key of at least thirty-two bytes";
        let t = entry_token(key, "ev1", "alice", 2_000);
        assert_eq!(verify_entry(key, "ev1", "alice", Some(&t), 1_000), Ok(()));
        // Another user, another event, another key: invalid.
        assert_eq!(
            verify_entry(key, "ev1", "mallory", Some(&t), 1_000),
            Err(EntryError::Invalid)
        );
        assert_eq!(
            verify_entry(key, "ev2", "alice", Some(&t), 1_000),
            Err(EntryError::Invalid)
        );
        let other = b"another entry key of thirty-two bytes!!";
        assert_eq!(
            verify_entry(other, "ev1", "alice", Some(&t), 1_000),
            Err(EntryError::Invalid)
        );
        // A later expiry grafted on the same MAC: invalid.
        let grafted = t.replacen("2000", "9000", 1);
        assert_eq!(
            verify_entry(key, "ev1", "alice", Some(&grafted), 1_000),
            Err(EntryError::Invalid)
        );
        // Expired, missing, malformed, too long ahead.
        assert_eq!(
            verify_entry(key, "ev1", "alice", Some(&t), 2_000),
            Err(EntryError::Expired)
        );
        assert_eq!(
            verify_entry(key, "ev1", "alice", None, 1_000),
            Err(EntryError::Missing)
        );
        for bad in ["", "2000", "x.y", "2000.zz", "2000.", ".abc"] {
            assert_eq!(
                verify_entry(key, "ev1", "alice", Some(bad), 1_000),
                Err(EntryError::Invalid),
                "{bad}"
            );
        }
        let far = entry_token(key, "ev1", "alice", 1_000 + MAX_ENTRY_TOKEN_SECONDS + 1);
        assert_eq!(
            verify_entry(key, "ev1", "alice", Some(&far), 1_000),
            Err(EntryError::TooLong)
        );
    }
}
