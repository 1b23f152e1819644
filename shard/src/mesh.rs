//! The shard mesh: bounded lock-free channels between shards, a main lane and a reply lane
//! (architecture.md §6, §12).
//!
//! Every ordered pair of shards has one glommio `shared_channel` (a single-producer,
//! single-consumer ring) per lane, so a shard's inbox on a lane is the set of rings pointing
//! at it, each bounded by the lane's capacity; a shard's messages to itself go through a
//! bounded local queue with the same capacity. Sends are `try_send` only (a reactor never
//! blocks on a peer shard); every message that is not delivered is counted by lane and
//! [`DropReason`] in [`MeshCounters`], which any thread can read (metrics).
//!
//! Build with [`build`] before the shard threads start, move each [`MeshPort`] into its
//! shard, and [`MeshPort::connect`] it there: connecting waits until every peer shard has
//! connected its ends too.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};

use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use glommio::{GlommioError, ResourceType};

/// A shard's index on this node.
pub type ShardId = u16;

/// The two lanes of architecture.md §6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Consensus frames, lifecycle messages, metadata submits (`system.sharding.inbox_capacity`).
    Main = 0,
    /// Client reply forwards only (`system.sharding.reply_inbox_capacity`).
    Reply = 1,
}

impl Lane {
    /// Both lanes, in index order.
    pub const ALL: [Lane; 2] = [Lane::Main, Lane::Reply];

    /// Name for logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Main => "main",
            Lane::Reply => "reply",
        }
    }
}

/// Why a message did not reach its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The target's inbox ring from this shard (or the loopback queue) is full.
    InboxFull = 0,
    /// The target shard stopped (its receiving end is gone).
    Closed = 1,
    /// The target id is not a shard of this node.
    NoSuchShard = 2,
    /// Counted by the receiver: the envelope names another shard as its target.
    Misdelivered = 3,
}

impl DropReason {
    /// Every reason, in index order.
    pub const ALL: [DropReason; 4] = [
        DropReason::InboxFull,
        DropReason::Closed,
        DropReason::NoSuchShard,
        DropReason::Misdelivered,
    ];

    /// Name for logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::InboxFull => "inbox_full",
            DropReason::Closed => "closed",
            DropReason::NoSuchShard => "no_such_shard",
            DropReason::Misdelivered => "misdelivered",
        }
    }
}

/// A message between shards; the receiver checks `to` against itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<T> {
    /// Sending shard.
    pub from: ShardId,
    /// Target shard.
    pub to: ShardId,
    /// The payload.
    pub body: T,
}

/// A refused send: the body comes back so the caller can answer (e.g. a transient error to a
/// client) instead of losing track of it. The drop is already counted.
#[derive(Debug, PartialEq, Eq)]
pub struct SendError<T> {
    /// Why.
    pub reason: DropReason,
    /// The undelivered payload.
    pub body: T,
}

const REASONS: usize = DropReason::ALL.len();
const LANES: usize = Lane::ALL.len();

/// Per-shard, per-lane message counters, shared by every shard and readable from any thread.
/// Each shard writes only its own row, so the counters never contend.
#[derive(Debug)]
pub struct MeshCounters {
    shards: usize,
    sent: Box<[AtomicU64]>,
    received: Box<[AtomicU64]>,
    dropped: Box<[AtomicU64]>,
}

impl MeshCounters {
    fn new(shards: usize) -> MeshCounters {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        MeshCounters {
            shards,
            sent: zeros(shards * LANES),
            received: zeros(shards * LANES),
            dropped: zeros(shards * LANES * REASONS),
        }
    }

    fn index(&self, shard: ShardId, lane: Lane) -> usize {
        assert!(usize::from(shard) < self.shards);
        usize::from(shard) * LANES + lane as usize
    }

    /// Messages `shard` handed to the mesh on `lane` (delivered into a ring).
    pub fn sent(&self, shard: ShardId, lane: Lane) -> u64 {
        self.sent[self.index(shard, lane)].load(Ordering::Relaxed)
    }

    /// Messages `shard` took out of its inbox on `lane` and kept.
    pub fn received(&self, shard: ShardId, lane: Lane) -> u64 {
        self.received[self.index(shard, lane)].load(Ordering::Relaxed)
    }

    /// Messages dropped on `shard` (as sender, or as receiver for `Misdelivered`).
    pub fn dropped(&self, shard: ShardId, lane: Lane, reason: DropReason) -> u64 {
        self.dropped[self.index(shard, lane) * REASONS + reason as usize].load(Ordering::Relaxed)
    }

    /// Every drop on the node, all shards, lanes and reasons.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Shards covered.
    pub fn shards(&self) -> usize {
        self.shards
    }

    fn count_sent(&self, shard: ShardId, lane: Lane) {
        self.sent[self.index(shard, lane)].fetch_add(1, Ordering::Relaxed);
    }

    fn count_received(&self, shard: ShardId, lane: Lane) {
        self.received[self.index(shard, lane)].fetch_add(1, Ordering::Relaxed);
    }

    fn count_drop(&self, shard: ShardId, lane: Lane, reason: DropReason) {
        self.dropped[self.index(shard, lane) * REASONS + reason as usize]
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Ring capacities per lane, per ordered pair of shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshCapacity {
    /// `system.sharding.inbox_capacity`.
    pub main: usize,
    /// `system.sharding.reply_inbox_capacity`.
    pub reply: usize,
}

impl MeshCapacity {
    fn of(self, lane: Lane) -> usize {
        match lane {
            Lane::Main => self.main,
            Lane::Reply => self.reply,
        }
    }
}

/// One shard's unconnected ends of the mesh; `Send`, so it moves into the shard's thread.
pub struct MeshPort<T: Send + 'static> {
    id: ShardId,
    capacity: MeshCapacity,
    /// `[lane][target]`, `None` at `target == id`.
    senders: [Vec<Option<SharedSender<Envelope<T>>>>; LANES],
    /// `[lane][source]`, `None` at `source == id`.
    receivers: [Vec<Option<SharedReceiver<Envelope<T>>>>; LANES],
    counters: Arc<MeshCounters>,
}

impl<T: Send + 'static> std::fmt::Debug for MeshPort<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshPort")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Builds the mesh of `shards` shards: one port per shard, and the shared counters.
pub fn build<T: Send + 'static>(
    shards: usize,
    capacity: MeshCapacity,
) -> (Vec<MeshPort<T>>, Arc<MeshCounters>) {
    assert!((1..=usize::from(u16::MAX)).contains(&shards));
    assert!(
        capacity.main > 0 && capacity.reply > 0,
        "lanes are bounded, not empty"
    );
    let counters = Arc::new(MeshCounters::new(shards));
    let mut ports: Vec<MeshPort<T>> = (0..shards)
        .map(|id| MeshPort {
            id: id as ShardId,
            capacity,
            senders: Lane::ALL.map(|_| (0..shards).map(|_| None).collect()),
            receivers: Lane::ALL.map(|_| (0..shards).map(|_| None).collect()),
            counters: Arc::clone(&counters),
        })
        .collect();
    for lane in Lane::ALL {
        for from in 0..shards {
            for to in (0..shards).filter(|&to| to != from) {
                let (tx, rx) = shared_channel::new_bounded(capacity.of(lane));
                ports[from].senders[lane as usize][to] = Some(tx);
                ports[to].receivers[lane as usize][from] = Some(rx);
            }
        }
    }
    (ports, counters)
}

impl<T: Send + 'static> MeshPort<T> {
    /// This port's shard.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// Connects every end on the calling executor. Resolves once every peer shard has connected
    /// its ends as well, so all shards must connect concurrently.
    pub async fn connect(self) -> Mesh<T> {
        let shards = self.counters.shards();
        let mut senders: [Vec<Option<ConnectedSender<Envelope<T>>>>; LANES] =
            Lane::ALL.map(|_| (0..shards).map(|_| None).collect());
        let mut receivers: [Vec<Option<ConnectedReceiver<Envelope<T>>>>; LANES] =
            Lane::ALL.map(|_| (0..shards).map(|_| None).collect());
        // Each connect waits for its peer; spawn them all so no shard waits on an end another
        // shard has not reached yet.
        let mut connecting = Vec::new();
        for (lane, row) in self.senders.into_iter().enumerate() {
            for (peer, end) in row.into_iter().enumerate() {
                if let Some(end) = end {
                    connecting.push(glommio::spawn_local(async move {
                        (lane, peer, End::Tx(end.connect().await))
                    }));
                }
            }
        }
        for (lane, row) in self.receivers.into_iter().enumerate() {
            for (peer, end) in row.into_iter().enumerate() {
                if let Some(end) = end {
                    connecting.push(glommio::spawn_local(async move {
                        (lane, peer, End::Rx(end.connect().await))
                    }));
                }
            }
        }
        for task in connecting {
            match task.await {
                (lane, peer, End::Tx(sender)) => senders[lane][peer] = Some(sender),
                (lane, peer, End::Rx(receiver)) => receivers[lane][peer] = Some(receiver),
            }
        }
        Mesh {
            id: self.id,
            capacity: self.capacity,
            senders,
            receivers,
            loopback: Lane::ALL.map(|_| RefCell::new(VecDeque::new())),
            loopback_waker: Lane::ALL.map(|_| Cell::new(None)),
            next: Lane::ALL.map(|_| Cell::new(0)),
            ring_wakers: Lane::ALL.map(|_| (0..shards).map(|_| Arc::default()).collect()),
            counters: self.counters,
        }
    }
}

enum End<T: Send + 'static> {
    Tx(ConnectedSender<Envelope<T>>),
    Rx(ConnectedReceiver<Envelope<T>>),
}

/// One shard's connected mesh. Lives on its executor (not `Send`). One task per lane receives
/// (the shard's pump); any task may send.
pub struct Mesh<T: Send + 'static> {
    id: ShardId,
    capacity: MeshCapacity,
    senders: [Vec<Option<ConnectedSender<Envelope<T>>>>; LANES],
    receivers: [Vec<Option<ConnectedReceiver<Envelope<T>>>>; LANES],
    loopback: [RefCell<VecDeque<Envelope<T>>>; LANES],
    loopback_waker: [Cell<Option<Waker>>; LANES],
    /// Where the next receive starts looking, so no source starves another.
    next: [Cell<usize>; LANES],
    /// One waker per remote ring, registered with glommio at most once per wait (see
    /// [`RingWaker`]).
    ring_wakers: [Vec<Arc<RingWaker>>; LANES],
    counters: Arc<MeshCounters>,
}

/// The waker a pending receive on one remote ring registers with glommio.
///
/// glommio keeps every waker a pending `recv` registers until a message arrives on that ring
/// (and then wakes only as many as there are messages), and a task's waker count is an `i16`.
/// A receiver polled on every tick while its rings stay empty would pile up one waker per poll
/// and abort the executor after 32768 of them (two minutes of an idle two-shard node). So a
/// ring is polled through glommio only while it is not armed, or after this waker fired; in
/// between, a poll just records the task to wake.
#[derive(Default)]
struct RingWaker {
    /// A registration is outstanding in glommio.
    armed: std::sync::atomic::AtomicBool,
    /// glommio woke the registration: the ring may hold a message (or closed).
    fired: std::sync::atomic::AtomicBool,
    /// The task waiting on the ring now.
    task: std::sync::Mutex<Option<Waker>>,
}

impl RingWaker {
    fn wait_with(&self, waker: &Waker) {
        // `try_recv` polls with the no-op waker: it must not replace the waiting task's.
        if waker.will_wake(Waker::noop()) {
            return;
        }
        if let Ok(mut task) = self.task.lock()
            && !task.as_ref().is_some_and(|t| t.will_wake(waker))
        {
            *task = Some(waker.clone());
        }
    }
}

impl std::task::Wake for RingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, std::sync::atomic::Ordering::Release);
        self.armed
            .store(false, std::sync::atomic::Ordering::Release);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl<T: Send + 'static> std::fmt::Debug for Mesh<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Mesh<T> {
    /// This shard.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// Shards on the node.
    pub fn shards(&self) -> usize {
        self.counters.shards()
    }

    /// The node's counters.
    pub fn counters(&self) -> &Arc<MeshCounters> {
        &self.counters
    }

    /// Hands `body` to shard `to` on `lane` without waiting. A refusal is counted and returns
    /// the body.
    pub fn try_send(&self, to: ShardId, lane: Lane, body: T) -> Result<(), SendError<T>> {
        let refuse = |reason: DropReason, body: T| {
            self.counters.count_drop(self.id, lane, reason);
            Err(SendError { reason, body })
        };
        if usize::from(to) >= self.shards() {
            return refuse(DropReason::NoSuchShard, body);
        }
        let envelope = Envelope {
            from: self.id,
            to,
            body,
        };
        if to == self.id {
            let mut queue = self.loopback[lane as usize].borrow_mut();
            if queue.len() >= self.capacity.of(lane) {
                return refuse(DropReason::InboxFull, envelope.body);
            }
            queue.push_back(envelope);
            if let Some(waker) = self.loopback_waker[lane as usize].take() {
                waker.wake();
            }
            self.counters.count_sent(self.id, lane);
            return Ok(());
        }
        let sender = self.senders[lane as usize][usize::from(to)]
            .as_ref()
            .expect("a ring to every other shard");
        match sender.try_send(envelope) {
            Ok(()) => {
                self.counters.count_sent(self.id, lane);
                Ok(())
            }
            Err(GlommioError::WouldBlock(ResourceType::Channel(e))) => {
                refuse(DropReason::InboxFull, e.body)
            }
            Err(GlommioError::Closed(ResourceType::Channel(e))) => {
                refuse(DropReason::Closed, e.body)
            }
            Err(other) => unreachable!("shared channel try_send returned {other}"),
        }
    }

    /// Takes one waiting message on `lane` without waiting, or `None`.
    pub fn try_recv(&self, lane: Lane) -> Option<Envelope<T>> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match self.poll_lane(lane, &mut cx) {
            Poll::Ready(envelope) => envelope,
            Poll::Pending => None,
        }
    }

    /// Waits for the next message on `lane`. `None` once every other shard has closed its ring
    /// to this one and nothing is left (never on a single-shard node: its loopback stays open).
    pub async fn recv(&self, lane: Lane) -> Option<Envelope<T>> {
        poll_fn(|cx| self.poll_lane(lane, cx)).await
    }

    pub(crate) fn poll_lane(
        &self,
        lane: Lane,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Envelope<T>>> {
        loop {
            match self.poll_once(lane, cx) {
                Poll::Ready(Some(envelope)) if envelope.to != self.id => {
                    // A wrong target is a bug somewhere upstream; count it and never act on it.
                    self.counters
                        .count_drop(self.id, lane, DropReason::Misdelivered);
                }
                Poll::Ready(Some(envelope)) => {
                    self.counters.count_received(self.id, lane);
                    return Poll::Ready(Some(envelope));
                }
                other => return other,
            }
        }
    }

    fn poll_once(&self, lane: Lane, cx: &mut std::task::Context<'_>) -> Poll<Option<Envelope<T>>> {
        let l = lane as usize;
        let shards = self.shards();
        let start = self.next[l].get();
        let mut open = false;
        for step in 0..shards {
            let source = (start + step) % shards;
            let ready = if source == usize::from(self.id) {
                open |= shards == 1;
                match self.loopback[l].borrow_mut().pop_front() {
                    Some(envelope) => Poll::Ready(Some(envelope)),
                    None => {
                        self.loopback_waker[l].set(Some(cx.waker().clone()));
                        Poll::Pending
                    }
                }
            } else {
                let receiver = self.receivers[l][source]
                    .as_ref()
                    .expect("a ring from every shard");
                let ring = &self.ring_wakers[l][source];
                ring.wait_with(cx.waker());
                if ring.armed.load(std::sync::atomic::Ordering::Acquire)
                    && !ring.fired.swap(false, std::sync::atomic::Ordering::AcqRel)
                {
                    // Registered and not woken since: nothing arrived, nothing to register.
                    open = true;
                    continue;
                }
                let waker = Waker::from(ring.clone());
                let mut ring_cx = std::task::Context::from_waker(&waker);
                let polled = std::pin::pin!(receiver.recv()).poll(&mut ring_cx);
                if polled.is_pending() {
                    ring.armed.store(true, std::sync::atomic::Ordering::Release);
                }
                open |= !matches!(polled, Poll::Ready(None));
                polled
            };
            if let Poll::Ready(Some(envelope)) = ready {
                self.next[l].set((source + 1) % shards);
                return Poll::Ready(Some(envelope));
            }
        }
        if open {
            Poll::Pending
        } else {
            Poll::Ready(None)
        }
    }

    /// Closes this shard's sending ends: peers see `None` from [`Mesh::recv`] once every shard
    /// has closed.
    pub fn close(&self) {
        for row in &self.senders {
            for sender in row.iter().flatten() {
                sender.close();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glommio::{LocalExecutorBuilder, Placement};

    /// An envelope that names another shard is dropped by the receiver and counted, never
    /// handed on. `try_send` always stamps the right target, so the test writes to the ring
    /// directly.
    #[test]
    fn a_misdelivered_envelope_is_counted_and_dropped() {
        crate::runtime::raise_memlock_limit().unwrap();
        let (ports, counters) = build::<u32>(2, MeshCapacity { main: 4, reply: 4 });
        let (sent_tx, sent_rx) = std::sync::mpsc::channel::<()>();
        let threads: Vec<_> = ports
            .into_iter()
            .map(|port| {
                let sent_tx = sent_tx.clone();
                LocalExecutorBuilder::new(Placement::Unbound)
                    .io_memory(64 << 10)
                    .spawn(move || async move {
                        let mesh = port.connect().await;
                        if mesh.id() == 0 {
                            let ring = mesh.senders[Lane::Main as usize][1].as_ref().unwrap();
                            ring.try_send(Envelope {
                                from: 0,
                                to: 0,
                                body: 7,
                            })
                            .unwrap();
                            mesh.try_send(1, Lane::Main, 8).unwrap();
                            sent_tx.send(()).unwrap();
                            Vec::new()
                        } else {
                            let mut got = Vec::new();
                            while got.is_empty() {
                                got.extend(mesh.try_recv(Lane::Main).map(|e| e.body));
                                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                            }
                            got
                        }
                    })
                    .unwrap()
            })
            .collect();
        drop(sent_tx);
        sent_rx.recv().unwrap();
        let results: Vec<Vec<u32>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            results[1],
            [8],
            "only the rightly addressed message comes out"
        );
        assert_eq!(counters.dropped(1, Lane::Main, DropReason::Misdelivered), 1);
        assert_eq!(counters.received(1, Lane::Main), 1);
        assert_eq!(counters.dropped_total(), 1);
    }

    /// A receiving task polled again and again while its remote rings stay empty (the pump's
    /// idle wait re-polls on every tick) must not pile up waker references: glommio keeps
    /// every waker a pending receive registers until a message arrives, and a task's waker
    /// count is an i16, so 32768 idle polls used to abort the shard (about two minutes of an
    /// idle two-shard node). 40,000 polls, then a message still wakes the receiver.
    #[test]
    fn idle_polls_do_not_accumulate_wakers() {
        crate::runtime::raise_memlock_limit().unwrap();
        let (ports, _) = build::<u32>(2, MeshCapacity { main: 4, reply: 4 });
        let (polled_tx, polled_rx) = std::sync::mpsc::channel::<()>();
        let polled_rx = std::sync::Mutex::new(polled_rx);
        let polled_rx = std::sync::Arc::new(polled_rx);
        let threads: Vec<_> = ports
            .into_iter()
            .map(|port| {
                let polled_tx = polled_tx.clone();
                let polled_rx = polled_rx.clone();
                LocalExecutorBuilder::new(Placement::Unbound)
                    .io_memory(64 << 10)
                    .spawn(move || async move {
                        let mesh = port.connect().await;
                        if mesh.id() == 0 {
                            for _ in 0..40_000 {
                                std::future::poll_fn(|cx| {
                                    for lane in Lane::ALL {
                                        assert!(mesh.poll_lane(lane, cx).is_pending());
                                    }
                                    Poll::Ready(())
                                })
                                .await;
                                assert!(mesh.try_recv(Lane::Main).is_none());
                            }
                            polled_tx.send(()).unwrap();
                            mesh.recv(Lane::Main).await.map(|e| e.body)
                        } else {
                            let rx = polled_rx.lock().unwrap();
                            rx.recv().unwrap();
                            drop(rx);
                            mesh.try_send(0, Lane::Main, 9).unwrap();
                            None
                        }
                    })
                    .unwrap()
            })
            .collect();
        drop(polled_tx);
        let results: Vec<Option<u32>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(results[0], Some(9));
    }
}
