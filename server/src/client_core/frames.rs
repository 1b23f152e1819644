//! The frames the client core builds itself (client-plane.md §1.2, §1.3, §4.2): Replies to a
//! request it answers locally and Evictions. Replies of the groups come built by the core.

use bytes::Bytes;
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
    seal(reply_header(request, status), body)
}

/// A Reply header echoing `request`, with `status`; the size and checksums are left to seal.
fn reply_header(request: &RequestHeader, status: u32) -> ReplyHeader {
    let mut h = ReplyHeader::zeroed();
    h.frame = FrameHeader::new(Command::Reply, SENDER);
    h.request_checksum = request.request_checksum;
    h.client = request.client;
    h.timestamp = request.timestamp;
    h.request = request.request;
    h.operation = request.operation;
    h.status.set(status);
    h
}

/// A reply ready to be written: a frame (the header and the first part of the body) and
/// further body parts after it, written with one vectored write, never joined (decision 405).
/// The header's size covers every part.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The header and the start of the body.
    pub frame: Frame,
    /// The rest of the body, in order.
    pub more: Vec<Bytes>,
    /// For a poll built here: the offset of its last message (what auto-commit stores);
    /// `None` when unknown (then read from the body).
    pub last_offset: Option<Option<u64>>,
}

impl From<Frame> for Answer {
    fn from(frame: Frame) -> Answer {
        Answer {
            frame,
            more: Vec::new(),
            last_offset: None,
        }
    }
}

impl Answer {
    /// The header's command.
    pub fn command(&self) -> Option<wire::Command> {
        self.frame.command()
    }

    /// The whole reply as one frame (a copy of the parts when there are any: a reply that
    /// crosses the shard mesh).
    pub fn into_frame(self) -> Frame {
        if self.more.is_empty() {
            return self.frame;
        }
        let len = self.frame.bytes().len() + self.more.iter().map(Bytes::len).sum::<usize>();
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(self.frame.bytes());
        for part in &self.more {
            bytes.extend_from_slice(part);
        }
        Frame::new(bytes)
    }

    /// The offset of the last polled message, for auto-commit.
    pub fn polled_last_offset(&self) -> Option<u64> {
        match self.last_offset {
            Some(known) => known,
            None => crate::partition::last_polled_offset(self.frame.body()),
        }
    }

    /// Every part to write, the frame first.
    pub fn parts(&self) -> Vec<Bytes> {
        let mut parts = Vec::with_capacity(1 + self.more.len());
        parts.push(self.frame.shared().clone());
        parts.extend(self.more.iter().cloned());
        parts
    }
}

/// A Reply whose body is `head` then `more` (a poll: its head, then its batches as they are
/// held); the frame holds the header and `head`, the parts follow it unjoined.
pub fn reply_parts(request: &RequestHeader, status: u32, head: &[u8], more: Vec<Bytes>) -> Answer {
    let mut h = reply_header(request, status);
    let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + more.len());
    parts.push(head);
    parts.extend(more.iter().map(|b| &b[..]));
    wire::encode::finish_header_parts(&mut h, &parts).expect("a Reply of a valid size");
    let mut bytes = Vec::with_capacity(wire::HEADER_SIZE + head.len());
    bytes.extend_from_slice(h.bytes());
    bytes.extend_from_slice(head);
    Answer {
        frame: Frame::new(bytes),
        more,
        last_offset: None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use wire::header::Layout;

    /// A reply written in parts (decision 405) is byte for byte the reply built over the
    /// joined body: same header (size, seal) and body.
    #[test]
    fn a_reply_in_parts_is_the_joined_reply() {
        let mut request = RequestHeader::zeroed();
        request.client.set(0x1234_5678_9abc);
        request.request.set(42);
        request.operation = wire::Operation::NonReplicated.byte();
        let head = [9u8; 16];
        let parts = vec![
            Bytes::from(vec![1u8; 1000]),
            Bytes::from(vec![2u8; 3]),
            Bytes::new(),
            Bytes::from(vec![3u8; 70_000]),
        ];
        let mut joined = head.to_vec();
        for p in &parts {
            joined.extend_from_slice(p);
        }
        let whole = reply(&request, 0, &joined);
        let answer = reply_parts(&request, 0, &head, parts.clone());
        assert_eq!(answer.frame.bytes().len(), wire::HEADER_SIZE + 16);
        let written: Vec<u8> = answer.parts().iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(written, whole.bytes());
        assert_eq!(answer.into_frame().bytes(), whole.bytes());
    }
}
