//! WAL files freed by reclaim are removed apart from the storage task (decision 400).
//!
//! A reclaim pass after a checkpoint frees every WAL file the groups' checkpoint interval held:
//! at 1 MB prepares and the default 1024-op interval, about 16 files of 64 MiB per group. The
//! WAL names the new floor durably first (`PartitionWal::release`), so the files are out of
//! the log before they are gone; one local task then removes them one at a time
//! (`Storage::retire`) while the storage task goes on with every group's windows. Removed
//! inline, each file cost the storage task (and, through the last `close`, the shard's whole
//! thread) about 50 ms on a file system with online discard: the cluster stopped for 1.5-2 s
//! at every first checkpoint of a loaded shard.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use journal::storage::Storage;
use journal::wal::Released;
use tracing::{debug, warn};

use super::StorageTask;

/// The longest rest between two removals (a removal slower than this rests this long).
const RETIRE_REST_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// Released WAL files waiting for their removal, and whether a task is removing them.
pub(super) struct Retiring<F> {
    queue: RefCell<VecDeque<Released<F>>>,
    running: Cell<bool>,
}

impl<F> Default for Retiring<F> {
    fn default() -> Self {
        Retiring {
            queue: RefCell::new(VecDeque::new()),
            running: Cell::new(false),
        }
    }
}

impl<F> Retiring<F> {
    /// Files released and not removed yet.
    pub(super) fn pending(&self) -> usize {
        self.queue.borrow().len() + usize::from(self.running.get())
    }
}

impl<S: Storage + Clone + 'static> StorageTask<S> {
    /// Queues `released` for removal, oldest first, and starts the removing task if none runs.
    /// A failed removal is logged: the file is out of the WAL already, and the next open
    /// removes what is left below the floor.
    pub(super) fn retire(&mut self, released: Vec<Released<S::File>>) {
        if released.is_empty() {
            return;
        }
        self.retiring.queue.borrow_mut().extend(released);
        self.gauges
            .wal_files_retiring
            .store(self.retiring.pending() as u64, Ordering::Relaxed);
        if self.retiring.running.replace(true) {
            return;
        }
        let retiring = self.retiring.clone();
        let storage = self.wal.storage().clone();
        let gauges = self.gauges.clone();
        glommio::spawn_local(async move {
            loop {
                let next = retiring.queue.borrow_mut().pop_front();
                let Some(file) = next else {
                    break;
                };
                let started = std::time::Instant::now();
                match storage.retire(file.file, &file.name).await {
                    Ok(()) => {
                        debug!(
                            file = %file.name,
                            us = started.elapsed().as_micros() as u64,
                            "reclaimed WAL file removed"
                        );
                    }
                    Err(e) => warn!(
                        file = %file.name,
                        error = %e,
                        "removing a reclaimed WAL file failed; the next open removes it"
                    ),
                }
                gauges
                    .wal_files_retiring
                    .store(retiring.queue.borrow().len() as u64, Ordering::Relaxed);
                // Half the time at most: a removal's cost is mostly the file system's journal
                // commit that frees (and, with online discard, discards) the file's blocks, a
                // commit the WAL's own `fdatasync`s queue behind. Resting as long as it took
                // leaves every other commit to the windows, on any file size and device.
                let took = started.elapsed().min(RETIRE_REST_MAX);
                if !retiring.queue.borrow().is_empty() && !took.is_zero() {
                    glommio::timer::sleep(took).await;
                }
            }
            retiring.running.set(false);
            gauges.wal_files_retiring.store(0, Ordering::Relaxed);
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::Ordering;

    use journal::MemStorage;
    use journal::artifact::OffsetTable;
    use journal::segment::FlushPolicy;
    use journal::storage::Storage;
    use journal::wal::WalConfig;

    use super::super::tests::{TestTask, group, prepare, settle, with_test_task_wal};
    use super::super::{PartitionStorageOp, Queues};

    /// Small files, so that a few dozen one-sector windows span several of them.
    const WAL: WalConfig = WalConfig {
        file_size_max: 64 * 1024,
        window_bytes_max: 16 * 1024,
        window_us_max: 500,
    };

    fn append(queues: &Queues, p: u32, op: u64) {
        let g = group(p);
        queues.push(
            g,
            PartitionStorageOp::Append {
                op,
                frame: prepare(g, op),
            },
        );
    }

    async fn wal_files(disk: &MemStorage) -> Vec<String> {
        let names = disk.list().await.unwrap();
        names
            .into_iter()
            .filter(|n| n.starts_with("wal."))
            .collect()
    }

    /// Both groups checkpoint, and the reclaim pass that follows frees the WAL files below the
    /// checkpoints; removing them never returns (the disk holds every removal of a `wal.`
    /// file). The WAL's floor moved durably before any removal, so both groups' later prepares
    /// are journaled and acknowledged meanwhile, every one of them; the freed files are still
    /// there, counted as retiring; once the removals go on they are gone, and a reopen of the
    /// WAL replays exactly the ops from the checkpoints up. With the files removed by the
    /// storage task itself (inline, as before decision 400), no window after the checkpoints
    /// is written and the test fails at the first check.
    #[test]
    fn a_reclaim_whose_file_removals_hang_stalls_no_group() {
        with_test_task_wal(WAL, |wal_disk, _parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                gauges,
            } = t;
            for p in 0..2 {
                queues.boot(group(p), FlushPolicy::default());
            }
            let running = glommio::spawn_local(task.run());
            let mut done = BTreeSet::new();
            for op in 1..=60 {
                append(&queues, 0, op);
                append(&queues, 1, op);
                settle(&inbox, &mut done, 2 * op as usize).await;
            }
            assert_eq!(done.len(), 120, "the load before the checkpoints");
            let before = wal_files(&wal_disk).await;
            assert!(before.len() >= 4, "several WAL files: {before:?}");
            wal_disk.hold_removes("wal.");
            for p in 0..2 {
                queues.push(
                    group(p),
                    PartitionStorageOp::Checkpoint {
                        op: 60,
                        prepare: (0, 0),
                        offsets: OffsetTable::default(),
                        frontier: 0,
                        lost_state: false,
                    },
                );
            }
            for op in 61..=80 {
                append(&queues, 0, op);
                append(&queues, 1, op);
                settle(&inbox, &mut done, 2 * op as usize).await;
            }
            assert_eq!(
                done.len(),
                160,
                "every prepare after the checkpoints acknowledged while the freed files' \
                 removal hangs"
            );
            let reclaimed = gauges.wal_files_reclaimed.load(Ordering::Relaxed);
            assert!(reclaimed >= 3, "{reclaimed} files reclaimed");
            let oldest: Vec<String> = (1..=reclaimed)
                .map(|seq| format!("wal.{seq:010}"))
                .collect();
            let listed = wal_files(&wal_disk).await;
            assert!(
                oldest.iter().all(|n| listed.contains(n)),
                "not removed yet: {listed:?}"
            );
            assert_eq!(
                gauges.wal_files_retiring.load(Ordering::Relaxed),
                reclaimed,
                "every freed file counted as retiring"
            );
            wal_disk.release_removes();
            // The remover rests between files as long as each took (microseconds here).
            for _ in 0..10_000 {
                if gauges.wal_files_retiring.load(Ordering::Relaxed) == 0 {
                    break;
                }
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
            let listed = wal_files(&wal_disk).await;
            assert!(
                oldest.iter().all(|n| !listed.contains(n)),
                "removed: {listed:?}"
            );
            queues.closed.set(true);
            queues.wake();
            running.await;
            assert_eq!(*fatal.borrow(), None);
            // The reopened WAL holds the ops from the checkpoints up, and nothing of the files
            // that were freed.
            let mut replay = journal::wal::GroupReplay::default();
            let (_, recovery) =
                journal::wal::PartitionWal::open(wal_disk.clone(), WAL, |r| replay.apply(r))
                    .await
                    .unwrap();
            assert!(recovery.is_clean(), "{recovery:?}");
            for p in 0..2 {
                let ops = &replay.groups[&group(p)];
                let (first, last) = (ops.keys().next(), ops.keys().next_back());
                assert!(first.is_some_and(|op| *op > 1 && *op <= 60), "{first:?}");
                assert_eq!(last, Some(&80));
            }
        });
    }
}
