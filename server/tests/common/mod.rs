//! Helpers for the end-to-end tests that run real `strand start` processes on loopback: a
//! scratch directory, free ports, a cluster config, spawning and signalling nodes, and reading
//! `/metrics`. Every wait is bounded.

#![allow(dead_code)]

pub mod client;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bound on every wait (generous: a loaded CI machine must not flake).
pub const BOUND: Duration = Duration::from_secs(60);

/// Clusters of one test binary run one at a time (the CI machine has 2 cores).
pub static SERIAL: Mutex<()> = Mutex::new(());

/// Takes [`SERIAL`], also after another test panicked holding it.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("strand-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Ports the kernel hands out now (bound and released; another process could take one, which
/// would fail the node's bind loudly, not silently).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

pub struct Node {
    pub id: u8,
    /// The client port.
    pub tcp: u16,
    pub http: u16,
    pub replica_port: u16,
    pub dir: PathBuf,
    pub child: Option<Child>,
}

/// A cluster of `n` nodes on `ports` (3 per node: tcp, http, tcp_replica), timeouts short
/// enough for tests, a metadata checkpoint every 64 ops, `extra` appended (more sections).
pub fn config(name: &str, n: usize, ports: &[u16], extra: &str) -> String {
    config_with(
        name,
        n,
        ports,
        "journal_slots = 256\ncheckpoint_interval_ops = 64",
        extra,
    )
}

/// [`config`] with `metadata` as the body of its `[metadata]` section.
pub fn config_with(name: &str, n: usize, ports: &[u16], metadata: &str, extra: &str) -> String {
    let mut text = format!(
        r#"
[cluster]
enabled = true
name = "{name}"
heartbeat_timeout = "2s"
commit_broadcast_interval = "200ms"
view_change_retransmit_interval = "200ms"
view_change_status_timeout = "2s"
request_start_view_retransmit_interval = "500ms"
repair_retry_interval = "200ms"

[message_bus]
reconnect_period = "200ms"

[metadata]
{metadata}

[system]
memory_prefault_bytes = "0"

[system.sharding]
io_memory = "256 KiB"
{extra}
"#
    );
    for i in 0..n {
        let p = &ports[i * 3..i * 3 + 3];
        text.push_str(&format!(
            "\n[[cluster.nodes]]\nname = \"n{i}\"\nip = \"127.0.0.1\"\nreplica_id = {i}\n\
             ports = {{ tcp = {}, http = {}, tcp_replica = {} }}\n",
            p[0], p[1], p[2]
        ));
    }
    text
}

/// The nodes of a cluster under `dir` on `ports` (not started).
pub fn nodes(dir: &Path, n: u8, ports: &[u16]) -> Vec<Node> {
    (0..n)
        .map(|i| Node {
            id: i,
            tcp: ports[usize::from(i) * 3],
            http: ports[usize::from(i) * 3 + 1],
            replica_port: ports[usize::from(i) * 3 + 2],
            dir: dir.join(format!("node-{i}")),
            child: None,
        })
        .collect()
}

/// Starts `node` (one unpinned shard, the test commit hook every 100 ms, decision 138) with
/// `extra` arguments, its stderr appended to `log`.
pub fn spawn(config: &Path, node: &mut Node, log: &Path, extra: &[&str]) {
    start(config, node, log, 1, Some(100), extra);
}

/// Starts `node` with `shards` unpinned shards and no test hook: only clients commit.
pub fn spawn_plain(config: &Path, node: &mut Node, log: &Path, shards: u8) {
    start(config, node, log, shards, None, &[]);
}

/// Starts `node` with `shards` unpinned shards, the test commit hook every `register_ms` (or
/// none), the default root user and `extra` arguments, its stderr appended to `log`.
pub fn start(
    config: &Path,
    node: &mut Node,
    log: &Path,
    shards: u8,
    register_ms: Option<u64>,
    extra: &[&str],
) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_strand"));
    command
        .env("RUST_LOG", "info")
        .env_remove("IGGY_ROOT_USERNAME")
        .env_remove("IGGY_ROOT_PASSWORD");
    match register_ms {
        Some(ms) => command.env("STRAND_TEST_REGISTER_INTERVAL_MS", ms.to_string()),
        None => command.env_remove("STRAND_TEST_REGISTER_INTERVAL_MS"),
    };
    let child = command
        .args(["start", "--config"])
        .arg(config)
        .args([
            "--replica-id",
            &node.id.to_string(),
            "--shards",
            &shards.to_string(),
            "--data-dir",
        ])
        .arg(&node.dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    node.child = Some(child);
}

/// Every sample of `/metrics` as `name{labels}` -> value, or `None` if the node does not
/// answer.
pub fn scrape(http: u16) -> Option<BTreeMap<String, u64>> {
    let mut stream = TcpStream::connect(("127.0.0.1", http)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
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

/// The metadata group's gauges and counters (names without `strand_`), or `None`.
pub fn metrics(http: u16) -> Option<BTreeMap<String, u64>> {
    let all = scrape(http)?;
    Some(
        all.into_iter()
            .filter_map(|(k, v)| {
                k.strip_suffix("{plane=\"metadata\"}")
                    .map(|n| (n.trim_start_matches("strand_").to_owned(), v))
            })
            .collect(),
    )
}

pub fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own unreaped child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// SIGKILLs `node` and reaps it.
pub fn kill(node: &mut Node) {
    if let Some(mut child) = node.child.take() {
        signal(&child, libc::SIGKILL);
        child.wait().unwrap();
    }
}

/// SIGKILLs every live node and reaps it.
pub fn kill_all(nodes: &mut [Node]) {
    for node in nodes.iter_mut() {
        kill(node);
    }
}

/// The sum over a node's shards of one partition-plane metric (full name, `strand_` included).
pub fn partition_sum(all: &BTreeMap<String, u64>, name: &str) -> u64 {
    all.iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) && k.contains("plane=\"partition\""))
        .map(|(_, v)| *v)
        .sum()
}

/// The sum over every label set of one metric (full name, `strand_` included).
pub fn metric_sum(all: &BTreeMap<String, u64>, name: &str) -> u64 {
    all.iter()
        .filter(|(k, _)| k.as_str() == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| *v)
        .sum()
}

/// One unlabelled metric's value from `/metrics` (panics when the node does not answer or
/// does not render it).
pub fn raw_metric(http: u16, name: &str) -> u64 {
    let all = scrape(http).unwrap_or_else(|| panic!("no /metrics on {http}"));
    *all.get(name)
        .unwrap_or_else(|| panic!("{name} not in /metrics: {all:?}"))
}

/// Polls `f` until it returns `Some`, within [`BOUND`] (the logs in the panic message).
pub fn eventually<T>(what: &str, logs: &Path, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < BOUND,
            "{what}: not within {BOUND:?}\nlogs:\n{}",
            std::fs::read_to_string(logs).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for one normal metadata primary among `live` (indices into `nodes`) and returns it.
pub fn metadata_primary(nodes: &[Node], live: &[usize], logs: &Path) -> usize {
    let watched: Vec<&Node> = live.iter().map(|&i| &nodes[i]).collect();
    let metrics = wait_until("one metadata primary", &watched, logs, one_primary);
    live[metrics.iter().position(|m| m["is_primary"] == 1).unwrap()]
}

/// Polls until `done` holds for the metrics of `nodes`, within [`BOUND`].
pub fn wait_until(
    what: &str,
    nodes: &[&Node],
    logs: &Path,
    mut done: impl FnMut(&[BTreeMap<String, u64>]) -> bool,
) -> Vec<BTreeMap<String, u64>> {
    let start = Instant::now();
    let mut last = Vec::new();
    while start.elapsed() < BOUND {
        let all: Option<Vec<_>> = nodes.iter().map(|n| metrics(n.http)).collect();
        if let Some(all) = all {
            if done(&all) {
                return all;
            }
            last = all;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "{what}: not within {BOUND:?}; last metrics {last:?}\nlogs:\n{}",
        std::fs::read_to_string(logs).unwrap_or_default()
    );
}

/// One normal primary, every node normal in the same view.
pub fn one_primary(all: &[BTreeMap<String, u64>]) -> bool {
    let views: std::collections::BTreeSet<u64> = all.iter().map(|m| m["view"]).collect();
    all.iter().all(|m| m["status"] == 0)
        && views.len() == 1
        && all.iter().filter(|m| m["is_primary"] == 1).count() == 1
}

/// Runs `body`; whatever it did, SIGTERMs every live node, then asserts each exited 0 (after
/// re-raising a panic of `body`).
pub fn run_cluster(nodes: &mut [Node], logs: &Path, body: impl FnOnce(&mut [Node])) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(nodes)));
    for node in nodes.iter() {
        if let Some(child) = node.child.as_ref() {
            signal(child, libc::SIGTERM);
        }
    }
    let mut statuses = Vec::new();
    for node in nodes.iter_mut() {
        if let Some(mut child) = node.child.take() {
            statuses.push((node.id, child.wait().unwrap()));
        }
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    for (id, status) in statuses {
        assert!(
            status.success(),
            "n{id}: {status}\n{}",
            std::fs::read_to_string(logs).unwrap_or_default()
        );
    }
}

/// Runs `body`; whatever it did, SIGKILLs every live node; after a panic prints the logs and
/// re-raises it, otherwise removes `dir`.
pub fn run_killed(nodes: &mut [Node], logs: &Path, dir: &Path, body: impl FnOnce(&mut [Node])) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(nodes)));
    kill_all(nodes);
    if let Err(panic) = result {
        eprintln!(
            "logs:\n{}",
            std::fs::read_to_string(logs).unwrap_or_default()
        );
        std::panic::resume_unwind(panic);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A payload that names its batch and position (distinct per message, sizes varied).
pub fn payload(batch: usize, i: usize) -> Vec<u8> {
    let mut p = format!("batch {batch} message {i} ").into_bytes();
    p.resize(p.len() + (batch * 37 + i * 11) % 300, (batch + i) as u8);
    p
}

/// Sends `batches` batches of three messages to `stream`, topic 0, round robin over the
/// partitions `acked` holds (one list each), numbered from `first`; every confirmation names
/// the partition and the next offset, and lands in `acked`.
pub fn send_batches(
    c: &mut client::Client,
    stream: u32,
    acked: &mut [Vec<(u64, Vec<u8>)>],
    first: usize,
    batches: usize,
) {
    for b in first..first + batches {
        let partition = (b % acked.len()) as u32;
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| payload(b, i)).collect();
        let (confirmed, base) = c.send(stream, partition, &payloads);
        let list = &mut acked[partition as usize];
        assert_eq!(confirmed, partition);
        assert_eq!(base, list.len() as u64, "offsets are dense per partition");
        for (i, p) in payloads.into_iter().enumerate() {
            list.push((base + i as u64, p));
        }
    }
}

/// Polls every partition of `acked` on `tcp` until it holds exactly what was acknowledged, in
/// order (a backup commits a little after the primary answered).
pub fn reads_back(
    tcp: u16,
    client: u128,
    stream: u32,
    acked: &[Vec<(u64, Vec<u8>)>],
    logs: &Path,
    what: &str,
) {
    let mut c = client::Client::connect(tcp, client);
    c.login();
    for (partition, expected) in acked.iter().enumerate() {
        let partition = partition as u32;
        let got = eventually(&format!("{what}: partition {partition}"), logs, || {
            c.poll(stream, partition)
                .filter(|got| got.len() >= expected.len())
        });
        assert_eq!(
            got.len(),
            expected.len(),
            "{what}: partition {partition} holds more than was acknowledged"
        );
        for (g, e) in got.iter().zip(expected) {
            assert_eq!(g.0, e.0, "{what}: offsets in order");
            assert!(
                g.1 == e.1,
                "{what}: payload at offset {} differs ({} vs {} bytes)",
                e.0,
                g.1.len(),
                e.1.len()
            );
        }
    }
}

/// The node that is primary of all `groups` partition groups, once every node of `live` runs
/// them all.
pub fn partition_primary(nodes: &[Node], live: &[usize], groups: u64, logs: &Path) -> usize {
    eventually(
        "every node runs every group, one is their primary",
        logs,
        || {
            let all: Option<Vec<_>> = live.iter().map(|&i| scrape(nodes[i].http)).collect();
            let all = all?;
            if all
                .iter()
                .any(|m| partition_sum(m, "strand_partition_groups") != groups)
            {
                return None;
            }
            let primaries: Vec<u64> = all
                .iter()
                .map(|m| partition_sum(m, "strand_partition_primaries"))
                .collect();
            let at = primaries.iter().position(|&p| p == groups)?;
            (primaries.iter().sum::<u64>() == groups).then_some(live[at])
        },
    )
}

/// The lines of `logs` that contain `needle`.
pub fn log_lines(logs: &Path, needle: &str) -> Vec<String> {
    std::fs::read_to_string(logs)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}
