//! The storage task of one shard's partition groups: the shard WAL, every group's superblock,
//! segments and offsets, and the group commit of their appends (see the parent module's
//! doc).

use super::*;

/// An append in the open window: group, op, lsn, the frame, and its body's reference when
/// the WAL record carries one (decision 414).
pub(super) type WindowEntry = (u64, u64, u64, Frame, Option<BodyRef>);

/// The frame a group holds for a journaled prepare (decision 443): its header alone, copied
/// out of the whole frame so the batch's buffer is freed, when its body is in the segments
/// (`body`); the whole frame otherwise.
pub(super) fn held_frame(frame: Frame, body: Option<&BodyRef>) -> Frame {
    match (body, frame.header_bytes()) {
        (Some(_), Some(header)) => Frame::new(Bytes::copy_from_slice(header)),
        _ => frame,
    }
}

/// A held prepare made whole again for a `Read` (decision 443): the header and the `len`
/// bytes `at` names in the segments, when they have its length and hash; `None` otherwise
/// (a read error, or segments an install replaced), which the core takes as not held here.
pub(super) async fn whole_frame<S: Storage>(
    log: &PartitionLog<S>,
    header: &Frame,
    at: &BodyRef,
) -> Option<Frame> {
    let body = match log.read_span(at.segment, at.position, at.len).await {
        Ok(Some(body)) => body,
        Ok(None) => return None,
        Err(e) => {
            warn!(error = %e, "reading a held prepare's body from the segments failed");
            return None;
        }
    };
    // `read_span` answers exactly `at.len` bytes; the hash tells whether they are the body.
    if !at.names(&body) {
        warn!(
            segment = at.segment,
            position = at.position,
            "a held prepare's body does not match its reference"
        );
        return None;
    }
    let mut whole = Vec::with_capacity(wire::HEADER_SIZE + body.len());
    whole.extend_from_slice(header.header_bytes()?);
    whole.extend_from_slice(&body);
    Some(Frame::new(whole))
}

/// The base offset of the SendMessages batch a whole prepare frame carries.
pub(super) fn send_messages_base(frame: &[u8]) -> Option<u64> {
    if frame.get(208) != Some(&wire::Operation::SendMessages.byte()) {
        return None;
    }
    journal::batch::peek(frame.get(wire::HEADER_SIZE..)?).map(|i| i.base_offset)
}

/// Reserves a SendMessages body at `disk`'s segment tail when it can go there now: its base
/// offset, whether it is [`REF_BODY_MIN`] bytes or more (its segment must be written and synced
/// before its append is acknowledged), and the reference its WAL record then carries.
pub(super) fn reserve_body<S: Storage>(
    disk: &mut GroupDisk<S>,
    gauges: &PartitionGauges,
    frame: &Frame,
) -> Option<(u64, bool, Option<BodyRef>)> {
    if frame.bytes().get(208) != Some(&wire::Operation::SendMessages.byte()) {
        return None;
    }
    let body = frame.shared().slice(wire::HEADER_SIZE..);
    let info = journal::batch::peek(&body)?;
    let (segment, position) = disk.log.reserve(body.clone())?;
    let referenced = body.len() >= REF_BODY_MIN;
    if referenced {
        add(&gauges.bodies_ahead, 1);
        add(&gauges.bodies_ahead_bytes, body.len() as u64);
    }
    let reference = referenced
        .then(|| BodyRef::of(segment, position, &body))
        .flatten();
    Some((info.base_offset, referenced, reference))
}

/// One group's disk state in the storage task.
pub(super) struct GroupDisk<S: Storage> {
    pub(super) prefix: String,
    pub(super) policy: FlushPolicy,
    pub(super) superblock: Superblock<S>,
    pub(super) log: PartitionLog<S>,
    pub(super) offset_store: OffsetStore<S>,
    /// Journaled prepares at or above the checkpoint op, with their lsn (0: replayed at boot,
    /// held at the WAL floor). A prepare whose body is in `bodies` is held by its header alone
    /// (`held_frame`): its batch is in the segments, and a `Read` takes it from there
    /// (decision 443), so a group never holds up to a checkpoint interval of whole batches.
    pub(super) frames: BTreeMap<u64, (u64, Frame)>,
    /// Where the bodies of the `frames` journaled as references are in the segments
    /// (decision 414): a copy forward copies the reference, not the body.
    pub(super) bodies: BTreeMap<u64, BodyRef>,
    pub(super) checkpoint_op: u64,
    /// The end offset of the batches committed here (the checkpoint's frontier at boot): a
    /// rewind never goes below it.
    pub(super) committed_end: u64,
    pub(super) last_persist_failed: bool,
    /// Where the read path finds the written batches (decision 280), refreshed after every
    /// flush and install.
    pub(super) map: SharedMap,
}

impl<S: Storage> GroupDisk<S> {
    /// The lowest lsn this group still needs: its entries from the checkpoint op up (the
    /// entry at the checkpoint op itself stays, journal.md §6).
    pub(super) fn hold(&self, floor: u64) -> Option<u64> {
        self.frames
            .values()
            .map(|(lsn, _)| if *lsn == 0 { floor } else { *lsn })
            .min()
    }
}

/// The shard's disks: the WAL and every group's files.
pub struct ShardDisk<S: Storage> {
    /// The shard's partition directory (every group's files, prefixed).
    pub partitions: S,
    /// The WAL's directory.
    pub wal: S,
}

/// The storage task's state.
pub(super) struct StorageTask<S: Storage> {
    pub(super) partitions: S,
    pub(super) identity: journal::Identity,
    pub(super) wal: PartitionWal<S>,
    pub(super) guard: ReclaimGuard,
    pub(super) faults: FaultRecord<S>,
    /// Replayed prepares of groups not booted yet.
    pub(super) replay: GroupReplay,
    pub(super) groups: BTreeMap<u64, GroupDisk<S>>,
    pub(super) queues: Rc<Queues>,
    pub(super) inbox: Rc<Inbox>,
    pub(super) fatal: Rc<RefCell<Option<String>>>,
    pub(super) gauges: Arc<PartitionGauges>,
    pub(super) busy: Rc<RefCell<BTreeSet<u64>>>,
    pub(super) started: Instant,
    pub(super) limits: ReclaimLimits,
    /// The durable lsn at the last reclaim.
    pub(super) last_reclaim_at: u64,
    /// The stamp records a rejoin (decision 240).
    pub(super) rejoin: bool,
    /// Committed metadata: whether a group's incarnation is dead (decision 342).
    pub(super) metadata: MetadataReader,
    /// Each group's in-memory tail budget (decision 280).
    pub(super) read_cache_bytes: usize,
    /// [`Host::tail_share`], handed to every machine booted here.
    pub(super) tail_share: Rc<Cell<usize>>,
    /// Where each op's time goes (decision 350).
    pub(super) timeline: Rc<Timeline>,
    /// Reclaimed WAL files being removed apart (decision 400).
    pub(super) retiring: Rc<retire::Retiring<S::File>>,
    /// Groups away running a window's segment work (decision 440).
    pub(super) away: Rc<away::AwayShared<S>>,
    /// Appends taken into a window while their group was away with their body (decision
    /// 480): acknowledged once the group is back and their window committed.
    pub(super) late: BTreeMap<u64, Vec<WindowEntry>>,
    /// A late entry is in the open WAL window: it must be committed.
    pub(super) late_open: bool,
}

pub(super) fn identity_of(frame: &[u8]) -> u128 {
    frame
        .get(..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u128::from_le_bytes)
}

impl<S: Storage + Clone + 'static> StorageTask<S> {
    pub(super) fn fail(&self, cause: String) {
        error!(cause = %cause, "partition storage failed; stopping the node");
        self.fatal.borrow_mut().get_or_insert(cause);
        self.inbox.wake();
    }

    pub(super) fn done(&self, group: u64, completion: Completion) {
        self.inbox.push(Event::Done { group, completion });
    }

    pub(super) fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    pub(super) async fn commit_window(&mut self) -> Result<u64, WalError> {
        let started = Instant::now();
        let lsn = self.wal.commit().await?;
        self.committed(started);
        Ok(lsn)
    }

    /// [`StorageTask::commit_window`] that, while the window's write and `fdatasync` are in
    /// flight, sends the large bodies of appends that arrive to their segments ahead of their
    /// own window (decision 480, [`away::dispatch_early`]).
    /// The groups of `staying` have entries in this window and are not sent away.
    pub(super) async fn commit_window_dispatching(
        &mut self,
        staying: &BTreeSet<u64>,
    ) -> Result<u64, WalError> {
        let started = Instant::now();
        let StorageTask {
            wal,
            groups,
            queues,
            away,
            gauges,
            ..
        } = self;
        let lsn = futures_lite::future::or(wal.commit(), async {
            match away::dispatch_early(groups, queues, away, gauges, staying).await {}
        })
        .await?;
        self.committed(started);
        Ok(lsn)
    }

    pub(super) fn committed(&mut self, started: Instant) {
        self.away
            .durable(self.wal.durable_lsn(), self.wal.last_written_at());
        add(&self.gauges.wal_commits, 1);
        add(
            &self.gauges.wal_commit_ns,
            u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
        );
    }

    pub(super) async fn run(mut self) {
        while self.queues.ready().await {
            self.take_back();
            if self.fatal.borrow().is_some() {
                // The node is stopping: write nothing more.
                self.queues.groups.borrow_mut().clear();
                self.queues.boots.borrow_mut().clear();
                self.queues.removals.borrow_mut().clear();
                self.queues.early.borrow_mut().clear();
                continue;
            }
            if !self.queues.seals.borrow().is_empty()
                || !self.queues.removals.borrow().is_empty()
                || !self.queues.boots.borrow().is_empty()
            {
                // These passes need every group's disk here (decision 440).
                self.settle_away().await;
            }
            self.apply_seals().await;
            let removals: Vec<_> = self.queues.removals.borrow_mut().drain(..).collect();
            for group in removals {
                self.remove_group(group).await;
            }
            let boots: Vec<_> = self.queues.boots.borrow_mut().drain(..).collect();
            for (group, policy) in boots {
                self.boot_group(group, policy).await;
            }
            self.append_window().await;
            let mut checkpointed = false;
            let groups: Vec<u64> = self.queues.groups.borrow().keys().copied().collect();
            for group in groups {
                if self.queues.away.borrow().contains(&group) {
                    continue; // its work waits until it is back
                }
                loop {
                    let op = {
                        let mut queues = self.queues.groups.borrow_mut();
                        let Some(q) = queues.get_mut(&group) else {
                            break;
                        };
                        if matches!(q.front(), None | Some(PartitionStorageOp::Append { .. })) {
                            break;
                        }
                        q.pop_front().expect("non-empty")
                    };
                    checkpointed |= matches!(op, PartitionStorageOp::Checkpoint { .. });
                    self.execute(group, op).await;
                    if self.fatal.borrow().is_some() {
                        break;
                    }
                }
            }
            self.queues.groups.borrow_mut().retain(|_, q| !q.is_empty());
            self.spawn_seals();
            if self.queues.recheck.replace(false)
                || checkpointed
                || self.wal.durable_lsn() >= self.last_reclaim_at + RECLAIM_EVERY_LSNS
            {
                // Reclaim weighs every group's holds and synced segments.
                self.settle_away().await;
                self.reclaim().await;
            }
            if self.queues.is_idle() && self.wal.end_lag() > 0 && self.stays_idle().await {
                // Idle: vouch for the last window (decision 90).
                if let Err(e) = self.wal.record_end().await {
                    warn!(error = %e, "recording the WAL's durable end failed");
                }
            }
        }
        self.settle_away().await;
        self.shutdown().await;
    }

    /// Whether no work came for [`END_IDLE`] (`false` at once when work comes or the queues
    /// close).
    pub(super) async fn stays_idle(&self) -> bool {
        let queues = self.queues.clone();
        futures_lite::future::or(
            async move {
                queues.ready().await;
                false
            },
            async {
                glommio::timer::sleep(END_IDLE).await;
                true
            },
        )
        .await
    }

    /// The leading appends of every group's queue, in one WAL window (group commit); each
    /// group's `Appended` only after the window's `fdatasync` returned. Committed batches for
    /// the segments met among those leading appends are taken too (segments and WAL are apart:
    /// a committed batch and an uncommitted prepare commute), and the segment writes they make
    /// due run while the window's write and `fdatasync` are in flight instead of after them
    /// (decision 270: a segment write is off the critical path of the next window).
    pub(super) async fn append_window(&mut self) {
        let mut window: Vec<WindowEntry> = Vec::new();
        let mut flush: BTreeSet<u64> = BTreeSet::new();
        // Groups whose segment takes a referenced body in this window (decision 441).
        let mut ahead: BTreeSet<u64> = BTreeSet::new();
        loop {
            let next = {
                let away = self.queues.away.borrow();
                let early = self.queues.early.borrow();
                let mut queues = self.queues.groups.borrow_mut();
                queues.iter_mut().find_map(|(group, q)| {
                    let here = !away.contains(group);
                    let takes = match q.front()? {
                        // An append whose body went ahead is taken while its group is away.
                        PartitionStorageOp::Append { op, .. } => {
                            here || early.get(group).is_some_and(|(o, _)| o == op)
                        }
                        PartitionStorageOp::Machine(StorageWork::Batch(_)) => here,
                        _ => false,
                    };
                    takes
                        .then(|| q.pop_front())
                        .flatten()
                        .map(|op| (*group, op))
                })
            };
            let Some((group, next)) = next else {
                break;
            };
            let (op, frame) = match next {
                PartitionStorageOp::Append { op, frame } => (op, frame),
                PartitionStorageOp::Machine(StorageWork::Batch(bytes)) => {
                    match self.hold_batch(group, bytes) {
                        Ok(true) => {
                            flush.insert(group);
                        }
                        Ok(false) => {}
                        Err(e) => {
                            self.fail(e);
                            return;
                        }
                    }
                    continue;
                }
                _ => unreachable!("only appends and batches are taken"),
            };
            let early = self
                .queues
                .early
                .borrow_mut()
                .remove(&group)
                .filter(|(o, _)| *o == op);
            if let Some((_, body)) = early {
                // Its body is in the segment or on its way there (decision 480): only its WAL
                // record remains.
                if !self
                    .submit_early(group, op, frame, body, &mut window, &mut ahead)
                    .await
                {
                    return;
                }
                continue;
            }
            let Some(disk) = self.groups.get(&group) else {
                self.done(
                    group,
                    Completion::AppendFailed {
                        op,
                        checksum: identity_of(frame.bytes()),
                    },
                );
                continue;
            };
            if op < disk.checkpoint_op {
                // A checkpoint landed above it (a transfer install): durable in the segments.
                self.done(
                    group,
                    Completion::Appended {
                        op,
                        checksum: identity_of(frame.bytes()),
                    },
                );
                continue;
            }
            let now = self.now_us();
            let reserved = self.reserve_ahead(group, &frame, &mut ahead);
            let body = reserved.and_then(|(_, body)| body);
            let mut submitted = self.submit(group, &frame, body.as_ref(), now);
            if matches!(submitted, Err(WalError::WindowFull { .. })) {
                if let Err(e) = self
                    .finish_window_flushing(&mut window, &BTreeSet::new(), &mut ahead)
                    .await
                {
                    self.fail(e);
                    return;
                }
                submitted = self.submit(group, &frame, body.as_ref(), now);
            }
            match submitted {
                Ok((lsn, bytes)) => {
                    add(&self.gauges.wal_bytes, bytes);
                    self.timeline.windowed(group, op, Instant::now());
                    window.push((group, op, lsn, frame, body));
                }
                Err(e) => {
                    warn!(group, op, error = %e, "partition append refused by the WAL");
                    // Its batch must not reach the segment: nothing journals it.
                    if let Some((base, _)) = reserved
                        && !self
                            .groups
                            .get_mut(&group)
                            .is_some_and(|d| d.log.unreserve(base))
                    {
                        self.fail(format!(
                            "group {group:#x}: op {op}: its batch was taken for the segment and \
                             cannot be given back"
                        ));
                        return;
                    }
                    self.done(
                        group,
                        Completion::AppendFailed {
                            op,
                            checksum: identity_of(frame.bytes()),
                        },
                    );
                }
            }
        }
        if let Err(e) = self
            .finish_window_flushing(&mut window, &flush, &mut ahead)
            .await
        {
            self.fail(e);
        }
    }

    /// Reserves a SendMessages body at its segment's tail when it can go there now
    /// (`PartitionLog::reserve`: it starts at the next offset): its base offset, and the
    /// reference the WAL record carries instead of it when it is [`REF_BODY_MIN`] bytes or
    /// more. `ahead` notes the group of a referenced body: its segment is written and synced in
    /// this window (a shorter body waits for the next flush: decision 441).
    pub(super) fn reserve_ahead(
        &mut self,
        group: u64,
        frame: &Frame,
        ahead: &mut BTreeSet<u64>,
    ) -> Option<(u64, Option<BodyRef>)> {
        let disk = self.groups.get_mut(&group)?;
        let (base, referenced, body) = reserve_body(disk, &self.gauges, frame)?;
        if referenced {
            // Written and synced beside the window. A shorter body waits in the log's pending
            // batches for the next flush (the policy's, or a referenced body's): its WAL record
            // holds it whole, and one device request fewer per window (decision 441).
            ahead.insert(group);
        }
        Some((base, body))
    }

    /// Puts the WAL record of an append whose body went to its segment ahead of this window
    /// (decision 480) in the window: with the window's entries when its group is back (its
    /// segment is durable), otherwise with the group's late entries, acknowledged when it is
    /// back. `false` when the task failed: the batch is in the segment's tail already, so an
    /// append the WAL refuses cannot be given back.
    pub(super) async fn submit_early(
        &mut self,
        group: u64,
        op: u64,
        frame: Frame,
        body: Option<BodyRef>,
        window: &mut Vec<WindowEntry>,
        ahead: &mut BTreeSet<u64>,
    ) -> bool {
        let now = self.now_us();
        let mut submitted = self.submit(group, &frame, body.as_ref(), now);
        if matches!(submitted, Err(WalError::WindowFull { .. })) {
            if let Err(e) = self
                .finish_window_flushing(window, &BTreeSet::new(), ahead)
                .await
            {
                self.fail(e);
                return false;
            }
            submitted = self.submit(group, &frame, body.as_ref(), now);
        }
        match submitted {
            Ok((lsn, bytes)) => {
                add(&self.gauges.wal_bytes, bytes);
                self.timeline.windowed(group, op, Instant::now());
                let entry = (group, op, lsn, frame, body);
                if self.queues.away.borrow().contains(&group) {
                    self.late.entry(group).or_default().push(entry);
                    self.late_open = true;
                } else {
                    window.push(entry);
                }
                true
            }
            Err(e) => {
                self.fail(format!(
                    "group {group:#x}: op {op}: the WAL refused an append whose batch went to \
                     the segment ahead of its window: {e}"
                ));
                false
            }
        }
    }

    /// Submits an append's WAL record, a reference to its body when it has one: its lsn and
    /// the record's payload bytes.
    pub(super) fn submit(
        &mut self,
        group: u64,
        frame: &Frame,
        body: Option<&BodyRef>,
        now: u64,
    ) -> Result<(u64, u64), WalError> {
        match (body, frame.header_bytes()) {
            (Some(body), Some(header)) => self
                .wal
                .submit_ref(group, header, body, now)
                .map(|lsn| (lsn, (wire::HEADER_SIZE + BodyRef::LEN) as u64)),
            _ => self
                .wal
                .submit(group, frame.bytes(), now)
                .map(|lsn| (lsn, frame.bytes().len() as u64)),
        }
    }

    /// A committed batch into its group's segments (held in memory until a flush): whether a
    /// flush is due.
    pub(super) fn hold_batch(&mut self, group: u64, bytes: Bytes) -> Result<bool, String> {
        let Some(disk) = self.groups.get_mut(&group) else {
            return Ok(false);
        };
        let end = journal::batch::peek(&bytes).map_or(0, |i| i.end_offset());
        disk.committed_end = disk.committed_end.max(end);
        if end <= disk.log.next_offset() {
            // Held already: reserved at the tail (a short body waits there for a flush,
            // decision 441), or in the segments since before a restart.
            return Ok(disk.log.should_flush(0, 0));
        }
        disk.log
            .commit_verified_batch(bytes)
            .map_err(|e| format!("group {group:#x}: segments: {e}"))?;
        Ok(disk.log.should_flush(0, 0))
    }

    /// Writes the window durably: the WAL's one durable write while the segments of
    /// `ahead` take their referenced bodies and are synced (decision 414) and the due
    /// segment flushes of `flush` run (decision 270: a segment write is off the critical path
    /// of the next window). Each `Appended` is sent once the WAL and every synced segment are
    /// durable.
    ///
    /// The groups with segment work go away to run it (decision 440, `away`): this waits only
    /// for the WAL commit, and their entries are acknowledged when they come back.
    pub(super) async fn finish_window_flushing(
        &mut self,
        window: &mut Vec<WindowEntry>,
        flush: &BTreeSet<u64>,
        ahead: &mut BTreeSet<u64>,
    ) -> Result<(), String> {
        if window.is_empty() && flush.is_empty() && ahead.is_empty() && !self.late_open {
            return Ok(());
        }
        let leaving: BTreeSet<u64> = flush
            .iter()
            .chain(ahead.iter())
            .copied()
            .filter(|g| self.groups.contains_key(g))
            .collect();
        let mut parked: BTreeMap<u64, Vec<WindowEntry>> = BTreeMap::new();
        let mut staying = Vec::with_capacity(window.len());
        for entry in window.drain(..) {
            if leaving.contains(&entry.0) {
                parked.entry(entry.0).or_default().push(entry);
            } else {
                staying.push(entry);
            }
        }
        let has_records = !parked.is_empty() || !staying.is_empty() || self.late_open;
        for group in leaving {
            let disk = self.groups.remove(&group).expect("filtered on presence");
            let synced = ahead.contains(&group);
            let entries = parked.remove(&group).unwrap_or_default();
            self.send_away(group, disk, synced, entries);
        }
        ahead.clear();
        if has_records {
            // One durable write for every group's appends; meanwhile the large
            // bodies that come in go to their segments (decision 480).
            self.late_open = false;
            // A group with entries here stays until they are accounted: its disk takes them.
            let staying_groups: BTreeSet<u64> = staying.iter().map(|e| e.0).collect();
            self.commit_window_dispatching(&staying_groups)
                .await
                .map_err(|e| format!("partition WAL commit: {e}"))?;
            self.ack_late();
        }
        let synced = Instant::now();
        let written = self.wal.last_written_at().unwrap_or(synced);
        self.account(staying, true, written, synced);
        Ok(())
    }

    /// Cuts `group`'s segments back to `offset` (the first body of prepares a view change
    /// truncated; decision 414). Never below a batch this node committed: that would be a
    /// truncation of committed ops, which the core never asks for.
    pub(super) async fn rewind(&mut self, group: u64, offset: u64) -> Result<(), String> {
        let Some(disk) = self.groups.get_mut(&group) else {
            return Ok(());
        };
        if offset >= disk.log.next_offset() {
            return Ok(());
        }
        if offset < disk.committed_end {
            return Err(format!(
                "the segments would be cut to offset {offset}, below the committed offset {}",
                disk.committed_end
            ));
        }
        let rewound = disk.log.rewind(offset).await;
        disk.map.borrow_mut().refresh(&disk.log);
        add(&self.gauges.segment_rewinds, 1);
        debug!(
            group = format!("{group:#x}"),
            offset, "segment tail rewound"
        );
        rewound.map_err(|e| format!("segments: {e}"))
    }

    /// The due segment flushes of `groups`, one after the other.
    pub(super) async fn flush_segments(&mut self, groups: &BTreeSet<u64>) -> Result<(), String> {
        for (group, disk) in self.groups.iter_mut().filter(|(g, _)| groups.contains(g)) {
            let flushed = disk.log.flush().await;
            // Readers learn what is written (decision 280), also after a failed flush.
            disk.map.borrow_mut().refresh(&disk.log);
            flushed.map_err(|e| format!("group {group:#x}: segments: {e}"))?;
        }
        Ok(())
    }

    pub(super) async fn execute(&mut self, group: u64, op: PartitionStorageOp) {
        let identity = self.identity;
        let Some(disk) = self.groups.get_mut(&group) else {
            return;
        };
        match op {
            PartitionStorageOp::Append { .. } => unreachable!("appends run in windows"),
            PartitionStorageOp::Truncate { from_op } => {
                if disk.last_persist_failed {
                    self.fail(format!(
                        "group {group:#x}: truncate from op {from_op} refused: the superblock \
                         write before it failed"
                    ));
                    return;
                }
                let truncated = disk.frames.split_off(&from_op);
                let referenced = disk.bodies.split_off(&from_op);
                // Bodies of the truncated prepares written ahead at the segment's tail go once
                // the truncation is durable (decision 414); a referenced one is held by its
                // header alone (decision 443), its reference names where it starts.
                let rewind_to = truncated
                    .values()
                    .filter_map(|(_, f)| send_messages_base(f.bytes()))
                    .chain(referenced.values().map(|b| b.base_offset))
                    .min();
                let now = self.now_us();
                let lsn = match self.wal.submit_truncate(group, from_op, now) {
                    Ok(lsn) => lsn,
                    Err(e) => {
                        self.fail(format!("group {group:#x}: truncate from op {from_op}: {e}"));
                        return;
                    }
                };
                if let Err(e) = self.commit_window().await {
                    self.fail(format!("group {group:#x}: truncate from op {from_op}: {e}"));
                    return;
                }
                self.guard.note(lsn, group, &[]);
                if let Some(offset) = rewind_to
                    && let Err(e) = self.rewind(group, offset).await
                {
                    self.fail(format!("group {group:#x}: truncate from op {from_op}: {e}"));
                }
            }
            PartitionStorageOp::Persist(state) => {
                let op_head = disk.frames.keys().next_back().copied().unwrap_or(0);
                let (written, headers) =
                    persisted_state(disk.superblock.state(), identity, &state, op_head);
                let done = match disk
                    .superblock
                    .write_with_view_headers(&written, &headers)
                    .await
                {
                    Ok(()) => {
                        disk.last_persist_failed = false;
                        mark_superblock(&self.gauges, group);
                        Completion::VsrStatePersisted {
                            view: state.view,
                            log_view: state.log_view,
                        }
                    }
                    Err(e) => {
                        warn!(group, view = state.view, error = %e, "group superblock write failed");
                        disk.last_persist_failed = true;
                        Completion::VsrStatePersistFailed {
                            view: state.view,
                            log_view: state.log_view,
                        }
                    }
                };
                self.done(group, done);
            }
            PartitionStorageOp::Read { op, checksum } => {
                let held = disk
                    .frames
                    .get(&op)
                    .filter(|(_, f)| identity_of(f.bytes()) == checksum)
                    .map(|(_, f)| f.clone());
                let frame = match (held, disk.bodies.get(&op)) {
                    (Some(header), Some(at)) => whole_frame(&disk.log, &header, at).await,
                    (held, _) => held,
                };
                self.done(group, Completion::Read { op, frame });
            }
            PartitionStorageOp::Machine(StorageWork::Batch(bytes)) => {
                let flushed = match self.hold_batch(group, bytes) {
                    Ok(true) => self.flush_segments(&BTreeSet::from([group])).await,
                    Ok(false) => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = flushed {
                    self.fail(e);
                }
            }
            PartitionStorageOp::Machine(StorageWork::Offsets(table)) => {
                if let Err(e) = disk
                    .offset_store
                    .write(&table, disk.policy.enforce_fsync)
                    .await
                {
                    self.fail(format!("group {group:#x}: offsets: {e}"));
                }
            }
            PartitionStorageOp::Machine(StorageWork::Install {
                offsets,
                staged: Some(staged),
                ..
            }) => {
                if let Err(e) = self.install_staged(group, &staged, &offsets).await {
                    self.fail(format!("group {group:#x}: installing a transfer: {e}"));
                }
            }
            PartitionStorageOp::Machine(StorageWork::Install {
                batches, offsets, ..
            }) => {
                if let Err(e) = self.install(group, &batches, &offsets).await {
                    self.fail(format!("group {group:#x}: installing a transfer: {e}"));
                }
            }
            PartitionStorageOp::Checkpoint {
                op,
                prepare,
                offsets,
                frontier,
                lost_state,
            } => {
                if let Err(e) = self
                    .checkpoint(group, op, prepare, &offsets, frontier, lost_state)
                    .await
                {
                    self.fail(format!("group {group:#x}: checkpoint at op {op}: {e}"));
                    return;
                }
                add(&self.gauges.checkpoints, 1);
                self.done(group, Completion::Checkpointed { op });
            }
        }
    }

    /// Segments synced, offsets synced, then the superblock naming the checkpoint and the
    /// offset frontier; entries below the checkpoint op leave the WAL's hold.
    pub(super) async fn checkpoint(
        &mut self,
        group: u64,
        op: u64,
        prepare: (u128, u64),
        offsets: &OffsetTable,
        frontier: u64,
        lost_state: bool,
    ) -> Result<(), String> {
        let identity = self.identity;
        let disk = self.groups.get_mut(&group).ok_or("not hosted")?;
        disk.log.sync().await.map_err(|e| e.to_string())?;
        disk.offset_store
            .write(offsets, true)
            .await
            .map_err(|e| e.to_string())?;
        let base = disk
            .superblock
            .state()
            .copied()
            .unwrap_or_else(|| journal::recover::formatted_state(identity));
        let op_head = disk.frames.keys().next_back().copied().unwrap_or(op);
        let state = journal::VsrState {
            checkpoint_op: op,
            checkpoint_prepare_checksum: prepare.0,
            checkpoint_timestamp: prepare.1,
            offset_frontier: frontier.max(base.offset_frontier),
            op_head: op_head.max(base.op_head),
            commit_max: base.commit_max.max(op),
            ..base
        };
        disk.superblock
            .write(&state)
            .await
            .map_err(|e| e.to_string())?;
        mark_superblock(&self.gauges, group);
        disk.checkpoint_op = op;
        disk.frames = disk.frames.split_off(&op);
        disk.bodies = disk.bodies.split_off(&op);
        // Faulty ops up to the checkpoint are durable in it. A loss of unknown end (decision
        // 162: the group rejoined in lost state) is repaired once the replica left lost state,
        // i.e. holds the view's log durably again, and no bounded range remains above the
        // checkpoint: `repaired(.., u64::MAX - 1)` leaves it as `u64::MAX..`, which names no op.
        self.faults
            .repaired(group, op)
            .await
            .map_err(|e| e.to_string())?;
        let only_open = self
            .faults
            .faulty()
            .get(&group)
            .is_some_and(|ranges| ranges.iter().all(|r| r.last.is_none()));
        if only_open && !lost_state {
            self.faults
                .repaired(group, u64::MAX - 1)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    pub(super) async fn install(
        &mut self,
        group: u64,
        batches: &[Bytes],
        offsets: &OffsetTable,
    ) -> Result<(), String> {
        let storage = self.partitions.clone();
        let disk = self.groups.get_mut(&group).ok_or("not hosted")?;
        let mut artifacts = Vec::new();
        let mut kinds = Vec::new();
        if let Some(first) = batches.first().and_then(|b| journal::batch::peek(b)) {
            artifacts.push(batches.concat());
            kinds.push((ArtifactKind::SEGMENT_LOG, first.base_offset));
        }
        artifacts.push(offsets.encode());
        kinds.push((ArtifactKind::CONSUMER_OFFSETS, 0));
        let listed: Vec<(ArtifactKind, u64, &[u8])> = kinds
            .iter()
            .zip(&artifacts)
            .map(|((k, f), b)| (*k, *f, b.as_slice()))
            .collect();
        let manifest = build_manifest(&listed).map_err(|e| e.to_string())?;
        let (log, _, table) =
            install_partition(storage, &disk.prefix, disk.policy, &manifest, &artifacts)
                .await
                .map_err(|e| e.to_string())?;
        adopt_installed(disk, log, &table).await
    }

    /// Writes a transfer's staged SEGMENT_LOG into the group's segments by chunk (decision 284)
    /// and the offsets table, then maps the new segments for the read path.
    pub(super) async fn install_staged(
        &mut self,
        group: u64,
        staged: &crate::partition::machine::StagedLog,
        offsets: &OffsetTable,
    ) -> Result<(), String> {
        let storage = self.partitions.clone();
        let disk = self.groups.get_mut(&group).ok_or("not hosted")?;
        let (log, _) = journal::segment::install_from_file(
            storage,
            &disk.prefix,
            disk.policy,
            &staged.name,
            staged.frontier,
            staged.len,
            offsets.next_offset,
        )
        .await
        .map_err(|e| e.to_string())?;
        adopt_installed(disk, log, offsets).await
    }

    /// Reclaims the WAL up to what every group no longer needs: below the first record whose
    /// batch its group's segments have not synced (`ReclaimGuard`), and below every group's
    /// entries from its checkpoint op up (decision 164). The group holding the WAL back by
    /// more than `limits.warn_lsns` is counted (`reclaim_blocked`), the segments are forced
    /// synced, and that group's held entries are copied forward to the WAL's head (the same
    /// frames again: replay keeps the newest record of an op), which releases the old files.
    /// A group still holding more than `limits.busy_lsns` after that is refused `Busy` until
    /// it releases.
    pub(super) async fn reclaim(&mut self) {
        self.last_reclaim_at = self.wal.durable_lsn();
        let floor = self.wal.floor();
        let durable = self.wal.durable_lsn();
        let holder = self.holds(floor).first().copied();
        if let Some((lsn, group)) = holder
            && durable.saturating_sub(lsn) > self.limits.warn_lsns
        {
            add(&self.gauges.reclaim_blocked, 1);
            debug!(
                group,
                lsn, durable, "a lagging group holds the WAL's reclaim"
            );
            if let Err(e) = self.sync_segments().await {
                self.fail(e);
                return;
            }
            // Copying pays only when it frees much more than it writes (a busy group far
            // from its checkpoint would otherwise be copied again every pass).
            let held = self.groups.get(&group).map_or(0, |d| d.frames.len() as u64);
            let cheap = held.saturating_mul(COPY_FORWARD_RATIO) <= durable.saturating_sub(lsn);
            if self.limits.copy_forward
                && cheap
                && let Err(e) = self.copy_forward(group).await
            {
                self.fail(format!(
                    "group {group:#x}: copying held entries forward: {e}"
                ));
                return;
            }
        }
        let durable = self.wal.durable_lsn();
        let holds = self.holds(floor);
        let synced: BTreeMap<u64, u64> = self
            .groups
            .iter()
            .map(|(g, d)| (*g, d.log.synced_offset()))
            .collect();
        let guarded = self
            .guard
            .limit(|g| synced.get(&g).copied().unwrap_or(u64::MAX));
        let limit = holds
            .first()
            .map_or(durable + 1, |(lsn, _)| *lsn)
            .min(guarded);
        self.gauges.wal_lag.store(
            durable.saturating_sub(limit.saturating_sub(1)),
            Ordering::Relaxed,
        );
        let busy: BTreeSet<u64> = holds
            .iter()
            .filter(|(lsn, _)| durable.saturating_sub(*lsn) > self.limits.busy_lsns)
            .map(|(_, group)| *group)
            .collect();
        self.gauges
            .busy_groups
            .store(busy.len() as u64, Ordering::Relaxed);
        *self.busy.borrow_mut() = busy;
        if limit > floor {
            // The files go apart from this task (decision 400): removed here, one after the
            // other, they held every group's windows for about 50 ms each.
            match self.wal.release(limit).await {
                Ok(released) => {
                    add(&self.gauges.wal_files_reclaimed, released.len() as u64);
                    self.retire(released);
                }
                Err(e) => warn!(error = %e, "WAL reclaim failed"),
            }
        }
        self.gauges
            .wal_floor
            .store(self.wal.floor(), Ordering::Relaxed);
    }

    /// The lowest lsn each group still needs, lowest first (groups replayed but not booted
    /// keep their records at the floor).
    pub(super) fn holds(&self, floor: u64) -> Vec<(u64, u64)> {
        let mut holds: Vec<(u64, u64)> = self
            .groups
            .iter()
            .filter_map(|(g, d)| d.hold(floor).map(|lsn| (lsn, *g)))
            .collect();
        holds.extend(
            self.replay
                .groups
                .iter()
                .filter(|(_, ops)| !ops.is_empty())
                .map(|(g, _)| (floor, *g)),
        );
        holds.sort_unstable();
        holds
    }

    /// Syncs every group's segments that hold unsynced batches (a forced flush point, journal.md
    /// §4: WAL reclamation).
    pub(super) async fn sync_segments(&mut self) -> Result<(), String> {
        for (group, disk) in self.groups.iter_mut() {
            // A group whose seal runs apart is synced when it is done (decision 355); its
            // synced offset holds the WAL meanwhile.
            if disk.log.synced_offset() < disk.log.next_offset() && !disk.log.is_sealing() {
                disk.log
                    .sync()
                    .await
                    .map_err(|e| format!("group {group:#x}: segments: {e}"))?;
            }
        }
        Ok(())
    }

    /// Appends `group`'s held entries again at the WAL's head, in op order, in one window.
    pub(super) async fn copy_forward(&mut self, group: u64) -> Result<(), WalError> {
        let Some(disk) = self.groups.get(&group) else {
            return Ok(());
        };
        let frames: Vec<(u64, Frame, Option<BodyRef>)> = disk
            .frames
            .iter()
            .map(|(op, (_, f))| (*op, f.clone(), disk.bodies.get(op).copied()))
            .collect();
        let mut moved = Vec::with_capacity(frames.len());
        for (op, frame, body) in frames {
            let now = self.now_us();
            let mut lsn = self.submit(group, &frame, body.as_ref(), now);
            if matches!(lsn, Err(WalError::WindowFull { .. })) {
                self.commit_window().await?;
                lsn = self.submit(group, &frame, body.as_ref(), now);
            }
            moved.push((op, lsn?.0, frame));
        }
        self.commit_window().await?;
        add(&self.gauges.copied_forward, moved.len() as u64);
        let disk = self.groups.get_mut(&group).expect("checked above");
        for (op, lsn, frame) in moved {
            self.guard.note(lsn, group, frame.bytes());
            disk.frames.insert(op, (lsn, frame));
        }
        Ok(())
    }

    /// Boots one group's disk and hands the pump what the core recovers from.
    pub(super) async fn boot_group(&mut self, group: u64, policy: FlushPolicy) {
        if self.groups.contains_key(&group) {
            return;
        }
        let prefix = group_prefix(group);
        let marker = match self.check_incarnation(group, &prefix).await {
            Ok(Some(marker)) => marker,
            Ok(None) => return, // removed
            Err(e) => {
                error!(group, error = %e, "partition incarnation marker unusable; the group stays down");
                return;
            }
        };
        let (replayed, bodies) = self.replay.take(group);
        let mut boot = match journal::recover_partition(
            self.partitions.clone(),
            &prefix,
            self.identity,
            policy,
            replayed,
            &bodies,
        )
        .await
        {
            Ok(boot) => boot,
            Err(e) => {
                // The partition is tombstoned; the rest of the node runs (journal.md §4.1).
                error!(group, error = %e, "partition group cannot boot; it stays down");
                return;
            }
        };
        // Referenced bodies not found intact: their prepares may have been acknowledged, so
        // they are faulty (repaired from peers, never nacked), durably before the group
        // journals anything (decision 414).
        for op in std::mem::take(&mut boot.unresolved) {
            warn!(
                group = format!("{group:#x}"),
                op, "a referenced message batch is not intact in the segments; the op is faulty"
            );
            let ops = journal::boot::FaultyOps {
                first: op,
                last: Some(op),
            };
            if let Err(e) = self.faults.add(group, ops).await {
                error!(group, error = %e, "recording faulty ops failed; the group stays down");
                return;
            }
        }
        if boot.tail_cut > 0 {
            info!(
                group = format!("{group:#x}"),
                bytes = boot.tail_cut,
                "segment tail that no journaled prepare names was cut"
            );
        }
        // Each replayed prepare becomes one shared frame: the core's recovery and the group's
        // held entries (a referenced one by its header, decision 443) take it without a copy.
        let replayed: BTreeMap<u64, Frame> = std::mem::take(&mut boot.frames)
            .into_iter()
            .map(|(op, f)| (op, Frame::new(f)))
            .collect();
        let checkpoint_op = boot.state.map_or(0, |s| s.checkpoint_op);
        let frontier = boot.state.map_or(0, |s| s.offset_frontier);
        // One pass over the segments by chunk rebuilds the tail and the log's checksum; the
        // older batches stay on disk (decision 283). The machine is restored at the checkpoint
        // exactly: batches flushed after it come back through the replay (a store judged
        // against a later offset could differ).
        let files: Rc<dyn SegmentFiles> = Rc::new(StorageFiles(self.partitions.clone()));
        let map = SegmentMap {
            files: Some(files.clone()),
            dir: self.partitions.local_dir().map(ToOwned::to_owned),
            ..SegmentMap::default()
        };
        let map = Rc::new(RefCell::new(map));
        map.borrow_mut().refresh(&boot.log);
        let mapped = map.borrow().clone();
        let keep = self.read_cache_bytes.min(self.tail_share.get());
        let scanned = reader::scan(&mapped, &*files, frontier, keep).await;
        let scanned = match scanned {
            Ok(scan) => scan,
            Err(e) => {
                error!(group, error = %e, "partition segments unreadable; the group stays down");
                return;
            }
        };
        let mut offsets = boot.offsets.clone();
        offsets.next_offset = frontier;
        let machine = PartitionStateMachine::from_scan(
            GroupId(group),
            scanned,
            offsets,
            map.clone(),
            self.read_cache_bytes,
        )
        // The shard's budget bounds every tail beside its own (decision 424).
        .map(|m| m.with_tail_share(self.tail_share.clone()));
        let machine = match machine {
            // A received transfer stages in this directory (decision 220).
            Ok(m) => m.with_staging_dir(self.partitions.local_dir().map(ToOwned::to_owned)),
            Err(e) => {
                error!(group, error = %e, "partition segments inconsistent; the group stays down");
                return;
            }
        };
        let mut superblock = boot.state.and_then(|_| core_state(&boot.superblock));
        let faults = self
            .faults
            .faulty()
            .get(&group)
            .cloned()
            .unwrap_or_default();
        let mut lost_state = false;
        for range in &faults {
            match range.last {
                Some(last) => {
                    if let Some(sb) = superblock.as_mut() {
                        sb.held_ceiling = sb.held_ceiling.max(last);
                    }
                }
                // `u64::MAX..` is a repaired loss (see `checkpoint`).
                None if range.first == u64::MAX => {}
                None => lost_state = true,
            }
        }
        // Decision 240: in a rejoined directory a group without a superblock state may have
        // acknowledged prepares in the life before the wipe; it boots lost, and the core
        // persists the mark before it sends anything (its sends wait for the superblock).
        let rejoin = self.rejoin && !self.gauges.rejoin_cleared.load(Ordering::Acquire);
        let rejoin_lost = crate::boot::boots_lost_by_stamp(rejoin, superblock.as_ref());
        if superblock.is_some() {
            mark_superblock(&self.gauges, group);
        }
        lost_state |= rejoin_lost;
        let frames: Vec<Frame> = replayed
            .range(checkpoint_op..)
            .map(|(_, f)| f.clone())
            .collect();
        let recovered = Recovered {
            snapshot_op: checkpoint_op,
            snapshot_checksum: boot.state.map_or(0, |s| s.checkpoint_prepare_checksum),
            snapshot_timestamp: boot.state.map_or(0, |s| s.checkpoint_timestamp),
            frames,
            offset_frontier: frontier,
            lost_state,
            superblock,
            incarnation: incarnation(),
            ..Recovered::default()
        };
        info!(
            group = format!("{group:#x}"),
            checkpoint_op,
            replayed = recovered.frames.len(),
            next_offset = boot.next_offset,
            lost_state =
                recovered.lost_state || recovered.superblock.as_ref().is_some_and(|s| s.lost_state),
            rejoin_lost,
            "partition group recovered"
        );
        let mut log = boot.log;
        seals::apart(&mut log);
        let disk = GroupDisk {
            prefix,
            policy,
            superblock: boot.superblock,
            log,
            offset_store: boot.offset_store,
            bodies: bodies
                .range(checkpoint_op..)
                .filter(|(op, _)| replayed.contains_key(op))
                .map(|(op, b)| (*op, *b))
                .collect(),
            frames: replayed
                .range(checkpoint_op..)
                .map(|(op, f)| (*op, (0, held_frame(f.clone(), bodies.get(op)))))
                .collect(),
            checkpoint_op,
            committed_end: frontier,
            last_persist_failed: false,
            map,
        };
        self.groups.insert(group, disk);
        self.inbox.push(Event::Booted(Box::new(BootedGroup {
            group,
            recovered,
            machine,
            incarnation: marker,
        })));
    }

    /// Before a group boots: its directory's incarnation against the committed metadata
    /// (decision 342). A dead one is removed (`Ok(None)`); a live key without a marker gets
    /// one, durably, before the group journals anything. `Ok(Some(marker))` otherwise.
    pub(super) async fn check_incarnation(
        &mut self,
        group: u64,
        prefix: &str,
    ) -> Result<Option<Option<u64>>, String> {
        let (mut store, marker) =
            crate::partition::lifecycle::open_marker(self.partitions.clone(), prefix)
                .await
                .map_err(|e| e.to_string())?;
        let state = self.metadata.view().state.clone();
        match crate::partition::lifecycle::verdict(&state, group, marker) {
            crate::partition::lifecycle::Verdict::Dead => {
                drop(store);
                self.remove_group(group).await;
                Ok(None)
            }
            crate::partition::lifecycle::Verdict::Live(live) if marker.is_none() => {
                crate::partition::lifecycle::write_marker(&mut store, live)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Some(Some(live)))
            }
            _ => Ok(Some(marker)),
        }
    }

    /// Removes a group whose deletion committed (decision 342; the order and why a crash at
    /// any step is safe: `partition::lifecycle`): its state here (and so its hold on the WAL),
    /// a WAL truncate from op 0, then its files, the marker last.
    pub(super) async fn remove_group(&mut self, group: u64) {
        self.groups.remove(&group);
        self.queues.early.borrow_mut().remove(&group);
        self.late.remove(&group);
        self.replay.take(group);
        self.queues.groups.borrow_mut().remove(&group);
        let now = self.now_us();
        let truncated = match self.wal.submit_truncate(group, 0, now) {
            Ok(lsn) => match self.commit_window().await {
                Ok(_) => {
                    self.guard.note(lsn, group, &[]);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = truncated {
            self.fail(format!("group {group:#x}: removal: WAL truncate: {e}"));
            return;
        }
        match crate::partition::lifecycle::remove_files(&self.partitions, &group_prefix(group))
            .await
        {
            Ok(files) => {
                add(&self.gauges.groups_removed, 1);
                info!(
                    group = format!("{group:#x}"),
                    files, "partition group removed"
                );
            }
            Err(e) => {
                // The marker stays while anything else does: the next boot finishes.
                warn!(group, error = %e, "removing a deleted group's files failed");
            }
        }
        self.inbox.push(Event::Removed { group });
    }

    /// SIGTERM: the committed partition data reaches disk (segments and offsets synced), and
    /// the WAL's durable end is recorded.
    pub(super) async fn shutdown(&mut self) {
        if self.fatal.borrow().is_some() {
            return;
        }
        for (group, disk) in self.groups.iter_mut() {
            if let Err(e) = disk.log.sync().await {
                warn!(group, error = %e, "syncing segments at shutdown failed");
            }
        }
        if let Err(e) = self.wal.record_end().await {
            warn!(error = %e, "recording the WAL's durable end at shutdown failed");
        }
    }
}

/// Makes `log`, just installed by a state transfer, the group's segments, and writes the
/// transfer's offsets table (synced).
async fn adopt_installed<S: Storage + Clone + 'static>(
    disk: &mut GroupDisk<S>,
    log: PartitionLog<S>,
    table: &OffsetTable,
) -> Result<(), String> {
    disk.log = log;
    // What a transfer installs is committed. The segments it replaced held the bodies
    // references named: later copies forward copy the prepares whole.
    disk.committed_end = disk.committed_end.max(disk.log.next_offset());
    disk.bodies.clear();
    seals::apart(&mut disk.log);
    disk.map.borrow_mut().refresh(&disk.log);
    disk.offset_store
        .write(table, true)
        .await
        .map_err(|e| e.to_string())
}
