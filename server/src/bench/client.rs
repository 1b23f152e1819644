//! The bench's own client over the client plane (client-plane.md §1-§8): blocking, one
//! connection per producer or consumer, lockstep on each connection as the protocol is, so
//! several connections in flight are how the harness pipelines (decision 180).
//!
//! Bodies are encoded and decoded with [`crate::client`]'s codecs. The hot path allocates
//! nothing per message: a producer builds its SendMessages frame once per partition
//! ([`SendFrame`]) and only restamps the batch's `origin_timestamp` and checksum per send; reply
//! bodies land in one buffer per connection that grows to the largest reply and stays.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use wire::header::{FrameHeader, Layout, RequestHeader};
use wire::{Command, HEADER_SIZE, Operation, Sender};

use crate::client::codec::{Identifier, Name, Options, Partitioning, PollingStrategy};
use crate::client::reply::{
    ClusterMetadata, LoginReply, PollHead, StreamDetails, TopicDetails, has_result_section,
    read_result,
};
use crate::client::request::{
    ClientVersion, CreateTopic, Credentials, Login, PROTOCOL_VERSION, PollMessages, Request,
    SendMessages,
};

/// The largest reply a client accepts: the reference's frame limit (client-plane.md §1).
pub const REPLY_MAX: usize = wire::MAX_MESSAGE_SIZE_DEFAULT;

/// The transient refusal codes (client-plane.md §4.1).
pub const TRANSIENT: [u32; 2] = [57, 58];
/// Pause between repeats of a transiently refused request.
pub const TRANSIENT_PAUSE: Duration = Duration::from_millis(20);
/// How long a request is repeated while refused transiently (the SDK's 30 s).
pub const TRANSIENT_BOUND: Duration = Duration::from_secs(30);

const REPLY_OPERATION: usize = 208;
const REPLY_STATUS: usize = 216;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The server ended the session (client-plane.md §4.2).
    #[error("evicted by the server, reason {0}")]
    Evicted(u8),
    /// A Reply with a non-zero status.
    #[error("{operation:?} answered status {status}")]
    Status {
        /// The request's operation.
        operation: Operation,
        /// The status code.
        status: u32,
    },
    /// A result section carrying a rejection.
    #[error("{operation:?} rejected with code {code}")]
    Rejected {
        /// The request's operation.
        operation: Operation,
        /// The code.
        code: u32,
    },
    /// A reply that does not frame or decode.
    #[error("malformed reply to {operation:?}: {why}")]
    Malformed {
        /// The request's operation.
        operation: Operation,
        /// What is wrong.
        why: String,
    },
}

type Result<T> = std::result::Result<T, ClientError>;

fn malformed(operation: Operation, why: impl std::fmt::Display) -> ClientError {
    ClientError::Malformed {
        operation,
        why: why.to_string(),
    }
}

/// A random non-zero client id (client-plane.md §1.2): std's per-process hash keys mixed with
/// the time and the pid; unique enough for sessions of one benchmark.
pub fn random_client_id() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut id = 0u128;
    for salt in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        id = id << 64 | u128::from(h.finish());
    }
    id.max(1)
}

/// Microseconds since the Unix epoch (the clock of batch timestamps).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Fields of a Request header (client-plane.md §1.2).
#[derive(Debug, Clone, Copy)]
pub struct RequestFields {
    /// Client id.
    pub client: u128,
    /// Session from Register (0 before).
    pub session: u64,
    /// Request number (§2.3).
    pub request: u64,
    /// Operation byte.
    pub operation: Operation,
    /// Legacy code (NonReplicated only).
    pub code: u32,
    /// Stamp `request_checksum` (Register, metadata ops, Logout).
    pub stamped: bool,
}

/// The Request header (client-plane.md §1.2) for `body`.
pub fn request_header(fields: RequestFields, body: &[u8]) -> [u8; HEADER_SIZE] {
    let mut header = RequestHeader::zeroed();
    header.frame = FrameHeader::new(
        Command::Request,
        Sender {
            cluster: 0,
            replica: 0,
            view: 0,
        },
    );
    header.client.set(fields.client);
    if fields.stamped {
        header
            .request_checksum
            .set(u128::from(wire::integrity::xxh3(body)));
    }
    header.request.set(fields.request);
    header.operation = fields.operation.byte();
    header.session.set(fields.session);
    header.reserved[..4].copy_from_slice(&fields.code.to_le_bytes());
    wire::finish_header(&mut header, body).expect("a client body fits a frame");
    *header.bytes()
}

/// Appends a whole Request frame (header then `body`) to `out`.
pub fn put_request(out: &mut Vec<u8>, fields: RequestFields, body: &[u8]) {
    out.extend_from_slice(&request_header(fields, body));
    out.extend_from_slice(body);
}

/// Byte offsets of the batch header fields a producer restamps (client-plane.md §8.1).
const BATCH_ORIGIN_TIMESTAMP: usize = 24;
const BATCH_CHECKSUM: usize = 40;

/// A SendMessages frame built once and restamped per send: `batch` messages of
/// `message_size` bytes to one partition, explicit partitioning (§8.1).
#[derive(Debug, Clone)]
pub struct SendFrame {
    frame: Vec<u8>,
    batch_at: usize,
    frame_checksums: Vec<u64>,
    /// Messages per send.
    pub messages: u32,
    /// The partition it targets.
    pub partition: u32,
}

impl SendFrame {
    /// Builds the frame for a logged-in connection.
    pub fn new(
        fields: RequestFields,
        stream: u32,
        topic: u32,
        partition: u32,
        message_size: usize,
        batch: u32,
    ) -> SendFrame {
        let payload: Vec<u8> = (0..message_size).map(|i| (i % 251) as u8).collect();
        let messages: Vec<(u128, &[u8])> = (1..=u128::from(batch))
            .map(|id| (id, payload.as_slice()))
            .collect();
        let batch_bytes = wire::batch::build_messages(0, 0, 0, now_us(), &messages);
        let frame_checksums = (0..batch as usize)
            .map(|i| {
                let at =
                    wire::batch::HEADER_SIZE + i * (wire::batch::FRAME_HEADER_SIZE + message_size);
                u64::from_le_bytes(batch_bytes[at..at + 8].try_into().expect("8 bytes"))
            })
            .collect();
        let mut body = Vec::with_capacity(batch_bytes.len() + 32);
        Request::SendMessages(SendMessages {
            stream: Identifier::Numeric(stream),
            topic: Identifier::Numeric(topic),
            partitioning: Partitioning::Partition(partition),
            messages_count: batch,
            batch: &batch_bytes,
        })
        .encode(&mut body);
        let mut frame = Vec::with_capacity(HEADER_SIZE + body.len());
        put_request(&mut frame, fields, &body);
        let batch_at = frame.len() - batch_bytes.len();
        SendFrame {
            frame,
            batch_at,
            frame_checksums,
            messages: batch,
            partition,
        }
    }

    /// Sets the batch's `origin_timestamp` (µs) and recomputes its checksum; the frames'
    /// checksums do not cover the batch header, so they stay.
    pub fn stamp_origin(&mut self, origin_us: u64) {
        let batch = &mut self.frame[self.batch_at..];
        batch[BATCH_ORIGIN_TIMESTAMP..BATCH_ORIGIN_TIMESTAMP + 8]
            .copy_from_slice(&origin_us.to_le_bytes());
        let sum = wire::batch::checksum(batch, self.frame_checksums.iter().copied());
        batch[BATCH_CHECKSUM..BATCH_CHECKSUM + 8].copy_from_slice(&sum.to_le_bytes());
    }

    /// The whole frame.
    pub fn bytes(&self) -> &[u8] {
        &self.frame
    }

    /// The batch inside it.
    pub fn batch(&self) -> &[u8] {
        &self.frame[self.batch_at..]
    }
}

/// The `offset_delta`s of the first and last of `count` message frames tiling `batch` (the
/// batch header skipped), or `None` if they do not tile it. A poll may return part of a
/// stored batch: its header keeps the stored `base_offset` and the frames their deltas
/// (client-plane.md §8.3), so the offsets come from the frames, not from the header's count.
pub fn frame_deltas(batch: &[u8], count: u32) -> Option<(u32, u32)> {
    // Frame fields (client-plane.md §8.1): offset_delta at 24, user_headers_length at 32,
    // payload_length at 36, after a 48-byte head.
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let mut at = wire::batch::HEADER_SIZE;
    let (mut first, mut last) = (None, 0);
    for _ in 0..count {
        let frame = batch.get(at..)?;
        let delta = u32_at(frame, 24)?;
        first.get_or_insert(delta);
        last = delta;
        let len = wire::batch::FRAME_HEADER_SIZE
            .checked_add(u32_at(frame, 32)? as usize)?
            .checked_add(u32_at(frame, 36)? as usize)?;
        at = at.checked_add(len)?;
    }
    (at == batch.len()).then_some((first?, last))
}

/// One batch of a poll reply, as the consumer accounts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolledBatch {
    /// Offset of its first message.
    pub first_offset: u64,
    /// The offset after its last message.
    pub end_offset: u64,
    /// Messages in it.
    pub messages: u32,
    /// The producer's `origin_timestamp` (µs).
    pub origin_us: u64,
}

/// Where a poll reads: stream, topic, partition, from `offset`, at most `count` messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollAt {
    /// Stream id.
    pub stream: u32,
    /// Topic id.
    pub topic: u32,
    /// Partition id.
    pub partition: u32,
    /// First offset wanted.
    pub offset: u64,
    /// At most this many messages.
    pub count: u32,
}

/// A logged-in (or not yet) connection.
pub struct Connection {
    stream: TcpStream,
    client: u128,
    session: u64,
    /// The request counter (§2.3): 1 after login, incremented by metadata ops.
    request: u64,
    header: [u8; HEADER_SIZE],
    body: Vec<u8>,
    out: Vec<u8>,
    transient_retries: u64,
    foreign_echoes: u64,
}

impl Connection {
    /// Connects (TCP_NODELAY on, `congestion` set before the connection starts), retrying a
    /// refused connection until `patience` runs out.
    pub fn connect(
        addr: SocketAddr,
        patience: Duration,
        congestion: Option<&shard::net::CongestionControl>,
    ) -> Result<Connection> {
        let started = std::time::Instant::now();
        let stream = loop {
            match shard::net::socket::std_connect(addr, Duration::from_secs(5), congestion) {
                Ok(stream) => break stream,
                Err(_) if started.elapsed() < patience => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e.into()),
            }
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Connection {
            stream,
            client: random_client_id(),
            session: 0,
            request: 1,
            header: [0; HEADER_SIZE],
            body: Vec::new(),
            out: Vec::new(),
            transient_retries: 0,
            foreign_echoes: 0,
        })
    }

    /// The congestion control the connection runs under, as the kernel reports it.
    pub fn congestion_control(&self) -> std::io::Result<String> {
        shard::net::socket::congestion_control_of(&self.stream)
    }

    /// Header fields for the next request of `operation`; metadata ops and Logout consume a
    /// request number, the others reuse the current one (§2.3).
    pub fn fields(&mut self, operation: Operation, code: u32) -> RequestFields {
        let stamped = operation.is_metadata() || operation == Operation::Logout;
        let request = self.request;
        if stamped {
            self.request += 1;
        }
        RequestFields {
            client: self.client,
            session: self.session,
            request,
            operation,
            code,
            stamped,
        }
    }

    /// Writes `frame` and reads the reply; returns the status-checked reply body. A transient
    /// refusal (57 TransientNotCommitted, 58 TransientNotAccepted, in the header status or the
    /// result section, client-plane.md §4.1) repeats the same frame every
    /// [`TRANSIENT_PAUSE`] for up to [`TRANSIENT_BOUND`], as the SDK does; a refused request
    /// was not applied, so the repeat does not duplicate it.
    pub fn round_trip(&mut self, frame: &[u8], operation: Operation) -> Result<&[u8]> {
        let started = std::time::Instant::now();
        loop {
            self.stream.write_all(frame)?;
            let code = match self.read_reply_len(operation) {
                Ok(len) => {
                    let code = match has_result_section(operation) {
                        true => match read_result(&self.body[..len]) {
                            Ok(Err(code)) if TRANSIENT.contains(&code) => Some(code),
                            _ => None,
                        },
                        false => None,
                    };
                    match code {
                        Some(code) => code,
                        None => return Ok(&self.body[..len]),
                    }
                }
                Err(ClientError::Status { status, .. }) if TRANSIENT.contains(&status) => status,
                Err(e) => return Err(e),
            };
            if started.elapsed() > TRANSIENT_BOUND {
                return Err(ClientError::Status {
                    operation,
                    status: code,
                });
            }
            self.transient_retries += 1;
            std::thread::sleep(TRANSIENT_PAUSE);
        }
    }

    /// Replies so far that echoed another operation of the same framing than the request's
    /// (client-plane.md §1.3 asks for the request's own).
    pub fn foreign_echoes(&self) -> u64 {
        self.foreign_echoes
    }

    /// Transient refusals repeated so far on this connection.
    pub fn transient_retries(&self) -> u64 {
        self.transient_retries
    }

    /// Reads one reply into `self.body`; its body's length.
    fn read_reply_len(&mut self, operation: Operation) -> Result<usize> {
        self.stream.read_exact(&mut self.header)?;
        let size = u32::from_le_bytes(self.header[48..52].try_into().expect("4 bytes")) as usize;
        if !(HEADER_SIZE..=REPLY_MAX).contains(&size) {
            return Err(malformed(operation, format!("frame size {size}")));
        }
        let len = size - HEADER_SIZE;
        if self.body.len() < len {
            self.body.resize(len, 0);
        }
        self.stream.read_exact(&mut self.body[..len])?;
        match Command::from_byte(self.header[60]) {
            Some(Command::Reply) => {}
            Some(Command::Eviction) => return Err(ClientError::Evicted(self.header[255])),
            _ => return Err(malformed(operation, format!("command {}", self.header[60]))),
        }
        // The fields the SDK reads (client-plane.md §1.3): operation at 208, status at 216.
        // The SDK only uses the echoed operation to pick the body framing (§3), so, like it,
        // accept another operation whose framing is the same (a CreateTopic answered as its
        // server-prepared CreateTopicWithAssignments, 64); a framing change is an error.
        let echoed = self.header[REPLY_OPERATION];
        if echoed != operation.byte() {
            let same_framing = Operation::from_byte(echoed)
                .is_some_and(|e| has_result_section(e) == has_result_section(operation));
            if !same_framing {
                return Err(malformed(
                    operation,
                    format!("reply echoes operation {echoed}"),
                ));
            }
            self.foreign_echoes += 1;
        }
        let status = u32::from_le_bytes(
            self.header[REPLY_STATUS..REPLY_STATUS + 4]
                .try_into()
                .expect("4 bytes"),
        );
        if status != 0 {
            return Err(ClientError::Status { operation, status });
        }
        Ok(len)
    }

    /// Sends `request` (encoded into the connection's buffer) and reads the reply body.
    fn call(&mut self, request: &Request<'_>) -> Result<&[u8]> {
        let (operation, code) = request.operation();
        let mut body = std::mem::take(&mut self.out);
        body.clear();
        request.encode(&mut body);
        let fields = self.fields(operation, code);
        let mut frame = Vec::with_capacity(HEADER_SIZE + body.len());
        put_request(&mut frame, fields, &body);
        self.out = body;
        self.round_trip(&frame, operation)
    }

    /// A metadata call: the result section's payload, or the rejection.
    fn call_result(&mut self, request: &Request<'_>) -> Result<Vec<u8>> {
        let operation = request.operation().0;
        let body = self.call(request)?;
        match read_result(body).map_err(|e| malformed(operation, e))? {
            Ok(payload) => Ok(payload.to_vec()),
            Err(code) => Err(ClientError::Rejected { operation, code }),
        }
    }

    /// Register with a username and password (§6.2); takes the session.
    pub fn login(&mut self, username: &str, password: &str) -> Result<()> {
        let name = |text: &str| {
            Name::new(text).ok_or_else(|| malformed(Operation::Register, "name length"))
        };
        let login = Request::Register(Login {
            version: ClientVersion {
                protocol_version: PROTOCOL_VERSION,
                sdk_name: name("strand-bench")?,
                sdk_version: name(env!("CARGO_PKG_VERSION"))?,
            },
            credentials: Credentials::Password {
                username: name(username)?,
                password: password.to_owned(),
            },
            context: String::new(),
        });
        let mut body = Vec::new();
        login.encode(&mut body);
        let mut frame = Vec::new();
        put_request(
            &mut frame,
            RequestFields {
                client: self.client,
                session: 0,
                request: 0,
                operation: Operation::Register,
                code: 0,
                stamped: true,
            },
            &body,
        );
        let reply = self.round_trip(&frame, Operation::Register)?;
        let payload = match read_result(reply).map_err(|e| malformed(Operation::Register, e))? {
            Ok(payload) => payload,
            Err(code) => {
                return Err(ClientError::Rejected {
                    operation: Operation::Register,
                    code,
                });
            }
        };
        let reply = LoginReply::decode(payload).map_err(|e| malformed(Operation::Register, e))?;
        if reply.session == 0 {
            return Err(malformed(Operation::Register, "session 0"));
        }
        self.session = reply.session;
        self.request = 1;
        Ok(())
    }

    /// GetClusterMetadata (§6.4).
    pub fn cluster_metadata(&mut self) -> Result<ClusterMetadata> {
        let body = self.call(&Request::GetClusterMetadata)?;
        ClusterMetadata::decode(body).map_err(|e| malformed(Operation::NonReplicated, e))
    }

    /// CreateStream (§7.1): the new stream's id.
    pub fn create_stream(&mut self, name: &str) -> Result<u32> {
        let name = Name::new(name).ok_or_else(|| malformed(Operation::CreateStream, "name"))?;
        let payload = self.call_result(&Request::CreateStream {
            name,
            options: Options::default(),
        })?;
        let details =
            StreamDetails::decode(&payload).map_err(|e| malformed(Operation::CreateStream, e))?;
        Ok(details.stream.id)
    }

    /// CreateTopic (§7.3): the topic's id and its partitions' ids.
    pub fn create_topic(
        &mut self,
        stream: u32,
        name: &str,
        partitions: u32,
        segment_size: Option<u64>,
    ) -> Result<(u32, Vec<u32>)> {
        let name = Name::new(name).ok_or_else(|| malformed(Operation::CreateTopic, "name"))?;
        let mut options = Options::default();
        if let Some(size) = segment_size {
            let value = crate::client::codec::OptionValue {
                kind: crate::client::codec::kind::U64,
                bytes: size.to_le_bytes().to_vec(),
            };
            options.0.insert(String::from("segment_size"), value);
        }
        let payload = self.call_result(&Request::CreateTopic(CreateTopic {
            stream: Identifier::Numeric(stream),
            partitions_count: partitions,
            name,
            options,
        }))?;
        let details =
            TopicDetails::decode(&payload).map_err(|e| malformed(Operation::CreateTopic, e))?;
        let ids = details.partitions.iter().map(|p| p.id).collect();
        Ok((details.topic.id, ids))
    }

    /// Sends a prebuilt frame and checks the reply frames as SendMessages' (§8.1).
    pub fn send(&mut self, frame: &SendFrame) -> Result<()> {
        let body = self.round_trip(frame.bytes(), Operation::SendMessages)?;
        // An empty body or `4 + 20 x count` bytes (§8.1).
        if !body.is_empty() {
            let count = u32::from_le_bytes(
                body.get(..4)
                    .ok_or_else(|| malformed(Operation::SendMessages, "short body"))?
                    .try_into()
                    .expect("4 bytes"),
            ) as usize;
            if body.len() != 4 + 20 * count {
                return Err(malformed(
                    Operation::SendMessages,
                    format!("{} bytes for {count} confirmations", body.len()),
                ));
            }
        }
        Ok(())
    }

    /// PollMessages by offset (§8.2) with consumer id `consumer`; calls `each` for every batch
    /// of the reply and returns the reply's head. Allocates nothing once the buffers are grown.
    pub fn poll(
        &mut self,
        consumer: u32,
        at: PollAt,
        mut each: impl FnMut(PolledBatch),
    ) -> Result<PollHead> {
        let PollAt {
            stream,
            topic,
            partition,
            offset,
            count,
        } = at;
        let op = Operation::NonReplicated;
        let request = Request::PollMessages(PollMessages {
            consumer: crate::client::codec::Consumer {
                group: false,
                id: Identifier::Numeric(consumer),
            },
            stream: Identifier::Numeric(stream),
            topic: Identifier::Numeric(topic),
            partition: Some(partition),
            strategy: PollingStrategy::Offset(offset),
            count,
            auto_commit: false,
        });
        let mut frame = std::mem::take(&mut self.out);
        frame.clear();
        frame.resize(HEADER_SIZE, 0);
        request.encode(&mut frame);
        let fields = self.fields(op, crate::client::request::code::POLL_MESSAGES);
        let header = request_header(fields, &frame[HEADER_SIZE..]);
        frame[..HEADER_SIZE].copy_from_slice(&header);
        let result = self.round_trip(&frame, op).map(<[u8]>::len);
        self.out = frame;
        let body = &self.body[..result?];
        let (head, mut rest) = PollHead::decode(body).map_err(|e| malformed(op, e))?;
        let mut messages = 0u64;
        while !rest.is_empty() {
            let batch = wire::batch::peek(rest).ok_or_else(|| malformed(op, "batch truncated"))?;
            let len = usize::try_from(batch.length).unwrap_or(usize::MAX);
            if len < wire::batch::HEADER_SIZE || len > rest.len() {
                return Err(malformed(op, format!("batch_length {}", batch.length)));
            }
            messages += u64::from(batch.message_count);
            let (first, last) = frame_deltas(&rest[..len], batch.message_count)
                .ok_or_else(|| malformed(op, "message frames do not tile the batch"))?;
            each(PolledBatch {
                first_offset: batch.base_offset + u64::from(first),
                end_offset: batch.base_offset + u64::from(last) + 1,
                messages: batch.message_count,
                origin_us: batch.origin_timestamp,
            });
            rest = &rest[len..];
        }
        if messages != u64::from(head.messages_count) {
            return Err(malformed(
                op,
                format!(
                    "head says {} messages, batches hold {messages}",
                    head.messages_count
                ),
            ));
        }
        Ok(head)
    }
}
