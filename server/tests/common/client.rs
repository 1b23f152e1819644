//! A raw client of the client port (client-plane.md) for the end-to-end tests: Request frames
//! built by hand, lockstep, resending on a transient answer as the SDK does. Every wait is
//! bounded by [`super::BOUND`].

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use server::client::codec::{Consumer, Identifier, PollingStrategy};
use server::client::reply::{ConsumerOffsetReply, PollHead, decode_send_reply};
use server::client::request::{OffsetTarget, PollMessages, Request, StoreConsumerOffset};

use super::BOUND;

pub const HEADER: usize = 256;

pub const REGISTER: u8 = 1;
pub const NON_REPLICATED: u8 = 2;
pub const CREATE_STREAM: u8 = 128;
pub const CREATE_TOPIC: u8 = 132;
pub const SEND_MESSAGES: u8 = 160;
pub const STORE_CONSUMER_OFFSET: u8 = 161;
pub const GET_CLUSTER_METADATA: u32 = 12;
pub const POLL_MESSAGES: u32 = 100;
pub const GET_CONSUMER_OFFSET: u32 = 120;
pub const GET_STREAMS: u32 = 201;
pub const GET_TOPIC: u32 = 300;

/// One answer frame (header and body).
pub struct Answer(pub Vec<u8>);

impl Answer {
    pub fn command(&self) -> u8 {
        self.0[60]
    }
    pub fn status(&self) -> u32 {
        assert_eq!(self.command(), 8, "a Reply expected");
        u32::from_le_bytes(self.0[216..220].try_into().unwrap())
    }
    pub fn body(&self) -> &[u8] {
        &self.0[HEADER..]
    }
    /// The result section's code (0 for success).
    pub fn result(&self) -> u32 {
        assert_eq!(self.status(), 0);
        let body = self.body();
        match u32::from_le_bytes(body[0..4].try_into().unwrap()) {
            0 => 0,
            1 => u32::from_le_bytes(body[8..12].try_into().unwrap()),
            n => panic!("result count {n}"),
        }
    }
    /// 57/58 in the header or in the result section: the SDK resends.
    pub fn transient(&self) -> bool {
        self.command() == 8
            && (matches!(self.status(), 57 | 58)
                || (self.status() == 0
                    && self.body().len() == 12
                    && u32::from_le_bytes(self.body()[0..4].try_into().unwrap()) == 1
                    && matches!(self.result(), 57 | 58)))
    }
}

/// A Request frame.
pub fn frame(
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

/// A one-byte-length name.
pub fn name(text: &str) -> Vec<u8> {
    let mut out = vec![text.len() as u8];
    out.extend_from_slice(text.as_bytes());
    out
}

/// The body of a CreateTopic of `partitions` partitions named `topic` in stream `stream`.
pub fn topic_body(stream: u32, partitions: u32, topic: &str) -> Vec<u8> {
    let mut body = vec![1, 4];
    body.extend_from_slice(&stream.to_le_bytes());
    body.extend_from_slice(&partitions.to_le_bytes());
    body.extend_from_slice(&name(topic));
    body
}

/// The body of a SendMessages of `payloads` to `partition` of `stream`, topic 0.
pub fn send_body(stream: u32, partition: u32, payloads: &[Vec<u8>]) -> Vec<u8> {
    send_body_to(stream, 0, partition, payloads)
}

/// The body of a SendMessages of `payloads` to `partition` of `stream` / `topic`.
pub fn send_body_to(stream: u32, topic: u32, partition: u32, payloads: &[Vec<u8>]) -> Vec<u8> {
    let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let batch = wire::batch::build(0, 0, 0, 0, &slices);
    let mut envelope = vec![1, 4];
    envelope.extend_from_slice(&stream.to_le_bytes());
    envelope.extend_from_slice(&[1, 4]);
    envelope.extend_from_slice(&topic.to_le_bytes());
    envelope.extend_from_slice(&[2, 4]);
    envelope.extend_from_slice(&partition.to_le_bytes());
    envelope.extend_from_slice(&(payloads.len() as u32).to_le_bytes());
    let mut body = (envelope.len() as u32).to_le_bytes().to_vec();
    body.extend_from_slice(&envelope);
    body.extend_from_slice(&batch);
    body
}

/// Consumer 7 (a single consumer, numeric id).
pub fn consumer() -> Consumer {
    Consumer {
        group: false,
        id: Identifier::Numeric(7),
    }
}

/// Consumer 7's offset on `partition` of `stream`, topic 0.
pub fn target(stream: u32, partition: u32) -> OffsetTarget {
    OffsetTarget {
        consumer: consumer(),
        stream: Identifier::Numeric(stream),
        topic: Identifier::Numeric(0),
        partition: Some(partition),
    }
}

/// GetClusterMetadata: `(tcp port, role)` per node in roster order (role 0 = leader).
pub fn cluster_roles(body: &[u8]) -> Vec<(u16, u8)> {
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

/// One connection of one client id, lockstep.
pub struct Client {
    pub stream: TcpStream,
    pub client: u128,
    pub session: u64,
    pub request: u64,
}

impl Client {
    /// Connects to the client port, waiting for a (re)started node to bind it.
    pub fn connect(tcp: u16, client: u128) -> Client {
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

    /// One request, one answer.
    pub fn exchange_once(&mut self, f: &[u8]) -> Answer {
        self.stream.write_all(f).unwrap();
        let mut header = [0u8; HEADER];
        self.stream.read_exact(&mut header).unwrap();
        let size = u32::from_le_bytes(header[48..52].try_into().unwrap()) as usize;
        let mut out = header.to_vec();
        out.resize(size, 0);
        self.stream.read_exact(&mut out[HEADER..]).unwrap();
        Answer(out)
    }

    /// Resends the same request on a transient answer, as the SDK does (every 50 ms).
    pub fn exchange(&mut self, f: &[u8]) -> Answer {
        let start = Instant::now();
        loop {
            let answer = self.exchange_once(f);
            if !answer.transient() || start.elapsed() > BOUND {
                return answer;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Register with the default root user; the session is kept.
    pub fn login(&mut self) {
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

    /// A replicated request with the next request number, resent while transient.
    pub fn replicated(&mut self, operation: u8, body: &[u8]) -> Answer {
        let f = frame(self.client, operation, 0, self.session, self.request, body);
        self.request += 1;
        self.exchange(&f)
    }

    /// A replicated request with the next request number, sent once.
    pub fn replicated_once(&mut self, operation: u8, body: &[u8]) -> Answer {
        let f = frame(self.client, operation, 0, self.session, self.request, body);
        self.request += 1;
        self.exchange_once(&f)
    }

    /// A non-replicated request (`code`), resent while transient.
    pub fn read(&mut self, code: u32, body: &[u8]) -> Answer {
        let f = frame(self.client, NON_REPLICATED, code, self.session, 1, body);
        self.exchange(&f)
    }

    /// SendMessages of `payloads` to `partition` of `stream`, topic 0: the confirmed
    /// `(partition, base_offset)`.
    pub fn send(&mut self, stream: u32, partition: u32, payloads: &[Vec<u8>]) -> (u32, u64) {
        let body = send_body(stream, partition, payloads);
        let answer = self.replicated(SEND_MESSAGES, &body);
        assert_eq!(answer.status(), 0, "SendMessages to partition {partition}");
        let confirmations = decode_send_reply(answer.body()).unwrap();
        assert_eq!(confirmations.len(), 1, "{confirmations:?}");
        (confirmations[0].partition, confirmations[0].base_offset)
    }

    /// Every message of `partition` of `stream` from offset 0, as `(offset, payload)`; `None`
    /// if the node does not know the partition (yet).
    pub fn poll(&mut self, stream: u32, partition: u32) -> Option<Vec<(u64, Vec<u8>)>> {
        self.poll_with(
            stream,
            partition,
            PollingStrategy::Offset(0),
            100_000,
            false,
        )
    }

    /// Every message of `partition` of `stream` / `topic` from offset 0.
    pub fn poll_topic(
        &mut self,
        stream: u32,
        topic: u32,
        partition: u32,
    ) -> Option<Vec<(u64, Vec<u8>)>> {
        self.poll_at(
            stream,
            topic,
            partition,
            PollingStrategy::Offset(0),
            100_000,
            false,
        )
    }

    /// A PollMessages of consumer 7 on topic 0: `(offset, payload)` of every message
    /// returned, `None` on a non-zero status.
    pub fn poll_with(
        &mut self,
        stream: u32,
        partition: u32,
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Option<Vec<(u64, Vec<u8>)>> {
        self.poll_at(stream, 0, partition, strategy, count, auto_commit)
    }

    /// A PollMessages of consumer 7: `(offset, payload)` of every message returned, `None` on
    /// a non-zero status.
    pub fn poll_at(
        &mut self,
        stream: u32,
        topic: u32,
        partition: u32,
        strategy: PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Option<Vec<(u64, Vec<u8>)>> {
        let mut body = Vec::new();
        Request::PollMessages(PollMessages {
            consumer: consumer(),
            stream: Identifier::Numeric(stream),
            topic: Identifier::Numeric(topic),
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

    /// StoreConsumerOffset of consumer 7: the result code.
    pub fn store_offset(&mut self, stream: u32, partition: u32, offset: u64) -> u32 {
        let mut body = Vec::new();
        Request::StoreConsumerOffset(StoreConsumerOffset {
            target: target(stream, partition),
            offset,
            quorum: true,
        })
        .encode(&mut body);
        self.replicated(STORE_CONSUMER_OFFSET, &body).result()
    }

    /// GetConsumerOffset of consumer 7.
    pub fn consumer_offset(&mut self, stream: u32, partition: u32) -> Option<ConsumerOffsetReply> {
        let mut body = Vec::new();
        Request::GetConsumerOffset(target(stream, partition)).encode(&mut body);
        let answer = self.read(GET_CONSUMER_OFFSET, &body);
        assert_eq!(answer.status(), 0);
        ConsumerOffsetReply::decode(answer.body()).unwrap()
    }

    /// GetStreams: the names, in id order.
    pub fn streams(&mut self) -> Vec<String> {
        let answer = self.read(GET_STREAMS, &[]);
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
    pub fn topic(&mut self) -> Option<String> {
        let answer = self.read(GET_TOPIC, &[1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0]);
        assert_eq!(answer.status(), 0);
        let body = answer.body();
        if body.is_empty() {
            return None;
        }
        let len = usize::from(body[49]);
        Some(String::from_utf8(body[50..50 + len].to_vec()).unwrap())
    }
}
