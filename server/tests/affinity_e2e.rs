//! Partition primaries follow the metadata primary across real processes (decision 221): three
//! `strand start` processes on loopback; the metadata primary is SIGKILLed and restarted, so
//! the metadata group is led by a node other than replica 0; then a topic of three partitions
//! is created. Fresh partition groups start in view 0, led by replica 0; primary affinity moves
//! every one of them to the metadata primary, where a client then sends to every partition.
//! Without affinity the groups stay with replica 0 and the wait for them fails.
//!
//! Every wait is bounded; nothing asserts on elapsed time.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BOUND, Node};
use server::client::reply::decode_send_reply;

const HEADER: usize = 256;
const PARTITIONS: u32 = 3;

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

/// The sum over a node's shards of one partition-plane metric, or `None` if the node does not
/// answer.
fn partition_sum(all: &BTreeMap<String, u64>, name: &str) -> u64 {
    all.iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) && k.contains("plane=\"partition\""))
        .map(|(_, v)| *v)
        .sum()
}

/// Polls `f` until it returns `Some`, within [`BOUND`].
fn eventually<T>(what: &str, logs: &Path, mut f: impl FnMut() -> Option<T>) -> T {
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

struct Answer(Vec<u8>);

impl Answer {
    fn status(&self) -> u32 {
        assert_eq!(self.0[60], 8, "a Reply expected");
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
    /// 57/58 in the header or in the result section: the SDK resends.
    fn transient(&self) -> bool {
        self.0[60] == 8
            && (matches!(self.status(), 57 | 58)
                || (self.status() == 0
                    && self.body().len() == 12
                    && u32::from_le_bytes(self.body()[0..4].try_into().unwrap()) == 1
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
const CREATE_STREAM: u8 = 128;
const CREATE_TOPIC: u8 = 132;
const SEND_MESSAGES: u8 = 160;

impl Client {
    /// Connects to the client port, waiting for a (re)started node to bind it.
    fn connect(tcp: u16, client: u128) -> Client {
        let start = Instant::now();
        let stream = loop {
            match TcpStream::connect(("127.0.0.1", tcp)) {
                Ok(stream) => break stream,
                Err(e) if start.elapsed() > BOUND => panic!("connecting to {tcp}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
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

    /// Resends the same request on a transient answer, as the SDK does.
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
        self.request = 1;
    }

    /// A replicated request with the next request number, resent while transient.
    fn replicated(&mut self, operation: u8, body: &[u8]) -> Answer {
        let f = frame(self.client, operation, 0, self.session, self.request, body);
        self.request += 1;
        self.exchange(&f)
    }

    /// SendMessages of `payloads` to `partition` of stream 0 / topic 0: the confirmed
    /// `(partition, base_offset)`.
    fn send(&mut self, partition: u32, payloads: &[Vec<u8>]) -> (u32, u64) {
        let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let batch = wire::batch::build(0, 0, 0, 0, &slices);
        let mut envelope = vec![1, 4];
        envelope.extend_from_slice(&0u32.to_le_bytes());
        envelope.extend_from_slice(&[1, 4]);
        envelope.extend_from_slice(&0u32.to_le_bytes());
        envelope.extend_from_slice(&[2, 4]);
        envelope.extend_from_slice(&partition.to_le_bytes());
        envelope.extend_from_slice(&(payloads.len() as u32).to_le_bytes());
        let mut body = (envelope.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(&envelope);
        body.extend_from_slice(&batch);
        let answer = self.replicated(SEND_MESSAGES, &body);
        assert_eq!(answer.status(), 0, "SendMessages to partition {partition}");
        let confirmations = decode_send_reply(answer.body()).unwrap();
        assert_eq!(confirmations.len(), 1, "{confirmations:?}");
        (confirmations[0].partition, confirmations[0].base_offset)
    }
}

/// Waits for one normal metadata primary among `live` and returns it.
fn metadata_primary(nodes: &[Node], live: &[usize], logs: &Path) -> usize {
    let watched: Vec<&Node> = live.iter().map(|&i| &nodes[i]).collect();
    let metrics = common::wait_until("one metadata primary", &watched, logs, common::one_primary);
    live[metrics.iter().position(|m| m["is_primary"] == 1).unwrap()]
}

#[test]
fn partition_primaries_follow_the_metadata_primary_across_processes() {
    let _serial = common::serial();
    let dir = common::scratch("affinity");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, common::config("affinity-e2e", 3, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    let tcp = |i: usize| ports[i * 3];
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    common::run_cluster(&mut nodes, &logs, |nodes| {
        // 1. Move the metadata primary off replica 0 (partition groups start led by it).
        let mut mp = metadata_primary(nodes, &[0, 1, 2], &logs);
        while mp == 0 {
            eprintln!("SIGKILL metadata primary n{mp}");
            common::kill(&mut nodes[mp]);
            let live: Vec<usize> = (0..3).filter(|&i| i != mp).collect();
            let next = metadata_primary(nodes, &live, &logs);
            spawn(&config_path, &mut nodes[mp], &logs);
            mp = next;
        }
        let mp = metadata_primary(nodes, &[0, 1, 2], &logs);
        assert_ne!(mp, 0);
        eprintln!("metadata primary n{mp}");

        // 2. A topic of three partitions, created on the metadata primary.
        let mut admin = Client::connect(tcp(mp), 0xAD);
        admin.login();
        assert_eq!(admin.replicated(CREATE_STREAM, &name("orders")).result(), 0);
        let mut topic = vec![1, 4];
        topic.extend_from_slice(&0u32.to_le_bytes());
        topic.extend_from_slice(&PARTITIONS.to_le_bytes());
        topic.extend_from_slice(&name("events"));
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);

        // 3. Every node runs every group, and the metadata primary leads all of them.
        eventually(
            "the metadata primary leads every partition group",
            &logs,
            || {
                let all: Option<Vec<_>> = nodes.iter().map(|n| common::scrape(n.http)).collect();
                let all = all?;
                let groups = all
                    .iter()
                    .all(|m| partition_sum(m, "strand_partition_groups") == u64::from(PARTITIONS));
                let led = partition_sum(&all[mp], "strand_partition_primaries");
                (groups && led == u64::from(PARTITIONS)).then_some(())
            },
        );

        // 4. A client on the metadata primary sends to every partition.
        let mut producer = Client::connect(tcp(mp), 0xB0B);
        producer.login();
        for partition in 0..PARTITIONS {
            let payload = format!("to partition {partition}").into_bytes();
            let (confirmed, base) = producer.send(partition, &[payload]);
            assert_eq!((confirmed, base), (partition, 0));
        }
        // The metadata primary is still where it was (nothing pulled it away).
        assert_eq!(metadata_primary(nodes, &[0, 1, 2], &logs), mp);
    });
}
