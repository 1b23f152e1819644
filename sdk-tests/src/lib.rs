//! The harness of the SDK tests: a real `strand dev --replicas 3` cluster as a child process
//! group ([`DevCluster`]), or three `strand start` children one of which can be killed and
//! restarted alone ([`start::StartCluster`]); their `/metrics`; a raw-frame client
//! ([`raw::RawClient`]); a client that rotates addresses after a failover
//! ([`RotatingClient`]); and step timeouts that name the step.
//!
//! The binary under test is `$STRAND_BIN` (`.ci/run` builds it first and passes its path);
//! there is no fallback to a binary found elsewhere, so a stale build is never tested.

pub mod raw;
mod rotate;
pub mod start;

pub use rotate::{AfterLogin, Call, RotatingClient};

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How many nodes the smoke test runs.
pub const REPLICAS: usize = 3;

/// How long the cluster may take to elect a primary and to spread a commit point.
pub const CLUSTER_BOUND: Duration = Duration::from_secs(60);

/// One SDK step's bound: below the SDK's own 30 s read timeout, so a server that never
/// answers is reported here, by step, not as the SDK's generic `Disconnected`.
pub const STEP_BOUND: Duration = Duration::from_secs(20);

/// The addresses `strand dev` printed for one node.
#[derive(Debug, Clone)]
pub struct NodeAddrs {
    /// `ip:port` of the client (`tcp`) listener.
    pub client: String,
    /// `ip:port` of the HTTP listener serving `/metrics`.
    pub http: String,
}

/// A running `strand dev` and everything it started, stopped on drop (also on panic): SIGTERM
/// to the whole process group, a bounded wait for `strand dev` to stop its nodes, then SIGKILL
/// to the group.
pub struct DevCluster {
    child: Child,
    pgid: i32,
    /// Scratch directory: data directories, the generated config and `strand.log`.
    pub dir: PathBuf,
    /// Per node, in replica-id order.
    pub nodes: Vec<NodeAddrs>,
    log: PathBuf,
    passed: bool,
}

/// The path of the binary under test, or a panic that says how to provide it.
pub fn strand_bin() -> PathBuf {
    let Some(path) = std::env::var_os("STRAND_BIN") else {
        panic!(
            "STRAND_BIN is not set: build the server first (cargo build -p server --bin strand) \
             and pass its path, as .ci/run does"
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "STRAND_BIN={} does not exist or is not a file",
        path.display()
    );
    path
}

/// The default dev ports of `node` (node i on every default port plus 100 x i).
fn default_ports(node: usize) -> (u16, u16) {
    let step = 100 * node as u16;
    (8090 + step, 3000 + step)
}

impl DevCluster {
    /// Starts `strand dev --replicas 3 --data-dir <scratch>/data` and reads the addresses it
    /// prints. Fails if any of the fixed dev ports already answers (another cluster would make
    /// every later check a lie).
    pub fn start(scratch: &Path) -> DevCluster {
        let bin = strand_bin();
        for node in 0..REPLICAS {
            let (client, http) = default_ports(node);
            for port in [client, http] {
                assert!(
                    TcpStream::connect(("127.0.0.1", port)).is_err(),
                    "127.0.0.1:{port} already answers before the cluster starts: another strand \
                     (or something else) holds the fixed dev ports; stop it first"
                );
            }
        }
        let _ = std::fs::remove_dir_all(scratch);
        std::fs::create_dir_all(scratch).expect("creating the scratch directory");
        let log = scratch.join("strand.log");
        let log_file = std::fs::File::create(&log).expect("creating strand.log");
        let mut command = Command::new(&bin);
        command
            .args(["dev", "--replicas", &REPLICAS.to_string(), "--data-dir"])
            .arg(scratch.join("data"))
            .env(
                "RUST_LOG",
                std::env::var("STRAND_SDK_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            // Commits must come from the SDK's requests only (decision 138's test source off).
            .env_remove("STRAND_TEST_REGISTER_INTERVAL_MS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file);
        // Its own process group, so cleanup reaches the nodes `strand dev` spawns even if
        // `strand dev` itself is gone.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        // And if this process dies without running the drop guard (killed by a signal, a CI
        // timeout), `strand dev` gets SIGTERM and stops its nodes itself.
        // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
        // which is async-signal-safe; it allocates nothing and touches no lock.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} dev: {e}", bin.display()));
        let pgid = i32::try_from(child.id()).expect("pid fits i32");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut cluster = DevCluster {
            child,
            pgid,
            dir: scratch.to_owned(),
            nodes: Vec::new(),
            log,
            passed: false,
        };
        // A reader thread forwards the lines, and keeps draining so the pipe never fills.
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                eprintln!("[strand dev] {line}");
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut found: BTreeMap<usize, NodeAddrs> = BTreeMap::new();
        while found.len() < REPLICAS {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => cluster.fail(&format!(
                    "strand dev printed {} of {REPLICAS} node addresses within 30 s",
                    found.len()
                )),
            };
            if let Some((node, addrs)) = parse_node_line(&line) {
                found.insert(node, addrs);
            }
        }
        cluster.nodes = found.into_values().collect();
        cluster
    }

    /// Panics with `what`, the tail of the nodes' log and where the whole log is.
    pub fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\n--- last lines of {} ---\n{}",
            self.log.display(),
            self.log_tail(80)
        )
    }

    /// The last `n` lines of the nodes' combined stderr.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Every `/metrics` of the cluster, `None` for a node that does not answer.
    pub fn metrics(&self) -> Vec<Option<Metrics>> {
        self.nodes
            .iter()
            .map(|n| Metrics::scrape(&n.http))
            .collect()
    }

    /// Polls every node's metrics until `done` holds, within [`CLUSTER_BOUND`]; fails naming
    /// `what` with the last metrics seen. Also fails at once if `strand dev` exited.
    pub fn wait_metrics(&mut self, what: &str, done: impl Fn(&[Metrics]) -> bool) -> Vec<Metrics> {
        let deadline = Instant::now() + CLUSTER_BOUND;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.fail(&format!("{what}: strand dev exited early ({status})"));
            }
            let all = self.metrics();
            if let Some(all) = all.iter().cloned().collect::<Option<Vec<_>>>()
                && done(&all)
            {
                return all;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "{what}: not within {CLUSTER_BOUND:?}; last metrics {all:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Marks the run as passed: the scratch directory is removed on drop (kept otherwise).
    pub fn pass(&mut self) {
        self.passed = true;
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group we created (pgid = our child's pid, which we
        // have not reaped yet, so no other group can have taken the id).
        unsafe { libc::kill(-self.pgid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Whatever is left of the group (a node that ignored SIGTERM, or strand dev itself).
        // SAFETY: as above; after the reap the group may be empty, and kill then fails with
        // ESRCH, which is fine.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        let _ = self.child.wait();
        if self.passed {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "--- last lines of {} ---\n{}\n--- kept {} ---",
                self.log.display(),
                self.log_tail(60),
                self.dir.display()
            );
        }
    }
}

/// `node 1: clients tcp 127.0.0.1:8190, http 127.0.0.1:3100, replicas ...`
fn parse_node_line(line: &str) -> Option<(usize, NodeAddrs)> {
    let rest = line.strip_prefix("node ")?;
    let (index, rest) = rest.split_once(':')?;
    let node = index.trim().parse().ok()?;
    let client = rest.split("clients tcp ").nth(1)?.split(',').next()?.trim();
    let http = rest.split("http ").nth(1)?.split(',').next()?.trim();
    Some((
        node,
        NodeAddrs {
            client: client.to_owned(),
            http: http.to_owned(),
        },
    ))
}

/// The metadata group's gauges of one node (`strand_NAME{plane="metadata"} V`, by NAME).
#[derive(Debug, Clone)]
pub struct Metrics(pub BTreeMap<String, u64>);

impl Metrics {
    /// `GET /metrics` from `addr`, `None` if it does not answer in full.
    pub fn scrape(addr: &str) -> Option<Metrics> {
        let mut stream = TcpStream::connect(addr).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: strand\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        let mut out = BTreeMap::new();
        for line in text.lines() {
            if let Some((name, value)) = line.split_once("{plane=\"metadata\"} ")
                && let Some(name) = name.strip_prefix("strand_")
                && let Ok(v) = value.trim().parse()
            {
                out.insert(name.to_owned(), v);
            }
        }
        (out.contains_key("is_primary") && out.contains_key("commit_max")).then_some(Metrics(out))
    }

    /// A gauge; panics naming it when the node does not export it.
    pub fn get(&self, name: &str) -> u64 {
        *self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("metric strand_{name}{{plane=\"metadata\"}} is missing"))
    }
}

/// Every sample of `GET /metrics` from `addr` as `name{labels}` -> value (names with the
/// `strand_` prefix, labels as rendered), `None` if it does not answer in full.
pub fn scrape_all(addr: &str) -> Option<BTreeMap<String, u64>> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: strand\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("strand_")) {
        if let Some((name, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.parse()
        {
            out.insert(name.to_owned(), v);
        }
    }
    out.contains_key("strand_view{plane=\"metadata\"}")
        .then_some(out)
}

/// One sample of [`scrape_all`] by its full rendered name; panics naming the sample when it is
/// absent, so a renamed metric fails the test that reads it.
pub fn sample(all: &BTreeMap<String, u64>, name: &str) -> u64 {
    *all.get(name)
        .unwrap_or_else(|| panic!("metric sample `{name}` is not on /metrics"))
}

/// The index of the one node whose metadata `is_primary` is 1, if exactly one is.
pub fn single_primary(all: &[Metrics]) -> Option<usize> {
    let primaries: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].get("is_primary") == 1)
        .collect();
    (primaries.len() == 1).then(|| primaries[0])
}

/// The SDK's own logs on stderr, filtered by `STRAND_SDK_CLIENT_LOG` (default `warn`; e.g.
/// `iggy=trace` shows every request's command code and size as the SDK sends it).
pub fn init_client_log() {
    let filter = std::env::var("STRAND_SDK_CLIENT_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_test_writer()
        .try_init();
}

/// Runs one SDK step under [`STEP_BOUND`]; a timeout or an error panics with the step's name.
pub async fn step<T, E: std::fmt::Debug>(
    name: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> T {
    match tokio::time::timeout(STEP_BOUND, fut).await {
        Ok(Ok(value)) => {
            eprintln!("step ok: {name}");
            value
        }
        Ok(Err(e)) => panic!("step `{name}` failed: {e:?}"),
        Err(_) => panic!("step `{name}`: no answer within {STEP_BOUND:?}"),
    }
}

/// A connected SDK client on `address` (no login) that gives up instead of reconnecting, so a
/// dropped connection is reported by the step that saw it.
pub async fn client_on(address: &str) -> iggy::prelude::IggyClient {
    let client = iggy::prelude::IggyClient::builder()
        .with_tcp()
        .with_server_address(address.to_owned())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    use iggy::prelude::Client as _;
    step("connect", client.connect()).await;
    client
}

/// The error of a call the server must refuse, within [`STEP_BOUND`]; success or silence
/// panics with the step's name.
pub async fn refused<T: std::fmt::Debug>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, iggy::prelude::IggyError>>,
) -> iggy::prelude::IggyError {
    match tokio::time::timeout(STEP_BOUND, fut).await {
        Ok(Err(e)) => {
            eprintln!("step refused as expected: {what}: {e:?}");
            e
        }
        Ok(Ok(value)) => panic!("`{what}` succeeded ({value:?}) but must be refused"),
        Err(_) => panic!("`{what}`: no answer within the bound"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_dev_address_line() {
        let line = "node 1: clients tcp 127.0.0.1:8190, http 127.0.0.1:3100, replicas \
                    127.0.0.1:9190, data /x/node-1";
        let (node, addrs) = parse_node_line(line).unwrap();
        assert_eq!(node, 1);
        assert_eq!(addrs.client, "127.0.0.1:8190");
        assert_eq!(addrs.http, "127.0.0.1:3100");
        assert!(parse_node_line("3 nodes started").is_none());
    }

    #[test]
    fn one_primary_exactly() {
        let m = |p: u64| Metrics(BTreeMap::from([("is_primary".to_owned(), p)]));
        assert_eq!(single_primary(&[m(0), m(1), m(0)]), Some(1));
        assert_eq!(single_primary(&[m(1), m(1), m(0)]), None);
        assert_eq!(single_primary(&[m(0), m(0), m(0)]), None);
    }
}
