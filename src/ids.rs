//! Identifiers checked once, at the edge: a value of these types is always well-formed.
//!
//! Forms (shared/API.md): event and show ids `^[a-z0-9][a-z0-9_-]{0,63}$`; seat ids
//! `^[A-Za-z0-9-]{1,16}$`; user ids 1–128 characters of `[A-Za-z0-9._:@-]`; tickets are UUIDs.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use uuid::Uuid;

/// An id that does not have the allowed form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is not of the allowed form")]
pub struct BadId {
    /// Which kind of id.
    pub what: &'static str,
    /// The rejected value (truncated).
    pub value: String,
}

fn bad(what: &'static str, value: &str) -> BadId {
    BadId {
        what,
        value: value.chars().take(80).collect(),
    }
}

fn is_slug(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// An event id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    /// Checks the form.
    pub fn parse(s: &str) -> Result<Self, BadId> {
        is_slug(s)
            .then(|| EventId(s.to_owned()))
            .ok_or_else(|| bad("event id", s))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A show id (same form as an event id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShowId(String);

impl ShowId {
    /// Checks the form.
    pub fn parse(s: &str) -> Result<Self, BadId> {
        is_slug(s)
            .then(|| ShowId(s.to_owned()))
            .ok_or_else(|| bad("show id", s))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ShowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A seat id: `^[A-Za-z0-9-]{1,16}$`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeatId(String);

impl SeatId {
    /// Checks the form.
    pub fn parse(s: &str) -> Result<Self, BadId> {
        let ok = !s.is_empty()
            && s.len() <= 16
            && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-');
        ok.then(|| SeatId(s.to_owned()))
            .ok_or_else(|| bad("seat id", s))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// Parses a server-issued UUID (hold or booking id).
pub fn parse_uuid(what: &'static str, s: &str) -> Result<Uuid, BadId> {
    Uuid::parse_str(s).map_err(|_| bad(what, s))
}

/// A user id as the client names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserId(String);

impl UserId {
    /// Checks the form.
    pub fn parse(s: &str) -> Result<Self, BadId> {
        let ok = !s.is_empty()
            && s.len() <= 128
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._:@-".contains(&c));
        ok.then(|| UserId(s.to_owned()))
            .ok_or_else(|| bad("user_id", s))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A ticket: the server-issued UUID of one person's place in one event's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(Uuid);

impl Ticket {
    /// Checks the form (any UUID; whether it exists is Redis's answer, a 404).
    pub fn parse(s: &str) -> Result<Self, BadId> {
        Uuid::parse_str(s).map(Ticket).map_err(|_| bad("ticket", s))
    }

    /// Wraps a UUID the server made.
    pub fn from_uuid(u: Uuid) -> Self {
        Ticket(u)
    }

    /// A number in `0..1` fixed for this ticket and spread uniformly over tickets (the ticket's
    /// bits are an HMAC output): per-client jitter without storing anything.
    pub fn spread(self) -> f64 {
        (self.0.as_u128() % 1_000_000) as f64 / 1_000_000.0
    }

    /// The ticket's 128 bits.
    pub fn as_u128(self) -> u128 {
        self.0.as_u128()
    }

    /// Hyphenated lowercase form: the wire form, the ticket in hold records, and the line's
    /// sorted-set member in events created before the short form ([`Ticket::to_short_member`]).
    pub fn to_member(self) -> String {
        self.0.hyphenated().to_string()
    }

    /// The line's sorted-set member: 84 of the ticket's HMAC bits (its first 48 and last 36, so
    /// none of the UUID's version and variant bits) in 14 characters of the URL-safe base64
    /// alphabet. A member of at most 14 bytes fits Redis's 16-byte allocation with its string
    /// header and terminator, where the 36-character form takes 48 (docs/architecture.md, "What
    /// a waiting person costs in Redis"). Two tickets of one event share a member with
    /// probability n²/2⁸⁵: 6·10⁻¹³ for 5 million people.
    pub fn to_short_member(self) -> String {
        let u = self.0.as_u128();
        // The 84 bits at the top of 11 bytes: their first 14 base64 characters are exactly them.
        let bits = (((u >> 80) << 36) | (u & ((1 << 36) - 1))) << 44;
        let mut member = B64.encode(&bits.to_be_bytes()[..11]);
        member.truncate(14);
        member
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_follow_the_contract() {
        assert!(EventId::parse("topgun-open").is_ok());
        assert!(EventId::parse("0_a-b").is_ok());
        assert!(EventId::parse(&"a".repeat(64)).is_ok());
        for bad in ["", "-a", "_a", "A", "a b", "a{b}", "é", &"a".repeat(65)] {
            assert!(EventId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn user_ids_follow_the_contract() {
        assert!(UserId::parse("alice@example.com:1._-").is_ok());
        assert!(UserId::parse(&"u".repeat(128)).is_ok());
        for bad in ["", "a b", "a/b", "ü", &"u".repeat(129)] {
            assert!(UserId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn seat_ids_follow_the_contract() {
        assert!(SeatId::parse("A-12").is_ok());
        assert!(SeatId::parse(&"9".repeat(16)).is_ok());
        for bad in ["", "A_1", "A 1", &"9".repeat(17)] {
            assert!(SeatId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn tickets_are_uuids() {
        let t = Ticket::parse("7C0D7D0E-8C0A-4A43-9D7E-3F5CF1F0B2A1").unwrap();
        assert_eq!(t.to_member(), "7c0d7d0e-8c0a-4a43-9d7e-3f5cf1f0b2a1");
        // Bits 7c0d7d0e8c0a (the first 48) and cf1f0b2a1 (the last 36), six at a time.
        assert_eq!(t.to_short_member(), "fA19DowKzx8LKh");
        assert!(Ticket::parse("not-a-uuid").is_err());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// The contract's slug, written independently of `is_slug`.
        fn slug_by_contract(s: &str) -> bool {
            let mut chars = s.chars();
            matches!(chars.next(), Some('a'..='z' | '0'..='9'))
                && s.len() <= 64
                && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
        }

        proptest! {
            #[test]
            fn event_and_show_ids_accept_exactly_the_contracts_form(s in "\\PC{0,70}") {
                prop_assert_eq!(EventId::parse(&s).is_ok(), slug_by_contract(&s));
                prop_assert_eq!(ShowId::parse(&s).is_ok(), slug_by_contract(&s));
            }

            #[test]
            fn well_formed_slugs_round_trip(s in "[a-z0-9][a-z0-9_-]{0,63}") {
                let id = EventId::parse(&s).unwrap();
                prop_assert_eq!(id.as_str(), s.as_str());
            }

            #[test]
            fn user_ids_accept_exactly_the_contracts_form(s in "[A-Za-z0-9._:@/ é-]{0,130}") {
                let by_contract = !s.is_empty()
                    && s.len() <= 128
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || "._:@-".contains(c));
                prop_assert_eq!(UserId::parse(&s).is_ok(), by_contract);
            }

            #[test]
            fn tickets_parse_any_uuid_and_print_one_form(bits in any::<u128>(), upper in any::<bool>()) {
                let u = Uuid::from_u128(bits).hyphenated().to_string();
                let given = if upper { u.to_uppercase() } else { u.clone() };
                prop_assert_eq!(Ticket::parse(&given).unwrap().to_member(), u);
            }

            #[test]
            fn nothing_panics_on_arbitrary_input(s in "\\PC{0,200}") {
                let _ = (EventId::parse(&s), ShowId::parse(&s), SeatId::parse(&s));
                let _ = (UserId::parse(&s), Ticket::parse(&s), parse_uuid("id", &s));
            }
        }
    }
}
