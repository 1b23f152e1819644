//! Small value types shared by every module: ids, time, status, frames.

use bytes::Bytes;
use std::fmt;

use wire::HEADER_SIZE;
use wire::header::{Layout, PrepareHeader};

pub use wire::GroupId;

/// A replica's index in the roster (`0..replica_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub u8);

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// A client id as carried in Request/Reply/Prepare (`client`, u128, non-zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u128);

/// Time as the caller sees it. The core never reads a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    /// Monotonic tick counter of the driver (one tick = 10 ms in production). Timers count
    /// [`crate::Input::Tick`] inputs, not this value; it is informational.
    pub tick: u64,
    /// Wall clock in microseconds since the Unix epoch; only used to stamp prepare timestamps
    /// (floored by `last_timestamp + 1`, so it may jump backwards safely).
    pub realtime_us: u64,
}

/// Replica status (§2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Serving the role given by `view`.
    Normal,
    /// Collecting StartViewChange / DoViewChange for `view`.
    ViewChange,
    /// Quorum-invisible after a restart (or after seeing a newer view), probing.
    Recovering,
}

/// Which plane a group belongs to (§14), derived from the group id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    /// The metadata group `1 << 63`: client table, sealed prepare bodies.
    Metadata,
    /// A partition group: SendMessages stamping, consumer offsets, no client table.
    Partition,
}

/// The durable view state (what the superblock records for the group).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VsrState {
    /// `view`.
    pub view: u32,
    /// `log_view` (always `<= view`).
    pub log_view: u32,
    /// A lower bound of `commit_max` (informational on recovery).
    pub commit_max: u64,
    /// The replica may have acknowledged prepares it no longer holds (it rejoined after its
    /// state was wiped) and must not vote in a view change until it durably holds the log of
    /// a view it adopted. Survives restarts until the core clears it.
    pub lost_state: bool,
    /// The headers of the log `log_view` vouches for that lie above the commit point, highest
    /// op last, at most 128 (decision 50): the view's headers this replica adopted (StartView
    /// suffix, merged log) and its verified journaled entries. Written together with
    /// `log_view`, so a restarted replica never claims `log_view` with a shorter log.
    pub view_headers: Vec<PrepareHeader>,
    /// The highest op the journal may have held and no longer holds (`held_ceiling`): a write
    /// carrying it is durable before any truncation takes effect (decision 51).
    pub held_ceiling: u64,
    /// The snapshot op the identity below belongs to (0 = none known).
    pub snapshot_op: u64,
    /// Identity of the prepare at `snapshot_op`, 0 when unknown (a transferred snapshot
    /// before the op above it arrived, decision 52). The driver stores it with its
    /// checkpoint when `snapshot_op` is the checkpoint its superblock names.
    pub snapshot_checksum: u128,
    /// Timestamp of the prepare at `snapshot_op` (0 when unknown).
    pub snapshot_timestamp: u64,
}

/// One whole frame (header and body), immutable and cheap to clone (broadcasts share it).
///
/// Frames built by the core are always sealed/identified with `wire::finish`; frames handed in
/// by the driver are whatever arrived. The bytes are a [`Bytes`]: a `Vec` becomes a frame
/// without a copy, and the journal write, every peer queue and the state machine's apply share
/// one allocation (decision 261).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Frame(Bytes);

impl Frame {
    /// Wraps bytes (a `Vec<u8>` or `Bytes` without copying). A frame built by the core is at
    /// least [`HEADER_SIZE`] bytes long.
    pub fn new(bytes: impl Into<Bytes>) -> Frame {
        Frame(bytes.into())
    }

    /// The whole frame as shared bytes (no copy): slice it to keep a part alive.
    pub fn shared(&self) -> &Bytes {
        &self.0
    }

    /// The whole frame.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The 256 header bytes; `None` for a frame shorter than a header.
    pub fn header_bytes(&self) -> Option<&[u8; HEADER_SIZE]> {
        self.0.get(..HEADER_SIZE)?.try_into().ok()
    }

    /// The body after the header (empty for a short frame).
    pub fn body(&self) -> &[u8] {
        self.0.get(HEADER_SIZE..).unwrap_or(&[])
    }

    /// The header viewed as a prepare (any command; callers check the command).
    pub fn prepare_header(&self) -> Option<&PrepareHeader> {
        PrepareHeader::view(self.0.get(..HEADER_SIZE)?)
    }

    /// The command byte, if the frame has a header.
    pub fn command(&self) -> Option<wire::Command> {
        wire::Command::from_byte(*self.0.get(60)?)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the frame is empty (never true for a frame the core built).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Deref for Frame {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.command() {
            Some(command) => {
                let op = self
                    .prepare_header()
                    .filter(|_| {
                        matches!(
                            command,
                            wire::Command::Prepare | wire::Command::RepairPrepare
                        )
                    })
                    .map(|h| h.op.get());
                write!(f, "Frame({command}, {} bytes, op {op:?})", self.0.len())
            }
            None => write!(f, "Frame(?, {} bytes)", self.0.len()),
        }
    }
}
