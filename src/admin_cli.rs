//! `waitroom admin`: the operators' command line over the admin API — list and show events with
//! their live figures, create or update one, pause, open or close it, switch its ranking
//! strategy. It speaks only HTTP to a running service, with the admin token from the
//! environment; `--json` prints the API's answer instead of a table.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use crate::config::Secret;

/// `waitroom admin`.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// Base URL of a running service.
    #[arg(long, env = "WAITROOM_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The admin bearer token.
    #[arg(long = "admin-token", env = "WAITROOM_ADMIN_TOKEN")]
    pub token: Secret,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// The admin subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Every event with its live figures.
    List,
    /// One event: configuration, figures, waiting per shard.
    Show {
        /// Event id.
        event: String,
    },
    /// Create or update an event (only the options given change).
    Put {
        /// Event id.
        event: String,
        /// Shards of the line.
        #[arg(long)]
        shards: Option<u32>,
        /// Admissions per second.
        #[arg(long)]
        admit_per_second: Option<f64>,
        /// Most active sessions at once.
        #[arg(long)]
        active_capacity: Option<u64>,
        /// Length of an active session, seconds.
        #[arg(long)]
        active_ttl_seconds: Option<u64>,
        /// Length of a hold, seconds.
        #[arg(long)]
        hold_ttl_seconds: Option<u64>,
        /// Most seats in one hold.
        #[arg(long)]
        max_seats_per_hold: Option<u32>,
        /// `global_counter`, `timestamp`, `statistical` or `hybrid`.
        #[arg(long)]
        strategy: Option<String>,
        /// `open`, `paused` or `closed`.
        #[arg(long)]
        state: Option<String>,
        /// `numbered` (a new event's default) or `sorted_sets`; only when the event is created.
        #[arg(long)]
        line_form: Option<String>,
    },
    /// Stop entering and admitting; the line keeps its order.
    Pause {
        /// Event id.
        event: String,
    },
    /// Let people enter and be admitted again.
    Open {
        /// Event id.
        event: String,
    },
    /// End the sale: nobody enters, nobody is admitted.
    Close {
        /// Event id.
        event: String,
    },
    /// Switch the ranking strategy (every instance follows within a second).
    Strategy {
        /// Event id.
        event: String,
        /// `global_counter`, `timestamp`, `statistical` or `hybrid`.
        name: String,
    },
}

/// Runs one admin command and prints its result.
pub async fn run(args: AdminArgs) -> anyhow::Result<()> {
    let api = Api::new(&args)?;
    let out = match &args.command {
        AdminCommand::List => {
            api.call(reqwest::Method::GET, "/admin/v1/events", None)
                .await?
        }
        AdminCommand::Show { event } => {
            api.call(
                reqwest::Method::GET,
                &format!("/admin/v1/events/{event}"),
                None,
            )
            .await?
        }
        AdminCommand::Put {
            event,
            shards,
            admit_per_second,
            active_capacity,
            active_ttl_seconds,
            hold_ttl_seconds,
            max_seats_per_hold,
            strategy,
            state,
            line_form,
        } => {
            let mut body = Map::new();
            let mut set = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    body.insert(k.to_owned(), v);
                }
            };
            set("shards", shards.map(Value::from));
            set("admit_per_second", admit_per_second.map(Value::from));
            set("active_capacity", active_capacity.map(Value::from));
            set("active_ttl_seconds", active_ttl_seconds.map(Value::from));
            set("hold_ttl_seconds", hold_ttl_seconds.map(Value::from));
            set("max_seats_per_hold", max_seats_per_hold.map(Value::from));
            set("strategy", strategy.clone().map(Value::from));
            set("state", state.clone().map(Value::from));
            set("line_form", line_form.clone().map(Value::from));
            api.put_event(event, Value::Object(body)).await?
        }
        AdminCommand::Pause { event } => api.put_event(event, json!({"state": "paused"})).await?,
        AdminCommand::Open { event } => api.put_event(event, json!({"state": "open"})).await?,
        AdminCommand::Close { event } => api.put_event(event, json!({"state": "closed"})).await?,
        AdminCommand::Strategy { event, name } => {
            api.call(
                reqwest::Method::PUT,
                &format!("/admin/v1/events/{event}/strategy"),
                Some(json!({ "strategy": name })),
            )
            .await?
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    match &args.command {
        AdminCommand::List => print!("{}", table(out["events"].as_array().map_or(&[][..], |v| v))),
        AdminCommand::Show { .. } => print!("{}", detail(&out)),
        _ => println!("{}", serde_json::to_string(&out)?),
    }
    Ok(())
}

/// The admin API at one URL with one token.
struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    fn new(args: &AdminArgs) -> anyhow::Result<Self> {
        Ok(Api {
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .build()?,
            url: args.url.trim_end_matches('/').to_owned(),
            token: args.token.expose().to_owned(),
        })
    }

    async fn put_event(&self, event: &str, body: Value) -> anyhow::Result<Value> {
        self.call(
            reqwest::Method::PUT,
            &format!("/admin/v1/events/{event}"),
            Some(body),
        )
        .await
    }

    /// One request; a non-2xx answer is an error carrying the API's code and message.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("calling {}{path}", self.url))?;
        let status = resp.status();
        let value: Value = resp.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(
            status.is_success(),
            "{status}: {} — {}",
            value["error"].as_str().unwrap_or("?"),
            value["message"].as_str().unwrap_or("")
        );
        Ok(value)
    }
}

/// Events as a table: one line each, the figures an operator watches.
pub fn table(events: &[Value]) -> String {
    let mut rows = vec![[
        "event".to_owned(),
        "state".to_owned(),
        "strategy".to_owned(),
        "waiting".to_owned(),
        "active".to_owned(),
        "admitted/s".to_owned(),
        "configured/s".to_owned(),
    ]];
    for e in events {
        let (c, s) = (&e["config"], &e["stats"]);
        rows.push([
            text(&e["event"]),
            text(&c["state"]),
            text(&s["effective_strategy"]),
            text(&s["waiting"]),
            text(&s["active"]),
            s["measured_admit_per_second"]
                .as_f64()
                .map_or("-".to_owned(), |r| format!("{r:.1}")),
            text(&c["admit_per_second"]),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One event in detail: configuration lines, figures, waiting per shard.
fn detail(e: &Value) -> String {
    let (c, s) = (&e["config"], &e["stats"]);
    let mut out = format!(
        "event {}: {} · strategy {} (in use: {}) · leader {}\n",
        text(&e["event"]),
        text(&c["state"]),
        text(&c["strategy"]),
        text(&s["effective_strategy"]),
        text(&s["admission_leader"]),
    );
    out.push_str(&format!(
        "waiting {} · active {} of {} · admitted {} · {} admitted/s of {} configured\n",
        text(&s["waiting"]),
        text(&s["active"]),
        text(&c["active_capacity"]),
        text(&s["admitted_total"]),
        s["measured_admit_per_second"]
            .as_f64()
            .map_or("-".to_owned(), |r| format!("{r:.1}")),
        text(&c["admit_per_second"]),
    ));
    if s["turning_away"] == Value::Bool(true) {
        out.push_str(
            "new people turned away: a Redis node of this line is near its memory limit (the memory guard)\n",
        );
    }
    if c["line_form"] == "numbered" {
        out.push_str("numbered line: one counter orders everyone; no per-shard counts\n");
    }
    for shard in s["shards"].as_array().map_or(&[][..], |v| v) {
        out.push_str(&format!(
            "  shard {:>3}  {:>10} waiting\n",
            text(&shard["shard"]),
            text(&shard["waiting"])
        ));
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detail_says_when_new_people_are_turned_away() {
        let event = |closed: bool| {
            json!({"event": "topgun", "config": {"state": "open"},
                   "stats": {"waiting": 10, "shards": [], "turning_away": closed}})
        };
        assert!(detail(&event(true)).contains("new people turned away"));
        assert!(!detail(&event(false)).contains("turned away"));
    }

    #[test]
    fn the_detail_names_a_numbered_line_and_lists_a_sorted_lines_shards() {
        let numbered = json!({"event": "topgun", "config": {"line_form": "numbered"},
                              "stats": {"waiting": 10, "shards": []}});
        let d = detail(&numbered);
        assert!(d.contains("numbered line"), "{d}");
        assert!(!d.contains("  shard "), "{d}");
        let sorted = json!({"event": "topgun", "config": {"line_form": "sorted_sets"},
                            "stats": {"waiting": 10, "shards": [{"shard": 0, "waiting": 6},
                                                                {"shard": 1, "waiting": 4}]}});
        let d = detail(&sorted);
        assert!(!d.contains("numbered line"), "{d}");
        assert_eq!(d.matches(" waiting\n").count(), 2, "{d}");
    }

    #[test]
    fn the_table_lines_up_events_and_their_figures() {
        let events = vec![json!({
            "event": "topgun",
            "config": {"state": "open", "admit_per_second": 500.0},
            "stats": {"effective_strategy": "timestamp", "waiting": 1200, "active": 40,
                      "measured_admit_per_second": 498.25}
        })];
        let t = table(&events);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("event "));
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "topgun",
                "open",
                "timestamp",
                "1200",
                "40",
                "498.2",
                "500.0"
            ]
        );
    }
}
