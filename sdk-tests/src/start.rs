//! Three `strand start` processes from one config, each a child of the test with its own data
//! directory, so one node can be SIGKILLed alone and restarted from its directory (`strand
//! dev` stops every node once one exits, so failover cannot use it). Ports are picked free
//! by the kernel; every wait is bounded and names its step.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{CLUSTER_BOUND, Metrics, NodeAddrs, REPLICAS, strand_bin};

/// Timeouts short enough for a test (the same as the server's end-to-end tests).
const SETTINGS: &str = r#"
[cluster]
enabled = true
name = "sdk-failover"
replica_lanes = 1
heartbeat_timeout = "2s"
commit_broadcast_interval = "200ms"
view_change_retransmit_interval = "200ms"
view_change_status_timeout = "2s"
request_start_view_retransmit_interval = "500ms"
repair_retry_interval = "200ms"

[message_bus]
reconnect_period = "200ms"

[system]
memory_prefault_bytes = "0"

[system.sharding]
io_memory = "1 MiB"
"#;

/// A cluster of `strand start` nodes; every live node gets SIGTERM on drop (also on panic),
/// then SIGKILL after a bounded wait.
pub struct StartCluster {
    /// Scratch directory: the config, `node-N` data directories, `strand.log`.
    pub dir: PathBuf,
    /// Per node, in replica-id order.
    pub nodes: Vec<NodeAddrs>,
    config: PathBuf,
    log: PathBuf,
    children: Vec<Option<Child>>,
    passed: bool,
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("binding a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

impl StartCluster {
    /// Writes the config and starts every node.
    pub fn start(scratch: &Path) -> StartCluster {
        StartCluster::start_with(scratch, "")
    }

    /// As [`StartCluster::start`], with `cluster` (TOML lines, each ending in a newline) added
    /// to the config's `[cluster]` table, e.g. `dead_node_session_timeout = "2s"\n`.
    pub fn start_with(scratch: &Path, cluster: &str) -> StartCluster {
        let _ = std::fs::remove_dir_all(scratch);
        std::fs::create_dir_all(scratch).expect("creating the scratch directory");
        let ports = free_ports(3 * REPLICAS);
        let mut text = SETTINGS.replacen("[cluster]\n", &format!("[cluster]\n{cluster}"), 1);
        let mut nodes = Vec::new();
        for i in 0..REPLICAS {
            let p = &ports[3 * i..3 * i + 3];
            text.push_str(&format!(
                "\n[[cluster.nodes]]\nname = \"n{i}\"\nip = \"127.0.0.1\"\nreplica_id = {i}\n\
                 ports = {{ tcp = {}, http = {}, tcp_replica = {} }}\n",
                p[0], p[1], p[2]
            ));
            nodes.push(NodeAddrs {
                client: format!("127.0.0.1:{}", p[0]),
                http: format!("127.0.0.1:{}", p[1]),
            });
        }
        let config = scratch.join("cluster.toml");
        std::fs::write(&config, text).expect("writing the config");
        let mut cluster = StartCluster {
            dir: scratch.to_owned(),
            nodes,
            config,
            log: scratch.join("strand.log"),
            children: (0..REPLICAS).map(|_| None).collect(),
            passed: false,
        };
        for node in 0..REPLICAS {
            cluster.spawn(node);
        }
        cluster
    }

    /// Starts `node` from its data directory (first boot or restart).
    pub fn spawn(&mut self, node: usize) {
        assert!(self.children[node].is_none(), "node {node} is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("opening strand.log");
        let mut command = Command::new(strand_bin());
        command
            .env(
                "RUST_LOG",
                std::env::var("STRAND_SDK_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("STRAND_TEST_REGISTER_INTERVAL_MS")
            .env_remove("IGGY_ROOT_USERNAME")
            .env_remove("IGGY_ROOT_PASSWORD")
            .args(["start", "--config"])
            .arg(&self.config)
            .args([
                "--replica-id",
                &node.to_string(),
                "--shards",
                "1",
                "--data-dir",
            ])
            .arg(self.dir.join(format!("node-{node}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // A node outlives no test process: SIGKILL when the test dies without its drop guard.
        // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
        // which is async-signal-safe; it allocates nothing and touches no lock.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting node {node}: {e}"));
        self.children[node] = Some(child);
    }

    /// SIGKILLs `node` and reaps it.
    pub fn kill(&mut self, node: usize) {
        let mut child = self.children[node]
            .take()
            .unwrap_or_else(|| panic!("node {node} is not running"));
        // SAFETY: kill(2) on our own child, not reaped yet (its pid cannot be reused).
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
    }

    /// Whether `node` runs (as far as this harness started and did not kill it).
    pub fn running(&self, node: usize) -> bool {
        self.children[node].is_some()
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

    /// Every line of the nodes' combined stderr that contains `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Polls the metrics of the `nodes` listed until `done` holds, within [`CLUSTER_BOUND`];
    /// fails naming `what`, also at once when a node this harness runs exited on its own.
    pub fn wait_metrics(
        &mut self,
        what: &str,
        nodes: &[usize],
        done: impl Fn(&[Metrics]) -> bool,
    ) -> Vec<Metrics> {
        let deadline = Instant::now() + CLUSTER_BOUND;
        loop {
            for node in nodes {
                if let Some(child) = self.children[*node].as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    self.fail(&format!("{what}: node {node} exited on its own ({status})"));
                }
            }
            let all: Option<Vec<Metrics>> = nodes
                .iter()
                .map(|n| Metrics::scrape(&self.nodes[*n].http))
                .collect();
            if let Some(all) = &all
                && done(all)
            {
                return all.clone();
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

impl Drop for StartCluster {
    fn drop(&mut self) {
        for child in self.children.iter().flatten() {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for child in self.children.iter_mut().flatten() {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
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
