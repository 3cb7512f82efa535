//! Redis as an operator sees it: every node's `INFO`, read by the service on an interval and
//! exported under redis_exporter's metric names ([`crate::telemetry::redis_node`]), one series
//! per node (label `addr`). No exporter can be installed next to a managed Redis, and the
//! service already knows every node of the cluster.
//!
//! Each node is asked over a connection of its own (not through the cluster client, which
//! routes by slot), bounded in time; a node that does not answer is `redis_up 0` and keeps no
//! other series fresh.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use super::RedisConn;
use crate::config::RedisConfig;
use crate::telemetry::{self, redis_node as m};

/// How often the nodes are read.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// How long one node may take to answer.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The address of every node of the deployment (`host:port`), primaries and replicas.
async fn node_addrs(conn: &mut RedisConn, seed: &str) -> Vec<String> {
    if !conn.is_cluster() {
        return vec![host_port(seed).to_owned()];
    }
    let nodes: Result<String, _> = redis::cmd("CLUSTER").arg("NODES").query_async(conn).await;
    match nodes {
        Ok(text) => parse_cluster_nodes(&text),
        Err(e) => {
            tracing::warn!(error = %e, "redis nodes: CLUSTER NODES failed");
            Vec::new()
        }
    }
}

/// `host:port` of every node line of `CLUSTER NODES` (`<id> <ip:port@cport> <flags> …`),
/// leaving out nodes flagged `noaddr` or `handshake`.
pub fn parse_cluster_nodes(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (_, addr, flags) = (parts.next()?, parts.next()?, parts.next()?);
            if flags.contains("noaddr") || flags.contains("handshake") {
                return None;
            }
            let hp = addr.split('@').next()?;
            (!hp.starts_with(':')).then(|| hp.to_owned())
        })
        .collect();
    out.sort();
    out
}

/// Where the `host:port` part of a Redis URL (`redis://[user:pass@]host:port[/db][?opts]`) sits.
fn authority(url: &str) -> std::ops::Range<usize> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let start = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
    start..end
}

/// The `host:port` part of a Redis URL.
pub(super) fn host_port(url: &str) -> &str {
    &url[authority(url)]
}

/// `url` with its `host:port` replaced by `addr`: scheme, credentials and options are kept, so
/// a TLS deployment with AUTH is read the way the service connects to it.
fn url_for(url: &str, addr: &str) -> String {
    let at = authority(url);
    format!("{}{addr}{}", &url[..at.start], &url[at.end..])
}

/// A client for the node at `addr` (`host:port`), connecting as the seed URL does: its scheme,
/// credentials and options, and the configured AUTH and CA.
pub(super) fn node_client(
    seed: &str,
    addr: &str,
    cfg: &RedisConfig,
) -> anyhow::Result<redis::Client> {
    super::client(&url_for(seed, addr), cfg)
}

/// One node's figures, from `INFO` and `SLOWLOG LEN`.
#[derive(Debug, Default, PartialEq)]
pub struct NodeInfo {
    fields: HashMap<String, String>,
    /// Keys per database (`db0` …).
    pub keys: Vec<(String, u64)>,
}

impl NodeInfo {
    /// Parses `INFO` text (`name:value` lines, `# Section` headers).
    pub fn parse(text: &str) -> Self {
        let mut info = NodeInfo::default();
        for line in text.lines() {
            let Some((k, v)) = line.trim().split_once(':') else {
                continue;
            };
            if k.starts_with("db") && k[2..].chars().all(|c| c.is_ascii_digit()) {
                // db0:keys=12,expires=0,avg_ttl=0
                if let Some(n) = v
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("keys="))
                    .and_then(|n| n.parse().ok())
                {
                    info.keys.push((k.to_owned(), n));
                }
            } else {
                info.fields.insert(k.to_owned(), v.to_owned());
            }
        }
        info
    }

    /// A numeric field.
    pub fn number(&self, name: &str) -> Option<f64> {
        self.fields.get(name)?.parse().ok()
    }

    /// A text field.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Reads every node every [`INTERVAL`] until `shutdown`, exporting the figures.
pub async fn watch(conn: RedisConn, cfg: RedisConfig, shutdown: CancellationToken) {
    metrics::gauge!(telemetry::REDIS_NODE_OPS_CAPACITY).set(cfg.node_ops_capacity);
    let seed = cfg.nodes.first().cloned().unwrap_or_default();
    let mut conns: HashMap<String, MultiplexedConnection> = HashMap::new();
    loop {
        let addrs = node_addrs(&mut conn.clone(), &seed).await;
        for addr in &addrs {
            let up = match read_node(&mut conns, &cfg, &seed, addr).await {
                Ok((info, slowlog)) => {
                    export(addr, &info, slowlog);
                    1.0
                }
                Err(e) => {
                    tracing::debug!(addr = %addr, error = %e, "redis nodes: no answer");
                    conns.remove(addr);
                    0.0
                }
            };
            metrics::gauge!(m::UP, "addr" => addr.clone()).set(up);
        }
        conns.retain(|a, _| addrs.contains(a));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(INTERVAL) => {}
        }
    }
}

/// `INFO` and `SLOWLOG LEN` of one node, over its own connection (made on first use).
async fn read_node(
    conns: &mut HashMap<String, MultiplexedConnection>,
    cfg: &RedisConfig,
    seed: &str,
    addr: &str,
) -> anyhow::Result<(NodeInfo, u64)> {
    let mut pipe = redis::pipe();
    pipe.cmd("INFO").arg("all").cmd("SLOWLOG").arg("LEN");
    let (info, slowlog): (String, u64) = ask_node(conns, cfg, seed, addr, &pipe).await?;
    Ok((NodeInfo::parse(&info), slowlog))
}

/// `pipe`'s answer from the node at `addr`, over a connection of its own kept in `conns` (made
/// on first use), within [`TIMEOUT`].
pub(super) async fn ask_node<T: redis::FromRedisValue>(
    conns: &mut HashMap<String, MultiplexedConnection>,
    cfg: &RedisConfig,
    seed: &str,
    addr: &str,
    pipe: &redis::Pipeline,
) -> anyhow::Result<T> {
    let read = async {
        if !conns.contains_key(addr) {
            let client = node_client(seed, addr, cfg)?;
            conns.insert(
                addr.to_owned(),
                client.get_multiplexed_async_connection().await?,
            );
        }
        let c = conns.get_mut(addr).expect("just inserted");
        anyhow::Ok(pipe.query_async(c).await?)
    };
    tokio::time::timeout(TIMEOUT, read).await?
}

fn export(addr: &str, info: &NodeInfo, slowlog: u64) {
    let a = addr.to_owned();
    let gauge = |name: &'static str, field: &str| {
        if let Some(v) = info.number(field) {
            metrics::gauge!(name, "addr" => a.clone()).set(v);
        }
    };
    gauge(m::OPS_PER_SEC, "instantaneous_ops_per_sec");
    gauge(m::MEMORY_USED, "used_memory");
    gauge(m::MEMORY_MAX, "maxmemory");
    gauge(m::CONNECTED_CLIENTS, "connected_clients");
    gauge(m::CONNECTED_SLAVES, "connected_slaves");
    gauge(m::MASTER_REPL_OFFSET, "master_repl_offset");
    if let Some(total) = info.number("total_commands_processed") {
        metrics::counter!(m::COMMANDS_PROCESSED, "addr" => a.clone()).absolute(total as u64);
    }
    let role = info.text("role").unwrap_or("unknown").to_owned();
    if role == "slave" {
        // redis_exporter labels a replica's link by its primary: `master_host`, `master_port`.
        let (host, port) = (
            info.text("master_host").unwrap_or("").to_owned(),
            info.text("master_port").unwrap_or("").to_owned(),
        );
        if let Some(v) = info.number("slave_repl_offset") {
            metrics::gauge!(m::SLAVE_REPL_OFFSET, "addr" => a.clone(), "master_host" => host.clone(), "master_port" => port.clone())
                .set(v);
        }
        let up = info.text("master_link_status") == Some("up");
        metrics::gauge!(m::MASTER_LINK_UP, "addr" => a.clone(), "master_host" => host, "master_port" => port)
            .set(if up { 1.0 } else { 0.0 });
    }
    let version = info.text("redis_version").unwrap_or("").to_owned();
    // A node that changed role (a promoted replica) keeps one `== 1` series: the other is 0.
    for other in ["master", "slave"].into_iter().filter(|r| *r != role) {
        metrics::gauge!(m::INSTANCE_INFO, "addr" => a.clone(), "role" => other, "redis_version" => version.clone())
            .set(0.0);
    }
    metrics::gauge!(m::INSTANCE_INFO, "addr" => a.clone(), "role" => role, "redis_version" => version)
        .set(1.0);
    metrics::gauge!(m::SLOWLOG_LENGTH, "addr" => a.clone()).set(slowlog as f64);
    for (db, n) in &info.keys {
        metrics::gauge!(m::DB_KEYS, "addr" => a.clone(), "db" => db.clone()).set(*n as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_give_every_reachable_address() {
        let text = "07c3 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                    67ed 127.0.0.1:7004@17004 slave 07c3 0 1 1 connected\n\
                    aaaa :0@0 master,noaddr - 0 0 0 disconnected\n";
        assert_eq!(
            parse_cluster_nodes(text),
            vec!["127.0.0.1:7000".to_owned(), "127.0.0.1:7004".to_owned()]
        );
    }

    #[test]
    fn node_urls_keep_scheme_and_credentials() {
        assert_eq!(host_port("redis://127.0.0.1:7000"), "127.0.0.1:7000");
        // The scheme's own text is never taken for the host, and options are kept.
        assert_eq!(
            url_for("redis://redis", "10.0.0.2:6379"),
            "redis://10.0.0.2:6379"
        );
        assert_eq!(
            url_for("redis://h:1?protocol=resp3", "[::1]:7000"),
            "redis://[::1]:7000?protocol=resp3"
        );
        assert_eq!(
            url_for("rediss://u:p@w@h:1#insecure", "h2:2"),
            "rediss://u:p@w@h2:2#insecure"
        );
        assert_eq!(
            url_for("rediss://:secret@10.0.0.1:6379/0", "10.0.0.2:6379"),
            "rediss://:secret@10.0.0.2:6379/0"
        );
    }

    #[test]
    fn info_text_parses_fields_and_keyspace() {
        let info = NodeInfo::parse(
            "# Server\r\nredis_version:7.0.15\r\n# Replication\r\nrole:slave\r\n\
             master_link_status:up\r\n# Keyspace\r\ndb0:keys=12,expires=3,avg_ttl=0\r\n",
        );
        assert_eq!(info.text("redis_version"), Some("7.0.15"));
        assert_eq!(info.text("role"), Some("slave"));
        assert_eq!(info.keys, vec![("db0".to_owned(), 12)]);
        assert_eq!(info.number("redis_version"), None);
    }
}
