//! The partition plane's data layer, as pure functions the partition state machine and the
//! client core share (client-plane.md §8.3, §9; consensus.md §5.8, §14):
//! - where a poll starts ([`resolve_start`]) and the PollMessages reply built from the whole
//!   batches the journal's `PartitionLog` returns ([`build_poll_reply`]), including the
//!   rewritten header of a partly returned batch;
//! - consumer offsets over the journal's [`OffsetTable`] (the CONSUMER_OFFSETS artifact):
//!   the deterministic apply of StoreConsumerOffset and the GetConsumerOffset answer.
//!
//! Offsets here are message offsets, never op numbers (consensus.md §14).

pub mod lifecycle;
pub mod machine;
pub mod reader;

use bytes::Bytes;
use journal::artifact::OffsetTable;
use journal::batch::{self, BatchFault, BatchInfo};
use xxhash_rust::xxh3::xxh3_64;

use crate::client::codec::{Consumer, PollingStrategy};
use crate::client::reply::{ConsumerOffsetReply, PollHead, RESULT_OK, result_rejected};
use crate::client::request::{BATCH_HEADER_SIZE, Request};
use crate::client::status;

/// Size of a message frame's fixed head (client-plane.md §8.1).
const FRAME_HEAD: usize = 48;

/// Where a poll starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From this message offset.
    Offset(u64),
    /// From the first batch whose `base_timestamp` is at least this (µs).
    Timestamp(u64),
}

/// A poll's answer from the group's shard: built from the in-memory tail, or a read of the
/// segments the caller awaits (decision 281).
#[derive(Debug)]
pub enum PollAnswer {
    /// Answered from memory.
    Ready(Poll),
    /// Starts below the tail: await [`reader::DiskPoll::read`].
    Disk(reader::DiskPoll),
}

/// Resolves a polling strategy (§8.3): Offset from its value, First from 0, Last from
/// `current - (count - 1)`, Next from the stored offset + 1 (0 if none), Timestamp by batch
/// time. `current` is the highest committed offset (`None` for an empty partition). `None`
/// means an empty poll: nothing committed, or a start beyond `current`.
pub fn resolve_start(
    strategy: PollingStrategy,
    count: u32,
    current: Option<u64>,
    stored: Option<u64>,
) -> Option<Start> {
    let current = current?;
    let offset = match strategy {
        PollingStrategy::Timestamp(t) => return Some(Start::Timestamp(t)),
        PollingStrategy::Offset(v) => v,
        PollingStrategy::First(_) => 0,
        PollingStrategy::Last(_) => current.saturating_sub(u64::from(count.max(1)) - 1),
        PollingStrategy::Next(_) => match stored {
            Some(s) => s.checked_add(1)?,
            None => 0,
        },
    };
    (offset <= current).then_some(Start::Offset(offset))
}

/// Why stored batches cannot be turned into a poll reply (storage returned bytes that are not
/// whole verified batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    /// A batch fails verification.
    #[error("stored batch at byte {at}: {fault:?}")]
    Batch {
        /// Where in the input.
        at: usize,
        /// What is wrong.
        fault: BatchFault,
    },
}

/// A built poll reply: the 16-byte head and the batches after it, kept apart so that the
/// reply is written with one vectored write and no batch is copied into a body (decision 405).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    /// The body's head (partition id, current offset, messages count; client-plane.md §8.3).
    pub head: [u8; 16],
    /// The batches, in order: shared with the tail or the segment read holding them, or a
    /// batch returned in part under its rewritten header.
    pub batches: Vec<Bytes>,
    /// Messages returned.
    pub messages_count: u32,
    /// Offset of the last message returned (what auto-commit stores).
    pub last_offset: Option<u64>,
}

impl Poll {
    /// The body's length: the head and every batch.
    pub fn body_len(&self) -> usize {
        self.head.len() + self.batches.iter().map(Bytes::len).sum::<usize>()
    }

    /// The body as one buffer (a copy: for a reply that must travel as one frame, and tests).
    pub fn body(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.body_len());
        body.extend_from_slice(&self.head);
        for b in &self.batches {
            body.extend_from_slice(b);
        }
        body
    }
}

/// Builds a [`Poll`] from whole batches the caller has already checked: batches of the
/// in-memory tail (verified when they were committed, decision 262) or batches read from the
/// segments and verified by that read. At most `count` messages from `start`.
pub(crate) struct PollBuilder {
    start: Option<Start>,
    count: u32,
    taken: u32,
    last_offset: Option<u64>,
    batches: Vec<Bytes>,
}

impl PollBuilder {
    pub(crate) fn new(start: Option<Start>, count: u32) -> PollBuilder {
        PollBuilder {
            start,
            count,
            taken: 0,
            last_offset: None,
            batches: Vec::new(),
        }
    }

    /// Whether another batch can add messages.
    pub(crate) fn wants_more(&self) -> bool {
        self.start.is_some() && self.taken < self.count
    }

    /// Takes what `batch` (exactly `info.len` bytes, checked) holds of the poll: the whole
    /// batch shared, a part under a rewritten header, or nothing (`false`).
    pub(crate) fn push(&mut self, info: &BatchInfo, batch: &Bytes) -> bool {
        if !self.wants_more() {
            return false;
        }
        let (from, wanted_all) = match self.start {
            None => return false,
            Some(Start::Timestamp(t)) if info.base_timestamp < t => return false,
            Some(Start::Timestamp(_)) => (0, true),
            Some(Start::Offset(o)) if info.end_offset() <= o => return false,
            Some(Start::Offset(o)) => (o.saturating_sub(info.base_offset), o <= info.base_offset),
        };
        let available = u64::from(info.message_count) - from;
        let n = available.min(u64::from(self.count - self.taken)) as u32;
        if wanted_all && n == info.message_count {
            self.batches.push(batch.clone());
        } else {
            self.batches.push(batch_part(batch, from as u32, n));
        }
        self.taken += n;
        self.last_offset = Some(info.base_offset + from + u64::from(n) - 1);
        true
    }

    pub(crate) fn finish(self, partition_id: u32, current: Option<u64>) -> Poll {
        let mut head = Vec::with_capacity(16);
        PollHead {
            partition_id,
            current_offset: current.unwrap_or(0),
            messages_count: self.taken,
        }
        .encode(&mut head);
        Poll {
            head: head.as_slice().try_into().expect("a poll head is 16 bytes"),
            batches: self.batches,
            messages_count: self.taken,
            last_offset: self.last_offset,
        }
    }
}

/// Builds the PollMessages reply from `batches`: whole stored batches in offset order (as
/// `PartitionLog::read_from_offset` / `read_from_timestamp` return them), each verified here
/// before it is used, at most `count` messages from `start`. A batch returned in part gets a
/// new header (§8.3): `batch_length` and `message_count` cover the selected frames,
/// `batch_checksum` is recomputed; base offset and timestamps are unchanged and frames keep
/// their deltas. An empty result is the 16-byte head with count 0, never an empty body.
pub fn build_poll_reply(
    partition_id: u32,
    current: Option<u64>,
    start: Option<Start>,
    count: u32,
    batches: &[u8],
) -> Result<Poll, PollError> {
    let mut builder = PollBuilder::new(start, count);
    let mut at = 0;
    while at < batches.len() && builder.wants_more() {
        let bytes = &batches[at..];
        let info = batch::verify(bytes).map_err(|fault| PollError::Batch { at, fault })?;
        builder.push(&info, &Bytes::copy_from_slice(&bytes[..info.len as usize]));
        at += info.len as usize;
    }
    Ok(builder.finish(partition_id, current))
}

/// The offset of the last message in a PollMessages reply body (what an auto-commit poll
/// stores, client-plane.md §8.2): the last frame's `base_offset + offset_delta`. `None` when
/// the reply holds no message or its batches do not verify.
pub fn last_polled_offset(body: &[u8]) -> Option<u64> {
    let (head, mut batches) = PollHead::decode(body).ok()?;
    let mut last = None;
    while !batches.is_empty() {
        let info = batch::verify(batches).ok()?;
        let bytes = batches.get(..info.len as usize)?;
        let mut at = BATCH_HEADER_SIZE;
        for _ in 0..info.message_count {
            let frame = bytes.get(at..at + FRAME_HEAD)?;
            let u32_at = |i: usize| u32::from_le_bytes(frame[i..i + 4].try_into().expect("4"));
            last = Some(info.base_offset + u64::from(u32_at(24)));
            at += FRAME_HEAD + u32_at(32) as usize + u32_at(36) as usize;
        }
        batches = &batches[info.len as usize..];
    }
    if head.messages_count == 0 { None } else { last }
}

/// Frames `first..first + n` of a checked batch under a rewritten header.
fn batch_part(batch: &[u8], first: u32, n: u32) -> Bytes {
    assert!(n > 0, "a part holds at least one message");
    let mut at = BATCH_HEADER_SIZE;
    let mut frames = 0..0;
    let mut checksums = Vec::with_capacity(n as usize);
    for i in 0.. {
        let head = &batch[at..at + FRAME_HEAD];
        let len = FRAME_HEAD
            + u32::from_le_bytes(head[32..36].try_into().expect("4")) as usize
            + u32::from_le_bytes(head[36..40].try_into().expect("4")) as usize;
        if i == first {
            frames.start = at;
        }
        if i >= first {
            checksums.push(u64::from_le_bytes(head[0..8].try_into().expect("8")));
        }
        at += len;
        if i + 1 == first + n {
            frames.end = at;
            break;
        }
    }
    let mut header = [0u8; BATCH_HEADER_SIZE];
    header.copy_from_slice(&batch[..BATCH_HEADER_SIZE]);
    let length = (BATCH_HEADER_SIZE + frames.len()) as u64;
    header[32..40].copy_from_slice(&length.to_le_bytes());
    header[48..52].copy_from_slice(&n.to_le_bytes());
    let mut digest = Vec::with_capacity(44 + 8 * checksums.len());
    digest.extend_from_slice(&header[0..40]);
    digest.extend_from_slice(&header[48..52]);
    for c in &checksums {
        digest.extend_from_slice(&c.to_le_bytes());
    }
    header[40..48].copy_from_slice(&xxh3_64(&digest).to_le_bytes());
    let mut out = Vec::with_capacity(BATCH_HEADER_SIZE + frames.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&batch[frames]);
    Bytes::from(out)
}

/// The highest committed offset of a partition whose next offset is `next_offset`.
pub fn current_offset(next_offset: u64) -> Option<u64> {
    next_offset.checked_sub(1)
}

/// The stored offset of `consumer`.
pub fn stored_offset(table: &OffsetTable, consumer: &Consumer) -> Option<u64> {
    let map = if consumer.group {
        &table.groups
    } else {
        &table.consumers
    };
    map.get(&consumer.key()).copied()
}

/// The GetConsumerOffset answer (§9.2): `None` (an empty body) when nothing is stored.
pub fn consumer_offset_reply(
    table: &OffsetTable,
    consumer: &Consumer,
    partition_id: u32,
) -> Option<ConsumerOffsetReply> {
    Some(ConsumerOffsetReply {
        partition_id,
        current_offset: current_offset(table.next_offset).unwrap_or(0),
        stored_offset: stored_offset(table, consumer)?,
    })
}

/// Stores `offset` for `consumer`: refused with 4100 (InvalidOffset) beyond the partition's
/// highest committed offset (and on an empty partition).
pub fn store_offset(table: &mut OffsetTable, consumer: &Consumer, offset: u64) -> Result<(), u32> {
    if current_offset(table.next_offset).is_none_or(|current| offset > current) {
        return Err(status::INVALID_OFFSET);
    }
    let map = if consumer.group {
        &mut table.groups
    } else {
        &mut table.consumers
    };
    map.insert(consumer.key(), offset);
    Ok(())
}

/// The deterministic apply of a committed StoreConsumerOffset body (the client's bytes; the
/// group of the prepare already names the partition): its reply body, a result section.
pub fn apply_store_consumer_offset(table: &mut OffsetTable, body: &[u8]) -> Vec<u8> {
    let outcome = match Request::decode(wire::Operation::StoreConsumerOffset, 0, body) {
        Ok(Request::StoreConsumerOffset(store)) => {
            store_offset(table, &store.target.consumer, store.offset)
        }
        _ => Err(status::INVALID_COMMAND),
    };
    match outcome {
        Ok(()) => RESULT_OK.to_vec(),
        Err(code) => result_rejected(code).to_vec(),
    }
}

/// The deterministic apply of a committed DeleteConsumerOffset body (decision 322): removes
/// the consumer's stored offset; a consumer with none is refused with 3021
/// (ConsumerOffsetNotFound). Its reply body is a result section.
pub fn apply_delete_consumer_offset(table: &mut OffsetTable, body: &[u8]) -> Vec<u8> {
    let outcome = match Request::decode(wire::Operation::DeleteConsumerOffset, 0, body) {
        Ok(Request::DeleteConsumerOffset(delete)) => {
            let consumer = &delete.target.consumer;
            let map = if consumer.group {
                &mut table.groups
            } else {
                &mut table.consumers
            };
            map.remove(&consumer.key())
                .map(|_| ())
                .ok_or(status::CONSUMER_OFFSET_NOT_FOUND)
        }
        _ => Err(status::INVALID_COMMAND),
    };
    match outcome {
        Ok(()) => RESULT_OK.to_vec(),
        Err(code) => result_rejected(code).to_vec(),
    }
}

#[cfg(test)]
mod tests;
