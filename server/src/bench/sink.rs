//! A sink server for the bench client (decision 183): it speaks just enough of the client plane
//! to be a target (Register, GetClusterMetadata, CreateStream, CreateTopic, SendMessages,
//! PollMessages, Ping, Logout) and answers at once, storing nothing but one template batch and
//! a message count per partition. The harness run against it measures the client alone: what
//! the client can offer is an upper bound the cluster's figures are read against.
//!
//! It decodes every request with the server's own decoders (header checks of
//! `wire::decode::decode_request`, bodies with [`Request::decode`]) and verifies sampled
//! batches with `wire::batch::verify` (the first two of each connection, then one in 1024), so
//! a client that frames wrongly fails against it. Polls are answered from the template: the
//! partition's first batch, restamped with the polled offset and the newest origin timestamp.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wire::header::{FrameHeader, Layout, ReplyHeader};
use wire::{Command, HEADER_SIZE, Operation, Sender};

use crate::client::codec::Name;
use crate::client::reply::{
    ClusterMetadata, ClusterNode, LoginReply, PartitionRecord, PollHead, RESULT_OK,
    SendConfirmation, StreamDetails, StreamRecord, TopicDetails, TopicRecord, encode_send_reply,
};
use crate::client::request::{Answer, PROTOCOL_VERSION, Request};
use crate::client::status;

/// One partition's state.
#[derive(Default)]
struct Partition {
    appended: AtomicU64,
    newest_origin: AtomicU64,
    template: Mutex<Option<Arc<Vec<u8>>>>,
}

#[derive(Default)]
struct State {
    streams: AtomicU64,
    sessions: AtomicU64,
    partitions: Mutex<Vec<Arc<Partition>>>,
    /// Batches that failed verification (a client framing bug).
    rejected: AtomicU64,
    /// Refuse this many requests of each connection transiently first (tests).
    refuse_first: u64,
    /// Answer CreateTopic with this operation byte instead of its own (tests).
    create_topic_echo: Option<u8>,
    /// Transient refusals answered.
    refused: AtomicU64,
}

/// A running sink; its threads end with the process (it is a benchmark and test fixture).
pub struct Sink {
    addr: SocketAddr,
    state: Arc<State>,
}

impl Sink {
    /// Binds `addr` (port 0 for any) and serves every connection on its own thread.
    pub fn spawn(addr: &str) -> std::io::Result<Sink> {
        Sink::spawn_refusing(addr, 0)
    }

    /// As [`Sink::spawn`], but each connection's first `refuse_first` requests (Register and
    /// partition requests) are refused transiently first: a Register with the result
    /// `[1][0][57]`, a send or poll with status 58 (client-plane.md §4.1).
    pub fn spawn_refusing(addr: &str, refuse_first: u64) -> std::io::Result<Sink> {
        Sink::spawn_with(addr, refuse_first, None)
    }

    /// As [`Sink::spawn_refusing`], and CreateTopic answered with the operation byte
    /// `create_topic_echo` when given (a node that echoes its server-prepared operation).
    pub fn spawn_with(
        addr: &str,
        refuse_first: u64,
        create_topic_echo: Option<u8>,
    ) -> std::io::Result<Sink> {
        Sink::serve_on(TcpListener::bind(addr)?, refuse_first, create_topic_echo)
    }

    /// As [`Sink::spawn`], with `congestion` set on the listener before it listens, so every
    /// connection it accepts runs under it: `strand bench --sink --tcp-congestion NAME`, the
    /// sink end of a client measured under that control (decision 501).
    pub fn spawn_under(
        addr: SocketAddr,
        congestion: Option<&shard::net::CongestionControl>,
    ) -> std::io::Result<Sink> {
        let listener = shard::net::socket::std_listener(addr, congestion)?;
        Sink::serve_on(listener, 0, None)
    }

    fn serve_on(
        listener: TcpListener,
        refuse_first: u64,
        create_topic_echo: Option<u8>,
    ) -> std::io::Result<Sink> {
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            refuse_first,
            create_topic_echo,
            ..State::default()
        });
        let shared = state.clone();
        std::thread::Builder::new()
            .name("bench-sink".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let state = shared.clone();
                    let _ = std::thread::Builder::new()
                        .name("bench-sink-conn".into())
                        .spawn(move || {
                            let _ = serve(stream, addr, &state);
                        });
                }
            })?;
        Ok(Sink { addr, state })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Batches that failed `wire::batch::verify` so far.
    pub fn rejected(&self) -> u64 {
        self.state.rejected.load(Ordering::Relaxed)
    }

    /// Transient refusals answered so far.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// Messages appended to `partition` so far.
    pub fn appended(&self, partition: u32) -> u64 {
        let parts = self.state.partitions.lock().expect("not poisoned");
        parts
            .get(partition as usize)
            .map_or(0, |p| p.appended.load(Ordering::Relaxed))
    }
}

fn serve(mut stream: TcpStream, addr: SocketAddr, state: &State) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut frame = vec![0u8; HEADER_SIZE];
    let mut out = Vec::new();
    let mut body = Vec::new();
    let mut sends = 0u64;
    let mut refused = 0u64;
    loop {
        frame.resize(HEADER_SIZE, 0);
        match stream.read_exact(&mut frame[..HEADER_SIZE]) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let size = u32::from_le_bytes(frame[48..52].try_into().expect("4 bytes")) as usize;
        if !(HEADER_SIZE..=wire::MAX_MESSAGE_SIZE_DEFAULT).contains(&size) {
            return Ok(());
        }
        frame.resize(size, 0);
        stream.read_exact(&mut frame[HEADER_SIZE..])?;
        let Ok((header, request_body)) =
            wire::decode::decode_request(&frame, wire::MAX_MESSAGE_SIZE_DEFAULT)
        else {
            return Ok(());
        };
        let (client, request_no, op_byte) =
            (header.client.get(), header.request.get(), header.operation);
        let code = u32::from_le_bytes(header.reserved[..4].try_into().expect("4 bytes"));
        let operation = Operation::from_byte(op_byte).expect("decode_request checked it");
        body.clear();
        let status = match Request::decode(operation, code, request_body) {
            Err(e) => match e.answer() {
                Answer::Status(code) => code,
                Answer::Evict(_) => return Ok(()),
            },
            Ok(request) if refused < state.refuse_first => {
                refused += 1;
                state.refused.fetch_add(1, Ordering::Relaxed);
                match request {
                    Request::Register(_) => {
                        body.extend_from_slice(&crate::client::reply::result_rejected(57));
                        0
                    }
                    Request::SendMessages(_) | Request::PollMessages(_) => 58,
                    _ => answer(&request, addr, state, &mut sends, &mut body),
                }
            }
            Ok(request) => answer(&request, addr, state, &mut sends, &mut body),
        };
        out.clear();
        let mut reply = ReplyHeader::zeroed();
        reply.frame = FrameHeader::new(
            Command::Reply,
            Sender {
                cluster: 0,
                replica: 0,
                view: 0,
            },
        );
        reply.client.set(client);
        reply.request.set(request_no);
        reply.operation = match (operation, state.create_topic_echo) {
            (Operation::CreateTopic, Some(echo)) => echo,
            _ => op_byte,
        };
        reply.status.set(status);
        if status != 0 {
            body.clear();
        }
        wire::finish_header(&mut reply, &body).expect("a reply fits");
        out.extend_from_slice(reply.bytes());
        out.extend_from_slice(&body);
        stream.write_all(&out)?;
    }
}

/// The status and body for one decoded request.
fn answer(
    request: &Request<'_>,
    addr: SocketAddr,
    state: &State,
    sends: &mut u64,
    body: &mut Vec<u8>,
) -> u32 {
    let name = |text: &str| Name::new(text).expect("a short name");
    match request {
        Request::Ping | Request::Logout => {}
        Request::Register(_) => LoginReply {
            user_id: 0,
            session: state.sessions.fetch_add(1, Ordering::Relaxed) + 1,
            server_protocol_version: PROTOCOL_VERSION,
            server_version: name("strand-bench-sink"),
        }
        .encode(body),
        Request::GetClusterMetadata => ClusterMetadata {
            name: "strand-bench-sink".into(),
            nodes: vec![ClusterNode {
                name: "sink".into(),
                ip: addr.ip().to_string(),
                tcp: addr.port(),
                quic: 0,
                http: 0,
                websocket: 0,
                role: crate::client::answers::ROLE_LEADER,
                status: crate::client::answers::STATUS_HEALTHY,
            }],
        }
        .encode(body),
        Request::CreateStream { name, .. } => {
            body.extend_from_slice(&RESULT_OK);
            StreamDetails {
                stream: StreamRecord {
                    id: state.streams.fetch_add(1, Ordering::Relaxed) as u32,
                    created_at: 0,
                    topics_count: 0,
                    size_bytes: 0,
                    messages_count: 0,
                    name: name.clone(),
                    options: Default::default(),
                },
                topics: Vec::new(),
            }
            .encode(body);
        }
        Request::CreateTopic(topic) => {
            let mut parts = state.partitions.lock().expect("not poisoned");
            *parts = (0..topic.partitions_count)
                .map(|_| Arc::new(Partition::default()))
                .collect();
            body.extend_from_slice(&RESULT_OK);
            TopicDetails {
                topic: TopicRecord {
                    id: 0,
                    created_at: 0,
                    partitions_count: topic.partitions_count,
                    message_expiry: u64::MAX,
                    compression_algorithm: 1,
                    max_topic_size: u64::MAX,
                    size_bytes: 0,
                    messages_count: 0,
                    name: topic.name.clone(),
                    explicit: Default::default(),
                    derived: Default::default(),
                },
                partitions: (0..topic.partitions_count)
                    .map(|id| PartitionRecord {
                        id,
                        created_at: 0,
                        segments_count: 1,
                        current_offset: 0,
                        size_bytes: 0,
                        messages_count: 0,
                    })
                    .collect(),
            }
            .encode(body);
        }
        Request::SendMessages(send) => {
            let crate::client::codec::Partitioning::Partition(id) = send.partitioning else {
                return status::FEATURE_UNAVAILABLE;
            };
            let Some(part) = partition(state, id) else {
                return status::RESOURCE_NOT_FOUND;
            };
            *sends += 1;
            if (*sends <= 2 || sends.is_multiple_of(1024))
                && wire::batch::verify(send.batch).is_err()
            {
                state.rejected.fetch_add(1, Ordering::Relaxed);
                return status::INVALID_FORMAT;
            }
            let Some(header) = wire::batch::peek(send.batch) else {
                return status::INVALID_FORMAT;
            };
            {
                let mut template = part.template.lock().expect("not poisoned");
                if template.is_none() {
                    *template = Some(Arc::new(send.batch.to_vec()));
                }
            }
            part.newest_origin
                .fetch_max(header.origin_timestamp, Ordering::Relaxed);
            let base = part
                .appended
                .fetch_add(u64::from(header.message_count), Ordering::Relaxed);
            encode_send_reply(
                &[SendConfirmation {
                    stream: 0,
                    topic: 0,
                    partition: id,
                    base_offset: base,
                }],
                body,
            );
        }
        Request::PollMessages(poll) => {
            let id = poll.partition.unwrap_or(0);
            let Some(part) = partition(state, id) else {
                return status::RESOURCE_NOT_FOUND;
            };
            let appended = part.appended.load(Ordering::Relaxed);
            let from = match poll.strategy {
                crate::client::codec::PollingStrategy::Offset(o) => o,
                _ => 0,
            };
            let template = part.template.lock().expect("not poisoned").clone();
            let current = appended.saturating_sub(1);
            match template {
                Some(template) if from < appended => {
                    let count = wire::batch::peek(&template).map_or(0, |h| h.message_count);
                    PollHead {
                        partition_id: id,
                        current_offset: current,
                        messages_count: count,
                    }
                    .encode(body);
                    let at = body.len();
                    body.extend_from_slice(&template);
                    // base_offset at 8, origin_timestamp at 24 (client-plane.md §8.1); the
                    // checksum is left stale: clients do not check it on poll (§8.3).
                    body[at + 8..at + 16].copy_from_slice(&from.to_le_bytes());
                    let origin = part.newest_origin.load(Ordering::Relaxed);
                    body[at + 24..at + 32].copy_from_slice(&origin.to_le_bytes());
                }
                _ => PollHead {
                    partition_id: id,
                    current_offset: current,
                    messages_count: 0,
                }
                .encode(body),
            }
        }
        _ => return status::FEATURE_UNAVAILABLE,
    }
    0
}

fn partition(state: &State, id: u32) -> Option<Arc<Partition>> {
    state
        .partitions
        .lock()
        .expect("not poisoned")
        .get(id as usize)
        .cloned()
}
