//! The replica plane over loopback TCP: real glommio executors, one per shard, each node a set
//! of threads in this process, ports picked by binding to port 0.
//!
//! Waits are bounded by [`WAIT`], a liveness bound for a loaded machine, never a timing claim.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcp};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::channels::shared_channel;
use glommio::net::TcpListener;
use glommio::timer::Timer;
use glommio::{ExecutorJoinHandle, GlommioError, LocalExecutorBuilder, Placement, ResourceType};
use shard::net::counters::{Closed, Dropped, Handshake, SendDrop};
use shard::net::plane::{Handed, NodeShared, SendError};
use shard::net::tls::TlsConfig;
use shard::net::{Counters, NetConfig, Origin, Peer, Plane, Sink};

fn shard_of_lane(lane: u8, shards: usize) -> usize {
    usize::from(shard::mapping::shard_of_lane(lane, shards as u16))
}
use wire::encode::{Sender, finish_header};
use wire::handshake::{Keys, NO_NONCE, hello_frame};
use wire::header::{CommitHeader, FrameHeader, Layout, PrepareHeader, RoutedRequestHeader};
use wire::{Command, GroupId, Message, Operation, cluster_id};

const WAIT: Duration = Duration::from_secs(30);
const CLUSTER: &str = "strand-test";
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const OTHER_SECRET: &[u8] = b"fedcba9876543210fedcba9876543210";

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[derive(Debug, Clone)]
struct Got {
    shard: usize,
    origin: Origin,
    frame: Vec<u8>,
    /// The shard loop's turns when the frame was delivered.
    turns: u64,
}

type Configure = Arc<dyn Fn(&mut NetConfig) + Send + Sync>;

fn plain() -> Configure {
    Arc::new(|_| {})
}

/// What the test thread and a node's executors share.
#[derive(Default)]
struct Control {
    addr: Mutex<Option<SocketAddr>>,
    roster: Mutex<Option<Vec<Peer>>>,
    outbox: Mutex<Vec<(u8, u8, Bytes)>>,
    sent: Mutex<Vec<Result<(), SendError>>>,
    received: Mutex<Vec<Got>>,
    /// `(origin, up)` in the order the sinks saw them.
    events: Mutex<Vec<(Origin, bool)>>,
    connections: Mutex<HashMap<usize, Vec<(u8, u8)>>>,
    /// Frames `Plane::drain` reported dropped when the node stopped with `drain` set.
    drained_left: Mutex<Option<usize>>,
    drain: AtomicBool,
    counters: Mutex<Vec<Arc<Counters>>>,
    node: Mutex<Option<NodeShared>>,
    /// Keep only each frame's header (throughput runs).
    headers_only: AtomicBool,
    /// Microseconds the sink works (spins) on each frame: a busy node.
    work_per_frame_us: AtomicU64,
    /// Turns of the shards' own loops (each waits on a timer, so each turn needs the
    /// executor to look at its rings).
    turns: AtomicU64,
    stop: AtomicBool,
}

struct Collect {
    shard: usize,
    control: Arc<Control>,
}

impl Sink for Collect {
    fn frame(&self, origin: Origin, message: &Message<'_>, frame: &[u8]) {
        assert_eq!(message.header_bytes(), &frame[..256]);
        let kept = if self.control.headers_only.load(Ordering::Relaxed) {
            &frame[..256]
        } else {
            frame
        };
        let work = Duration::from_micros(self.control.work_per_frame_us.load(Ordering::Relaxed));
        let started = Instant::now();
        while started.elapsed() < work {
            std::hint::spin_loop();
        }
        self.control.received.lock().unwrap().push(Got {
            shard: self.shard,
            origin,
            frame: kept.to_vec(),
            turns: self.control.turns.load(Ordering::SeqCst),
        });
    }

    fn connected(&self, origin: Origin) {
        self.control.events.lock().unwrap().push((origin, true));
    }

    fn disconnected(&self, origin: Origin) {
        self.control.events.lock().unwrap().push((origin, false));
    }
}

struct Node {
    id: u8,
    control: Arc<Control>,
    handles: Vec<ExecutorJoinHandle<()>>,
}

impl Node {
    fn launch(id: u8, shards: usize, bind: SocketAddr, configure: Configure) -> Node {
        let control = Arc::new(Control::default());
        let node = NodeShared::default();
        *control.node.lock().unwrap() = Some(node.clone());
        let mut senders = Vec::new();
        let mut receivers: Vec<Option<_>> = vec![None];
        for _ in 1..shards {
            let (tx, rx) = shared_channel::new_bounded::<Handed>(64);
            senders.push(tx);
            receivers.push(Some(rx));
        }
        let mut senders = Some(senders);
        let mut handles = Vec::new();
        for (shard, receiver) in receivers.into_iter().enumerate() {
            let control = control.clone();
            let configure = configure.clone();
            let node = node.clone();
            let senders = if shard == 0 { senders.take() } else { None };
            let handle = LocalExecutorBuilder::new(Placement::Unbound)
                .name(&format!("n{id}s{shard}"))
                .spawn(move || {
                    run_shard(
                        id, shard, shards, bind, control, configure, node, senders, receiver,
                    )
                })
                .expect("executor");
            handles.push(handle);
        }
        Node {
            id,
            control,
            handles,
        }
    }

    fn addr(&self) -> SocketAddr {
        let mut addr = None;
        eventually("a listening address", || {
            addr = *self.control.addr.lock().unwrap();
            addr.is_some()
        });
        addr.unwrap()
    }

    fn set_roster(&self, roster: &[Peer]) {
        *self.control.roster.lock().unwrap() = Some(roster.to_vec());
    }

    fn send(&self, peer: u8, lane: u8, frame: Bytes) {
        self.control
            .outbox
            .lock()
            .unwrap()
            .push((peer, lane, frame));
    }

    /// Queues `frames` in one step: the node sends them all within one turn of its loop.
    fn send_all(&self, frames: impl IntoIterator<Item = (u8, u8, Bytes)>) {
        self.control.outbox.lock().unwrap().extend(frames);
    }

    fn outbox_empty(&self) -> bool {
        self.control.outbox.lock().unwrap().is_empty()
    }

    fn received(&self) -> Vec<Got> {
        self.control.received.lock().unwrap().clone()
    }

    fn connections(&self) -> Vec<(u8, u8)> {
        let mut all: Vec<_> = self
            .control
            .connections
            .lock()
            .unwrap()
            .values()
            .flatten()
            .copied()
            .collect();
        all.sort_unstable();
        all
    }

    fn shard_connections(&self, shard: usize) -> Vec<(u8, u8)> {
        self.control
            .connections
            .lock()
            .unwrap()
            .get(&shard)
            .cloned()
            .unwrap_or_default()
    }

    /// Sums `read` over this node's shards.
    fn count(&self, read: impl Fn(&Counters) -> u64) -> u64 {
        self.control
            .counters
            .lock()
            .unwrap()
            .iter()
            .map(|c| read(c))
            .sum()
    }

    fn stop(self) {
        self.control.stop.store(true, Ordering::SeqCst);
        for handle in self.handles {
            handle.join().expect("executor ends");
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_shard(
    id: u8,
    shard: usize,
    shards: usize,
    bind: SocketAddr,
    control: Arc<Control>,
    configure: Configure,
    node: NodeShared,
    senders: Option<Vec<shared_channel::SharedSender<Handed>>>,
    receiver: Option<shared_channel::SharedReceiver<Handed>>,
) {
    let listener = (shard == 0).then(|| {
        let listener = TcpListener::bind(bind).expect("bind");
        *control.addr.lock().unwrap() = Some(listener.local_addr().unwrap());
        listener
    });
    let roster = loop {
        if let Some(roster) = control.roster.lock().unwrap().clone() {
            break roster;
        }
        Timer::new(Duration::from_millis(5)).await;
    };
    let mut config = NetConfig::new(cluster_id(CLUSTER), id, roster);
    configure(&mut config);
    config.validate(shards).expect("valid config");
    let sink = Rc::new(Collect {
        shard,
        control: control.clone(),
    });
    let plane = Plane::new(Arc::new(config), shard, shards, node, sink);
    control
        .counters
        .lock()
        .unwrap()
        .push(plane.counters().clone());
    if let Some(senders) = senders {
        let mut connected = Vec::new();
        for sender in senders {
            connected.push(sender.connect().await);
        }
        plane.set_handoff(Box::new(move |target, handed| {
            connected[target - 1]
                .try_send(handed)
                .map_err(|error| match error {
                    GlommioError::WouldBlock(ResourceType::Channel(handed))
                    | GlommioError::Closed(ResourceType::Channel(handed)) => handed,
                    other => panic!("handoff channel: {other}"),
                })
        }));
    }
    if let Some(receiver) = receiver {
        let receiver = receiver.connect().await;
        let plane = plane.clone();
        glommio::spawn_local(async move {
            while let Some(handed) = receiver.recv().await {
                plane.adopt(handed);
            }
        })
        .detach();
    }
    if let Some(listener) = listener {
        plane.serve(listener);
    }
    plane.start_connector();
    loop {
        let mine: Vec<_> = {
            let mut outbox = control.outbox.lock().unwrap();
            let (mine, rest) = outbox
                .drain(..)
                .partition(|(_, lane, _)| shard_of_lane(*lane, shards) == shard);
            *outbox = rest;
            mine
        };
        for (peer, lane, frame) in mine {
            let result = plane.send_lane(peer, lane, &frame);
            control.sent.lock().unwrap().push(result);
        }
        control
            .connections
            .lock()
            .unwrap()
            .insert(shard, plane.connections());
        if control.stop.load(Ordering::SeqCst) {
            if control.drain.load(Ordering::SeqCst) {
                let left = plane.drain(WAIT).await;
                *control.drained_left.lock().unwrap() = Some(left);
            } else {
                plane.shutdown();
            }
            break;
        }
        Timer::new(Duration::from_millis(5)).await;
        control.turns.fetch_add(1, Ordering::SeqCst);
    }
    // Let the writers shut their sockets down.
    Timer::new(Duration::from_millis(50)).await;
}

fn roster(addrs: &[SocketAddr]) -> Vec<Peer> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| Peer {
            id: i as u8,
            name: format!("node-{i}"),
            addr: *addr,
        })
        .collect()
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An address nothing listens on (a port bound and released).
fn dead_addr() -> SocketAddr {
    std::net::TcpListener::bind(any_port())
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Launches one node per `(shards, configure)`; `None` is a roster member that never runs.
fn cluster(specs: Vec<Option<(usize, Configure)>>) -> (Vec<Option<Node>>, Vec<Peer>) {
    let nodes: Vec<Option<Node>> = specs
        .into_iter()
        .enumerate()
        .map(|(id, spec)| spec.map(|(shards, c)| Node::launch(id as u8, shards, any_port(), c)))
        .collect();
    let addrs: Vec<SocketAddr> = nodes
        .iter()
        .map(|n| n.as_ref().map_or_else(dead_addr, Node::addr))
        .collect();
    let roster = roster(&addrs);
    for node in nodes.iter().flatten() {
        node.set_roster(&roster);
    }
    (nodes, roster)
}

fn commit(from: u8, group: GroupId, op: u64) -> Bytes {
    let mut header = CommitHeader::zeroed();
    header.frame = FrameHeader::new(
        Command::Commit,
        Sender {
            cluster: cluster_id(CLUSTER),
            replica: from,
            view: 1,
        },
    );
    header.commit.set(op);
    header.group.set(group.0);
    finish_header(&mut header, &[]).unwrap();
    Bytes::copy_from_slice(header.bytes())
}

fn prepare(from: u8, op: u64, body: &[u8]) -> Bytes {
    let mut header = PrepareHeader::zeroed();
    header.frame = FrameHeader::new(
        Command::Prepare,
        Sender {
            cluster: cluster_id(CLUSTER),
            replica: from,
            view: 1,
        },
    );
    header.op.set(op);
    header.operation = Operation::CreateStream.byte();
    header.group.set(GroupId::METADATA.0);
    finish_header(&mut header, body).unwrap();
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(body);
    Bytes::from(frame)
}

fn commit_op(frame: &[u8]) -> u64 {
    u64::from_le_bytes(frame[152..160].try_into().unwrap())
}

fn every_lane(node: &Node, peers: &[u8], lanes: u8) {
    let mut want: Vec<(u8, u8)> = peers
        .iter()
        .flat_map(|&p| (0..lanes).map(move |l| (p, l)))
        .collect();
    want.sort_unstable();
    eventually(&format!("node {} on every lane", node.id), || {
        node.connections() == want
    });
}

#[test]
fn three_nodes_exchange_sealed_frames_on_every_lane() {
    let (nodes, _) = cluster(vec![
        Some((1, plain())),
        Some((1, plain())),
        Some((1, plain())),
    ]);
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    every_lane(&nodes[0], &[1, 2], 16);
    every_lane(&nodes[1], &[0, 2], 16);
    every_lane(&nodes[2], &[0, 1], 16);
    // The sink heard every connection come up, once per (peer, lane): the pumps' connection
    // reports start from it (a plane that never reports `connected` leaves every peer down in
    // the core, which then skips them in chain replication).
    for node in &nodes {
        let mut up: Vec<(u8, u8)> = node
            .control
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, connected)| *connected)
            .map(|(o, _)| (o.peer, o.lane))
            .collect();
        up.sort_unstable();
        assert_eq!(up, node.connections(), "node {} connected reports", node.id);
    }
    let body = vec![0x5a; 70_000];
    for node in &nodes {
        for peer in nodes.iter().filter(|p| p.id != node.id) {
            for lane in 0..16u8 {
                let op = u64::from(node.id) * 1000 + u64::from(lane);
                node.send(peer.id, lane, commit(node.id, GroupId(u64::from(lane)), op));
            }
            node.send(peer.id, 3, prepare(node.id, 7, &body));
        }
    }
    for node in &nodes {
        eventually("every frame delivered", || node.received().len() == 2 * 17);
        for got in node.received() {
            assert_ne!(got.origin.peer, node.id);
            if got.frame[60] == Command::Commit.byte() {
                let op = commit_op(&got.frame);
                assert_eq!(op / 1000, u64::from(got.origin.peer));
                assert_eq!(op % 1000, u64::from(got.origin.lane), "frame on its lane");
                assert_eq!(got.frame, commit(got.origin.peer, GroupId(op % 1000), op));
            } else {
                assert_eq!(got.frame, prepare(got.origin.peer, 7, &body));
                assert_eq!(got.origin.lane, 3);
            }
        }
        assert_eq!(node.count(|c| Counters::read(&c.frames_out)), 2 * 17);
        assert_eq!(node.count(|c| Counters::read(&c.frames_in)), 2 * 17);
        for reason in Dropped::ALL {
            assert_eq!(node.count(|c| c.dropped_count(*reason)), 0, "{reason:?}");
        }
    }
    // Lower ids dialled, higher ids accepted.
    assert_eq!(
        nodes[0].count(|c| Counters::read(&c.established_outbound)),
        32
    );
    assert_eq!(
        nodes[2].count(|c| Counters::read(&c.established_inbound)),
        32
    );
    nodes.into_iter().for_each(Node::stop);
}

#[test]
fn queue_overruns_are_counted_and_batches_are_vectored() {
    let small_batches: Configure = Arc::new(|c| {
        c.max_batch = 100;
        c.peer_queue_capacity = 256;
    });
    let (nodes, _) = cluster(vec![Some((1, small_batches)), Some((1, plain()))]);
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    every_lane(&nodes[0], &[1], 16);
    // Pushed within one turn of the node's loop, before its writer runs: the queue takes 256,
    // 44 overrun, and the writer drains 100 + 100 + 56.
    nodes[0].send_all((0..300).map(|op| (1, 5, commit(0, GroupId(5), op))));
    eventually("256 frames delivered", || nodes[1].received().len() == 256);
    let sent = nodes[0].control.sent.lock().unwrap().clone();
    assert_eq!(sent.iter().filter(|r| r.is_ok()).count(), 256);
    assert_eq!(
        sent.iter()
            .filter(|r| **r == Err(SendError::QueueFull))
            .count(),
        44
    );
    assert_eq!(
        nodes[0].count(|c| c.send_drop_count(SendDrop::QueueFull)),
        44
    );
    assert_eq!(nodes[0].count(|c| Counters::read(&c.batches_out)), 3);
    let ops: Vec<u64> = nodes[1]
        .received()
        .iter()
        .map(|g| commit_op(&g.frame))
        .collect();
    assert_eq!(
        ops,
        (0..256).collect::<Vec<_>>(),
        "in order, first come first queued"
    );
    nodes.into_iter().for_each(Node::stop);
}

/// Opens a raw connection to `addr` that says ReplicaHello as `replica` on `lane`, auth off.
fn raw_peer(addr: SocketAddr, replica: u8, lane: u8) -> StdTcp {
    let mut stream = StdTcp::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
        .write_all(&hello_frame(cluster_id(CLUSTER), replica, &NO_NONCE, lane))
        .unwrap();
    stream
}

/// Whether the node closed the raw connection (EOF or reset, never a timeout).
fn closed_by_node(stream: &mut StdTcp) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) => panic!("raw peer read: {e}"),
        }
    }
}

#[test]
fn garbage_oversize_and_command_byte_close_only_that_connection() {
    // Replica 1 is a roster member that never runs: the raw connections pose as it.
    let (nodes, _) = cluster(vec![Some((1, plain())), None, Some((1, plain()))]);
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    let (zero, two) = (&nodes[0], &nodes[1]);
    every_lane(zero, &[2], 16);
    let addr = two.addr();

    let mut oversized = [0u8; 256];
    oversized[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut command = *commit(1, GroupId(0), 1).first_chunk::<256>().unwrap();
    command[60] = 31;
    let garbage = [0x5au8; 512];
    let mut small = [0u8; 256];
    small[48..52].copy_from_slice(&100u32.to_le_bytes());
    let cases: [(&[u8], Closed); 4] = [
        (&garbage, Closed::SizeTooLarge),
        (&oversized, Closed::SizeTooLarge),
        (&command, Closed::CommandByte),
        (&small, Closed::SizeTooSmall),
    ];
    for (lane, (bytes, reason)) in cases.iter().enumerate() {
        let before = two.count(|c| c.closed_count(*reason));
        let mut raw = raw_peer(addr, 1, lane as u8);
        eventually("the raw peer registered", || {
            two.connections().contains(&(1, lane as u8))
        });
        raw.write_all(bytes).unwrap();
        assert!(closed_by_node(&mut raw), "{reason:?}");
        eventually("the close counted", || {
            two.count(|c| c.closed_count(*reason)) == before + 1
        });
    }
    // Nothing else closed: every lane between the real nodes still carries frames.
    assert_eq!(two.count(|c| Counters::read(&c.frames_in)), 0);
    for lane in 0..16u8 {
        zero.send(
            2,
            lane,
            commit(0, GroupId(u64::from(lane)), u64::from(lane)),
        );
    }
    eventually("frames after the attacks", || two.received().len() == 16);
    assert!(two.received().iter().all(|g| g.origin.peer == 0));
    assert_eq!(zero.count(|c| Counters::read(&c.established_outbound)), 16);
    assert_eq!(two.count(|c| c.closed_count(Closed::Eof)), 0);
    nodes.into_iter().for_each(Node::stop);
}

#[test]
fn a_client_request_on_the_replica_port_is_dropped_and_the_connection_kept() {
    let (nodes, _) = cluster(vec![None, Some((1, plain()))]);
    let one = nodes.into_iter().flatten().next().unwrap();
    let mut raw = raw_peer(one.addr(), 0, 2);
    eventually("the raw peer registered", || one.connections() == [(0, 2)]);
    let mut request = RoutedRequestHeader::zeroed();
    request.frame = FrameHeader::new(
        Command::Request,
        Sender {
            cluster: cluster_id(CLUSTER),
            replica: 0,
            view: 0,
        },
    );
    request.client.set(7);
    request.session.set(1);
    request.request.set(1);
    request.operation = Operation::CreateStream.byte();
    request.group.set(GroupId::METADATA.0);
    finish_header(&mut request, &[]).unwrap();
    raw.write_all(request.bytes()).unwrap();
    // A flipped byte under the seal: dropped, connection kept.
    let mut broken = commit(0, GroupId(0), 5).to_vec();
    broken[200] ^= 1;
    raw.write_all(&broken).unwrap();
    raw.write_all(&commit(0, GroupId(0), 9)).unwrap();
    eventually("the sealed commit after them", || one.received().len() == 1);
    assert_eq!(commit_op(&one.received()[0].frame), 9);
    assert_eq!(one.count(|c| c.dropped_count(Dropped::ClientRequest)), 1);
    assert_eq!(one.count(|c| c.dropped_count(Dropped::Seal)), 1);
    assert_eq!(one.connections(), [(0, 2)]);
    one.stop();
}

/// A peer that keeps the socket full does not hold the shard (decision 502): while a stream
/// of large prepares lasts, longer than many turns of the shard's own loop, that loop keeps
/// turning. Each frame costs the sink a millisecond of work, so the peer's writes stay ahead
/// of the reads and every read finds bytes waiting; a reader that never suspends would let
/// the loop turn only after the last frame.
#[test]
fn a_peer_that_keeps_the_socket_full_does_not_hold_the_shard() {
    const FRAMES: u64 = 160;
    let (nodes, _) = cluster(vec![None, Some((1, plain()))]);
    let one = nodes.into_iter().flatten().next().unwrap();
    one.control.headers_only.store(true, Ordering::SeqCst);
    one.control.work_per_frame_us.store(1_000, Ordering::SeqCst);
    let mut raw = raw_peer(one.addr(), 0, 3);
    eventually("the raw peer registered", || one.connections() == [(0, 3)]);
    let body = vec![0x5a; 256 * 1024];
    let frames: Vec<Bytes> = (1..=FRAMES).map(|op| prepare(0, op, &body)).collect();
    let writer = std::thread::spawn(move || {
        for frame in &frames {
            raw.write_all(frame).unwrap();
        }
        raw
    });
    eventually("every frame delivered", || {
        one.received().len() == FRAMES as usize
    });
    let _raw = writer.join().unwrap();
    let got = one.received();
    let turned = got.last().unwrap().turns - got.first().unwrap().turns;
    // At least 160 ms of the sink's work, one turn per 5 ms timer: about 30 turns.
    assert!(
        turned >= 5,
        "the shard's loop turned {turned} times while {FRAMES} frames were read"
    );
    one.stop();
}

/// Node 0 dials node 1 with `dialer`'s settings, node 1 accepts with `acceptor`'s; node 0
/// keeps sending on every lane. Returns both after node 1 counted `attempts` refusals for
/// `refusal`, having checked that node 1 never delivered a frame.
fn never_delivered(dialer: Configure, acceptor: Configure, refusal: Handshake) {
    let (nodes, _) = cluster(vec![Some((1, dialer)), Some((1, acceptor))]);
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    let (zero, one) = (&nodes[0], &nodes[1]);
    let mut op = 0;
    // Two full sweeps of refusals, with frames offered on every lane all along.
    eventually("32 refused handshakes", || {
        if zero.outbox_empty() {
            for lane in 0..16 {
                op += 1;
                zero.send(1, lane, commit(0, GroupId(0), op));
            }
        }
        assert!(
            one.received().is_empty(),
            "a refused peer got a frame delivered"
        );
        one.count(|c| c.handshake_count(refusal)) >= 32
    });
    assert!(
        one.received().is_empty(),
        "a refused peer got a frame delivered"
    );
    assert_eq!(one.count(|c| Counters::read(&c.frames_in)), 0);
    assert!(one.connections().is_empty());
    nodes.into_iter().for_each(Node::stop);
}

fn auth(secret: &'static [u8], previous: Option<&'static [u8]>) -> Configure {
    Arc::new(move |c| c.auth = Some(Keys::new(secret, previous).unwrap()))
}

fn tls_auth(secret: &'static [u8]) -> Configure {
    Arc::new(move |c| {
        c.auth = Some(Keys::new(secret, None).unwrap());
        let name = c.roster[usize::from(c.self_id)].name.clone();
        c.tls = Some(Arc::new(TlsConfig::self_signed(&name).unwrap()));
    })
}

#[test]
fn wrong_cluster_never_gets_a_frame_delivered() {
    let other: Configure = Arc::new(|c| c.cluster = cluster_id("another-cluster"));
    never_delivered(other, plain(), Handshake::ClusterMismatch);
}

#[test]
fn wrong_secret_never_gets_a_frame_delivered() {
    // The dialer refuses the acceptor's MAC first; the acceptor sees the connection end.
    never_delivered(auth(OTHER_SECRET, None), auth(SECRET, None), Handshake::Io);
}

#[test]
fn no_tls_when_tls_is_on_never_gets_a_frame_delivered() {
    never_delivered(auth(SECRET, None), tls_auth(SECRET), Handshake::Tls);
}

#[test]
fn auth_off_dialer_is_refused_by_an_auth_on_acceptor() {
    never_delivered(plain(), auth(SECRET, None), Handshake::AuthRequired);
}

fn exchange(dialer: Configure, acceptor: Configure) {
    exchange_on(dialer, acceptor, 1);
}

/// Node 0 (one shard) dials node 1 (`acceptor_shards` shards); frames cross every lane both
/// ways, and a 200 KB prepare crosses lane 9.
fn exchange_on(dialer: Configure, acceptor: Configure, acceptor_shards: usize) {
    let (nodes, _) = cluster(vec![Some((1, dialer)), Some((acceptor_shards, acceptor))]);
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    every_lane(&nodes[0], &[1], 16);
    every_lane(&nodes[1], &[0], 16);
    let body = vec![7u8; 200_000];
    for lane in 0..16 {
        nodes[0].send(1, lane, commit(0, GroupId(0), u64::from(lane)));
        nodes[1].send(0, lane, commit(1, GroupId(0), 100 + u64::from(lane)));
    }
    nodes[0].send(1, 9, prepare(0, 3, &body));
    eventually("frames both ways", || {
        nodes[0].received().len() == 16 && nodes[1].received().len() == 17
    });
    assert!(
        nodes[1]
            .received()
            .iter()
            .any(|g| g.frame == prepare(0, 3, &body))
    );
    nodes.into_iter().for_each(Node::stop);
}

#[test]
fn authenticated_tls_self_signed_exchanges_frames() {
    exchange(tls_auth(SECRET), tls_auth(SECRET));
}

#[test]
fn tls_sessions_move_with_their_connection_to_another_shard() {
    exchange_on(tls_auth(SECRET), tls_auth(SECRET), 2);
}

#[test]
fn rotation_window_connects_both_ways() {
    exchange(
        auth(OTHER_SECRET, Some(SECRET)),
        auth(SECRET, Some(OTHER_SECRET)),
    );
}

#[test]
fn reconnects_after_the_peer_restarts() {
    let (nodes, roster) = cluster(vec![Some((1, plain())), Some((1, plain()))]);
    let mut nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    every_lane(&nodes[0], &[1], 16);
    nodes.pop().unwrap().stop();
    eventually("the dialer saw every lane close", || {
        nodes[0].connections().is_empty()
    });
    let one = Node::launch(1, 1, roster[1].addr, plain());
    one.set_roster(&roster);
    every_lane(&nodes[0], &[1], 16);
    every_lane(&one, &[0], 16);
    nodes[0].send(1, 4, commit(0, GroupId(0), 44));
    eventually("a frame on the new connection", || {
        one.received().len() == 1
    });
    assert!(nodes[0].count(|c| Counters::read(&c.established_outbound)) >= 32);
    one.stop();
    nodes.into_iter().for_each(Node::stop);
}

#[test]
fn accepted_connections_move_to_the_shard_owning_their_lane() {
    let (nodes, _) = cluster(vec![Some((1, plain())), Some((2, plain()))]);
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    let (zero, one) = (&nodes[0], &nodes[1]);
    every_lane(zero, &[1], 16);
    every_lane(one, &[0], 16);
    // Shard 0 accepted all sixteen and handed the odd lanes to shard 1.
    let even: Vec<(u8, u8)> = (0..16).step_by(2).map(|l| (0, l)).collect();
    let odd: Vec<(u8, u8)> = (1..16).step_by(2).map(|l| (0, l)).collect();
    assert_eq!(one.shard_connections(0), even);
    assert_eq!(one.shard_connections(1), odd);
    let counters = one.control.counters.lock().unwrap().clone();
    let by_shard = |read: fn(&Counters) -> u64| -> Vec<u64> {
        let mut v: Vec<u64> = counters.iter().map(|c| read(c)).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(by_shard(|c| Counters::read(&c.handed_off)), [0, 8]);
    assert_eq!(by_shard(|c| Counters::read(&c.adopted)), [0, 8]);
    // Frames are read on the owning shard, and the adopting shard writes on its lanes.
    for lane in 0..16 {
        zero.send(1, lane, commit(0, GroupId(0), u64::from(lane)));
        one.send(0, lane, commit(1, GroupId(0), 100 + u64::from(lane)));
    }
    eventually("frames both ways", || {
        zero.received().len() == 16 && one.received().len() == 16
    });
    for got in one.received() {
        assert_eq!(got.shard, shard_of_lane(got.origin.lane, 2));
    }
    let lanes: Vec<u8> = {
        let mut l: Vec<u8> = zero.received().iter().map(|g| g.origin.lane).collect();
        l.sort_unstable();
        l
    };
    assert_eq!(lanes, (0..16).collect::<Vec<_>>());
    nodes.into_iter().for_each(Node::stop);
}

#[test]
fn silent_connections_time_out_and_handshakes_are_capped() {
    let short_grace: Configure = Arc::new(|c| c.handshake_grace = Duration::from_millis(300));
    let (nodes, _) = cluster(vec![None, Some((1, short_grace))]);
    let one = nodes.into_iter().flatten().next().unwrap();
    let mut silent = StdTcp::connect(one.addr()).unwrap();
    silent.set_read_timeout(Some(WAIT)).unwrap();
    assert!(closed_by_node(&mut silent));
    eventually("the timeout counted", || {
        one.count(|c| c.handshake_count(Handshake::Timeout)) == 1
    });
    one.stop();

    let long_grace: Configure = Arc::new(|c| c.handshake_grace = Duration::from_secs(60));
    let (nodes, _) = cluster(vec![None, Some((1, long_grace))]);
    let one = nodes.into_iter().flatten().next().unwrap();
    let in_flight = one.control.node.lock().unwrap().clone().unwrap();
    let mut held = Vec::new();
    for _ in 0..256 {
        held.push(StdTcp::connect(one.addr()).unwrap());
    }
    eventually("256 handshakes in flight", || {
        in_flight.handshakes_in_flight() == 256
    });
    let mut refused = StdTcp::connect(one.addr()).unwrap();
    refused.set_read_timeout(Some(WAIT)).unwrap();
    assert!(closed_by_node(&mut refused));
    assert_eq!(one.count(|c| c.handshake_count(Handshake::CapFull)), 1);
    assert_eq!(in_flight.handshakes_in_flight(), 256);
    assert_eq!(one.count(|c| c.handshake_count(Handshake::Timeout)), 0);
    // Closing them frees every slot.
    drop(held);
    eventually("slots released", || in_flight.handshakes_in_flight() == 0);
    one.stop();
}

#[test]
fn a_second_connection_on_a_lane_and_a_lane_beyond_the_count_are_closed() {
    let (nodes, _) = cluster(vec![None, Some((1, plain()))]);
    let one = nodes.into_iter().flatten().next().unwrap();
    let _first = raw_peer(one.addr(), 0, 6);
    eventually("the first registered", || one.connections() == [(0, 6)]);
    let mut second = raw_peer(one.addr(), 0, 6);
    assert!(closed_by_node(&mut second));
    assert_eq!(one.count(|c| c.closed_count(Closed::Duplicate)), 1);
    let mut beyond = raw_peer(one.addr(), 0, 16);
    assert!(closed_by_node(&mut beyond));
    eventually("the lane refusal counted", || {
        one.count(|c| c.handshake_count(Handshake::LaneOutOfRange)) == 1
    });
    assert_eq!(one.connections(), [(0, 6)]);
    one.stop();
}

/// A CA, and for each roster name a certificate it signed, as PEM files in a fresh directory.
struct Pki {
    dir: std::path::PathBuf,
}

impl Pki {
    fn new(tag: &str, names: &[&str]) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let dir = std::env::temp_dir().join(format!("strand-pki-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        for name in names {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec![name.to_string()])
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        Pki { dir }
    }

    /// Auth plus CA-mode TLS: present `own`'s certificate (from `presented`), trust `self`.
    fn configure(&self, presented: &Pki) -> Configure {
        let trusted = self.dir.join("ca.pem");
        let presented = presented.dir.clone();
        Arc::new(move |c| {
            c.auth = Some(Keys::new(SECRET, None).unwrap());
            let name = &c.roster[usize::from(c.self_id)].name;
            let tls = TlsConfig::from_files(
                &presented.join(format!("{name}.pem")),
                &presented.join(format!("{name}.key")),
                &trusted,
            )
            .unwrap();
            c.tls = Some(Arc::new(tls));
        })
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn ca_mode_verifies_roster_names() {
    let pki = Pki::new("good", &["node-0", "node-1"]);
    exchange(pki.configure(&pki), pki.configure(&pki));
}

#[test]
fn ca_mode_refuses_a_certificate_from_another_ca() {
    let pki = Pki::new("trusted", &["node-0", "node-1"]);
    let rogue = Pki::new("rogue", &["node-0", "node-1"]);
    never_delivered(pki.configure(&pki), pki.configure(&rogue), Handshake::Tls);
}

/// Relays the three handshake frames between a dialer and an acceptor, terminating TLS on
/// both sides (a machine in the middle holding valid-looking certificates); counts the
/// finishes it relayed.
fn relay(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
) -> Arc<std::sync::atomic::AtomicUsize> {
    use rustls::pki_types::ServerName;
    use rustls::{ClientConnection, ServerConnection, StreamOwned};
    let finishes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = finishes.clone();
    let tls = TlsConfig::self_signed("relay").unwrap();
    std::thread::spawn(move || {
        for down in listener.incoming() {
            let Ok(down) = down else { return };
            let Ok(up) = StdTcp::connect(upstream) else {
                continue;
            };
            for socket in [&down, &up] {
                socket
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
            }
            let server = ServerConnection::new(tls.server.clone()).unwrap();
            let name = ServerName::try_from("iggy-replica").unwrap();
            let client = ClientConnection::new(tls.client.clone(), name).unwrap();
            let mut down = StreamOwned::new(server, down);
            let mut up = StreamOwned::new(client, up);
            let mut frame = [0u8; 256];
            let relayed = (|| -> std::io::Result<()> {
                down.read_exact(&mut frame)?;
                up.write_all(&frame)?;
                up.read_exact(&mut frame)?;
                down.write_all(&frame)?;
                down.read_exact(&mut frame)?;
                up.write_all(&frame)?;
                Ok(())
            })();
            if relayed.is_ok() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    finishes
}

#[test]
fn a_relay_terminating_tls_on_both_sides_never_connects() {
    let zero = Node::launch(0, 1, any_port(), tls_auth(SECRET));
    let one = Node::launch(1, 1, any_port(), tls_auth(SECRET));
    let listener = std::net::TcpListener::bind(any_port()).unwrap();
    let relay_addr = listener.local_addr().unwrap();
    let finishes = relay(listener, one.addr());
    // Node 0 believes node 1 lives at the relay.
    zero.set_roster(&roster(&[zero.addr(), relay_addr]));
    one.set_roster(&roster(&[zero.addr(), one.addr()]));
    eventually("the dialer refused relayed challenges", || {
        zero.count(|c| c.handshake_count(Handshake::MacMismatch)) >= 16
    });
    assert_eq!(finishes.load(Ordering::SeqCst), 0);
    assert!(one.connections().is_empty());
    assert_eq!(one.count(|c| Counters::read(&c.established_inbound)), 0);
    zero.stop();
    one.stop();
}

/// Replica-plane throughput beside raw loopback TCP in the same run (1 MiB frames, one
/// connection, plaintext). A measurement, not a check: run it with
/// `cargo test -p shard --release --test replica_plane -- --ignored --nocapture throughput`.
#[test]
#[ignore = "measurement; run explicitly in release"]
fn throughput_one_mib_frames_beside_raw_loopback() {
    const FRAMES: usize = 2048;
    const WINDOW: usize = 192;
    let body = vec![0x42u8; (1 << 20) - 256];

    // Baseline: std TCP over loopback, same bytes, 1 MiB writes.
    let listener = std::net::TcpListener::bind(any_port()).unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0usize;
        while total < FRAMES << 20 {
            total += stream.read(&mut buf).unwrap();
        }
    });
    let mut stream = StdTcp::connect(addr).unwrap();
    let frame = prepare(0, 1, &body);
    let start = Instant::now();
    for _ in 0..FRAMES {
        stream.write_all(&frame).unwrap();
    }
    reader.join().unwrap();
    let raw = (FRAMES << 20) as f64 / start.elapsed().as_secs_f64() / 1e6;

    let (nodes, _) = cluster(vec![Some((1, plain())), Some((1, plain()))]);
    let nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    nodes[1].control.headers_only.store(true, Ordering::Relaxed);
    every_lane(&nodes[0], &[1], 16);
    let start = Instant::now();
    let mut sent = 0;
    while sent < FRAMES {
        let received = nodes[1].control.received.lock().unwrap().len();
        let room = (received + WINDOW).saturating_sub(sent).min(FRAMES - sent);
        for _ in 0..room {
            nodes[0].send(1, 0, frame.clone());
        }
        sent += room;
        std::thread::sleep(Duration::from_millis(1));
    }
    eventually("every frame", || nodes[1].received().len() == FRAMES);
    let plane = (FRAMES << 20) as f64 / start.elapsed().as_secs_f64() / 1e6;
    assert_eq!(
        nodes[0].count(|c| c.send_drop_count(SendDrop::QueueFull)),
        0
    );
    let batches = nodes[0].count(|c| Counters::read(&c.batches_out));
    println!(
        "1 MiB frames x {FRAMES}: replica plane {plane:.0} MB/s, raw loopback TCP {raw:.0} MB/s \
         ({:.2}x), {batches} vectored writes",
        plane / raw
    );
    nodes.into_iter().for_each(Node::stop);
}

#[test]
fn drain_hands_every_queued_frame_to_the_peer_before_closing() {
    let (nodes, _) = cluster(vec![Some((1, plain())), Some((1, plain()))]);
    let mut nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    every_lane(&nodes[0], &[1], 16);
    let body = vec![1u8; 128 * 1024];
    let zero = nodes.remove(0);
    // Queued and stopped in the same turn of the node's loop: only drain gets them out.
    zero.send_all((0..200).map(|op| (1, (op % 16) as u8, prepare(0, op + 1, &body))));
    zero.control.drain.store(true, Ordering::SeqCst);
    let control = zero.control.clone();
    zero.stop();
    assert_eq!(*control.drained_left.lock().unwrap(), Some(0));
    assert!(control.sent.lock().unwrap().iter().all(Result::is_ok));
    eventually("every drained frame", || nodes[0].received().len() == 200);
    nodes.into_iter().for_each(Node::stop);
}

#[test]
fn tls_without_the_replica_alpn_is_refused() {
    use rustls::pki_types::ServerName;
    use rustls::{ClientConnection, StreamOwned};
    let (nodes, _) = cluster(vec![None, Some((1, tls_auth(SECRET)))]);
    let one = nodes.into_iter().flatten().next().unwrap();
    let tls = TlsConfig::self_signed("client").unwrap();
    for (alpn, refusal) in [
        (vec![], Handshake::Alpn),
        (vec![b"h2".to_vec()], Handshake::Tls),
    ] {
        let mut client = (*tls.client).clone();
        client.alpn_protocols = alpn;
        let name = ServerName::try_from("iggy-replica").unwrap();
        let connection = ClientConnection::new(Arc::new(client), name).unwrap();
        let socket = StdTcp::connect(one.addr()).unwrap();
        socket.set_read_timeout(Some(WAIT)).unwrap();
        let mut stream = StreamOwned::new(connection, socket);
        let hello = hello_frame(cluster_id(CLUSTER), 0, &[9; 32], 0);
        // The TLS handshake runs inside the first write; the node then closes.
        let _ = stream.write_all(&hello).and_then(|()| stream.flush());
        let mut buf = [0u8; 256];
        assert!(
            !matches!(stream.read(&mut buf), Ok(n) if n > 0),
            "{refusal:?}"
        );
        eventually("the refusal counted", || {
            one.count(|c| c.handshake_count(refusal)) == 1
        });
    }
    assert!(one.connections().is_empty());
    one.stop();
}
