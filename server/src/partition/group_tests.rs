//! Tests of the partition groups' pump and storage task.

use super::*;
use journal::MemStorage;
use journal::mem::FailOp;
use wire::header::{FrameHeader, Layout, PrepareHeader};
use wire::{Command, Operation, PartitionKey, Sender};

/// The inbox holds at most `INBOX_BYTES_MAX` of frames however few they are (decision 503):
/// a shard whose pump did not run took in 8,192 one-megabyte prepares before. Beyond the
/// bound a frame is dropped and counted, and room comes back as the pump takes frames out.
#[test]
fn the_inbox_holds_a_bounded_number_of_bytes() {
    use crate::inbox_bound::INBOX_BYTES_MAX;
    let gauges = Arc::new(PartitionGauges::default());
    let inbox = Inbox::new(gauges.clone());
    let frame = || Event::Frame {
        from: 1,
        group: 7,
        bytes: Bytes::from(vec![0u8; 1 << 20]),
    };
    let fits = INBOX_BYTES_MAX >> 20;
    assert!(
        fits < INBOX_FRAMES_MAX,
        "the byte bound is the one that bites here"
    );
    for _ in 0..fits {
        assert!(inbox.push(frame()));
    }
    assert!(!inbox.push(frame()), "one megabyte more is over the bound");
    assert_eq!(gauges.dropped_full.load(Ordering::Relaxed), 1);
    // Events the pump must see are never refused.
    assert!(inbox.push(Event::Removed { group: 7 }));
    assert!(inbox.pop().is_some());
    assert!(inbox.push(frame()), "room again once the pump took one out");
    assert!(!inbox.push(frame()));
    assert_eq!(gauges.dropped_full.load(Ordering::Relaxed), 2);
}

/// A storage task over in-memory disks as a test drives it (replica 0 of 3, default WAL and
/// limits, a fresh boot of `wal`), with the handles the test reads back.
pub(super) struct TestTask {
    pub task: StorageTask<MemStorage>,
    pub queues: Rc<Queues>,
    pub inbox: Rc<Inbox>,
    pub fatal: Rc<RefCell<Option<String>>>,
    pub gauges: Arc<PartitionGauges>,
}

/// Runs `body` on a fresh executor (256 KiB of io memory) with a WAL disk, a partition
/// disk and [`test_task`] over them (no metadata), and returns what it returns.
pub(super) fn with_test_task<T, F>(
    body: impl FnOnce(MemStorage, MemStorage, TestTask) -> F + Send + 'static,
) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + 'static,
{
    with_test_task_wal(WalConfig::default(), body)
}

/// [`with_test_task`] with a WAL of `config`.
pub(super) fn with_test_task_wal<T, F>(
    config: WalConfig,
    body: impl FnOnce(MemStorage, MemStorage, TestTask) -> F + Send + 'static,
) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(256 << 10)
        .spawn(move || async move {
            let (wal, parts) = (MemStorage::new(), MemStorage::new());
            let task = test_task_wal(&wal, &parts, MetadataReader::default(), config).await;
            body(wal, parts, task).await
        })
        .unwrap()
        .join()
        .unwrap()
}

pub(super) async fn test_task(
    wal: &MemStorage,
    parts: &MemStorage,
    metadata: MetadataReader,
) -> TestTask {
    test_task_wal(wal, parts, metadata, WalConfig::default()).await
}

async fn test_task_wal(
    wal: &MemStorage,
    parts: &MemStorage,
    metadata: MetadataReader,
    config: WalConfig,
) -> TestTask {
    let identity = journal::Identity {
        cluster: 42,
        replica_id: 0,
        replica_count: 3,
    };
    let booted = boot_shard(wal.clone(), config, &BTreeMap::new())
        .await
        .unwrap();
    let gauges = Arc::new(PartitionGauges::default());
    let inbox = Rc::new(Inbox::new(gauges.clone()));
    let queues = Rc::new(Queues::default());
    let fatal = Rc::new(RefCell::new(None));
    let timeline: Rc<Timeline> = Rc::default();
    let task = StorageTask {
        partitions: parts.clone(),
        identity,
        wal: booted.wal,
        guard: ReclaimGuard::default(),
        faults: booted.faults,
        replay: booted.replay,
        groups: BTreeMap::new(),
        queues: queues.clone(),
        inbox: inbox.clone(),
        fatal: fatal.clone(),
        gauges: gauges.clone(),
        busy: Rc::default(),
        started: Instant::now(),
        limits: ReclaimLimits::default(),
        last_reclaim_at: 0,
        rejoin: false,
        metadata,
        read_cache_bytes: crate::partition::machine::READ_CACHE_BYTES,
        tail_share: Rc::new(Cell::new(crate::partition::machine::READ_CACHE_BYTES)),
        timeline: timeline.clone(),
        retiring: Rc::default(),
        away: away::AwayShared::new(queues.clone(), inbox.clone(), timeline, fatal.clone()),
        late: BTreeMap::new(),
        late_open: false,
    };
    TestTask {
        task,
        queues,
        inbox,
        fatal,
        gauges,
    }
}

/// The `Appended` completions in `inbox`, as `(group, op)`, into `into`.
pub(super) fn appended_into(inbox: &Inbox, into: &mut BTreeSet<(u64, u64)>) {
    while let Some((_, e)) = inbox.pop() {
        if let Event::Done {
            group,
            completion: Completion::Appended { op, .. },
        } = e
        {
            into.insert((group, op));
        }
    }
}

/// Yields until `into` holds `want` appends or the other tasks made no progress in many
/// turns (the in-memory disk answers at once, so a stuck task stays stuck however long it
/// runs).
/// Closes the storage task's queues, waits for the task to stop, and checks that it never
/// failed.
pub(super) async fn stop(
    queues: &Queues,
    running: glommio::Task<()>,
    fatal: &RefCell<Option<String>>,
) {
    queues.closed.set(true);
    queues.wake();
    running.await;
    assert_eq!(*fatal.borrow(), None);
}

pub(super) async fn settle(inbox: &Inbox, into: &mut BTreeSet<(u64, u64)>, want: usize) {
    for _ in 0..10_000 {
        appended_into(inbox, into);
        if into.len() >= want {
            return;
        }
        glommio::executor().yield_now().await;
    }
}

pub(super) fn group(partition: u32) -> u64 {
    GroupId::partition(PartitionKey {
        stream: 1,
        topic: 1,
        partition,
    })
    .unwrap()
    .0
}

/// A sealed partition prepare of `op` in `group` (a StoreConsumerOffset body).
pub(super) fn prepare(group: u64, op: u64) -> Frame {
    prepare_of(group, op, Operation::StoreConsumerOffset, &[op as u8; 64])
}

/// Messages in a [`send_messages`] batch.
pub(super) const SEND_BATCH: u64 = 80;

/// A sealed SendMessages prepare of `op` in `group` whose batch of [`SEND_BATCH`] 1000-byte
/// messages starts at `base_offset`: more than [`REF_BODY_MIN`](super::REF_BODY_MIN), so
/// it is written once at its segment's tail and referenced from the WAL (decision 414).
pub(super) fn send_messages(group: u64, op: u64, base_offset: u64) -> Frame {
    let (frame, body) = send_batch(group, op, base_offset, SEND_BATCH);
    assert!(body.len() >= super::REF_BODY_MIN);
    frame
}

/// A sealed SendMessages prepare of `op` in `group` whose batch of `messages` 1000-byte
/// messages starts at `base_offset`, and the batch.
pub(super) fn send_batch(group: u64, op: u64, base_offset: u64, messages: u64) -> (Frame, Vec<u8>) {
    let payload = vec![op as u8; 1000];
    let payloads: Vec<&[u8]> = (0..messages).map(|_| &payload[..]).collect();
    let body = journal::batch::build(0, base_offset, 1_000 + op, &payloads);
    (prepare_of(group, op, Operation::SendMessages, &body), body)
}

fn prepare_of(group: u64, op: u64, operation: Operation, body: &[u8]) -> Frame {
    let mut header = PrepareHeader::zeroed();
    header.frame = FrameHeader::new(
        Command::Prepare,
        Sender {
            cluster: 42,
            replica: 0,
            view: 1,
        },
    );
    header.op.set(op);
    header.commit.set(op - 1);
    header.timestamp.set(1_000 + op);
    header.operation = operation.byte();
    header.group.set(group);
    wire::encode::finish_header(&mut header, body).unwrap();
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(body);
    Frame::new(frame)
}

/// Runs the storage task over `groups` groups with `appends` appends each, queued at once,
/// after `before` ran on the WAL's storage. Returns the events it sent back, the fatal
/// cause, the WAL's fdatasyncs during the run, and the gauges.
/// `(group, op)` of every `Appended`, the fatal cause, the WAL's fdatasyncs, the gauges.
type AppendRun = (Vec<(u64, u64)>, Option<String>, u64, Arc<PartitionGauges>);
/// [`AppendRun`] and each group's segment end offset after the run.
type AppendRunWithEnds = (
    Vec<(u64, u64)>,
    Option<String>,
    u64,
    Arc<PartitionGauges>,
    Vec<u64>,
);

fn run_appends(
    groups: u32,
    appends: u64,
    before: impl FnOnce(&MemStorage, &MemStorage) + Send + 'static,
) -> AppendRun {
    let (events, fatal, syncs, gauges, _) = run_appends_with(groups, appends, false, before);
    (events, fatal, syncs, gauges)
}

/// [`run_appends`]; with `batches`, each append is followed in its group's queue by a
/// committed batch of 1024 messages for the segments (a flush due after each), as the pump
/// queues them when ops commit while later ones are being appended. Also returns the
/// next offset of each group's segments as reopened from the partition directory after it.
fn run_appends_with(
    groups: u32,
    appends: u64,
    batches: bool,
    before: impl FnOnce(&MemStorage, &MemStorage) + Send + 'static,
) -> AppendRunWithEnds {
    with_test_task(move |wal_disk, parts, t| async move {
        let TestTask {
            task,
            queues,
            inbox,
            fatal,
            gauges,
        } = t;
        for p in 0..groups {
            queues.boot(group(p), FlushPolicy::default());
        }
        let payloads: Vec<&[u8]> = (0..1024).map(|_| &b"12345678"[..]).collect();
        for op in 1..=appends {
            for p in 0..groups {
                let frame = prepare(group(p), op);
                queues.push(group(p), PartitionStorageOp::Append { op, frame });
                if batches {
                    let base = (op - 1) * 1024;
                    let batch = journal::batch::build(u64::from(p), base, op, &payloads);
                    let work = StorageWork::Batch(Bytes::from(batch));
                    queues.push(group(p), PartitionStorageOp::Machine(work));
                }
            }
        }
        before(&wal_disk, &parts);
        let syncs = wal_disk.counts().1;
        queues.closed.set(true);
        task.run().await;
        let syncs = wal_disk.counts().1 - syncs;
        let mut ends = Vec::new();
        for p in 0..groups {
            let prefix = group_prefix(group(p));
            let policy = FlushPolicy::default();
            let (log, _) = PartitionLog::open(parts.clone(), &prefix, policy, 0)
                .await
                .unwrap();
            ends.push(log.next_offset());
        }
        let mut events = Vec::new();
        while let Some((_, e)) = inbox.pop() {
            events.push(e);
        }
        // A booted group's machine shares its segment map (`Rc`): the events stay
        // on the executor's thread, their appends leave.
        let events = appended(&events);
        let fatal = fatal.borrow().clone();
        (events, fatal, syncs, gauges, ends)
    })
}

fn appended(events: &[Event]) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Done {
                group,
                completion: Completion::Appended { op, .. },
            } => Some((*group, *op)),
            _ => None,
        })
        .collect()
}

/// Appends of several groups queued together go into one WAL window: one write, one
/// `fdatasync` for all of them (plus the durable-end record written when the WAL goes
/// idle and at shutdown), and each group's completions come back in its op order.
#[test]
fn appends_of_many_groups_share_one_window_and_one_fdatasync() {
    let (events, fatal, syncs, gauges) = run_appends(3, 10, |_, _| {});
    assert_eq!(fatal, None);
    let done = events;
    assert_eq!(done.len(), 30);
    for p in 0..3 {
        let ops: Vec<u64> = done
            .iter()
            .filter(|(g, _)| *g == group(p))
            .map(|(_, op)| *op)
            .collect();
        assert_eq!(ops, (1..=10).collect::<Vec<_>>(), "group {p} in op order");
    }
    assert_eq!(gauges.wal_commits.load(Ordering::Relaxed), 1);
    assert_eq!(gauges.appends.load(Ordering::Relaxed), 30);
    assert!(
        syncs <= 3,
        "{syncs} WAL fdatasyncs for 30 appends: one window, the durable-end records"
    );
}

/// A window whose `fdatasync` fails acknowledges none of its appends, and the node stops.
#[test]
fn a_failed_window_sync_acknowledges_nothing() {
    let (events, fatal, _, _) = run_appends(2, 5, |wal, _| wal.fail_next(FailOp::Sync));
    assert!(fatal.is_some_and(|f| f.contains("partition WAL commit")));
    assert_eq!(events, Vec::new(), "no Appended before the sync returned");
}

/// Committed batches for the segments queued between a group's appends neither split the
/// window (every append in one write and one `fdatasync`) nor wait for it: their segment
/// writes are done in the same pass (every batch is in the segments after it), and every
/// append is acknowledged.
#[test]
fn segment_batches_between_appends_share_the_window_pass() {
    let (events, fatal, syncs, gauges, ends) = run_appends_with(2, 4, true, |_, _| {});
    assert_eq!(fatal, None);
    assert_eq!(events.len(), 8);
    assert_eq!(gauges.wal_commits.load(Ordering::Relaxed), 1, "one window");
    assert!(syncs <= 3, "{syncs} WAL fdatasyncs");
    assert_eq!(
        ends,
        vec![4 * 1024, 4 * 1024],
        "every batch in the segments"
    );
}

/// A segment whose blocks cannot be reserved ahead (decision 515) is counted once and its
/// appends go on: every append acknowledged, every batch in the segments, the node running.
#[test]
fn a_failed_reservation_is_counted_and_the_appends_go_on() {
    let (events, fatal, _, gauges, ends) =
        run_appends_with(2, 4, true, |_, parts| parts.fail_next(FailOp::Reserve));
    assert_eq!(fatal, None);
    assert_eq!(events.len(), 8);
    assert_eq!(ends, vec![4 * 1024, 4 * 1024]);
    assert_eq!(
        gauges.segment_reserve_failures.load(Ordering::Relaxed),
        1,
        "one segment failed to reserve, once"
    );
}

/// With segment flushes running beside the window's `fdatasync`, a failed sync still
/// acknowledges nothing.
#[test]
fn a_failed_window_sync_beside_segment_flushes_acknowledges_nothing() {
    let (events, fatal, _, _, _) =
        run_appends_with(2, 4, true, |wal, _| wal.fail_next(FailOp::Sync));
    assert!(fatal.is_some_and(|f| f.contains("partition WAL commit")));
    assert_eq!(events, Vec::new(), "no Appended before the sync");
}

/// The durable-end record of an idle WAL (decision 90) waits until no work came for
/// [`END_IDLE`] (decision 351): the window's `fdatasync` is the only one while its producer
/// turns around, a next append within that time finds no end record before its window,
/// and a WAL left idle is vouched for.
#[test]
fn the_idle_end_record_waits_for_a_quiet_wal() {
    let (syncs, quiet, fatal) = with_test_task(|wal_disk, _parts, t| async move {
        let TestTask {
            task,
            queues,
            inbox,
            fatal,
            ..
        } = t;
        queues.boot(group(0), FlushPolicy::default());
        let storage = glommio::spawn_local(task.run());
        let appended = |inbox: &Inbox| {
            let mut n = 0;
            while let Some((_, e)) = inbox.pop() {
                n += appended(&[e]).len();
            }
            n
        };
        let mut syncs = Vec::new();
        for op in 1..=2 {
            let before = wal_disk.counts().1;
            queues.push(
                group(0),
                PartitionStorageOp::Append {
                    op,
                    frame: prepare(group(0), op),
                },
            );
            let mut seen = 0;
            while seen == 0 {
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                seen = appended(&inbox);
            }
            // Turned around well inside END_IDLE: the next append comes now.
            syncs.push(wal_disk.counts().1 - before);
        }
        let before = wal_disk.counts().1;
        glommio::timer::sleep(END_IDLE * 3).await;
        let quiet = wal_disk.counts().1 - before;
        queues.closed.set(true);
        queues.wake();
        storage.await;
        let fatal = fatal.borrow().clone();
        (syncs, quiet, fatal)
    });
    assert_eq!(fatal, None);
    assert_eq!(
        syncs,
        vec![1, 1],
        "one fdatasync per append while appends keep coming (no end record between them)"
    );
    assert_eq!(
        quiet, 1,
        "the quiet WAL's end record: one write and fdatasync"
    );
}

mod affinity {
    use super::Affinity;

    /// Nothing is due until the lead has held one view for a heartbeat timeout; then each
    /// backup group once per heartbeat timeout; a new view or a lost lead starts over.
    #[test]
    fn takeovers_wait_for_a_steady_lead_and_repeat_once_per_timeout() {
        let mut a = Affinity::default();
        let groups = || [1u64, 2].into_iter();
        assert!(a.due(0, None, 10, groups()).is_empty());
        assert!(a.due(1, Some(3), 10, groups()).is_empty(), "lead just seen");
        assert!(a.due(10, Some(3), 10, groups()).is_empty());
        assert_eq!(a.due(11, Some(3), 10, groups()), vec![1, 2]);
        assert!(
            a.due(12, Some(3), 10, groups()).is_empty(),
            "once per timeout"
        );
        assert_eq!(
            a.due(20, Some(3), 10, [2u64].into_iter()),
            Vec::<u64>::new()
        );
        assert_eq!(a.due(21, Some(3), 10, groups()), vec![1, 2]);
        assert!(
            a.due(40, Some(4), 10, groups()).is_empty(),
            "a new view starts over"
        );
        assert!(a.due(45, None, 10, groups()).is_empty());
        assert!(
            a.due(60, Some(4), 10, groups()).is_empty(),
            "the lead was lost"
        );
        assert_eq!(a.due(70, Some(4), 10, groups()), vec![1, 2]);
    }
}
