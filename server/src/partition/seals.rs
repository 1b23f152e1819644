//! Segment seals apart from the storage task (decision 355).
//!
//! The flush that fills a group's segment only marks it sealing (`PartitionLog::seal_apart`);
//! the storage task spawns the seal's two `fdatasync`s as a local task and goes on with every
//! group's WAL windows. When the syncs return, the task queues the answer and wakes the storage
//! task, which creates the next segment and flushes the batches the group held meanwhile
//! (`PartitionLog::sealed`). Every segment sync is timed into `strand_segment_sync_seconds`.
//!
//! `STRAND_SEAL_INLINE=1` in a node's environment keeps the former inline seal (the storage
//! task awaits it), for before/after measurements only.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use journal::segment::{PartitionLog, SyncTiming};
use journal::storage::Storage;
use tracing::{debug, info, warn};

use super::{PartitionGauges, StorageTask, add};

/// Upper bounds (seconds) of the `strand_segment_sync_seconds` buckets.
pub const SYNC_BUCKETS: [f64; 6] = [0.001, 0.01, 0.05, 0.25, 1.0, 5.0];

/// A segment sync at least this long is logged at info level.
const SLOW_SYNC_MS: u128 = 100;

/// Makes `log` seal apart, unless `STRAND_SEAL_INLINE=1`.
pub(super) fn apart<S: Storage>(log: &mut PartitionLog<S>) {
    if std::env::var_os("STRAND_SEAL_INLINE").is_none_or(|v| v != "1") {
        log.seal_apart();
    }
}

fn record(gauges: &PartitionGauges, group: u64, timing: SyncTiming, kind: &str) {
    let seconds = timing.elapsed.as_secs_f64();
    add(&gauges.segment_syncs, 1);
    add(
        &gauges.segment_sync_ns,
        u64::try_from(timing.elapsed.as_nanos()).unwrap_or(u64::MAX),
    );
    if let Some(i) = SYNC_BUCKETS.iter().position(|le| seconds <= *le) {
        add(&gauges.segment_sync_buckets[i], 1);
    }
    if timing.elapsed.as_millis() >= SLOW_SYNC_MS {
        info!(
            group = format!("{group:#x}"),
            kind,
            ms = timing.elapsed.as_millis() as u64,
            bytes = timing.bytes,
            "slow segment sync"
        );
    } else {
        debug!(
            group = format!("{group:#x}"),
            kind,
            us = timing.elapsed.as_micros() as u64,
            bytes = timing.bytes,
            "segment sync"
        );
    }
}

impl<S: Storage + Clone + 'static> StorageTask<S> {
    /// Spawns the seal of every group whose segment filled, and records the segment syncs
    /// done and the reservations of blocks ahead that failed since the last call.
    pub(super) fn spawn_seals(&mut self) {
        for (group, disk) in self.groups.iter_mut() {
            for timing in disk.log.take_sync_timings() {
                record(&self.gauges, *group, timing, "inline");
            }
            for failure in disk.log.take_reserve_failures() {
                add(&self.gauges.segment_reserve_failures, 1);
                warn!(
                    group = format!("{group:#x}"),
                    segment = failure.segment,
                    len = failure.len,
                    error = %failure.error,
                    "segment blocks not reserved ahead; its appends allocate as they go"
                );
            }
            let Some(job) = disk.log.take_seal() else {
                continue;
            };
            let (group, queues) = (*group, self.queues.clone());
            debug!(
                group = format!("{group:#x}"),
                end = job.end(),
                "segment seal spawned"
            );
            glommio::spawn_local(async move {
                let done = job.run().await;
                queues.seals.borrow_mut().push((group, done));
                queues.wake();
            })
            .detach();
        }
    }

    /// Applies the finished seals: the next segment of each group is created and its held
    /// batches flushed. A failed seal sync stops the node (nothing past it was written).
    pub(super) async fn apply_seals(&mut self) {
        let done: Vec<_> = self.queues.seals.borrow_mut().drain(..).collect();
        for (group, done) in done {
            let Some(disk) = self.groups.get_mut(&group) else {
                continue; // removed meanwhile
            };
            let timing = done.timing;
            let applied = disk.log.sealed(done).await;
            disk.map.borrow_mut().refresh(&disk.log);
            match applied {
                Ok(true) => record(&self.gauges, group, timing, "seal"),
                Ok(false) => {}
                Err(e) => {
                    self.fail(format!("group {group:#x}: segment seal: {e}"));
                    return;
                }
            }
        }
    }
}

/// `strand_segment_sync_seconds` (histogram, per shard): every segment `fdatasync` pair.
pub(super) fn render_metrics(out: &mut String, shards: &[Arc<PartitionGauges>]) {
    let name = "strand_segment_sync_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} segment fdatasyncs (seals, forced syncs, enforce_fsync flushes).\n\
         # TYPE {name} histogram"
    );
    for (shard, g) in shards.iter().enumerate() {
        let labels = format!("plane=\"partition\",shard=\"{shard}\"");
        let mut cumulative = 0;
        for (le, n) in SYNC_BUCKETS.iter().zip(&g.segment_sync_buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let count = g.segment_syncs.load(Ordering::Relaxed);
        let sum = g.segment_sync_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {count}\n{name}_sum{{{labels}}} {sum}\n\
             {name}_count{{{labels}}} {count}"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use bytes::Bytes;
    use journal::segment::{FlushPolicy, PartitionLog, log_name};
    use wire::GroupId;
    use wire::PartitionKey;

    use super::super::tests::{TestTask, prepare, settle, stop, with_test_task};
    use super::super::{PartitionStorageOp, Queues, group_prefix};
    use crate::partition::machine::StorageWork;

    fn group(partition: u32) -> u64 {
        GroupId::partition(PartitionKey {
            stream: 1,
            topic: 1,
            partition,
        })
        .unwrap()
        .0
    }

    /// Every flush fills a segment (a batch of 1024 messages is larger than the segment).
    const POLICY: FlushPolicy = FlushPolicy {
        enforce_fsync: false,
        messages_required_to_save: 1024,
        size_of_messages_required_to_save: 1 << 20,
        segment_size: 1 << 12,
    };

    /// Queues `op`'s append and its committed batch for `group`.
    fn queue(queues: &Queues, p: u32, op: u64) {
        let payloads: Vec<&[u8]> = (0..1024).map(|_| &b"12345678"[..]).collect();
        let g = group(p);
        queues.push(
            g,
            PartitionStorageOp::Append {
                op,
                frame: prepare(g, op),
            },
        );
        let batch = journal::batch::build(u64::from(p), (op - 1) * 1024, op, &payloads);
        let work = StorageWork::Batch(Bytes::from(batch));
        queues.push(g, PartitionStorageOp::Machine(work));
    }

    /// The seal of one group's segment never returns (its `.log` sync is held): the other
    /// group's prepares are still journaled and acknowledged, and so are the sealing group's
    /// (its WAL is apart from its segments); only its segment writes wait, no next segment
    /// exists before the seal's sync returned, and once it does every batch reaches the
    /// segments. With the seal awaited inline by the storage task, no window after the seal
    /// runs and the test fails at the first check.
    #[test]
    fn a_seal_that_does_not_return_stalls_no_other_group() {
        with_test_task(|_wal_disk, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                gauges,
            } = t;
            for p in 0..2 {
                queues.boot(group(p), POLICY);
            }
            let sealed_log = log_name(&group_prefix(group(0)), 0);
            parts.hold_syncs(&sealed_log);
            let running = glommio::spawn_local(task.run());
            let mut done = BTreeSet::new();
            for op in 1..=5 {
                queue(&queues, 0, op);
                queue(&queues, 1, op);
                settle(&inbox, &mut done, 2 * op as usize).await;
            }
            let want: BTreeSet<(u64, u64)> = (1..=5)
                .flat_map(|op| [(group(0), op), (group(1), op)])
                .collect();
            assert_eq!(done, want, "every prepare acknowledged while a seal hangs");
            let names = journal::storage::Storage::list(&parts).await.unwrap();
            let segments = |g: u64| {
                names
                    .iter()
                    .filter(|n| n.starts_with(&group_prefix(g)) && n.ends_with(".log"))
                    .count()
            };
            assert_eq!(segments(group(0)), 1, "no segment after an unsynced seal");
            assert!(
                segments(group(1)) >= 5,
                "the other group rolls on: {names:?}"
            );
            parts.release_syncs();
            stop(&queues, running, &fatal).await;
            for p in 0..2 {
                let prefix = group_prefix(group(p));
                let (log, recovery) = PartitionLog::open(parts.clone(), &prefix, POLICY, 0)
                    .await
                    .unwrap();
                assert!(recovery.damage.is_empty());
                assert_eq!(log.next_offset(), 5 * 1024, "group {p}: every batch");
            }
            let syncs = gauges
                .segment_syncs
                .load(std::sync::atomic::Ordering::Relaxed);
            assert!(syncs >= 5, "{syncs} segment syncs timed");
        });
    }
}
