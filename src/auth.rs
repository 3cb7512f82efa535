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
    key: Vec<u8>,
}

impl Signer {
    /// A signer for `secret`.
    pub fn new(secret: &str) -> Self {
        Signer {
            key: secret.as_bytes().to_vec(),
        }
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(domain);
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p);
        }
        mac
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
}
