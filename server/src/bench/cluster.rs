//! `--spawn N`: N child `strand start` processes on loopback from a generated config (the
//! `strand dev` settings, ports the kernel hands out, `partition.ack` as asked), each with its
//! own data directory and log file; waits until the metadata group has exactly one primary
//! (from `/metrics`), and stops them all when dropped (decision 186).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::config;

/// Bound on the wait for a primary.
pub const PRIMARY_BOUND: Duration = Duration::from_secs(60);

/// One node's ports.
#[derive(Debug, Clone, Copy)]
pub struct NodePorts {
    /// Client plane.
    pub tcp: u16,
    /// `/metrics`.
    pub http: u16,
    /// Replica plane.
    pub tcp_replica: u16,
}

/// A running local cluster; dropping it stops the nodes and removes a temporary directory.
pub struct Cluster {
    children: Vec<Child>,
    /// The nodes' ports, by replica id.
    pub nodes: Vec<NodePorts>,
    /// The cluster's directory (config, node-i/, node-i.log).
    pub dir: PathBuf,
    remove: bool,
}

/// Ports the kernel hands out now (bound and released; a node that loses one to another
/// process fails its bind loudly).
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// What the flags set in the spawned nodes' config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spawned<'a> {
    /// `partition.ack`.
    pub ack: &'a str,
    /// `partition.wal_size` in bytes (`None`: the node's default).
    pub wal_size: Option<u64>,
    /// `partition.read_cache_bytes` (`None`: the node's default).
    pub read_cache: Option<u64>,
    /// `system.memory_prefault_bytes` (`None`: the node's default).
    pub memory_prefault: Option<u64>,
    /// `network.tcp_congestion_control` (`None`: the kernel's default).
    pub congestion: Option<&'a shard::net::CongestionControl>,
}

/// The config text of an `n`-node cluster on `nodes`, with the keys `spawned` sets.
pub fn config_text(nodes: &[NodePorts], spawned: &Spawned<'_>) -> String {
    let mut text = config::DEV_CONFIG.to_string();
    text.push_str(&format!("\n[partition]\nack = \"{}\"\n", spawned.ack));
    if let Some(bytes) = spawned.wal_size {
        text.push_str(&format!("wal_size = \"{bytes}\"\n"));
    }
    if let Some(bytes) = spawned.read_cache {
        text.push_str(&format!("read_cache_bytes = \"{bytes}\"\n"));
    }
    if let Some(bytes) = spawned.memory_prefault {
        text.push_str(&format!(
            "\n[system]\nmemory_prefault_bytes = \"{bytes}\"\n"
        ));
    }
    text.push_str(&config::network_section(spawned.congestion));
    for (i, p) in nodes.iter().enumerate() {
        text.push_str(&format!(
            "\n[[cluster.nodes]]\nname = \"bench-{i}\"\nip = \"127.0.0.1\"\nreplica_id = {i}\n\
             ports = {{ tcp = {}, http = {}, tcp_replica = {} }}\n",
            p.tcp, p.http, p.tcp_replica
        ));
    }
    text
}

impl Cluster {
    /// Starts `replicas` nodes of `exe` under `dir` (removed when dropped if `remove`).
    pub fn start(
        exe: &Path,
        replicas: u8,
        spawned: &Spawned<'_>,
        dir: PathBuf,
        remove: bool,
    ) -> anyhow::Result<Cluster> {
        let ports = free_ports(3 * usize::from(replicas))?;
        let nodes: Vec<NodePorts> = ports
            .chunks(3)
            .map(|p| NodePorts {
                tcp: p[0],
                http: p[1],
                tcp_replica: p[2],
            })
            .collect();
        let text = config_text(&nodes, spawned);
        for i in 0..replicas {
            let overrides = config::Overrides {
                replica_id: u64::from(i),
                shards: Some(1),
                available_cpus: shard::cores::thread_allowed_cpus()?,
                ..config::Overrides::default()
            };
            config::load(&text, &overrides).context("the generated bench config")?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut cluster = Cluster {
            children: Vec::new(),
            nodes,
            dir,
            remove,
        };
        let config_path = cluster.dir.join("strand-bench.toml");
        std::fs::write(&config_path, &text)
            .with_context(|| format!("writing {}", config_path.display()))?;
        for i in 0..replicas {
            let data = cluster.dir.join(format!("node-{i}"));
            std::fs::create_dir_all(&data)?;
            let log_path = cluster.dir.join(format!("node-{i}.log"));
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let child = Command::new(exe)
                .arg("start")
                .arg("--config")
                .arg(&config_path)
                .args([
                    "--replica-id",
                    &i.to_string(),
                    "--shards",
                    "1",
                    "--data-dir",
                ])
                .arg(&data)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting node {i} ({})", exe.display()))?;
            cluster.children.push(child);
        }
        Ok(cluster)
    }

    /// Waits until exactly one node reports itself the metadata group's normal primary;
    /// returns its replica id. Fails if a node exits or the bound passes.
    pub fn wait_primary(&mut self, bound: Duration) -> anyhow::Result<usize> {
        let started = Instant::now();
        loop {
            for (i, child) in self.children.iter_mut().enumerate() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "node {i} exited ({status}) before the cluster formed; see {}",
                        self.dir.join(format!("node-{i}.log")).display()
                    );
                }
            }
            let primaries: Vec<usize> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| metric(n.http, "strand_is_primary{plane=\"metadata\"}") == Some(1))
                .map(|(i, _)| i)
                .collect();
            if let [one] = primaries[..] {
                return Ok(one);
            }
            if started.elapsed() > bound {
                bail!(
                    "no single primary within {bound:?} (primaries: {primaries:?}); logs in {}",
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the cluster reports itself ready for a measured load, from every node's
    /// `/metrics` (decision 360): every node's metadata group normal (`strand_status` 0), every
    /// node holding all its replica connections (`strand_replica_connections_open` summed over
    /// shards at least `(nodes - 1) x lanes`), hosting at least `partitions` partition groups
    /// with none lost, its memory prefault done (`strand_memory_prefault_pending_bytes` 0,
    /// decision 513), and the partition groups' normal primaries over all nodes at least
    /// `partitions`. Returns what it waited for, for the report.
    pub fn wait_ready(&mut self, partitions: u32, bound: Duration) -> anyhow::Result<String> {
        let started = Instant::now();
        let n = self.nodes.len() as u64;
        let links = (n - 1) * BENCH_LANES;
        let partitions = u64::from(partitions);
        let what = format!(
            "every node: metadata normal, {links} replica connection(s) open, {partitions} \
             partition group(s) hosted and none lost, memory prefaulted; {partitions} \
             partition primaries in all"
        );
        loop {
            for (i, child) in self.children.iter_mut().enumerate() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "node {i} exited ({status}) while the harness waited for the cluster; \
                         see {}",
                        self.dir.join(format!("node-{i}.log")).display()
                    );
                }
            }
            let texts: Vec<Option<String>> =
                self.nodes.iter().map(|n| metrics_text(n.http)).collect();
            let missing = not_ready(&texts, links, partitions);
            if missing.is_empty() {
                return Ok(what);
            }
            if started.elapsed() > bound {
                bail!(
                    "the cluster was not ready within {bound:?} ({}); logs in {}",
                    missing.join("; "),
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The sum over all nodes of the metric family `name` (the samples whose labels contain
    /// `label`), or `None` if a node does not answer.
    pub fn sum_over_nodes(&self, name: &str, label: &str) -> Option<u64> {
        self.nodes
            .iter()
            .map(|n| metrics_text(n.http).and_then(|t| labelled_sum(&t, name, label)))
            .sum()
    }

    /// Node `i`'s client address.
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.nodes[i].tcp))
    }

    /// CPU seconds (user + system) the running nodes have used so far, summed over all of them
    /// (from `/proc/PID/stat`); `None` where `/proc` cannot be read.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.sum_over_processes(process_cpu_seconds)
    }

    /// Bytes the running nodes have caused to be written to storage so far, summed over all of
    /// them (`write_bytes` of `/proc/PID/io`: `O_DIRECT` writes through io_uring count there);
    /// `None` where `/proc` cannot be read.
    pub fn write_bytes(&self) -> Option<u64> {
        self.sum_over_processes(process_write_bytes)
    }

    /// Minor page faults the running nodes have taken so far, summed over all of them
    /// (`/proc/PID/stat` field 10): each one a page the node touched for the first time, or
    /// again after its allocator gave it back (decision 511). `None` where `/proc` cannot be
    /// read.
    pub fn minor_faults(&self) -> Option<u64> {
        self.sum_over_processes(process_minor_faults)
    }

    /// `figure` of every running node's process, summed; `None` if any is `None`.
    fn sum_over_processes<T: std::iter::Sum<T>>(&self, figure: fn(u32) -> Option<T>) -> Option<T> {
        self.children.iter().map(|child| figure(child.id())).sum()
    }

    /// The largest peak resident set (`VmHWM` of `/proc/PID/status`) among the running
    /// nodes, in bytes; `None` where `/proc` cannot be read.
    pub fn resident_peak_bytes_max(&self) -> Option<u64> {
        self.children
            .iter()
            .map(|child| process_resident_peak_bytes(child.id()))
            .try_fold(0, |max, peak| Some(max.max(peak?)))
    }

    /// SIGTERM to every node, then waits (SIGKILL after 10 s); true if all exited 0.
    pub fn stop(&mut self) -> bool {
        for child in &mut self.children {
            if matches!(child.try_wait(), Ok(None))
                && let Ok(pid) = i32::try_from(child.id())
            {
                // SAFETY: kill(2) on our own child's pid, not reaped yet (try_wait said it is
                // running), so the pid still names it.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let mut clean = true;
        for child in &mut self.children {
            let deadline = Instant::now() + Duration::from_secs(10);
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        let _ = child.kill();
                        break child.wait().ok();
                    }
                }
            };
            clean &= status.is_some_and(|s| s.success());
        }
        self.children.clear();
        clean
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// User plus system CPU seconds of process `pid` so far (`/proc/PID/stat` fields 14 and 15).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_seconds_of_stat(&stat, clock_ticks_per_second()?)
}

/// Minor page faults of process `pid` so far (`/proc/PID/stat` field 10).
pub fn process_minor_faults(pid: u32) -> Option<u64> {
    crate::memory::minor_faults_of_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The peak resident set of process `pid` in bytes (`VmHWM` of `/proc/PID/status`).
pub fn process_resident_peak_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    crate::memory::kb_field(&status, "VmHWM:")
}

/// Bytes process `pid` has caused to be written to storage (`/proc/PID/io`).
pub fn process_write_bytes(pid: u32) -> Option<u64> {
    write_bytes_of_io(&std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
}

/// The `write_bytes:` line of a `/proc/PID/io` text.
pub fn write_bytes_of_io(io: &str) -> Option<u64> {
    io.lines()
        .find_map(|line| line.strip_prefix("write_bytes:")?.trim().parse().ok())
}

/// Parses utime + stime (fields 14 and 15, in clock ticks) out of a `/proc/PID/stat` line.
pub fn cpu_seconds_of_stat(stat: &str, ticks_per_second: f64) -> Option<f64> {
    let utime: u64 = crate::memory::stat_field(stat, 14)?.parse().ok()?;
    let stime: u64 = crate::memory::stat_field(stat, 15)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second)
}

fn clock_ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf(3) reads a constant of the system; no memory is passed.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// One gauge of a node's `/metrics`, or `None` if it does not answer or lacks it.
pub fn metric(http: u16, name: &str) -> Option<u64> {
    metrics_text(http)?
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}

/// A node's whole `/metrics` text, or `None` if it does not answer.
pub fn metrics_text(http: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", http)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The sum of every sample of the family `name` in a Prometheus text (the bare name or the
/// name with labels; a `name_suffix` family is not counted), or `None` if it has none.
pub fn family_sum(text: &str, name: &str) -> Option<u64> {
    labelled_sum(text, name, "")
}

/// As [`family_sum`], over the samples whose labels contain `label` (e.g.
/// `reason="not_connected"`; empty for all).
pub fn labelled_sum(text: &str, name: &str, label: &str) -> Option<u64> {
    let mut sum = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = match rest.as_bytes().first() {
            Some(b' ') if label.is_empty() => rest.trim(),
            Some(b'{') => match rest.rfind('}') {
                Some(end) if rest[..end].contains(label) => rest[end + 1..].trim(),
                _ => continue,
            },
            _ => continue,
        };
        if let Ok(v) = value.parse::<u64>() {
            sum = Some(sum.unwrap_or(0) + v);
        }
    }
    sum
}

/// What keeps a cluster from being ready for a measured load (decision 360), from each node's
/// `/metrics` text (`None`: it did not answer); empty when ready. `links` is the replica
/// connections each node must hold, `partitions` the groups each must host and the primaries
/// the nodes must have in all.
pub fn not_ready(texts: &[Option<String>], links: u64, partitions: u64) -> Vec<String> {
    let mut missing = Vec::new();
    let mut primaries = 0;
    for (i, text) in texts.iter().enumerate() {
        let Some(text) = text else {
            missing.push(format!("node {i}: /metrics unanswered"));
            continue;
        };
        let status = family_sum(text, "strand_status");
        let open = family_sum(text, "strand_replica_connections_open");
        let groups = family_sum(text, "strand_partition_groups");
        let lost = family_sum(text, "strand_partition_lost_groups");
        let prefault = family_sum(text, "strand_memory_prefault_pending_bytes");
        primaries += family_sum(text, "strand_partition_primaries").unwrap_or(0);
        if status != Some(0) {
            missing.push(format!("node {i}: metadata status {status:?}"));
        }
        if open.unwrap_or(0) < links {
            missing.push(format!("node {i}: {open:?} of {links} connections"));
        }
        if groups.unwrap_or(0) < partitions || lost != Some(0) {
            missing.push(format!("node {i}: groups {groups:?}, lost {lost:?}"));
        }
        if prefault != Some(0) {
            missing.push(format!(
                "node {i}: memory prefault pending {prefault:?} bytes"
            ));
        }
    }
    if primaries < partitions {
        missing.push(format!("{primaries} of {partitions} partition primaries"));
    }
    missing
}

/// `cluster.replica_lanes` of the generated config (`strand dev`'s: one shard per node).
pub const BENCH_LANES: u64 = 1;
