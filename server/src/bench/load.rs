//! The load: producer and consumer threads, one connection each (decision 180), per-batch
//! latency in HDR histograms, and a timeline sampled every [`TICK`] for the chart.
//!
//! Producer latency is from the send's start (under `--rate`, from the batch's scheduled time,
//! so a stalled server is not hidden by a client that waited) to the reply read. Consumer
//! latency is end to end: from the producer's `origin_timestamp`, stamped just before the send,
//! to the moment the consumer has the batch (one clock: both ends are this process).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::client::{Connection, PollAt, SendFrame, now_us};

/// Timeline resolution.
pub const TICK: Duration = Duration::from_millis(250);
/// After the producers stop, consumers have this long to read everything back.
pub const DRAIN_BOUND: Duration = Duration::from_secs(60);

/// When the producers stop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// After this many messages in all (rounded up to whole batches per producer).
    Messages(u64),
    /// After this long.
    Duration(Duration),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Producer connections.
    pub producers: u32,
    /// Consumer connections.
    pub consumers: u32,
    /// Partitions of the topic.
    pub partitions: u32,
    /// Payload bytes per message.
    pub message_size: usize,
    /// Messages per batch.
    pub batch: u32,
    /// When to stop.
    pub stop: Stop,
    /// Offered load in messages per second over all producers (`None`: as fast as acks come).
    pub rate: Option<f64>,
    /// `--rate P%`: before anything else, the producers run as fast as acknowledgements allow
    /// for this long (not recorded), and the load's rate is then this fraction of what that
    /// probe moved; it replaces `rate`.
    pub rate_of_max: Option<(f64, Duration)>,
    /// Load run before the clock starts, at the load's rate, not recorded (`--warmup`).
    pub warmup: Duration,
    /// Consumers wait until the producers are done and then read back what the load produced
    /// (`--read-back`); their latency is then per poll, not end to end.
    pub read_back: bool,
    /// Messages asked for per poll.
    pub poll_batch: u32,
}

/// Where and as whom.
#[derive(Debug, Clone)]
pub struct Target {
    /// A node's client port.
    pub addr: SocketAddr,
    /// Username.
    pub username: String,
    /// Password.
    pub password: String,
    /// `--tcp-congestion`: set on every connection before it connects.
    pub congestion: Option<shard::net::CongestionControl>,
}

/// The stream, topic and partitions the load goes to.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Stream id.
    pub stream: u32,
    /// Topic id.
    pub topic: u32,
    /// Partition ids.
    pub partitions: Vec<u32>,
}

/// One side's results.
#[derive(Debug, Clone)]
pub struct Side {
    /// Messages moved.
    pub messages: u64,
    /// Batches moved (polls that returned messages, for read-back consumers).
    pub batches: u64,
    /// From the side's first worker starting to its last finishing.
    pub elapsed: Duration,
    /// Per-batch latency, µs.
    pub latency: Histogram<u64>,
    /// Transient refusals (57/58) repeated.
    pub transient_retries: u64,
}

/// One timeline point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Seconds since the start (end of the interval).
    pub t_s: f64,
    /// Messages acknowledged to producers in the interval, per second.
    pub produced_msgs_s: f64,
    /// Messages read by consumers in the interval, per second.
    pub consumed_msgs_s: f64,
    /// Producer latency p50 / p99 in the interval (µs), if a batch completed in it.
    pub producer_p50_us: Option<u64>,
    /// See `producer_p50_us`.
    pub producer_p99_us: Option<u64>,
    /// Consumer latency p50 / p99 in the interval (µs).
    pub consumer_p50_us: Option<u64>,
    /// See `consumer_p50_us`.
    pub consumer_p99_us: Option<u64>,
}

/// What the load measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Producers.
    pub producer: Side,
    /// Consumers (`None` with no consumer).
    pub consumer: Option<Side>,
    /// The timeline.
    pub timeline: Vec<Point>,
    /// What ran before the clock started.
    pub before: Before,
}

/// The unrecorded phases before the clock started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Before {
    /// `--rate P%`: messages/s the as-fast-as-possible probe moved.
    pub probe_msgs_s: Option<f64>,
    /// The rate the load ran at (`--rate` or derived from the probe).
    pub rate_msgs_s: Option<f64>,
    /// Messages acknowledged before the clock started (probe and warm-up), not recorded.
    pub messages: u64,
    /// Seconds those phases took.
    pub seconds: f64,
}

/// Live counters, read by the progress display.
#[derive(Debug, Default)]
pub struct Counters {
    /// Messages acknowledged to producers.
    pub produced: AtomicU64,
    /// Messages read by consumers.
    pub consumed: AtomicU64,
}

/// A latency histogram in µs (1 µs to 10 min, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds")
}

/// Which partitions worker `i` of `n` serves: every `n`-th from `i` when there are at least
/// `n`, else the one `i` falls on.
pub fn owned(i: u32, n: u32, partitions: &[u32]) -> Vec<u32> {
    let len = partitions.len() as u32;
    if len >= n {
        (i..len)
            .step_by(n as usize)
            .map(|k| partitions[k as usize])
            .collect()
    } else {
        vec![partitions[(i % len) as usize]]
    }
}

/// Where each of `mine` (from [`owned`]) stands in `partitions`.
fn positions(mine: &[u32], partitions: &[u32]) -> Vec<usize> {
    mine.iter()
        .map(|q| partitions.iter().position(|x| x == q).expect("owned"))
        .collect()
}

/// Per-interval latency histograms of one worker.
struct Series {
    started: Instant,
    buckets: Vec<Histogram<u64>>,
}

impl Series {
    fn new(started: Instant) -> Series {
        Series {
            started,
            buckets: Vec::new(),
        }
    }
    fn record(&mut self, latency_us: u64) {
        let k = (self.started.elapsed().as_nanos() / TICK.as_nanos()) as usize;
        while self.buckets.len() <= k {
            self.buckets
                .push(Histogram::new_with_bounds(1, 600_000_000, 2).expect("valid bounds"));
        }
        self.buckets[k].saturating_record(latency_us.max(1));
    }
}

struct Worker {
    transient_retries: u64,
    begun: Instant,
    latency: Histogram<u64>,
    series: Series,
    messages: u64,
    batches: u64,
    finished: Instant,
}

struct Shared {
    counters: Arc<Counters>,
    /// Messages acknowledged per partition (index = position in `Layout::partitions`).
    produced: Vec<AtomicU64>,
    producers_done: AtomicBool,
    abort: AtomicBool,
    error: Mutex<Option<String>>,
    /// Messages acknowledged before the clock started.
    unrecorded: AtomicU64,
    /// The load's rate, published before the warm-up (it may come from the probe).
    rate: Mutex<Option<f64>>,
    /// Per partition: the offset the measured load starts at (published with the start).
    start_offsets: Mutex<Vec<u64>>,
}

impl Shared {
    fn fail(&self, who: String, error: impl std::fmt::Display) {
        self.abort.store(true, Ordering::SeqCst);
        let mut slot = self.error.lock().expect("not poisoned");
        if slot.is_none() {
            *slot = Some(format!("{who}: {error}"));
        }
    }
}

/// Runs the load against `layout`; `progress` is called every tick with the live counters and
/// the elapsed time.
pub fn run(
    target: &Target,
    workload: &Workload,
    layout: &Layout,
    mut progress: impl FnMut(&Counters, Duration),
) -> anyhow::Result<Outcome> {
    let counters = Arc::new(Counters::default());
    let shared = Arc::new(Shared {
        counters: counters.clone(),
        produced: layout
            .partitions
            .iter()
            .map(|_| AtomicU64::new(0))
            .collect(),
        producers_done: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        error: Mutex::new(None),
        unrecorded: AtomicU64::new(0),
        rate: Mutex::new(workload.rate),
        start_offsets: Mutex::new(vec![0; layout.partitions.len()]),
    });
    let workers = (workload.producers + workload.consumers) as usize;
    let barrier = Arc::new(Barrier::new(workers + 1));
    let start_at = Arc::new(Mutex::new(None::<Instant>));
    let mut producers = Vec::new();
    for p in 0..workload.producers {
        let (target, workload, layout) = (target.clone(), workload.clone(), layout.clone());
        let (shared, barrier, start_at) = (shared.clone(), barrier.clone(), start_at.clone());
        producers.push(
            std::thread::Builder::new()
                .name(format!("producer-{p}"))
                .spawn(move || {
                    produce(p, &target, &workload, &layout, &shared, &barrier, &start_at)
                })?,
        );
    }
    let mut consumers = Vec::new();
    for c in 0..workload.consumers {
        let (target, workload, layout) = (target.clone(), workload.clone(), layout.clone());
        let (shared, barrier, start_at) = (shared.clone(), barrier.clone(), start_at.clone());
        consumers.push(
            std::thread::Builder::new()
                .name(format!("consumer-{c}"))
                .spawn(move || {
                    consume(c, &target, &workload, &layout, &shared, &barrier, &start_at)
                })?,
        );
    }
    // Every worker connects and logs in (wait 1); the producers run the probe (wait 2); the
    // rate is published (wait 3); the producers warm up (wait 4); the start offsets and the
    // clock are published (wait 5). Phases of zero length pass straight through.
    barrier.wait();
    let probe_started = Instant::now();
    barrier.wait();
    let mut before = Before {
        rate_msgs_s: workload.rate,
        ..Before::default()
    };
    if let Some((fraction, _)) = workload.rate_of_max {
        let secs = probe_started.elapsed().as_secs_f64().max(1e-9);
        let max = shared.unrecorded.load(Ordering::SeqCst) as f64 / secs;
        before.probe_msgs_s = Some(max);
        // At least one batch a second over all producers, so a stalled probe still runs.
        let rate = (max * fraction).max(f64::from(workload.batch));
        before.rate_msgs_s = Some(rate);
        *shared.rate.lock().expect("not poisoned") = Some(rate);
    }
    barrier.wait();
    barrier.wait();
    *shared.start_offsets.lock().expect("not poisoned") = shared
        .produced
        .iter()
        .map(|p| p.load(Ordering::SeqCst))
        .collect();
    before.messages = shared.unrecorded.load(Ordering::SeqCst);
    before.seconds = probe_started.elapsed().as_secs_f64();
    let started = Instant::now();
    *start_at.lock().expect("not poisoned") = Some(started);
    barrier.wait();
    let mut samples = vec![(Duration::ZERO, 0u64, 0u64)];
    let mut next = started + TICK;
    loop {
        let all_done =
            producers.iter().all(|h| h.is_finished()) && consumers.iter().all(|h| h.is_finished());
        let now = Instant::now();
        if now >= next || all_done {
            samples.push((
                now - started,
                counters.produced.load(Ordering::Relaxed),
                counters.consumed.load(Ordering::Relaxed),
            ));
            progress(&counters, now - started);
            next += TICK;
        }
        if producers.iter().all(|h| h.is_finished()) {
            shared.producers_done.store(true, Ordering::SeqCst);
        }
        if all_done {
            break;
        }
        std::thread::sleep(Duration::from_millis(10).min(next.saturating_duration_since(now)));
    }
    let join = |handles: Vec<std::thread::JoinHandle<Option<Worker>>>| -> Vec<Worker> {
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap_or(None))
            .collect()
    };
    let producer_workers = join(producers);
    let consumer_workers = join(consumers);
    if let Some(error) = shared.error.lock().expect("not poisoned").take() {
        anyhow::bail!("{error}");
    }
    let side = |workers: &[Worker]| -> Side {
        let mut latency = histogram();
        for w in workers {
            latency.add(&w.latency).expect("same bounds");
        }
        Side {
            messages: workers.iter().map(|w| w.messages).sum(),
            batches: workers.iter().map(|w| w.batches).sum(),
            elapsed: match workers.iter().map(|w| w.begun).min() {
                Some(begun) => workers
                    .iter()
                    .map(|w| w.finished.saturating_duration_since(begun))
                    .max()
                    .unwrap_or_default(),
                None => Duration::ZERO,
            },
            latency,
            transient_retries: workers.iter().map(|w| w.transient_retries).sum(),
        }
    };
    let producer = side(&producer_workers);
    let consumer = (workload.consumers > 0).then(|| side(&consumer_workers));
    let timeline = timeline(&samples, &producer_workers, &consumer_workers);
    Ok(Outcome {
        producer,
        consumer,
        timeline,
        before,
    })
}

fn timeline(
    samples: &[(Duration, u64, u64)],
    producers: &[Worker],
    consumers: &[Worker],
) -> Vec<Point> {
    let merged = |workers: &[Worker], k: usize| -> Option<(u64, u64)> {
        let mut h: Option<Histogram<u64>> = None;
        for w in workers {
            if let Some(b) = w.series.buckets.get(k).filter(|b| !b.is_empty()) {
                match &mut h {
                    Some(h) => h.add(b).expect("same bounds"),
                    None => h = Some(b.clone()),
                }
            }
        }
        h.map(|h| (h.value_at_quantile(0.5), h.value_at_quantile(0.99)))
    };
    samples
        .windows(2)
        .enumerate()
        .map(|(k, w)| {
            let ((t0, p0, c0), (t1, p1, c1)) = (w[0], w[1]);
            let dt = (t1 - t0).as_secs_f64().max(1e-9);
            let prod = merged(producers, k);
            let cons = merged(consumers, k);
            Point {
                t_s: t1.as_secs_f64(),
                produced_msgs_s: (p1 - p0) as f64 / dt,
                consumed_msgs_s: (c1 - c0) as f64 / dt,
                producer_p50_us: prod.map(|p| p.0),
                producer_p99_us: prod.map(|p| p.1),
                consumer_p50_us: cons.map(|c| c.0),
                consumer_p99_us: cons.map(|c| c.1),
            }
        })
        .collect()
}

fn login(target: &Target) -> Result<Connection, super::client::ClientError> {
    let mut conn = Connection::connect(
        target.addr,
        Duration::from_secs(10),
        target.congestion.as_ref(),
    )?;
    conn.login(&target.username, &target.password)?;
    Ok(conn)
}

fn start_of(start_at: &Mutex<Option<Instant>>) -> Instant {
    start_at
        .lock()
        .expect("not poisoned")
        .unwrap_or_else(Instant::now)
}

/// When a phase of sending ends.
#[derive(Debug, Clone, Copy)]
struct Until {
    deadline: Option<Instant>,
    batches: Option<u64>,
}

/// One producer's connection and prebuilt frames.
struct Producer {
    conn: Connection,
    frames: Vec<SendFrame>,
    index_of: Vec<usize>,
    next_slot: usize,
    /// Where this producer's batches fall in each interval under a rate, as a fraction of it:
    /// `p / producers`, so the offered load is spread evenly in time (decision 442).
    phase: f64,
}

impl Producer {
    fn new(p: u32, mut conn: Connection, workload: &Workload, layout: &Layout) -> Producer {
        let mine = owned(p, workload.producers, &layout.partitions);
        let fields = conn.fields(wire::Operation::SendMessages, 0);
        let frames = mine
            .iter()
            .map(|&q| {
                SendFrame::new(
                    fields,
                    layout.stream,
                    layout.topic,
                    q,
                    workload.message_size,
                    workload.batch,
                )
            })
            .collect();
        let index_of = positions(&mine, &layout.partitions);
        Producer {
            phase: phase_of(p, workload.producers),
            conn,
            frames,
            index_of,
            next_slot: 0,
        }
    }

    /// Sends batches from `started` until `until`, `rate` messages/s over all producers (or
    /// as fast as acknowledgements come); records into `worker` when given, else counts the
    /// messages as unrecorded.
    fn run(
        &mut self,
        workload: &Workload,
        shared: &Shared,
        (started, until, rate): (Instant, Until, Option<f64>),
        mut worker: Option<&mut Worker>,
    ) -> Result<(), super::client::ClientError> {
        // Seconds between this producer's batches under a rate.
        let interval = rate.map(|rate| {
            Duration::from_secs_f64(
                f64::from(workload.batch) * f64::from(workload.producers) / rate.max(1e-9),
            )
        });
        let mut sent = 0u64;
        loop {
            if shared.abort.load(Ordering::Relaxed)
                || until.batches.is_some_and(|q| sent >= q)
                || until.deadline.is_some_and(|d| Instant::now() >= d)
            {
                return Ok(());
            }
            let scheduled = match interval {
                Some(interval) => {
                    let at = due(started, interval, sent, self.phase);
                    if until.deadline.is_some_and(|d| at >= d) {
                        return Ok(());
                    }
                    let now = Instant::now();
                    if at > now {
                        std::thread::sleep(at - now);
                    }
                    at
                }
                None => Instant::now(),
            };
            let slot = self.next_slot % self.frames.len();
            self.next_slot += 1;
            let frame = &mut self.frames[slot];
            frame.stamp_origin(now_us());
            self.conn.send(frame)?;
            let messages = u64::from(frame.messages);
            sent += 1;
            shared.produced[self.index_of[slot]].fetch_add(messages, Ordering::Relaxed);
            match worker.as_deref_mut() {
                Some(worker) => {
                    let latency = scheduled.elapsed().as_micros() as u64;
                    worker.latency.saturating_record(latency.max(1));
                    worker.series.record(latency);
                    worker.messages += messages;
                    worker.batches += 1;
                    shared
                        .counters
                        .produced
                        .fetch_add(messages, Ordering::Relaxed);
                }
                None => {
                    shared.unrecorded.fetch_add(messages, Ordering::Relaxed);
                }
            }
        }
    }
}

/// When a producer's batch number `sent` is due under a rate: one every `interval`, offset by
/// the producer's `phase` (a fraction of the interval), so that `P` producers at phases
/// `p / P` offer their batches evenly spaced, not all at once (decision 442).
pub(super) fn due(started: Instant, interval: Duration, sent: u64, phase: f64) -> Instant {
    started + interval.mul_f64(sent as f64 + phase)
}

/// Producer `p`'s phase among `producers`: `p / producers` of an interval.
pub(super) fn phase_of(p: u32, producers: u32) -> f64 {
    f64::from(p) / f64::from(producers.max(1))
}

fn produce(
    p: u32,
    target: &Target,
    workload: &Workload,
    layout: &Layout,
    shared: &Shared,
    barrier: &Barrier,
    start_at: &Mutex<Option<Instant>>,
) -> Option<Worker> {
    let who = format!("producer {p}");
    let setup = login(target);
    barrier.wait();
    let mut producer = match setup {
        Ok(conn) => Some(Producer::new(p, conn, workload, layout)),
        Err(e) => {
            shared.fail(who.clone(), e);
            None
        }
    };
    // Every phase is entered whatever happened, so the barriers always meet; a failed
    // phase aborts the run and the later ones return at once.
    let phase = |producer: &mut Option<Producer>, length: Duration, rate: Option<f64>| {
        if let Some(pr) = producer.as_mut().filter(|_| !length.is_zero()) {
            let start = Instant::now();
            let until = Until {
                deadline: Some(start + length),
                batches: None,
            };
            if let Err(e) = pr.run(workload, shared, (start, until, rate), None) {
                shared.fail(who.clone(), e);
            }
        }
    };
    phase(
        &mut producer,
        workload.rate_of_max.map_or(Duration::ZERO, |(_, d)| d),
        None,
    );
    barrier.wait();
    barrier.wait();
    let rate = *shared.rate.lock().expect("not poisoned");
    phase(&mut producer, workload.warmup, rate);
    barrier.wait();
    barrier.wait();
    let started = start_of(start_at);
    let mut producer = producer?;
    let quota = match workload.stop {
        Stop::Messages(total) => {
            let batches = total.div_ceil(u64::from(workload.batch));
            let n = u64::from(workload.producers);
            Some(batches / n + u64::from(u64::from(p) < batches % n))
        }
        Stop::Duration(_) => None,
    };
    let deadline = match workload.stop {
        Stop::Duration(d) => Some(started + d),
        Stop::Messages(_) => None,
    };
    let mut worker = Worker {
        transient_retries: 0,
        begun: started,
        latency: histogram(),
        series: Series::new(started),
        messages: 0,
        batches: 0,
        finished: started,
    };
    let until = Until {
        deadline,
        batches: quota,
    };
    if let Err(e) = producer.run(workload, shared, (started, until, rate), Some(&mut worker)) {
        shared.fail(who, e);
        return None;
    }
    worker.finished = Instant::now();
    worker.transient_retries = producer.conn.transient_retries();
    Some(worker)
}

fn consume(
    c: u32,
    target: &Target,
    workload: &Workload,
    layout: &Layout,
    shared: &Shared,
    barrier: &Barrier,
    start_at: &Mutex<Option<Instant>>,
) -> Option<Worker> {
    let who = format!("consumer {c}");
    let setup = login(target);
    // Consumers take no part in the probe or the warm-up: they start at the offsets the
    // measured load starts at.
    for _ in 0..5 {
        barrier.wait();
    }
    let started = start_of(start_at);
    let mut conn = match setup {
        Ok(conn) => conn,
        Err(e) => {
            shared.fail(who, e);
            return None;
        }
    };
    let mine = owned(c, workload.consumers, &layout.partitions);
    let index_of = positions(&mine, &layout.partitions);
    let offsets = shared.start_offsets.lock().expect("not poisoned").clone();
    let mut next: Vec<u64> = index_of.iter().map(|&i| offsets[i]).collect();
    if workload.read_back {
        while !shared.producers_done.load(Ordering::SeqCst) {
            if shared.abort.load(Ordering::Relaxed) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let begun = Instant::now();
    let mut worker = Worker {
        transient_retries: 0,
        begun,
        latency: histogram(),
        series: Series::new(started),
        messages: 0,
        batches: 0,
        finished: begun,
    };
    let mut drained_since: Option<Instant> = None;
    loop {
        if shared.abort.load(Ordering::Relaxed) {
            return None;
        }
        let done = shared.producers_done.load(Ordering::SeqCst);
        let mut got = 0u64;
        for (i, &q) in mine.iter().enumerate() {
            if done && next[i] >= shared.produced[index_of[i]].load(Ordering::SeqCst) {
                continue;
            }
            let mut error = None;
            let mut polled = 0u64;
            let at = PollAt {
                stream: layout.stream,
                topic: layout.topic,
                partition: q,
                offset: next[i],
                count: workload.poll_batch,
            };
            let asked = Instant::now();
            let result = conn.poll(c + 1, at, |batch| {
                if batch.first_offset != next[i] {
                    error.get_or_insert(format!(
                        "partition {q}: batch at offset {} where {} was next",
                        batch.first_offset, next[i]
                    ));
                }
                next[i] = batch.end_offset;
                if !workload.read_back {
                    let latency = now_us().saturating_sub(batch.origin_us);
                    worker.latency.saturating_record(latency.max(1));
                    worker.series.record(latency);
                    worker.batches += 1;
                }
                polled += u64::from(batch.messages);
            });
            if let Err(e) = result {
                shared.fail(who, e);
                return None;
            }
            if let Some(e) = error {
                shared.fail(who, e);
                return None;
            }
            if workload.read_back && polled > 0 {
                let latency = asked.elapsed().as_micros() as u64;
                worker.latency.saturating_record(latency.max(1));
                worker.series.record(latency);
                worker.batches += 1;
            }
            worker.messages += polled;
            got += polled;
            shared
                .counters
                .consumed
                .fetch_add(polled, Ordering::Relaxed);
        }
        if got > 0 {
            continue;
        }
        if done {
            let caught_up = mine
                .iter()
                .enumerate()
                .all(|(i, _)| next[i] >= shared.produced[index_of[i]].load(Ordering::SeqCst));
            if caught_up {
                break;
            }
            let since = *drained_since.get_or_insert_with(Instant::now);
            if since.elapsed() > DRAIN_BOUND {
                let behind: Vec<String> = mine
                    .iter()
                    .enumerate()
                    .map(|(i, q)| {
                        format!(
                            "partition {q} at {} of {}",
                            next[i],
                            shared.produced[index_of[i]].load(Ordering::SeqCst)
                        )
                    })
                    .collect();
                shared.fail(
                    who,
                    format!(
                        "did not read back everything within {DRAIN_BOUND:?}: {}",
                        behind.join(", ")
                    ),
                );
                return None;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    worker.finished = Instant::now();
    worker.transient_retries = conn.transient_retries();
    Some(worker)
}
