//! The counters and gauges of one shard's partition groups, and their `/metrics` text.

use super::*;

/// Counters and gauges of one shard's partition groups (relaxed atomics; read by `/metrics`).
#[derive(Debug, Default)]
pub struct PartitionGauges {
    /// Groups hosted.
    pub groups: AtomicU64,
    /// `Replica::take_over` calls that started a view change toward this node (primary
    /// affinity, decision 221).
    pub takeovers: AtomicU64,
    /// Of them, primary in a normal view.
    pub primaries: AtomicU64,
    /// Sum of the groups' `commit_min`.
    pub commit: AtomicU64,
    /// Of them, in lost state (decisions 73, 240): they neither ack nor vote.
    pub lost: AtomicU64,
    /// Appends made durable.
    pub appends: AtomicU64,
    /// WAL windows committed (one durable write each, decision 496).
    pub wal_commits: AtomicU64,
    /// Nanoseconds spent in WAL commits (the durable write).
    pub wal_commit_ns: AtomicU64,
    /// Bytes submitted to the WAL.
    pub wal_bytes: AtomicU64,
    /// SendMessages bodies written once at their segment's tail and referenced from the WAL
    /// (decision 414), and their bytes.
    pub bodies_ahead: AtomicU64,
    /// Bytes of those bodies.
    pub bodies_ahead_bytes: AtomicU64,
    /// Segment tails cut back after a view change truncated prepares (decision 414).
    pub segment_rewinds: AtomicU64,
    /// Segments whose blocks could not be reserved ahead (decision 515): their appends
    /// allocate as they go.
    pub segment_reserve_failures: AtomicU64,
    /// WAL lsns held below the durable end (what reclaim cannot free yet).
    pub wal_lag: AtomicU64,
    /// Reclaims held back by a group lagging over [`ReclaimLimits::warn_lsns`].
    pub reclaim_blocked: AtomicU64,
    /// Held entries copied forward to the WAL's head.
    pub copied_forward: AtomicU64,
    /// WAL files reclaimed (out of the WAL; removed apart, decision 400).
    pub wal_files_reclaimed: AtomicU64,
    /// Reclaimed WAL files not removed yet (decision 400).
    pub wal_files_retiring: AtomicU64,
    /// The lowest lsn the WAL holds.
    pub wal_floor: AtomicU64,
    /// Groups refused `Busy` right now for holding the WAL.
    pub busy_groups: AtomicU64,
    /// Checkpoints durable.
    pub checkpoints: AtomicU64,
    /// The hosted groups whose own superblock is durable on this shard (published by the
    /// storage task; read by the rejoin mark's clearing, decision 290).
    pub marked: arc_swap::ArcSwap<BTreeSet<u64>>,
    /// The stamp's rejoin mark was cleared in this process (decision 290): a group that boots
    /// without a superblock from now on boots fresh.
    pub rejoin_cleared: std::sync::atomic::AtomicBool,
    /// Sum of the hosted groups' installed state transfers.
    pub transfers: AtomicU64,
    /// Replica-plane frames forwarded to the shard that owns their group.
    pub forwarded: AtomicU64,
    /// Frames for no group this node knows (dropped).
    pub dropped_unknown: AtomicU64,
    /// Frames dropped on a full inbox.
    pub dropped_full: AtomicU64,
    /// Frames a hosted group ignored because they carry another incarnation of its key
    /// (decision 375).
    pub fenced: AtomicU64,
    /// Prepares a hosted group forwarded but did not journal because its appends that have
    /// not completed reached `appending_bytes_max` (decision 504); repair fetches them later.
    pub appending_behind: AtomicU64,
    /// Bytes of prepares the shard's groups asked to append and have not seen complete, as of
    /// the last tick (decision 505).
    pub appending_bytes: AtomicU64,
    /// Ticks on which that reached [`SHARD_APPENDING_BYTES_MAX`].
    pub pressure_ticks: AtomicU64,
    /// Pending requests answered 57 because their group was dropped (decision 377).
    pub dropped_answered: AtomicU64,
    /// Messages the shard's partitions hold: the sum of their applied next offsets (offsets
    /// start at 0 and nothing is deleted yet). GetStats' `messages_count` sums it over shards.
    pub messages: AtomicU64,
    /// Bytes of committed batches the shard's partitions hold (GetStats'
    /// `messages_size_bytes`, decision 380).
    pub stored_bytes: AtomicU64,
    /// Segment files of the shard's partitions (GetStats' `segments_count`, decision 380).
    pub segments: AtomicU64,
    /// Groups removed because the committed metadata deleted them (decision 342).
    pub groups_removed: AtomicU64,
    /// Bytes of committed batches the groups' tails hold in memory (decision 280).
    pub cache_bytes: AtomicU64,
    /// Bytes of committed batches the groups' running log hashes have still to take: paid
    /// while the pump is idle, so 0 on a quiet node (decision 493).
    pub hash_owed_bytes: AtomicU64,
    /// Segment syncs (a seal, a forced sync, an `enforce_fsync` flush), their total time and
    /// their count per bucket of `SYNC_BUCKETS` (decision 355).
    pub segment_syncs: AtomicU64,
    /// Nanoseconds in segment syncs.
    pub segment_sync_ns: AtomicU64,
    /// Segment syncs per upper bound of `SYNC_BUCKETS` (not cumulative).
    pub segment_sync_buckets: [AtomicU64; seals::SYNC_BUCKETS.len()],
}

/// Publishes that `group`'s own superblock is durable on this shard (decision 290).
pub(super) fn mark_superblock(gauges: &PartitionGauges, group: u64) {
    if !gauges.marked.load().contains(&group) {
        gauges.marked.rcu(|marked| {
            let mut marked = BTreeSet::clone(marked);
            marked.insert(group);
            marked
        });
    }
}

pub(super) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Appends the partition groups' metrics of every shard (decision 167), labelled
/// `plane="partition"` and `shard`: gauges `strand_partition_groups`,
/// `strand_partition_primaries`, `strand_partition_commit` (sum of the groups' `commit_min`),
/// `strand_partition_lost_groups`, `strand_partition_cache_bytes`,
/// `strand_partition_hash_owed_bytes`,
/// `strand_wal_lag_lsns`, `strand_wal_floor_lsn`, `strand_partition_busy_groups`; counters
/// `strand_partition_appends_total`, `strand_wal_commits_total` (one durable write each),
/// `strand_wal_commit_seconds_total`, `strand_wal_bytes_total`,
/// `strand_partition_bodies_ahead_total`, `strand_partition_bodies_ahead_bytes_total`,
/// `strand_segment_rewinds_total`, `strand_segment_reserve_failures_total`,
/// `strand_partition_checkpoints_total`, `strand_partition_transfers_total`,
/// `strand_reclaim_blocked_total`, `strand_wal_copied_forward_total`,
/// `strand_wal_files_reclaimed_total`, `strand_wal_files_retiring`,
/// `strand_frames_forwarded_total`,
/// `strand_partition_inbox_dropped_total` by `reason` (`unknown_group`, `full`). Names differ
/// from the metadata group's where a family would otherwise be split (Prometheus text wants
/// one group of lines per family).
pub fn render_metrics(out: &mut String, shards: &[Arc<PartitionGauges>]) {
    use std::fmt::Write as _;
    type Pick = fn(&PartitionGauges) -> &AtomicU64;
    let rows: [(&str, &str, &str, Pick); 31] = [
        (
            "partition_cache_bytes",
            "gauge",
            "bytes of committed batches the partition groups hold in memory",
            |g| &g.cache_bytes,
        ),
        (
            "partition_hash_owed_bytes",
            "gauge",
            "bytes of committed batches the running log hashes have still to take",
            |g| &g.hash_owed_bytes,
        ),
        (
            "partition_groups",
            "gauge",
            "partition groups hosted",
            |g| &g.groups,
        ),
        (
            "partition_primaries",
            "gauge",
            "partition groups this node leads in a normal view",
            |g| &g.primaries,
        ),
        (
            "partition_commit",
            "gauge",
            "sum of the partition groups' applied ops",
            |g| &g.commit,
        ),
        (
            "partition_lost_groups",
            "gauge",
            "partition groups in lost state (they neither ack nor vote)",
            |g| &g.lost,
        ),
        (
            "wal_lag_lsns",
            "gauge",
            "WAL records held below the durable end",
            |g| &g.wal_lag,
        ),
        (
            "wal_floor_lsn",
            "gauge",
            "the lowest lsn the WAL holds",
            |g| &g.wal_floor,
        ),
        (
            "partition_busy_groups",
            "gauge",
            "groups refused Busy for holding the WAL",
            |g| &g.busy_groups,
        ),
        (
            "partition_appends_total",
            "counter",
            "prepares journaled durably",
            |g| &g.appends,
        ),
        (
            "wal_commits_total",
            "counter",
            "WAL windows committed (one durable write each)",
            |g| &g.wal_commits,
        ),
        (
            "wal_commit_seconds_total",
            "counter",
            "time in WAL window durable writes",
            |g| &g.wal_commit_ns,
        ),
        (
            "wal_bytes_total",
            "counter",
            "bytes appended to the WAL",
            |g| &g.wal_bytes,
        ),
        (
            "partition_bodies_ahead_total",
            "counter",
            "message batches written once at their segment's tail, referenced from the WAL",
            |g| &g.bodies_ahead,
        ),
        (
            "partition_bodies_ahead_bytes_total",
            "counter",
            "bytes of the batches written once at their segment's tail",
            |g| &g.bodies_ahead_bytes,
        ),
        (
            "segment_rewinds_total",
            "counter",
            "segment tails cut back after a view change truncated prepares",
            |g| &g.segment_rewinds,
        ),
        (
            "segment_reserve_failures_total",
            "counter",
            "segments whose blocks could not be reserved ahead (their appends allocate as they go)",
            |g| &g.segment_reserve_failures,
        ),
        (
            "partition_checkpoints_total",
            "counter",
            "checkpoints made durable",
            |g| &g.checkpoints,
        ),
        (
            "partition_transfers_total",
            "counter",
            "state transfers the hosted groups installed",
            |g| &g.transfers,
        ),
        (
            "reclaim_blocked_total",
            "counter",
            "reclaims held back by a lagging group",
            |g| &g.reclaim_blocked,
        ),
        (
            "wal_copied_forward_total",
            "counter",
            "held entries copied to the WAL's head",
            |g| &g.copied_forward,
        ),
        (
            "wal_files_reclaimed_total",
            "counter",
            "WAL files reclaimed",
            |g| &g.wal_files_reclaimed,
        ),
        (
            "wal_files_retiring",
            "gauge",
            "reclaimed WAL files not removed yet",
            |g| &g.wal_files_retiring,
        ),
        (
            "frames_forwarded_total",
            "counter",
            "replica frames forwarded to the owning shard",
            |g| &g.forwarded,
        ),
        (
            "partition_groups_removed_total",
            "counter",
            "partition groups removed after their deletion committed",
            |g| &g.groups_removed,
        ),
        (
            "partition_inbox_dropped_total",
            "counter",
            "replica frames dropped before the partition pump",
            |g| &g.dropped_unknown,
        ),
        (
            "partition_frames_fenced_total",
            "counter",
            "replica frames of another incarnation of the group's key, ignored",
            |g| &g.fenced,
        ),
        (
            "partition_appending_bytes",
            "gauge",
            "bytes of prepares the shard's groups asked to append and have not seen complete \
             (decision 505)",
            |g| &g.appending_bytes,
        ),
        (
            "partition_storage_pressure_ticks_total",
            "counter",
            "ticks on which the shard's incomplete appends reached their bound, so each group \
             took new appends only into an empty backlog (decision 505)",
            |g| &g.pressure_ticks,
        ),
        (
            "partition_prepares_appending_behind_total",
            "counter",
            "prepares forwarded but not journaled: the group's incomplete appends were at \
             their bound (decision 504); repair fetches them later",
            |g| &g.appending_behind,
        ),
        (
            "partition_dropped_requests_answered_total",
            "counter",
            "requests of a dropped incarnation answered 57",
            |g| &g.dropped_answered,
        ),
    ];
    for (name, kind, help, pick) in rows {
        if !help.is_empty() {
            let _ = writeln!(out, "# HELP strand_{name} {help}.");
            let _ = writeln!(out, "# TYPE strand_{name} {kind}");
        }
        for (shard, g) in shards.iter().enumerate() {
            let v = pick(g).load(Ordering::Relaxed);
            let labels = format!("plane=\"partition\",shard=\"{shard}\"");
            match name {
                "wal_commit_seconds_total" => {
                    let _ = writeln!(out, "strand_{name}{{{labels}}} {}", v as f64 / 1e9);
                }
                "partition_inbox_dropped_total" => {
                    let full = g.dropped_full.load(Ordering::Relaxed);
                    let _ = writeln!(
                        out,
                        "strand_{name}{{reason=\"unknown_group\",{labels}}} {v}\n\
                         strand_{name}{{reason=\"full\",{labels}}} {full}"
                    );
                }
                _ => {
                    let _ = writeln!(out, "strand_{name}{{{labels}}} {v}");
                }
            }
        }
    }
    seals::render_metrics(out, shards);
}
