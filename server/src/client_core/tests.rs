//! The client core over loopback TCP with raw frames: a node of two shards in this process
//! (the real metadata group on shard 0 over in-memory storage, a fake partition host on each
//! shard), and a std client that writes request frames and reads whatever comes back.
//!
//! Every read has a socket timeout (a hang fails the test instead of stalling CI); nothing
//! asserts on elapsed time.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use consensus::ClientRequest;
use shard::{MeshCapacity, Runtime, RuntimeConfig, ShardContext, Sharding};
use wire::{GroupId, HEADER_SIZE, Operation};

use super::{ClientCore, Counters, NodeInfo};
use crate::client::codec::Consumer;
use crate::client::reply::{ConsumerOffsetReply, StreamDetails, decode_streams, read_result};
use crate::client::request::PollMessages;
use crate::config::{self, Config, Overrides};
use crate::groups::{Partitions, Refused, ReplySink};
use crate::metadata::password::HashParams;
use crate::metadata::view::MetadataReader;
use crate::metadata::{Genesis, MetadataStateMachine};
use crate::metadata_group::{self as metadata, Inbox, MetadataSink, Pump};
use crate::metrics::Gauges;
use crate::partition::Poll;
use crate::shard_msg::ShardMsg;

/// Bound on every socket read: a missing answer fails the test.
const READ_BOUND: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
[cluster]
enabled = true
name = "client-core-test"

[[cluster.nodes]]
name = "n0"
ip = "127.0.0.1"
replica_id = 0
ports = { tcp = 1, http = 2, tcp_replica = 3 }

[system.sharding]
io_memory = "256 KiB"
"#;

fn config() -> Config {
    let overrides = Overrides {
        replica_id: 0,
        shards: Some(2),
        available_cpus: shard::cores::thread_allowed_cpus().unwrap(),
        ..Overrides::default()
    };
    config::load(CONFIG, &overrides).unwrap()
}

/// What the fake partition host saw, shared with the test thread.
#[derive(Default)]
struct Seen {
    submits: Vec<(u16, u64, Operation)>,
    polls: Vec<(u16, u64, u32)>,
}

/// A partition host that answers every submit at once through the shard's reply sink with a
/// status naming the shard (1000 + shard), and every poll with a 16-byte head whose
/// partition id is the shard; groups listed in `unknown` are refused as unknown.
struct FakePartitions {
    shard: u16,
    sink: RefCell<Option<Rc<dyn ReplySink>>>,
    seen: Arc<Mutex<Seen>>,
}

impl Partitions for FakePartitions {
    fn submit(&self, group: GroupId, request: ClientRequest) -> Result<(), Refused> {
        let operation = Operation::from_byte(request.header.operation).unwrap();
        self.seen
            .lock()
            .unwrap()
            .submits
            .push((self.shard, group.0, operation));
        let frame = super::frames::reply(&request.header, 1000 + u32::from(self.shard), &[]);
        let sink = self.sink.borrow().clone().unwrap();
        sink.reply(request.header.client.get(), frame);
        Ok(())
    }
    fn poll(
        &self,
        group: GroupId,
        partition: u32,
        _: &PollMessages,
    ) -> Result<crate::partition::PollAnswer, u32> {
        self.seen
            .lock()
            .unwrap()
            .polls
            .push((self.shard, group.0, partition));
        let mut head = [0u8; 16];
        head[..4].copy_from_slice(&u32::from(self.shard).to_le_bytes());
        Ok(crate::partition::PollAnswer::Ready(Poll {
            head,
            batches: Vec::new(),
            messages_count: 0,
            last_offset: None,
        }))
    }
    fn consumer_offset(
        &self,
        _: GroupId,
        partition: u32,
        _: &Consumer,
    ) -> Result<Option<ConsumerOffsetReply>, u32> {
        Ok(Some(ConsumerOffsetReply {
            partition_id: partition,
            current_offset: u64::from(self.shard),
            stored_offset: 7,
        }))
    }
}

/// A two-shard node in this process: the client port of each shard on its own loopback port
/// (so a test picks the shard), the metadata group on shard 0.
struct Node {
    runtime: Option<Runtime<()>>,
    addrs: Vec<SocketAddr>,
    counters: Arc<Counters>,
    seen: Arc<Mutex<Seen>>,
    reader: MetadataReader,
    /// The partition gauges GetStats sums (one per shard; no pump publishes them here).
    partitions: Arc<Vec<Arc<crate::partition_group::PartitionGauges>>>,
}

impl Node {
    fn start() -> Node {
        Node::start_with(false)
    }

    /// `black_hole`: shard 0 takes metadata requests and drops them (no reply ever comes).
    fn start_with(black_hole: bool) -> Node {
        let config = config();
        let shards = 2usize;
        let machine = MetadataStateMachine::new(&Genesis {
            cluster_id: wire::cluster_id(&config.cluster.name),
            root: config.metadata.root.clone(),
            params: HashParams::TEST,
        })
        .unwrap();
        let handle = machine.handle().clone();
        let reader = machine.reader();
        let machine = Arc::new(Mutex::new(Some(consensus::Buffered::new(machine))));
        let counters = Arc::new(Counters::default());
        let gauges = Arc::new(Gauges::default());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let partitions: Arc<Vec<Arc<crate::partition_group::PartitionGauges>>> =
            Arc::new((0..shards).map(|_| Arc::default()).collect());
        let info = NodeInfo {
            addresses: Arc::default(),
            config: Arc::new(config.clone()),
            reader: reader.clone(),
            gauges: gauges.clone(),
            counters: counters.clone(),
            started: std::time::SystemTime::now(),
            partitions: partitions.clone(),
        };
        let consensus = crate::wiring::metadata_config(&config).unwrap();
        let net = Arc::new(crate::wiring::net_config(&config).unwrap());
        let (addr_tx, addr_rx) = mpsc::channel::<(u16, SocketAddr)>();
        let addr_tx = Arc::new(Mutex::new(addr_tx));
        let runtime_config = RuntimeConfig {
            sharding: Sharding::Unpinned(shards),
            io_memory: 256 << 10,
            ring_depth: 64,
            mesh: MeshCapacity {
                main: 256,
                reply: 256,
            },
            stop_poll_interval: Duration::from_millis(10),
        };
        let body = {
            let seen = seen.clone();
            move |ctx: ShardContext<ShardMsg>| {
                let info = info.clone();
                let machine = machine.clone();
                let handle = handle.clone();
                let consensus = consensus.clone();
                let net = net.clone();
                let addr_tx = addr_tx.clone();
                let gauges = gauges.clone();
                let seen = seen.clone();
                async move {
                    let mesh = Rc::new(ctx.mesh);
                    let core = {
                        let mesh = mesh.clone();
                        ClientCore::new(
                            ctx.id,
                            ctx.shards as u16,
                            info,
                            Rc::new(super::NoPartitions),
                            Box::new(move |to, lane, message| {
                                mesh.try_send(to, lane, message).map_err(|e| e.body)
                            }),
                        )
                    };
                    // The host is built after the core: it needs the core's reply sink.
                    core.set_partitions(Rc::new(FakePartitions {
                        shard: ctx.id,
                        sink: RefCell::new(Some(core.reply_sink())),
                        seen,
                    }));
                    let mut pump = None;
                    if ctx.id == 0 {
                        let inbox = Rc::new(Inbox::new(gauges.clone()));
                        let plane = shard::net::Plane::new(
                            net,
                            0,
                            ctx.shards,
                            shard::net::plane::NodeShared::default(),
                            Rc::new(MetadataSink {
                                inbox: inbox.clone(),
                            }),
                        );
                        let machine = machine.lock().unwrap().take().unwrap();
                        let boot = crate::boot::recover(
                            journal::MemStorage::new(),
                            std::path::Path::new("mem"),
                            journal::Identity {
                                cluster: wire::cluster_id("client-core-test"),
                                replica_id: 0,
                                replica_count: 1,
                            },
                            journal::metadata::JournalConfig {
                                slot_count: 256,
                                slot_size: crate::boot::METADATA_SLOT_SIZE,
                            },
                            machine,
                        )
                        .await
                        .unwrap();
                        if black_hole {
                            core.set_metadata(Box::new(|_| {}));
                        } else {
                            let inbox = inbox.clone();
                            core.set_metadata(Box::new(move |r| inbox.push_request(r)));
                        }
                        pump = Some(glommio::spawn_local(metadata::run(Pump {
                            config: consensus,
                            boot,
                            plane,
                            inbox,
                            stop: ctx.stop.clone(),
                            gauges,
                            test_register_ticks: None,
                            superblock_wedged: None,
                            replies: Some(core.reply_sink()),
                            sessions: Some(handle),
                            dead_node_sessions: None,
                        })));
                    }
                    let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    let addr = listener.local_addr().unwrap();
                    core.serve(listener, ctx.stop.clone());
                    addr_tx.lock().unwrap().send((ctx.id, addr)).unwrap();
                    let mut handler = Handler { core };
                    shard::pump::run(&mesh, &ctx.stop, &mut handler).await;
                    if let Some(pump) = pump {
                        pump.await;
                    }
                }
            }
        };
        let runtime = Runtime::<()>::start(&runtime_config, body).unwrap();
        let mut addrs = vec![None; shards];
        for _ in 0..shards {
            let (shard, addr) = addr_rx.recv_timeout(READ_BOUND).unwrap();
            addrs[usize::from(shard)] = Some(addr);
        }
        Node {
            runtime: Some(runtime),
            addrs: addrs.into_iter().map(Option::unwrap).collect(),
            counters,
            seen,
            reader,
            partitions,
        }
    }

    fn connect(&self, shard: usize) -> Client {
        let stream = TcpStream::connect(self.addrs[shard]).unwrap();
        stream.set_read_timeout(Some(READ_BOUND)).unwrap();
        Client {
            stream,
            client: 0x00c1_1e47_0000_0000_0000_0000_0000_0000 + shard as u128 + 1,
            session: 0,
            request: 1,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            let _ = runtime.stop_and_join(Duration::from_secs(20));
        }
    }
}

struct Handler {
    core: Rc<ClientCore>,
}

impl shard::pump::Handler<ShardMsg> for Handler {
    fn on_tick(&mut self) {}
    fn on_main(&mut self, envelope: shard::Envelope<ShardMsg>) {
        self.core.on_mesh(envelope.body);
    }
    fn on_reply(&mut self, envelope: shard::Envelope<ShardMsg>) {
        self.core.on_mesh(envelope.body);
    }
}

/// A frame as read back.
#[derive(Debug)]
struct Answer(Vec<u8>);

impl Answer {
    fn command(&self) -> u8 {
        self.0[60]
    }
    fn is_reply(&self) -> bool {
        self.command() == wire::Command::Reply.byte()
    }
    fn is_eviction(&self) -> bool {
        self.command() == wire::Command::Eviction.byte()
    }
    fn reason(&self) -> u8 {
        assert!(self.is_eviction(), "not an eviction: {self:?}");
        self.0[255]
    }
    fn status(&self) -> u32 {
        assert!(self.is_reply(), "not a reply: command {}", self.command());
        u32::from_le_bytes(self.0[216..220].try_into().unwrap())
    }
    fn request(&self) -> u64 {
        u64::from_le_bytes(self.0[200..208].try_into().unwrap())
    }
    fn operation(&self) -> u8 {
        self.0[208]
    }
    fn body(&self) -> &[u8] {
        &self.0[HEADER_SIZE..]
    }
    /// TransientNotCommitted / TransientNotAccepted in the header or the result section.
    fn is_transient(&self) -> bool {
        if !self.is_reply() {
            return false;
        }
        let transient = |code: u32| code == 57 || code == 58;
        transient(self.status())
            || (self.status() == 0
                && self.body().len() == 12
                && matches!(read_result(self.body()), Ok(Err(code)) if transient(code)))
    }
}

/// How often the test client resends a transiently refused request (every 50 ms: 30 s, the
/// SDK's own bound).
const TRANSIENT_RETRIES: usize = 600;

struct Client {
    stream: TcpStream,
    client: u128,
    session: u64,
    request: u64,
}

/// A Request frame. `code` goes to offset 196 (NonReplicated); metadata ops are stamped with
/// the body's XXH3 as the SDK does.
fn request_frame(
    client: u128,
    operation: Operation,
    code: u32,
    session: u64,
    request: u64,
    body: &[u8],
) -> Vec<u8> {
    let mut frame = vec![0u8; HEADER_SIZE];
    frame[48..52].copy_from_slice(&((HEADER_SIZE + body.len()) as u32).to_le_bytes());
    frame[60] = wire::Command::Request.byte();
    frame[128..144].copy_from_slice(&client.to_le_bytes());
    if operation == Operation::Register || operation.is_metadata() {
        let stamp = u128::from(xxhash_rust::xxh3::xxh3_64(body));
        frame[144..160].copy_from_slice(&stamp.to_le_bytes());
    }
    frame[168..176].copy_from_slice(&request.to_le_bytes());
    frame[176] = operation.byte();
    frame[184..192].copy_from_slice(&session.to_le_bytes());
    frame[196..200].copy_from_slice(&code.to_le_bytes());
    frame.extend_from_slice(body);
    frame
}

fn login_body(version: u32, username: &str, password: &str) -> Vec<u8> {
    let mut body = version.to_le_bytes().to_vec();
    for name in ["rust-sdk", "0.11.0-edge.4", username, password] {
        body.push(name.len() as u8);
        body.extend_from_slice(name.as_bytes());
    }
    body.extend_from_slice(&0u32.to_le_bytes());
    body
}

fn name(text: &str) -> Vec<u8> {
    let mut out = vec![text.len() as u8];
    out.extend_from_slice(text.as_bytes());
    out
}

impl Client {
    fn send_raw(&mut self, frame: &[u8]) {
        self.stream.write_all(frame).unwrap();
    }

    /// The next frame, or `None` when the server closed the connection.
    fn read(&mut self) -> Option<Answer> {
        let mut header = [0u8; HEADER_SIZE];
        match self.stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading a frame: {e}"),
        }
        let size = u32::from_le_bytes(header[48..52].try_into().unwrap()) as usize;
        let mut frame = header.to_vec();
        frame.resize(size, 0);
        self.stream.read_exact(&mut frame[HEADER_SIZE..]).unwrap();
        Some(Answer(frame))
    }

    /// Sends `frame` and reads the answer, resending the same frame on a transient answer
    /// (57/58, either channel) as the SDK does, a bounded number of times.
    fn exchange(&mut self, frame: &[u8]) -> Answer {
        for _ in 0..TRANSIENT_RETRIES {
            self.send_raw(frame);
            let answer = self.read().expect("an answer, not a close");
            if answer.is_transient() {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            return answer;
        }
        panic!("still transient after {TRANSIENT_RETRIES} tries");
    }

    fn call(&mut self, operation: Operation, code: u32, body: &[u8]) -> Answer {
        let frame = request_frame(
            self.client,
            operation,
            code,
            self.session,
            self.request,
            body,
        );
        if operation.is_metadata() || operation == Operation::Logout {
            self.request += 1;
        }
        self.exchange(&frame)
    }

    fn login(&mut self, username: &str, password: &str) -> Answer {
        let frame = request_frame(
            self.client,
            Operation::Register,
            0,
            0,
            0,
            &login_body(0x2C00, username, password),
        );
        let answer = self.exchange(&frame);
        if answer.is_reply() && answer.status() == 0 {
            let payload = read_result(answer.body()).unwrap().unwrap();
            self.session = u64::from_le_bytes(payload[4..12].try_into().unwrap());
            self.request = 1;
        }
        answer
    }

    fn ping(&mut self) -> Answer {
        self.call(Operation::NonReplicated, 1, &[])
    }
}

fn create_stream_body(stream: &str) -> Vec<u8> {
    name(stream)
}

fn create_topic_body(stream: u32, partitions: u32, topic: &str) -> Vec<u8> {
    let mut body = vec![1, 4];
    body.extend_from_slice(&stream.to_le_bytes());
    body.extend_from_slice(&partitions.to_le_bytes());
    body.extend_from_slice(&name(topic));
    body
}

fn streams(answer: &Answer) -> Vec<String> {
    assert_eq!(answer.status(), 0);
    decode_streams(answer.body())
        .unwrap()
        .into_iter()
        .map(|s| s.name.as_str().to_owned())
        .collect()
}

#[test]
fn login_succeeds_and_binds_a_session() {
    let node = Node::start();
    let mut c = node.connect(0);
    let answer = c.login("iggy", "iggy");
    assert_eq!(answer.status(), 0);
    assert_eq!(answer.operation(), Operation::Register.byte());
    assert_ne!(c.session, 0, "the session must be non-zero");
    // The session works on the shard that took the login and on the other one.
    assert_eq!(
        streams(&c.call(Operation::NonReplicated, 201, &[])),
        Vec::<String>::new()
    );
    let mut other = node.connect(1);
    other.client = c.client;
    other.session = c.session;
    assert_eq!(other.call(Operation::NonReplicated, 201, &[]).status(), 0);
    // Logout commits; the session is gone on every shard (status 40 for a read).
    let answer = c.call(Operation::Logout, 0, &[]);
    assert_eq!(answer.status(), 0);
    assert_eq!(answer.operation(), Operation::Logout.byte());
    assert!(answer.body().is_empty());
    assert_eq!(c.call(Operation::NonReplicated, 201, &[]).status(), 40);
    assert_eq!(other.call(Operation::NonReplicated, 201, &[]).status(), 40);
}

#[test]
fn wrong_password_and_unknown_user_are_evicted_with_invalid_credentials() {
    let node = Node::start();
    let mut c = node.connect(0);
    assert_eq!(c.login("iggy", "wrong").reason(), 9);
    // The connection stays: the client may register again on it (client-plane.md §4.2).
    assert_eq!(c.login("nobody", "iggy").reason(), 9);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
}

#[test]
fn protocol_version_gate_evicts_with_the_window() {
    let node = Node::start();
    let mut c = node.connect(1);
    let frame = request_frame(
        c.client,
        Operation::Register,
        0,
        0,
        0,
        &login_body(0x2800, "iggy", "iggy"), // 0.10.0
    );
    c.send_raw(&frame);
    let answer = c.read().unwrap();
    assert_eq!(answer.reason(), 14);
    assert_eq!(&answer.0[144..148], &0x2C00u32.to_le_bytes());
    assert_eq!(&answer.0[148..152], &0x2C00u32.to_le_bytes());
    // 0.11.7 passes.
    let frame = request_frame(
        c.client,
        Operation::Register,
        0,
        0,
        0,
        &login_body(0x2C07, "iggy", "iggy"),
    );
    c.send_raw(&frame);
    assert_eq!(c.read().unwrap().status(), 0);
}

#[test]
fn requests_before_login_get_the_spec_answers() {
    let node = Node::start();
    let mut c = node.connect(0);
    // Ping is allowed.
    assert_eq!(c.ping().status(), 0);
    // A NonReplicated read: status 40.
    assert_eq!(c.call(Operation::NonReplicated, 201, &[]).status(), 40);
    // A replicated op without a session: Eviction NoSession.
    let frame = request_frame(c.client, Operation::CreateStream, 0, 0, 1, &name("s"));
    c.send_raw(&frame);
    assert_eq!(c.read().unwrap().reason(), 1);
    // Nothing was created.
    assert!(node.reader.view().state.streams.is_empty());
}

#[test]
fn a_replica_command_on_the_client_port_closes_only_that_connection() {
    let node = Node::start();
    let mut bad = node.connect(0);
    let mut good = node.connect(0);
    assert_eq!(good.ping().status(), 0);
    let mut frame = vec![0u8; HEADER_SIZE];
    frame[48..52].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    frame[60] = wire::Command::Prepare.byte();
    bad.send_raw(&frame);
    assert!(bad.read().is_none(), "the connection must close");
    assert_eq!(
        node.counters.closed_replica_command.load(Ordering::Relaxed),
        1
    );
    assert_eq!(good.ping().status(), 0);
}

#[test]
fn an_oversized_size_field_closes_the_connection() {
    let node = Node::start();
    let mut c = node.connect(1);
    let mut frame = request_frame(c.client, Operation::NonReplicated, 1, 0, 1, &[]);
    frame[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
    c.send_raw(&frame);
    assert!(c.read().is_none());
    let mut small = node.connect(1);
    let mut frame = request_frame(small.client, Operation::NonReplicated, 1, 0, 1, &[]);
    frame[48..52].copy_from_slice(&100u32.to_le_bytes());
    small.send_raw(&frame);
    assert!(small.read().is_none());
    assert_eq!(node.counters.closed_framing.load(Ordering::Relaxed), 2);
    assert_eq!(node.connect(1).ping().status(), 0);
}

#[test]
fn unserved_and_unknown_commands_are_answered_never_silent() {
    let node = Node::start();
    let mut c = node.connect(0);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    // A NonReplicated code the SDK knows and this server does not serve: 5.
    assert_eq!(c.call(Operation::NonReplicated, 13, &[]).status(), 5);
    // FlushUnsavedBuffer: 5.
    assert_eq!(c.call(Operation::NonReplicated, 102, &[]).status(), 5);
    // An unknown code: 3 (InvalidCommand, client-plane.md §2.4).
    assert_eq!(c.call(Operation::NonReplicated, 9999, &[]).status(), 3);
    // A replicated metadata op not served (DeleteSegments): refused before routing, status 5.
    let answer = c.call(Operation::DeleteSegments, 0, &name("someone"));
    assert_eq!(answer.status(), 5);
    assert!(answer.body().is_empty());
    // An undefined operation byte: Eviction InvalidRequestOperation.
    let mut frame = request_frame(c.client, Operation::NonReplicated, 1, c.session, 1, &[]);
    frame[176] = 250;
    c.send_raw(&frame);
    assert_eq!(c.read().unwrap().reason(), 4);
}

#[test]
fn create_stream_replies_after_commit_and_get_streams_sees_it_on_every_shard() {
    let node = Node::start();
    let mut c = node.connect(1); // the metadata group is on shard 0: over the mesh
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    let answer = c.call(Operation::CreateStream, 0, &create_stream_body("orders"));
    assert_eq!(answer.status(), 0);
    assert_eq!(answer.operation(), Operation::CreateStream.byte());
    let payload = read_result(answer.body()).unwrap().unwrap();
    let details = StreamDetails::decode(payload).unwrap();
    assert_eq!(details.stream.name.as_str(), "orders");
    // The reply came at commit: the committed view already has it.
    assert!(node.reader.view().op > 0);
    assert_eq!(
        streams(&c.call(Operation::NonReplicated, 201, &[])),
        ["orders"]
    );
    let mut d = node.connect(0);
    assert_eq!(d.login("iggy", "iggy").status(), 0);
    assert_eq!(
        streams(&d.call(Operation::NonReplicated, 201, &[])),
        ["orders"]
    );
    // A duplicate name is a committed business rejection: [1][0][1012].
    let answer = d.call(Operation::CreateStream, 0, &create_stream_body("orders"));
    assert_eq!(read_result(answer.body()).unwrap(), Err(1012));
    // DeleteStream, then the list is empty.
    let answer = c.call(Operation::DeleteStream, 0, &[1, 4, 0, 0, 0, 0]);
    assert_eq!(read_result(answer.body()).unwrap(), Ok(&[][..]));
    assert!(streams(&d.call(Operation::NonReplicated, 201, &[])).is_empty());
}

#[test]
fn exactly_one_answer_per_request_in_lockstep() {
    let node = Node::start();
    let mut c = node.connect(1);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    // Mixed requests, each followed by the next: the frame read after request k is the answer
    // to request k (same operation and number), so no extra frame was ever written between.
    for i in 0..6u32 {
        let number = c.request;
        let answer = c.call(
            Operation::CreateStream,
            0,
            &create_stream_body(&format!("s{i}")),
        );
        assert_eq!(answer.operation(), Operation::CreateStream.byte());
        assert_eq!(answer.request(), number);
        let answer = c.ping();
        assert_eq!(answer.operation(), Operation::NonReplicated.byte());
        let answer = c.call(Operation::NonReplicated, 9999, &[]);
        assert_eq!(answer.status(), 3);
    }
    assert_eq!(
        streams(&c.call(Operation::NonReplicated, 201, &[])).len(),
        6
    );
    assert_eq!(node.counters.undeliverable.load(Ordering::Relaxed), 0);
}

#[test]
fn a_resent_metadata_request_is_answered_from_the_client_table() {
    let node = Node::start();
    let mut c = node.connect(0);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    let number = c.request;
    let first = c.call(Operation::CreateStream, 0, &create_stream_body("once"));
    assert_eq!(read_result(first.body()).unwrap().map(|_| ()), Ok(()));
    // The client reconnects and resends the same request (same client, session, number).
    let mut again = node.connect(1);
    again.client = c.client;
    again.session = c.session;
    again.request = number;
    let second = again.call(Operation::CreateStream, 0, &create_stream_body("once"));
    assert_eq!(
        second.body(),
        first.body(),
        "the cached reply, not a second apply"
    );
    assert_eq!(node.reader.view().state.streams.len(), 1);
}

#[test]
fn partition_requests_run_on_the_groups_shard() {
    let node = Node::start();
    let mut c = node.connect(0);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    let answer = c.call(Operation::CreateStream, 0, &create_stream_body("s"));
    assert_eq!(read_result(answer.body()).unwrap().map(|_| ()), Ok(()));
    let answer = c.call(Operation::CreateTopic, 0, &create_topic_body(0, 8, "t"));
    assert_eq!(read_result(answer.body()).unwrap().map(|_| ()), Ok(()));
    // Replicated as CreateTopicWithAssignments (64), answered as the CreateTopic asked
    // (client-plane.md §1.3: the SDK frames the body by the echoed operation).
    assert_eq!(answer.operation(), Operation::CreateTopic.byte());
    let view = node.reader.view();
    let topic = view
        .topic(
            &crate::client::codec::Identifier::Numeric(0),
            &crate::client::codec::Identifier::Numeric(0),
        )
        .unwrap();
    let lanes = config().cluster.replica_lanes;
    let owners: Vec<u16> = (0..8).map(|p| topic.shard(p, lanes, 2).unwrap()).collect();
    let groups: Vec<u64> = (0..8).map(|p| topic.group(p).unwrap().0).collect();
    drop(view);
    assert!(
        owners.contains(&0) && owners.contains(&1),
        "8 partitions over 2 shards: {owners:?}"
    );
    for partition in 0..8u32 {
        let owner = owners[partition as usize];
        // StoreConsumerOffset (replicated partition op): consumer 1, stream 0, topic 0,
        // partition, offset 0, ack quorum.
        let mut body = vec![1, 1, 4, 1, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1];
        body.extend_from_slice(&partition.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.push(1);
        let answer = c.call(Operation::StoreConsumerOffset, 0, &body);
        assert_eq!(
            answer.status(),
            1000 + u32::from(owner),
            "partition {partition}"
        );
        // PollMessages (a read): answered by the owner's host.
        let mut body = vec![1, 1, 4, 1, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1];
        body.extend_from_slice(&partition.to_le_bytes());
        body.push(1);
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.push(0);
        let answer = c.call(Operation::NonReplicated, 100, &body);
        assert_eq!(answer.status(), 0);
        assert_eq!(&answer.body()[..4], &u32::from(owner).to_le_bytes());
    }
    let seen = node.seen.lock().unwrap();
    for partition in 0..8usize {
        let (owner, group) = (owners[partition], groups[partition]);
        assert!(seen.submits.iter().any(|s| s.0 == owner && s.1 == group));
        assert!(seen.polls.iter().any(|p| p.0 == owner && p.1 == group));
    }
    assert!(
        seen.submits
            .iter()
            .all(|s| owners[groups.iter().position(|g| *g == s.1).unwrap()] == s.0)
    );
}

#[test]
fn a_conflicting_resend_is_refused_not_left_waiting() {
    let node = Node::start();
    let mut c = node.connect(0);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    let number = c.request;
    let first = c.call(Operation::CreateStream, 0, &create_stream_body("one"));
    assert_eq!(read_result(first.body()).unwrap().map(|_| ()), Ok(()));
    // The same request number with another body: the client table drops it; the client
    // still hears an answer, a terminal one (a transient one would be resent forever).
    c.request = number;
    let answer = c.call(Operation::CreateStream, 0, &create_stream_body("two"));
    assert_eq!(read_result(answer.body()).unwrap(), Err(4));
    assert_eq!(node.reader.view().state.streams.len(), 1);
}

/// Logins past the password check and waiting for their commit are bounded per shard (the
/// next Register is answered 58 before any hashing), and a request whose reply never comes is
/// answered 57 after the deadline, never left waiting.
#[test]
fn logins_in_flight_are_bounded_and_a_lost_reply_is_answered_at_the_deadline() {
    let node = Node::start_with(true);
    let mut waiting: Vec<Client> = (0..super::LOGINS_IN_FLIGHT_MAX)
        .map(|i| {
            let mut c = node.connect(0);
            c.client += 0x100 * (i as u128 + 1);
            let frame = request_frame(
                c.client,
                Operation::Register,
                0,
                0,
                0,
                &login_body(0x2C00, "iggy", "iggy"),
            );
            c.send_raw(&frame);
            c
        })
        .collect();
    // Once all of them were read, all are in flight (each is counted in the same executor
    // turn that read it).
    while node.counters.requests.load(Ordering::Relaxed) < waiting.len() as u64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut extra = node.connect(0);
    let frame = request_frame(
        extra.client,
        Operation::Register,
        0,
        0,
        0,
        &login_body(0x2C00, "iggy", "iggy"),
    );
    extra.send_raw(&frame);
    let answer = extra.read().unwrap();
    assert_eq!(read_result(answer.body()).unwrap(), Err(58));
    assert_eq!(node.counters.logins_refused.load(Ordering::Relaxed), 1);
    for c in waiting.iter_mut() {
        let answer = c.read().expect("an answer, not silence");
        assert_eq!(answer.operation(), Operation::Register.byte());
        assert_eq!(read_result(answer.body()).unwrap(), Err(57));
    }
    assert_eq!(
        node.counters.deadline.load(Ordering::Relaxed),
        super::LOGINS_IN_FLIGHT_MAX as u64
    );
}

/// A session this node has not committed yet (above its commit point) is transient (57): a
/// login answered through another replica (decision 153); an unknown one at or below the
/// commit point is refused as no session.
#[test]
fn an_unknown_session_above_the_commit_point_is_transient() {
    let node = Node::start();
    let mut c = node.connect(0);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    let committed = node.reader.sessions().op;
    assert!(committed >= c.session);
    let ahead = request_frame(
        c.client,
        Operation::NonReplicated,
        201,
        committed + 10,
        1,
        &[],
    );
    c.send_raw(&ahead);
    assert_eq!(c.read().unwrap().status(), 57);
    let stale = request_frame(
        c.client + 1,
        Operation::NonReplicated,
        201,
        committed,
        1,
        &[],
    );
    c.send_raw(&stale);
    assert_eq!(c.read().unwrap().status(), 40);
    // A replicated op with an unknown session at or below the commit point: NoSession.
    let stale = request_frame(
        c.client + 1,
        Operation::CreateStream,
        0,
        committed,
        1,
        &name("x"),
    );
    c.send_raw(&stale);
    assert_eq!(c.read().unwrap().reason(), 1);
}

#[test]
fn get_stats_and_cluster_metadata_answer_from_the_node() {
    use crate::client::reply::{ClusterMetadata, Stats};
    let node = Node::start();
    let mut c = node.connect(1);
    // Both need a session (status 40 before login).
    assert_eq!(c.call(Operation::NonReplicated, 12, &[]).status(), 40);
    assert_eq!(c.login("iggy", "iggy").status(), 0);
    let answer = c.call(Operation::CreateStream, 0, &create_stream_body("s"));
    assert_eq!(read_result(answer.body()).unwrap().map(|_| ()), Ok(()));
    let answer = c.call(Operation::NonReplicated, 10, &[]);
    assert_eq!(answer.status(), 0);
    let stats = Stats::decode(answer.body()).unwrap();
    assert_eq!(stats.streams_count, 1);
    assert_eq!(stats.process_id, std::process::id());
    assert_eq!(stats.threads_count, 2);
    assert!(stats.clients_count >= 1);
    // Messages, bytes and segments are the sums of every shard's partition gauges
    // (decision 380).
    for (shard, (messages, bytes, segments)) in [(3, 700, 2), (4, 1100, 5)].into_iter().enumerate()
    {
        let g = &node.partitions[shard];
        g.messages.store(messages, Ordering::Relaxed);
        g.stored_bytes.store(bytes, Ordering::Relaxed);
        g.segments.store(segments, Ordering::Relaxed);
    }
    let stats = Stats::decode(c.call(Operation::NonReplicated, 10, &[]).body()).unwrap();
    assert_eq!(
        (
            stats.messages_count,
            stats.messages_size_bytes,
            stats.segments_count
        ),
        (7, 1800, 7)
    );
    let answer = c.call(Operation::NonReplicated, 12, &[]);
    assert_eq!(answer.status(), 0);
    let roster = ClusterMetadata::decode(answer.body()).unwrap();
    assert_eq!(roster.name, "client-core-test");
    assert_eq!(roster.nodes.len(), 1);
    // The one node is the normal primary (the Gauges the pump publishes): the leader.
    assert_eq!(roster.nodes[0].role, crate::client::answers::ROLE_LEADER);
    assert_eq!(
        roster.nodes[0].status,
        crate::client::answers::STATUS_HEALTHY
    );
}

/// Stream 0, topic 0, group 0 as numeric identifiers (client-plane.md §10).
fn group_target() -> Vec<u8> {
    let mut body = Vec::new();
    for id in [0u32, 0, 0] {
        body.extend_from_slice(&[1, 4]);
        body.extend_from_slice(&id.to_le_bytes());
    }
    body
}

/// SyncConsumerGroup's answer: (generation, partitions), `None` when empty (not a member).
fn sync_group(c: &mut Client) -> Option<(u64, Vec<u32>)> {
    let answer = c.call(Operation::NonReplicated, 606, &group_target());
    assert_eq!(answer.status(), 0);
    let body = answer.body();
    if body.is_empty() {
        return None;
    }
    let n = u32::from_le_bytes(body[8..12].try_into().unwrap()) as usize;
    assert_eq!(body.len(), 12 + 4 * n);
    Some((
        u64::from_le_bytes(body[..8].try_into().unwrap()),
        (0..n)
            .map(|i| u32::from_le_bytes(body[12 + 4 * i..16 + 4 * i].try_into().unwrap()))
            .collect(),
    ))
}

/// A group poll (consumer kind 2, group 0) of `partition`, offset 0.
fn group_poll(c: &mut Client, partition: u32) -> Answer {
    let mut body = vec![2, 1, 4, 0, 0, 0, 0];
    body.extend_from_slice(&[1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0]);
    body.push(1);
    body.extend_from_slice(&partition.to_le_bytes());
    body.push(1);
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&10u32.to_le_bytes());
    body.push(0);
    c.call(Operation::NonReplicated, 100, &body)
}

#[test]
fn consumer_group_members_are_sessions_fenced_by_partition_and_end_with_the_connection() {
    let node = Node::start();
    let mut c = node.connect(1);
    let mut d = node.connect(0);
    for x in [&mut c, &mut d] {
        assert_eq!(x.login("iggy", "iggy").status(), 0);
    }
    let ok = |answer: Answer| {
        assert_eq!(answer.status(), 0);
        read_result(answer.body()).unwrap().unwrap().to_vec()
    };
    ok(c.call(Operation::CreateStream, 0, &create_stream_body("s")));
    ok(c.call(Operation::CreateTopic, 0, &create_topic_body(0, 2, "t")));
    let mut create = vec![1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0];
    create.extend_from_slice(&name("g"));
    let details = ok(c.call(Operation::CreateConsumerGroup, 0, &create));
    assert_eq!(&details[..12], [0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);

    // GetTopics (301): u32 count, then the topic records.
    let topics = c.call(Operation::NonReplicated, 301, &[1, 4, 0, 0, 0, 0]);
    assert_eq!(topics.status(), 0);
    assert_eq!(&topics.body()[..4], &1u32.to_le_bytes());

    assert_eq!(sync_group(&mut c), None);
    assert_eq!(group_poll(&mut c, 0).status(), 5006, "not a member yet");
    ok(c.call(Operation::JoinConsumerGroup, 0, &group_target()));
    assert_eq!(sync_group(&mut c), Some((1, vec![0, 1])));
    ok(d.call(Operation::JoinConsumerGroup, 0, &group_target()));
    assert_eq!(sync_group(&mut c), Some((2, vec![0])));
    assert_eq!(sync_group(&mut d), Some((2, vec![1])));
    // A member polling a partition of another member is fenced with 5009.
    assert_eq!(group_poll(&mut c, 1).status(), 5009);
    assert_eq!(group_poll(&mut c, 0).status(), 0);
    // GetConsumerGroup (600) on every shard: two members.
    let got = c.call(Operation::NonReplicated, 600, &group_target());
    assert_eq!(&got.body()[8..12], &2u32.to_le_bytes());

    // d's connection closes without a Leave: the node proposes its session's Logout, and
    // the group rebalances to c alone.
    drop(d);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sync_group(&mut c) != Some((3, vec![0, 1])) {
        assert!(
            std::time::Instant::now() < deadline,
            "d's membership outlived its connection"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        node.counters.group_sessions_ended.load(Ordering::Relaxed),
        1
    );
    // Leave, then a second Leave is a committed 5006.
    ok(c.call(Operation::LeaveConsumerGroup, 0, &group_target()));
    let again = c.call(Operation::LeaveConsumerGroup, 0, &group_target());
    assert_eq!(read_result(again.body()).unwrap(), Err(5006));
    let got = c.call(Operation::NonReplicated, 600, &group_target());
    assert_eq!(&got.body()[8..12], &0u32.to_le_bytes());
    ok(c.call(Operation::DeleteConsumerGroup, 0, &group_target()));
    assert!(
        c.call(Operation::NonReplicated, 600, &group_target())
            .body()
            .is_empty()
    );
}
mod users;

#[test]
fn a_request_body_is_read_into_a_buffer_with_a_header_of_room() {
    // Decision 460: the core turns a SendMessages body into its prepare in this allocation
    // only when a header's room is spare; without it every batch is copied again.
    for len in [0, 1, 1000, 1 << 20] {
        let body = super::conn::body_buffer(len);
        assert_eq!(body.len(), len);
        assert!(body.capacity() >= len + HEADER_SIZE, "len {len}");
        assert!(body.iter().all(|b| *b == 0));
    }
}
