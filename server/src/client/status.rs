//! Error codes of the client plane (client-plane.md §4.1): one number space shared by the
//! Reply header's `status` and the result section's `result`.

/// Generic error.
pub const ERROR: u32 = 1;
/// Undecodable body or unknown code.
pub const INVALID_COMMAND: u32 = 3;
/// Request checksum mismatch or bad body.
pub const INVALID_FORMAT: u32 = 4;
/// A known command this server does not serve.
pub const FEATURE_UNAVAILABLE: u32 = 5;
/// Bad identifier.
pub const INVALID_IDENTIFIER: u32 = 6;
/// Partition op whose stream/topic does not resolve.
pub const RESOURCE_NOT_FOUND: u32 = 20;
/// No session.
pub const UNAUTHENTICATED: u32 = 40;
/// Permission denied.
pub const UNAUTHORIZED: u32 = 41;
/// Wrong username or password.
pub const INVALID_CREDENTIALS: u32 = 42;
/// Stream id not found.
pub const STREAM_ID_NOT_FOUND: u32 = 1009;
/// Stream name not found.
pub const STREAM_NAME_NOT_FOUND: u32 = 1010;
/// Stream name taken.
pub const STREAM_NAME_ALREADY_EXISTS: u32 = 1012;
/// Topic id not found.
pub const TOPIC_ID_NOT_FOUND: u32 = 2010;
/// Topic name not found.
pub const TOPIC_NAME_NOT_FOUND: u32 = 2011;
/// Topic name taken.
pub const TOPIC_NAME_ALREADY_EXISTS: u32 = 2013;
/// More partitions than a topic may have.
pub const TOO_MANY_PARTITIONS: u32 = 2015;
/// A partition count of 0.
pub const INVALID_PARTITIONS_COUNT: u32 = 2019;
/// Partition not found.
pub const PARTITION_NOT_FOUND: u32 = 3007;
/// No stored consumer offset.
pub const CONSUMER_OFFSET_NOT_FOUND: u32 = 3021;
/// Bad message count.
pub const INVALID_MESSAGES_COUNT: u32 = 4009;
/// An option key CreateStream/CreateTopic does not take.
pub const UNSUPPORTED_OPTION_KEY: u32 = 4041;
/// An offset beyond the partition's.
pub const INVALID_OFFSET: u32 = 4100;
