//! Bytes in, whole frames out (wire.md §3, §6 steps 1–2).
//!
//! The framer checks only `size` and the command byte, as soon as a header is in and before any
//! room is made for the body; seals and everything else are checked later, on the borrowed frame.
//! A violation poisons the framer: the connection must close, and every later call repeats the
//! error.
//!
//! Buffering: one buffer per connection, grown only when a frame does not fit (at most to the
//! frame's size plus [`READ_CHUNK`]), never zero-filled per read, compacted by moving the one
//! partial frame at its end. Frames come out as slices of it, so the steady state allocates and
//! copies nothing per frame.

use core::mem::offset_of;

use crate::header::FrameHeader;
use crate::{Command, HEADER_SIZE, MAX_MESSAGE_SIZE_DEFAULT};

/// The writable space [`Framer::spare`] guarantees: one socket read.
pub const READ_CHUNK: usize = 64 * 1024;

/// The buffer a connection starts with; large enough that compaction is rare for frames far
/// below it.
pub const BUFFER_INITIAL: usize = 1024 * 1024;

const SIZE_OFFSET: usize = offset_of!(FrameHeader, size);
const COMMAND_OFFSET: usize = offset_of!(FrameHeader, command);

// `size` is a u32; widening it to usize must be lossless.
const _: () = assert!(usize::BITS >= u32::BITS);

/// A framing violation: the reference closes the connection (wire.md §6 steps 1–2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// `size` is below the 256-byte header.
    #[error("frame size {size} is smaller than a header")]
    SizeTooSmall {
        /// The declared `size`.
        size: u32,
    },
    /// `size` is above `max_message_size` (the limit is inclusive).
    #[error("frame size {size} exceeds max_message_size {max}")]
    SizeTooLarge {
        /// The declared `size`.
        size: u32,
        /// The configured `max_message_size`.
        max: usize,
    },
    /// The command byte is above [`Command::MAX`].
    #[error("unknown command byte {0}")]
    UnknownCommand(u8),
    /// A slice handed to a whole-frame decoder is not exactly one frame: a caller bug (the
    /// framer hands out whole frames), reported as a value all the same.
    #[error("{len} bytes do not hold exactly one frame of {size} bytes")]
    Incomplete {
        /// Bytes given.
        len: usize,
        /// The frame's `size`, or 256 when not even a header is there.
        size: usize,
    },
}

/// The framing check of one header: `Ok(None)` until 256 bytes are in, then the frame's total
/// size, or the violation in spec order (size, then command byte). Exposed so that other
/// readers (vector tests, tools) classify frames exactly as the framer does.
pub fn frame_size(
    header_prefix: &[u8],
    max_message_size: usize,
) -> Result<Option<usize>, FramingError> {
    let Some(header) = header_prefix.first_chunk::<HEADER_SIZE>() else {
        return Ok(None);
    };
    let size = u32::from_le_bytes([
        header[SIZE_OFFSET],
        header[SIZE_OFFSET + 1],
        header[SIZE_OFFSET + 2],
        header[SIZE_OFFSET + 3],
    ]);
    let len = size as usize;
    if len < HEADER_SIZE {
        return Err(FramingError::SizeTooSmall { size });
    }
    if len > max_message_size {
        return Err(FramingError::SizeTooLarge {
            size,
            max: max_message_size,
        });
    }
    let command = header[COMMAND_OFFSET];
    if command > Command::MAX {
        return Err(FramingError::UnknownCommand(command));
    }
    Ok(Some(len))
}

/// Checks that `frame` is exactly one whole frame within the limits and returns its header and
/// command: the entry check of every whole-frame decoder (the receive pipeline, the handshake).
pub fn whole_frame(
    frame: &[u8],
    max_message_size: usize,
) -> Result<(&[u8; HEADER_SIZE], Command), FramingError> {
    let incomplete = |size| FramingError::Incomplete {
        len: frame.len(),
        size,
    };
    let header = frame
        .first_chunk::<HEADER_SIZE>()
        .ok_or(incomplete(HEADER_SIZE))?;
    let size = frame_size(header, max_message_size)?.expect("a whole header is in");
    if size != frame.len() {
        return Err(incomplete(size));
    }
    let command =
        Command::from_byte(header[COMMAND_OFFSET]).expect("frame_size checked the command");
    Ok((header, command))
}

/// A connection's stream framer. Feed it with [`Framer::spare`] + [`Framer::filled`] (read
/// straight into its buffer) or [`Framer::push`], then drain [`Framer::next_frame`] until it
/// returns `None` before reading again.
#[derive(Debug)]
pub struct Framer {
    /// Always initialized up to its length: zeroed once per growth, never per read.
    buf: Vec<u8>,
    /// First byte not yet returned as a frame.
    start: usize,
    /// End of the bytes read.
    end: usize,
    max_message_size: usize,
    poisoned: Option<FramingError>,
}

impl Default for Framer {
    fn default() -> Self {
        Framer::new(MAX_MESSAGE_SIZE_DEFAULT)
    }
}

impl Framer {
    /// A framer accepting frames up to `max_message_size` bytes (inclusive), the connection's
    /// `message_bus.max_message_size`.
    pub fn new(max_message_size: usize) -> Framer {
        let capacity = BUFFER_INITIAL
            .min(max_message_size.saturating_add(READ_CHUNK))
            .max(HEADER_SIZE + READ_CHUNK);
        Framer {
            buf: vec![0; capacity],
            start: 0,
            end: 0,
            max_message_size,
            poisoned: None,
        }
    }

    /// Writable space of at least [`READ_CHUNK`] bytes to read the socket into; report what was
    /// read with [`Framer::filled`]. May compact or grow the buffer, never for a bad header.
    /// Once poisoned, the space is scratch: bytes written there are dropped.
    pub fn spare(&mut self) -> &mut [u8] {
        self.reserve(READ_CHUNK);
        &mut self.buf[self.end..]
    }

    /// Records that the first `n` bytes of the last [`Framer::spare`] now hold input.
    ///
    /// # Panics
    /// When `n` exceeds that space: a caller bug, not a network condition.
    pub fn filled(&mut self, n: usize) {
        assert!(
            n <= self.buf.len() - self.end,
            "filled past the spare space"
        );
        if self.poisoned.is_none() {
            self.end += n;
        }
    }

    /// Copies `bytes` in: for callers that do not own the read buffer (tests, fuzzing, TLS
    /// plaintext). Dropped once poisoned.
    pub fn push(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        if self.poisoned.is_none() {
            self.buf[self.end..self.end + bytes.len()].copy_from_slice(bytes);
            self.end += bytes.len();
        }
    }

    /// The next complete frame, exactly `size` bytes borrowed from the buffer; `None` until one
    /// is complete; the violation, for ever, once the stream broke a framing rule.
    pub fn next_frame(&mut self) -> Option<Result<&[u8], FramingError>> {
        if let Some(error) = self.poisoned {
            return Some(Err(error));
        }
        let pending = &self.buf[self.start..self.end];
        match frame_size(pending, self.max_message_size) {
            Ok(Some(size)) if size <= pending.len() => {
                let frame = self.start..self.start + size;
                self.start += size;
                if self.start == self.end {
                    // Nothing pending: the next read starts at 0 without a compaction.
                    self.start = 0;
                    self.end = 0;
                }
                Some(Ok(&self.buf[frame]))
            }
            Ok(_) => None,
            Err(error) => {
                self.poisoned = Some(error);
                Some(Err(error))
            }
        }
    }

    /// Takes a large frame that has begun but is not complete out of the buffer, so that its
    /// remaining bytes are read straight into the buffer it will live in (decision 365): when
    /// the pending bytes start with a header that passes [`frame_size`] for a frame of at
    /// least `min` bytes that they do not hold whole, returns a buffer of exactly the frame's
    /// size whose first `n` bytes are the ones already read, and `n`; the framer is then empty.
    /// `None` (and nothing taken) when poisoned, when fewer than a header's bytes are pending,
    /// for a bad header (left for [`Framer::next_frame`] to report), for a frame below `min`,
    /// and for a frame already whole. Call it after draining [`Framer::next_frame`].
    pub fn take_partial(&mut self, min: usize) -> Option<(Vec<u8>, usize)> {
        if self.poisoned.is_some() {
            return None;
        }
        let pending = &self.buf[self.start..self.end];
        let size = frame_size(pending, self.max_message_size).ok()??;
        if size < min || size <= pending.len() {
            return None;
        }
        // Zeroed by the allocator (fresh pages), not by a fill pass; the caller reads the rest
        // of the frame over the zeroes and hands the buffer on only once it is full.
        let mut frame = vec![0; size];
        frame[..pending.len()].copy_from_slice(pending);
        let n = pending.len();
        self.start = 0;
        self.end = 0;
        Some((frame, n))
    }

    /// The violation that closed the stream, if any.
    pub fn poisoned(&self) -> Option<FramingError> {
        self.poisoned
    }

    /// Bytes read but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The buffer's size, for memory accounting.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Makes `min` bytes writable after `end`: compaction first (moves only the pending bytes,
    /// one partial frame when the caller drains), growth only when they cannot fit.
    fn reserve(&mut self, min: usize) {
        if self.poisoned.is_some() {
            self.start = 0;
            self.end = 0;
            return;
        }
        if self.buf.len() - self.end >= min {
            return;
        }
        let pending = self.end - self.start;
        let needed = pending.saturating_add(min);
        if needed <= self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
        } else {
            self.grow(needed);
            if self.poisoned.is_some() {
                return;
            }
        }
        self.start = 0;
        self.end = pending;
    }

    /// Replaces the buffer by a larger one holding the pending bytes at 0. Doubling keeps the
    /// copies linear; the cap keeps memory at the pending frame's size plus one read, and the
    /// header is checked first so that a bad `size` never makes room for its body.
    fn grow(&mut self, needed: usize) {
        let pending = &self.buf[self.start..self.end];
        let frame_end = match frame_size(pending, self.max_message_size) {
            Ok(size) => size.unwrap_or(self.max_message_size),
            Err(error) => {
                self.poisoned = Some(error);
                self.start = 0;
                self.end = 0;
                return;
            }
        };
        let capacity = self
            .buf
            .len()
            .saturating_mul(2)
            .min(frame_end.saturating_add(READ_CHUNK))
            .max(needed);
        // `vec!` of zeroes comes from the allocator already zeroed (no fill pass).
        let mut grown = vec![0; capacity];
        grown[..pending.len()].copy_from_slice(pending);
        self.buf = grown;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(command: u8, body: usize, fill: u8) -> Vec<u8> {
        let mut frame = vec![fill; HEADER_SIZE + body];
        let size = u32::try_from(frame.len()).expect("small frame");
        frame[SIZE_OFFSET..SIZE_OFFSET + 4].copy_from_slice(&size.to_le_bytes());
        frame[COMMAND_OFFSET] = command;
        frame
    }

    fn header(size: u32, command: u8) -> Vec<u8> {
        let mut header = vec![0; HEADER_SIZE];
        header[SIZE_OFFSET..SIZE_OFFSET + 4].copy_from_slice(&size.to_le_bytes());
        header[COMMAND_OFFSET] = command;
        header
    }

    fn drain(framer: &mut Framer, out: &mut Vec<Vec<u8>>) {
        while let Some(frame) = framer.next_frame() {
            out.push(frame.expect("valid stream").to_vec());
        }
    }

    #[test]
    fn frame_size_checks_in_spec_order() {
        let max = 4096;
        assert_eq!(frame_size(&header(300, 29)[..255], max), Ok(None));
        assert_eq!(frame_size(&header(256, 29), max), Ok(Some(256)));
        assert_eq!(frame_size(&header(4096, 0), max), Ok(Some(4096)));
        assert_eq!(
            frame_size(&header(255, 30), max),
            Err(FramingError::SizeTooSmall { size: 255 })
        );
        assert_eq!(
            frame_size(&header(4097, 30), max),
            Err(FramingError::SizeTooLarge { size: 4097, max })
        );
        assert_eq!(
            frame_size(&header(256, 30), max),
            Err(FramingError::UnknownCommand(30))
        );
    }

    #[test]
    fn split_at_every_byte_boundary_reassembles() {
        let frames = [frame(1, 0, 7), frame(6, 300, 8), frame(29, 1, 9)];
        let stream = frames.concat();
        for split in 0..=stream.len() {
            let mut framer = Framer::new(4096);
            let mut out = Vec::new();
            framer.push(&stream[..split]);
            drain(&mut framer, &mut out);
            framer.push(&stream[split..]);
            drain(&mut framer, &mut out);
            assert_eq!(out, frames, "split at {split}");
            assert_eq!(framer.buffered(), 0);
        }
    }

    #[test]
    fn single_byte_reads_reassemble() {
        let frames = [frame(9, 0, 1), frame(25, 513, 2)];
        let mut framer = Framer::new(4096);
        let mut out = Vec::new();
        for byte in frames.concat() {
            framer.spare()[0] = byte;
            framer.filled(1);
            drain(&mut framer, &mut out);
        }
        assert_eq!(out, frames);
    }

    #[test]
    fn bad_header_fails_before_the_body_and_stays_failed() {
        let mut framer = Framer::new(4096);
        let capacity = framer.capacity();
        framer.push(&header(4097, 1));
        let error = FramingError::SizeTooLarge {
            size: 4097,
            max: 4096,
        };
        assert_eq!(framer.next_frame(), Some(Err(error)));
        framer.push(&vec![0; 10 * capacity]);
        assert_eq!(framer.capacity(), capacity);
        assert_eq!(framer.next_frame(), Some(Err(error)));
        assert_eq!(framer.poisoned(), Some(error));
    }

    #[test]
    fn bad_header_never_grows_the_buffer_even_undrained() {
        let mut framer = Framer::new(MAX_MESSAGE_SIZE_DEFAULT);
        let capacity = framer.capacity();
        framer.push(&header(256, 31));
        framer.push(&vec![0; 2 * capacity]);
        assert_eq!(framer.capacity(), capacity);
        assert_eq!(
            framer.next_frame(),
            Some(Err(FramingError::UnknownCommand(31)))
        );
    }

    #[test]
    fn large_frame_grows_only_with_its_bytes_and_within_bound() {
        let max = MAX_MESSAGE_SIZE_DEFAULT;
        let size = 8 * BUFFER_INITIAL;
        let big = frame(6, size - HEADER_SIZE, 3);
        let mut framer = Framer::new(max);
        framer.push(&big[..HEADER_SIZE]);
        assert_eq!(framer.next_frame(), None);
        assert_eq!(framer.capacity(), BUFFER_INITIAL);
        let mut fed = HEADER_SIZE;
        while fed < big.len() {
            let n = framer.spare().len().min(READ_CHUNK).min(big.len() - fed);
            framer.spare()[..n].copy_from_slice(&big[fed..fed + n]);
            framer.filled(n);
            fed += n;
            assert!(framer.capacity() <= size + READ_CHUNK);
            let ahead = BUFFER_INITIAL.max(2 * (fed + READ_CHUNK));
            assert!(framer.capacity() <= ahead, "grew ahead of the bytes");
        }
        assert_eq!(framer.next_frame(), Some(Ok(&big[..])));
    }

    #[test]
    fn steady_state_does_not_reallocate() {
        let frames = [frame(6, 0, 1), frame(6, 1024, 2), frame(6, 64 * 1024, 3)];
        let stream: Vec<u8> = frames.concat().repeat(20);
        let mut framer = Framer::default();
        let capacity = framer.capacity();
        let mut count = 0;
        for read in stream.chunks(READ_CHUNK) {
            framer.push(read);
            while let Some(frame) = framer.next_frame() {
                assert_eq!(frame.expect("valid"), frames[count % 3]);
                count += 1;
            }
        }
        assert_eq!(count, 60);
        assert_eq!(framer.capacity(), capacity);
    }

    /// A stream fed in uneven reads, with every frame of at least `min` bytes still arriving
    /// when the buffer is drained taken out and finished in its own buffer, gives back exactly
    /// the frames in order: the taken prefix is the bytes read and nothing past them.
    fn run_with_takes(stream: &[u8], reads: &[usize], min: usize) -> (Vec<Vec<u8>>, usize) {
        let mut framer = Framer::new(MAX_MESSAGE_SIZE_DEFAULT);
        let mut out = Vec::new();
        let mut taken = 0;
        let mut at = 0;
        let mut r = 0;
        while at < stream.len() {
            let n = reads[r % reads.len()].min(stream.len() - at);
            r += 1;
            framer.push(&stream[at..at + n]);
            at += n;
            drain(&mut framer, &mut out);
            if let Some((mut frame, filled)) = framer.take_partial(min) {
                taken += 1;
                assert!(frame.len() >= min && filled < frame.len());
                assert_eq!(
                    framer.buffered(),
                    0,
                    "the framer keeps none of a taken frame"
                );
                // The rest of the frame comes straight from the stream, as a socket read into
                // the taken buffer would.
                let rest = frame.len() - filled;
                frame[filled..].copy_from_slice(&stream[at..at + rest]);
                at += rest;
                out.push(frame);
            }
        }
        drain(&mut framer, &mut out);
        (out, taken)
    }

    #[test]
    fn large_frames_under_way_are_taken_whole_and_in_order() {
        let min = 4096;
        let frames = [
            frame(6, 10_000, 1),
            frame(6, 10, 2),
            frame(6, min - HEADER_SIZE, 3),
            frame(6, min - HEADER_SIZE - 1, 4),
            frame(6, 300_000, 5),
            frame(6, 0, 6),
        ];
        let stream = frames.concat();
        for reads in [&[1000][..], &[257, 3000, 17], &[100_000], &[4096, 1]] {
            let (out, taken) = run_with_takes(&stream, reads, min);
            assert_eq!(out, frames, "reads {reads:?}");
            assert!(taken >= 1, "reads {reads:?}: no frame was taken");
        }
    }

    #[test]
    fn take_partial_leaves_small_whole_bad_and_headerless_input_alone() {
        let min = 4096;
        let big = frame(6, 8000, 7);
        // Not a whole header yet.
        let mut framer = Framer::new(MAX_MESSAGE_SIZE_DEFAULT);
        framer.push(&big[..HEADER_SIZE - 1]);
        assert_eq!(framer.take_partial(min), None);
        // A whole frame stays for next_frame.
        framer.push(&big[HEADER_SIZE - 1..]);
        assert_eq!(framer.take_partial(min), None);
        assert_eq!(framer.next_frame(), Some(Ok(&big[..])));
        // A frame below the bound stays.
        let small = frame(6, min - HEADER_SIZE - 1, 8);
        framer.push(&small[..HEADER_SIZE + 10]);
        assert_eq!(framer.take_partial(min), None);
        framer.push(&small[HEADER_SIZE + 10..]);
        assert_eq!(framer.next_frame(), Some(Ok(&small[..])));
        // A bad header is left for next_frame to report, and nothing is allocated for it.
        let mut bad = Framer::new(4096);
        bad.push(&header(4097, 1));
        assert_eq!(bad.take_partial(1), None);
        assert!(matches!(
            bad.next_frame(),
            Some(Err(FramingError::SizeTooLarge { .. }))
        ));
        assert_eq!(bad.take_partial(1), None);
    }

    #[test]
    fn a_taken_frame_holds_the_bytes_read_and_zeroes_past_them() {
        // The framer's buffer held older, larger frames: the taken buffer must carry only the
        // new frame's bytes read so far, never stale bytes from behind them.
        let mut framer = Framer::new(MAX_MESSAGE_SIZE_DEFAULT);
        let old = frame(6, 200_000, 0xAA);
        framer.push(&old);
        assert_eq!(framer.next_frame(), Some(Ok(&old[..])));
        let new = frame(6, 100_000, 0x55);
        framer.push(&new[..5000]);
        let (taken, filled) = framer.take_partial(4096).expect("a large frame under way");
        assert_eq!(filled, 5000);
        assert_eq!(taken.len(), new.len());
        assert_eq!(&taken[..filled], &new[..5000]);
        assert!(
            taken[filled..].iter().all(|b| *b == 0),
            "stale bytes past the read ones"
        );
        assert_eq!(framer.buffered(), 0);
        assert_eq!(framer.next_frame(), None);
    }
}
