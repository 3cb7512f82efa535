//! Private Redis processes for tests that kill a node: a 6-node cluster or one standalone
//! server, on their own ports and directories, stopped when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisProcs {
    pub ports: Vec<u16>,
    children: Vec<Option<Child>>,
    dir: PathBuf,
}

/// `program` as a child that dies with the test process: started through util-linux's
/// `setpriv --pdeathsig KILL`, which execs it with a parent-death signal. A test that nextest
/// ends at its timeout is killed, so its `Drop`s never stop what it started: one such `waitroom
/// serve` ran on for 80 minutes, through two CI runs, competing for the 2 cores. Without
/// setpriv, the plain command. (The signal follows the thread that started the child; tests
/// start theirs from the test body or runtime workers, which live as long as the test.)
pub fn dies_with_test(program: impl AsRef<std::ffi::OsStr>) -> Command {
    static SETPRIV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let setpriv = *SETPRIV.get_or_init(|| {
        Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .status()
            .is_ok_and(|s| s.success())
    });
    if !setpriv {
        return Command::new(program);
    }
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
    cmd
}

fn start_node(dir: &std::path::Path, port: u16, cluster: bool) -> Child {
    let d = dir.join(port.to_string());
    std::fs::create_dir_all(&d).unwrap();
    let mut cmd = dies_with_test("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .arg("--dir")
    .arg(&d)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if cluster {
        cmd.args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ]);
    }
    cmd.spawn().expect("redis-server starts")
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl RedisProcs {
    /// One standalone Redis on `port`.
    pub fn standalone(port: u16) -> Self {
        let dir =
            std::env::temp_dir().join(format!("waitroom-test-redis-{port}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let child = start_node(&dir, port, false);
        wait_until(Duration::from_secs(10), "standalone redis", || {
            cli(port, &["ping"]).contains("PONG")
        });
        RedisProcs {
            ports: vec![port],
            children: vec![Some(child)],
            dir,
        }
    }

    /// A cluster of 3 primaries + 3 replicas on `base..base+6`, ready and fully linked.
    pub fn cluster(base: u16) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "waitroom-test-cluster-{base}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let ports: Vec<u16> = (base..base + 6).collect();
        let children = ports
            .iter()
            .map(|p| Some(start_node(&dir, *p, true)))
            .collect();
        for p in &ports {
            wait_until(Duration::from_secs(10), "cluster node", || {
                cli(*p, &["ping"]).contains("PONG")
            });
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let procs = RedisProcs {
            ports,
            children,
            dir,
        };
        procs.wait_healthy(Duration::from_secs(30));
        procs
    }

    /// The ports of the nodes running (not killed).
    fn live(&self) -> Vec<u16> {
        self.ports
            .iter()
            .zip(&self.children)
            .filter(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    /// Waits until every live node reports cluster_state:ok and 3 replicas are linked.
    pub fn wait_healthy(&self, limit: Duration) {
        let live = self.live();
        wait_until(limit, "cluster healthy", || {
            live.iter()
                .all(|p| cli(*p, &["cluster", "info"]).contains("cluster_state:ok"))
        });
        // A fresh replica shows as a slot-less primary for a while: wait until every replica
        // is linked, so clients see the final topology (shared/INFRA.md).
        if live.len() == self.ports.len() {
            wait_until(limit, "replicas linked", || {
                live.iter()
                    .map(|p| cli(*p, &["info", "replication"]))
                    .filter(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
                    .count()
                    == 3
                    // ... and every node lists every replica for its slots (clients build their
                    // routing from CLUSTER SLOTS: a replica missing there never serves a read).
                    && live.iter().all(|p| {
                        let slots = cli(*p, &["cluster", "slots"]);
                        self.ports.iter().all(|q| slots.lines().any(|l| l.trim() == q.to_string()))
                    })
            });
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// Port of the primary serving `slot`.
    pub fn primary_for_slot(&self, slot: u16) -> u16 {
        // CLUSTER NODES lines: "<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slots>..."
        let nodes = cli(self.ports[0], &["cluster", "nodes"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            for range in &f[8..] {
                let (lo, hi) = match range.split_once('-') {
                    Some((a, b)) => (a.parse::<u16>().unwrap_or(1), b.parse::<u16>().unwrap_or(0)),
                    None => match range.parse::<u16>() {
                        Ok(s) => (s, s),
                        Err(_) => continue,
                    },
                };
                if (lo..=hi).contains(&slot) {
                    let addr = f[1].split('@').next().unwrap();
                    return addr.rsplit(':').next().unwrap().parse().unwrap();
                }
            }
        }
        panic!("no primary serves slot {slot}:\n{nodes}");
    }

    /// Port of a replica of the primary on `port` (from `CLUSTER NODES`).
    #[allow(dead_code)]
    pub fn replica_of(&self, primary: u16) -> u16 {
        let nodes = cli(primary, &["cluster", "nodes"]);
        let id = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split_whitespace().next())
            .expect("own line")
            .to_owned();
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 && f[2].contains("slave") && f[3] == id {
                let addr = f[1].split('@').next().unwrap();
                return addr.rsplit(':').next().unwrap().parse().unwrap();
            }
        }
        panic!("no replica of {primary}:\n{nodes}");
    }

    /// A hash read straight from the node on `port` (no redirection): field → value.
    #[allow(dead_code)]
    pub fn hgetall(&self, port: u16, key: &str) -> std::collections::HashMap<String, String> {
        let out = cli(port, &["hgetall", key]);
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_owned(), c[1].to_owned()))
            .collect()
    }

    /// The ports of the nodes that are primaries now (`ROLE`).
    #[allow(dead_code)]
    pub fn primaries(&self) -> Vec<u16> {
        self.live()
            .into_iter()
            .filter(|p| cli(*p, &["role"]).starts_with("master"))
            .collect()
    }

    /// `used_memory` of the node on `port`, bytes.
    #[allow(dead_code)]
    pub fn used_memory(&self, port: u16) -> u64 {
        let info = cli(port, &["info", "memory"]);
        info.lines()
            .find_map(|l| l.trim().strip_prefix("used_memory:"))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no used_memory from {port}: {info}"))
    }

    /// Sets `maxmemory` of the node on `port` (0: no limit).
    #[allow(dead_code)]
    pub fn set_maxmemory(&self, port: u16, bytes: u64) {
        let out = cli(port, &["config", "set", "maxmemory", &bytes.to_string()]);
        assert!(out.contains("OK"), "config set maxmemory on {port}: {out}");
    }

    /// Drops the replication links of the primary on `port` (`CLIENT KILL TYPE replica`):
    /// until a replica reconnects, writes stay on the primary alone.
    #[allow(dead_code)]
    pub fn cut_replicas(&self, port: u16) {
        cli(port, &["client", "kill", "type", "replica"]);
    }

    /// Waits until the node on `port` reports itself a primary (a replica promoted by a
    /// failover).
    #[allow(dead_code)]
    pub fn wait_primary(&self, port: u16, limit: Duration) {
        wait_until(limit, "replica promoted", || {
            cli(port, &["role"]).starts_with("master")
        });
    }

    fn index(&self, port: u16) -> usize {
        self.ports
            .iter()
            .position(|p| *p == port)
            .expect("known port")
    }

    fn child(&self, port: u16) -> &Child {
        self.children[self.index(port)].as_ref().expect("running")
    }

    /// Tells the replica on `port` never to take over from its primary
    /// (`cluster-replica-no-failover`): a primary that hangs then stays the primary, hung, for
    /// as long as it hangs (a slow node, a network that drops packets, a cluster whose node
    /// timeout is longer than the hang).
    #[allow(dead_code)]
    pub fn no_failover(&self, port: u16) {
        let out = cli(
            port,
            &["config", "set", "cluster-replica-no-failover", "yes"],
        );
        assert!(out.contains("OK"), "config set on {port}: {out}");
    }

    /// Freezes the node on `port` (SIGSTOP): it neither answers nor replicates, and its
    /// connections stay open — a hang, not a refusal.
    #[allow(dead_code)]
    pub fn pause(&self, port: u16) {
        signal(self.child(port).id(), "-STOP");
    }

    /// Lets a frozen node go on (SIGCONT).
    #[allow(dead_code)]
    pub fn resume(&self, port: u16) {
        signal(self.child(port).id(), "-CONT");
    }

    /// Replaces a killed node by a fresh one on its port (no data, a new identity) that joins
    /// as a replica of the primary on `of`: how an operator restores redundancy after a
    /// failover without persistence (restarting the old node with its old identity would let
    /// it serve its former slots, empty, until the cluster corrects it).
    #[allow(dead_code)]
    pub fn replace_as_replica(&mut self, port: u16, of: u16) {
        let i = self.index(port);
        assert!(self.children[i].is_none(), "node {port} still runs");
        let _ = std::fs::remove_dir_all(self.dir.join(port.to_string()));
        self.children[i] = Some(start_node(&self.dir, port, true));
        wait_until(Duration::from_secs(10), "fresh node", || {
            cli(port, &["ping"]).contains("PONG")
        });
        cli(port, &["cluster", "meet", "127.0.0.1", &of.to_string()]);
        let id = cli(of, &["cluster", "myid"]).trim().to_owned();
        wait_until(Duration::from_secs(20), "replica attached", || {
            cli(port, &["cluster", "replicate", &id]).contains("OK")
        });
        wait_until(Duration::from_secs(30), "replica in sync", || {
            let info = cli(port, &["info", "replication"]);
            info.contains("role:slave") && info.contains("master_link_status:up")
        });
    }

    /// Each running node's role and replication state (`INFO replication`, without the backlog
    /// lines) and one node's `CLUSTER NODES`: what a failure message shows of a failover.
    #[allow(dead_code)]
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let live = self.live();
        for &p in &live {
            let info = cli(p, &["info", "replication"]);
            let kept: Vec<&str> = info
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("repl_backlog"))
                .collect();
            out.push_str(&format!("node {p}: {}\n", kept.join(" ")));
        }
        if let Some(&p) = live.first() {
            out.push_str(&format!(
                "cluster nodes from {p}:\n{}",
                cli(p, &["cluster", "nodes"])
            ));
        }
        out
    }

    /// kill -9 of the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let i = self.index(port);
        if let Some(mut c) = self.children[i].take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

impl Drop for RedisProcs {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private Kafka-protocol broker (tansu on sqlite, the stack's build) on its own port and
/// directory, for tests that pause or kill the broker without touching the shared one.
pub struct Broker {
    pub port: u16,
    /// The port clients are told to use (the broker's own, or a proxy's in front of it).
    advertised: u16,
    child: Option<Child>,
    dir: PathBuf,
}

/// The tansu binary `scripts/stack` built (`WAITROOM_TANSU_BIN` overrides).
fn tansu_bin() -> PathBuf {
    if let Ok(b) = std::env::var("WAITROOM_TANSU_BIN") {
        return b.into();
    }
    let cache = std::env::var("WAITROOM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/waitroom"));
    cache.join("tools-tansu-pg/bin/tansu")
}

#[allow(dead_code)] // start, pause, resume: for faults that freeze or restart the broker itself
impl Broker {
    /// Starts a broker on `port` and waits until it listens.
    pub fn start(port: u16) -> Self {
        Self::start_behind(port, port)
    }

    /// Starts a broker on `port` that tells clients to connect to `advertised` (a proxy).
    pub fn start_behind(port: u16, advertised: u16) -> Self {
        let dir =
            std::env::temp_dir().join(format!("waitroom-broker-{port}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut b = Broker {
            port,
            advertised,
            child: None,
            dir,
        };
        b.restart();
        b
    }

    /// Starts the broker again on the same storage (after [`Broker::kill`]).
    pub fn restart(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://127.0.0.1:{}", self.advertised);
        let child = dies_with_test(tansu_bin())
            .arg("broker")
            .args([
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .arg("--storage-engine")
            // A path relative to the working directory (tansu joins it to the cwd).
            .arg("sqlite://tansu.db")
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("tansu.log")).unwrap())
            .spawn()
            .expect("tansu starts (scripts/stack up builds it)");
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(20), "private broker listening", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// The broker's address for `WAITROOM_KAFKA_BROKERS`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    fn signal(&self, sig: &str) {
        signal(self.child.as_ref().expect("running").id(), sig);
    }

    /// Freezes the broker (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen broker go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy in front of a broker that can cut the network to it: while frozen, whatever
/// clients send is swallowed (the broker never sees it, so nothing it answers is lost and no
/// retry repeats a write it has), nothing comes back; thawing closes every connection, and
/// clients reconnect. A partition between the service and Kafka, as a test can make one.
pub struct Partition {
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Partition {
    /// Listens on `port` and forwards to 127.0.0.1:`upstream`.
    pub async fn start(port: u16, upstream: u16) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let frozen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (f, c) = (frozen.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let frozen = f.clone();
                let task = tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                    let Ok(mut broker) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (mut cr, mut cw) = client.split();
                    let (mut br, mut bw) = broker.split();
                    let up = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = cr.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<_, std::io::Error>(());
                            }
                            if !frozen.load(Ordering::SeqCst) {
                                bw.write_all(&buf[..n]).await?;
                            }
                        }
                    };
                    let down = tokio::io::copy(&mut br, &mut cw);
                    let _ = tokio::join!(up, down);
                });
                c.lock().unwrap().push(task.abort_handle());
            }
        });
        Partition {
            frozen,
            conns,
            accept,
        }
    }

    /// Cuts the network: requests are swallowed from now on.
    pub fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Heals it: every connection is closed (clients reconnect), traffic flows again.
    pub fn thaw(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
        self.frozen
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.accept.abort();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

/// A private PostgreSQL (the machine's binaries, run as the `postgres` user when the tests run
/// as root) on its own port and directory, for tests that stop the database under a sale.
pub struct PgProc {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

/// Runs `cmd` as the `postgres` user (PostgreSQL refuses to run as root), or as is otherwise.
fn as_postgres(cmd: &str) -> std::process::Output {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let mut c = if root {
        let mut c = Command::new("su");
        c.args(["postgres", "-c", cmd]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", cmd]);
        c
    };
    c.output().expect("a shell")
}

#[allow(dead_code)]
impl PgProc {
    /// initdb and start on `port`.
    pub fn start(port: u16) -> Self {
        let bin = PathBuf::from(
            String::from_utf8(
                Command::new("pg_config")
                    .arg("--bindir")
                    .output()
                    .expect("pg_config (scripts/stack up installs PostgreSQL)")
                    .stdout,
            )
            .unwrap()
            .trim(),
        );
        let dir = std::env::temp_dir().join(format!("waitroom-pg-{port}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chown")
            .args(["postgres", &dir.display().to_string()])
            .status();
        let out = as_postgres(&format!(
            "{}/initdb -D {}/data -A trust -U postgres",
            bin.display(),
            dir.display()
        ));
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pg = PgProc { port, dir, bin };
        pg.up();
        pg
    }

    /// postgres://… of the database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server on its data (again, after [`PgProc::crash`]).
    pub fn up(&self) {
        let out = as_postgres(&format!(
            "{}/pg_ctl -D {d}/data -l {d}/log -w -t 30 -o '-p {} -k {d} -c listen_addresses=127.0.0.1' start",
            self.bin.display(),
            self.port,
            d = self.dir.display()
        ));
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops it as a crash would (`pg_ctl stop -m immediate`: no checkpoint, every connection cut).
    pub fn crash(&self) {
        let out = as_postgres(&format!(
            "{}/pg_ctl -D {}/data -w -m immediate stop",
            self.bin.display(),
            self.dir.display()
        ));
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PgProc {
    fn drop(&mut self) {
        let _ = as_postgres(&format!(
            "{}/pg_ctl -D {}/data -w -m immediate stop",
            self.bin.display(),
            self.dir.display()
        ));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
