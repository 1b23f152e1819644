//! The shared field encodings of the client plane (client-plane.md §5): a bounded reader that
//! answers every short or malformed input with a [`BodyError`], and the writers beside it.

use thiserror::Error;

/// Why a client body does not decode. Every variant is an operating error (untrusted bytes),
/// never a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BodyError {
    /// The body ends inside `field`.
    #[error("body ends inside {field}")]
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// Bytes left after the last field.
    #[error("{len} trailing bytes after the body")]
    Trailing {
        /// How many.
        len: usize,
    },
    /// A text field is not UTF-8.
    #[error("{field} is not UTF-8")]
    NotUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A length-prefixed field with a length outside its range.
    #[error("{field} has length {len}")]
    Length {
        /// The field.
        field: &'static str,
        /// The length found.
        len: u64,
    },
    /// An Identifier kind other than 1 (numeric) or 2 (string).
    #[error("identifier kind {0}")]
    IdentifierKind(u8),
    /// A numeric Identifier whose length is not 4, or a string one of length 0.
    #[error("identifier of kind {kind} with length {len}")]
    IdentifierLength {
        /// The kind byte.
        kind: u8,
        /// The length byte.
        len: u8,
    },
    /// A Consumer kind other than 1 (consumer) or 2 (group).
    #[error("consumer kind {0}")]
    ConsumerKind(u8),
    /// A Partitioning kind other than 1, 2, 3, or a length that does not fit the kind.
    #[error("partitioning kind {kind} with length {len}")]
    Partitioning {
        /// The kind byte.
        kind: u8,
        /// The length byte.
        len: u8,
    },
    /// A polling strategy kind outside 1..=5.
    #[error("polling strategy kind {0}")]
    StrategyKind(u8),
    /// The optional-partition flag is neither 0 nor 1.
    #[error("optional partition flag {0}")]
    PartitionFlag(u8),
    /// An option entry of kind 0 or above 15.
    #[error("option value kind {0}")]
    OptionKind(u8),
    /// An option key that is not of kind 2 (string).
    #[error("option key of kind {0}")]
    OptionKeyKind(u8),
    /// An options block with a key and no value.
    #[error("option key without a value")]
    OptionWithoutValue,
    /// More than 1024 option pairs.
    #[error("more than {max} option pairs", max = OPTIONS_PAIRS_MAX)]
    OptionsTooMany,
    /// An options block above 100 000 bytes.
    #[error("options block of {0} bytes")]
    OptionsTooLarge(usize),
    /// The same option key twice.
    #[error("duplicate option key")]
    OptionDuplicateKey,
    /// A fixed-size option value whose length is not its kind's width.
    #[error("option value of kind {kind} with length {len}")]
    OptionWidth {
        /// The kind.
        kind: u8,
        /// The length found.
        len: u32,
    },
    /// The SendMessages envelope's `metadata_length` disagrees with its fields.
    #[error("metadata_length {declared} but the envelope fields take {actual}")]
    MetadataLength {
        /// The declared value.
        declared: u32,
        /// What the fields took.
        actual: u32,
    },
    /// The envelope's `messages_count` disagrees with the batch header's.
    #[error("messages_count {envelope} but the batch says {batch}")]
    MessagesCount {
        /// The envelope's count.
        envelope: u32,
        /// The batch header's.
        batch: u32,
    },
    /// A boolean byte other than 0 or 1.
    #[error("{field} byte {value} is not a boolean")]
    Bool {
        /// The field.
        field: &'static str,
        /// The byte.
        value: u8,
    },
}

/// At most this many key/value pairs in an options block (§5).
pub const OPTIONS_PAIRS_MAX: usize = 1024;
/// At most this many bytes in an options block (§5).
pub const OPTIONS_BYTES_MAX: usize = 100_000;

/// A cursor over untrusted bytes: every read is bounds-checked and names its field.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// The unread bytes, consuming them.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    /// `len` bytes.
    pub fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], BodyError> {
        let (head, tail) = self
            .bytes
            .split_at_checked(len)
            .ok_or(BodyError::Truncated { field })?;
        self.bytes = tail;
        Ok(head)
    }

    /// An array of `N` bytes.
    pub fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], BodyError> {
        let bytes = self.take(N, field)?;
        Ok(bytes.try_into().expect("take returned N bytes"))
    }

    /// A byte.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, BodyError> {
        Ok(self.array::<1>(field)?[0])
    }
    /// A little-endian u16.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, BodyError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    /// A little-endian u32.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, BodyError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    /// A little-endian u64.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, BodyError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    /// A little-endian f32.
    pub fn f32(&mut self, field: &'static str) -> Result<f32, BodyError> {
        Ok(f32::from_le_bytes(self.array(field)?))
    }
    /// A 0/1 byte.
    pub fn bool(&mut self, field: &'static str) -> Result<bool, BodyError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(BodyError::Bool { field, value }),
        }
    }

    /// `u8 len` + UTF-8, with `len` in `min..=255`.
    pub fn str_u8(&mut self, min: u8, field: &'static str) -> Result<&'a str, BodyError> {
        let len = self.u8(field)?;
        if len < min {
            return Err(BodyError::Length {
                field,
                len: u64::from(len),
            });
        }
        utf8(self.take(usize::from(len), field)?, field)
    }

    /// `u32 len` + UTF-8 (any length the body holds).
    pub fn str_u32(&mut self, field: &'static str) -> Result<&'a str, BodyError> {
        let len = self.u32(field)?;
        let bytes = self.take(usize::try_from(len).unwrap_or(usize::MAX), field)?;
        utf8(bytes, field)
    }

    /// Fails unless every byte was read.
    pub fn finish(self) -> Result<(), BodyError> {
        match self.bytes.len() {
            0 => Ok(()),
            len => Err(BodyError::Trailing { len }),
        }
    }
}

fn utf8<'a>(bytes: &'a [u8], field: &'static str) -> Result<&'a str, BodyError> {
    std::str::from_utf8(bytes).map_err(|_| BodyError::NotUtf8 { field })
}

/// Writes `u8 len` + bytes. Panics if `text` is longer than 255 bytes: callers hold values
/// that were decoded or validated to fit (a programmer error otherwise).
pub fn put_str_u8(out: &mut Vec<u8>, text: &str) {
    let len = u8::try_from(text.len()).expect("a u8-prefixed string fits 255 bytes");
    out.push(len);
    out.extend_from_slice(text.as_bytes());
}

/// Writes `u32 len` + bytes.
pub fn put_str_u32(out: &mut Vec<u8>, text: &str) {
    let len = u32::try_from(text.len()).expect("a u32-prefixed string fits 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// A Name (§5): `u8 len` (1..=255) + UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// A name, if it is 1..=255 bytes.
    pub fn new(text: &str) -> Option<Name> {
        (1..=255)
            .contains(&text.len())
            .then(|| Name(text.to_owned()))
    }
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Decodes a Name.
    pub fn read(r: &mut Reader<'_>, field: &'static str) -> Result<Name, BodyError> {
        Ok(Name(r.str_u8(1, field)?.to_owned()))
    }
    /// Encodes a Name.
    pub fn write(&self, out: &mut Vec<u8>) {
        put_str_u8(out, &self.0);
    }
}

/// An Identifier (§5): a numeric id or a name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identifier {
    /// Kind 1: a u32 id.
    Numeric(u32),
    /// Kind 2: a name of 1..=255 bytes.
    Named(Name),
}

impl Identifier {
    /// Decodes an Identifier.
    pub fn read(r: &mut Reader<'_>, field: &'static str) -> Result<Identifier, BodyError> {
        let kind = r.u8(field)?;
        let len = r.u8(field)?;
        match (kind, len) {
            (1, 4) => Ok(Identifier::Numeric(r.u32(field)?)),
            (2, 1..) => Ok(Identifier::Named(Name(
                utf8(r.take(usize::from(len), field)?, field)?.to_owned(),
            ))),
            (1 | 2, _) => Err(BodyError::IdentifierLength { kind, len }),
            _ => Err(BodyError::IdentifierKind(kind)),
        }
    }
    /// Encodes an Identifier.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Identifier::Numeric(id) => {
                out.extend_from_slice(&[1, 4]);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Identifier::Named(name) => {
                out.push(2);
                name.write(out);
            }
        }
    }
}

/// A Consumer (§5): a plain consumer or a consumer group, each named by an Identifier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Consumer {
    /// Kind 2 (consumer group) when true, kind 1 (consumer) otherwise.
    pub group: bool,
    /// Its id.
    pub id: Identifier,
}

impl Consumer {
    /// Decodes a Consumer.
    pub fn read(r: &mut Reader<'_>) -> Result<Consumer, BodyError> {
        let group = match r.u8("consumer kind")? {
            1 => false,
            2 => true,
            kind => return Err(BodyError::ConsumerKind(kind)),
        };
        Ok(Consumer {
            group,
            id: Identifier::read(r, "consumer id")?,
        })
    }
    /// Encodes a Consumer.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(if self.group { 2 } else { 1 });
        self.id.write(out);
    }

    /// The numeric key a plain consumer's offsets are stored under: its id, or XXH32 (seed 0)
    /// of its name (§5).
    pub fn key(&self) -> u32 {
        match &self.id {
            Identifier::Numeric(id) => *id,
            Identifier::Named(name) => xxhash_rust::xxh32::xxh32(name.as_str().as_bytes(), 0),
        }
    }
}

/// How SendMessages picks a partition (§5).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Partitioning {
    /// Kind 1: round-robin over the topic's partitions.
    Balanced,
    /// Kind 2: this partition.
    Partition(u32),
    /// Kind 3: XXH32(key, seed 0) mod partitions; 1..=255 bytes.
    Key(Vec<u8>),
}

impl Partitioning {
    /// Decodes a Partitioning.
    pub fn read(r: &mut Reader<'_>) -> Result<Partitioning, BodyError> {
        let kind = r.u8("partitioning")?;
        let len = r.u8("partitioning")?;
        match (kind, len) {
            (1, 0) => Ok(Partitioning::Balanced),
            (2, 4) => Ok(Partitioning::Partition(r.u32("partitioning")?)),
            (3, 1..) => Ok(Partitioning::Key(
                r.take(usize::from(len), "partitioning")?.to_vec(),
            )),
            _ => Err(BodyError::Partitioning { kind, len }),
        }
    }
    /// Encodes a Partitioning. Panics on a key outside 1..=255 bytes (a programmer error).
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Partitioning::Balanced => out.extend_from_slice(&[1, 0]),
            Partitioning::Partition(id) => {
                out.extend_from_slice(&[2, 4]);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Partitioning::Key(key) => {
                let len = u8::try_from(key.len()).expect("a messages key fits 255 bytes");
                assert!(len > 0, "a messages key is not empty");
                out.extend_from_slice(&[3, len]);
                out.extend_from_slice(key);
            }
        }
    }
    /// The encoded size.
    pub fn encoded_len(&self) -> usize {
        match self {
            Partitioning::Balanced => 2,
            Partitioning::Partition(_) => 6,
            Partitioning::Key(key) => 2 + key.len(),
        }
    }
}

/// Where a poll starts (§5, §8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PollingStrategy {
    /// Kind 1: from this offset.
    Offset(u64),
    /// Kind 2: batches whose `base_timestamp` is at least this (µs).
    Timestamp(u64),
    /// Kind 3: from offset 0 (the value is carried and ignored).
    First(u64),
    /// Kind 4: the last `count` messages (the value is carried and ignored).
    Last(u64),
    /// Kind 5: the stored offset + 1, or 0 (the value is carried and ignored).
    Next(u64),
}

impl PollingStrategy {
    /// Decodes a strategy (9 bytes).
    pub fn read(r: &mut Reader<'_>) -> Result<PollingStrategy, BodyError> {
        let kind = r.u8("polling strategy")?;
        let value = r.u64("polling strategy")?;
        Ok(match kind {
            1 => PollingStrategy::Offset(value),
            2 => PollingStrategy::Timestamp(value),
            3 => PollingStrategy::First(value),
            4 => PollingStrategy::Last(value),
            5 => PollingStrategy::Next(value),
            kind => return Err(BodyError::StrategyKind(kind)),
        })
    }
    /// Encodes a strategy.
    pub fn write(&self, out: &mut Vec<u8>) {
        let (kind, value) = match *self {
            PollingStrategy::Offset(v) => (1, v),
            PollingStrategy::Timestamp(v) => (2, v),
            PollingStrategy::First(v) => (3, v),
            PollingStrategy::Last(v) => (4, v),
            PollingStrategy::Next(v) => (5, v),
        };
        out.push(kind);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

/// An optional partition (§5): 5 bytes, flag then id.
pub fn read_optional_partition(r: &mut Reader<'_>) -> Result<Option<u32>, BodyError> {
    let flag = r.u8("partition flag")?;
    let id = r.u32("partition id")?;
    match flag {
        0 => Ok(None),
        1 => Ok(Some(id)),
        flag => Err(BodyError::PartitionFlag(flag)),
    }
}

/// Writes an optional partition (absent: flag 0 and id 0).
pub fn write_optional_partition(out: &mut Vec<u8>, partition: Option<u32>) {
    out.push(u8::from(partition.is_some()));
    out.extend_from_slice(&partition.unwrap_or(0).to_le_bytes());
}

/// One option value: its kind (1..=15, §5) and bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OptionValue {
    /// Value kind (1 raw, 2 string, 3 bool, ... 15 f64).
    pub kind: u8,
    /// The value's bytes (1..=255).
    pub bytes: Vec<u8>,
}

/// Value kinds of the options block.
pub mod kind {
    /// Raw bytes.
    pub const RAW: u8 = 1;
    /// UTF-8 string.
    pub const STRING: u8 = 2;
    /// One byte, 0 or 1.
    pub const BOOL: u8 = 3;
    /// u32, little-endian.
    pub const U32: u8 = 11;
    /// u64, little-endian.
    pub const U64: u8 = 12;
}

/// Natural width of a fixed-size value kind, `None` for variable ones (raw, string).
fn kind_width(kind: u8) -> Option<u32> {
    Some(match kind {
        3 | 4 | 9 => 1,
        5 | 10 => 2,
        6 | 11 | 14 => 4,
        7 | 12 | 15 => 8,
        8 | 13 => 16,
        _ => return None,
    })
}

/// An options block (§5): key/value pairs, string keys, sorted (a `BTreeMap` makes the
/// re-encoding canonical: the SDK writes keys sorted, so SDK bytes round-trip unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Options(pub std::collections::BTreeMap<String, OptionValue>);

impl Options {
    /// Decodes the entries filling `bytes` exactly.
    pub fn decode(bytes: &[u8]) -> Result<Options, BodyError> {
        if bytes.len() > OPTIONS_BYTES_MAX {
            return Err(BodyError::OptionsTooLarge(bytes.len()));
        }
        let mut r = Reader::new(bytes);
        let mut map = std::collections::BTreeMap::new();
        while r.remaining() > 0 {
            let key = read_entry(&mut r)?;
            if key.kind != kind::STRING {
                return Err(BodyError::OptionKeyKind(key.kind));
            }
            let key = utf8(&key.bytes, "option key")?.to_owned();
            if r.remaining() == 0 {
                return Err(BodyError::OptionWithoutValue);
            }
            let value = read_entry(&mut r)?;
            if map.len() == OPTIONS_PAIRS_MAX {
                return Err(BodyError::OptionsTooMany);
            }
            if map.insert(key, value).is_some() {
                return Err(BodyError::OptionDuplicateKey);
            }
        }
        Ok(Options(map))
    }

    /// Decodes a length-prefixed block (`u32 byte_len` + entries).
    pub fn read_prefixed(r: &mut Reader<'_>) -> Result<Options, BodyError> {
        let len = r.u32("options length")?;
        let bytes = r.take(usize::try_from(len).unwrap_or(usize::MAX), "options block")?;
        Options::decode(bytes)
    }

    /// Encodes the entries, keys in sorted order.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for (key, value) in &self.0 {
            write_entry(out, kind::STRING, key.as_bytes());
            write_entry(out, value.kind, &value.bytes);
        }
    }

    /// Encodes as a length-prefixed block.
    pub fn write_prefixed(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        self.encode(out);
        let len = u32::try_from(out.len() - at - 4).expect("options fit a u32");
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn read_entry(r: &mut Reader<'_>) -> Result<OptionValue, BodyError> {
    let kind = r.u8("option kind")?;
    if !(1..=15).contains(&kind) {
        return Err(BodyError::OptionKind(kind));
    }
    let len = r.u32("option length")?;
    if !(1..=255).contains(&len) {
        return Err(BodyError::Length {
            field: "option value",
            len: u64::from(len),
        });
    }
    if let Some(width) = kind_width(kind)
        && width != len
    {
        return Err(BodyError::OptionWidth { kind, len });
    }
    let bytes = r.take(len as usize, "option value")?.to_vec();
    Ok(OptionValue { kind, bytes })
}

fn write_entry(out: &mut Vec<u8>, kind: u8, bytes: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}
