//! The suffix body of DoViewChange and StartView (wire.md §11.11): packed Prepare headers,
//! highest op first, consecutive, with blank entries for slots the sender does not hold.

use thiserror::Error;

use crate::header::{Layout, PrepareHeader};
use crate::integrity::verify_prepare_identity;
use crate::{Command, HEADER_SIZE, Operation};

/// The most entries a suffix may carry.
pub const SUFFIX_ENTRIES_MAX: usize = 128;

/// Why a suffix body does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SuffixError {
    /// The body length is not a multiple of 256.
    #[error("suffix body of {len} bytes is not a whole number of headers")]
    NotWholeHeaders {
        /// Body length.
        len: usize,
    },
    /// More than [`SUFFIX_ENTRIES_MAX`] entries.
    #[error("suffix has {count} entries, more than 128")]
    TooManyEntries {
        /// Entry count.
        count: usize,
    },
    /// A nack or present bit is set at or beyond the entry count.
    #[error("bitset names entry {index} of a {count}-entry suffix")]
    BitsetBeyondSuffix {
        /// Lowest offending bit.
        index: u32,
        /// Entry count.
        count: usize,
    },
    /// An entry is not a valid Prepare header (command, reserved bytes, operation).
    #[error("suffix entry {index} is not a valid prepare header")]
    BadEntry {
        /// Entry index.
        index: usize,
    },
    /// Entry `index` does not carry op `head_op - index`.
    #[error("suffix entry {index} has op {op}, expected {expected:?}")]
    OpOutOfOrder {
        /// Entry index.
        index: usize,
        /// The op it carries.
        op: u64,
        /// The op it must carry (`None` when `head_op - index` underflows).
        expected: Option<u64>,
    },
    /// A held entry's checksum is not its identity.
    #[error("suffix entry {index} fails its prepare identity")]
    IdentityMismatch {
        /// Entry index.
        index: usize,
    },
    /// A held entry's timestamp is not above the next held entry's.
    #[error("suffix entry {index} has a timestamp not above the entry below it")]
    TimestampNotDecreasing {
        /// Entry index.
        index: usize,
    },
    /// Adjacent held entries do not chain (`parent` is not the identity below).
    #[error("suffix entry {index} does not chain to the entry below it")]
    ChainBreak {
        /// Entry index.
        index: usize,
    },
}

/// A decoded suffix: a view over the body, every entry already checked.
#[derive(Debug, Clone, Copy)]
pub struct Suffix<'a> {
    head_op: u64,
    body: &'a [u8],
}

/// One entry of a suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuffixEntry<'a> {
    /// The sender holds this prepare's header.
    Held(&'a PrepareHeader),
    /// The sender does not hold the slot at this op.
    Blank {
        /// The slot's op.
        op: u64,
    },
}

impl SuffixEntry<'_> {
    /// The entry's op.
    pub fn op(&self) -> u64 {
        match self {
            SuffixEntry::Held(h) => h.op.get(),
            SuffixEntry::Blank { op } => *op,
        }
    }
}

/// The blank pattern for `op`: all zero except the Prepare command byte and `op`.
pub fn blank_entry(op: u64) -> PrepareHeader {
    let mut header = PrepareHeader::zeroed();
    header.frame.command = Command::Prepare.byte();
    header.op.set(op);
    header
}

/// Whether `header` is byte-equal to the blank pattern of its op.
pub fn is_blank(header: &PrepareHeader) -> bool {
    *header == blank_entry(header.op.get())
}

/// The stateless Prepare checks (wire.md §11.2) applied to a header regardless of its command
/// byte: both reserved regions zero and a defined operation.
pub(crate) fn prepare_fields_valid(header: &PrepareHeader) -> bool {
    header.frame.reserved_frame.iter().all(|b| *b == 0)
        && header.reserved.iter().all(|b| *b == 0)
        && Operation::from_byte(header.operation).is_some()
}

/// Checks the shape of a suffix body against its bitsets (wire.md §11.9 validation).
pub fn check_shape(body_len: usize, bitsets: &[u128]) -> Result<usize, SuffixError> {
    if !body_len.is_multiple_of(HEADER_SIZE) {
        return Err(SuffixError::NotWholeHeaders { len: body_len });
    }
    let count = body_len / HEADER_SIZE;
    if count > SUFFIX_ENTRIES_MAX {
        return Err(SuffixError::TooManyEntries { count });
    }
    for bits in bitsets {
        let beyond = if count >= 128 { 0 } else { bits >> count };
        if beyond != 0 {
            let index = count as u32 + beyond.trailing_zeros();
            return Err(SuffixError::BitsetBeyondSuffix { index, count });
        }
    }
    Ok(count)
}

impl<'a> Suffix<'a> {
    /// Decodes and checks a suffix body whose first entry must carry `head_op`.
    pub fn decode(head_op: u64, body: &'a [u8]) -> Result<Suffix<'a>, SuffixError> {
        check_shape(body.len(), &[])?;
        let suffix = Suffix { head_op, body };
        let mut above: Option<(usize, &PrepareHeader)> = None;
        for (index, chunk) in body.chunks_exact(HEADER_SIZE).enumerate() {
            let header = PrepareHeader::view(chunk).expect("chunk is a header");
            let expected = head_op.checked_sub(index as u64);
            if expected != Some(header.op.get()) {
                return Err(SuffixError::OpOutOfOrder {
                    index,
                    op: header.op.get(),
                    expected,
                });
            }
            if header.frame.command != Command::Prepare.byte() || !prepare_fields_valid(header) {
                return Err(SuffixError::BadEntry { index });
            }
            if is_blank(header) {
                continue;
            }
            if header.frame.checksum.get() != 0 && !verify_prepare_identity(header.bytes()) {
                return Err(SuffixError::IdentityMismatch { index });
            }
            if let Some((above_index, above_header)) = above {
                check_link(above_index, above_header, header)?;
            }
            above = Some((index, header));
        }
        Ok(suffix)
    }

    /// The op of entry 0.
    pub fn head_op(&self) -> u64 {
        self.head_op
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.body.len() / HEADER_SIZE
    }

    /// Whether the suffix is empty.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// The entries, highest op first.
    pub fn entries(&self) -> impl Iterator<Item = SuffixEntry<'a>> + 'a {
        self.body.chunks_exact(HEADER_SIZE).map(|chunk| {
            let header = PrepareHeader::view(chunk).expect("chunk is a header");
            if is_blank(header) {
                SuffixEntry::Blank {
                    op: header.op.get(),
                }
            } else {
                SuffixEntry::Held(header)
            }
        })
    }
}

/// Compares a held entry with the next held entry below it.
fn check_link(
    index: usize,
    above: &PrepareHeader,
    below: &PrepareHeader,
) -> Result<(), SuffixError> {
    if above.timestamp.get() <= below.timestamp.get() {
        return Err(SuffixError::TimestampNotDecreasing { index });
    }
    let adjacent = above.op.get() == below.op.get() + 1;
    if adjacent
        && below.frame.checksum.get() != 0
        && above.parent.get() != below.frame.checksum.get()
    {
        return Err(SuffixError::ChainBreak { index });
    }
    Ok(())
}

/// Encodes a suffix body from entries given highest op first (blank entries as
/// [`blank_entry`]). The caller is responsible for consecutive ops.
pub fn encode<'h>(entries: impl IntoIterator<Item = &'h PrepareHeader>, out: &mut Vec<u8>) {
    for header in entries {
        out.extend_from_slice(header.bytes());
    }
}
