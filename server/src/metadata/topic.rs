//! Topic options (client-plane.md §5 and §7.3): the catalogue of keys CreateTopic accepts,
//! their validation, and the derived options (server defaults for every key left out) that
//! the primary writes into CreateTopicWithAssignments so that every replica stores the same
//! resolved settings whatever its own defaults.

use crate::client::codec::{OptionValue, Options, kind};
use crate::client::status;

/// The resolved settings of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicSettings {
    /// 1 none, 2 gzip.
    pub compression_algorithm: u8,
    /// µs, `u64::MAX` = never.
    pub message_expiry: u64,
    /// Bytes, `u64::MAX` = unlimited.
    pub max_topic_size: u64,
    /// Bytes per segment.
    pub segment_size: u64,
    /// fsync every flush.
    pub enforce_fsync: bool,
    /// Flush after this many messages.
    pub messages_required_to_save: u32,
    /// Flush after this many bytes.
    pub size_of_messages_required_to_save: u64,
    /// Preallocate segment files.
    pub preallocate_segments: bool,
}

/// The smallest segment (1 MiB).
pub const SEGMENT_SIZE_MIN: u64 = 1 << 20;
/// The largest segment (1 GiB).
pub const SEGMENT_SIZE_MAX: u64 = 1 << 30;

impl TopicSettings {
    /// The reference's defaults for absent keys (§7.3).
    pub const DEFAULT: TopicSettings = TopicSettings {
        compression_algorithm: 1,
        message_expiry: u64::MAX,
        max_topic_size: u64::MAX,
        segment_size: SEGMENT_SIZE_MAX,
        enforce_fsync: false,
        messages_required_to_save: 1024,
        size_of_messages_required_to_save: 1 << 20,
        preallocate_segments: false,
    };
}

/// The option keys CreateTopic accepts, sorted.
pub const KEYS: [&str; 8] = [
    "compression_algorithm",
    "enforce_fsync",
    "max_topic_size",
    "message_expiry",
    "messages_required_to_save",
    "preallocate_segments",
    "segment_size",
    "size_of_messages_required_to_save",
];

fn u64_of(value: &OptionValue) -> Result<u64, u32> {
    match (value.kind, value.bytes.as_slice()) {
        (kind::U64, bytes) => Ok(u64::from_le_bytes(
            bytes.try_into().map_err(|_| status::INVALID_FORMAT)?,
        )),
        (kind::U32, bytes) => Ok(u64::from(u32::from_le_bytes(
            bytes.try_into().map_err(|_| status::INVALID_FORMAT)?,
        ))),
        _ => Err(status::INVALID_FORMAT),
    }
}

fn bool_of(value: &OptionValue) -> Result<bool, u32> {
    match (value.kind, value.bytes.as_slice()) {
        (kind::BOOL, [0]) => Ok(false),
        (kind::BOOL, [1]) => Ok(true),
        _ => Err(status::INVALID_FORMAT),
    }
}

fn set(settings: &mut TopicSettings, key: &str, value: &OptionValue) -> Result<(), u32> {
    match key {
        "compression_algorithm" => {
            settings.compression_algorithm = match (value.kind, value.bytes.as_slice()) {
                (kind::STRING, b"none") => 1,
                (kind::STRING, b"gzip") => 2,
                _ => return Err(status::INVALID_FORMAT),
            }
        }
        "message_expiry" => {
            settings.message_expiry = match u64_of(value)? {
                0 => TopicSettings::DEFAULT.message_expiry,
                v => v,
            }
        }
        "max_topic_size" => {
            settings.max_topic_size = match u64_of(value)? {
                0 => TopicSettings::DEFAULT.max_topic_size,
                v => v,
            }
        }
        "segment_size" => {
            let v = u64_of(value)?;
            if !(SEGMENT_SIZE_MIN..=SEGMENT_SIZE_MAX).contains(&v) || v % 512 != 0 {
                return Err(status::INVALID_FORMAT);
            }
            settings.segment_size = v;
        }
        "enforce_fsync" => settings.enforce_fsync = bool_of(value)?,
        "messages_required_to_save" => {
            let v = u64_of(value)?;
            settings.messages_required_to_save = u32::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .ok_or(status::INVALID_FORMAT)?;
        }
        "size_of_messages_required_to_save" => {
            settings.size_of_messages_required_to_save = u64_of(value)?;
        }
        "preallocate_segments" => settings.preallocate_segments = bool_of(value)?,
        _ => return Err(status::UNSUPPORTED_OPTION_KEY),
    }
    Ok(())
}

fn default_value(key: &str) -> OptionValue {
    let d = TopicSettings::DEFAULT;
    let (kind, bytes) = match key {
        "compression_algorithm" => (kind::STRING, b"none".to_vec()),
        "message_expiry" => (kind::U64, d.message_expiry.to_le_bytes().to_vec()),
        "max_topic_size" => (kind::U64, d.max_topic_size.to_le_bytes().to_vec()),
        "segment_size" => (kind::U64, d.segment_size.to_le_bytes().to_vec()),
        "enforce_fsync" => (kind::BOOL, vec![u8::from(d.enforce_fsync)]),
        "messages_required_to_save" => (
            kind::U32,
            d.messages_required_to_save.to_le_bytes().to_vec(),
        ),
        "size_of_messages_required_to_save" => (
            kind::U64,
            d.size_of_messages_required_to_save.to_le_bytes().to_vec(),
        ),
        "preallocate_segments" => (kind::BOOL, vec![u8::from(d.preallocate_segments)]),
        _ => unreachable!("KEYS lists every key"),
    };
    OptionValue { kind, bytes }
}

/// The derived options for `explicit`: the default of every catalogue key it leaves out.
pub fn derive(explicit: &Options) -> Options {
    Options(
        KEYS.iter()
            .filter(|k| !explicit.0.contains_key(**k))
            .map(|k| ((*k).to_owned(), default_value(k)))
            .collect(),
    )
}

/// Resolves the settings from the explicit and derived options: every key must be in the
/// catalogue (else 4041), each value valid for its key (else 4), a key set at most once
/// across both, and the whole topic at least one segment (`max_topic_size >= segment_size`).
pub fn resolve(explicit: &Options, derived: &Options) -> Result<TopicSettings, u32> {
    let mut settings = TopicSettings::DEFAULT;
    for (key, value) in explicit.0.iter().chain(derived.0.iter()) {
        set(&mut settings, key, value)?;
    }
    if explicit.0.keys().any(|k| derived.0.contains_key(k)) {
        return Err(status::INVALID_FORMAT);
    }
    if settings.max_topic_size < settings.segment_size {
        return Err(status::INVALID_FORMAT);
    }
    Ok(settings)
}
