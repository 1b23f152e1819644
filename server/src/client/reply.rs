//! Client reply bodies (client-plane.md §3, §6-§9): the result section, the records the
//! metadata commands answer with, and the raw payloads of the NonReplicated and partition
//! commands. Each has an encoder (what the server sends) and a decoder (what a client reads;
//! tests and tools use it, and it shares the reader's typed errors).

use wire::Operation;

use super::codec::{BodyError, Name, Options, Reader, put_str_u32};

/// The success result section: `count = 0` (client-plane.md §3).
pub const RESULT_OK: [u8; 4] = [0; 4];

/// A result section carrying one rejection: `[1][0][code]`.
pub fn result_rejected(code: u32) -> [u8; 12] {
    let mut out = [0; 12];
    out[0..4].copy_from_slice(&1u32.to_le_bytes());
    out[8..12].copy_from_slice(&code.to_le_bytes());
    out
}

/// Reads a result section: `Ok(payload)` on success, `Err(code)` for a rejection.
pub fn read_result(body: &[u8]) -> Result<Result<&[u8], u32>, BodyError> {
    let mut r = Reader::new(body);
    match r.u32("result count")? {
        0 => Ok(Ok(r.rest())),
        1 => {
            let _index = r.u32("result index")?;
            let code = r.u32("result code")?;
            r.finish()?;
            Ok(Err(code))
        }
        count => Err(BodyError::Length {
            field: "result count",
            len: u64::from(count),
        }),
    }
}

/// Whether replies to `operation` open with a result section (§3).
pub fn has_result_section(operation: Operation) -> bool {
    operation.is_metadata()
        || matches!(
            operation,
            Operation::Register | Operation::StoreConsumerOffset | Operation::DeleteConsumerOffset
        )
}

/// A refusal as it travels: header `status` and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The Reply header's status.
    pub status: u32,
    /// The body.
    pub body: Vec<u8>,
}

/// The channel of a refusal (§4.1): operations whose replies carry a result section answer
/// `status = 0` with `[1][0][code]`; the others answer `status = code` with an empty body.
pub fn refusal(operation: Operation, code: u32) -> Refusal {
    if has_result_section(operation) {
        Refusal {
            status: 0,
            body: result_rejected(code).to_vec(),
        }
    } else {
        Refusal {
            status: code,
            body: Vec::new(),
        }
    }
}

/// The Register success payload (§6.2), after the `[u32 0]` result section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginReply {
    /// The user's id (root is 0).
    pub user_id: u32,
    /// The session: the Register's commit op, never 0.
    pub session: u64,
    /// The server's protocol version.
    pub server_protocol_version: u32,
    /// The server's version text.
    pub server_version: Name,
}

impl LoginReply {
    /// Encodes the whole body, result section included.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&RESULT_OK);
        out.extend_from_slice(&self.user_id.to_le_bytes());
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&self.server_protocol_version.to_le_bytes());
        self.server_version.write(out);
    }
    /// Decodes the payload after the result section.
    pub fn decode(payload: &[u8]) -> Result<LoginReply, BodyError> {
        let mut r = Reader::new(payload);
        let reply = LoginReply {
            user_id: r.u32("user_id")?,
            session: r.u64("session")?,
            server_protocol_version: r.u32("server_protocol_version")?,
            server_version: Name::read(&mut r, "server_version")?,
        };
        r.finish()?;
        Ok(reply)
    }
}

/// A stream record (§7.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    /// Id (0-based).
    pub id: u32,
    /// Creation time, µs since the epoch.
    pub created_at: u64,
    /// Topics in the stream.
    pub topics_count: u32,
    /// Bytes stored.
    pub size_bytes: u64,
    /// Messages stored.
    pub messages_count: u64,
    /// Name.
    pub name: Name,
    /// Options (none are accepted today).
    pub options: Options,
}

impl StreamRecord {
    /// Encodes the record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.created_at.to_le_bytes());
        out.extend_from_slice(&self.topics_count.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.messages_count.to_le_bytes());
        self.name.write(out);
        self.options.write_prefixed(out);
    }
    /// Decodes one record.
    pub fn read(r: &mut Reader<'_>) -> Result<StreamRecord, BodyError> {
        Ok(StreamRecord {
            id: r.u32("stream id")?,
            created_at: r.u64("created_at")?,
            topics_count: r.u32("topics_count")?,
            size_bytes: r.u64("size_bytes")?,
            messages_count: r.u64("messages_count")?,
            name: Name::read(r, "stream name")?,
            options: Options::read_prefixed(r)?,
        })
    }
}

/// A topic record (§7.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    /// Id (0-based within its stream).
    pub id: u32,
    /// Creation time, µs.
    pub created_at: u64,
    /// Partitions.
    pub partitions_count: u32,
    /// Message expiry in µs (`u64::MAX` = never).
    pub message_expiry: u64,
    /// 1 none, 2 gzip.
    pub compression_algorithm: u8,
    /// Byte limit (`u64::MAX` = unlimited).
    pub max_topic_size: u64,
    /// Bytes stored.
    pub size_bytes: u64,
    /// Messages stored.
    pub messages_count: u64,
    /// Name.
    pub name: Name,
    /// Options the client set.
    pub explicit: Options,
    /// Server defaults for the keys it did not set.
    pub derived: Options,
}

impl TopicRecord {
    /// Encodes the record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.created_at.to_le_bytes());
        out.extend_from_slice(&self.partitions_count.to_le_bytes());
        out.extend_from_slice(&self.message_expiry.to_le_bytes());
        out.push(self.compression_algorithm);
        out.extend_from_slice(&self.max_topic_size.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.messages_count.to_le_bytes());
        self.name.write(out);
        self.explicit.write_prefixed(out);
        self.derived.write_prefixed(out);
    }
    /// Decodes one record.
    pub fn read(r: &mut Reader<'_>) -> Result<TopicRecord, BodyError> {
        Ok(TopicRecord {
            id: r.u32("topic id")?,
            created_at: r.u64("created_at")?,
            partitions_count: r.u32("partitions_count")?,
            message_expiry: r.u64("message_expiry")?,
            compression_algorithm: r.u8("compression_algorithm")?,
            max_topic_size: r.u64("max_topic_size")?,
            size_bytes: r.u64("size_bytes")?,
            messages_count: r.u64("messages_count")?,
            name: Name::read(r, "topic name")?,
            explicit: Options::read_prefixed(r)?,
            derived: Options::read_prefixed(r)?,
        })
    }
}

/// A partition record (§7.3), 40 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRecord {
    /// Id (0-based).
    pub id: u32,
    /// Creation time, µs.
    pub created_at: u64,
    /// Segments.
    pub segments_count: u32,
    /// Highest offset.
    pub current_offset: u64,
    /// Bytes stored.
    pub size_bytes: u64,
    /// Messages stored.
    pub messages_count: u64,
}

impl PartitionRecord {
    /// Encodes the record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.created_at.to_le_bytes());
        out.extend_from_slice(&self.segments_count.to_le_bytes());
        out.extend_from_slice(&self.current_offset.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.messages_count.to_le_bytes());
    }
    /// Decodes one record.
    pub fn read(r: &mut Reader<'_>) -> Result<PartitionRecord, BodyError> {
        Ok(PartitionRecord {
            id: r.u32("partition id")?,
            created_at: r.u64("created_at")?,
            segments_count: r.u32("segments_count")?,
            current_offset: r.u64("current_offset")?,
            size_bytes: r.u64("size_bytes")?,
            messages_count: r.u64("messages_count")?,
        })
    }
}

/// The GetTopic payload: the topic record and exactly `partitions_count` partition records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDetails {
    /// The topic.
    pub topic: TopicRecord,
    /// Its partitions, as many as `topic.partitions_count`.
    pub partitions: Vec<PartitionRecord>,
}

impl TopicDetails {
    /// Encodes the payload. Asserts the count matches (a programmer error otherwise).
    pub fn encode(&self, out: &mut Vec<u8>) {
        assert_eq!(self.topic.partitions_count as usize, self.partitions.len());
        self.topic.encode(out);
        for p in &self.partitions {
            p.encode(out);
        }
    }
    /// Decodes a whole payload.
    pub fn decode(payload: &[u8]) -> Result<TopicDetails, BodyError> {
        let mut r = Reader::new(payload);
        let topic = TopicRecord::read(&mut r)?;
        let partitions = read_counted(&mut r, topic.partitions_count, PartitionRecord::read)?;
        r.finish()?;
        Ok(TopicDetails { topic, partitions })
    }
}

/// The GetStream payload: the stream record and exactly `topics_count` topic records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDetails {
    /// The stream.
    pub stream: StreamRecord,
    /// Its topics.
    pub topics: Vec<TopicRecord>,
}

impl StreamDetails {
    /// Encodes the payload. Asserts the count matches.
    pub fn encode(&self, out: &mut Vec<u8>) {
        assert_eq!(self.stream.topics_count as usize, self.topics.len());
        self.stream.encode(out);
        for t in &self.topics {
            t.encode(out);
        }
    }
    /// Decodes a whole payload.
    pub fn decode(payload: &[u8]) -> Result<StreamDetails, BodyError> {
        let mut r = Reader::new(payload);
        let stream = StreamRecord::read(&mut r)?;
        let topics = read_counted(&mut r, stream.topics_count, TopicRecord::read)?;
        r.finish()?;
        Ok(StreamDetails { stream, topics })
    }
}

/// Reads `count` records, never reserving more than the input could hold.
fn read_counted<T>(
    r: &mut Reader<'_>,
    count: u32,
    read: impl Fn(&mut Reader<'_>) -> Result<T, BodyError>,
) -> Result<Vec<T>, BodyError> {
    let mut items = Vec::with_capacity((count as usize).min(r.remaining() / 8 + 1));
    for _ in 0..count {
        items.push(read(r)?);
    }
    Ok(items)
}

/// The GetStreams payload: stream records back to back.
pub fn decode_streams(payload: &[u8]) -> Result<Vec<StreamRecord>, BodyError> {
    let mut r = Reader::new(payload);
    let mut streams = Vec::new();
    while r.remaining() > 0 {
        streams.push(StreamRecord::read(&mut r)?);
    }
    Ok(streams)
}

/// A node of the GetClusterMetadata reply (§6.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Node name.
    pub name: String,
    /// Client-facing ip.
    pub ip: String,
    /// `tcp` port.
    pub tcp: u16,
    /// `quic` port (0 when absent).
    pub quic: u16,
    /// `http` port.
    pub http: u16,
    /// `websocket` port (0 when absent).
    pub websocket: u16,
    /// 0 leader, 1 follower.
    pub role: u8,
    /// 0 healthy, 1 starting, 2 stopping, 3 unreachable, 4 maintenance, 5 unknown.
    pub status: u8,
}

/// The GetClusterMetadata reply (§6.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMetadata {
    /// Cluster name.
    pub name: String,
    /// The roster.
    pub nodes: Vec<ClusterNode>,
}

/// A role byte outside 0..=1 or a status byte outside 0..=5.
const ROLE_MAX: u8 = 1;
const NODE_STATUS_MAX: u8 = 5;

impl ClusterMetadata {
    /// Encodes the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_str_u32(out, &self.name);
        out.extend_from_slice(&(self.nodes.len() as u32).to_le_bytes());
        for n in &self.nodes {
            put_str_u32(out, &n.name);
            put_str_u32(out, &n.ip);
            for port in [n.tcp, n.quic, n.http, n.websocket] {
                out.extend_from_slice(&port.to_le_bytes());
            }
            out.push(n.role);
            out.push(n.status);
        }
    }
    /// Decodes the payload; a role or status outside the table fails (as in the SDK).
    pub fn decode(payload: &[u8]) -> Result<ClusterMetadata, BodyError> {
        let mut r = Reader::new(payload);
        let name = r.str_u32("cluster name")?.to_owned();
        let count = r.u32("node count")?;
        let nodes = read_counted(&mut r, count, |r| {
            let node = ClusterNode {
                name: r.str_u32("node name")?.to_owned(),
                ip: r.str_u32("node ip")?.to_owned(),
                tcp: r.u16("tcp port")?,
                quic: r.u16("quic port")?,
                http: r.u16("http port")?,
                websocket: r.u16("websocket port")?,
                role: r.u8("role")?,
                status: r.u8("status")?,
            };
            if node.role > ROLE_MAX {
                return Err(BodyError::Length {
                    field: "role",
                    len: u64::from(node.role),
                });
            }
            if node.status > NODE_STATUS_MAX {
                return Err(BodyError::Length {
                    field: "node status",
                    len: u64::from(node.status),
                });
            }
            Ok(node)
        })?;
        r.finish()?;
        Ok(ClusterMetadata { name, nodes })
    }
}

/// One cache metric of GetStats (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheMetric {
    /// Stream id.
    pub stream: u32,
    /// Topic id.
    pub topic: u32,
    /// Partition id.
    pub partition: u32,
    /// Hits.
    pub hits: u64,
    /// Misses.
    pub misses: u64,
    /// Hit ratio.
    pub hit_ratio: f32,
}

/// The GetStats reply (§6.5).
#[derive(Debug, Clone, PartialEq, Default)]
#[allow(missing_docs)] // the fields are the spec's table, in its order
pub struct Stats {
    pub process_id: u32,
    pub cpu_usage: f32,
    pub total_cpu_usage: f32,
    pub memory_usage: u64,
    pub total_memory: u64,
    pub available_memory: u64,
    pub run_time: u64,
    pub start_time: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub messages_size_bytes: u64,
    pub streams_count: u32,
    pub topics_count: u32,
    pub partitions_count: u32,
    pub segments_count: u32,
    pub messages_count: u64,
    pub clients_count: u32,
    pub consumer_groups_count: u32,
    pub hostname: String,
    pub os_name: String,
    pub os_version: String,
    pub kernel_version: String,
    pub server_version: String,
    pub server_semver: u32,
    pub cache_metrics: Vec<CacheMetric>,
    pub threads_count: u32,
    pub free_disk_space: u64,
    pub total_disk_space: u64,
}

impl Stats {
    /// Encodes the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.process_id.to_le_bytes());
        out.extend_from_slice(&self.cpu_usage.to_le_bytes());
        out.extend_from_slice(&self.total_cpu_usage.to_le_bytes());
        for v in [
            self.memory_usage,
            self.total_memory,
            self.available_memory,
            self.run_time,
            self.start_time,
            self.read_bytes,
            self.written_bytes,
            self.messages_size_bytes,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.streams_count,
            self.topics_count,
            self.partitions_count,
            self.segments_count,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.messages_count.to_le_bytes());
        out.extend_from_slice(&self.clients_count.to_le_bytes());
        out.extend_from_slice(&self.consumer_groups_count.to_le_bytes());
        for s in [
            &self.hostname,
            &self.os_name,
            &self.os_version,
            &self.kernel_version,
            &self.server_version,
        ] {
            put_str_u32(out, s);
        }
        out.extend_from_slice(&self.server_semver.to_le_bytes());
        out.extend_from_slice(&(self.cache_metrics.len() as u32).to_le_bytes());
        for m in &self.cache_metrics {
            out.extend_from_slice(&m.stream.to_le_bytes());
            out.extend_from_slice(&m.topic.to_le_bytes());
            out.extend_from_slice(&m.partition.to_le_bytes());
            out.extend_from_slice(&m.hits.to_le_bytes());
            out.extend_from_slice(&m.misses.to_le_bytes());
            out.extend_from_slice(&m.hit_ratio.to_le_bytes());
        }
        out.extend_from_slice(&self.threads_count.to_le_bytes());
        out.extend_from_slice(&self.free_disk_space.to_le_bytes());
        out.extend_from_slice(&self.total_disk_space.to_le_bytes());
    }

    /// Decodes the payload.
    pub fn decode(payload: &[u8]) -> Result<Stats, BodyError> {
        let mut r = Reader::new(payload);
        let mut s = Stats {
            process_id: r.u32("process_id")?,
            cpu_usage: r.f32("cpu_usage")?,
            total_cpu_usage: r.f32("total_cpu_usage")?,
            memory_usage: r.u64("memory_usage")?,
            total_memory: r.u64("total_memory")?,
            available_memory: r.u64("available_memory")?,
            run_time: r.u64("run_time")?,
            start_time: r.u64("start_time")?,
            read_bytes: r.u64("read_bytes")?,
            written_bytes: r.u64("written_bytes")?,
            messages_size_bytes: r.u64("messages_size_bytes")?,
            streams_count: r.u32("streams_count")?,
            topics_count: r.u32("topics_count")?,
            partitions_count: r.u32("partitions_count")?,
            segments_count: r.u32("segments_count")?,
            messages_count: r.u64("messages_count")?,
            clients_count: r.u32("clients_count")?,
            consumer_groups_count: r.u32("consumer_groups_count")?,
            hostname: r.str_u32("hostname")?.to_owned(),
            os_name: r.str_u32("os_name")?.to_owned(),
            os_version: r.str_u32("os_version")?.to_owned(),
            kernel_version: r.str_u32("kernel_version")?.to_owned(),
            server_version: r.str_u32("server_version")?.to_owned(),
            server_semver: r.u32("server_semver")?,
            ..Stats::default()
        };
        let count = r.u32("cache metric count")?;
        s.cache_metrics = read_counted(&mut r, count, |r| {
            Ok(CacheMetric {
                stream: r.u32("cache stream")?,
                topic: r.u32("cache topic")?,
                partition: r.u32("cache partition")?,
                hits: r.u64("cache hits")?,
                misses: r.u64("cache misses")?,
                hit_ratio: r.f32("cache hit ratio")?,
            })
        })?;
        s.threads_count = r.u32("threads_count")?;
        s.free_disk_space = r.u64("free_disk_space")?;
        s.total_disk_space = r.u64("total_disk_space")?;
        r.finish()?;
        Ok(s)
    }
}

/// One SendMessages confirmation (§8.1), 20 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendConfirmation {
    /// Stream id.
    pub stream: u32,
    /// Topic id.
    pub topic: u32,
    /// Partition id.
    pub partition: u32,
    /// Offset of the batch's first message.
    pub base_offset: u64,
}

/// Encodes the SendMessages reply: count, then exactly `count` confirmations.
pub fn encode_send_reply(confirmations: &[SendConfirmation], out: &mut Vec<u8>) {
    out.extend_from_slice(&(confirmations.len() as u32).to_le_bytes());
    for c in confirmations {
        out.extend_from_slice(&c.stream.to_le_bytes());
        out.extend_from_slice(&c.topic.to_le_bytes());
        out.extend_from_slice(&c.partition.to_le_bytes());
        out.extend_from_slice(&c.base_offset.to_le_bytes());
    }
}

/// Decodes a SendMessages reply; the body must hold exactly `4 + 20 x count` bytes (an empty
/// body is zero confirmations).
pub fn decode_send_reply(body: &[u8]) -> Result<Vec<SendConfirmation>, BodyError> {
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = Reader::new(body);
    let count = r.u32("confirmation count")?;
    let items = read_counted(&mut r, count, |r| {
        Ok(SendConfirmation {
            stream: r.u32("stream id")?,
            topic: r.u32("topic id")?,
            partition: r.u32("partition id")?,
            base_offset: r.u64("base_offset")?,
        })
    })?;
    r.finish()?;
    Ok(items)
}

/// The 16-byte head of a PollMessages reply (§8.3); the stored batches follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollHead {
    /// The partition polled (`u32::MAX`: a group member must re-sync).
    pub partition_id: u32,
    /// The partition's highest committed offset (0 when empty).
    pub current_offset: u64,
    /// Messages in the batches that follow.
    pub messages_count: u32,
}

/// Size of [`PollHead`]: a poll reply is never shorter.
pub const POLL_HEAD_SIZE: usize = 16;

impl PollHead {
    /// Encodes the head.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.partition_id.to_le_bytes());
        out.extend_from_slice(&self.current_offset.to_le_bytes());
        out.extend_from_slice(&self.messages_count.to_le_bytes());
    }
    /// Splits a poll reply into its head and the batch bytes.
    pub fn decode(body: &[u8]) -> Result<(PollHead, &[u8]), BodyError> {
        let mut r = Reader::new(body);
        let head = PollHead {
            partition_id: r.u32("partition_id")?,
            current_offset: r.u64("current_offset")?,
            messages_count: r.u32("messages_count")?,
        };
        Ok((head, r.rest()))
    }
}

/// The GetConsumerOffset reply (§9.2), 20 bytes; an empty body means none is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerOffsetReply {
    /// Partition id.
    pub partition_id: u32,
    /// The partition's highest offset.
    pub current_offset: u64,
    /// The stored offset.
    pub stored_offset: u64,
}

impl ConsumerOffsetReply {
    /// Encodes the reply.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.partition_id.to_le_bytes());
        out.extend_from_slice(&self.current_offset.to_le_bytes());
        out.extend_from_slice(&self.stored_offset.to_le_bytes());
    }
    /// Decodes a reply: `None` for the empty body.
    pub fn decode(body: &[u8]) -> Result<Option<ConsumerOffsetReply>, BodyError> {
        if body.is_empty() {
            return Ok(None);
        }
        let mut r = Reader::new(body);
        let reply = ConsumerOffsetReply {
            partition_id: r.u32("partition_id")?,
            current_offset: r.u64("current_offset")?,
            stored_offset: r.u64("stored_offset")?,
        };
        r.finish()?;
        Ok(Some(reply))
    }
}
