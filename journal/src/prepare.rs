//! Checks of a prepare frame as the journal stores it: every entry read back is verified by
//! prepare identity and body digest (wire crate), never trusted.

use wire::header::{Layout, PrepareHeader};
use wire::integrity::{body_digest, verify_prepare_identity};
use wire::{Command, HEADER_SIZE};

/// Why bytes are not a whole, intact prepare frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameFault {
    /// Shorter than a header.
    #[error("frame of {0} bytes is shorter than a header")]
    TooShort(usize),
    /// The command byte is not Prepare.
    #[error("command byte {0} is not Prepare")]
    NotPrepare(u8),
    /// `size` disagrees with the bytes there are.
    #[error("header size {size} but {len} bytes")]
    Size {
        /// The header's `size`.
        size: u32,
        /// The bytes available.
        len: usize,
    },
    /// The prepare identity does not verify.
    #[error("prepare identity does not verify")]
    Identity,
    /// The body digest does not match `checksum_body`.
    #[error("body digest mismatch")]
    BodyDigest,
    /// The journal's own checksum of the stored frame (which also covers `view`, outside the
    /// prepare identity) does not match.
    #[error("stored record checksum mismatch")]
    Record,
}

/// A verified prepare header (a copy of its 256 bytes) with the fields the journal uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header(pub [u8; HEADER_SIZE]);

impl Header {
    fn view(&self) -> &PrepareHeader {
        PrepareHeader::view(&self.0).expect("256 bytes")
    }

    /// The op.
    pub fn op(&self) -> u64 {
        self.view().op.get()
    }

    /// The prepare identity (`checksum`).
    pub fn identity(&self) -> u128 {
        self.view().frame.checksum.get()
    }

    /// The parent identity.
    pub fn parent(&self) -> u128 {
        self.view().parent.get()
    }

    /// The frame size, header included.
    pub fn size(&self) -> u32 {
        self.view().frame.size.get()
    }

    /// The primary's commit point when the prepare was built.
    pub fn commit(&self) -> u64 {
        self.view().commit.get()
    }

    /// The group key.
    pub fn group(&self) -> u64 {
        self.view().group.get()
    }

    /// The timestamp.
    pub fn timestamp(&self) -> u64 {
        self.view().timestamp.get()
    }

    /// The view the prepare was sent in.
    pub fn view_number(&self) -> u32 {
        self.view().frame.view.get()
    }
}

/// Checks a header alone: command Prepare and identity. The body is not looked at.
pub fn verify_header(bytes: &[u8]) -> Result<Header, FrameFault> {
    let header: [u8; HEADER_SIZE] = bytes
        .get(..HEADER_SIZE)
        .ok_or(FrameFault::TooShort(bytes.len()))?
        .try_into()
        .expect("256 bytes");
    if header[60] != Command::Prepare.byte() {
        return Err(FrameFault::NotPrepare(header[60]));
    }
    if !verify_prepare_identity(&header) {
        return Err(FrameFault::Identity);
    }
    let header = Header(header);
    if (header.size() as usize) < HEADER_SIZE {
        return Err(FrameFault::Size {
            size: header.size(),
            len: bytes.len(),
        });
    }
    Ok(header)
}

/// Checks a whole frame: header, `size == frame.len()`, identity, and — when `digest` — the
/// body digest (metadata prepares commit to their body; partition prepares carry 0 and are
/// covered by the WAL record checksum instead).
pub fn verify_frame(frame: &[u8], digest: bool) -> Result<Header, FrameFault> {
    let header = verify_header(frame)?;
    if header.size() as usize != frame.len() {
        return Err(FrameFault::Size {
            size: header.size(),
            len: frame.len(),
        });
    }
    let checksum_body = PrepareHeader::view(frame)
        .expect("checked")
        .frame
        .checksum_body
        .get();
    if digest && checksum_body != body_digest(&frame[HEADER_SIZE..]) {
        return Err(FrameFault::BodyDigest);
    }
    Ok(header)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wire::encode::{Sender, finish_header};
    use wire::header::FrameHeader;
    use wire::{GroupId, Operation};

    /// A sealed metadata prepare for op `op` with `parent`, body of `body_len` bytes.
    pub(crate) fn prepare(op: u64, parent: u128, body_len: usize, salt: u8) -> Vec<u8> {
        prepare_in(GroupId::METADATA.0, op, parent, body_len, salt)
    }

    pub(crate) fn prepare_in(
        group: u64,
        op: u64,
        parent: u128,
        body_len: usize,
        salt: u8,
    ) -> Vec<u8> {
        let sender = Sender {
            cluster: 42,
            replica: 0,
            view: 1,
        };
        let mut header = PrepareHeader::zeroed();
        header.frame = FrameHeader::new(Command::Prepare, sender);
        header.op.set(op);
        header.parent.set(parent);
        header.commit.set(op.saturating_sub(1));
        header.timestamp.set(1_000 + op);
        header.operation = Operation::CreateStream.byte();
        header.group.set(group);
        let body: Vec<u8> = (0..body_len)
            .map(|i| (i as u8).wrapping_mul(31) ^ salt)
            .collect();
        finish_header(&mut header, &body).expect("finish");
        let mut frame = header.bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn a_finished_prepare_verifies_and_flips_do_not() {
        let frame = prepare(3, 9, 100, 0);
        let header = verify_frame(&frame, true).unwrap();
        assert_eq!(header.op(), 3);
        assert_eq!(header.parent(), 9);
        for at in [0, 17, 60, 176, 255, 256, 355] {
            let mut bad = frame.clone();
            bad[at] ^= 4;
            assert!(verify_frame(&bad, true).is_err(), "byte {at}");
        }
        assert_eq!(
            verify_frame(&frame[..100], true),
            Err(FrameFault::TooShort(100))
        );
    }
}
