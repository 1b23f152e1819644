//! Frame builders: every frame the core emits goes through `wire::finish_header`.

use wire::header::{
    CommitHeader, EvictionHeader, FrameHeader, Layout, PrepareHeader, PrepareOkHeader, ReplyHeader,
    RequestHeader,
};
use wire::{Command, Sender};

use crate::types::Frame;

/// Error codes the core puts on the client plane (client-plane.md §4.1).
pub mod codes {
    /// `TransientNotCommitted`: outcome unknown, retry the same request.
    pub const TRANSIENT_NOT_COMMITTED: u32 = 57;
    /// `TransientNotAccepted`: never queued, retry anywhere.
    pub const TRANSIENT_NOT_ACCEPTED: u32 = 58;
    /// `InvalidMessageChecksum`.
    pub const INVALID_MESSAGE_CHECKSUM: u32 = 4027;
    /// `InvalidBatchChecksum`.
    pub const INVALID_BATCH_CHECKSUM: u32 = 4039;
    /// `InvalidMessagesCount`.
    pub const INVALID_MESSAGES_COUNT: u32 = 4009;
    /// `InvalidFormat`.
    pub const INVALID_FORMAT: u32 = 4;
    /// `RequestAlreadyApplied`. TODO: the spec names this code but gives no number; 60 is a
    /// placeholder until client-plane.md §4.1 lists it (the SDK treats unknown codes as
    /// terminal errors, which is the intended meaning).
    pub const REQUEST_ALREADY_APPLIED: u32 = 60;
    /// `ClientIdOwnedByAnotherUser`. TODO: number not in the spec; placeholder as above.
    pub const CLIENT_ID_OWNED_BY_ANOTHER_USER: u32 = 61;
}

pub(crate) fn finish<H: Layout>(mut header: H, body: &[u8]) -> Frame {
    wire::finish_header(&mut header, body).expect("the core builds only valid commands");
    let mut bytes = Vec::with_capacity(wire::HEADER_SIZE + body.len());
    bytes.extend_from_slice(header.bytes());
    bytes.extend_from_slice(body);
    Frame::new(bytes)
}

/// A buffer of `wire::HEADER_SIZE` zero bytes followed by `body`, sized exactly: the one copy
/// of a body the core makes on its way into a frame ([`finish_in_place`] seals it).
pub(crate) fn with_header_room(body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(wire::HEADER_SIZE + body.len());
    bytes.resize(wire::HEADER_SIZE, 0);
    bytes.extend_from_slice(body);
    bytes
}

/// `buf[start..]` moved to follow `wire::HEADER_SIZE` bytes of room, in `buf`'s own allocation
/// when its capacity has the room (decision 460: the client core reads a request's body into a
/// buffer with `wire::HEADER_SIZE` bytes spare, so a SendMessages batch becomes its prepare
/// with one move over bytes the admission check just read, no fresh allocation to page-fault
/// in). The room holds whatever was there: [`finish_in_place`] overwrites all of it.
/// `start` must be at most `buf.len()`.
pub(crate) fn into_header_room(mut buf: Vec<u8>, start: usize) -> Vec<u8> {
    let len = buf.len() - start;
    let room = wire::HEADER_SIZE;
    if start < room {
        buf.reserve_exact(room - start);
        buf.resize(room + len, 0);
        buf.copy_within(start..start + len, room);
    } else if start > room {
        buf.copy_within(start.., room);
        buf.truncate(room + len);
    }
    buf
}

/// Seals a frame whose body already sits in `bytes` after `wire::HEADER_SIZE` placeholder
/// bytes (a state chunk read straight into its frame): no second copy of the body.
pub(crate) fn finish_in_place<H: Layout>(mut header: H, mut bytes: Vec<u8>) -> Frame {
    wire::finish_header(&mut header, &bytes[wire::HEADER_SIZE..])
        .expect("the core builds only valid commands");
    bytes[..wire::HEADER_SIZE].copy_from_slice(header.bytes());
    Frame::new(bytes)
}

/// PrepareOk for a journaled prepare (§5.7): echoes, with the acker's view and `commit_max`.
pub(crate) fn prepare_ok(sender: Sender, prepare: &PrepareHeader, commit_max: u64) -> Frame {
    let mut h = PrepareOkHeader::zeroed();
    h.frame = FrameHeader::new(Command::PrepareOk, sender);
    h.parent = prepare.parent;
    h.prepare_checksum = prepare.frame.checksum;
    h.op = prepare.op;
    h.commit.set(commit_max);
    h.timestamp = prepare.timestamp;
    h.request = prepare.request;
    h.operation = prepare.operation;
    h.group = prepare.group;
    finish(h, &[])
}

/// Commit heartbeat (§5.9).
pub(crate) fn commit(sender: Sender, group: u64, commit_min: u64, counter: u64) -> Frame {
    let mut h = CommitHeader::zeroed();
    h.frame = FrameHeader::new(Command::Commit, sender);
    h.timestamp_monotonic.set(counter);
    h.commit.set(commit_min);
    h.group.set(group);
    finish(h, &[])
}

/// The reply of a committed op: every field from the prepare as journaled (wire.md §11.6).
pub(crate) fn reply_committed(prepare: &PrepareHeader, body: &[u8]) -> Frame {
    let mut h = ReplyHeader::zeroed();
    h.frame.cluster = prepare.frame.cluster;
    h.frame.view = prepare.frame.view;
    h.frame.release = prepare.frame.release;
    h.frame.replica = prepare.frame.replica;
    h.frame.command = Command::Reply.byte();
    h.request_checksum = prepare.request_checksum;
    h.client = prepare.client;
    h.op = prepare.op;
    h.commit = prepare.op;
    h.timestamp = prepare.timestamp;
    h.request = prepare.request;
    h.operation = prepare.operation;
    finish(h, body)
}

/// Partition-plane pre-commit denial: `status = code`, empty body, `op = 0`.
pub(crate) fn reply_denied_status(
    sender: Sender,
    request: &RequestHeader,
    commit_max: u64,
    code: u32,
) -> Frame {
    let mut h = ReplyHeader::zeroed();
    h.frame = FrameHeader::new(Command::Reply, sender);
    h.request_checksum = request.request_checksum;
    h.client = request.client;
    h.commit.set(commit_max);
    h.timestamp = request.timestamp;
    h.request = request.request;
    h.operation = request.operation;
    h.status.set(code);
    finish(h, &[])
}

/// Metadata-plane refusal: `status = 0`, body `[1][0][code]`, common region from the request,
/// `op = commit = commit_max` (wire.md §11.6).
pub(crate) fn reply_denied_result(request: &RequestHeader, commit_max: u64, code: u32) -> Frame {
    let mut h = ReplyHeader::zeroed();
    h.frame.cluster = request.frame.cluster;
    h.frame.view = request.frame.view;
    h.frame.release = request.frame.release;
    h.frame.replica = request.frame.replica;
    h.frame.command = Command::Reply.byte();
    h.request_checksum = request.request_checksum;
    h.client = request.client;
    h.op.set(commit_max);
    h.commit.set(commit_max);
    h.timestamp = request.timestamp;
    h.request = request.request;
    h.operation = request.operation;
    let mut body = [0u8; 12];
    body[0..4].copy_from_slice(&1u32.to_le_bytes());
    body[8..12].copy_from_slice(&code.to_le_bytes());
    finish(h, &body)
}

/// Eviction frame for a client (wire.md §11.7).
pub(crate) fn eviction(
    sender: Sender,
    client: u128,
    reason: wire::decode::EvictionReason,
) -> Frame {
    let mut h = EvictionHeader::zeroed();
    h.frame = FrameHeader::new(Command::Eviction, sender);
    h.client.set(client);
    h.reason = reason as u8;
    finish(h, &[])
}

/// A journaled prepare re-stamped with `view` for retransmission (identity unchanged, §5.9).
pub(crate) fn restamp(frame: &Frame, view: u32) -> Frame {
    if frame.get(52..56) == Some(&view.to_le_bytes()[..]) {
        return frame.clone();
    }
    let mut bytes = frame.bytes().to_vec();
    bytes[52..56].copy_from_slice(&view.to_le_bytes());
    Frame::new(bytes)
}

/// A journaled prepare as a RepairPrepare (only the command byte changes, §10.2).
pub(crate) fn as_repair(frame: &Frame) -> Frame {
    let mut bytes = frame.bytes().to_vec();
    bytes[60] = Command::RepairPrepare.byte();
    Frame::new(bytes)
}

/// Whole frame bytes from a decoded header and body.
pub(crate) fn whole<H: Layout>(header: &H, body: &[u8]) -> Frame {
    let mut bytes = Vec::with_capacity(wire::HEADER_SIZE + body.len());
    bytes.extend_from_slice(header.bytes());
    bytes.extend_from_slice(body);
    Frame::new(bytes)
}
