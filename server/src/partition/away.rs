//! A group's segment work of a window runs apart from the storage task (decision 440).
//!
//! The window's WAL write and `fdatasync` are small (a header and a body reference per large
//! batch); its segment writes are not (the batch itself, then the segment's `fdatasync`, which
//! on ext4 also commits the file's new size). The storage task used to await both before it
//! took the next window, so two producers on two partitions took turns: each batch waited for
//! the other's segment sync before its own window began.
//!
//! Now, when a window closes, each group with segment work in it (a body reserved at its tail,
//! or a due flush of committed batches) *goes away*: its [`GroupDisk`] moves into a local task
//! of its own that runs the flush (synced when a referenced body is in it) and comes back with
//! the group's entries of that window. The storage task awaits only the WAL commit, then goes on
//! with the next window for every group still here.
//!
//! While a group is away nothing else touches its disk: its queue is skipped (and does not count
//! as work, so the task never spins on it), and every pass that needs all groups (seals, boots,
//! removals, reclaim, shutdown) first waits for every group to come back ([`settle`]).
//!
//! A group's entries are acknowledged once the WAL commit of their window *and* the group's
//! segment work are durable, as before. The away task sends their `Appended` itself when the
//! WAL was durable first (the common case: the WAL's write is the smaller one); otherwise the
//! storage task does when it takes the group back. Either way the bookkeeping (journaled
//! frames, body references, the reclaim guard) is done when the group is back, before any other
//! work of that group runs.
//!
//! [`settle`]: StorageTask::settle_away

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::Poll;
use std::time::Instant;

use journal::storage::Storage;
use journal::wal::BodyRef;

use super::{
    Completion, Event, Frame, GroupDisk, Inbox, PartitionGauges, PartitionStorageOp, Queues,
    REF_BODY_MIN, StorageTask, Timeline, add, reserve_body,
};

/// An entry of a window: group, op, lsn, the frame, its body's reference (see `WindowEntry`).
type Entry = (u64, u64, u64, Frame, Option<BodyRef>);

/// What the away tasks share with the storage task.
pub(super) struct AwayShared<S: Storage> {
    /// Groups back from their segment work, to take in.
    back: RefCell<Vec<Back<S>>>,
    /// The WAL's durable lsn and when its last window's write returned, set after every
    /// commit: an away task acknowledges its entries itself when they are at or below it.
    durable: Cell<(u64, Option<Instant>)>,
    queues: Rc<Queues>,
    inbox: Rc<Inbox>,
    timeline: Rc<Timeline>,
    fatal: Rc<RefCell<Option<String>>>,
}

impl<S: Storage> AwayShared<S> {
    pub(super) fn new(
        queues: Rc<Queues>,
        inbox: Rc<Inbox>,
        timeline: Rc<Timeline>,
        fatal: Rc<RefCell<Option<String>>>,
    ) -> Rc<Self> {
        Rc::new(AwayShared {
            back: RefCell::new(Vec::new()),
            durable: Cell::new((0, None)),
            queues,
            inbox,
            timeline,
            fatal,
        })
    }

    /// The WAL committed up to `lsn`; its last window's write returned at `written`.
    pub(super) fn durable(&self, lsn: u64, written: Option<Instant>) {
        self.durable.set((lsn, written));
    }
}

/// A group back from its segment work.
struct Back<S: Storage> {
    group: u64,
    disk: GroupDisk<S>,
    entries: Vec<Entry>,
    flushed: Result<(), String>,
    /// The away task sent the entries' `Appended` (the WAL was durable first).
    acked: bool,
}

fn checksum(frame: &Frame) -> u128 {
    super::identity_of(frame.bytes())
}

/// Moves `group`'s disk into a local task of its own that runs its segment flush (synced when
/// `synced`) and comes back with `entries`, acknowledging them itself when their WAL window
/// is durable by then.
fn go_away<S: Storage + Clone + 'static>(
    queues: &Queues,
    shared: &Rc<AwayShared<S>>,
    group: u64,
    mut disk: GroupDisk<S>,
    synced: bool,
    entries: Vec<Entry>,
) {
    queues.away.borrow_mut().insert(group);
    let shared = shared.clone();
    glommio::spawn_local(async move {
        let flushed = if synced {
            disk.log.flush_synced().await
        } else {
            disk.log.flush().await
        };
        // Readers learn what is written (decision 280), also after a failed flush.
        disk.map.borrow_mut().refresh(&disk.log);
        let flushed = flushed.map_err(|e| format!("group {group:#x}: segments: {e}"));
        let (durable, written) = shared.durable.get();
        let acked = flushed.is_ok()
            && shared.fatal.borrow().is_none()
            && entries.iter().all(|e| e.2 <= durable);
        if acked {
            let now = Instant::now();
            for (group, op, _, frame, _) in &entries {
                shared
                    .timeline
                    .synced(*group, *op, written.unwrap_or(now).min(now), now);
                shared.inbox.push(Event::Done {
                    group: *group,
                    completion: Completion::Appended {
                        op: *op,
                        checksum: checksum(frame),
                    },
                });
            }
        }
        shared.back.borrow_mut().push(Back {
            group,
            disk,
            entries,
            flushed,
            acked,
        });
        shared.queues.back.set(shared.queues.back.get() + 1);
        shared.queues.wake();
    })
    .detach();
}

/// Runs while a WAL window is being committed, and never returns (the caller races it with
/// the commit): every group here whose leading append carries a body of [`REF_BODY_MIN`] bytes
/// or more has that body reserved at its segment's tail and goes away to write and sync it
/// at once, ahead of the append's own window (decision 480). The append's reference is noted
/// in `queues.early`; the next window takes its WAL record, also while the group is away.
/// Groups with entries in the window being committed (`staying`) stay: their bookkeeping
/// needs their disk when the commit returns.
///
/// Before, an append that came in during a commit waited for the commit to end before its
/// window, and only then did its segment write start: on one disk that wait sat on the path
/// of every large batch.
pub(super) async fn dispatch_early<S: Storage + Clone + 'static>(
    groups: &mut BTreeMap<u64, GroupDisk<S>>,
    queues: &Rc<Queues>,
    shared: &Rc<AwayShared<S>>,
    gauges: &PartitionGauges,
    staying: &BTreeSet<u64>,
) -> Infallible {
    loop {
        let leading: Vec<(u64, u64, Frame)> = {
            let away = queues.away.borrow();
            let early = queues.early.borrow();
            queues
                .groups
                .borrow()
                .iter()
                .filter(|(g, _)| {
                    !away.contains(g) && !early.contains_key(g) && !staying.contains(g)
                })
                .filter_map(|(g, q)| match q.front() {
                    Some(PartitionStorageOp::Append { op, frame })
                        if frame.bytes().len() >= wire::HEADER_SIZE + REF_BODY_MIN =>
                    {
                        Some((*g, *op, frame.clone()))
                    }
                    _ => None,
                })
                .collect()
        };
        for (group, op, frame) in leading {
            let Some(disk) = groups.get_mut(&group) else {
                continue;
            };
            if op < disk.checkpoint_op {
                continue; // acknowledged without a record by its window
            }
            let Some((_, referenced, body)) = reserve_body(disk, gauges, &frame) else {
                continue; // not at the tail: its window journals it whole
            };
            debug_assert!(referenced, "only large bodies go ahead");
            queues.early.borrow_mut().insert(group, (op, body));
            let disk = groups.remove(&group).expect("looked up above");
            go_away(queues, shared, group, disk, true, Vec::new());
        }
        // Until the next push (or any other wake of the queues).
        let mut waited = false;
        poll_fn(|cx| {
            if waited {
                return Poll::Ready(());
            }
            waited = true;
            queues.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await;
    }
}

impl<S: Storage + Clone + 'static> StorageTask<S> {
    /// Sends `group`'s disk away to run its segment flush (synced when `synced`), with its
    /// `entries` of the window being committed.
    pub(super) fn send_away(
        &mut self,
        group: u64,
        disk: GroupDisk<S>,
        synced: bool,
        entries: Vec<Entry>,
    ) {
        go_away(&self.queues, &self.away, group, disk, synced, entries);
    }

    /// Takes in every group back from its segment work: its disk, its entries' bookkeeping,
    /// and their `Appended` where the away task did not send it. A failed flush stops the
    /// node (its entries are never acknowledged).
    pub(super) fn take_back(&mut self) {
        let back: Vec<Back<S>> = self.away.back.borrow_mut().drain(..).collect();
        self.queues
            .back
            .set(self.queues.back.get().saturating_sub(back.len()));
        // Entries the away task left unacknowledged are behind a WAL commit that has returned
        // by now (the storage task awaits every commit before it takes groups back).
        let durable = self.wal.durable_lsn();
        for Back {
            group,
            disk,
            entries,
            flushed,
            acked,
        } in back
        {
            self.queues.away.borrow_mut().remove(&group);
            self.groups.insert(group, disk);
            if let Err(e) = flushed {
                self.fail(e);
                continue;
            }
            if !acked && entries.iter().any(|e| e.2 > durable) {
                self.fail(format!(
                    "group {group:#x}: an append came back from its segment before its WAL \
                     window was committed"
                ));
                continue;
            }
            let synced = Instant::now();
            let written = self.wal.last_written_at().unwrap_or(synced);
            let ack = !acked && self.fatal.borrow().is_none();
            self.account(entries, ack, written, synced);
        }
        self.ack_late();
    }

    /// Acknowledges the late entries (decision 480) of every group that is back, once their
    /// WAL window is durable: both halves of each are then on disk.
    pub(super) fn ack_late(&mut self) {
        if self.late.is_empty() {
            return;
        }
        let durable = self.wal.durable_lsn();
        let back: Vec<u64> = {
            let away = self.queues.away.borrow();
            self.late
                .keys()
                .copied()
                .filter(|g| !away.contains(g))
                .collect()
        };
        for group in back {
            let entries = self.late.remove(&group).unwrap_or_default();
            let (durable, waiting): (Vec<Entry>, Vec<Entry>) =
                entries.into_iter().partition(|e| e.2 <= durable);
            if !waiting.is_empty() {
                self.late.insert(group, waiting);
            }
            if durable.is_empty() {
                continue;
            }
            let synced = Instant::now();
            let written = self.wal.last_written_at().unwrap_or(synced);
            let ack = self.fatal.borrow().is_none();
            self.account(durable, ack, written, synced);
        }
    }

    /// The bookkeeping of appends whose WAL window and segment work are durable, and their
    /// `Appended` when `ack`.
    pub(super) fn account(
        &mut self,
        entries: Vec<Entry>,
        ack: bool,
        written: Instant,
        synced: Instant,
    ) {
        for (group, op, lsn, frame, body) in entries {
            self.guard.note(lsn, group, frame.bytes());
            let checksum = checksum(&frame);
            if let Some(disk) = self.groups.get_mut(&group) {
                disk.frames
                    .insert(op, (lsn, super::held_frame(frame, body.as_ref())));
                match body {
                    Some(body) => disk.bodies.insert(op, body),
                    None => disk.bodies.remove(&op),
                };
            }
            add(&self.gauges.appends, 1);
            if ack {
                self.timeline.synced(group, op, written, synced);
                self.done(group, Completion::Appended { op, checksum });
            }
        }
    }

    /// Waits until every group is back from its segment work, and takes them in.
    pub(super) async fn settle_away(&mut self) {
        loop {
            self.take_back();
            if self.queues.away.borrow().is_empty() {
                return;
            }
            let queues = self.queues.clone();
            poll_fn(|cx| {
                if queues.back.get() > 0 {
                    return Poll::Ready(());
                }
                queues.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            })
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use journal::segment::{FlushPolicy, PartitionLog, log_name};

    use bytes::Bytes;

    use super::super::tests::{
        SEND_BATCH, TestTask, group, send_batch, send_messages, settle, stop, with_test_task,
    };
    use super::super::{PartitionStorageOp, REF_BODY_MIN, group_prefix};
    use crate::partition::machine::StorageWork;

    /// One group's segment sync does not return: the other group's large batches are still
    /// journaled and acknowledged, window after window, and the held group's batch only once
    /// its segment sync returns. With the segment work awaited inside the window (before
    /// decision 440) nothing after the held window is acknowledged and the first check fails;
    /// with the held group acknowledged before its sync (the away task acking before its
    /// flush) the first check fails too.
    #[test]
    fn a_segment_sync_that_does_not_return_stalls_no_other_group() {
        with_test_task(|_wal, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                ..
            } = t;
            let (a, b) = (group(0), group(1));
            for g in [a, b] {
                queues.boot(g, FlushPolicy::default());
            }
            parts.hold_syncs(&log_name(&group_prefix(a), 0));
            let running = glommio::spawn_local(task.run());
            let send = |g: u64, op: u64| append(op, send_messages(g, op, (op - 1) * SEND_BATCH));
            queues.push(a, send(a, 1));
            let mut done = BTreeSet::new();
            for op in 1..=4 {
                queues.push(b, send(b, op));
                settle(&inbox, &mut done, op as usize).await;
            }
            let want: BTreeSet<(u64, u64)> = (1..=4).map(|op| (b, op)).collect();
            assert_eq!(
                done, want,
                "the other group's batches acknowledged while a segment sync hangs, not the \
                 held group's"
            );
            parts.release_syncs();
            settle(&inbox, &mut done, 5).await;
            assert!(
                done.contains(&(a, 1)),
                "the held group's batch acknowledged once its segment is synced: {done:?}"
            );
            stop(&queues, running, &fatal).await;
            for (g, batches) in [(a, 1), (b, 4)] {
                let (log, _) =
                    PartitionLog::open(parts.clone(), &group_prefix(g), FlushPolicy::default(), 0)
                        .await
                        .unwrap();
                assert_eq!(
                    log.next_offset(),
                    batches * SEND_BATCH,
                    "every batch written"
                );
            }
        });
    }

    /// Batches shorter than `REF_BODY_MIN` are acknowledged on the WAL alone: no segment write
    /// in their windows (decision 441). They reach the segment with the flush the policy makes
    /// due at commit, and come back from it after a restart. With every reserved body written
    /// in its window again (decision 414's first form) the first check fails.
    #[test]
    fn small_batches_wait_for_the_policys_flush_to_reach_the_segment() {
        const MESSAGES: u64 = 4;
        with_test_task(|_wal, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                ..
            } = t;
            let a = group(0);
            let policy = FlushPolicy {
                messages_required_to_save: 4 * MESSAGES,
                ..FlushPolicy::default()
            };
            queues.boot(a, policy);
            let running = glommio::spawn_local(task.run());
            let batches: Vec<_> = (1..=4)
                .map(|op| send_batch(a, op, (op - 1) * MESSAGES, MESSAGES))
                .collect();
            assert!(batches.iter().all(|(_, b)| b.len() < REF_BODY_MIN));
            let mut done = BTreeSet::new();
            let mut writes_after_first = 0;
            for (op, (frame, _)) in (1..).zip(&batches) {
                let frame = frame.clone();
                queues.push(a, append(op, frame));
                settle(&inbox, &mut done, op as usize).await;
                if op == 1 {
                    writes_after_first = parts.counts().0;
                }
            }
            assert_eq!(done.len(), 4, "every small batch acknowledged");
            assert_eq!(
                parts.counts().0,
                writes_after_first,
                "no segment write in the windows of small batches"
            );
            for (_, body) in &batches {
                let work = StorageWork::Batch(Bytes::from(body.clone()));
                queues.push(a, PartitionStorageOp::Machine(work));
            }
            for _ in 0..1000 {
                if parts.counts().0 > writes_after_first {
                    break;
                }
                glommio::executor().yield_now().await;
            }
            assert!(
                parts.counts().0 > writes_after_first,
                "the policy's flush writes the committed batches"
            );
            stop(&queues, running, &fatal).await;
            let (log, _) = PartitionLog::open(parts.clone(), &group_prefix(a), policy, 0)
                .await
                .unwrap();
            assert_eq!(
                log.next_offset(),
                4 * MESSAGES,
                "every batch in the segment"
            );
            let read = log.read_from_offset(0, 1 << 20).await.unwrap();
            let want: Vec<u8> = batches.iter().flat_map(|(_, b)| b.clone()).collect();
            assert_eq!(read, want, "the segment holds the batches byte for byte");
        });
    }

    /// The first WAL file's name (the sequence starts at 1).
    const FIRST_WAL: &str = "wal.0000000001";

    /// The storage op that appends `frame` as `op`.
    fn append(op: u64, frame: consensus::Frame) -> PartitionStorageOp {
        PartitionStorageOp::Append { op, frame }
    }

    /// Yields a while: the in-memory disks answer at once, so what has not happened after
    /// this waits on a held sync.
    async fn quiet() {
        for _ in 0..2_000 {
            glommio::executor().yield_now().await;
        }
    }

    /// A large batch that comes in while a WAL window is being committed goes to its segment
    /// at once, ahead of its own window (decision 480): with the WAL's `fdatasync` held, the
    /// second group's batch is already written to its segment and synced, and nothing is
    /// acknowledged. Once the sync returns both are, and the second batch's WAL reference
    /// reads back whole from where it was written. With the early dispatch taken out
    /// (`dispatch_early` only waiting), the first check fails.
    #[test]
    fn a_large_body_goes_to_its_segment_while_a_window_commits() {
        with_test_task(|wal, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                ..
            } = t;
            let (a, b) = (group(0), group(1));
            for g in [a, b] {
                queues.boot(g, FlushPolicy::default());
            }
            parts.log_writes();
            wal.hold_syncs(FIRST_WAL);
            let running = glommio::spawn_local(task.run());
            queues.push(a, append(1, send_messages(a, 1, 0)));
            quiet().await;
            let b_frame = send_messages(b, 1, 0);
            let b_log = log_name(&group_prefix(b), 0);
            let syncs_before = parts.counts().1;
            queues.push(b, append(1, b_frame.clone()));
            quiet().await;
            let mut done = BTreeSet::new();
            super::super::tests::appended_into(&inbox, &mut done);
            assert!(
                !parts.writes_to(&b_log).is_empty() && parts.counts().1 > syncs_before,
                "the second batch is written and synced while the first window's fdatasync \
                 is held"
            );
            assert!(
                done.is_empty(),
                "nothing acknowledged before the WAL is durable"
            );
            wal.release_syncs();
            settle(&inbox, &mut done, 2).await;
            assert_eq!(done, BTreeSet::from([(a, 1), (b, 1)]), "both acknowledged");
            let whole = read(&queues, &inbox, b, 1, super::checksum(&b_frame)).await;
            assert_eq!(
                whole.as_ref().map(|f| f.bytes().to_vec()),
                Some(b_frame.bytes().to_vec()),
                "the reference its WAL record carries finds the body where it went"
            );
            stop(&queues, running, &fatal).await;
            for g in [a, b] {
                let (log, _) =
                    PartitionLog::open(parts.clone(), &group_prefix(g), FlushPolicy::default(), 0)
                        .await
                        .unwrap();
                assert_eq!(log.next_offset(), SEND_BATCH, "each batch in its segment");
            }
        });
    }

    /// An append whose body went ahead is taken into the next window while its segment sync
    /// is still in flight, and acknowledged only once both its WAL window and that sync are
    /// durable (decision 480). With the late entry acknowledged with its window (as if its
    /// group were back), the check that it waits fails.
    #[test]
    fn an_append_whose_body_went_ahead_waits_for_its_segment_sync() {
        with_test_task(|wal, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                gauges,
            } = t;
            let (a, b) = (group(0), group(1));
            for g in [a, b] {
                queues.boot(g, FlushPolicy::default());
            }
            wal.hold_syncs(FIRST_WAL);
            parts.hold_syncs(&log_name(&group_prefix(b), 0));
            let running = glommio::spawn_local(task.run());
            queues.push(a, append(1, send_messages(a, 1, 0)));
            quiet().await;
            let writes = parts.counts().0;
            queues.push(b, append(1, send_messages(b, 1, 0)));
            quiet().await;
            assert!(
                parts.counts().0 > writes,
                "the second batch went to its segment during the first window's commit"
            );
            let commits = gauges
                .wal_commits
                .load(std::sync::atomic::Ordering::Relaxed);
            wal.release_syncs();
            let mut done = BTreeSet::new();
            settle(&inbox, &mut done, 1).await;
            quiet().await;
            super::super::tests::appended_into(&inbox, &mut done);
            assert!(
                gauges
                    .wal_commits
                    .load(std::sync::atomic::Ordering::Relaxed)
                    >= commits + 2,
                "the second batch's record is committed in a window of its own"
            );
            assert_eq!(
                done,
                BTreeSet::from([(a, 1)]),
                "the second batch waits for its segment sync"
            );
            parts.release_syncs();
            settle(&inbox, &mut done, 2).await;
            assert!(
                done.contains(&(b, 1)),
                "acknowledged once its segment is synced"
            );
            stop(&queues, running, &fatal).await;
            let (log, _) =
                PartitionLog::open(parts.clone(), &group_prefix(b), FlushPolicy::default(), 0)
                    .await
                    .unwrap();
            assert_eq!(log.next_offset(), SEND_BATCH, "its batch in the segment");
        });
    }

    /// A group with an entry in the window being committed does not send its next large body
    /// ahead (decision 480): the entry's bookkeeping needs the group's disk when the commit
    /// returns, so its prepare is still held and read back after both are acknowledged. With
    /// such a group sent away too, its first prepare is lost to reads and the check fails.
    #[test]
    fn a_group_with_an_entry_in_the_committing_window_stays() {
        with_test_task(|wal, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                ..
            } = t;
            let a = group(0);
            queues.boot(a, FlushPolicy::default());
            wal.hold_syncs(FIRST_WAL);
            let running = glommio::spawn_local(task.run());
            let first = super::super::tests::prepare(a, 1);
            queues.push(a, append(1, first.clone()));
            quiet().await;
            let writes = parts.counts().0;
            queues.push(a, append(2, send_messages(a, 2, 0)));
            quiet().await;
            assert_eq!(
                parts.counts().0,
                writes,
                "no segment write for a group whose entry is being committed"
            );
            wal.release_syncs();
            let mut done = BTreeSet::new();
            settle(&inbox, &mut done, 2).await;
            assert_eq!(done, BTreeSet::from([(a, 1), (a, 2)]), "both acknowledged");
            let held = read(&queues, &inbox, a, 1, super::checksum(&first)).await;
            assert_eq!(
                held.map(|f| f.bytes().to_vec()),
                Some(first.bytes().to_vec()),
                "the first prepare is held"
            );
            stop(&queues, running, &fatal).await;
        });
    }

    /// Pushes a `Read` of `op` and waits for its answer.
    async fn read(
        queues: &super::Queues,
        inbox: &super::Inbox,
        group: u64,
        op: u64,
        checksum: u128,
    ) -> Option<consensus::Frame> {
        queues.push(group, PartitionStorageOp::Read { op, checksum });
        for _ in 0..10_000 {
            if let Some((_, e)) = inbox.pop()
                && let super::Event::Done {
                    completion: super::Completion::Read { frame, .. },
                    ..
                } = e
            {
                return frame;
            }
            glommio::executor().yield_now().await;
        }
        panic!("the Read of op {op} was never answered");
    }

    /// A prepare whose body went to the segments is held by its header alone (decision 443),
    /// and a `Read` of it answers the whole frame, byte for byte, from the segment, also after
    /// a restart (the boot holds the replayed prepare by its header too); the batch's own buffer
    /// is not kept. With the whole frame held again the buffer check fails; with the header
    /// answered as it is held, the first frame check fails; with the boot forgetting the
    /// reference, the check after the restart fails.
    #[test]
    fn a_referenced_prepare_is_held_by_its_header_and_read_whole_from_the_segment() {
        with_test_task(|wal, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                ..
            } = t;
            let a = group(0);
            queues.boot(a, FlushPolicy::default());
            let running = glommio::spawn_local(task.run());
            let frame = send_messages(a, 1, 0);
            let sent = frame.shared().clone();
            queues.push(a, append(1, frame.clone()));
            drop(frame);
            let mut done = BTreeSet::new();
            settle(&inbox, &mut done, 1).await;
            assert_eq!(done, BTreeSet::from([(a, 1)]));
            let checksum = super::checksum(&consensus::Frame::new(sent.clone()));
            let whole = |read: Option<consensus::Frame>, when: &str| {
                let read = read.unwrap_or_else(|| panic!("{when}: the prepare is held"));
                assert!(
                    read.bytes() == &sent[..],
                    "{when}: the Read answers the whole frame ({} bytes, sent {})",
                    read.len(),
                    sent.len()
                );
            };
            whole(read(&queues, &inbox, a, 1, checksum).await, "running");
            assert!(
                sent.is_unique(),
                "the storage task keeps no reference to the batch's buffer"
            );
            stop(&queues, running, &fatal).await;
            // A restart over the same disks: the WAL replays the reference.
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                ..
            } = super::super::tests::test_task(&wal, &parts, Default::default()).await;
            queues.boot(a, FlushPolicy::default());
            let running = glommio::spawn_local(task.run());
            whole(read(&queues, &inbox, a, 1, checksum).await, "restarted");
            stop(&queues, running, &fatal).await;
        });
    }
}
