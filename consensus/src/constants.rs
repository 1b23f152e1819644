//! Protocol limits and spec defaults. Runtime configuration may tune below the limits, never
//! above; the relations between them are asserted at compile time.

/// The largest roster the core supports (DVC bookkeeping is a fixed 32-slot array, §3).
pub const REPLICAS_MAX: usize = 32;

/// The largest prepare queue depth: a DoViewChange suffix carries at most 128 entries (§5.1).
pub const PIPELINE_PREPARE_QUEUE_MAX: usize = 127;

/// Entries of a DoViewChange / StartView suffix.
pub const SUFFIX_ENTRIES_MAX: usize = wire::suffix::SUFFIX_ENTRIES_MAX;

/// Distance below a DVC sender's head beyond which nothing can be uncommitted (§8.6 step 1).
pub const UNCOMMITTED_WINDOW_MAX: u64 = 127;

/// Default prepare queue depth (§5.1).
pub const PREPARE_QUEUE_DEPTH_DEFAULT: usize = 32;

/// Default request queue depth: twice the prepare depth (§5.1).
pub const REQUEST_QUEUE_DEPTH_DEFAULT: usize = 2 * PREPARE_QUEUE_DEPTH_DEFAULT;

/// The largest request queue depth.
pub const REQUEST_QUEUE_DEPTH_MAX: usize = 2 * PIPELINE_PREPARE_QUEUE_MAX;

/// Default `repair_chunk_max` (§10.3).
pub const REPAIR_CHUNK_MAX_DEFAULT: u32 = 128;

/// About how many bytes of prepares one repair window carries (decisions 506 and 517): a
/// requester asks for fewer than `repair_chunk_max` ops when the largest of the prepares it
/// saw last says a whole chunk would bring more, and a server ends a chunk once its frames
/// reach this many bytes, so a window fits well inside `appending_bytes_max`.
pub const REPAIR_WINDOW_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// How many ops one round of the requester's size estimate spans (decision 517): a repair
/// window is sized by the largest prepare among the newest `PREPARE_SIZE_ROUND` to
/// `2 x PREPARE_SIZE_ROUND` ops it saw, so one large batch long ago no longer keeps every
/// later window of small prepares short.
pub const PREPARE_SIZE_ROUND: u32 = 64;

/// Default `message_bus.peer_queue_capacity`; `repair_chunk_max` must stay strictly below it.
pub const PEER_QUEUE_CAPACITY_DEFAULT: u32 = 256;

/// Tick length assumed by the tick defaults below.
pub const TICK_MS: u64 = 10;

/// Prepare retransmit base interval: 250 ms.
pub const PREPARE_RETRANSMIT_TICKS_DEFAULT: u64 = 25;
/// Cap exponent of the prepare retransmit backoff (`2^4` = 16 × base).
pub const PREPARE_RETRANSMIT_BACKOFF_EXPONENT_MAX: u32 = 4;
/// Commit broadcast interval: 500 ms.
pub const COMMIT_BROADCAST_TICKS_DEFAULT: u64 = 50;
/// Normal heartbeat timeout: 5 s.
pub const HEARTBEAT_TIMEOUT_TICKS_DEFAULT: u64 = 500;
/// StartViewChange / DoViewChange retransmit interval: 500 ms.
pub const VIEW_CHANGE_RETRANSMIT_TICKS_DEFAULT: u64 = 50;
/// View change status timeout: 5 s.
pub const VIEW_CHANGE_STATUS_TIMEOUT_TICKS_DEFAULT: u64 = 500;
/// RequestStartView retransmit interval: 1 s.
pub const REQUEST_START_VIEW_TICKS_DEFAULT: u64 = 100;
/// Probe firings before a recovering replica elects (§6).
pub const VIEW_PROBE_ATTEMPTS_MAX_DEFAULT: u32 = 5;
/// Repair / state-transfer idle retry: 1 s.
pub const REPAIR_RETRY_TICKS_DEFAULT: u64 = 100;
/// Forwarded register/logout wait: 5 s.
pub const FORWARD_TIMEOUT_TICKS_DEFAULT: u64 = 500;
/// State-transfer stalls tolerated before falling back to journal repair (§11.2 step 7).
pub const STATE_TRANSFER_STALLS_MAX: u32 = 5;
/// Served offer expiry, in repair-retry intervals (§6).
pub const OFFER_EXPIRY_RETRIES: u64 = 10;
/// Served offer expiry once the last chunk was served.
pub const OFFER_EXPIRY_RETRIES_DONE: u64 = 3;
/// A state-transfer chunk's largest payload (state-transfer.md; wire's cap).
pub const STATE_CHUNK_LEN_MAX: u32 = wire::manifest::CHUNK_LEN_CAP;
/// State-machine artifact bytes the core holds at once for one group's state transfer, both
/// sides together (decision 170): the serving side reads one chunk straight into the frame
/// that carries it and hands it to the outbox; the receiving side passes each chunk through to
/// the state machine and keeps only a running checksum. Two chunk frames leave room for the
/// frame in flight while the next is built. The CLIENT_TABLE (the core's own state, held
/// decoded anyway) is outside this bound.
pub const TRANSFER_BYTES_HELD_MAX: usize = 2 * (STATE_CHUNK_LEN_MAX as usize + wire::HEADER_SIZE);

/// Default `clients_table_max` (§12).
pub const CLIENTS_TABLE_MAX_DEFAULT: usize = 8192;
/// The largest client table.
pub const CLIENTS_TABLE_MAX: usize = 65_536;
/// Cached replies per client (§12).
pub const CLIENT_REPLIES_MAX: usize = 5;

/// Committed frames kept in memory below `commit_min` before the core reads them back through
/// [`crate::Effect::Read`].
pub const FRAME_CACHE_COMMITTED_DEFAULT: u64 = 256;

/// Bytes of frames kept in memory before committed ones are dropped (one largest frame at the
/// default `max_message_size`).
pub const FRAME_CACHE_COMMITTED_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// A partition transfer's artifacts together at most (state-transfer.md §3): staged on disk,
/// never held whole in memory.
pub const PARTITION_TRANSFER_LEN_MAX: u64 = 1 << 40;

/// Default `transfer_artifact_bytes_max` (decision 507): Strand offers a partition's whole
/// retained log as one SEGMENT_LOG (decision 163), not one per segment as the reference, so
/// the partition's total cap.
pub const TRANSFER_ARTIFACT_BYTES_MAX_DEFAULT: u64 = PARTITION_TRANSFER_LEN_MAX;

/// A partition transfer's consumer-offsets artifact at most (state-transfer.md §3).
pub const PARTITION_OFFSETS_ARTIFACT_LEN_MAX: u64 = 32 << 20;

/// Bytes of prepares a replica may have asked its journal to append and not yet seen durable
/// before a backup stops journaling new ones (decision 504): one largest frame at the default
/// `max_message_size`, the frame cache's bound.
pub const APPENDING_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// Parked forwarded sessions waiting for a result, per replica.
pub const FORWARDS_PENDING_MAX: usize = 1024;

const _: () = assert!(PIPELINE_PREPARE_QUEUE_MAX < SUFFIX_ENTRIES_MAX);
const _: () = assert!(UNCOMMITTED_WINDOW_MAX as usize == PIPELINE_PREPARE_QUEUE_MAX);
const _: () = assert!(PREPARE_QUEUE_DEPTH_DEFAULT <= PIPELINE_PREPARE_QUEUE_MAX);
const _: () = assert!(REQUEST_QUEUE_DEPTH_DEFAULT <= REQUEST_QUEUE_DEPTH_MAX);
const _: () = assert!(REPAIR_CHUNK_MAX_DEFAULT < PEER_QUEUE_CAPACITY_DEFAULT);
const _: () = assert!(HEARTBEAT_TIMEOUT_TICKS_DEFAULT >= 4 * COMMIT_BROADCAST_TICKS_DEFAULT);
const _: () =
    assert!(VIEW_CHANGE_STATUS_TIMEOUT_TICKS_DEFAULT >= 4 * VIEW_CHANGE_RETRANSMIT_TICKS_DEFAULT);
const _: () = assert!(CLIENTS_TABLE_MAX_DEFAULT <= CLIENTS_TABLE_MAX);
const _: () = assert!(REPLICAS_MAX <= 128);

/// Headers kept in the in-memory index below `commit_min` (older ones are only on disk).
pub const HEADERS_RETAINED: u64 = 65_536;

/// Default periodic checkpoint interval of partition groups (unbounded WAL): a checkpoint once
/// `commit_min` has advanced this many ops past the snapshot floor (consensus.md §11,
/// journal.md §3.4).
pub const CHECKPOINT_INTERVAL_OPS_DEFAULT: u64 = 1024;

/// Default periodic checkpoint interval of the metadata group: its fixed-slot journal must hold
/// two intervals plus a full pipeline above its checkpoint (decision 34).
pub const METADATA_CHECKPOINT_INTERVAL_OPS_DEFAULT: u64 = 256;

/// Default slot count of the metadata prepare journal (`journal::JournalConfig::default()`,
/// journal.md §3.1 `journal_slots`); the core's `journal_slot_count` for metadata groups.
pub const JOURNAL_SLOT_COUNT_DEFAULT: u64 = 1024;

// A checkpoint is always reachable with the defaults (the rule `RawConfig::validate` checks).
const _: () = assert!(
    JOURNAL_SLOT_COUNT_DEFAULT
        >= 2 * METADATA_CHECKPOINT_INTERVAL_OPS_DEFAULT + PREPARE_QUEUE_DEPTH_DEFAULT as u64
);

/// Smallest non-zero checkpoint interval `RawConfig::validate` accepts.
pub const CHECKPOINT_INTERVAL_OPS_MIN: u64 = 8;

/// The widest op span the in-memory journal index covers (one pointer per slot): a prepare
/// further above the index base is not journaled until the base moves up (state transfer).
pub const JOURNAL_SPAN_MAX: u64 = 1 << 24;

/// Ops scanned per repair-window or coverage computation before giving up on the scan.
pub const SCAN_MAX: u64 = 1 << 16;

/// Default of `RawConfig::timestamp_ahead_max_us` (decision 72, consensus.md §17.7): a backup
/// journals and acknowledges a live prepare only if its timestamp is at most this far ahead of
/// the backup's own clock.
pub const TIMESTAMP_AHEAD_MAX_US_DEFAULT: u64 = 10_000_000;
