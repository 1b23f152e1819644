//! `/metrics` on the node's `http` port, Prometheus text format 0.0.4. Every name is prefixed
//! `strand_`. The metadata pump publishes its group's state into [`Gauges`] (atomics) after
//! every turn; the replica plane's [`shard::net::Counters`] of every shard are read as they are.
//!
//! The endpoint is a small std thread: it is off the shards' executors, answers one request per
//! connection and serves nothing but `GET /metrics`.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use consensus::{Replica, StateMachine};
use shard::net::Counters;

use crate::metadata_group::status_code;

/// The metadata group's published state.
#[derive(Debug, Default)]
pub struct Gauges {
    view: AtomicU64,
    log_view: AtomicU64,
    status: AtomicU64,
    is_primary: AtomicU64,
    commit_max: AtomicU64,
    commit_min: AtomicU64,
    op: AtomicU64,
    /// 1 while the replica is in lost state (decisions 28, 191): it never votes or acks.
    lost_state: AtomicU64,
    /// Transitions into view-change status seen by the pump.
    view_changes: AtomicU64,
    /// Checkpoints made durable.
    pub checkpoints: AtomicU64,
    /// State transfers this replica installed since the process started.
    transfers: AtomicU64,
    /// `op + 1` while the replica is normal and not in lost state, else 0: one atomic, so a
    /// reader never pairs a normal status with an op from a lost moment (decision 290).
    unlost_head: AtomicU64,
    appends: AtomicU64,
    append_micros: AtomicU64,
    /// Frames dropped because the pump's inbox was full.
    pub inbox_dropped_full: AtomicU64,
    /// Frames of another group that reached shard 0's metadata sink.
    pub inbox_dropped_foreign: AtomicU64,
    /// Peers whose lane-0 connection is down, one bit per replica id (the pump's view; all
    /// peers start connected, as in the core).
    peers_down: AtomicU64,
    /// Session forwarding by kind and outcome (decision 330).
    pub forwards: crate::forward_metrics::ForwardCounters,
}

impl Gauges {
    /// Publishes the replica's state.
    pub fn observe<M: StateMachine>(&self, replica: &Replica<M>) {
        let status = u64::from(status_code(replica.status(), replica.is_transferring()));
        let before = self.status.swap(status, Ordering::Relaxed);
        if status == 1 && before != 1 {
            self.view_changes.fetch_add(1, Ordering::Relaxed);
        }
        self.view
            .store(u64::from(replica.view()), Ordering::Relaxed);
        self.log_view
            .store(u64::from(replica.log_view()), Ordering::Relaxed);
        self.is_primary.store(
            u64::from(replica.is_primary() && status == 0),
            Ordering::Relaxed,
        );
        self.commit_max
            .store(replica.commit_max(), Ordering::Relaxed);
        self.commit_min
            .store(replica.commit_min(), Ordering::Release);
        self.op.store(replica.op(), Ordering::Relaxed);
        self.lost_state
            .store(u64::from(replica.is_lost_state()), Ordering::Relaxed);
        self.transfers
            .store(replica.transfers_installed(), Ordering::Relaxed);
        let unlost = status == 0 && !replica.is_lost_state();
        self.unlost_head
            .store(if unlost { replica.op() + 1 } else { 0 }, Ordering::Relaxed);
    }

    /// The highest op the replica applied, as last published.
    pub fn commit_min(&self) -> u64 {
        self.commit_min.load(Ordering::Acquire)
    }

    /// The replica's op head as last published while it was normal and not in lost state;
    /// `None` while it is not (decision 290).
    pub fn unlost_head(&self) -> Option<u64> {
        self.unlost_head.load(Ordering::Relaxed).checked_sub(1)
    }

    /// The view this node's metadata replica leads as the primary of a normal view, `None`
    /// otherwise (primary affinity reads it from every shard, decision 221).
    pub fn metadata_lead(&self) -> Option<u64> {
        (self.is_primary.load(Ordering::Relaxed) == 1).then(|| self.view.load(Ordering::Relaxed))
    }

    /// The metadata primary of the view this node is in, while that view is normal (what
    /// GetClusterMetadata names as leader); `None` during a view change or recovery.
    pub fn metadata_primary(&self, replica_count: u8) -> Option<u8> {
        if self.status.load(Ordering::Relaxed) != 0 || replica_count == 0 {
            return None;
        }
        Some((self.view.load(Ordering::Relaxed) % u64::from(replica_count)) as u8)
    }

    /// Records a peer's lane-0 connection going up or down.
    pub fn set_peer(&self, peer: u8, connected: bool) {
        let bit = 1u64 << (peer % 64);
        if connected {
            self.peers_down.fetch_and(!bit, Ordering::Relaxed);
        } else {
            self.peers_down.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Whether the pump last saw `peer`'s connection down.
    pub fn peer_down(&self, peer: u8) -> bool {
        self.peers_down.load(Ordering::Relaxed) & (1u64 << (peer % 64)) != 0
    }

    /// One durable metadata append and how long it took (write + fdatasync of slot and ring).
    pub fn record_append(&self, took: Duration) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.append_micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// What the endpoint renders.
pub struct Sources {
    /// The metadata group.
    pub gauges: Arc<Gauges>,
    /// Each shard's replica-plane counters, by shard id.
    pub planes: Vec<Arc<Counters>>,
    /// The client plane's counters (every shard adds to them).
    pub clients: Option<Arc<crate::client_core::Counters>>,
    /// The partition groups' gauges of every shard, by shard id.
    pub partitions: Vec<Arc<crate::partition_group::PartitionGauges>>,
    /// The boot's memory prefault, running on a thread of its own (decision 513).
    pub prefault: Arc<crate::memory::Prefault>,
}

/// The Prometheus text of every metric.
pub fn render(sources: &Sources) -> String {
    let g = &sources.gauges;
    let mut out = String::new();
    let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let gauges: [(&str, &str, &AtomicU64); 8] = [
        ("view", "the group's current view", &g.view),
        (
            "log_view",
            "the view in which the log was last rebased",
            &g.log_view,
        ),
        (
            "status",
            "0 normal, 1 view change, 2 recovering, 3 transferring",
            &g.status,
        ),
        (
            "is_primary",
            "1 when this node is the group's normal primary",
            &g.is_primary,
        ),
        ("commit_max", "highest op known committed", &g.commit_max),
        ("commit_min", "highest op applied here", &g.commit_min),
        ("op", "highest op in the log", &g.op),
        (
            "lost_state",
            "1 while this replica lost its state and may not vote (it rejoins)",
            &g.lost_state,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP strand_{name} {help}.");
        let _ = writeln!(out, "# TYPE strand_{name} gauge");
        let _ = writeln!(out, "strand_{name}{{plane=\"metadata\"}} {}", read(value));
    }
    let counters: [(&str, &str, &AtomicU64); 7] = [
        (
            "view_changes_total",
            "view changes entered",
            &g.view_changes,
        ),
        (
            "checkpoints_total",
            "checkpoints made durable",
            &g.checkpoints,
        ),
        (
            "state_transfers_total",
            "state transfers installed",
            &g.transfers,
        ),
        ("appends_total", "prepares journaled durably", &g.appends),
        (
            "append_seconds_total",
            "time spent in durable appends (write and fdatasync)",
            &g.append_micros,
        ),
        (
            "inbox_dropped_total{reason=\"full\",",
            "replica frames dropped before the pump",
            &g.inbox_dropped_full,
        ),
        (
            "inbox_dropped_total{reason=\"foreign_group\",",
            "",
            &g.inbox_dropped_foreign,
        ),
    ];
    for (name, help, value) in counters {
        let (base, labels) = match name.split_once('{') {
            Some((base, labels)) => (base, labels),
            None => (name, ""),
        };
        if !help.is_empty() {
            let _ = writeln!(out, "# HELP strand_{base} {help}.");
            let _ = writeln!(out, "# TYPE strand_{base} counter");
        }
        let v = read(value);
        if base == "append_seconds_total" {
            let _ = writeln!(
                out,
                "strand_{base}{{{labels}plane=\"metadata\"}} {}",
                v as f64 / 1e6
            );
        } else {
            let _ = writeln!(out, "strand_{base}{{{labels}plane=\"metadata\"}} {v}");
        }
    }
    g.forwards.render(&mut out);
    if let Some(c) = &sources.clients {
        let _ = writeln!(
            out,
            "# HELP strand_client_connections_open client connections open now."
        );
        let _ = writeln!(out, "# TYPE strand_client_connections_open gauge");
        let _ = writeln!(out, "strand_client_connections_open {}", read(&c.open));
        let client_counters: [(&str, &AtomicU64); 15] = [
            ("client_connections_total", &c.accepted),
            ("client_requests_total", &c.requests),
            ("client_closed_total{reason=\"framing\"}", &c.closed_framing),
            (
                "client_closed_total{reason=\"replica_command\"}",
                &c.closed_replica_command,
            ),
            (
                "client_closed_total{reason=\"undecodable\"}",
                &c.closed_undecodable,
            ),
            ("client_replies_undeliverable_total", &c.undeliverable),
            ("client_deadline_answers_total", &c.deadline),
            ("client_replies_stale_total", &c.stale),
            ("client_mesh_refused_total", &c.mesh_refused),
            ("client_logins_refused_total", &c.logins_refused),
            ("client_shard_disagreements_total", &c.shard_disagreement),
            ("client_remote_forgotten_total", &c.remote_forgotten),
            ("client_auto_commits_failed_total", &c.auto_commits_failed),
            ("client_poll_read_errors_total", &c.poll_read_errors),
            ("client_group_sessions_ended_total", &c.group_sessions_ended),
        ];
        let mut typed = std::collections::HashSet::new();
        for (name, value) in client_counters {
            let base = name.split('{').next().unwrap_or(name);
            if typed.insert(base) {
                let _ = writeln!(out, "# TYPE strand_{base} counter");
            }
            let _ = writeln!(out, "strand_{name} {}", read(value));
        }
    }
    crate::partition_group::render_metrics(&mut out, &sources.partitions);
    crate::timeline::render_metrics(&mut out);
    // The replica plane, per shard.
    let mut seen = std::collections::HashSet::new();
    for (shard, counters) in sources.planes.iter().enumerate() {
        for (name, reason, value) in counters.snapshot() {
            if seen.insert(name) {
                let _ = writeln!(out, "# TYPE strand_{name} counter");
            }
            if reason.is_empty() {
                let _ = writeln!(out, "strand_{name}{{shard=\"{shard}\"}} {value}");
            } else {
                let _ = writeln!(
                    out,
                    "strand_{name}{{shard=\"{shard}\",reason=\"{reason}\"}} {value}"
                );
            }
        }
    }
    if !sources.planes.is_empty() {
        let _ = writeln!(
            out,
            "# HELP strand_replica_connections_open replica connections registered on the shard now."
        );
        let _ = writeln!(out, "# TYPE strand_replica_connections_open gauge");
        for (shard, counters) in sources.planes.iter().enumerate() {
            let _ = writeln!(
                out,
                "strand_replica_connections_open{{shard=\"{shard}\"}} {}",
                Counters::read(&counters.open)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP strand_memory_prefault_pending_bytes bytes the boot's memory prefault has still to touch (0 once done)."
    );
    let _ = writeln!(out, "# TYPE strand_memory_prefault_pending_bytes gauge");
    let _ = writeln!(
        out,
        "strand_memory_prefault_pending_bytes {}",
        sources.prefault.pending_bytes()
    );
    out
}

/// Binds `addr` and serves `/metrics` on a thread of its own for the life of the process.
pub fn serve(addr: SocketAddr, sources: Sources) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new()
        .name("strand-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &sources);
            }
        })?;
    Ok(local)
}

fn answer(mut stream: TcpStream, sources: &Sources) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    // Read the request head (up to 8 KiB).
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body) = if line.starts_with(b"GET /metrics ") || line == b"GET /metrics" {
        ("200 OK", render(sources))
    } else {
        ("404 Not Found", "only GET /metrics is served\n".to_owned())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

#[cfg(test)]
mod readme_tests {
    use super::*;

    /// Every metric name the endpoint renders is documented in the README's metrics section
    /// (the replica-plane rows may abbreviate `strand_replica_X` as `_X`), so the names cannot
    /// drift from the code (issue 10 item 7).
    #[test]
    fn the_readme_documents_every_metric() {
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let text = render(&Sources {
            gauges: Arc::new(Gauges::default()),
            planes: vec![Arc::new(Counters::default())],
            clients: Some(Arc::new(crate::client_core::Counters::default())),
            partitions: vec![Arc::new(crate::partition_group::PartitionGauges::default())],
            prefault: Arc::new(crate::memory::Prefault::default()),
        });
        let names: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("strand_"))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        assert!(names.len() > 20, "{names:?}");
        let missing: Vec<&&str> = names
            .iter()
            .filter(|n| {
                !readme.contains(&format!("`{n}`")) && !readme.contains(&format!("`{n}{{")) && {
                    let short = n.strip_prefix("strand_replica").unwrap_or(n);
                    !readme.contains(&format!("`{short}`"))
                }
            })
            .collect();
        assert!(
            missing.is_empty(),
            "metrics missing from the README: {missing:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_group::PartitionGauges;

    /// Every family is one group of lines with at most one TYPE line, the partition groups of
    /// each shard are labelled `plane="partition"` and `shard`, and values are read live.
    #[test]
    fn families_are_contiguous_and_partitions_are_labelled_per_shard() {
        let shards: Vec<Arc<PartitionGauges>> = (0..2)
            .map(|_| Arc::new(PartitionGauges::default()))
            .collect();
        shards[1].wal_commits.store(7, Ordering::Relaxed);
        shards[0].dropped_full.store(3, Ordering::Relaxed);
        let clients = Arc::new(crate::client_core::Counters::default());
        clients.group_sessions_ended.store(2, Ordering::Relaxed);
        let text = render(&Sources {
            gauges: Arc::new(Gauges::default()),
            planes: vec![Arc::new(Counters::default())],
            clients: Some(clients),
            partitions: shards,
            prefault: Arc::new(crate::memory::Prefault::default()),
        });
        assert!(text.contains("strand_client_group_sessions_ended_total 2"));
        assert!(text.contains("strand_wal_commits_total{plane=\"partition\",shard=\"1\"} 7"));
        assert!(text.contains(
            "strand_partition_inbox_dropped_total{reason=\"full\",plane=\"partition\",shard=\"0\"} 3"
        ));
        let mut seen = Vec::new();
        let mut last = "";
        // A histogram's `_bucket`, `_sum` and `_count` lines belong to its family.
        let histograms: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" histogram"))
            .collect();
        for line in text.lines() {
            let name = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
                .unwrap_or(line)
                .split(['{', ' '])
                .next()
                .unwrap();
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| histograms.contains(b)))
                .unwrap_or(name);
            if name != last {
                assert!(!seen.contains(&name), "family {name} split: {text}");
                seen.push(name);
                last = name;
            }
        }
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(types, seen.len(), "one TYPE line per family");
    }
}
