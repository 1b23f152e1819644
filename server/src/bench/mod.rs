//! `strand bench`: the bundled load harness (issue 12). It measures its baselines first
//! ([`baseline`]: loopback bandwidth, a small round trip, and with `--spawn` the disk's synced
//! write bandwidth in the data directory), starts a local cluster if asked ([`cluster`]),
//! creates a stream and a topic, runs producers and consumers over its own client ([`client`],
//! [`load`]), and writes the report ([`report`]: JSON, SVG chart, HDR distributions). A sink
//! server ([`sink`]) answers the client at once, to show what the client alone can offer.

pub mod baseline;
pub mod chain_load;
pub mod client;
pub mod cluster;
pub mod load;
pub mod report;
pub mod sink;

use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use shard::net::CongestionControl;

use self::client::Connection;
use self::load::{Layout, Stop, Target, Workload};
use self::report::{ConsumerReport, Latency, Report};

/// The build's git commit (set by `server/build.rs`; `unknown` outside a git checkout).
pub const COMMIT: &str = match option_env!("STRAND_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

/// Bound on the wait for a new topic's partitions to answer.
pub const READY_BOUND: Duration = Duration::from_secs(30);

/// `strand bench` flags.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// `compare A.json B.json`.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// `strand bench` subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Print two reports side by side, with B / A for every figure.
    Compare {
        /// The first report.
        a: PathBuf,
        /// The second report.
        b: PathBuf,
    },
}

/// How a spawned cluster acknowledges a SendMessages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AckArg {
    /// After a quorum of replicas has it on disk.
    Disk,
    /// After a quorum has it in memory.
    Memory,
}

impl AckArg {
    /// The `partition.ack` value.
    pub fn as_str(self) -> &'static str {
        match self {
            AckArg::Disk => "disk",
            AckArg::Memory => "memory",
        }
    }
}

/// The flags of a run.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Producer connections (each sends whole batches, lockstep).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub producers: u32,
    /// Consumer connections (each polls its partitions by offset and reads everything back).
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub consumers: u32,
    /// Partitions of the benchmark topic.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
    /// Payload bytes per message.
    #[arg(long, value_name = "BYTES", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    pub message_size: u32,
    /// The benchmark topic's `segment_size` option (bytes, a multiple of 512 in 1 MiB..=1 GiB;
    /// default the node's, 1 GiB): a run crosses segment seals with little disk.
    #[arg(long, value_name = "BYTES")]
    pub segment_size: Option<u64>,
    /// Messages per SendMessages batch.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub batch: u32,
    /// Stop after N messages in all (rounded up to whole batches).
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    pub messages: Option<u64>,
    /// Stop after S seconds (default 10 when --messages is not given).
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,
    /// A fixed offered load in messages per second over all producers (default: as fast as
    /// acknowledgements allow). Latency is then measured from each batch's scheduled time.
    /// `P%` (e.g. `50%`): first a probe of --probe-seconds as fast as acknowledgements allow
    /// (not recorded), then the load at P percent of the probe's messages/s.
    #[arg(long, value_name = "MSGS_PER_S|P%", value_parser = parse_rate)]
    pub rate: Option<RateArg>,
    /// Seconds of the as-fast-as-possible probe that `--rate P%` runs first.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    pub probe_seconds: f64,
    /// Seconds of load run before the clock starts, at the load's rate, whose samples are not
    /// recorded (default 1 with --address; 0 with --spawn, which waits for the cluster to
    /// report itself ready instead).
    #[arg(long, value_name = "S")]
    pub warmup: Option<f64>,
    /// Consumers read back what the producers acknowledged, after the producers are done
    /// (from the segments and the in-memory tails, nothing being written meanwhile); their
    /// throughput is over the read-back alone and their latency per poll.
    #[arg(long)]
    pub read_back: bool,
    /// With --spawn: skip the chain with no server in it (decision 516), which writes up to
    /// 2 GiB per chain to the data directory's disk after the load; the checks then have no
    /// chain limit.
    #[arg(long)]
    pub no_chain_probe: bool,
    /// Messages a consumer asks for per poll (default: --batch).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub poll_batch: Option<u32>,
    /// A running node's client address (HOST:PORT); with --sink, where the sink listens.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "spawn")]
    pub address: Option<String>,
    /// Start a local N-node cluster (child `strand start` processes) and run against it.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u8).range(1..=i64::from(crate::config::DEV_REPLICAS_MAX)))]
    pub spawn: Option<u8>,
    /// How the spawned cluster acknowledges (partition.ack; default disk).
    #[arg(long, value_enum)]
    pub ack: Option<AckArg>,
    /// The spawned nodes' `partition.wal_size`: each WAL file's size, e.g. `1 GiB` or
    /// `268435456` (8 MiB..=1 GiB, a multiple of 4 KiB; default the node's, 64 MiB).
    #[arg(long, value_name = "SIZE", requires = "spawn", value_parser = parse_wal_size)]
    pub wal_size: Option<u64>,
    /// The spawned nodes' `partition.read_cache_bytes`: each partition's in-memory tail, e.g.
    /// `64 MiB` (64 KiB..=4 GiB; default the node's, 256 MiB within the shard's 1 GiB).
    #[arg(long, value_name = "SIZE", requires = "spawn", value_parser = parse_read_cache)]
    pub read_cache: Option<u64>,
    /// The spawned nodes' `system.memory_prefault_bytes`: memory each faults in at boot for
    /// its caches, e.g. `512 MiB`, or `0` for none (1 MiB..=1 TiB; default the node's, 1 GiB;
    /// decision 512).
    #[arg(long, value_name = "SIZE", requires = "spawn", value_parser = parse_memory_prefault)]
    pub memory_prefault: Option<u64>,
    /// The spawned cluster's directory (kept); default a temporary one, removed after.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Write report.json, chart.svg and the latency distributions here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seconds each bandwidth baseline runs.
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub baseline_seconds: f64,
    /// Username to log in with.
    #[arg(long, default_value = crate::metadata::ROOT_DEFAULT)]
    pub username: String,
    /// Password to log in with.
    #[arg(long, default_value = crate::metadata::ROOT_DEFAULT)]
    pub password: String,
    /// A TCP congestion control (e.g. `cubic`) set on every socket of the run before it
    /// connects or listens: the load's connections, the loopback and round-trip probes and,
    /// with --spawn, the nodes' (`network.tcp_congestion_control`). Default: the kernel's
    /// (decision 501). Against --address the nodes keep their own config.
    #[arg(long, value_name = "NAME", value_parser = parse_congestion)]
    pub tcp_congestion: Option<CongestionControl>,
    /// Serve the sink (answers every request at once) on --address (default 127.0.0.1:8090)
    /// until killed, instead of running a load.
    #[arg(long, conflicts_with_all = ["spawn", "out"])]
    pub sink: bool,
}

/// Parses `--tcp-congestion`: a name of the kernel's shape (whether this kernel has it is
/// checked before the run, [`validate`]).
pub fn parse_congestion(text: &str) -> Result<CongestionControl, String> {
    CongestionControl::new(text).map_err(|e| e.to_string())
}

/// Parses `--wal-size`: a size as the config writes it (`64 MiB`, `4096`), in the range and
/// alignment the config accepts for `partition.wal_size`.
pub fn parse_wal_size(text: &str) -> Result<u64, String> {
    let bytes = crate::config::parse_size(text)
        .ok_or_else(|| format!("--wal-size {text}: not a size like \"64 MiB\" or \"4096\""))?;
    let (low, high) = (crate::config::WAL_SIZE_MIN, crate::config::WAL_SIZE_MAX);
    if bytes < low || bytes > high || !bytes.is_multiple_of(journal::storage::SECTOR as u64) {
        return Err(format!(
            "--wal-size {text}: {bytes} bytes must be in {low}..={high} and a multiple of {}",
            journal::storage::SECTOR
        ));
    }
    Ok(bytes)
}

/// Parses `--read-cache`: a size as the config writes it, in the range the config accepts for
/// `partition.read_cache_bytes`.
pub fn parse_read_cache(text: &str) -> Result<u64, String> {
    let bytes = crate::config::parse_size(text)
        .ok_or_else(|| format!("--read-cache {text}: not a size like \"256 MiB\" or \"4096\""))?;
    if !(64 << 10..=4 << 30).contains(&bytes) {
        return Err(format!(
            "--read-cache {text}: {bytes} bytes must be in 64 KiB..=4 GiB"
        ));
    }
    Ok(bytes)
}

/// Parses `--memory-prefault`: `0`, or a size in the range the config accepts for
/// `system.memory_prefault_bytes`.
pub fn parse_memory_prefault(text: &str) -> Result<u64, String> {
    let bytes = crate::config::parse_size(text)
        .ok_or_else(|| format!("--memory-prefault {text}: not a size like \"512 MiB\" or \"0\""))?;
    if !crate::memory::is_prefault_bytes(bytes) {
        return Err(format!(
            "--memory-prefault {text}: {bytes} bytes must be 0 or in 1 MiB..=1 TiB"
        ));
    }
    Ok(bytes)
}

/// `--rate`: a fixed load or a percentage of a probe's maximum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RateArg {
    /// Messages per second over all producers.
    Fixed(f64),
    /// This fraction (0, 1] of the messages/s an as-fast-as-possible probe moves.
    OfMax(f64),
}

/// Parses `--rate`: a positive number, or a percentage in (0, 100] followed by `%`.
pub fn parse_rate(text: &str) -> Result<RateArg, String> {
    match text.strip_suffix('%') {
        Some(p) => match p.trim().parse::<f64>() {
            Ok(p) if p.is_finite() && p > 0.0 && p <= 100.0 => Ok(RateArg::OfMax(p / 100.0)),
            _ => Err(format!(
                "--rate {text}: a percentage of the measured maximum must be in (0, 100]"
            )),
        },
        None => match text.trim().parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(RateArg::Fixed(r)),
            _ => Err(format!(
                "--rate {text}: a positive number of messages per second, or P% of the maximum"
            )),
        },
    }
}

/// Bytes of one SendMessages frame for `batch` messages of `message_size` bytes (explicit
/// partitioning, numeric ids): header, envelope, batch header, frames.
pub fn send_frame_size(message_size: u32, batch: u32) -> u64 {
    const ENVELOPE: u64 = 4 + 6 + 6 + 6 + 4;
    wire::HEADER_SIZE as u64
        + ENVELOPE
        + wire::batch::HEADER_SIZE as u64
        + u64::from(batch) * (wire::batch::FRAME_HEADER_SIZE as u64 + u64::from(message_size))
}

/// Checks the cross-flag rules clap does not: names the flags in every error.
pub fn validate(args: &RunArgs) -> anyhow::Result<()> {
    if let Some(congestion) = &args.tcp_congestion {
        congestion.check().context("--tcp-congestion")?;
    }
    if args.sink {
        return Ok(());
    }
    if args.address.is_none() && args.spawn.is_none() {
        bail!("strand bench needs --address HOST:PORT (a running cluster) or --spawn N");
    }
    if args.spawn.is_none() {
        if let Some(ack) = args.ack {
            bail!(
                "--ack {} sets how a --spawn'ed cluster acknowledges; against --address the \
                 cluster's own config decides",
                ack.as_str()
            );
        }
        if args.data_dir.is_some() {
            bail!("--data-dir is where a --spawn'ed cluster keeps its data; it needs --spawn");
        }
    }
    let frame = send_frame_size(args.message_size, args.batch);
    if frame > wire::MAX_MESSAGE_SIZE_DEFAULT as u64 {
        bail!(
            "--batch {} x --message-size {} makes a {frame}-byte SendMessages frame, above the \
             {}-byte frame limit",
            args.batch,
            args.message_size,
            wire::MAX_MESSAGE_SIZE_DEFAULT
        );
    }
    if let Some(d) = args.duration
        && !(d.is_finite() && d > 0.0)
    {
        bail!("--duration must be a positive number of seconds, got {d}");
    }
    if args.messages == Some(0) {
        bail!("--messages must be at least 1");
    }
    if let Some(RateArg::Fixed(r)) = args.rate
        && !(r.is_finite() && r > 0.0)
    {
        bail!("--rate must be a positive number of messages per second, got {r}");
    }
    if !(args.probe_seconds.is_finite() && args.probe_seconds > 0.0) {
        bail!(
            "--probe-seconds must be positive, got {}",
            args.probe_seconds
        );
    }
    if let Some(w) = args.warmup
        && !(w.is_finite() && w >= 0.0)
    {
        bail!("--warmup must be zero or a positive number of seconds, got {w}");
    }
    if args.read_back && args.consumers == 0 {
        bail!("--read-back needs consumers to read back: give --consumers N");
    }
    if !(args.baseline_seconds.is_finite() && args.baseline_seconds > 0.0) {
        bail!(
            "--baseline-seconds must be positive, got {}",
            args.baseline_seconds
        );
    }
    Ok(())
}

/// `strand bench`: runs it, writing progress to stderr and the summary to `out`. `exe` is
/// the `strand` binary the cluster nodes are started from.
pub fn main(args: BenchArgs, exe: &Path, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match args.command {
        Some(BenchCommand::Compare { a, b }) => {
            let read = |p: &Path| -> anyhow::Result<Report> {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
            };
            let (ra, rb) = (read(&a)?, read(&b)?);
            write!(
                out,
                "{}",
                report::compare(&ra, &rb, &a.display().to_string(), &b.display().to_string())
            )?;
            Ok(())
        }
        None => {
            let args = args.run;
            validate(&args)?;
            if args.sink {
                let addr = args.address.as_deref().unwrap_or("127.0.0.1:8090");
                let sink = sink::Sink::spawn_under(resolve(addr)?, args.tcp_congestion.as_ref())
                    .with_context(|| format!("binding {addr}"))?;
                writeln!(out, "sink listening on {}", sink.addr())?;
                out.flush()?;
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            let report = run(&args, exe)?;
            summary(&report, out)?;
            Ok(())
        }
    }
}

/// A run with baselines, optional local cluster, load and report; writes the files under
/// `--out` and returns the report.
pub fn run(args: &RunArgs, exe: &Path) -> anyhow::Result<Report> {
    validate(args)?;
    let terminal = std::io::stderr().is_terminal();
    let write_size = send_frame_size(args.message_size, args.batch) as usize;
    let budget = baseline::Budget::standard(Duration::from_secs_f64(args.baseline_seconds));
    let congestion = args.tcp_congestion.as_ref();
    let (mut cluster, target_addr, replicas, acked, baseline) = match (args.spawn, &args.address) {
        (Some(n), _) => {
            let (dir, remove) = match &args.data_dir {
                Some(dir) => (dir.clone(), false),
                None => (
                    std::env::temp_dir().join(format!(
                        "strand-bench-{}-{}",
                        std::process::id(),
                        client::now_us()
                    )),
                    true,
                ),
            };
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            note("measuring baselines (loopback, round trip, disk)");
            let baseline = baseline::measure(write_size, Some(&dir), budget, congestion);
            // Under a fixed load, also how fast a quorum's copies of one batch reach this
            // disk when every replica writes its own (the fixed-load p50 check's limit).
            let baseline = baseline.and_then(|mut b| {
                if args.rate.is_some() {
                    note("measuring how a chain's copies of one batch reach the disk");
                    let stagger = Duration::from_secs_f64(
                        write_size as f64 / (b.loopback_mb_s * 1e6).max(1.0),
                    );
                    b.chain_writes = Some(baseline::chain_writes(
                        &dir,
                        write_size,
                        u32::from(n),
                        stagger,
                        budget,
                    )?);
                }
                Ok(b)
            });
            let baseline = match baseline {
                Ok(b) => b,
                Err(e) => {
                    if remove {
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                    return Err(e).context("measuring the baselines");
                }
            };
            note(&format!("starting {n} node(s) in {}", dir.display()));
            let mut cluster = cluster::Cluster::start(
                exe,
                n,
                &cluster::Spawned {
                    ack: args.ack.unwrap_or(AckArg::Disk).as_str(),
                    wal_size: args.wal_size,
                    read_cache: args.read_cache,
                    // The nodes share the machine's free memory (decision 512).
                    memory_prefault: Some(args.memory_prefault.unwrap_or_else(|| {
                        crate::memory::local_prefault_bytes(n, crate::memory::available_bytes())
                    })),
                    congestion,
                },
                dir.clone(),
                remove,
            )
            .inspect_err(|_| {
                if remove {
                    let _ = std::fs::remove_dir_all(&dir);
                }
            })?;
            let primary = cluster.wait_primary(cluster::PRIMARY_BOUND)?;
            let addr = cluster.client_addr(primary);
            note(&format!("node {primary} is primary; clients at {addr}"));
            (
                Some(cluster),
                addr,
                Some(u32::from(n)),
                args.ack.unwrap_or(AckArg::Disk).as_str().to_string(),
                baseline,
            )
        }
        (None, Some(address)) => {
            let addr = resolve(address)?;
            note("measuring baselines (loopback, round trip)");
            let baseline = baseline::measure(write_size, None, budget, congestion)
                .context("measuring the baselines")?;
            (None, addr, None, "unknown".to_string(), baseline)
        }
        (None, None) => bail!("strand bench needs --address HOST:PORT or --spawn N"),
    };
    note(&baseline_line(&baseline));
    let target = Target {
        addr: target_addr,
        username: args.username.clone(),
        password: args.password.clone(),
        congestion: args.tcp_congestion.clone(),
    };
    let (layout, replicas) = prepare(&target, args, replicas)?;
    let ready = match cluster.as_mut() {
        Some(cluster) => {
            let waiting = std::time::Instant::now();
            let what = cluster.wait_ready(args.partitions, READY_BOUND)?;
            let waited_s = waiting.elapsed().as_secs_f64();
            note(&format!("ready after {waited_s:.2} s: {what}"));
            Some((what, waited_s))
        }
        None => None,
    };
    let warmup = Duration::from_secs_f64(args.warmup.unwrap_or(match args.spawn {
        Some(_) => 0.0,
        None => 1.0,
    }));
    let workload = Workload {
        producers: args.producers,
        consumers: args.consumers,
        partitions: args.partitions,
        message_size: args.message_size as usize,
        batch: args.batch,
        stop: match (args.messages, args.duration) {
            (Some(n), _) => Stop::Messages(n),
            (None, Some(d)) => Stop::Duration(Duration::from_secs_f64(d)),
            (None, None) => Stop::Duration(Duration::from_secs(10)),
        },
        rate: match args.rate {
            Some(RateArg::Fixed(r)) => Some(r),
            _ => None,
        },
        rate_of_max: match args.rate {
            Some(RateArg::OfMax(f)) => Some((f, Duration::from_secs_f64(args.probe_seconds))),
            _ => None,
        },
        warmup,
        read_back: args.read_back,
        poll_batch: args.poll_batch.unwrap_or(args.batch),
    };
    let started_at_us = client::now_us();
    let not_connected = |c: &cluster::Cluster| {
        c.sum_over_nodes(
            "strand_replica_send_dropped_total",
            "reason=\"not_connected\"",
        )
    };
    let dropped_before = cluster.as_ref().and_then(not_connected);
    let cpu_before = cluster.as_ref().and_then(|c| c.cpu_seconds());
    let written_before = cluster.as_ref().and_then(|c| c.write_bytes());
    let faults_before = cluster.as_ref().and_then(|c| c.minor_faults());
    let outcome = with_progress(terminal, &workload, |progress| {
        load::run(&target, &workload, &layout, progress)
    })?;
    let cpu_after = cluster.as_ref().and_then(|c| c.cpu_seconds());
    let written_after = cluster.as_ref().and_then(|c| c.write_bytes());
    let faults_after = cluster.as_ref().and_then(|c| c.minor_faults());
    let resident_peak = cluster.as_ref().and_then(|c| c.resident_peak_bytes_max());
    let dropped_after = cluster.as_ref().and_then(not_connected);
    if let Some(cluster) = cluster.as_mut()
        && !cluster.stop()
    {
        eprintln!(
            "strand bench: a node exited unclean at the end; logs in {}",
            cluster.dir.display()
        );
    }
    // As fast as acknowledgements allow: what a chain of as many nodes with no server in it
    // reaches, and one such node, on this machine now (the limit of the 3 / 1 replica ratio
    // and of the throughput checks, decision 516). After the load, with the nodes stopped:
    // run before it, its gigabytes of writes cost the measured load 2-5%.
    let mut baseline = baseline;
    if let (Some(c), Some(n)) = (cluster.as_ref(), replicas)
        && runs_chain_probe(args)
    {
        note("measuring a chain of nodes with no server in it");
        let load = chain_load::Load {
            write_size,
            producers: args.producers,
            time: budget.time * 2,
            bytes_max: budget.disk_bytes_max,
        };
        match chain_load::chain_load(&c.dir, load, n, congestion) {
            Ok(chain) => baseline.chain_load = Some(chain),
            Err(e) => eprintln!(
                "strand bench: the chain with no server in it failed, so the checks have no \
                 chain limit: {e}"
            ),
        }
    }
    drop(cluster);
    let (msgs_s, mb_s) = report::rates(&outcome.producer, workload.message_size);
    let ceiling = baseline::ceiling_mb_s(&baseline, replicas);
    let ratio = |v: f64, of: f64| if of > 0.0 { v / of } else { 0.0 };
    let consumer = outcome.consumer.as_ref().map(|side| {
        let (msgs_s, mb_s) = report::rates(side, workload.message_size);
        ConsumerReport {
            throughput_msgs_s: msgs_s,
            throughput_mb_s: mb_s,
            latency_us: Latency::of(&side.latency),
            messages: side.messages,
            ratio_to_loopback: ratio(mb_s, baseline.loopback_mb_s),
            latency_kind: if workload.read_back {
                report::PER_POLL.to_string()
            } else {
                report::END_TO_END.to_string()
            },
            poll_batch: workload.poll_batch,
        }
    });
    let report = Report {
        commit: COMMIT.to_string(),
        invariant_sweep: consensus::INVARIANT_SWEEP,
        started_at_us,
        replicas,
        acked,
        target: target_addr.to_string(),
        message_size: workload.message_size,
        batch: workload.batch,
        producers: workload.producers,
        consumers: workload.consumers,
        partitions: workload.partitions,
        rate_msgs_s: outcome.before.rate_msgs_s,
        duration_s: outcome.producer.elapsed.as_secs_f64(),
        messages: outcome.producer.messages,
        throughput_msgs_s: msgs_s,
        throughput_mb_s: mb_s,
        latency_us: Latency::of(&outcome.producer.latency),
        transient_retries: outcome.producer.transient_retries
            + outcome.consumer.as_ref().map_or(0, |c| c.transient_retries),
        ceiling_mb_s: ceiling,
        ratio_to_ceiling: ceiling.map(|c| ratio(mb_s, c)),
        ratio_to_loopback: ratio(mb_s, baseline.loopback_mb_s),
        // The CPU spans the probe and warm-up too: their messages count here.
        cpu_s_per_gb: cpu_before.zip(cpu_after).and_then(|(before, after)| {
            cpu_per_gb(
                after - before,
                outcome.producer.messages,
                &outcome.before,
                workload.message_size,
            )
        }),
        disk_bytes_per_payload_byte: written_before.zip(written_after).zip(replicas).and_then(
            |((before, after), replicas)| {
                // The writes span the probe and warm-up too: their messages count here.
                let messages = outcome.producer.messages + outcome.before.messages;
                let payload = messages as f64 * workload.message_size as f64;
                (payload > 0.0 && replicas > 0)
                    .then(|| after.saturating_sub(before) as f64 / f64::from(replicas) / payload)
            },
        ),
        // The faults span the probe and warm-up too, as the CPU does.
        minor_faults_per_mb: faults_before.zip(faults_after).and_then(|(before, after)| {
            per_payload_mb(
                after.saturating_sub(before) as f64,
                outcome.producer.messages + outcome.before.messages,
                workload.message_size,
            )
        }),
        node_resident_peak_mb: resident_peak.map(|bytes| bytes as f64 / 1e6),
        baseline,
        consumer,
        timeline: report::timeline(&outcome.timeline, workload.message_size),
        read_back: workload.read_back,
        before_clock: Some(report::BeforeClock {
            waited_for: ready.as_ref().map(|r| r.0.clone()),
            waited_s: ready.as_ref().map_or(0.0, |r| r.1),
            warmup_s: warmup.as_secs_f64(),
            probe_msgs_s: outcome.before.probe_msgs_s,
            unrecorded_messages: outcome.before.messages,
            unrecorded_s: outcome.before.seconds,
        }),
        replica_sends_dropped_not_connected: dropped_before
            .zip(dropped_after)
            .map(|(b, a)| a.saturating_sub(b)),
        checks: Vec::new(),
    };
    let report = Report {
        checks: report::checks(&report),
        ..report
    };
    if let Some(dir) = &args.out {
        report::write(
            dir,
            &report,
            &outcome.producer.latency,
            outcome.consumer.as_ref().map(|c| &c.latency),
        )?;
    }
    Ok(report)
}

fn resolve(address: &str) -> anyhow::Result<SocketAddr> {
    address
        .to_socket_addrs()
        .with_context(|| format!("--address {address}"))?
        .next()
        .with_context(|| format!("--address {address} resolves to nothing"))
}

/// Logs in, learns the replica count if the target says it (GetClusterMetadata), and creates
/// the benchmark's stream and topic.
fn prepare(
    target: &Target,
    args: &RunArgs,
    replicas: Option<u32>,
) -> anyhow::Result<(Layout, Option<u32>)> {
    let mut conn = Connection::connect(
        target.addr,
        Duration::from_secs(10),
        target.congestion.as_ref(),
    )
    .with_context(|| {
        format!(
            "connecting to {} (is the node's client plane serving?)",
            target.addr
        )
    })?;
    conn.login(&target.username, &target.password)
        .with_context(|| format!("logging in to {} as {}", target.addr, target.username))?;
    let replicas = match replicas {
        Some(r) => Some(r),
        None => conn
            .cluster_metadata()
            .ok()
            .map(|m| m.nodes.len() as u32)
            .filter(|n| *n > 0),
    };
    let name = format!("bench-{}-{}", std::process::id(), client::now_us());
    let stream = conn
        .create_stream(&name)
        .with_context(|| format!("creating stream {name}"))?;
    let (topic, partitions) = conn
        .create_topic(stream, "load", args.partitions, args.segment_size)
        .with_context(|| format!("creating topic load with {} partitions", args.partitions))?;
    if conn.foreign_echoes() > 0 {
        note(
            "the node answered a request with another operation than the request's (client-plane.md §1.3 says echo it); accepted as the SDK does, the framing being the same",
        );
    }
    if partitions.len() != args.partitions as usize {
        bail!(
            "asked for {} partitions, the topic has {}",
            args.partitions,
            partitions.len()
        );
    }
    // A partition's group may need a moment after CreateTopic commits: wait until each one
    // answers a poll (which adds nothing), so the load's first sends are not refusals.
    for &partition in &partitions {
        let started = std::time::Instant::now();
        loop {
            let at = client::PollAt {
                stream,
                topic,
                partition,
                offset: 0,
                count: 1,
            };
            match conn.poll(1, at, |_| {}) {
                Ok(_) => break,
                Err(_) if started.elapsed() < READY_BOUND => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "partition {partition} did not answer a poll within {READY_BOUND:?}"
                        )
                    });
                }
            }
        }
    }
    Ok((
        Layout {
            stream,
            topic,
            partitions,
        },
        replicas,
    ))
}

fn note(text: &str) {
    eprintln!("strand bench: {text}");
}

/// Live progress: an indicatif bar on a terminal, a plain line a second otherwise.
fn with_progress<T>(
    terminal: bool,
    workload: &Workload,
    body: impl FnOnce(&mut dyn FnMut(&load::Counters, Duration)) -> T,
) -> T {
    use std::sync::atomic::Ordering;
    let size = workload.message_size as f64;
    let consumers = workload.consumers;
    let line = |c: &load::Counters, t: Duration| {
        let produced = c.produced.load(Ordering::Relaxed);
        let consumed = c.consumed.load(Ordering::Relaxed);
        let secs = t.as_secs_f64().max(1e-9);
        let mut text = format!(
            "{secs:6.1} s  produced {produced} msgs ({:.1} MB/s)",
            produced as f64 * size / 1e6 / secs,
        );
        if consumers > 0 {
            text.push_str(&format!(
                "  consumed {consumed} msgs ({:.1} MB/s)",
                consumed as f64 * size / 1e6 / secs
            ));
        }
        text
    };
    if terminal {
        let bar = match workload.stop {
            Stop::Duration(d) => indicatif::ProgressBar::new(d.as_millis() as u64),
            Stop::Messages(n) => indicatif::ProgressBar::new(n),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {msg}").expect("a valid template"),
        );
        let stop = workload.stop;
        let mut update = |c: &load::Counters, t: Duration| {
            bar.set_position(match stop {
                Stop::Duration(_) => t.as_millis() as u64,
                Stop::Messages(_) => c.produced.load(Ordering::Relaxed),
            });
            bar.set_message(line(c, t));
        };
        let result = body(&mut update);
        bar.finish();
        result
    } else {
        let mut last = Duration::ZERO;
        let mut update = |c: &load::Counters, t: Duration| {
            if t >= last + Duration::from_secs(1) {
                last = t;
                eprintln!("strand bench: {}", line(c, t));
            }
        };
        body(&mut update)
    }
}

/// Whether a `--spawn` run measures the chain with no server in it (decision 516): as fast
/// as acknowledgements allow, in batches, unless `--no-chain-probe`.
fn runs_chain_probe(args: &RunArgs) -> bool {
    args.rate.is_none() && args.batch > 1 && !args.no_chain_probe
}

fn baseline_line(b: &baseline::Baseline) -> String {
    let opt = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}"));
    format!(
        "baseline: loopback {:.1} MB/s, rtt p50 {:.1} us p99 {:.1} us, disk {} MB/s ({}), \
         fdatasync p50 {} us, disk read {} MB/s, at {} bytes per write, TCP congestion \
         control {} (the run's sockets: {})",
        b.loopback_mb_s,
        b.rtt_us_p50,
        b.rtt_us_p99,
        opt(b.disk_write_mb_s),
        match b.disk_direct_io {
            Some(true) => "O_DIRECT",
            Some(false) => "page cache, O_DIRECT refused",
            None => "not measured",
        },
        opt(b.fdatasync_us_p50),
        opt(b.disk_read_mb_s),
        b.write_size,
        b.tcp_congestion_control.as_deref().unwrap_or("unknown"),
        b.socket_congestion_control
            .as_deref()
            .unwrap_or("the kernel's default")
    ) + &b.chain_writes.as_ref().map_or_else(String::new, |c| {
        format!(
            "; a quorum ({} of {}) of one batch's copies durable, writers {:.0} us apart: p50 \
             {:.0} us appending, {:.0} us over written blocks ({} rounds)",
            c.quorum,
            c.writers,
            c.stagger_us,
            c.append_quorum_us_p50,
            c.overwrite_quorum_us_p50,
            c.rounds
        )
    }) + &b.chain_load.as_ref().map_or_else(String::new, |c| {
        if c.replicas == 1 {
            return format!(
                "; with no server, {} producer(s): one node {:.0} batches/s",
                c.producers, c.single_batches_s
            );
        }
        format!(
            "; with no server, {} producer(s): a chain of {} nodes {:.0} batches/s, one node \
             {:.0} ({:.3}x)",
            c.producers, c.replicas, c.chain_batches_s, c.single_batches_s, c.ratio
        )
    })
}

/// The nodes' CPU seconds per GB of payload acknowledged over the span the CPU was measured
/// over: the `recorded` messages and those `before` the clock (`None` without payload).
fn cpu_per_gb(
    cpu_s: f64,
    recorded: u64,
    before: &load::Before,
    message_size: usize,
) -> Option<f64> {
    per_payload_mb(cpu_s, recorded + before.messages, message_size).map(|per_mb| per_mb * 1e3)
}

/// `count` per MB (10^6 B) of the payload of `messages` messages; `None` without payload.
fn per_payload_mb(count: f64, messages: u64, message_size: usize) -> Option<f64> {
    let mb = messages as f64 * message_size as f64 / 1e6;
    (mb > 0.0).then(|| count / mb)
}

/// The end-of-run summary.
pub fn summary(r: &Report, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let opt = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}"));
    writeln!(
        out,
        "strand bench {}: {} replica(s), acked {}, {} producer(s), {} consumer(s), {} partition(s), {} x {} B",
        r.commit,
        r.replicas
            .map_or_else(|| "?".to_string(), |n| n.to_string()),
        r.acked,
        r.producers,
        r.consumers,
        r.partitions,
        r.batch,
        r.message_size
    )?;
    if r.invariant_sweep {
        writeln!(
            out,
            "warning: this build runs the consensus core's invariant sweep after every step (a \
             debug build, or `consensus/invariants` pulled in by the `tests` package): its figures \
             are not the server's; build with `cargo build --release -p server`"
        )?;
    }
    writeln!(
        out,
        "{}; ceiling {} MB/s",
        baseline_line(&r.baseline),
        opt(r.ceiling_mb_s)
    )?;
    let lat = |l: &Latency| {
        format!(
            "p50 {} p90 {} p99 {} p99.9 {} max {} us",
            l.p50, l.p90, l.p99, l.p999, l.max
        )
    };
    writeln!(
        out,
        "producers: {} msgs in {:.2} s, {:.0} msgs/s, {:.1} MB/s (ratio to ceiling {}, to loopback {:.3}); per batch {}",
        r.messages,
        r.duration_s,
        r.throughput_msgs_s,
        r.throughput_mb_s,
        r.ratio_to_ceiling
            .map_or_else(|| "n/a".to_string(), |v| format!("{v:.3}")),
        r.ratio_to_loopback,
        lat(&r.latency_us)
    )?;
    if let Some(cpu) = r.cpu_s_per_gb {
        writeln!(out, "nodes' CPU: {cpu:.2} s per GB acknowledged")?;
    }
    if let Some(faults) = r.minor_faults_per_mb {
        let peak = r.node_resident_peak_mb.map_or_else(String::new, |mb| {
            format!("; largest node peak {mb:.0} MB resident")
        });
        writeln!(
            out,
            "nodes' memory: {faults:.1} minor page faults per MB acknowledged (pages touched \
             fresh){peak}"
        )?;
    }
    if let Some(b) = r.disk_bytes_per_payload_byte {
        let cap = report::disk_cap_ratio(r).map_or_else(String::new, |cap| {
            format!("; at the disk probe's bandwidth that caps ratio_to_ceiling at {cap:.3}")
        });
        writeln!(
            out,
            "nodes' writes: {b:.2} bytes per payload byte per node{cap}"
        )?;
    }
    if let Some(c) = &r.consumer {
        writeln!(
            out,
            "consumers{}: {} msgs, {:.0} msgs/s, {:.1} MB/s (ratio to loopback {:.3}); {} {}",
            if r.read_back { " (read back)" } else { "" },
            c.messages,
            c.throughput_msgs_s,
            c.throughput_mb_s,
            c.ratio_to_loopback,
            if c.latency_kind == report::PER_POLL {
                format!("per poll of up to {} msgs", c.poll_batch)
            } else {
                "end to end per batch".to_string()
            },
            lat(&c.latency_us)
        )?;
    }
    if let Some(b) = &r.before_clock {
        let mut text = String::from("before the clock: ");
        if let Some(what) = &b.waited_for {
            text.push_str(&format!("waited {:.2} s for {what}; ", b.waited_s));
        }
        if let Some(max) = b.probe_msgs_s {
            text.push_str(&format!("probe {max:.0} msgs/s; "));
        }
        text.push_str(&format!(
            "warm-up {:.1} s; {} msgs in {:.2} s not recorded",
            b.warmup_s, b.unrecorded_messages, b.unrecorded_s
        ));
        if let Some(rate) = r.rate_msgs_s {
            text.push_str(&format!("; load at {rate:.0} msgs/s"));
        }
        writeln!(out, "{text}")?;
    }
    if let Some(d) = r.replica_sends_dropped_not_connected {
        writeln!(
            out,
            "replica sends dropped as not connected during the load: {d}"
        )?;
    }
    for c in &r.checks {
        writeln!(out, "{}", report::check_line(c))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
