//! `strand start` and `strand dev` as real processes: boot the shards, stop on a signal, exit 0;
//! a broken config exits 2 naming the key.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A bound on waiting for a log line, so a broken build fails instead of hanging CI.
const PATIENCE: Duration = Duration::from_secs(60);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strand-start-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const CONFIG: &str = r#"
[cluster]
enabled = true
name = "start-test"

[[cluster.nodes]]
name = "n0"
ip = "127.0.0.1"
replica_id = 0
ports = { tcp = 18090, http = 13000, tcp_replica = 19090 }

[system]
memory_prefault_bytes = "4 MiB"

[system.sharding]
io_memory = "256 KiB"
"#;

fn strand() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strand"));
    command
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::piped());
    command
}

/// Collects stderr lines on a thread; `wait_for` returns every line up to the first that
/// contains `needle`.
struct Log(mpsc::Receiver<String>, Vec<String>);

impl Log {
    fn of(child: &mut Child) -> Log {
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Log(rx, Vec::new())
    }

    /// Waits for the next line (not one seen already) that contains `needle`.
    fn wait_for(&mut self, needle: &str) -> &[String] {
        let seen = self.1.iter().filter(|l| l.contains(needle)).count();
        self.wait_for_lines(needle, seen + 1)
    }

    /// Waits until `count` lines, seen already or to come, contain `needle`.
    fn wait_for_lines(&mut self, needle: &str, count: usize) -> &[String] {
        while self.1.iter().filter(|l| l.contains(needle)).count() < count {
            match self.0.recv_timeout(PATIENCE) {
                Ok(line) => self.1.push(line),
                Err(e) => panic!(
                    "not {count} lines with `{needle}` ({e}); log so far:\n{}",
                    self.1.join("\n")
                ),
            }
        }
        &self.1
    }

    fn rest(mut self) -> Vec<String> {
        self.1.extend(self.0.iter());
        self.1
    }
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own unreaped child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

#[test]
fn start_pins_its_shards_and_stops_on_sigterm() {
    let dir = scratch("pinned");
    std::fs::write(dir.join("strand.toml"), CONFIG).unwrap();
    let cores = shard::cores::thread_allowed_cpus().unwrap();
    let list = cores
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut child = strand()
        .args(["start", "--config"])
        .arg(dir.join("strand.toml"))
        .args(["--replica-id", "0", "--cores", &list, "--data-dir"])
        .arg(dir.join("data"))
        .spawn()
        .unwrap();
    let mut log = Log::of(&mut child);
    log.wait_for("strand node ready");
    // Decision 512: the allocator keeps freed memory and the configured 4 MiB is faulted in,
    // on a thread of its own while the node boots (decision 513).
    let lines = log
        .wait_for_lines("memory prefaulted for the caches", 1)
        .to_vec();
    assert!(
        lines.iter().any(|l| l.contains("allocator: one arena")),
        "no allocator line:\n{}",
        lines.join("\n")
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("memory prefaulted for the caches") && l.contains("bytes=4194304")),
        "no prefault line:\n{}",
        lines.join("\n")
    );
    for (shard, core) in cores.iter().enumerate() {
        assert!(
            lines.iter().any(|l| l.contains("shard executor up")
                && l.contains(&format!("shard={shard}"))
                && l.contains(&format!("core={core} "))
                && l.contains("io_memory=262144 ring_depth=128")),
            "no startup line for shard {shard} on core {core}:\n{}",
            lines.join("\n")
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("formatted a fresh data directory"))
    );
    signal(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    let rest = log.rest();
    assert!(status.success(), "{status}\n{}", rest.join("\n"));
    assert_eq!(
        rest.iter().filter(|l| l.contains("shard stopped")).count(),
        cores.len(),
        "{}",
        rest.join("\n")
    );
    assert!(
        dir.join("data").join("strand.cluster").is_file(),
        "the data directory is stamped"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn start_refuses_a_broken_config_naming_the_key() {
    let dir = scratch("broken");
    let broken = CONFIG.replace(
        "name = \"start-test\"",
        "name = \"start-test\"\nreplica_lanes = 1",
    );
    std::fs::write(dir.join("strand.toml"), broken).unwrap();
    let output = strand()
        .args(["start", "--config"])
        .arg(dir.join("strand.toml"))
        .args(["--replica-id", "0", "--shards", "2"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("config key `cluster.replica_lanes`: 1 is below the node's 2 shards"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_secret_from_the_environment_is_checked_and_named() {
    let dir = scratch("secret");
    let auth = format!(
        "{CONFIG}\n[cluster.auth]\nenabled = true\nshared_secret = \"{}\"\n",
        "s".repeat(32)
    );
    std::fs::write(dir.join("strand.toml"), auth).unwrap();
    let output = strand()
        .env("IGGY_CLUSTER_AUTH_SHARED_SECRET", "too short")
        .args(["start", "--config"])
        .arg(dir.join("strand.toml"))
        .args(["--replica-id", "0", "--shards", "1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "environment variable `IGGY_CLUSTER_AUTH_SHARED_SECRET`: is 9 bytes; at least 32 are required"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dev_runs_nodes_and_stops_them_on_ctrl_c() {
    let dir = scratch("dev");
    let mut child = strand()
        .args(["dev", "--replicas", "2", "--data-dir"])
        .arg(&dir)
        .spawn()
        .unwrap();
    let mut log = Log::of(&mut child);
    log.wait_for("strand node ready");
    let lines = log.wait_for("strand node ready").to_vec();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("replica=0") && l.contains("config valid"))
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("replica=1") && l.contains("config valid"))
    );
    // Decision 512: the nodes share the machine's free memory, so each prefaults what `strand
    // dev` gave it, on a thread of its own: started before "ready", done whenever it is done
    // (decision 513).
    let started = lines
        .iter()
        .filter(|l| l.contains("memory prefault started in the background"))
        .count();
    assert_eq!(started, 2, "{}", lines.join("\n"));
    let lines = log
        .wait_for_lines("memory prefaulted for the caches", 2)
        .to_vec();
    let config = std::fs::read_to_string(dir.join("strand-dev.toml")).unwrap();
    let given = config
        .lines()
        .find_map(|l| l.strip_prefix("memory_prefault_bytes = "))
        .expect("strand dev sets each node's prefault")
        .trim_matches('"')
        .to_string();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("memory prefaulted") && l.contains(&format!("bytes={given}"))),
        "no node prefaulted the {given} bytes strand dev gave it:\n{}",
        lines.join("\n")
    );
    // The two nodes form a cluster: both normal in one view, node 0 its primary.
    let start = std::time::Instant::now();
    loop {
        let m: Vec<_> = [3000, 3100].into_iter().map(metadata_gauges).collect();
        let formed = m
            .iter()
            .all(|g| g.get("status") == Some(&0) && g.get("view") == Some(&0))
            && m[0].get("is_primary") == Some(&1)
            && m[1].get("is_primary") == Some(&0);
        if formed {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "no cluster: {m:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(&child, libc::SIGINT);
    let status = child.wait().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "{status}\n{}", log.rest().join("\n"));
    assert!(
        stdout.contains(
            "node 0: clients tcp 127.0.0.1:8090, http 127.0.0.1:3000, replicas 127.0.0.1:9090"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "node 1: clients tcp 127.0.0.1:8190, http 127.0.0.1:3100, replicas 127.0.0.1:9190"
        ),
        "{stdout}"
    );
    let config = std::fs::read_to_string(dir.join("strand-dev.toml")).unwrap();
    assert!(config.contains("name = \"strand-dev-1\""));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a one-node cluster on `data` until it is ready, then stops it with SIGTERM.
fn run_once(config: &std::path::Path, data: &std::path::Path) {
    let mut child = strand()
        .args(["start", "--config"])
        .arg(config)
        .args(["--replica-id", "0", "--shards", "1", "--data-dir"])
        .arg(data)
        .spawn()
        .unwrap();
    let mut log = Log::of(&mut child);
    log.wait_for("metadata replica running on shard 0");
    signal(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}\n{}", log.rest().join("\n"));
}

fn refused(config: &std::path::Path, data: &std::path::Path) -> String {
    let output = strand()
        .args(["start", "--config"])
        .arg(config)
        .args(["--replica-id", "0", "--shards", "1", "--data-dir"])
        .arg(data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    stderr
}

#[test]
fn a_data_directory_of_another_cluster_or_with_a_broken_superblock_refuses_to_start() {
    let dir = scratch("refusals");
    let config = dir.join("strand.toml");
    std::fs::write(&config, with_ports(1)).unwrap();
    let data = dir.join("data");
    run_once(&config, &data);
    let stamp = std::fs::read(data.join("strand.cluster")).unwrap();

    // Another cluster name: refused, naming the stamp and the rule; nothing rewritten.
    let other = dir.join("other.toml");
    std::fs::write(
        &other,
        with_ports(1).replace("start-test", "another-cluster"),
    )
    .unwrap();
    let stderr = refused(&other, &data);
    assert!(stderr.contains("strand.cluster"), "{stderr}");
    assert!(
        stderr.contains("one cluster name, one roster size"),
        "{stderr}"
    );
    assert!(stderr.contains("\"another-cluster\""), "{stderr}");
    assert_eq!(std::fs::read(data.join("strand.cluster")).unwrap(), stamp);

    // The same config boots again (the refusal changed nothing).
    run_once(&config, &data);

    // Every superblock copy damaged: refused, naming the metadata directory; never formatted.
    let superblock = data.join("shard-0").join("metadata").join("superblock");
    let mut bytes = std::fs::read(&superblock).unwrap();
    for b in bytes.iter_mut().step_by(7) {
        *b ^= 0x5a;
    }
    std::fs::write(&superblock, &bytes).unwrap();
    let stderr = refused(&config, &data);
    assert!(stderr.contains("shard-0/metadata"), "{stderr}");
    assert!(stderr.contains("superblock"), "{stderr}");
    assert!(stderr.contains("refusing to start"), "{stderr}");
    assert_eq!(
        std::fs::read(&superblock).unwrap(),
        bytes,
        "never reformatted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `chattr` on every file of `dir` (`+i` makes writes through already open descriptors fail
/// with EPERM on ext4).
fn chattr(flag: &str, dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().all(|entry| {
        Command::new("chattr")
            .arg(flag)
            .arg(entry.path())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A storage failure the node cannot survive stops it with exit status 3 and a log line naming
/// the cause. The metadata files are made immutable under a running single-node cluster that
/// commits (test hook) and checkpoints every 8 ops: its next checkpoint (or append) fails.
#[test]
fn a_fatal_storage_failure_exits_3_naming_the_cause() {
    let dir = scratch("fatal");
    let config = dir.join("strand.toml");
    let text = with_ports(2).replace(
        "[system.sharding]",
        "[metadata]\njournal_slots = 256\ncheckpoint_interval_ops = 8\n\n[system.sharding]",
    );
    std::fs::write(&config, text).unwrap();
    let data = dir.join("data");
    let mut child = strand()
        .env("STRAND_TEST_REGISTER_INTERVAL_MS", "20")
        .args(["start", "--config"])
        .arg(&config)
        .args(["--replica-id", "0", "--shards", "1", "--data-dir"])
        .arg(&data)
        .spawn()
        .unwrap();
    let mut log = Log::of(&mut child);
    log.wait_for("metadata replica running on shard 0");
    // Wait until ops commit (so the superblock and journal were written once).
    let start = std::time::Instant::now();
    while commit_min(13002) < 2 {
        assert!(start.elapsed() < PATIENCE, "no commits");
        std::thread::sleep(Duration::from_millis(50));
    }
    let metadata = data.join("shard-0").join("metadata");
    if !chattr("+i", &metadata) {
        chattr("-i", &metadata);
        signal(&child, libc::SIGKILL);
        let _ = child.wait();
        panic!(
            "chattr +i failed on {} (needs ext4 or similar and CAP_LINUX_IMMUTABLE); this test \
             cannot inject a storage failure without it",
            metadata.display()
        );
    }
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > PATIENCE {
            signal(&child, libc::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(chattr("-i", &metadata), "undo chattr +i");
    let rest = log.rest();
    let status = status.unwrap_or_else(|| panic!("no fatal stop:\n{}", rest.join("\n")));
    assert_eq!(status.code(), Some(3), "{}", rest.join("\n"));
    assert!(
        rest.iter()
            .any(|l| l.contains("stopped by a fatal failure") && l.contains("cause=")),
        "{}",
        rest.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The metadata group's integer gauges of the node whose /metrics is on `port` (empty when it
/// does not answer).
fn metadata_gauges(port: u16) -> std::collections::BTreeMap<String, u64> {
    use std::io::{Read, Write};
    let mut out = std::collections::BTreeMap::new();
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return out;
    };
    let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    for line in text.lines() {
        if let Some((name, value)) = line.split_once("{plane=\"metadata\"} ")
            && let Ok(v) = value.parse()
        {
            out.insert(name.trim_start_matches("strand_").to_owned(), v);
        }
    }
    out
}

/// `strand_commit_min` of the node whose /metrics is on `port` (0 when it does not answer).
fn commit_min(port: u16) -> u64 {
    metadata_gauges(port)
        .get("commit_min")
        .copied()
        .unwrap_or(0)
}

/// [`CONFIG`] on ports of its own (`+ offset`), so tests of this binary run in parallel.
fn with_ports(offset: u16) -> String {
    CONFIG.replace(
        "ports = { tcp = 18090, http = 13000, tcp_replica = 19090 }",
        &format!(
            "ports = {{ tcp = {}, http = {}, tcp_replica = {} }}",
            18090 + offset,
            13000 + offset,
            19090 + offset
        ),
    )
}

/// A shard that panics stops the whole node with exit status 3 and a log line naming the panic
/// (never a process that answers `/metrics` while the shard's groups and clients are gone). The
/// test hook makes shard 1 of two panic right after it reported ready.
#[test]
fn a_panicking_shard_stops_the_node_with_the_fatal_status() {
    let dir = scratch("panic");
    let config = dir.join("strand.toml");
    std::fs::write(&config, with_ports(7)).unwrap();
    let mut child = strand()
        .env("STRAND_TEST_PANIC_SHARD", "1")
        .args(["start", "--config"])
        .arg(&config)
        .args(["--replica-id", "0", "--shards", "2", "--data-dir"])
        .arg(dir.join("data"))
        .spawn()
        .unwrap();
    let log = Log::of(&mut child);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > PATIENCE {
            signal(&child, libc::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest = log.rest();
    let status = status.unwrap_or_else(|| panic!("the node ran on:\n{}", rest.join("\n")));
    assert_eq!(status.code(), Some(3), "{}", rest.join("\n"));
    assert!(
        rest.iter().any(|l| l.contains("stopped by a fatal failure")
            && l.contains("panicked")
            && l.contains("STRAND_TEST_PANIC_SHARD")),
        "{}",
        rest.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
