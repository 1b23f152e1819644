//! The report of one run (issue 12 item 3): the JSON file, the chart (a hand-written SVG,
//! decision 184), the HDR percentile distributions, and `compare`.

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::baseline::Baseline;
use super::load::{Point, Side};

/// Per-batch latency percentiles, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// p50.
    pub p50: u64,
    /// p90.
    pub p90: u64,
    /// p99.
    pub p99: u64,
    /// p99.9.
    pub p999: u64,
    /// max.
    pub max: u64,
}

impl Latency {
    /// From a histogram in µs.
    pub fn of(h: &Histogram<u64>) -> Latency {
        Latency {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// `ConsumerReport::latency_kind` of consumers beside the producers: from the batch's origin
/// timestamp to the consumer having it.
pub const END_TO_END: &str = "end_to_end";
/// `ConsumerReport::latency_kind` of `--read-back`: one poll's round trip.
pub const PER_POLL: &str = "per_poll";

fn end_to_end() -> String {
    END_TO_END.to_string()
}

/// The consumers' figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerReport {
    /// Messages read per second.
    pub throughput_msgs_s: f64,
    /// Payload MB (10^6 bytes) read per second.
    pub throughput_mb_s: f64,
    /// End-to-end per-batch latency (origin timestamp to read), µs.
    pub latency_us: Latency,
    /// Messages read.
    pub messages: u64,
    /// `throughput_mb_s` over the loopback baseline.
    pub ratio_to_loopback: f64,
    /// What `latency_us` measures: [`END_TO_END`] or [`PER_POLL`].
    #[serde(default = "end_to_end")]
    pub latency_kind: String,
    /// Messages asked for per poll.
    #[serde(default)]
    pub poll_batch: u32,
}

/// What happened before the clock started (decision 360).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeforeClock {
    /// With `--spawn`: the cluster state the harness waited for (from every node's
    /// `/metrics`) after creating the topic.
    pub waited_for: Option<String>,
    /// Seconds that wait took.
    pub waited_s: f64,
    /// `--warmup`: seconds of load at the load's rate, not recorded.
    pub warmup_s: f64,
    /// `--rate P%`: what the as-fast-as-possible probe moved, messages/s.
    pub probe_msgs_s: Option<f64>,
    /// Messages acknowledged by the probe and the warm-up (not in `messages`).
    pub unrecorded_messages: u64,
    /// Seconds the probe and the warm-up took.
    pub unrecorded_s: f64,
}

/// One of issue 12's targets checked against this run (decision 362).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// Short name.
    pub name: String,
    /// The target in words, with how the bound is derived.
    pub target: String,
    /// The measured value.
    pub value: f64,
    /// The bound it is held to.
    pub bound: f64,
    /// `"us"` or `"ratio"`.
    pub unit: String,
    /// `value <= bound` for latencies, `value >= bound` for ratios.
    pub pass: bool,
    /// What this run's own baselines allow at best, where the bench can say (decision 410):
    /// a latency no design can go under, or the ratio the nodes' disk writes cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limit>,
}

/// A same-run limit beside a check's bound (decision 410).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    /// The limit, in the check's unit.
    pub value: f64,
    /// How it is derived.
    pub why: String,
}

/// One timeline point as written.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Seconds since the start.
    pub t_s: f64,
    /// Producer payload MB/s in the interval.
    pub produced_mb_s: f64,
    /// Consumer payload MB/s in the interval.
    pub consumed_mb_s: f64,
    /// Producer p50 (µs) in the interval.
    pub producer_p50_us: Option<u64>,
    /// Producer p99 (µs) in the interval.
    pub producer_p99_us: Option<u64>,
    /// Consumer p50 (µs) in the interval.
    pub consumer_p50_us: Option<u64>,
    /// Consumer p99 (µs) in the interval.
    pub consumer_p99_us: Option<u64>,
}

/// The JSON report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The build's git hash.
    pub commit: String,
    /// Whether this build runs the consensus core's invariant sweep after every step (a debug
    /// build, or a release build that pulled in `consensus/invariants`, e.g. through the
    /// `tests` package: decision 490). Its figures are not the server's.
    #[serde(default)]
    pub invariant_sweep: bool,
    /// When the load started (µs since the epoch).
    pub started_at_us: u64,
    /// Replicas in the cluster (`null` when the target does not say).
    pub replicas: Option<u32>,
    /// `"disk"`, `"memory"`, or `"unknown"` against `--address`.
    pub acked: String,
    /// Where the load went (`host:port` of the node used).
    pub target: String,
    /// Payload bytes per message.
    pub message_size: usize,
    /// Messages per batch.
    pub batch: u32,
    /// Producer connections.
    pub producers: u32,
    /// Consumer connections.
    pub consumers: u32,
    /// Partitions.
    pub partitions: u32,
    /// Offered load (messages/s), `null` for as fast as acknowledgements allow.
    pub rate_msgs_s: Option<f64>,
    /// Producer wall time, seconds.
    pub duration_s: f64,
    /// Messages acknowledged to producers.
    pub messages: u64,
    /// Producer messages per second.
    pub throughput_msgs_s: f64,
    /// Producer payload MB (10^6 bytes) per second.
    pub throughput_mb_s: f64,
    /// Producer per-batch latency, µs.
    pub latency_us: Latency,
    /// Requests repeated after a transient refusal (57/58), producers and consumers.
    pub transient_retries: u64,
    /// Same-run baselines.
    pub baseline: Baseline,
    /// min(loopback, disk) / replicas (loopback alone without a disk figure).
    pub ceiling_mb_s: Option<f64>,
    /// `throughput_mb_s / ceiling_mb_s`.
    pub ratio_to_ceiling: Option<f64>,
    /// `throughput_mb_s / baseline.loopback_mb_s`.
    pub ratio_to_loopback: f64,
    /// With `--spawn`: CPU seconds (user + system) all the nodes used while the load ran, per
    /// GB (10^9 B) of payload acknowledged to producers; `null` against `--address`. A
    /// throughput-independent cost figure for a shared machine (decision 260).
    #[serde(default)]
    pub cpu_s_per_gb: Option<f64>,
    /// With `--spawn`: bytes the nodes caused to be written to storage while the load ran
    /// (`/proc/PID/io` `write_bytes`: WAL, segments, indexes, superblocks), per node, per byte
    /// of payload acknowledged; `null` against `--address` (decision 410).
    #[serde(default)]
    pub disk_bytes_per_payload_byte: Option<f64>,
    /// With `--spawn`: minor page faults all the nodes took while the load ran, per MB
    /// (10^6 B) of payload acknowledged; `null` against `--address`. Each is a page touched
    /// fresh, which a node's steady state should not need: a high figure means the nodes were
    /// still growing (or giving back and retaking) memory, which on this VM slows every
    /// stage (decision 511).
    #[serde(default)]
    pub minor_faults_per_mb: Option<f64>,
    /// With `--spawn`: the largest peak resident set of any node (`VmHWM`), in MB (10^6 B);
    /// `null` against `--address` (decision 511).
    #[serde(default)]
    pub node_resident_peak_mb: Option<f64>,
    /// The consumers (`null` with none).
    pub consumer: Option<ConsumerReport>,
    /// Every 250 ms.
    pub timeline: Vec<TimelinePoint>,
    /// `--read-back`: the consumers read after the producers were done.
    #[serde(default)]
    pub read_back: bool,
    /// The wait, probe and warm-up before the clock started.
    #[serde(default)]
    pub before_clock: Option<BeforeClock>,
    /// With `--spawn`: replica-plane sends dropped for want of a connection
    /// (`strand_replica_send_dropped_total{reason="not_connected"}` over all nodes) while the
    /// load ran; `null` against `--address`.
    #[serde(default)]
    pub replica_sends_dropped_not_connected: Option<u64>,
    /// Issue 12's targets that apply to this run's shape, checked.
    #[serde(default)]
    pub checks: Vec<Check>,
}

/// Microseconds one SendMessages frame of the report's batch takes at the loopback baseline.
pub fn batch_transfer_us(r: &Report) -> f64 {
    let bytes = super::send_frame_size(r.message_size as u32, r.batch) as f64;
    if r.baseline.loopback_mb_s > 0.0 {
        bytes / r.baseline.loopback_mb_s
    } else {
        f64::INFINITY
    }
}

/// Issue 12's targets (item 4) that apply to the shape of run `r`, each with the bound its
/// same-run baselines give (decision 362):
/// - a fixed load (`--rate`, the target's is `--rate 50%`, half the measured maximum):
///   p99.9 within 3x p99, and p50 within 2 x (the batch's loopback transfer time x 3 + one
///   `fdatasync` p50) when the disk was measured;
/// - `--batch 1`: p50 within 3 x (the round trip p50 + one `fdatasync` p50);
/// - `--read-back`: consumers at 0.5x loopback or more;
/// - 1000-byte messages as fast as acknowledgements allow, acknowledged on disk:
///   `ratio_to_ceiling` at least 0.6 for 1 replica, 0.5 for more.
pub fn checks(r: &Report) -> Vec<Check> {
    let mut out = Vec::new();
    let us = |name: &str, target: String, value: u64, bound: f64| Check {
        name: name.to_string(),
        target,
        value: value as f64,
        bound,
        unit: "us".to_string(),
        pass: (value as f64) <= bound,
        limit: None,
    };
    let fsync = r.baseline.fdatasync_us_p50;
    if let Some(rate) = r.rate_msgs_s
        && r.batch > 1
    {
        out.push(us(
            "fixed_load_tail",
            format!("at {rate:.0} msgs/s: per-batch p99.9 <= 3 x p99"),
            r.latency_us.p999,
            3.0 * r.latency_us.p99 as f64,
        ));
        if let Some(fsync) = fsync {
            let transfer = batch_transfer_us(r);
            let mut check = us(
                "fixed_load_p50",
                format!(
                    "at {rate:.0} msgs/s: per-batch p50 <= 2 x (3 x {transfer:.0} us loopback \
                     transfer of the batch + {fsync:.0} us fdatasync)"
                ),
                r.latency_us.p50,
                2.0 * (3.0 * transfer + fsync),
            );
            // No replica can write a batch before it arrived whole: a node verifies the
            // batch before it journals it (decision 494). Measured where the run measured
            // it (decision 509), else from the disk probe's bandwidth (decision 410).
            check.limit = match &r.baseline.chain_writes {
                Some(c) => Some(Limit {
                    value: transfer + c.append_quorum_us_p50,
                    why: format!(
                        "the batch's first {transfer:.0} us loopback transfer + {:.0} us p50 \
                         for {} of {} writers {:.0} us apart to append it to this disk and \
                         fdatasync, as segments are written; over written blocks {:.0} us",
                        c.append_quorum_us_p50,
                        c.quorum,
                        c.writers,
                        c.stagger_us,
                        c.overwrite_quorum_us_p50
                    ),
                }),
                None => quorum_write_floor_us(r).map(|(floor, why)| Limit {
                    value: transfer + floor + fsync,
                    why: format!(
                        "the batch's first {transfer:.0} us loopback transfer + {why} + one \
                         {fsync:.0} us fdatasync"
                    ),
                }),
            };
            out.push(check);
        }
    }
    if r.batch == 1
        && let Some(fsync) = fsync
    {
        out.push(us(
            "single_message_p50",
            format!(
                "single messages: p50 <= 3 x ({:.0} us round trip + {fsync:.0} us fdatasync)",
                r.baseline.rtt_us_p50
            ),
            r.latency_us.p50,
            3.0 * (r.baseline.rtt_us_p50 + fsync),
        ));
    }
    if r.read_back
        && let Some(c) = &r.consumer
    {
        out.push(Check {
            name: "read_back".to_string(),
            target: "consumers reading back: MB/s >= 0.5 x loopback".to_string(),
            value: c.ratio_to_loopback,
            bound: 0.5,
            unit: "ratio".to_string(),
            pass: c.ratio_to_loopback >= 0.5,
            limit: segment_read_cap(r),
        });
    }
    if let Some(check) = replica_plane_check(r) {
        out.push(check);
    }
    if r.rate_msgs_s.is_none()
        && r.message_size == 1000
        && r.batch > 1
        && r.acked == "disk"
        && let (Some(replicas), Some(ratio)) = (r.replicas, r.ratio_to_ceiling)
    {
        let bound = if replicas == 1 { 0.6 } else { 0.5 };
        out.push(Check {
            name: "throughput".to_string(),
            target: format!("{replicas} replica(s), 1000 B: ratio_to_ceiling >= {bound}"),
            value: ratio,
            bound,
            unit: "ratio".to_string(),
            pass: ratio >= bound,
            limit: throughput_limit(r, replicas),
        });
    }
    out
}

/// Issue 12's 3 / 1 replica target, which takes two runs: `replicated`'s messages/s at least
/// 0.6x `single`'s, both of 100-byte messages in batches, acknowledged on disk as fast as
/// acknowledgements allow, with the same producers and partitions; `single` of one replica,
/// `replicated` of more. `None` for any other pair. The limit is what `replicated`'s run
/// measured for a chain of as many nodes with no server in it against one node alone
/// (decision 516).
pub fn replica_ratio(single: &Report, replicated: &Report) -> Option<Check> {
    let shaped = |r: &Report| {
        r.message_size == 100 && r.batch > 1 && r.rate_msgs_s.is_none() && r.acked == "disk"
    };
    let replicas = replicated.replicas.filter(|n| *n > 1)?;
    if single.replicas != Some(1)
        || !shaped(single)
        || !shaped(replicated)
        || (single.batch, single.producers, single.partitions)
            != (
                replicated.batch,
                replicated.producers,
                replicated.partitions,
            )
        || single.throughput_msgs_s <= 0.0
    {
        return None;
    }
    let value = replicated.throughput_msgs_s / single.throughput_msgs_s;
    Some(Check {
        name: "replica_ratio".to_string(),
        target: format!("{replicas} replicas, 100 B: messages/s >= 0.6 x those of 1 replica"),
        value,
        bound: 0.6,
        unit: "ratio".to_string(),
        pass: value >= 0.6,
        limit: replicated.baseline.chain_load.as_ref().map(|c| Limit {
            value: c.ratio,
            why: format!(
                "measured in the {replicas}-replica run: {} producer(s) against a chain of {} \
                 nodes with no server in it, {CHAIN_NODE}, {:.0} batches/s, and against one \
                 such node, {:.0}",
                c.producers, c.replicas, c.chain_batches_s, c.single_batches_s
            ),
        }),
    })
}

/// Issue 10's replica-plane figure (decision 415): 3 replicas, prepares of about 1 MiB
/// acknowledged on disk, committed MB/s against min(loopback / 2, disk / 3) from the same
/// run's baselines (every committed byte crosses loopback twice on the chain and is written
/// three times to the one disk), at least half of it.
fn replica_plane_check(r: &Report) -> Option<Check> {
    let batch_bytes = r.message_size as u64 * u64::from(r.batch);
    if r.rate_msgs_s.is_some()
        || r.replicas != Some(3)
        || r.acked != "disk"
        || !(512 * 1024..=2 * 1024 * 1024).contains(&batch_bytes)
    {
        return None;
    }
    let disk = r.baseline.disk_write_mb_s.filter(|d| *d > 0.0)?;
    let ceiling = (r.baseline.loopback_mb_s / 2.0).min(disk / 3.0);
    if ceiling <= 0.0 {
        return None;
    }
    let ratio = r.throughput_mb_s / ceiling;
    let limit = r
        .disk_bytes_per_payload_byte
        .filter(|b| *b > 0.0)
        .map(|b| Limit {
            value: disk / (3.0 * b) / ceiling,
            why: format!(
                "the nodes wrote {b:.2} bytes per payload byte each; 3 nodes doing so on one \
                 disk at the probe's bandwidth reach at most this ratio"
            ),
        });
    Some(Check {
        name: "replica_plane".to_string(),
        target: format!(
            "issue 10: 3 replicas, {batch_bytes} B prepares on disk: committed MB/s >= 0.5 x \
             min(loopback / 2, disk / 3) = 0.5 x {ceiling:.1} MB/s"
        ),
        value: ratio,
        bound: 0.5,
        unit: "ratio".to_string(),
        pass: ratio >= 0.5,
        limit,
    })
}

/// What a node of the chain with no server in it does (decision 516), for the limits' words.
const CHAIN_NODE: &str = "each appending every batch durably beside a WAL record";

/// The throughput check's limit: the lower of the disk cap ([`disk_cap_ratio`]) and what
/// the run's chain with no server in it moved over the ceiling ([`chain_ratio_to_ceiling`],
/// decision 516), with its derivation.
fn throughput_limit(r: &Report, replicas: u32) -> Option<Limit> {
    let cap = disk_cap_ratio(r).map(|cap| Limit {
        value: cap,
        why: format!(
            "the nodes wrote {:.2} bytes per payload byte each; {replicas} node(s) doing so on \
             one disk at the probe's bandwidth reach at most this ratio",
            r.disk_bytes_per_payload_byte.unwrap_or(0.0)
        ),
    });
    let chain = chain_ratio_to_ceiling(r).and_then(|ratio| {
        let c = r.baseline.chain_load.as_ref()?;
        Some(Limit {
            value: ratio,
            why: format!(
                "{} producer(s) against a chain of {} node(s) with no server in it, \
                 {CHAIN_NODE}, moved {:.0} batches/s of this run's payload",
                c.producers, c.replicas, c.chain_batches_s
            ),
        })
    });
    // The cap on a tie: `min_by` keeps the first of equals.
    [cap, chain]
        .into_iter()
        .flatten()
        .min_by(|a, b| a.value.total_cmp(&b.value))
}

/// The payload MB/s the run's chain with no server in it moved (decision 516), over the
/// run's ceiling.
pub fn chain_ratio_to_ceiling(r: &Report) -> Option<f64> {
    let c = r.baseline.chain_load.as_ref()?;
    let ceiling = r.ceiling_mb_s.filter(|c| *c > 0.0)?;
    let payload = f64::from(r.batch) * r.message_size as f64;
    Some(c.chain_batches_s * payload / 1e6 / ceiling)
}

/// The ratio to the ceiling that the nodes' own disk writes allow at the disk probe's
/// bandwidth: `R` nodes each writing `b` bytes per payload byte to one disk of `D` MB/s move at
/// most `D / (R b)` MB/s of payload (decision 410). `None` without the figures.
pub fn disk_cap_ratio(r: &Report) -> Option<f64> {
    let b = r.disk_bytes_per_payload_byte.filter(|b| *b > 0.0)?;
    let disk = r.baseline.disk_write_mb_s.filter(|d| *d > 0.0)?;
    let replicas = f64::from(r.replicas.filter(|n| *n > 0)?);
    let ceiling = r.ceiling_mb_s.filter(|c| *c > 0.0)?;
    Some(disk / (replicas * b) / ceiling)
}

/// The least time a quorum's copies of one batch take to reach the one disk all nodes share,
/// at the disk probe's bandwidth: a node acknowledges a batch only once a majority of
/// replicas wrote its frame, whatever else they write (decision 410). With its derivation.
pub fn quorum_write_floor_us(r: &Report) -> Option<(f64, String)> {
    let disk = r.baseline.disk_write_mb_s.filter(|d| *d > 0.0)?;
    let replicas = r.replicas.filter(|n| *n > 0)?;
    let quorum = replicas / 2 + 1;
    let bytes = super::send_frame_size(r.message_size as u32, r.batch) as f64;
    Some((
        f64::from(quorum) * bytes / disk,
        format!(
            "{quorum} cop(ies) of the {bytes:.0} B batch written to one disk at {disk:.0} MB/s"
        ),
    ))
}

/// The ratio to loopback a read-back served from the segments can reach at the disk probe's
/// read bandwidth (decision 413): the in-memory tail (`partition.read_cache_bytes`) serves
/// only the newest batches, so a read-back of more than it holds reads the rest from disk.
pub fn segment_read_cap(r: &Report) -> Option<Limit> {
    let read = r.baseline.disk_read_mb_s.filter(|d| *d > 0.0)?;
    (r.baseline.loopback_mb_s > 0.0).then(|| Limit {
        value: read / r.baseline.loopback_mb_s,
        why: format!(
            "the segments read back at the disk probe's {read:.0} MB/s, the in-memory tail aside"
        ),
    })
}

/// One check as a line of the summary.
pub fn check_line(c: &Check) -> String {
    let fmt = |v: f64| match c.unit.as_str() {
        "us" => format!("{v:.0} us"),
        _ => format!("{v:.3}"),
    };
    let limit = c.limit.as_ref().map_or_else(String::new, |l| {
        format!("; this run allows at best {} ({})", fmt(l.value), l.why)
    });
    format!(
        "target {}: {} (value {}, bound {}): {}{limit}",
        c.name,
        c.target,
        fmt(c.value),
        fmt(c.bound),
        if c.pass { "PASS" } else { "FAIL" }
    )
}

/// Messages and MB per second of a side.
pub fn rates(side: &Side, message_size: usize) -> (f64, f64) {
    let secs = side.elapsed.as_secs_f64();
    if secs <= 0.0 {
        return (0.0, 0.0);
    }
    let msgs = side.messages as f64 / secs;
    (msgs, msgs * message_size as f64 / 1e6)
}

/// Converts the load's timeline.
pub fn timeline(points: &[Point], message_size: usize) -> Vec<TimelinePoint> {
    let mb = |msgs: f64| msgs * message_size as f64 / 1e6;
    points
        .iter()
        .map(|p| TimelinePoint {
            t_s: p.t_s,
            produced_mb_s: mb(p.produced_msgs_s),
            consumed_mb_s: mb(p.consumed_msgs_s),
            producer_p50_us: p.producer_p50_us,
            producer_p99_us: p.producer_p99_us,
            consumer_p50_us: p.consumer_p50_us,
            consumer_p99_us: p.consumer_p99_us,
        })
        .collect()
}

/// File names under `--out`.
pub const JSON: &str = "report.json";
/// The chart.
pub const SVG: &str = "chart.svg";
/// Producer latency distribution.
pub const PRODUCER_HGRM: &str = "producer-latency.hgrm";
/// Consumer latency distribution.
pub const CONSUMER_HGRM: &str = "consumer-latency.hgrm";

/// Writes the JSON, the chart and the distributions under `dir`.
pub fn write(
    dir: &Path,
    report: &Report,
    producer: &Histogram<u64>,
    consumer: Option<&Histogram<u64>>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(report)?;
    let path = dir.join(JSON);
    std::fs::write(&path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    let path = dir.join(SVG);
    std::fs::write(&path, svg(report)).with_context(|| format!("writing {}", path.display()))?;
    let path = dir.join(PRODUCER_HGRM);
    std::fs::write(&path, distribution(producer))
        .with_context(|| format!("writing {}", path.display()))?;
    if let Some(consumer) = consumer {
        let path = dir.join(CONSUMER_HGRM);
        std::fs::write(&path, distribution(consumer))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The percentile distribution in the HdrHistogram text layout (µs).
pub fn distribution(h: &Histogram<u64>) -> String {
    let mut out = String::from("       Value     Percentile TotalCount 1/(1-Percentile)\n\n");
    for v in h.iter_quantiles(2) {
        let q = v.quantile_iterated_to();
        let inverse = if q < 1.0 {
            1.0 / (1.0 - q)
        } else {
            f64::INFINITY
        };
        let _ = writeln!(
            out,
            "{:12.3} {:14.12} {:10} {:14.2}",
            v.value_iterated_to() as f64,
            q,
            v.count_since_last_iteration(),
            inverse
        );
    }
    let _ = writeln!(
        out,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]\n#[Max     = {:12.3}, Total count    = {:12}]",
        h.mean(),
        h.stdev(),
        h.max() as f64,
        h.len()
    );
    out
}

/// A two-panel line chart: payload MB/s over time (producers, consumers) above per-batch
/// latency p50 and p99 over time (µs, log scale) below.
pub fn svg(report: &Report) -> String {
    const W: f64 = 900.0;
    const PANEL: f64 = 260.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 44.0;
    const GAP: f64 = 70.0;
    let h = TOP + PANEL + GAP + PANEL + 50.0;
    let points = &report.timeline;
    let t_max = points.iter().map(|p| p.t_s).fold(0.0, f64::max).max(1e-3);
    let x = |t: f64| LEFT + (W - LEFT - RIGHT) * t / t_max;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="16" font-size="13">strand bench: {} replica(s), acked {}, {} x {} B batches, {} producer(s), {} consumer(s), {} partition(s)</text>"#,
        report
            .replicas
            .map_or_else(|| "?".to_string(), |r| r.to_string()),
        escape(&report.acked),
        report.batch,
        report.message_size,
        report.producers,
        report.consumers,
        report.partitions,
    );
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="32" fill="#555">commit {}; producers {:.1} MB/s, per-batch p99 {} us; loopback {:.0} MB/s, disk {} MB/s</text>"##,
        escape(report.commit.get(..12).unwrap_or(&report.commit)),
        report.throughput_mb_s,
        report.latency_us.p99,
        report.baseline.loopback_mb_s,
        report
            .baseline
            .disk_write_mb_s
            .map_or_else(|| "n/a".to_string(), |d| format!("{d:.0}")),
    );
    // Panel 1: throughput.
    let top1 = TOP;
    let mb_max = points
        .iter()
        .flat_map(|p| [p.produced_mb_s, p.consumed_mb_s])
        .fold(0.0, f64::max)
        .max(report.ceiling_mb_s.unwrap_or(0.0))
        .max(1e-3)
        * 1.1;
    let y1 = |v: f64| top1 + PANEL - PANEL * v / mb_max;
    axes(&mut out, top1, PANEL, LEFT, W - RIGHT, "payload MB/s");
    for k in 0..=4 {
        let v = mb_max * f64::from(k) / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{:.0}</text>"#,
            LEFT - 6.0,
            y1(v) + 4.0,
            v
        );
    }
    if let Some(c) = report.ceiling_mb_s {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#999" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" fill="#666" text-anchor="end">ceiling {c:.0} MB/s</text>"##,
            W - RIGHT,
            y1(c),
            y1(c),
            W - RIGHT - 4.0,
            y1(c) - 4.0
        );
    }
    line(
        &mut out,
        points.iter().map(|p| (x(p.t_s), y1(p.produced_mb_s))),
        "#1f77b4",
    );
    if report.consumers > 0 {
        line(
            &mut out,
            points.iter().map(|p| (x(p.t_s), y1(p.consumed_mb_s))),
            "#2ca02c",
        );
    }
    // Panel 2: latency, log scale.
    let top2 = TOP + PANEL + GAP;
    let lat: Vec<u64> = points
        .iter()
        .flat_map(|p| {
            [
                p.producer_p50_us,
                p.producer_p99_us,
                p.consumer_p50_us,
                p.consumer_p99_us,
            ]
        })
        .flatten()
        .collect();
    let lo = (lat.iter().copied().min().unwrap_or(1).max(1) as f64)
        .log10()
        .floor();
    let hi = (lat.iter().copied().max().unwrap_or(10).max(10) as f64)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let y2 = |v: u64| top2 + PANEL - PANEL * ((v.max(1) as f64).log10() - lo) / (hi - lo);
    axes(
        &mut out,
        top2,
        PANEL,
        LEFT,
        W - RIGHT,
        "per-batch latency (µs, log)",
    );
    let mut decade = lo;
    while decade <= hi {
        let v = 10f64.powf(decade);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y2(v as u64) + 4.0,
            v as u64
        );
        decade += 1.0;
    }
    type Get = fn(&TimelinePoint) -> Option<u64>;
    let series: [(Get, &str); 4] = [
        (|p| p.producer_p50_us, "#1f77b4"),
        (|p| p.producer_p99_us, "#ff7f0e"),
        (|p| p.consumer_p50_us, "#2ca02c"),
        (|p| p.consumer_p99_us, "#d62728"),
    ];
    for (get, colour) in &series {
        line(
            &mut out,
            points
                .iter()
                .filter_map(|p| get(p).map(|v| (x(p.t_s), y2(v)))),
            colour,
        );
    }
    // Time axis labels and the legend.
    for k in 0..=4 {
        let t = t_max * f64::from(k) / 4.0;
        for base in [top1 + PANEL, top2 + PANEL] {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t:.1} s</text>"#,
                x(t),
                base + 16.0
            );
        }
    }
    let legend: [(&str, &str); 6] = [
        ("produced MB/s", "#1f77b4"),
        ("consumed MB/s", "#2ca02c"),
        ("producer p50", "#1f77b4"),
        ("producer p99", "#ff7f0e"),
        ("consumer p50", "#2ca02c"),
        ("consumer p99", "#d62728"),
    ];
    for (i, (name, colour)) in legend.iter().enumerate() {
        let lx = LEFT + 140.0 * i as f64;
        let ly = h - 14.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{name}</text>"#,
            lx + 18.0,
            lx + 22.0,
            ly + 4.0
        );
    }
    out.push_str("</svg>\n");
    out
}

fn axes(out: &mut String, top: f64, height: f64, left: f64, right: f64, label: &str) {
    let bottom = top + height;
    let _ = writeln!(
        out,
        r##"<rect x="{left}" y="{top}" width="{}" height="{height}" fill="none" stroke="#333"/><text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">{}</text>"##,
        right - left,
        left - 55.0,
        top + height / 2.0,
        left - 55.0,
        top + height / 2.0,
        escape(label)
    );
    let _ = bottom;
}

fn line(out: &mut String, points: impl Iterator<Item = (f64, f64)>, colour: &str) {
    let mut path = String::new();
    for (x, y) in points {
        let _ = write!(path, "{x:.1},{y:.1} ");
    }
    if !path.is_empty() {
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            path.trim_end()
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `strand bench compare A B`: the two reports' figures side by side, with B / A.
pub fn compare(a: &Report, b: &Report, a_name: &str, b_name: &str) -> String {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let num = |v: f64| {
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
        }
    };
    let opt = |v: Option<f64>| v.map_or_else(|| "null".to_string(), num);
    let mut row = |name: &str, x: String, y: String| rows.push((name.to_string(), x, y));
    row("commit", a.commit.clone(), b.commit.clone());
    row(
        "invariant_sweep",
        a.invariant_sweep.to_string(),
        b.invariant_sweep.to_string(),
    );
    row(
        "replicas",
        format!("{:?}", a.replicas),
        format!("{:?}", b.replicas),
    );
    row("acked", a.acked.clone(), b.acked.clone());
    row("workload", workload(a), workload(b));
    row(
        "throughput_msgs_s",
        num(a.throughput_msgs_s),
        num(b.throughput_msgs_s),
    );
    row(
        "throughput_mb_s",
        num(a.throughput_mb_s),
        num(b.throughput_mb_s),
    );
    for (name, f) in LATENCIES {
        row(
            &format!("latency_us.{name}"),
            f(&a.latency_us).to_string(),
            f(&b.latency_us).to_string(),
        );
    }
    row(
        "baseline.loopback_mb_s",
        num(a.baseline.loopback_mb_s),
        num(b.baseline.loopback_mb_s),
    );
    row(
        "baseline.rtt_us_p50",
        num(a.baseline.rtt_us_p50),
        num(b.baseline.rtt_us_p50),
    );
    row(
        "baseline.rtt_us_p99",
        num(a.baseline.rtt_us_p99),
        num(b.baseline.rtt_us_p99),
    );
    row(
        "baseline.disk_read_mb_s",
        opt(a.baseline.disk_read_mb_s),
        opt(b.baseline.disk_read_mb_s),
    );
    row(
        "baseline.disk_write_mb_s",
        opt(a.baseline.disk_write_mb_s),
        opt(b.baseline.disk_write_mb_s),
    );
    row(
        "baseline.fdatasync_us_p50",
        opt(a.baseline.fdatasync_us_p50),
        opt(b.baseline.fdatasync_us_p50),
    );
    let load = |r: &Report, f: fn(&super::chain_load::ChainLoad) -> f64| {
        opt(r.baseline.chain_load.as_ref().map(f))
    };
    row(
        "baseline.chain_load.chain_batches_s",
        load(a, |c| c.chain_batches_s),
        load(b, |c| c.chain_batches_s),
    );
    row(
        "baseline.chain_load.single_batches_s",
        load(a, |c| c.single_batches_s),
        load(b, |c| c.single_batches_s),
    );
    row(
        "baseline.chain_load.ratio",
        load(a, |c| c.ratio),
        load(b, |c| c.ratio),
    );
    let chain = |r: &Report, f: fn(&super::baseline::ChainWrites) -> f64| {
        opt(r.baseline.chain_writes.as_ref().map(f))
    };
    row(
        "baseline.chain_writes.append_quorum_us_p50",
        chain(a, |c| c.append_quorum_us_p50),
        chain(b, |c| c.append_quorum_us_p50),
    );
    row(
        "baseline.chain_writes.overwrite_quorum_us_p50",
        chain(a, |c| c.overwrite_quorum_us_p50),
        chain(b, |c| c.overwrite_quorum_us_p50),
    );
    let name = |n: &Option<String>| n.clone().unwrap_or_else(|| "null".into());
    row(
        "baseline.tcp_congestion_control",
        name(&a.baseline.tcp_congestion_control),
        name(&b.baseline.tcp_congestion_control),
    );
    row(
        "baseline.socket_congestion_control",
        name(&a.baseline.socket_congestion_control),
        name(&b.baseline.socket_congestion_control),
    );
    row("ceiling_mb_s", opt(a.ceiling_mb_s), opt(b.ceiling_mb_s));
    row(
        "ratio_to_ceiling",
        opt(a.ratio_to_ceiling),
        opt(b.ratio_to_ceiling),
    );
    row(
        "ratio_to_loopback",
        num(a.ratio_to_loopback),
        num(b.ratio_to_loopback),
    );
    row("cpu_s_per_gb", opt(a.cpu_s_per_gb), opt(b.cpu_s_per_gb));
    row(
        "disk_bytes_per_payload_byte",
        opt(a.disk_bytes_per_payload_byte),
        opt(b.disk_bytes_per_payload_byte),
    );
    row(
        "minor_faults_per_mb",
        opt(a.minor_faults_per_mb),
        opt(b.minor_faults_per_mb),
    );
    row(
        "node_resident_peak_mb",
        opt(a.node_resident_peak_mb),
        opt(b.node_resident_peak_mb),
    );
    let c = |r: &Report, f: &dyn Fn(&ConsumerReport) -> String| {
        r.consumer.as_ref().map_or_else(|| "null".to_string(), f)
    };
    row(
        "consumer.throughput_msgs_s",
        c(a, &|c| num(c.throughput_msgs_s)),
        c(b, &|c| num(c.throughput_msgs_s)),
    );
    row(
        "consumer.throughput_mb_s",
        c(a, &|c| num(c.throughput_mb_s)),
        c(b, &|c| num(c.throughput_mb_s)),
    );
    for (name, f) in LATENCIES {
        row(
            &format!("consumer.latency_us.{name}"),
            c(a, &|c| f(&c.latency_us).to_string()),
            c(b, &|c| f(&c.latency_us).to_string()),
        );
    }
    row(
        "replica_sends_dropped_not_connected",
        a.replica_sends_dropped_not_connected
            .map_or_else(|| "null".to_string(), |v| v.to_string()),
        b.replica_sends_dropped_not_connected
            .map_or_else(|| "null".to_string(), |v| v.to_string()),
    );
    // Each check either report has: value / bound and the verdict.
    let mut names: Vec<&str> = a.checks.iter().map(|c| c.name.as_str()).collect();
    for c in &b.checks {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    let of = |c: &Check| {
        format!(
            "{} / {} {}",
            num(c.value),
            num(c.bound),
            if c.pass { "PASS" } else { "FAIL" }
        )
    };
    let verdict = |r: &Report, name: &str| {
        r.checks
            .iter()
            .find(|c| c.name == name)
            .map_or_else(|| "null".to_string(), of)
    };
    for name in names {
        row(&format!("check.{name}"), verdict(a, name), verdict(b, name));
    }
    // The 3 / 1 replica target is a check of the pair (decision 516), shown under the run of
    // more replicas, with the limit that run measured.
    let pair = replica_ratio(a, b)
        .map(|c| (c, false))
        .or_else(|| replica_ratio(b, a).map(|c| (c, true)));
    if let Some((check, in_a)) = pair {
        let verdict = of(&check);
        let limit = check
            .limit
            .as_ref()
            .map_or_else(|| "null".to_string(), |l| num(l.value));
        let null = || "null".to_string();
        if in_a {
            row("check.replica_ratio", verdict, null());
            row("check.replica_ratio.limit", limit, null());
        } else {
            row("check.replica_ratio", null(), verdict);
            row("check.replica_ratio.limit", null(), limit);
        }
    }
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(6);
    let w1 = rows
        .iter()
        .map(|r| r.1.len())
        .max()
        .unwrap_or(0)
        .max(a_name.len());
    let w2 = rows
        .iter()
        .map(|r| r.2.len())
        .max()
        .unwrap_or(0)
        .max(b_name.len());
    let mut out = String::new();
    let _ = writeln!(out, "{:w0$}  {:>w1$}  {:>w2$}  B/A", "", a_name, b_name);
    for (name, x, y) in &rows {
        let ratio = match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(x), Ok(y)) if x != 0.0 => format!("{:.2}", y / x),
            _ => String::new(),
        };
        let _ = writeln!(out, "{name:w0$}  {x:>w1$}  {y:>w2$}  {ratio}");
    }
    out
}

type LatencyField = (&'static str, fn(&Latency) -> u64);
const LATENCIES: [LatencyField; 5] = [
    ("p50", |l| l.p50),
    ("p90", |l| l.p90),
    ("p99", |l| l.p99),
    ("p999", |l| l.p999),
    ("max", |l| l.max),
];

fn workload(r: &Report) -> String {
    format!(
        "{}p/{}c/{}part {}x{}B",
        r.producers, r.consumers, r.partitions, r.batch, r.message_size
    )
}
