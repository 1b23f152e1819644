//! The frames the client core builds itself (client-plane.md §1.2, §1.3, §4.2): Replies to a
//! request it answers locally and Evictions. Replies of the groups come built by the core.

use consensus::Frame;
use wire::decode::EvictionReason;
use wire::header::{EvictionHeader, FrameHeader, Layout, ReplyHeader, RequestHeader};
use wire::{Command, Sender};

use crate::client::reply::{Refusal, refusal};

const SENDER: Sender = Sender {
    cluster: 0,
    replica: 0,
    view: 0,
};

/// A Reply to `request` with header `status` and `body`; the common fields echo the request
/// (client, request number, operation, checksum, timestamp).
pub fn reply(request: &RequestHeader, status: u32, body: &[u8]) -> Frame {
    let mut h = ReplyHeader::zeroed();
    h.frame = FrameHeader::new(Command::Reply, SENDER);
    h.request_checksum = request.request_checksum;
    h.client = request.client;
    h.timestamp = request.timestamp;
    h.request = request.request;
    h.operation = request.operation;
    h.status.set(status);
    seal(h, body)
}

/// A Reply carrying a refusal as its operation's channel wants it (§4.1): the header status
/// for partition operations (the channel of the partition plane's pre-commit denials, as the
/// core's own), else as [`refusal`] decides.
pub fn refused(request: &RequestHeader, code: u32) -> Frame {
    let operation =
        wire::Operation::from_byte(request.operation).unwrap_or(wire::Operation::NonReplicated);
    if operation.is_partition() {
        return reply(request, code, &[]);
    }
    let Refusal { status, body } = refusal(operation, code);
    reply(request, status, &body)
}

/// A Reply from a [`Refusal`] (status and body as `route` decided).
pub fn from_refusal(request: &RequestHeader, refusal: &Refusal) -> Frame {
    reply(request, refusal.status, &refusal.body)
}

/// An Eviction of `client`; `window` is `(version, min)` for reason 14 (IncompatibleProtocol).
pub fn eviction(client: u128, reason: EvictionReason, window: Option<(u32, u32)>) -> Frame {
    let mut h = EvictionHeader::zeroed();
    h.frame = FrameHeader::new(Command::Eviction, SENDER);
    h.client.set(client);
    h.reason = reason as u8;
    if let (EvictionReason::IncompatibleProtocol, Some((version, min))) = (reason, window) {
        h.server_protocol_version.set(version);
        h.server_protocol_version_min.set(min);
    }
    seal(h, &[])
}

fn seal<H: Layout>(mut header: H, body: &[u8]) -> Frame {
    wire::encode::finish_header(&mut header, body).expect("a Reply or Eviction of a valid size");
    let mut bytes = Vec::with_capacity(wire::HEADER_SIZE + body.len());
    bytes.extend_from_slice(header.bytes());
    bytes.extend_from_slice(body);
    Frame::new(bytes)
}
