//! A shard's pump skeleton (architecture.md §6): one loop per shard that serves, in priority
//! order, the stop flag, the 10 ms consensus tick, one main-lane message followed by at most one
//! reply-lane message, and reply-lane messages when the main lane is idle.
//!
//! The tick is re-armed only after it fires, so a busy inbox delays it by at most one message's
//! handling and never starves it, and a slow tick never queues a burst of catch-up ticks. What
//! a tick or a message does is the [`Handler`]'s business; turning consensus effects into I/O is
//! not built yet.

use std::future::{Future, poll_fn};
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::mesh::{Envelope, Lane, Mesh};
use crate::runtime::StopSignal;

/// The consensus tick (consensus.md: timeouts are counted in 10 ms ticks).
pub const TICK: Duration = Duration::from_millis(10);

/// Messages a pump handles before it yields to the shard's other ready tasks (connection
/// readers and writers, tasks whose completions were reaped) even if glommio's preemption timer
/// has not asked it to. Bounds one pump turn: with the 1:1 main/reply interleave, at most 2 x
/// 64 handler calls run between yields, a few hundred microseconds of consensus steps, well
/// inside one tick. A yield reaps no new completions: that takes [`reactor_turn`], or the pump
/// running out of messages.
pub const TURN_MESSAGES_MAX: usize = 64;

/// The wait of [`reactor_turn`]: due at once, so it ends on the executor's next look at its
/// rings.
const REACTOR_TURN: Duration = Duration::from_micros(1);

/// Lets the shard's executor look at its rings once before this task goes on (decision 502).
///
/// glommio reaps a shard's rings (storage completions, timers, socket readiness) only when no
/// task is ready or its preempt timer (100 ms) fires; `yield_now` lets the shard's other
/// *ready* tasks run but reaps nothing. So a task that always has work (a socket read that
/// finds bytes waiting never suspends; a pump with events or owed work) holds back every
/// completion of its shard for as long as it has work: a replica connection's reader whose
/// peer kept the socket full did, for seconds. A timer is fired by the reactor, so waiting on
/// one that is already due suspends this task until the executor has been to its rings (if it
/// is due before the first poll, the turn is skipped, no harm done).
pub async fn reactor_turn() {
    glommio::timer::Timer::new(REACTOR_TURN).await;
}

/// What a shard does with its pump's events. Synchronous: the consensus core steps without
/// I/O, and I/O it asks for runs in tasks of the shard's own.
pub trait Handler<T> {
    /// The 10 ms tick.
    fn on_tick(&mut self);
    /// A main-lane message (consensus frames, lifecycle, metadata submits).
    fn on_main(&mut self, envelope: Envelope<T>);
    /// A reply-lane message (client reply forwards).
    fn on_reply(&mut self, envelope: Envelope<T>);
}

/// What one pump run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PumpStats {
    /// Ticks fired.
    pub ticks: u64,
    /// Main-lane messages handled.
    pub main: u64,
    /// Reply-lane messages handled.
    pub reply: u64,
}

enum Event<T> {
    Main(Envelope<T>),
    Reply(Envelope<T>),
    Deadline,
}

/// Runs the pump until `stop` is set.
pub async fn run<T: Send + 'static, H: Handler<T>>(
    mesh: &Mesh<T>,
    stop: &StopSignal,
    handler: &mut H,
) -> PumpStats {
    let mut stats = PumpStats::default();
    let mut next_tick = Instant::now() + TICK;
    let mut turn = 0usize;
    // A lane whose every ring closed (all peers stopped) is not waited on again.
    let mut open = [true; 2];
    loop {
        if stop.is_set() {
            return stats;
        }
        if Instant::now() >= next_tick {
            handler.on_tick();
            stats.ticks += 1;
            // Re-armed after it fired: a tick slower than TICK does not queue another at once.
            next_tick = Instant::now() + TICK;
            continue;
        }
        turn += 1;
        if turn >= TURN_MESSAGES_MAX {
            turn = 0;
            glommio::executor().yield_now().await;
        } else {
            glommio::yield_if_needed().await;
        }
        if let Some(main) = mesh.try_recv(Lane::Main) {
            handler.on_main(main);
            stats.main += 1;
            if let Some(reply) = mesh.try_recv(Lane::Reply) {
                handler.on_reply(reply);
                stats.reply += 1;
            }
            continue;
        }
        if let Some(reply) = mesh.try_recv(Lane::Reply) {
            handler.on_reply(reply);
            stats.reply += 1;
            continue;
        }
        // Idle: sleep until a message or the tick deadline (which also bounds how late the stop
        // flag is seen).
        turn = 0;
        let wait = next_tick.saturating_duration_since(Instant::now());
        let mut timer = std::pin::pin!(glommio::timer::Timer::new(wait));
        let event = poll_fn(|cx| {
            for (i, lane) in Lane::ALL.into_iter().enumerate() {
                if !open[i] {
                    continue;
                }
                match mesh.poll_lane(lane, cx) {
                    Poll::Ready(Some(envelope)) => {
                        return Poll::Ready(match lane {
                            Lane::Main => Event::Main(envelope),
                            Lane::Reply => Event::Reply(envelope),
                        });
                    }
                    Poll::Ready(None) => open[i] = false,
                    Poll::Pending => {}
                }
            }
            timer.as_mut().poll(cx).map(|_| Event::Deadline)
        })
        .await;
        match event {
            Event::Main(main) => {
                handler.on_main(main);
                stats.main += 1;
            }
            Event::Reply(reply) => {
                handler.on_reply(reply);
                stats.reply += 1;
            }
            Event::Deadline => {}
        }
    }
}
