//! The one place that loads Lua: each script from `lua/`, compiled in with `include_str!`.
//!
//! Scripts run with [`redis::Script::invoke_async`], which sends EVALSHA and loads the script
//! on NOSCRIPT (for instance on a replica just promoted after a failover). Their replies are
//! parsed into the types of [`super::replies`].

use redis::{Script, ScriptInvocation};

use super::keys::{NumberedKeys, ShowKeys};

/// All Lua scripts of the service.
pub struct Scripts {
    /// See `lua/enter.lua`.
    pub enter: Script,
    /// See `lua/leave.lua`.
    pub leave: Script,
    /// See `lua/shard_heads.lua`.
    pub shard_heads: Script,
    /// See `lua/seen.lua`.
    pub seen: Script,
    /// See `lua/admit.lua`.
    pub admit: Script,
    /// See `lua/lease.lua`.
    pub lease: Script,
    /// See `lua/next_numbers.lua`.
    pub next_numbers: Script,
    /// See `lua/gap.lua`.
    pub gap: Script,
    /// See `lua/publish_counter.lua`.
    pub publish_counter: Script,
    /// See `lua/show_setup.lua`.
    pub show_setup: Script,
    /// See `lua/show_view.lua`.
    pub show_view: Script,
    /// See `lua/show_sweep.lua`.
    pub show_sweep: Script,
    /// See `lua/hold.lua`.
    pub hold: Script,
    /// See `lua/release_hold.lua`.
    pub release_hold: Script,
    /// See `lua/book.lua`.
    pub book: Script,
    /// See `lua/unbook.lua`.
    pub unbook: Script,
    /// See `lua/adopt.lua`.
    pub adopt: Script,
    /// See `lua/settle.lua`.
    pub settle: Script,
    /// See `lua/lease_release.lua` (gives up the admission lease; not a seat hold).
    pub lease_release: Script,
    /// See `lua/nl_index.lua` (the numbered line's index).
    pub nl_index: Script,
    /// See `lua/nl_status.lua`.
    pub nl_status: Script,
    /// See `lua/nl_enter.lua`.
    pub nl_enter: Script,
    /// See `lua/nl_reenter.lua`.
    pub nl_reenter: Script,
    /// See `lua/nl_leave.lua`.
    pub nl_leave: Script,
    /// See `lua/nl_tick.lua`.
    pub nl_tick: Script,
    /// See `lua/nl_figures.lua`.
    pub nl_figures: Script,
    /// See `lua/nl_snapshot.lua`.
    pub nl_snapshot: Script,
}

impl Scripts {
    /// Compiles the scripts' hashes (no I/O).
    pub fn new() -> Self {
        Scripts {
            enter: Script::new(include_str!("../../lua/enter.lua")),
            leave: Script::new(include_str!("../../lua/leave.lua")),
            shard_heads: line_script(include_str!("../../lua/shard_heads.lua")),
            seen: Script::new(include_str!("../../lua/seen.lua")),
            admit: line_script(include_str!("../../lua/admit.lua")),
            lease: Script::new(include_str!("../../lua/lease.lua")),
            next_numbers: Script::new(include_str!("../../lua/next_numbers.lua")),
            gap: Script::new(include_str!("../../lua/gap.lua")),
            publish_counter: Script::new(include_str!("../../lua/publish_counter.lua")),
            show_setup: Script::new(include_str!("../../lua/show_setup.lua")),
            show_view: show_script(include_str!("../../lua/show_view.lua")),
            show_sweep: show_script(include_str!("../../lua/show_sweep.lua")),
            hold: show_script(include_str!("../../lua/hold.lua")),
            release_hold: show_script(include_str!("../../lua/release_hold.lua")),
            book: show_script(include_str!("../../lua/book.lua")),
            unbook: Script::new(include_str!("../../lua/unbook.lua")),
            adopt: Script::new(include_str!("../../lua/adopt.lua")),
            settle: show_script(include_str!("../../lua/settle.lua")),
            lease_release: Script::new(include_str!("../../lua/lease_release.lua")),
            nl_index: Script::new(include_str!("../../lua/nl_index.lua")),
            nl_status: numbered_script(include_str!("../../lua/nl_status.lua")),
            nl_enter: numbered_script(include_str!("../../lua/nl_enter.lua")),
            nl_reenter: numbered_script(include_str!("../../lua/nl_reenter.lua")),
            nl_leave: numbered_script(include_str!("../../lua/nl_leave.lua")),
            nl_tick: numbered_script(include_str!("../../lua/nl_tick.lua")),
            nl_figures: numbered_script(include_str!("../../lua/nl_figures.lua")),
            nl_snapshot: numbered_script(include_str!("../../lua/nl_snapshot.lua")),
        }
    }
}

impl Scripts {
    /// Loads every script on every node (SCRIPT LOAD is sent to all nodes of a cluster), so the
    /// first burst of traffic does not pay a NOSCRIPT round trip per request.
    pub async fn preload(&self, conn: &mut super::RedisConn) -> redis::RedisResult<()> {
        for s in [
            &self.enter,
            &self.leave,
            &self.shard_heads,
            &self.admit,
            &self.lease,
            &self.next_numbers,
            &self.gap,
            &self.publish_counter,
            &self.show_setup,
            &self.show_view,
            &self.show_sweep,
            &self.hold,
            &self.release_hold,
            &self.book,
            &self.unbook,
            &self.adopt,
            &self.settle,
            &self.lease_release,
            &self.nl_index,
            &self.nl_status,
            &self.nl_enter,
            &self.nl_reenter,
            &self.nl_leave,
            &self.nl_tick,
            &self.nl_figures,
            &self.nl_snapshot,
        ] {
            s.load_async(conn).await?;
        }
        Ok(())
    }
}

/// An invocation of a show script with the four keys every show script takes first
/// (lua/show_lib.lua); add the script's own keys and arguments.
pub fn with_show_keys<'a>(script: &'a Script, keys: &ShowKeys) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    for key in keys.core() {
        call.key(key);
    }
    call
}

/// A show script: `lua/show_lib.lua` (the shared `sweep()` that lapses holds) followed by the
/// script's own body, so every show script lapses expired holds before it acts.
fn show_script(body: &str) -> Script {
    Script::new(&format!(
        "{}\n{body}",
        include_str!("../../lua/show_lib.lua")
    ))
}

/// A line script of the admission: `lua/line_lib.lua` (the shared abandon check
/// `abandoned_flags()`) followed by the script's own body.
fn line_script(body: &str) -> Script {
    Script::new(&format!(
        "{}\n{body}",
        include_str!("../../lua/line_lib.lua")
    ))
}

/// A numbered line script: `lua/numbered_lib.lua` (the layout's keys, standing and departures)
/// followed by the script's own body.
fn numbered_script(body: &str) -> Script {
    Script::new(&format!(
        "{}\n{body}",
        include_str!("../../lua/numbered_lib.lua")
    ))
}

/// An invocation of a numbered line script with its seven keys (lua/numbered_lib.lua); add the
/// script's arguments.
pub fn with_numbered_keys<'a>(script: &'a Script, keys: &NumberedKeys) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    for key in keys.all() {
        call.key(key);
    }
    call
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
