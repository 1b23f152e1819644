//! Where a batch's time goes (decision 350): monotonic stamps of one partition op's life on a
//! node, from the client request's read to its reply's write, summed per stage into process-wide
//! counters shown on `/metrics` (`strand_batch_stage_us_total{stage}` and
//! `strand_batch_stage_count{stage}`: the mean of each stage) and, at `debug` level of the
//! `strand::timeline` target, one event per op with every stage of it.
//!
//! Stages of a primary's op (each from the end of the previous one):
//! `queued` (request in the pump's inbox), `prepared` (the core's step that builds the prepare),
//! `windowed` (waiting for the storage task to take the append into a WAL window), `written`
//! (the window's write), `synced` (its `fdatasync`), `fed` (`Appended` waiting in the inbox),
//! `committed` (from `Appended` to the reply effect: with backups, the wait for a quorum's
//! PrepareOk), `delivered` (the reply handed to the connection).
//! A backup's op: `received` (the Prepare in the inbox), then `prepared` .. `fed` as above, the
//! PrepareOk leaving in the step that feeds `Appended`.
//! The client connection adds `read` (the frame's body after its header), `routed` (decode and
//! routing up to the submit), `waited` (submit to reply), `wrote` (the reply's write).
//!
//! Cheap by construction: a few `Instant::now()` per op and one small map per shard, bounded
//! (an op never answered, a view change, is dropped when the map is full).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One stage of an op's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Request in the pump's inbox.
    Queued,
    /// Prepare received by a backup, in the pump's inbox.
    Received,
    /// The core's step up to the `Append` effect.
    Prepared,
    /// `Append` queued until the storage task put it in a WAL window.
    Windowed,
    /// The window's write.
    Written,
    /// The window's `fdatasync`.
    Synced,
    /// `Appended` in the pump's inbox.
    Fed,
    /// `Appended` fed until the reply effect (the quorum's PrepareOk on 3 replicas).
    Committed,
    /// Reply effect until handed to the connection's registry.
    Delivered,
    /// Client connection: the frame's body read after its header.
    Read,
    /// Client connection: decode and route until the submit.
    Routed,
    /// Client connection: submit until the reply.
    Waited,
    /// Client connection: the reply's write.
    Wrote,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 13] = [
        Stage::Queued,
        Stage::Received,
        Stage::Prepared,
        Stage::Windowed,
        Stage::Written,
        Stage::Synced,
        Stage::Fed,
        Stage::Committed,
        Stage::Delivered,
        Stage::Read,
        Stage::Routed,
        Stage::Waited,
        Stage::Wrote,
    ];

    /// The `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Queued => "queued",
            Stage::Received => "received",
            Stage::Prepared => "prepared",
            Stage::Windowed => "windowed",
            Stage::Written => "written",
            Stage::Synced => "synced",
            Stage::Fed => "fed",
            Stage::Committed => "committed",
            Stage::Delivered => "delivered",
            Stage::Read => "read",
            Stage::Routed => "routed",
            Stage::Waited => "waited",
            Stage::Wrote => "wrote",
        }
    }
}

struct Sum {
    us: AtomicU64,
    count: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: Sum = Sum {
    us: AtomicU64::new(0),
    count: AtomicU64::new(0),
};

static SUMS: [Sum; Stage::ALL.len()] = [ZERO; Stage::ALL.len()];

/// Adds one op's `us` in `stage` to the process-wide sums.
pub fn record(stage: Stage, us: u64) {
    let sum = &SUMS[stage as usize];
    sum.us.fetch_add(us, Ordering::Relaxed);
    sum.count.fetch_add(1, Ordering::Relaxed);
}

/// The sums of `stage`: total microseconds and ops.
pub fn sums(stage: Stage) -> (u64, u64) {
    let sum = &SUMS[stage as usize];
    (
        sum.us.load(Ordering::Relaxed),
        sum.count.load(Ordering::Relaxed),
    )
}

/// Appends the stage sums to a Prometheus text exposition.
pub fn render_metrics(out: &mut String) {
    out.push_str(
        "# HELP strand_batch_stage_us_total time partition ops spent in each stage of their life \
         on this node (decision 350)\n# TYPE strand_batch_stage_us_total counter\n",
    );
    for stage in Stage::ALL {
        let _ = writeln!(
            out,
            "strand_batch_stage_us_total{{stage=\"{}\"}} {}",
            stage.name(),
            sums(stage).0
        );
    }
    out.push_str(
        "# HELP strand_batch_stage_count ops that went through each stage\n\
         # TYPE strand_batch_stage_count counter\n",
    );
    for stage in Stage::ALL {
        let _ = writeln!(
            out,
            "strand_batch_stage_count{{stage=\"{}\"}} {}",
            stage.name(),
            sums(stage).1
        );
    }
    out.push_str(
        "# HELP strand_poll_stage_us_total time polls spent in each stage of their life on this \
         node (decision 420)\n# TYPE strand_poll_stage_us_total counter\n",
    );
    for stage in PollStage::ALL {
        let _ = writeln!(
            out,
            "strand_poll_stage_us_total{{stage=\"{}\"}} {}",
            stage.name(),
            poll_sums(stage).0
        );
    }
    out.push_str(
        "# HELP strand_poll_stage_count polls that went through each stage (segment reads for \
         opened)\n# TYPE strand_poll_stage_count counter\n",
    );
    for stage in PollStage::ALL {
        let _ = writeln!(
            out,
            "strand_poll_stage_count{{stage=\"{}\"}} {}",
            stage.name(),
            poll_sums(stage).1
        );
    }
}

/// One stage of a poll's life on the node that answers it (decision 420), each from the end of
/// the previous one: `idle` (the connection's previous reply written until this request's header
/// is read: the client's turn and the loopback), `read` (the body after the header), `routed`
/// (decode, session and route up to the read), `machine` (the partition state machine's poll:
/// the tail's batches, or the plan of a segment read), `disk` (the segment reads awaited, the
/// file's open included), `verified` (verifying the segment batches and building the poll),
/// `built` (the reply's header and parts), `forwarded` (a poll answered on another shard: the
/// mesh round trip, whose own stages that shard records), `other` (the rest of the read call:
/// waiting to be scheduled between them), `committed` (an auto-commit's store), `wrote` (the
/// reply's vectored write to the socket). `opened` is part of `disk`: the open of the segment
/// file alone, one per read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollStage {
    /// The previous reply written until this request's header is read.
    Idle,
    /// The body read after the header.
    Read,
    /// Decode and route until the read starts.
    Routed,
    /// The state machine's poll.
    Machine,
    /// The segment reads (open included).
    Disk,
    /// Verifying the read batches and building the poll.
    Verified,
    /// The reply's frame built.
    Built,
    /// A poll answered on another shard: the mesh round trip.
    Forwarded,
    /// The read call's time not in the stages above.
    Other,
    /// The auto-commit's store.
    Committed,
    /// The reply's write.
    Wrote,
    /// The open of a segment file (part of `disk`, one per read).
    Opened,
}

impl PollStage {
    /// Every stage, in order.
    pub const ALL: [PollStage; 12] = [
        PollStage::Idle,
        PollStage::Read,
        PollStage::Routed,
        PollStage::Machine,
        PollStage::Disk,
        PollStage::Verified,
        PollStage::Built,
        PollStage::Forwarded,
        PollStage::Other,
        PollStage::Committed,
        PollStage::Wrote,
        PollStage::Opened,
    ];

    /// The `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            PollStage::Idle => "idle",
            PollStage::Read => "read",
            PollStage::Routed => "routed",
            PollStage::Machine => "machine",
            PollStage::Disk => "disk",
            PollStage::Verified => "verified",
            PollStage::Built => "built",
            PollStage::Forwarded => "forwarded",
            PollStage::Other => "other",
            PollStage::Committed => "committed",
            PollStage::Wrote => "wrote",
            PollStage::Opened => "opened",
        }
    }
}

static POLL_SUMS: [Sum; PollStage::ALL.len()] = [ZERO; PollStage::ALL.len()];

/// Adds one poll's `us` in `stage` to the process-wide sums.
pub fn record_poll(stage: PollStage, us: u64) {
    let sum = &POLL_SUMS[stage as usize];
    sum.us.fetch_add(us, Ordering::Relaxed);
    sum.count.fetch_add(1, Ordering::Relaxed);
}

/// The sums of a poll `stage`: total microseconds and polls (reads for `opened`).
pub fn poll_sums(stage: PollStage) -> (u64, u64) {
    let sum = &POLL_SUMS[stage as usize];
    (
        sum.us.load(Ordering::Relaxed),
        sum.count.load(Ordering::Relaxed),
    )
}

/// What the read call of one poll measured where it ran (the group's shard).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadTimes {
    /// The state machine's poll.
    pub machine: Duration,
    /// The segment reads awaited (0 for a poll from the tail).
    pub disk: Duration,
    /// Verifying and building after the reads.
    pub verified: Duration,
    /// The reply's frame.
    pub built: Duration,
    /// Segment reads issued.
    pub reads: u32,
    /// Segment reads answered from the partition's kept read (decision 421).
    pub kept: u32,
    /// Segment reads answered by a read ahead (decision 421).
    pub ahead: u32,
}

impl ReadTimes {
    /// Records the stages (a poll answered for another shard records them where it ran).
    pub fn record(&self) {
        record_poll(PollStage::Machine, duration_us(self.machine));
        record_poll(PollStage::Disk, duration_us(self.disk));
        record_poll(PollStage::Verified, duration_us(self.verified));
        record_poll(PollStage::Built, duration_us(self.built));
    }

    fn sum(&self) -> Duration {
        self.machine + self.disk + self.verified + self.built
    }
}

/// The stamps of one poll on its connection's shard.
#[derive(Debug, Clone, Copy)]
pub struct PollCall {
    /// The read call started (after routing).
    pub started: Instant,
    /// The read call returned.
    pub answered: Instant,
    /// The auto-commit's store returned (`answered` without one).
    pub committed: Instant,
    /// Where the read ran here: its stages (`None`: forwarded to another shard).
    pub times: Option<ReadTimes>,
}

/// A poll's reply was written at `written`: every stage of it is recorded, with `idle` from the
/// connection's previous reply (`previous`), and one `debug` event of target `strand::timeline`.
pub fn poll_done(
    stamps: RequestStamps,
    call: PollCall,
    written: Instant,
    previous: Option<Instant>,
) {
    let idle = previous.map(|p| micros(p, stamps.header));
    if let Some(idle) = idle {
        record_poll(PollStage::Idle, idle);
    }
    let read = micros(stamps.header, stamps.read);
    let routed = micros(stamps.read, call.started);
    let call_us = micros(call.started, call.answered);
    let (times, forwarded, other) = match call.times {
        Some(t) => {
            t.record();
            let other = call_us.saturating_sub(duration_us(t.sum()));
            (t, 0, other)
        }
        None => {
            record_poll(PollStage::Forwarded, call_us);
            (ReadTimes::default(), call_us, 0)
        }
    };
    let committed = micros(call.answered, call.committed);
    let wrote = micros(call.committed, written);
    record_poll(PollStage::Read, read);
    record_poll(PollStage::Routed, routed);
    record_poll(PollStage::Other, other);
    record_poll(PollStage::Committed, committed);
    record_poll(PollStage::Wrote, wrote);
    tracing::debug!(
        target: "strand::timeline",
        total_us = micros(stamps.header, written),
        idle_us = idle.unwrap_or(0),
        read_us = read,
        routed_us = routed,
        machine_us = duration_us(times.machine),
        disk_us = duration_us(times.disk),
        reads = times.reads,
        kept = times.kept,
        ahead = times.ahead,
        verified_us = duration_us(times.verified),
        built_us = duration_us(times.built),
        forwarded_us = forwarded,
        other_us = other,
        committed_us = committed,
        wrote_us = wrote,
        "poll timeline"
    );
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn micros(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX)
}

/// Ops followed at once per shard; beyond it new ops are not followed.
const OPEN_MAX: usize = 4096;

/// An op followed this long is stale (a primary that lost its view never emits the reply that
/// closes it); a full map drops stale ops before it refuses a new one, so leftovers never stop
/// the timeline.
const STALE: Duration = Duration::from_secs(10);

/// The stamps of one op.
#[derive(Debug, Clone, Copy)]
struct Stamps {
    /// Pushed into the inbox (request or prepare).
    arrived: Instant,
    /// Popped by the pump.
    popped: Instant,
    /// A backup's op (arrived as a Prepare).
    backup: bool,
    prepared: Option<Instant>,
    windowed: Option<Instant>,
    written: Option<Instant>,
    synced: Option<Instant>,
    fed: Option<Instant>,
    committed: Option<Instant>,
}

/// One shard's open ops, shared by its partition pump and storage task.
#[derive(Debug)]
pub struct Timeline {
    open: RefCell<HashMap<(u64, u64), Stamps>>,
    /// Ops whose reply was emitted in the current step, closed when it is delivered.
    replied: RefCell<Vec<(u64, u64)>>,
    /// The event the pump is stepping: (arrived, popped, backup).
    stepping: Cell<Option<(Instant, Instant, bool)>>,
    /// See [`STALE`].
    stale: Duration,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            open: RefCell::default(),
            replied: RefCell::default(),
            stepping: Cell::default(),
            stale: STALE,
        }
    }
}

impl Timeline {
    /// The pump pops an event that arrived at `arrived`; `backup` for a Prepare frame.
    pub fn stepping(&self, arrived: Instant, backup: bool) {
        self.stepping.set(Some((arrived, Instant::now(), backup)));
    }

    /// The pump's step is over.
    pub fn stepped(&self) {
        self.stepping.set(None);
    }

    /// The step being run emitted `Append` of `op`: the op is followed from the event that
    /// caused it.
    pub fn appending(&self, group: u64, op: u64) {
        let Some((arrived, popped, backup)) = self.stepping.get() else {
            return;
        };
        let mut open = self.open.borrow_mut();
        if open.len() >= OPEN_MAX {
            let stale = self.stale;
            open.retain(|_, s| s.arrived.elapsed() < stale);
        }
        if open.len() >= OPEN_MAX {
            return;
        }
        open.insert(
            (group, op),
            Stamps {
                arrived,
                popped,
                backup,
                prepared: Some(Instant::now()),
                windowed: None,
                written: None,
                synced: None,
                fed: None,
                committed: None,
            },
        );
    }

    fn stamp(&self, group: u64, op: u64, f: impl FnOnce(&mut Stamps)) {
        if let Some(s) = self.open.borrow_mut().get_mut(&(group, op)) {
            f(s);
        }
    }

    /// The storage task put the op in a WAL window.
    pub fn windowed(&self, group: u64, op: u64, at: Instant) {
        self.stamp(group, op, |s| s.windowed = Some(at));
    }

    /// The op's window was written at `written` and synced at `synced`.
    pub fn synced(&self, group: u64, op: u64, written: Instant, synced: Instant) {
        self.stamp(group, op, |s| {
            s.written = Some(written);
            s.synced = Some(synced);
        });
    }

    /// The pump feeds the op's `Appended`. A backup's op ends here (its PrepareOk leaves in
    /// this step).
    pub fn fed(&self, group: u64, op: u64) {
        let now = Instant::now();
        let backup = {
            let mut open = self.open.borrow_mut();
            let Some(s) = open.get_mut(&(group, op)) else {
                return;
            };
            s.fed = Some(now);
            s.backup
        };
        if backup {
            self.close(group, op, now);
        }
    }

    /// The primary emitted the reply of `op`.
    pub fn committed(&self, group: u64, op: u64) {
        let mut followed = false;
        self.stamp(group, op, |s| {
            s.committed = Some(Instant::now());
            followed = true;
        });
        if followed {
            self.replied.borrow_mut().push((group, op));
        }
    }

    /// The replies of the step were handed over: the ops they answered end now.
    pub fn delivered(&self) {
        let now = Instant::now();
        let replied = std::mem::take(&mut *self.replied.borrow_mut());
        for (group, op) in replied {
            self.close(group, op, now);
        }
    }

    /// Forgets every op of `group` at or above `from_op` (a truncation) or all of it.
    pub fn forget(&self, group: u64, from_op: u64) {
        self.open
            .borrow_mut()
            .retain(|(g, op), _| *g != group || *op < from_op);
    }

    fn close(&self, group: u64, op: u64, end: Instant) {
        let Some(s) = self.open.borrow_mut().remove(&(group, op)) else {
            return;
        };
        let first = if s.backup {
            Stage::Received
        } else {
            Stage::Queued
        };
        let steps = [
            (first, Some(s.arrived), Some(s.popped)),
            (Stage::Prepared, Some(s.popped), s.prepared),
            (Stage::Windowed, s.prepared, s.windowed),
            (Stage::Written, s.windowed, s.written),
            (Stage::Synced, s.written, s.synced),
            (Stage::Fed, s.synced, s.fed),
            (Stage::Committed, s.fed, s.committed),
            (
                Stage::Delivered,
                s.committed,
                s.committed.map(|_| end).filter(|_| !s.backup),
            ),
        ];
        let mut us = [0u64; 8];
        for (i, (stage, from, to)) in steps.into_iter().enumerate() {
            if let (Some(from), Some(to)) = (from, to) {
                us[i] = micros(from, to);
                record(stage, us[i]);
            }
        }
        tracing::debug!(
            target: "strand::timeline",
            group = format!("{group:#x}"),
            op,
            backup = s.backup,
            total_us = micros(s.arrived, end),
            queued_us = us[0],
            prepared_us = us[1],
            windowed_us = us[2],
            written_us = us[3],
            synced_us = us[4],
            fed_us = us[5],
            committed_us = us[6],
            delivered_us = us[7],
            "op timeline"
        );
    }

    /// Ops followed now.
    pub fn open_ops(&self) -> usize {
        self.open.borrow().len()
    }
}

/// A client connection's stamps of one request.
#[derive(Debug, Clone, Copy)]
pub struct RequestStamps {
    /// Header read.
    pub header: Instant,
    /// Whole frame read.
    pub read: Instant,
}

/// A client connection's request ends: `submitted` and `replied` are the partition call's
/// (`None` for requests that are not partition writes, which are not recorded).
pub fn request_done(
    stamps: RequestStamps,
    submitted: Option<Instant>,
    replied: Option<Instant>,
    written: Instant,
) {
    let (Some(submitted), Some(replied)) = (submitted, replied) else {
        return;
    };
    let read = micros(stamps.header, stamps.read);
    let routed = micros(stamps.read, submitted);
    let waited = micros(submitted, replied);
    let wrote = micros(replied, written);
    record(Stage::Read, read);
    record(Stage::Routed, routed);
    record(Stage::Waited, waited);
    record(Stage::Wrote, wrote);
    tracing::debug!(
        target: "strand::timeline",
        read_us = read,
        routed_us = routed,
        waited_us = waited,
        wrote_us = wrote,
        "request timeline"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A primary's op goes through every stage in order and is closed at delivery; a backup's
    /// at `fed`; the sums count each stage once per op.
    #[test]
    fn ops_are_followed_from_arrival_to_delivery() {
        let t = Timeline::default();
        let before = sums(Stage::Committed).1;
        let before_received = sums(Stage::Received).1;
        t.stepping(Instant::now(), false);
        t.appending(7, 1);
        t.stepped();
        // Not stepping: an Append of a replay or a repair is not followed.
        t.appending(7, 2);
        assert_eq!(t.open_ops(), 1);
        let now = Instant::now();
        t.windowed(7, 1, now);
        t.synced(7, 1, now, now);
        t.fed(7, 1);
        assert_eq!(t.open_ops(), 1, "a primary's op waits for its reply");
        t.delivered();
        assert_eq!(t.open_ops(), 1, "not committed yet");
        t.committed(7, 1);
        t.delivered();
        assert_eq!(t.open_ops(), 0);
        assert!(sums(Stage::Committed).1 > before);

        t.stepping(Instant::now(), true);
        t.appending(7, 3);
        t.stepped();
        t.fed(7, 3);
        assert_eq!(t.open_ops(), 0, "a backup's op ends at its PrepareOk");
        assert!(sums(Stage::Received).1 > before_received);

        t.stepping(Instant::now(), false);
        t.appending(7, 4);
        t.appending(8, 4);
        t.forget(7, 4);
        assert_eq!(t.open_ops(), 1, "a truncation forgets its ops");
        t.forget(8, 0);
        assert_eq!(t.open_ops(), 0, "a dropped group forgets all of its ops");
    }

    /// A poll's stages are recorded once each (decision 420): a poll read on this shard adds
    /// its machine, disk, verify and build times and what the read call spent beside them; a
    /// forwarded one its mesh round trip; `idle` only after a previous reply.
    #[test]
    fn a_poll_records_each_of_its_stages() {
        let count = |stage| poll_sums(stage).1;
        let before: Vec<u64> = PollStage::ALL.iter().map(|&s| count(s)).collect();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let stamps = RequestStamps {
            header: ms(1),
            read: ms(2),
        };
        let times = ReadTimes {
            machine: Duration::from_millis(1),
            disk: Duration::from_millis(3),
            verified: Duration::from_millis(1),
            built: Duration::ZERO,
            reads: 1,
            kept: 0,
            ahead: 0,
        };
        let call = PollCall {
            started: ms(3),
            answered: ms(10),
            committed: ms(10),
            times: Some(times),
        };
        let (disk_us, other_us) = (poll_sums(PollStage::Disk).0, poll_sums(PollStage::Other).0);
        poll_done(stamps, call, ms(12), None);
        assert!(poll_sums(PollStage::Disk).0 >= disk_us + 3_000);
        assert!(
            poll_sums(PollStage::Other).0 >= other_us + 2_000,
            "the read call's 7 ms less its 5 ms of stages"
        );
        poll_done(
            stamps,
            PollCall {
                times: None,
                ..call
            },
            ms(12),
            Some(t0),
        );
        let after: Vec<u64> = PollStage::ALL.iter().map(|&s| count(s)).collect();
        for (i, stage) in PollStage::ALL.iter().enumerate() {
            // Other tests run polls of their own on other threads: at least, not exactly.
            let want = match stage {
                PollStage::Idle | PollStage::Forwarded => 1,
                PollStage::Machine | PollStage::Disk | PollStage::Verified | PollStage::Built => 1,
                PollStage::Opened => 0,
                _ => 2,
            };
            assert!(
                after[i] >= before[i] + want,
                "{}: {} -> {}",
                stage.name(),
                before[i],
                after[i]
            );
        }
    }

    /// Ops that never close (a primary that lost its view emits no reply for them) do not
    /// fill the map for good: a full map drops the stale ones and follows the new op.
    #[test]
    fn a_full_map_of_stale_ops_still_follows_new_ones() {
        let t = Timeline {
            stale: Duration::ZERO,
            ..Timeline::default()
        };
        t.stepping(Instant::now(), false);
        for op in 0..OPEN_MAX as u64 {
            t.appending(1, op);
        }
        assert_eq!(t.open_ops(), OPEN_MAX);
        t.appending(2, 1);
        assert_eq!(
            t.open_ops(),
            1,
            "the stale ops went, the new one is followed"
        );
        t.committed(2, 1);
        t.delivered();
        assert_eq!(t.open_ops(), 0);
    }
}
