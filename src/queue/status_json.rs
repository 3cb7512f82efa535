//! The queue status object written as JSON by hand: every enter and poll answers one, and
//! serde_json's derived serializer spent ~4,200 instructions per poll on it (a call per key
//! and per value, each key's bytes scanned for escapes; `scripts/bench-instr`,
//! docs/benchmarks.md, "The queue status written by hand"). Here the keys are literals and
//! the numbers go through `itoa`. The bytes are serde_json's, byte for byte (the unit tests
//! compare both over arbitrary values), so the derived `Serialize` stays the definition. A field
//! added to the struct stops the tests' generator from compiling until it is generated there,
//! and then the comparison fails until it is written here.

use super::QueueStatus;

impl QueueStatus {
    /// This status as `serde_json::to_vec` would write it.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.access_token.as_ref().map_or(0, String::len));
        out.extend_from_slice(b"{\"ticket\":");
        string(&mut out, &self.ticket);
        out.extend_from_slice(b",\"event\":");
        string(&mut out, &self.event);
        out.extend_from_slice(b",\"status\":");
        string(&mut out, self.status);
        out.extend_from_slice(b",\"position\":");
        match self.position {
            Some(p) => integer(&mut out, p),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"eta_seconds\":");
        // Not finite: `null`, as serde_json writes it. A finite one as serde_json's `Number`
        // prints it (its own float formatting).
        match self.eta_seconds.and_then(serde_json::Number::from_f64) {
            Some(n) => out.extend_from_slice(n.to_string().as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"next_poll_ms\":");
        integer(&mut out, self.next_poll_ms);
        out.extend_from_slice(b",\"access_token\":");
        match &self.access_token {
            Some(t) => string(&mut out, t),
            None => out.extend_from_slice(b"null"),
        }
        if let Some(at) = self.access_expires_at {
            out.extend_from_slice(b",\"access_expires_at\":");
            integer(&mut out, at);
        }
        if let Some(at) = self.admitted_at_ms {
            out.extend_from_slice(b",\"admitted_at_ms\":");
            integer(&mut out, at);
        }
        if let Some(s) = self.strategy {
            out.extend_from_slice(b",\"strategy\":");
            string(&mut out, s.as_str());
        }
        out.push(b'}');
        out
    }
}

fn integer(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `s` as a JSON string, escaped as serde_json escapes it: `"` and `\` by a backslash, the
/// control characters below 0x20 by their short forms or `\u00XX` (lower-case hex), the rest
/// (non-ASCII included) as it is.
fn string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    // The common case, an id or a name with nothing to escape, checked without a branch per
    // byte (the compiler makes it a few vector compares) and copied whole.
    let plain = !bytes.iter().fold(false, |esc, &b| {
        esc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use waitroom_strategies::StrategyKind;

    fn status() -> impl Strategy<Value = QueueStatus> {
        (
            (
                "\\PC{0,40}|[\\x00-\\x7f]{0,40}",
                "[a-z0-9_-]{1,64}|\\PC{0,10}",
                prop::sample::select(vec!["waiting", "admitted", "sold_out"]),
                prop::option::of(any::<u64>()),
                prop::option::of(prop_oneof![
                    any::<f64>(),
                    Just(f64::NAN),
                    Just(f64::INFINITY),
                    0.0..1e7f64
                ]),
            ),
            (
                any::<u64>(),
                prop::option::of("[A-Za-z0-9._-]{0,300}|[\\x00-\\x7f]{0,30}"),
                prop::option::of(any::<u64>()),
                prop::option::of(any::<u64>()),
                prop::option::of(prop::sample::select(StrategyKind::ALL.to_vec())),
            ),
        )
            .prop_map(
                |((ticket, event, status, position, eta_seconds), (next, token, exp, at, s))| {
                    QueueStatus {
                        ticket,
                        event,
                        status,
                        position,
                        eta_seconds,
                        next_poll_ms: next,
                        access_token: token,
                        access_expires_at: exp,
                        admitted_at_ms: at,
                        strategy: s,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn the_bytes_are_serde_jsons(s in status()) {
            let serde = serde_json::to_vec(&s).unwrap();
            prop_assert_eq!(
                String::from_utf8(s.to_json()).unwrap(),
                String::from_utf8(serde).unwrap()
            );
        }
    }

    #[test]
    fn every_control_character_and_quote_is_escaped_as_serde_json_does() {
        let all: String = (0u8..0x80).map(char::from).chain("é€😀".chars()).collect();
        let mut out = Vec::new();
        string(&mut out, &all);
        assert_eq!(out, serde_json::to_vec(&all).unwrap());
    }

    #[test]
    fn a_waiting_answer_reads_back_as_written() {
        let s = QueueStatus {
            ticket: "6f1c2a9e-8d0b-4c1e-9a57-3b2d1e0f4c88".into(),
            event: "concert-2026".into(),
            status: "waiting",
            position: Some(1234),
            eta_seconds: Some(12.5),
            next_poll_ms: 4500,
            access_token: None,
            access_expires_at: None,
            admitted_at_ms: None,
            strategy: Some(StrategyKind::GlobalCounter),
        };
        let v: serde_json::Value = serde_json::from_slice(&s.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"ticket": "6f1c2a9e-8d0b-4c1e-9a57-3b2d1e0f4c88",
                "event": "concert-2026", "status": "waiting", "position": 1234,
                "eta_seconds": 12.5, "next_poll_ms": 4500, "access_token": null,
                "strategy": "global_counter"})
        );
    }
}
