//! Three real `strand start` processes on loopback, one config: they form a cluster and agree
//! on a primary for the metadata group; SIGKILL of the primary gives a new view on the
//! survivors; the killed node restarts from its data directory, rejoins and catches up; then
//! all three are killed at once and restart without losing a committed op.
//!
//! Everything is read from each node's `/metrics`. There is no client plane yet, so ops are
//! committed through the test-only hook `STRAND_TEST_REGISTER_INTERVAL_MS` (the primary submits
//! a Register request of its own every 100 ms; one in flight at a time, so
//! commits follow the disk's fdatasync latency). Waits are bounded (generous: a loaded CI machine
//! must not flake); the view change's duration is printed, not asserted beyond the bound.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on every wait.
const BOUND: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("strand-cluster-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Ports the kernel hands out now (bound and released; another process could take one, which
/// would fail the node's bind loudly, not silently).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

struct Node {
    id: u8,
    http: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn config(ports: &[u16]) -> String {
    let mut text = String::from(
        r#"
[cluster]
enabled = true
name = "cluster-e2e"
heartbeat_timeout = "2s"
commit_broadcast_interval = "200ms"
view_change_retransmit_interval = "200ms"
view_change_status_timeout = "2s"
request_start_view_retransmit_interval = "500ms"
repair_retry_interval = "200ms"

[message_bus]
reconnect_period = "200ms"

[metadata]
journal_slots = 256
checkpoint_interval_ops = 8

[system.sharding]
io_memory = "256 KiB"
"#,
    );
    for i in 0..3 {
        let p = &ports[i * 3..i * 3 + 3];
        text.push_str(&format!(
            "\n[[cluster.nodes]]\nname = \"n{i}\"\nip = \"127.0.0.1\"\nreplica_id = {i}\n\
             ports = {{ tcp = {}, http = {}, tcp_replica = {} }}\n",
            p[0], p[1], p[2]
        ));
    }
    text
}

fn spawn(config: &Path, node: &mut Node, log: &Path) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_strand"))
        .env("RUST_LOG", "info")
        .env("STRAND_TEST_REGISTER_INTERVAL_MS", "100")
        .args(["start", "--config"])
        .arg(config)
        .args([
            "--replica-id",
            &node.id.to_string(),
            "--shards",
            "1",
            "--data-dir",
        ])
        .arg(&node.dir)
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    node.child = Some(child);
}

/// The metadata group's gauges of one node, or `None` if it does not answer.
fn metrics(http: u16) -> Option<BTreeMap<String, u64>> {
    let mut stream = TcpStream::connect(("127.0.0.1", http)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some((name, value)) = line.split_once("{plane=\"metadata\"} ")
            && let Ok(v) = value.parse()
        {
            out.insert(name.trim_start_matches("strand_").to_owned(), v);
        }
    }
    out.contains_key("view").then_some(out)
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own unreaped child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// Polls until `done` holds for the metrics of `nodes`, within [`BOUND`].
fn wait_until(
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

fn all_nodes(nodes: &[Node]) -> Vec<&Node> {
    nodes.iter().collect()
}

fn one_primary(all: &[BTreeMap<String, u64>]) -> bool {
    let views: std::collections::BTreeSet<u64> = all.iter().map(|m| m["view"]).collect();
    all.iter().all(|m| m["status"] == 0)
        && views.len() == 1
        && all.iter().filter(|m| m["is_primary"] == 1).count() == 1
}

#[test]
fn three_nodes_elect_fail_over_and_rejoin() {
    let dir = scratch("three");
    let ports = free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, config(&ports)).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes: Vec<Node> = (0..3u8)
        .map(|i| Node {
            id: i,
            http: ports[usize::from(i) * 3 + 1],
            dir: dir.join(format!("node-{i}")),
            child: None,
        })
        .collect();
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // 1. A cluster with one primary, committing.
        let all = wait_until(
            "one primary",
            &nodes.iter().collect::<Vec<_>>(),
            &logs,
            // Every node has checkpointed once (8 ops), so the restart below boots from a
            // snapshot with journaled prepares above it.
            |all| {
                one_primary(all)
                    && all
                        .iter()
                        .all(|m| m["commit_min"] >= 12 && m["checkpoints_total"] >= 1)
            },
        );
        let primary = all.iter().position(|m| m["is_primary"] == 1).unwrap();
        let view = all[primary]["view"];
        eprintln!("cluster formed: primary n{primary} in view {view}, metrics {all:?}");

        // 2. SIGKILL the primary: the survivors move to a newer view with a primary.
        let killed = Instant::now();
        let mut child = nodes[primary].child.take().unwrap();
        signal(&child, libc::SIGKILL);
        child.wait().unwrap();
        let survivors: Vec<&Node> = nodes
            .iter()
            .filter(|n| usize::from(n.id) != primary)
            .collect();
        let after = wait_until("a new view on the survivors", &survivors, &logs, |all| {
            one_primary(all) && all[0]["view"] > view
        });
        let took = killed.elapsed();
        eprintln!(
            "view change after SIGKILL of n{primary}: {took:?} (view {view} -> {})",
            after[0]["view"]
        );
        // The new primary commits (its own Registers).
        let commit_then = after.iter().map(|m| m["commit_max"]).max().unwrap();
        let after = wait_until("commits in the new view", &survivors, &logs, |all| {
            all.iter().all(|m| m["commit_max"] > commit_then)
        });
        let commit_before_restart = after.iter().map(|m| m["commit_max"]).min().unwrap();

        // 3. The killed node restarts from its directory, rejoins and catches up.
        spawn(&config_path, &mut nodes[primary], &logs);
        let all = wait_until(
            "the restarted node rejoins",
            &nodes.iter().collect::<Vec<_>>(),
            &logs,
            |all| {
                let me = &all[primary];
                one_primary(all)
                    && me["is_primary"] == 0
                    && me["commit_min"] >= commit_before_restart
                    && me["commit_max"] >= commit_before_restart
            },
        );
        eprintln!("rejoined: {all:?}");
        // The restart found its durable state: a superblock and journaled prepares (the
        // first boot of every node finds neither).
        let log = std::fs::read_to_string(&logs).unwrap();
        let restarted = log
            .lines()
            .find(|l| l.contains("metadata group recovered from") && l.contains("superblock=Some"))
            .unwrap_or_else(|| panic!("no recovery of a superblock:\n{log}"));
        let journaled: u64 = restarted
            .split("journaled=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(
            journaled >= 3,
            "it recovered {journaled} prepares: {restarted}"
        );
        let snapshot_op: u64 = restarted
            .split("snapshot_op=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(snapshot_op >= 8, "it restored no checkpoint: {restarted}");

        // 4. SIGKILL of all three at once, then all restart from their directories: nothing
        // committed is lost (the commit point reaches at least what any node reported) and no
        // view goes back.
        let before = wait_until(
            "metrics before the full kill",
            &all_nodes(&nodes),
            &logs,
            |_| true,
        );
        let committed = before.iter().map(|m| m["commit_max"]).max().unwrap();
        let view = before.iter().map(|m| m["view"]).max().unwrap();
        for node in nodes.iter_mut() {
            let mut child = node.child.take().unwrap();
            signal(&child, libc::SIGKILL);
            child.wait().unwrap();
        }
        for node in nodes.iter_mut() {
            spawn(&config_path, node, &logs);
        }
        let after = wait_until("the restarted cluster", &all_nodes(&nodes), &logs, |all| {
            one_primary(all) && all.iter().all(|m| m["commit_min"] > committed)
        });
        assert!(after.iter().all(|m| m["view"] >= view), "{after:?}");
        eprintln!("after a full restart (committed {committed} before): {after:?}");
    }));
    // 5. Every live node stops cleanly on SIGTERM.
    let mut statuses = Vec::new();
    for node in nodes.iter_mut() {
        if let Some(child) = node.child.as_ref() {
            signal(child, libc::SIGTERM);
        }
    }
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
            std::fs::read_to_string(&logs).unwrap_or_default()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
