//! Typed replies of the Lua scripts: each script's reply becomes a struct or enum here, once,
//! beside the scripts (lua/*.lua document the wire shapes in their `Returns` headers). Nothing
//! else in the service matches on a script's status integers or reads a tuple by position.

use redis::{FromRedisValue, ParsingError, Value};

fn fail<T>(script: &str, v: &Value) -> Result<T, ParsingError> {
    Err(ParsingError::from(format!(
        "unexpected reply of {script}: {v:?}"
    )))
}

fn items(script: &str, v: Value) -> Result<Vec<Value>, ParsingError> {
    match v {
        Value::Array(items) => Ok(items),
        other => fail(script, &other),
    }
}

fn at<T: FromRedisValue>(items: &[Value], i: usize) -> Result<T, ParsingError> {
    T::from_redis_value_ref(items.get(i).unwrap_or(&Value::Nil))
}

fn status(script: &str, items: &[Value]) -> Result<i64, ParsingError> {
    match items.first() {
        Some(v) => i64::from_redis_value_ref(v),
        None => fail(script, &Value::Array(Vec::new())),
    }
}

fn strings_from(items: &[Value], from: usize) -> Result<Vec<String>, ParsingError> {
    items
        .iter()
        .skip(from)
        .map(String::from_redis_value_ref)
        .collect()
}

/// `enter.lua` (and the poll's plain reads, `Queue::read_shard`): where a ticket stands in its
/// own shard.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ShardStanding {
    /// In the active set: admitted at this time (ms), session still live.
    Admitted {
        /// When the ticket was admitted, Unix ms.
        admitted_at_ms: u64,
    },
    /// Waiting in the shard's line.
    Waiting {
        /// The stored order key (arrival µs or counter number); NaN when a poll's read left it
        /// out (a `statistical` position does not use it: `ShardNeeds` in src/queue/mod.rs).
        score: f64,
        /// 0-based rank within the shard.
        rank: u64,
        /// People waiting in the shard; 0 when a poll's read left it out (exact and counted
        /// positions do not use it).
        shard_size: u64,
    },
    /// Not in the shard: never entered, left, or the session ended.
    Unknown,
}

impl FromRedisValue for ShardStanding {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("enter/status", v)?;
        match status("enter/status", &it)? {
            2 => Ok(ShardStanding::Admitted {
                admitted_at_ms: score_of(&it)? as u64,
            }),
            1 => Ok(ShardStanding::Waiting {
                score: score_of(&it)?,
                rank: at(&it, 2)?,
                shard_size: at(&it, 3)?,
            }),
            0 => Ok(ShardStanding::Unknown),
            _ => fail("enter/status", &Value::Array(it)),
        }
    }
}

/// A sorted-set score as Lua returns it (a string, possibly in exponent form).
fn score_of(it: &[Value]) -> Result<f64, ParsingError> {
    let raw: String = at(it, 1)?;
    raw.parse()
        .map_err(|_| ParsingError::from(format!("score {raw:?} is not a number")))
}

/// `shard_heads.lua`: one shard as the admission tick reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardRead {
    /// Live active sessions (lapsed ones were ended by the script).
    pub active: u64,
    /// People waiting after the abandoned were removed.
    pub waiting: u64,
    /// The first members, `(member, score)` in order.
    pub heads: Vec<(String, f64)>,
    /// Abandoned places removed by this read.
    pub abandoned: u64,
    /// Waiting from before the event's `global_counter` range.
    pub carried: u64,
    /// The first score in the counter range, if anyone numbered waits.
    pub first_counted: Option<f64>,
    /// The overload guard kept the script from removing anyone as abandoned.
    pub abandonment_suspended: bool,
    /// Counter numbers (`global_counter` range) of the places removed as abandoned.
    pub abandoned_numbers: Vec<u64>,
}

impl FromRedisValue for ShardRead {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("shard_heads", v)?;
        let first: String = at(&it, 5)?;
        Ok(ShardRead {
            active: at(&it, 0)?,
            waiting: at(&it, 1)?,
            heads: at(&it, 2)?,
            abandoned: at(&it, 3)?,
            carried: at(&it, 4)?,
            first_counted: first.parse().ok(),
            abandonment_suspended: at::<i64>(&it, 6)? == 1,
            abandoned_numbers: at::<Vec<String>>(&it, 7)?
                .iter()
                .map(|raw| {
                    raw.parse::<f64>()
                        .map(|n| n as u64)
                        .map_err(|_| ParsingError::from(format!("number {raw:?}")))
                })
                .collect::<Result<_, _>>()?,
        })
    }
}

/// `admit.lua`: who was moved into the active set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The admitted members, in order.
    pub members: Vec<String>,
    /// Abandoned places skipped and removed on the way.
    pub abandoned: u64,
    /// Why nothing moved, when nothing did for a reason other than an empty line.
    pub refused: Option<AdmitRefusal>,
}

/// Why `admit.lua` moved nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmitRefusal {
    /// The shard's clock passed the lease's fence: this tick outlived its lease.
    Fenced,
    /// An operation with this id already ran (a retry of one that went through).
    AlreadyRan,
}

impl FromRedisValue for Admitted {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("admit", v)?;
        let refused = match at::<Option<i64>>(&it, 2)? {
            None | Some(0) => None,
            Some(1) => Some(AdmitRefusal::Fenced),
            Some(2) => Some(AdmitRefusal::AlreadyRan),
            Some(_) => return fail("admit", &Value::Array(it)),
        };
        Ok(Admitted {
            members: at(&it, 0)?,
            abandoned: at(&it, 1)?,
            refused,
        })
    }
}

/// `hold.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldReply {
    /// Held; places still available in the show.
    Held {
        /// Seats or places neither held nor sold, after this hold.
        available: u64,
    },
    /// These seats are held or sold: nothing was held.
    Taken(Vec<String>),
    /// No such seats in the show: nothing was held.
    UnknownSeats(Vec<String>),
    /// General admission: fewer places remain than asked for.
    NotEnough,
    /// Seats asked of a general-admission show, or a quantity of a seated one.
    WrongKind,
    /// The ticket already has this live hold in the show: nothing held.
    AlreadyHolding(String),
    /// Over the ticket's cap for the show: it may take this many more.
    OverCap(u64),
}

impl FromRedisValue for HoldReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("hold", v)?;
        match status("hold", &it)? {
            1 => Ok(HoldReply::Held {
                available: at(&it, 1)?,
            }),
            0 => Ok(HoldReply::Taken(strings_from(&it, 1)?)),
            -1 => Ok(HoldReply::UnknownSeats(strings_from(&it, 1)?)),
            -2 => Ok(HoldReply::NotEnough),
            -3 => Ok(HoldReply::WrongKind),
            -4 => Ok(HoldReply::AlreadyHolding(at(&it, 1)?)),
            -5 => Ok(HoldReply::OverCap(at(&it, 1)?)),
            _ => fail("hold", &Value::Array(it)),
        }
    }
}

/// `release_hold.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReply {
    /// Released: its seats are available again.
    Released,
    /// No such live hold (never made, lapsed or released).
    NoHold,
    /// The hold belongs to another ticket.
    OtherTicket,
    /// The hold was booked: it cannot be released.
    Booked,
}

impl FromRedisValue for ReleaseReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("release_hold", v)?;
        match status("release_hold", &it)? {
            1 => Ok(ReleaseReply::Released),
            0 => Ok(ReleaseReply::NoHold),
            -1 => Ok(ReleaseReply::OtherTicket),
            -2 => Ok(ReleaseReply::Booked),
            _ => fail("release_hold", &Value::Array(it)),
        }
    }
}

/// `book.lua`: the hold record (JSON, see lua/show_lib.lua) comes back with a success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BookReply {
    /// The hold's seats were marked sold now.
    Marked(String),
    /// This hold was booked before: the same booking (idempotent).
    AlreadyBooked(String),
    /// No live hold: never made, lapsed, released, or a seat given to a sale the ledger holds.
    NoHold,
    /// Another ticket's hold.
    OtherTicket,
}

impl FromRedisValue for BookReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("book", v)?;
        match status("book", &it)? {
            1 => Ok(BookReply::Marked(at(&it, 1)?)),
            2 => Ok(BookReply::AlreadyBooked(at(&it, 1)?)),
            0 => Ok(BookReply::NoHold),
            -1 => Ok(BookReply::OtherTicket),
            _ => fail("book", &Value::Array(it)),
        }
    }
}

/// `show_setup.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShowSetup {
    /// The show was created now.
    Created,
    /// The show existed already, under this event.
    Existed {
        /// The event the existing show belongs to.
        event: String,
    },
}

impl FromRedisValue for ShowSetup {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("show_setup", v)?;
        match status("show_setup", &it)? {
            1 => Ok(ShowSetup::Created),
            0 => Ok(ShowSetup::Existed { event: at(&it, 1)? }),
            _ => fail("show_setup", &Value::Array(it)),
        }
    }
}

/// `show_view.lua`: a show's seat map; `None` for an unknown show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShowView {
    /// The show's event.
    pub event: String,
    /// True for general admission (places without seat numbers).
    pub general_admission: bool,
    /// All seats or places.
    pub total: u64,
    /// Neither held nor sold.
    pub available: u64,
    /// Each seat and its raw state ('' available, 'h:<hold>', 's:<booking>'), in display order.
    pub seats: Vec<(String, String)>,
}

/// The reply of `show_view.lua`: the view, or nothing for an unknown show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaybeShow(pub Option<ShowView>);

impl FromRedisValue for MaybeShow {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("show_view", v)?;
        let event: String = at(&it, 0)?;
        if event.is_empty() {
            return Ok(MaybeShow(None));
        }
        let kind: String = at(&it, 1)?;
        let flat: Vec<String> = at(&it, 5)?;
        let seats = flat
            .chunks(2)
            .map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or_default()))
            .collect();
        Ok(MaybeShow(Some(ShowView {
            event,
            general_admission: kind == "ga",
            total: at(&it, 2)?,
            available: at(&it, 3)?,
            seats,
        })))
    }
}

/// `show_sweep.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Places freed by lapsed holds.
    pub freed: u64,
    /// Places available after the sweep.
    pub available: u64,
}

impl FromRedisValue for Swept {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("show_sweep", v)?;
        Ok(Swept {
            freed: at(&it, 0)?,
            available: at(&it, 1)?,
        })
    }
}

/// `lease.lua`: whether this instance holds the lease, and until when (ms of the lease node's
/// clock) unless renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// This instance holds it.
    pub held: bool,
    /// When it lapses, ms (0 when not held).
    pub lapses_at_ms: u64,
}

impl FromRedisValue for Lease {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let it = items("lease", v)?;
        Ok(Lease {
            held: at::<i64>(&it, 0)? == 1,
            lapses_at_ms: at(&it, 1)?,
        })
    }
}

/// `lease_release.lua`: 1 or 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted(pub bool);

impl FromRedisValue for Granted {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Ok(Granted(i64::from_redis_value(v)? == 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn standings_parse_from_each_status() {
        let waiting = Value::Array(vec![
            Value::Int(1),
            bulk("1.7e+15"),
            Value::Int(3),
            Value::Int(9),
        ]);
        assert_eq!(
            ShardStanding::from_redis_value(waiting).unwrap(),
            ShardStanding::Waiting {
                score: 1.7e15,
                rank: 3,
                shard_size: 9
            }
        );
        let admitted = Value::Array(vec![
            Value::Int(2),
            bulk("1234"),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert_eq!(
            ShardStanding::from_redis_value(admitted).unwrap(),
            ShardStanding::Admitted {
                admitted_at_ms: 1234
            }
        );
        let unknown = Value::Array(vec![Value::Int(0), bulk("0"), Value::Int(0), Value::Int(0)]);
        assert_eq!(
            ShardStanding::from_redis_value(unknown).unwrap(),
            ShardStanding::Unknown
        );
        assert!(ShardStanding::from_redis_value(Value::Array(vec![Value::Int(7)])).is_err());
    }

    #[test]
    fn hold_replies_name_their_outcome() {
        let taken = Value::Array(vec![Value::Int(0), bulk("A-1"), bulk("A-2")]);
        assert_eq!(
            HoldReply::from_redis_value(taken).unwrap(),
            HoldReply::Taken(vec!["A-1".into(), "A-2".into()])
        );
        let held = Value::Array(vec![Value::Int(1), Value::Int(42)]);
        assert_eq!(
            HoldReply::from_redis_value(held).unwrap(),
            HoldReply::Held { available: 42 }
        );
        let wrong = Value::Array(vec![Value::Int(-3)]);
        assert_eq!(
            HoldReply::from_redis_value(wrong).unwrap(),
            HoldReply::WrongKind
        );
        assert!(HoldReply::from_redis_value(Value::Array(vec![Value::Int(-9)])).is_err());
    }

    #[test]
    fn shard_reads_have_no_first_number_when_the_script_sends_an_empty_string() {
        let v = Value::Array(vec![
            Value::Int(2),
            Value::Int(5),
            Value::Array(vec![bulk("m1"), bulk("10"), bulk("m2"), bulk("11")]),
            Value::Int(0),
            Value::Int(1),
            bulk(""),
            Value::Int(0),
        ]);
        let r = ShardRead::from_redis_value(v).unwrap();
        assert_eq!(r.heads, vec![("m1".into(), 10.0), ("m2".into(), 11.0)]);
        assert_eq!(r.first_counted, None);
        assert!(!r.abandonment_suspended);
    }
}
