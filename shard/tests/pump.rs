//! The pump skeleton's order: the tick is never starved by a busy inbox, is re-armed after it
//! fires, main and reply lanes interleave 1:1 under load, and an idle pump wakes for a message.
//!
//! Nothing here depends on how fast the machine is: handlers sleep (a sleep lasts at least its
//! duration), and the pump fires a tick only once the clock has passed its deadline.

use std::time::{Duration, Instant};

use shard::pump::{self, Handler, PumpStats, TICK};
use shard::runtime::raise_memlock_limit;
use shard::{
    Envelope, Lane, MeshCapacity, Runtime, RuntimeConfig, ShardContext, Sharding, StopSignal,
};

const JOIN: Duration = Duration::from_secs(60);

fn config(shards: usize) -> RuntimeConfig {
    raise_memlock_limit().unwrap();
    RuntimeConfig {
        sharding: Sharding::Unpinned(shards),
        io_memory: 64 << 10,
        ring_depth: 32,
        mesh: MeshCapacity {
            main: 64,
            reply: 64,
        },
        stop_poll_interval: Duration::from_millis(5),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Tick,
    Main(u32),
    Reply(u32),
}

/// Records events; stops the node when `done` says so.
struct Recorder {
    seen: Vec<Seen>,
    main_cost: Duration,
    tick_cost: Duration,
    ticks: Vec<(Instant, Instant)>,
    stop: StopSignal,
    done: fn(&Recorder) -> bool,
}

impl Recorder {
    fn new(stop: StopSignal, done: fn(&Recorder) -> bool) -> Recorder {
        Recorder {
            seen: Vec::new(),
            main_cost: Duration::ZERO,
            tick_cost: Duration::ZERO,
            ticks: Vec::new(),
            stop,
            done,
        }
    }

    fn count(&self, f: fn(&Seen) -> bool) -> usize {
        self.seen.iter().filter(|s| f(s)).count()
    }

    fn check_done(&self) {
        if (self.done)(self) {
            self.stop.set();
        }
    }
}

impl Handler<u32> for Recorder {
    fn on_tick(&mut self) {
        let start = Instant::now();
        std::thread::sleep(self.tick_cost);
        self.ticks.push((start, Instant::now()));
        self.seen.push(Seen::Tick);
        self.check_done();
    }

    fn on_main(&mut self, envelope: Envelope<u32>) {
        std::thread::sleep(self.main_cost);
        self.seen.push(Seen::Main(envelope.body));
        self.check_done();
    }

    fn on_reply(&mut self, envelope: Envelope<u32>) {
        self.seen.push(Seen::Reply(envelope.body));
        self.check_done();
    }
}

fn one_shard(
    prefill: impl Fn(&ShardContext<u32>) + Send + Sync + 'static,
    make: fn(StopSignal) -> Recorder,
) -> (Vec<Seen>, Vec<(Instant, Instant)>, PumpStats) {
    let runtime = Runtime::start(&config(1), move |ctx: ShardContext<u32>| {
        prefill(&ctx);
        async move {
            let mut recorder = make(ctx.stop.clone());
            let stats = pump::run(&ctx.mesh, &ctx.stop, &mut recorder).await;
            (recorder.seen, recorder.ticks, stats)
        }
    })
    .unwrap();
    runtime.join(JOIN).unwrap().remove(0)
}

fn fill(ctx: &ShardContext<u32>, lane: Lane, n: u32) {
    for i in 0..n {
        ctx.mesh.try_send(ctx.id, lane, i).unwrap();
    }
}

#[test]
fn a_busy_inbox_never_starves_the_tick() {
    let (seen, _, stats) = one_shard(
        |ctx| fill(ctx, Lane::Main, 40),
        |stop| {
            let mut r = Recorder::new(stop, |r| r.count(|s| matches!(s, Seen::Main(_))) == 40);
            r.main_cost = Duration::from_millis(1);
            r
        },
    );
    assert_eq!(stats.main, 40);
    // Ten messages of at least 1 ms each pass the first deadline (10 ms after the pump
    // started): the tick fires before the eleventh, with 30 still queued.
    let first_tick = seen.iter().position(|s| *s == Seen::Tick).expect("a tick");
    assert!(
        first_tick <= 10,
        "first tick after {first_tick} messages: {seen:?}"
    );
    assert!(
        stats.ticks >= 3,
        "40 ms of messages, {} ticks: {seen:?}",
        stats.ticks
    );
    let order: Vec<u32> = seen
        .iter()
        .filter_map(|s| {
            if let Seen::Main(i) = s {
                Some(*i)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(order, (0..40).collect::<Vec<_>>());
}

#[test]
fn main_and_reply_interleave_one_to_one() {
    let (seen, _, stats) = one_shard(
        |ctx| {
            fill(ctx, Lane::Main, 10);
            fill(ctx, Lane::Reply, 10);
        },
        |stop| Recorder::new(stop, |r| r.count(|s| !matches!(s, Seen::Tick)) == 20),
    );
    assert_eq!((stats.main, stats.reply), (10, 10));
    let messages: Vec<Seen> = seen.into_iter().filter(|s| *s != Seen::Tick).collect();
    let want: Vec<Seen> = (0..10)
        .flat_map(|i| [Seen::Main(i), Seen::Reply(i)])
        .collect();
    assert_eq!(messages, want);
}

#[test]
fn a_slow_tick_is_re_armed_after_it_fires() {
    let (_, ticks, stats) = one_shard(
        |_| {},
        |stop| {
            let mut r = Recorder::new(stop, |r| r.ticks.len() == 4);
            r.tick_cost = Duration::from_millis(25);
            r
        },
    );
    assert_eq!(stats.ticks, 4);
    for pair in ticks.windows(2) {
        let gap = pair[1].0.duration_since(pair[0].1);
        assert!(
            gap >= TICK,
            "a tick {gap:?} after the previous one ended: no catch-up bursts"
        );
    }
}

#[test]
fn an_idle_pump_wakes_for_another_shards_message() {
    let runtime = Runtime::start(&config(2), |ctx: ShardContext<u32>| async move {
        if ctx.id == 0 {
            let mut recorder = Recorder::new(ctx.stop.clone(), |r| {
                r.count(|s| matches!(s, Seen::Main(_))) == 1
            });
            let stats = pump::run(&ctx.mesh, &ctx.stop, &mut recorder).await;
            assert!(recorder.seen.contains(&Seen::Main(7)));
            stats
        } else {
            // Let shard 0's pump go idle (several ticks) before sending.
            glommio::timer::sleep(Duration::from_millis(30)).await;
            ctx.mesh.try_send(0, Lane::Main, 7).unwrap();
            ctx.stop.wait().await;
            PumpStats::default()
        }
    })
    .unwrap();
    let stats = runtime.join(JOIN).unwrap();
    assert_eq!(stats[0].main, 1);
    assert!(
        stats[0].ticks >= 1,
        "the pump ticked while idle: {:?}",
        stats[0]
    );
}
