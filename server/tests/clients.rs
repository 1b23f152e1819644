//! Clients against three real `strand start` processes on loopback, raw frames on the client
//! port (client-plane.md): a client logs in on the metadata primary and creates a stream and
//! a topic; another node's GetStreams shows them once it has committed them; a write on a
//! backup gets the documented answer (TransientNotAccepted in the result section, and
//! GetClusterMetadata naming the primary as leader); after SIGKILL of all three and a
//! restart from their directories (past a checkpoint), the metadata is still there.
//!
//! No test hook: every op is committed through a client. Waits are bounded (generous for a
//! loaded CI machine); nothing asserts on elapsed time.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on every wait.
const BOUND: Duration = Duration::from_secs(60);
const HEADER: usize = 256;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("strand-clients-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn config(ports: &[u16]) -> String {
    let mut text = String::from(
        r#"
[cluster]
enabled = true
name = "clients-e2e"
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

struct Node {
    id: u8,
    tcp: u16,
    http: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn spawn(config: &Path, node: &mut Node, log: &Path) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_strand"))
        .env("RUST_LOG", "info")
        .env_remove("STRAND_TEST_REGISTER_INTERVAL_MS")
        .env_remove("IGGY_ROOT_USERNAME")
        .env_remove("IGGY_ROOT_PASSWORD")
        .args(["start", "--config"])
        .arg(config)
        .args([
            "--replica-id",
            &node.id.to_string(),
            "--shards",
            "2",
            "--data-dir",
        ])
        .arg(&node.dir)
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    node.child = Some(child);
}

fn kill_all(nodes: &mut [Node]) {
    for node in nodes.iter_mut() {
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

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

/// The primary's index once every node is normal in one view with exactly one primary.
fn wait_for_primary(nodes: &[Node], logs: &Path) -> usize {
    let all: Vec<&Node> = nodes.iter().collect();
    all[wait_for_primary_of(&all, logs)].id as usize
}

/// The index in `nodes` of the one normal primary they agree on.
fn wait_for_primary_of(nodes: &[&Node], logs: &Path) -> usize {
    let start = Instant::now();
    while start.elapsed() < BOUND {
        let all: Option<Vec<_>> = nodes.iter().map(|n| metrics(n.http)).collect();
        if let Some(all) = all {
            let views: std::collections::BTreeSet<u64> = all.iter().map(|m| m["view"]).collect();
            if views.len() == 1
                && all.iter().all(|m| m["status"] == 0)
                && all.iter().filter(|m| m["is_primary"] == 1).count() == 1
            {
                return all.iter().position(|m| m["is_primary"] == 1).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "no single primary within {BOUND:?}\nlogs:\n{}",
        std::fs::read_to_string(logs).unwrap_or_default()
    );
}

struct Answer(Vec<u8>);

impl Answer {
    fn command(&self) -> u8 {
        self.0[60]
    }
    fn status(&self) -> u32 {
        assert_eq!(self.command(), 8, "a Reply expected");
        u32::from_le_bytes(self.0[216..220].try_into().unwrap())
    }
    fn body(&self) -> &[u8] {
        &self.0[HEADER..]
    }
    /// The result section's code (0 for success).
    fn result(&self) -> u32 {
        assert_eq!(self.status(), 0);
        let body = self.body();
        match u32::from_le_bytes(body[0..4].try_into().unwrap()) {
            0 => 0,
            1 => u32::from_le_bytes(body[8..12].try_into().unwrap()),
            n => panic!("result count {n}"),
        }
    }
    fn transient(&self) -> bool {
        self.command() == 8
            && (matches!(self.status(), 57 | 58)
                || (self.status() == 0
                    && self.body().len() == 12
                    && matches!(self.result(), 57 | 58)))
    }
}

struct Client {
    stream: TcpStream,
    client: u128,
    session: u64,
    request: u64,
}

fn frame(
    client: u128,
    operation: u8,
    code: u32,
    session: u64,
    request: u64,
    body: &[u8],
) -> Vec<u8> {
    let mut f = vec![0u8; HEADER];
    f[48..52].copy_from_slice(&((HEADER + body.len()) as u32).to_le_bytes());
    f[60] = 5;
    f[128..144].copy_from_slice(&client.to_le_bytes());
    f[168..176].copy_from_slice(&request.to_le_bytes());
    f[176] = operation;
    f[184..192].copy_from_slice(&session.to_le_bytes());
    f[196..200].copy_from_slice(&code.to_le_bytes());
    f.extend_from_slice(body);
    f
}

fn name(text: &str) -> Vec<u8> {
    let mut out = vec![text.len() as u8];
    out.extend_from_slice(text.as_bytes());
    out
}

const REGISTER: u8 = 1;
const NON_REPLICATED: u8 = 2;
const CREATE_STREAM: u8 = 128;
const CREATE_TOPIC: u8 = 132;
const STORE_CONSUMER_OFFSET: u8 = 161;

impl Client {
    fn connect(node: &Node, client: u128) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", node.tcp)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            stream,
            client,
            session: 0,
            request: 1,
        }
    }

    fn exchange_once(&mut self, f: &[u8]) -> Answer {
        self.stream.write_all(f).unwrap();
        let mut header = [0u8; HEADER];
        self.stream.read_exact(&mut header).unwrap();
        let size = u32::from_le_bytes(header[48..52].try_into().unwrap()) as usize;
        let mut out = header.to_vec();
        out.resize(size, 0);
        self.stream.read_exact(&mut out[HEADER..]).unwrap();
        Answer(out)
    }

    /// Resends on a transient answer, as the SDK does (57: same request every 50 ms).
    fn exchange(&mut self, f: &[u8]) -> Answer {
        let start = Instant::now();
        loop {
            let answer = self.exchange_once(f);
            if !answer.transient() || start.elapsed() > BOUND {
                return answer;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn login(&mut self) {
        let mut body = 0x2C00u32.to_le_bytes().to_vec();
        for part in ["rust-sdk", "0.11.0-edge.4", "iggy", "iggy"] {
            body.extend_from_slice(&name(part));
        }
        body.extend_from_slice(&0u32.to_le_bytes());
        let answer = self.exchange(&frame(self.client, REGISTER, 0, 0, 0, &body));
        assert_eq!(answer.result(), 0, "login");
        self.session = u64::from_le_bytes(answer.body()[8..16].try_into().unwrap());
        assert_ne!(self.session, 0);
        self.request = 1;
    }

    fn metadata(&mut self, operation: u8, body: &[u8], retry: bool) -> Answer {
        let f = frame(self.client, operation, 0, self.session, self.request, body);
        self.request += 1;
        if retry {
            self.exchange(&f)
        } else {
            self.exchange_once(&f)
        }
    }

    fn read(&mut self, code: u32, body: &[u8]) -> Answer {
        let f = frame(self.client, NON_REPLICATED, code, self.session, 1, body);
        self.exchange(&f)
    }

    /// GetStreams: the names, in id order.
    fn streams(&mut self) -> Vec<String> {
        let answer = self.read(201, &[]);
        assert_eq!(answer.status(), 0);
        let mut names = Vec::new();
        let mut body = answer.body();
        while !body.is_empty() {
            let len = usize::from(body[32]);
            names.push(String::from_utf8(body[33..33 + len].to_vec()).unwrap());
            let options = u32::from_le_bytes(body[33 + len..37 + len].try_into().unwrap());
            body = &body[37 + len + options as usize..];
        }
        names
    }

    /// GetTopic (stream 0, topic 0): its name, or `None` when not found.
    fn topic(&mut self) -> Option<String> {
        let answer = self.read(300, &[1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0]);
        assert_eq!(answer.status(), 0);
        let body = answer.body();
        if body.is_empty() {
            return None;
        }
        let len = usize::from(body[49]);
        Some(String::from_utf8(body[50..50 + len].to_vec()).unwrap())
    }
}

/// Polls `f` until it returns `Some`, within [`BOUND`].
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < BOUND, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn clients_create_on_the_primary_read_everywhere_and_backups_answer() {
    let dir = scratch("three");
    let ports = free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, config(&ports)).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes: Vec<Node> = (0..3u8)
        .map(|i| Node {
            id: i,
            tcp: ports[usize::from(i) * 3],
            http: ports[usize::from(i) * 3 + 1],
            dir: dir.join(format!("node-{i}")),
            child: None,
        })
        .collect();
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let primary = wait_for_primary(&nodes, &logs);
        let backup = (primary + 1) % 3;
        eprintln!("primary n{primary}, backup n{backup}");

        // 1. On the primary: log in, create a stream and a topic.
        let mut p = Client::connect(&nodes[primary], 0xA11CE);
        p.login();
        let answer = p.metadata(CREATE_STREAM, &name("orders"), true);
        assert_eq!(answer.result(), 0, "CreateStream on the primary");
        let mut topic = vec![1, 4, 0, 0, 0, 0];
        topic.extend_from_slice(&1u32.to_le_bytes());
        topic.extend_from_slice(&name("events"));
        assert_eq!(p.metadata(CREATE_TOPIC, &topic, true).result(), 0);
        assert_eq!(p.streams(), ["orders"]);

        // 2. A client on a backup: its Register travels to the primary (§13); GetStreams and
        // GetTopic there show the stream and the topic once that node committed them.
        let mut b = Client::connect(&nodes[backup], 0xB0B);
        b.login();
        eventually("the backup's GetStreams shows the stream", || {
            (b.streams() == ["orders"]).then_some(())
        });
        let name = eventually("the backup's GetTopic shows the topic", || b.topic());
        assert_eq!(name, "events");

        // 3. A metadata write on the backup: TransientNotAccepted in the result section (the
        // SDK retries, then asks for the leader), and GetClusterMetadata names the primary
        // as leader (the SDK's redirect).
        let answer = b.metadata(CREATE_STREAM, &self::name("elsewhere"), false);
        assert_eq!(answer.result(), 58, "a write on a backup");
        let answer = b.read(12, &[]);
        assert_eq!(answer.status(), 0);
        let roles = cluster_roles(answer.body());
        assert_eq!(roles.len(), 3);
        assert_eq!(
            roles.iter().filter(|(_, role)| *role == 0).count(),
            1,
            "{roles:?}"
        );
        assert_eq!(roles[primary], (nodes[primary].tcp, 0), "{roles:?}");
        assert!(!b.streams().contains(&"elsewhere".to_owned()));
        let requests = raw_metric(nodes[backup].http, "strand_client_requests_total");
        assert!(
            requests >= 5,
            "the backup counted its client requests: {requests}"
        );

        // 4. A partition request for a partition the topic does not have: ResourceNotFound
        // (20) in the result section, not silence.
        let mut body = vec![1, 1, 4, 1, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1];
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.push(1);
        let f = frame(p.client, STORE_CONSUMER_OFFSET, 0, p.session, 1, &body);
        assert_eq!(p.exchange(&f).result(), 20);

        // 5. Past a checkpoint (8 ops), SIGKILL all three and restart: the metadata is
        // restored from snapshot and journal.
        for i in 0..8 {
            let answer = p.metadata(CREATE_STREAM, &self::name(&format!("s{i}")), true);
            assert_eq!(answer.result(), 0);
        }
        eventually("a checkpoint on every node", || {
            let all: Option<Vec<_>> = nodes.iter().map(|n| metrics(n.http)).collect();
            all.filter(|all| all.iter().all(|m| m["checkpoints_total"] >= 1))
        });
        let before = p.streams();
        assert_eq!(before.len(), 9);
        kill_all(&mut nodes);
        for node in nodes.iter_mut() {
            spawn(&config_path, node, &logs);
        }
        let primary = wait_for_primary(&nodes, &logs);
        // Every node booted from a snapshot (installed into the metadata state machine) and
        // not from the journal alone.
        let log = std::fs::read_to_string(&logs).unwrap();
        let from_snapshot = log
            .lines()
            .filter(|l| l.contains("metadata group recovered from"))
            .filter(|l| {
                l.split("snapshot_op=")
                    .nth(1)
                    .and_then(|t| t.split_whitespace().next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|op| op > 0)
            })
            .count();
        assert_eq!(from_snapshot, 3, "each restart installs its snapshot");
        let mut again = Client::connect(&nodes[primary], 0xA11CE + 1);
        again.login();
        assert_eq!(again.streams(), before);
        assert_eq!(again.topic().as_deref(), Some("events"));

        // 6. SIGKILL the primary: a client that asks a survivor for the cluster metadata is
        // sent to the new primary (the SDK's redirect), and writes succeed there.
        let mut child = nodes[primary].child.take().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let survivors: Vec<&Node> = nodes.iter().filter(|n| n.id as usize != primary).collect();
        let new_primary = survivors[wait_for_primary_of(&survivors, &logs)].id as usize;
        assert_ne!(new_primary, primary);
        let asked = survivors
            .iter()
            .find(|n| n.id as usize != new_primary)
            .unwrap();
        let mut c = Client::connect(asked, 0xC0FFEE);
        c.login();
        let roles = eventually("a survivor names the new leader", || {
            let answer = c.read(12, &[]);
            let roles = cluster_roles(answer.body());
            (roles[new_primary].1 == 0).then_some(roles)
        });
        let leader_port = roles.iter().find(|(_, role)| *role == 0).unwrap().0;
        let leader = nodes.iter().find(|n| n.tcp == leader_port).unwrap();
        let mut c = Client::connect(leader, 0xC0FFEE + 1);
        c.login();
        let answer = c.metadata(CREATE_STREAM, &self::name("after-failover"), true);
        assert_eq!(answer.result(), 0, "CreateStream on the new primary");
        assert!(c.streams().contains(&"after-failover".to_owned()));
    }));
    kill_all(&mut nodes);
    if let Err(panic) = result {
        eprintln!(
            "logs:\n{}",
            std::fs::read_to_string(&logs).unwrap_or_default()
        );
        std::panic::resume_unwind(panic);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// GetClusterMetadata: `(tcp port, role)` per node in roster order.
fn cluster_roles(body: &[u8]) -> Vec<(u16, u8)> {
    let mut at = 0usize;
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap()) as usize;
    at += 4 + u32_at(at);
    let count = u32_at(at);
    at += 4;
    let mut out = Vec::new();
    for _ in 0..count {
        at += 4 + u32_at(at); // name
        at += 4 + u32_at(at); // ip
        let tcp = u16::from_le_bytes(body[at..at + 2].try_into().unwrap());
        at += 8;
        let role = body[at];
        at += 2;
        out.push((tcp, role));
    }
    out
}

/// One unlabelled metric's value from `/metrics`.
fn raw_metric(http: u16, name: &str) -> u64 {
    let mut stream = TcpStream::connect(("127.0.0.1", http)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}
