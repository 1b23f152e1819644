//! Messages end to end through three real `strand start` processes on loopback (issue 10 items
//! 4 and 8): a raw client logs in on the metadata primary, creates a stream and a topic of two
//! partitions, sends batches to both partitions (explicit partitioning) on the node that is
//! the partition groups' primary, polls them back by offset on every node and compares
//! payloads and offsets, stores and reads a consumer offset. Then a backup is SIGKILLed, more
//! messages are acknowledged by the two survivors, the backup restarts and reads back every
//! acknowledged message in order; all three are SIGKILLed and restarted and every node still
//! reads every acknowledged message; finally the partition primary is SIGKILLed, the
//! survivors elect a new primary of both groups, which acknowledges more, and both survivors
//! read everything.
//!
//! Node 0 runs two shards (one group on each) and the others one: on node 0 a client's
//! connection lives on one shard and one of the two partitions' requests and reads cross the
//! shard mesh to the other (`ShardMsg::Partition` / `Read`, replies back on the reply lane).
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
use server::client::codec::{Consumer, Identifier, PollingStrategy};
use server::client::reply::{ConsumerOffsetReply, PollHead, decode_send_reply};
use server::client::request::{OffsetTarget, PollMessages, Request, StoreConsumerOffset};

const HEADER: usize = 256;
const SHARDS: [u8; 3] = [2, 1, 1];
/// `cluster.replica_lanes` (the default).
const LANES: u16 = 16;

/// The first stream id whose topic 0 has partitions 0 and 1 on different shards of a
/// two-shard node, so node 0 runs one group on each shard.
fn stream_id() -> u32 {
    let shard = |stream: u32, partition: u32| {
        let group = wire::GroupId::partition(wire::PartitionKey {
            stream,
            topic: 0,
            partition,
        })
        .unwrap();
        shard::mapping::shard_of(group, LANES, 2)
    };
    (0..64).find(|&s| shard(s, 0) != shard(s, 1)).unwrap()
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
            &SHARDS[usize::from(node.id)].to_string(),
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
const NON_REPLICATED: u8 = 2;
const CREATE_STREAM: u8 = 128;
const CREATE_TOPIC: u8 = 132;
const SEND_MESSAGES: u8 = 160;
const STORE_CONSUMER_OFFSET: u8 = 161;
const POLL_MESSAGES: u32 = 100;
const GET_CONSUMER_OFFSET: u32 = 120;

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

    fn read(&mut self, code: u32, body: &[u8]) -> Answer {
        let f = frame(self.client, NON_REPLICATED, code, self.session, 1, body);
        self.exchange(&f)
    }

    /// SendMessages of `payloads` to `partition` of stream 0 / topic 0: the confirmed
    /// `(partition, base_offset)`.
    fn send(&mut self, partition: u32, payloads: &[Vec<u8>]) -> (u32, u64) {
        let body = send_body(partition, payloads);
        let answer = self.replicated(SEND_MESSAGES, &body);
        assert_eq!(answer.status(), 0, "SendMessages to partition {partition}");
        let confirmations = decode_send_reply(answer.body()).unwrap();
        assert_eq!(confirmations.len(), 1, "{confirmations:?}");
        (confirmations[0].partition, confirmations[0].base_offset)
    }

    /// Every message of `partition` from offset 0, as `(offset, payload)`; `None` if the node
    /// does not know the partition (yet).
    fn poll(&mut self, partition: u32) -> Option<Vec<(u64, Vec<u8>)>> {
        self.poll_with(partition, PollingStrategy::Offset(0), 100_000, false)
    }

    /// A PollMessages of consumer 7: `(offset, payload)` of every message returned, `None` on
    /// a non-zero status.
    fn poll_with(
        &mut self,
        partition: u32,
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Option<Vec<(u64, Vec<u8>)>> {
        let mut body = Vec::new();
        Request::PollMessages(PollMessages {
            consumer: consumer(),
            stream: Identifier::Numeric(stream_id()),
            topic: Identifier::Numeric(0),
            partition: Some(partition),
            strategy,
            count,
            auto_commit,
        })
        .encode(&mut body);
        let answer = self.read(POLL_MESSAGES, &body);
        if answer.status() != 0 {
            return None;
        }
        let (head, mut batches) = PollHead::decode(answer.body()).unwrap();
        assert_eq!(head.partition_id, partition);
        let mut out = Vec::new();
        while !batches.is_empty() {
            let header = wire::batch::verify(batches).expect("an intact stored batch");
            let bytes = &batches[..header.length as usize];
            let mut at = wire::batch::HEADER_SIZE;
            for _ in 0..header.message_count {
                let frame = &bytes[at..];
                let u32_at =
                    |i: usize| u32::from_le_bytes(frame[i..i + 4].try_into().unwrap()) as usize;
                let delta = u32_at(24) as u64;
                let (headers, payload) = (u32_at(32), u32_at(36));
                let start = wire::batch::FRAME_HEADER_SIZE;
                out.push((
                    header.base_offset + delta,
                    frame[start..start + payload].to_vec(),
                ));
                at += start + payload + headers;
            }
            assert_eq!(at, bytes.len(), "frames tile the batch");
            batches = &batches[bytes.len()..];
        }
        assert_eq!(out.len(), head.messages_count as usize);
        Some(out)
    }

    fn store_offset(&mut self, partition: u32, offset: u64) -> u32 {
        let mut body = Vec::new();
        Request::StoreConsumerOffset(StoreConsumerOffset {
            target: target(partition),
            offset,
            quorum: true,
        })
        .encode(&mut body);
        self.replicated(STORE_CONSUMER_OFFSET, &body).result()
    }

    fn consumer_offset(&mut self, partition: u32) -> Option<ConsumerOffsetReply> {
        let mut body = Vec::new();
        Request::GetConsumerOffset(target(partition)).encode(&mut body);
        let answer = self.read(GET_CONSUMER_OFFSET, &body);
        assert_eq!(answer.status(), 0);
        ConsumerOffsetReply::decode(answer.body()).unwrap()
    }
}

/// The body of a SendMessages of `payloads` to `partition` of the test's stream, topic 0.
fn send_body(partition: u32, payloads: &[Vec<u8>]) -> Vec<u8> {
    let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let batch = wire::batch::build(0, 0, 0, 0, &slices);
    let mut envelope = vec![1, 4];
    envelope.extend_from_slice(&stream_id().to_le_bytes());
    envelope.extend_from_slice(&[1, 4]);
    envelope.extend_from_slice(&0u32.to_le_bytes());
    envelope.extend_from_slice(&[2, 4]);
    envelope.extend_from_slice(&partition.to_le_bytes());
    envelope.extend_from_slice(&(payloads.len() as u32).to_le_bytes());
    let mut body = (envelope.len() as u32).to_le_bytes().to_vec();
    body.extend_from_slice(&envelope);
    body.extend_from_slice(&batch);
    body
}

fn consumer() -> Consumer {
    Consumer {
        group: false,
        id: Identifier::Numeric(7),
    }
}

fn target(partition: u32) -> OffsetTarget {
    OffsetTarget {
        consumer: consumer(),
        stream: Identifier::Numeric(stream_id()),
        topic: Identifier::Numeric(0),
        partition: Some(partition),
    }
}

/// A payload that names its batch and position (distinct per message, sizes varied).
fn payload(batch: usize, i: usize) -> Vec<u8> {
    let mut p = format!("batch {batch} message {i} ").into_bytes();
    p.resize(p.len() + (batch * 37 + i * 11) % 300, (batch + i) as u8);
    p
}

/// The nodes' `partition.read_cache_bytes` in the first test.
const READ_CACHE: &str = "64 KiB";

/// Sends `batches` batches of three 20,000-byte messages alternating over both partitions.
fn send_big(c: &mut Client, acked: &mut Acked, first: usize, batches: usize) {
    for b in first..first + batches {
        let partition = (b % 2) as u32;
        let payloads: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let mut p = payload(b, i);
                p.resize(20_000, (b * 7 + i) as u8);
                p
            })
            .collect();
        let (confirmed, base) = c.send(partition, &payloads);
        let list = &mut acked[partition as usize];
        assert_eq!((confirmed, base), (partition, list.len() as u64));
        for (i, p) in payloads.into_iter().enumerate() {
            list.push((base + i as u64, p));
        }
    }
}

/// What the test acknowledged: per partition, `(offset, payload)` in offset order.
type Acked = [Vec<(u64, Vec<u8>)>; 2];

/// Sends `batches` batches of three messages alternating over both partitions, numbered from
/// `first`; every confirmation names the partition and the next offset.
fn send_batches(c: &mut Client, acked: &mut Acked, first: usize, batches: usize) {
    for b in first..first + batches {
        let partition = (b % 2) as u32;
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| payload(b, i)).collect();
        let (confirmed, base) = c.send(partition, &payloads);
        let list = &mut acked[partition as usize];
        assert_eq!(confirmed, partition);
        assert_eq!(base, list.len() as u64, "offsets are dense per partition");
        for (i, p) in payloads.into_iter().enumerate() {
            list.push((base + i as u64, p));
        }
    }
}

/// Polls both partitions on `tcp` until they hold exactly what was acknowledged (a backup
/// commits a little after the primary answered).
fn reads_back(tcp: u16, client: u128, acked: &Acked, logs: &Path, what: &str) {
    let mut c = Client::connect(tcp, client);
    c.login();
    for partition in 0..2u32 {
        let expected = &acked[partition as usize];
        let got = eventually(&format!("{what}: partition {partition}"), logs, || {
            c.poll(partition).filter(|got| got.len() >= expected.len())
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

/// The node that is primary of both partition groups, once every node of `live` runs both.
fn partition_primary(nodes: &[Node], live: &[usize], logs: &Path) -> usize {
    eventually(
        "every node runs both groups, one is their primary",
        logs,
        || {
            let all: Option<Vec<_>> = live
                .iter()
                .map(|&i| common::scrape(nodes[i].http))
                .collect();
            let all = all?;
            if all
                .iter()
                .any(|m| partition_sum(m, "strand_partition_groups") != 2)
            {
                return None;
            }
            let primaries: Vec<u64> = all
                .iter()
                .map(|m| partition_sum(m, "strand_partition_primaries"))
                .collect();
            let at = primaries.iter().position(|&p| p == 2)?;
            (primaries.iter().sum::<u64>() == 2).then_some(live[at])
        },
    )
}

fn metadata_primary(nodes: &[Node], logs: &Path) -> usize {
    let all: Vec<&Node> = nodes.iter().collect();
    let metrics = common::wait_until("one metadata primary", &all, logs, common::one_primary);
    metrics.iter().position(|m| m["is_primary"] == 1).unwrap()
}

fn kill_all(nodes: &mut [Node]) {
    for node in nodes.iter_mut() {
        common::kill(node);
    }
}

#[test]
fn messages_are_sent_polled_and_survive_a_killed_backup_and_a_full_restart() {
    let _serial = common::serial();
    let dir = common::scratch("messages");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    // A small read cache: older polls read the segments (decision 280), here and after the
    // restarts (the boot rebuilds only the tail).
    let extra = format!("[partition]\nread_cache_bytes = \"{READ_CACHE}\"");
    std::fs::write(
        &config_path,
        common::config("messages-e2e", 3, &ports, &extra),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    let tcp = |i: usize| ports[i * 3];
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mp = metadata_primary(&nodes, &logs);

        // 1. On the metadata primary: log in, create streams up to the one whose two
        // partitions land on different shards of node 0, and there a topic of two partitions.
        let mut admin = Client::connect(tcp(mp), 0xAD);
        admin.login();
        for s in 0..=stream_id() {
            let answer = admin.replicated(CREATE_STREAM, &name(&format!("orders-{s}")));
            assert_eq!(answer.result(), 0);
        }
        let mut topic = vec![1, 4];
        topic.extend_from_slice(&stream_id().to_le_bytes());
        topic.extend_from_slice(&2u32.to_le_bytes());
        topic.extend_from_slice(&name("events"));
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);

        // 2. Every node runs both groups; send on their primary (partition primaries do not
        // follow the metadata primary yet).
        let pp = partition_primary(&nodes, &[0, 1, 2], &logs);
        eprintln!("metadata primary n{mp}, partition primary n{pp}");
        let n0 = common::scrape(nodes[0].http).unwrap();
        let per_shard: Vec<u64> = (0..2)
            .map(|s| n0[&format!("strand_partition_groups{{plane=\"partition\",shard=\"{s}\"}}")])
            .collect();
        assert_eq!(per_shard, [1, 1], "n0 runs one group on each shard");
        let mut producer = Client::connect(tcp(pp), 0xB0B);
        producer.login();
        let mut acked: Acked = [Vec::new(), Vec::new()];
        send_batches(&mut producer, &mut acked, 0, 10);
        // Read-your-writes on the primary: every acknowledged message is committed there.
        let got = producer.poll(1).unwrap();
        assert_eq!(got, acked[1], "the primary polls what it acknowledged");
        for i in 0..3 {
            reads_back(tcp(i), 0xC0 + i as u128, &acked, &logs, &format!("n{i}"));
        }

        // 3. A consumer offset: stored through the group, read back on every node.
        assert_eq!(producer.store_offset(1, 4), 0, "StoreConsumerOffset");
        let stored = producer.consumer_offset(1).expect("an offset is stored");
        assert_eq!(
            (
                stored.partition_id,
                stored.stored_offset,
                stored.current_offset
            ),
            (1, 4, acked[1].len() as u64 - 1)
        );
        assert_eq!(
            producer.consumer_offset(0),
            None,
            "nothing stored on partition 0"
        );
        for i in 0..3 {
            let mut c = Client::connect(tcp(i), 0xD0 + i as u128);
            c.login();
            eventually(&format!("n{i} reads the stored offset"), &logs, || {
                c.consumer_offset(1)
                    .filter(|o| o.stored_offset == 4)
                    .map(|_| ())
            });
        }

        // Auto-commit: a Next poll stores the last offset it returned, so the next Next poll
        // continues after it (consumer 7 has nothing stored on partition 0 yet).
        let next = |c: &mut Client| {
            c.poll_with(0, PollingStrategy::Next(0), 5, true)
                .expect("a Next poll")
        };
        assert_eq!(next(&mut producer), acked[0][0..5]);
        assert_eq!(next(&mut producer), acked[0][5..10]);
        let stored = producer
            .consumer_offset(0)
            .expect("auto-commit stored an offset");
        assert_eq!(stored.stored_offset, 9);

        // 4. SIGKILL a backup of both planes; the survivors acknowledge more; the backup
        // restarts and reads back every acknowledged message in order.
        let backup = (0..3).find(|&i| i != mp && i != pp).unwrap();
        eprintln!("SIGKILL backup n{backup}");
        common::kill(&mut nodes[backup]);
        send_batches(&mut producer, &mut acked, 10, 10);
        spawn(&config_path, &mut nodes[backup], &logs);
        reads_back(tcp(backup), 0xE0, &acked, &logs, "restarted backup");

        // 4b. Several times the read cache and past a segment flush (1 MiB by the default
        // policy): polls from offset 0 read the segments, payloads equal; every node's tails
        // hold well under what the partitions hold.
        let before: usize = acked.iter().flatten().map(|(_, p)| p.len()).sum();
        send_big(&mut producer, &mut acked, 100, 80);
        let total: usize = acked.iter().flatten().map(|(_, p)| p.len()).sum();
        assert!(total - before > 4 << 20);
        for (i, node) in nodes.iter().enumerate() {
            reads_back(
                tcp(i),
                0x1A0 + i as u128,
                &acked,
                &logs,
                &format!("n{i} big"),
            );
            let cached = partition_sum(
                &common::scrape(node.http).unwrap(),
                "strand_partition_cache_bytes",
            );
            eprintln!("n{i}: {cached} bytes of {total} in the partitions' tails");
            assert!(
                (cached as usize) < total / 2,
                "n{i}: tails hold {cached} of {total} bytes"
            );
        }

        // 5. SIGKILL all three and restart: every node reads every acknowledged message
        // (recovered from WAL and segments), and the groups take new messages again.
        kill_all(&mut nodes);
        for node in nodes.iter_mut() {
            spawn(&config_path, node, &logs);
        }
        for i in 0..3 {
            reads_back(
                tcp(i),
                0xF0 + i as u128,
                &acked,
                &logs,
                &format!("n{i} restarted"),
            );
        }
        let pp = partition_primary(&nodes, &[0, 1, 2], &logs);
        eprintln!(
            "after the restart: metadata primary n{}, partition primary n{pp}",
            metadata_primary(&nodes, &logs)
        );
        let mut producer = Client::connect(tcp(pp), 0xB0B + 1);
        producer.login();
        send_batches(&mut producer, &mut acked, 20, 4);
        for i in 0..3 {
            reads_back(
                tcp(i),
                0x100 + i as u128,
                &acked,
                &logs,
                &format!("n{i} at the end"),
            );
        }
        let stored = producer.consumer_offset(1).expect("the offset survived");
        assert_eq!(stored.stored_offset, 4);

        // 6. SIGKILL the partition primary: the two survivors elect a new primary for both
        // groups (view change of each group), which acknowledges more; both survivors read
        // every acknowledged message.
        eprintln!("SIGKILL partition primary n{pp}");
        common::kill(&mut nodes[pp]);
        let survivors: Vec<usize> = (0..3).filter(|&i| i != pp).collect();
        let new_pp = partition_primary(&nodes, &survivors, &logs);
        let alive: Vec<&Node> = survivors.iter().map(|&i| &nodes[i]).collect();
        let metrics = common::wait_until("a metadata primary", &alive, &logs, common::one_primary);
        let new_mp = survivors[metrics.iter().position(|m| m["is_primary"] == 1).unwrap()];
        eprintln!("new partition primary n{new_pp}, metadata primary n{new_mp}");
        let mut producer = Client::connect(tcp(new_pp), 0xB0B + 2);
        producer.login();
        send_batches(&mut producer, &mut acked, 24, 4);
        for &i in &survivors {
            reads_back(
                tcp(i),
                0x110 + i as u128,
                &acked,
                &logs,
                &format!("n{i} after failover"),
            );
        }
        eprintln!(
            "acknowledged {} + {} messages, all read back on every live node",
            acked[0].len(),
            acked[1].len()
        );
        for &i in &survivors {
            let m = common::scrape(nodes[i].http).unwrap();
            eprintln!(
                "n{i}: frames forwarded between shards {}, partition appends {}, WAL commits {}",
                partition_sum(&m, "strand_frames_forwarded_total"),
                partition_sum(&m, "strand_partition_appends_total"),
                partition_sum(&m, "strand_wal_commits_total"),
            );
        }
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

/// Decision 240 across processes, for partition groups: a rejoined node whose metadata group
/// left lost state crashes before its partition groups' superblocks land. The test makes that
/// directory: a backup of both partition groups is killed, its partition data (WAL and
/// group files, every shard) is removed, its metadata kept, and its stamp records a rejoin
/// (the line `strand start --rejoin` writes). With the other partition backup down it boots
/// both partition groups in lost state (`strand_partition_lost_groups`, the boot log's
/// `rejoin_lost=true`), and a SendMessages at the partition primary does not commit
/// (`strand_partition_commit` stands); once the other backup returns, the send commits and
/// the rejoined node's groups leave lost state.
#[test]
fn a_rejoined_node_boots_its_partition_groups_lost_and_never_helps_their_quorum() {
    let _serial = common::serial();
    let dir = common::scratch("partition-rejoin");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(
        &config_path,
        common::config("partition-rejoin-e2e", 3, &ports, ""),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    let tcp = |i: usize| ports[i * 3];
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mp = metadata_primary(&nodes, &logs);
        let mut admin = Client::connect(tcp(mp), 0xAD);
        admin.login();
        for s in 0..=stream_id() {
            let answer = admin.replicated(CREATE_STREAM, &name(&format!("orders-{s}")));
            assert_eq!(answer.result(), 0);
        }
        let mut topic = vec![1, 4];
        topic.extend_from_slice(&stream_id().to_le_bytes());
        topic.extend_from_slice(&2u32.to_le_bytes());
        topic.extend_from_slice(&name("events"));
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);
        let pp = partition_primary(&nodes, &[0, 1, 2], &logs);
        let mut producer = Client::connect(tcp(pp), 0xB0B);
        producer.login();
        let mut acked: Acked = [Vec::new(), Vec::new()];
        send_batches(&mut producer, &mut acked, 0, 6);
        for i in 0..3 {
            reads_back(tcp(i), 0xC0 + i as u128, &acked, &logs, &format!("n{i}"));
        }
        let backups: Vec<usize> = (0..3).filter(|&i| i != pp).collect();
        let (wiped, other) = (backups[0], backups[1]);
        eprintln!("partition primary n{pp}, rejoined n{wiped}, other backup n{other}");
        common::kill(&mut nodes[wiped]);
        common::kill(&mut nodes[other]);
        // The cut rejoin: metadata kept, every partition file gone, the stamp a rejoin.
        for entry in std::fs::read_dir(&nodes[wiped].dir).unwrap() {
            let shard = entry.unwrap().path();
            if !shard.is_dir() {
                continue;
            }
            for inner in std::fs::read_dir(&shard).unwrap() {
                let path = inner.unwrap().path();
                if path.file_name().unwrap() != "metadata" {
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path).unwrap();
                    } else {
                        std::fs::remove_file(&path).unwrap();
                    }
                }
            }
        }
        let stamp = nodes[wiped].dir.join("strand.cluster");
        let mut text = std::fs::read_to_string(&stamp).unwrap();
        assert!(!text.contains("rejoin ="), "{text}");
        text.push_str("rejoin = true\n");
        std::fs::write(&stamp, text).unwrap();

        // The other backup is down: the metadata group runs on the primary and the rejoined
        // node (its metadata is intact), the partition groups cannot commit.
        spawn(&config_path, &mut nodes[wiped], &logs);
        let pair = [pp, wiped];
        let both = eventually("the rejoined node hosts both groups, lost", &logs, || {
            let all: Option<Vec<_>> = pair
                .iter()
                .map(|&i| common::scrape(nodes[i].http))
                .collect();
            let all = all?;
            (partition_sum(&all[1], "strand_partition_groups") == 2
                && partition_sum(&all[1], "strand_partition_lost_groups") == 2)
                .then_some(all)
        });
        let commit = partition_sum(&both[0], "strand_partition_commit");
        let booted: Vec<String> = std::fs::read_to_string(&logs)
            .unwrap()
            .lines()
            .filter(|l| l.contains("partition group recovered") && l.contains("rejoin_lost=true"))
            .map(str::to_owned)
            .collect();
        assert_eq!(booted.len(), 2, "{booted:?}");
        let mut pending = Client::connect(tcp(pp), 0xBAD);
        pending.login();
        let request = frame(
            pending.client,
            SEND_MESSAGES,
            0,
            pending.session,
            pending.request,
            &send_body(0, &[payload(99, 0)]),
        );
        pending.stream.write_all(&request).unwrap();
        let mut samples = 0;
        let watched = Instant::now();
        while watched.elapsed() < Duration::from_secs(5) {
            if let (Some(p), Some(w)) = (
                common::scrape(nodes[pp].http),
                common::scrape(nodes[wiped].http),
            ) {
                samples += 1;
                assert_eq!(
                    partition_sum(&p, "strand_partition_commit"),
                    commit,
                    "the partition primary committed with the lost node's help"
                );
                assert_eq!(partition_sum(&w, "strand_partition_lost_groups"), 2);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(samples >= 5, "too few samples: {samples}");

        // The other backup returns: the send commits, the rejoined node catches up and
        // leaves lost state.
        spawn(&config_path, &mut nodes[other], &logs);
        eventually(
            "the send commits and the rejoined node leaves lost state",
            &logs,
            || {
                let p = common::scrape(nodes[pp].http)?;
                let w = common::scrape(nodes[wiped].http)?;
                (partition_sum(&p, "strand_partition_commit") > commit
                    && partition_sum(&w, "strand_partition_lost_groups") == 0)
                    .then_some(())
            },
        );
        // The commit that moved is the pending send (the only request): the rejoined node
        // reads it after everything acknowledged before.
        let next = acked[0].len() as u64;
        acked[0].push((next, payload(99, 0)));
        reads_back(tcp(wiped), 0xE0, &acked, &logs, "the rejoined node");
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

/// GetClusterMetadata: `(tcp port, role)` per node in roster order (role 0 = leader).
fn cluster_roles(body: &[u8]) -> Vec<(u16, u8)> {
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap()) as usize;
    let mut at = 4 + u32_at(0);
    let count = u32_at(at);
    at += 4;
    let mut out = Vec::new();
    for _ in 0..count {
        at += 4 + u32_at(at); // name
        at += 4 + u32_at(at); // ip
        let tcp = u16::from_le_bytes(body[at..at + 2].try_into().unwrap());
        at += 8;
        out.push((tcp, body[at]));
        at += 2;
    }
    out
}

/// The SDK's path on `strand dev --replicas 3` (default ports, one shard per node): connect to
/// node 0's client port, log in, find the leader with GetClusterMetadata and move there,
/// create a stream and a topic of two partitions, send with balanced partitioning, poll by
/// offset, store and read a consumer offset; Ctrl-C stops the cluster with exit 0.
#[test]
fn the_sdk_path_works_on_strand_dev() {
    let _serial = common::serial();
    let dir = common::scratch("dev");
    let log = dir.join("dev.log");
    let mut dev = Command::new(env!("CARGO_BIN_EXE_strand"))
        .env("RUST_LOG", "info")
        .env_remove("IGGY_ROOT_USERNAME")
        .env_remove("IGGY_ROOT_PASSWORD")
        .args(["dev", "--replicas", "3", "--data-dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut first = Client::connect(8090, 0x5D1);
        first.login();
        let roles = eventually("GetClusterMetadata names a leader", &log, || {
            let answer = first.read(12, &[]);
            let roles = cluster_roles(answer.body());
            (roles.len() == 3 && roles.iter().filter(|(_, r)| *r == 0).count() == 1)
                .then_some(roles)
        });
        let leader = roles.iter().find(|(_, r)| *r == 0).unwrap().0;
        let mut c = Client::connect(leader, 0x5D2);
        c.login();
        for s in 0..=stream_id() {
            let answer = c.replicated(CREATE_STREAM, &name(&format!("dev-{s}")));
            assert_eq!(answer.result(), 0);
        }
        let mut topic = vec![1, 4];
        topic.extend_from_slice(&stream_id().to_le_bytes());
        topic.extend_from_slice(&2u32.to_le_bytes());
        topic.extend_from_slice(&name("events"));
        assert_eq!(c.replicated(CREATE_TOPIC, &topic).result(), 0);
        // Balanced partitioning: the node picks the partition; both get messages.
        let mut seen = [0u32; 2];
        let mut sent: Vec<Vec<u8>> = Vec::new();
        for b in 0..6 {
            let payloads: Vec<Vec<u8>> = (0..2).map(|i| payload(b, i)).collect();
            let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
            let batch = wire::batch::build(0, 0, 0, 0, &slices);
            let mut envelope = vec![1, 4];
            envelope.extend_from_slice(&stream_id().to_le_bytes());
            envelope.extend_from_slice(&[1, 4, 0, 0, 0, 0, 1, 0]);
            envelope.extend_from_slice(&2u32.to_le_bytes());
            let mut body = (envelope.len() as u32).to_le_bytes().to_vec();
            body.extend_from_slice(&envelope);
            body.extend_from_slice(&batch);
            let answer = c.replicated(SEND_MESSAGES, &body);
            assert_eq!(answer.status(), 0, "balanced SendMessages on the leader");
            let confirmed = decode_send_reply(answer.body()).unwrap();
            seen[confirmed[0].partition as usize] += 2;
            sent.extend(payloads);
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        let mut polled: Vec<Vec<u8>> = Vec::new();
        for partition in 0..2 {
            let got = c.poll(partition).unwrap();
            assert_eq!(got.len() as u32, seen[partition as usize]);
            polled.extend(got.into_iter().map(|(_, p)| p));
        }
        polled.sort();
        sent.sort();
        assert!(polled == sent, "every sent payload is polled back once");
        assert_eq!(c.store_offset(0, 1), 0);
        assert_eq!(c.consumer_offset(0).unwrap().stored_offset, 1);
    }));
    common::signal(&dev, libc::SIGINT);
    let status = dev.wait().unwrap();
    if let Err(panic) = result {
        eprintln!(
            "logs:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::panic::resume_unwind(panic);
    }
    assert!(
        status.success(),
        "{status}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
