//! Same-run baselines (issue 12 item 2, decision 182): loopback TCP bandwidth at the batch
//! size, a small-message round trip, and in the data directory the synced sequential write
//! bandwidth at the batch size (`O_DIRECT` + `fdatasync` per write) with the `fdatasync`
//! latency. Each probe is bounded in time and bytes; none asserts anything about speed.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use shard::net::CongestionControl;
use shard::net::socket::{std_connect, std_listener};

/// The baselines of one run (the report's `baseline` object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// Loopback TCP bandwidth, MB/s (10^6 bytes), writes of `write_size` bytes.
    pub loopback_mb_s: f64,
    /// Round trip of a 64-byte message on one loopback connection, p50 (µs).
    pub rtt_us_p50: f64,
    /// The same, p99 (µs).
    pub rtt_us_p99: f64,
    /// Synced sequential write bandwidth in the data directory, MB/s (`null` without a data
    /// directory, that is against `--address`).
    pub disk_write_mb_s: Option<f64>,
    /// `fdatasync` after one such write, p50 (µs).
    pub fdatasync_us_p50: Option<f64>,
    /// Sequential read bandwidth of what the write probe wrote, read back at the same size
    /// (`O_DIRECT` where the write was), MB/s; what a poll from the segments can get from the
    /// disk (decision 413). `null` without a data directory, and in reports older than it.
    #[serde(default)]
    pub disk_read_mb_s: Option<f64>,
    /// Whether the disk probe opened with `O_DIRECT` (tmpfs refuses it; then the page cache
    /// carries the writes and every one is still `fdatasync`ed).
    pub disk_direct_io: Option<bool>,
    /// Bytes per write of the loopback and disk probes (the SendMessages frame of one batch;
    /// the disk probe rounds it up to 4096).
    pub write_size: usize,
    /// The kernel's default TCP congestion control when the probes ran
    /// (`/proc/sys/net/ipv4/tcp_congestion_control`), which every connection of the run,
    /// probes, harness and nodes, starts with. It moves the loopback figures: on the
    /// development machine `bbr` carried 2.5-3.4 GB/s where `cubic` carried 5.3-8.5 (decision
    /// 500). `null` where the file cannot be read, and in reports older than it.
    #[serde(default)]
    pub tcp_congestion_control: Option<String>,
    /// The congestion control `--tcp-congestion` set on every socket of the run (probes,
    /// harness, spawned nodes) before it connected or listened; `null` when the run's sockets
    /// kept the kernel's default, and in reports older than decision 501.
    #[serde(default)]
    pub socket_congestion_control: Option<String>,
    /// How fast a quorum's copies of one batch reach the one disk every spawned node writes
    /// to ([`chain_writes`]); measured for a fixed load (`--rate`) with `--spawn`, else `null`
    /// (and in reports older than decision 509).
    #[serde(default)]
    pub chain_writes: Option<ChainWrites>,
    /// A chain of as many nodes as the run has replicas with no server in it, and one such
    /// node alone, under the run's producers ([`chain_load`](super::chain_load::chain_load),
    /// decision 516): measured with `--spawn` runs of batches as fast as acknowledgements
    /// allow, else `null` (and in reports older than it).
    #[serde(default)]
    pub chain_load: Option<super::chain_load::ChainLoad>,
}

/// Where the probes listen: loopback, a port of the kernel's choosing.
pub(super) const LOCALHOST_ANY_PORT: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// A probe's connect to its own listener is answered at once; this only bounds a broken one.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where Linux shows the default TCP congestion control.
pub const CONGESTION_CONTROL_PATH: &str = "/proc/sys/net/ipv4/tcp_congestion_control";

/// The congestion control named in `path` (one word and a newline), `None` when it cannot be
/// read or names nothing.
pub fn congestion_control(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let name = text.trim();
    (!name.is_empty() && !name.contains(char::is_whitespace)).then(|| name.to_string())
}

/// How long each bandwidth probe runs, and the round-trip count.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Time per bandwidth probe.
    pub time: Duration,
    /// Round trips measured.
    pub round_trips: u32,
    /// At most this many bytes written by the disk probe.
    pub disk_bytes_max: u64,
}

impl Budget {
    /// One second per probe, 2000 round trips, at most 2 GiB on disk.
    pub fn standard(time: Duration) -> Budget {
        Budget {
            time,
            round_trips: 2000,
            disk_bytes_max: 2 << 30,
        }
    }
}

/// Runs every probe: the disk one only when `data_dir` is given.
pub fn measure(
    write_size: usize,
    data_dir: Option<&Path>,
    budget: Budget,
    congestion: Option<&CongestionControl>,
) -> std::io::Result<Baseline> {
    let loopback_mb_s = loopback(write_size, budget.time, congestion)?;
    let (rtt_us_p50, rtt_us_p99) = round_trip(64, budget.round_trips, congestion)?;
    let disk = match data_dir {
        Some(dir) => Some(disk(dir, write_size, budget)?),
        None => None,
    };
    Ok(Baseline {
        loopback_mb_s,
        rtt_us_p50,
        rtt_us_p99,
        disk_write_mb_s: disk.as_ref().map(|d| d.write_mb_s),
        fdatasync_us_p50: disk.as_ref().map(|d| d.fdatasync_us_p50),
        disk_read_mb_s: disk.as_ref().map(|d| d.read_mb_s),
        disk_direct_io: disk.as_ref().map(|d| d.direct_io),
        write_size,
        tcp_congestion_control: congestion_control(Path::new(CONGESTION_CONTROL_PATH)),
        socket_congestion_control: congestion.map(|c| c.name().to_string()),
        chain_writes: None,
        chain_load: None,
    })
}

/// Loopback TCP bandwidth: one connection, writes of `chunk` bytes for `time`, MB/s counted
/// from the first write to the receiver's end of stream; both ends under `congestion` when
/// given.
pub fn loopback(
    chunk: usize,
    time: Duration,
    congestion: Option<&CongestionControl>,
) -> std::io::Result<f64> {
    let listener = std_listener(LOCALHOST_ANY_PORT, congestion)?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || -> std::io::Result<(u64, Instant)> {
        let (mut stream, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match stream.read(&mut buf)? {
                0 => return Ok((total, Instant::now())),
                n => total += n as u64,
            }
        }
    });
    let mut stream = std_connect(addr, CONNECT_TIMEOUT, congestion)?;
    stream.set_nodelay(true)?;
    let data = vec![0x5au8; chunk.max(1)];
    let started = Instant::now();
    while started.elapsed() < time {
        stream.write_all(&data)?;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    let (total, ended) = receiver
        .join()
        .map_err(|_| std::io::Error::other("loopback receiver panicked"))??;
    Ok(mb_per_s(total, ended - started))
}

/// Round trip of `size`-byte messages echoed on one loopback connection: (p50, p99) in µs;
/// both ends under `congestion` when given.
pub fn round_trip(
    size: usize,
    count: u32,
    congestion: Option<&CongestionControl>,
) -> std::io::Result<(f64, f64)> {
    let listener = std_listener(LOCALHOST_ANY_PORT, congestion)?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        loop {
            match stream.read_exact(&mut buf) {
                Ok(()) => stream.write_all(&buf)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut stream = std_connect(addr, CONNECT_TIMEOUT, congestion)?;
    stream.set_nodelay(true)?;
    let mut buf = vec![1u8; size];
    let mut histogram = nanos_histogram();
    for _ in 0..count.max(1) {
        let started = Instant::now();
        stream.write_all(&buf)?;
        stream.read_exact(&mut buf)?;
        histogram.saturating_record(started.elapsed().as_nanos() as u64);
    }
    drop(stream);
    echo.join()
        .map_err(|_| std::io::Error::other("echo thread panicked"))??;
    Ok((
        histogram.value_at_quantile(0.5) as f64 / 1000.0,
        histogram.value_at_quantile(0.99) as f64 / 1000.0,
    ))
}

/// What the disk probe measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskProbe {
    /// MB/s over write + `fdatasync` pairs.
    pub write_mb_s: f64,
    /// `fdatasync` p50, µs.
    pub fdatasync_us_p50: f64,
    /// MB/s reading the written bytes back in order, at the same size and open mode.
    pub read_mb_s: f64,
    /// Opened with `O_DIRECT`.
    pub direct_io: bool,
    /// Writes made.
    pub writes: u64,
}

/// The direct-I/O alignment the probe uses (the logical block of any disk here divides it).
pub(super) const ALIGN: usize = 4096;

/// Sequential writes of `write_size` (rounded up to 4096) bytes to a new file in `dir`, each
/// followed by `fdatasync`, for `budget.time` or `budget.disk_bytes_max` bytes (at least 4
/// writes); then the same bytes read back in order at the same size, for at most
/// `budget.time`; the file is removed after.
pub fn disk(dir: &Path, write_size: usize, budget: Budget) -> std::io::Result<DiskProbe> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(".strand-bench-disk-probe");
    let (mut file, direct_io) = create_probe_file(&path)?;
    let size = write_size.max(1).div_ceil(ALIGN) * ALIGN;
    let mut backing = aligned_pattern(size, 253);
    let skip = backing.as_ptr().align_offset(ALIGN);
    let buf = &mut backing[skip..skip + size];
    let mut syncs = nanos_histogram();
    let mut written = 0u64;
    let mut writes = 0u64;
    let started = Instant::now();
    let result = (|| -> std::io::Result<()> {
        while writes < 4
            || (started.elapsed() < budget.time && written + size as u64 <= budget.disk_bytes_max)
        {
            file.write_all(buf)?;
            let synced = Instant::now();
            file.sync_data()?;
            syncs.saturating_record(synced.elapsed().as_nanos() as u64);
            written += size as u64;
            writes += 1;
        }
        Ok(())
    })();
    let elapsed = started.elapsed();
    drop(file);
    let read = result.and_then(|()| read_back(&path, buf, written, budget.time, direct_io));
    let _ = std::fs::remove_file(&path);
    let read_mb_s = read?;
    Ok(DiskProbe {
        write_mb_s: mb_per_s(written, elapsed),
        fdatasync_us_p50: syncs.value_at_quantile(0.5) as f64 / 1000.0,
        read_mb_s,
        direct_io,
        writes,
    })
}

/// What [`chain_writes`] measured: one batch's copies written by as many writers as the
/// cluster has replicas, each starting when the chain would hand it the batch (decision 509).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainWrites {
    /// Writers, one per replica, each with a file of its own in the data directory.
    pub writers: u32,
    /// Copies that make a batch durable on a quorum of the replicas.
    pub quorum: u32,
    /// Writer `i` starts `i` times this after the first (µs): the batch's loopback transfer
    /// time, the store-and-forward hop of the chain.
    pub stagger_us: f64,
    /// Rounds measured of each kind (the fewer of the two).
    pub rounds: u32,
    /// p50 over rounds of the time from the first writer's start until `quorum` writers had
    /// their write + `fdatasync` return, each appending to its file as segments are written
    /// (µs).
    pub append_quorum_us_p50: f64,
    /// The same, each writing over blocks its file already had written and synced: no block
    /// allocation and no file size to commit (µs).
    pub overwrite_quorum_us_p50: f64,
}

/// The most rounds [`chain_writes`] runs of each kind.
const CHAIN_ROUNDS_MAX: u64 = 100;

/// The disk idles this long between two rounds, so that each round finds it as a batch of a
/// moderate load does: with nothing of the last round still going.
const CHAIN_ROUND_GAP: Duration = Duration::from_millis(3);

/// Rounds in which `writers` threads each write one `write_size` buffer (rounded up to 4096)
/// and `fdatasync` it, to files of their own in `dir` (`O_DIRECT` where the file system takes
/// it), writer `i` starting `i x stagger` after the first, as a chain of replicas passes a
/// batch on; first appending (the files grow, as segments do), then over blocks written and
/// synced before the rounds. At most `CHAIN_ROUNDS_MAX` rounds of each kind, fewer when
/// they would write more than `budget.disk_bytes_max` or outlast `budget.time`; at least 5.
/// The files are removed after.
///
/// A batch of a fixed moderate load is acknowledged once a quorum of replicas has it
/// durable, and every replica of a local cluster writes to this one disk; so the quorum's
/// time here, plus the batch's first loopback transfer, is the least p50 such a run can show
/// (the fixed-load p50 check's limit).
pub fn chain_writes(
    dir: &Path,
    write_size: usize,
    writers: u32,
    stagger: Duration,
    budget: Budget,
) -> std::io::Result<ChainWrites> {
    let writers = writers.max(1);
    let quorum = writers / 2 + 1;
    let size = write_size.max(1).div_ceil(ALIGN) * ALIGN;
    let per_round = size as u64 * u64::from(writers);
    let rounds = (budget.disk_bytes_max / 2 / per_round).clamp(5, CHAIN_ROUNDS_MAX) as usize;
    let append = chain_rounds(dir, size, writers, stagger, rounds, budget.time, false)?;
    let overwrite = chain_rounds(dir, size, writers, stagger, rounds, budget.time, true)?;
    let measured = append.len().min(overwrite.len());
    let quorum_p50 = |times: Vec<Vec<Duration>>| -> std::io::Result<f64> {
        let mut per_round: Vec<Duration> = times
            .into_iter()
            .map(|mut round| {
                round.sort();
                round[quorum as usize - 1]
            })
            .collect();
        per_round.sort();
        per_round
            .get(per_round.len() / 2)
            .map(|p50| p50.as_secs_f64() * 1e6)
            .ok_or_else(|| std::io::Error::other("the chain probe completed no round"))
    };
    Ok(ChainWrites {
        writers,
        quorum,
        stagger_us: stagger.as_secs_f64() * 1e6,
        rounds: measured as u32,
        append_quorum_us_p50: quorum_p50(append)?,
        overwrite_quorum_us_p50: quorum_p50(overwrite)?,
    })
}

/// One kind of [`chain_writes`]' rounds: per round, every writer's time from the round's
/// start to its `fdatasync` returning. Rounds stop early (at least 5 run) past `time`.
fn chain_rounds(
    dir: &Path,
    size: usize,
    writers: u32,
    stagger: Duration,
    rounds: usize,
    time: Duration,
    overwrite: bool,
) -> std::io::Result<Vec<Vec<Duration>>> {
    use std::os::unix::fs::FileExt;
    use std::sync::{Barrier, Mutex};
    std::fs::create_dir_all(dir)?;
    let n = writers as usize;
    let barrier = Barrier::new(n);
    // Round `r`'s start, or `None` once the rounds are over; set by writer 0 between barriers.
    let start: Mutex<Option<Instant>> = Mutex::new(None);
    let times: Mutex<Vec<Vec<Duration>>> = Mutex::new(Vec::new());
    let begun = Instant::now();
    let results: Vec<std::io::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, start, times) = (&barrier, &start, &times);
                scope.spawn(move || -> std::io::Result<()> {
                    let path = dir.join(format!(".strand-bench-chain-{i}"));
                    // A writer that fails goes on meeting the barriers (without writing), so
                    // the others are never left waiting; its error is returned at the end.
                    let mut failed = None;
                    let mut backing = aligned_pattern(size, 251);
                    let skip = backing.as_ptr().align_offset(ALIGN);
                    let buf = &mut backing[skip..skip + size];
                    let file = match create_probe_file(&path) {
                        Ok((file, _)) => Some(file),
                        Err(e) => {
                            failed = Some(e);
                            None
                        }
                    };
                    if overwrite && let Some(file) = &file {
                        let written = (0..rounds)
                            .try_for_each(|r| file.write_all_at(buf, (r * size) as u64))
                            .and_then(|()| file.sync_data());
                        if let Err(e) = written {
                            failed = Some(e);
                        }
                    }
                    for round in 0..rounds {
                        barrier.wait();
                        if i == 0 {
                            let over = round >= 5 && begun.elapsed() > time;
                            *start.lock().expect("not poisoned") = (!over).then(Instant::now);
                        }
                        barrier.wait();
                        let Some(at) = *start.lock().expect("not poisoned") else {
                            break;
                        };
                        let due = at + stagger * i as u32;
                        while Instant::now() < due {
                            std::hint::spin_loop();
                        }
                        let took = match (&file, failed.is_none()) {
                            (Some(file), true) => {
                                match file
                                    .write_all_at(buf, (round * size) as u64)
                                    .and_then(|()| file.sync_data())
                                {
                                    Ok(()) => at.elapsed(),
                                    Err(e) => {
                                        failed = Some(e);
                                        Duration::ZERO
                                    }
                                }
                            }
                            _ => Duration::ZERO,
                        };
                        {
                            let mut times = times.lock().expect("not poisoned");
                            if times.len() <= round {
                                times.resize(round + 1, Vec::new());
                            }
                            times[round].push(took);
                        }
                        barrier.wait();
                        if i == 0 {
                            std::thread::sleep(CHAIN_ROUND_GAP);
                        }
                    }
                    drop(file);
                    let _ = std::fs::remove_file(&path);
                    failed.map_or(Ok(()), Err)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a chain writer panicked"))
            .collect()
    });
    results.into_iter().collect::<std::io::Result<()>>()?;
    Ok(times
        .into_inner()
        .expect("not poisoned")
        .into_iter()
        .filter(|round| round.len() == n)
        .collect())
}

/// Creates (or truncates) a probe's file at `path` for writing, with `O_DIRECT` where the file
/// system takes it (tmpfs refuses it): the file and whether it is direct.
fn create_probe_file(path: &Path) -> std::io::Result<(std::fs::File, bool)> {
    create_probe_file_with(path, 0)
}

/// [`create_probe_file`] with `flags` (such as `O_DSYNC`) besides.
pub(super) fn create_probe_file_with(
    path: &Path,
    flags: i32,
) -> std::io::Result<(std::fs::File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags| {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_DIRECT | flags) {
        Ok(file) => Ok((file, true)),
        Err(_) => Ok((open(flags)?, false)),
    }
}

/// A buffer of `size + ALIGN` bytes whose aligned window of `size` bytes (from
/// `as_ptr().align_offset(ALIGN)`) holds the byte pattern `i % modulus`: `O_DIRECT` needs the
/// address aligned, and this gets it without unsafe.
fn aligned_pattern(size: usize, modulus: usize) -> Vec<u8> {
    let mut backing = vec![0u8; size + ALIGN];
    let skip = backing.as_ptr().align_offset(ALIGN);
    backing[skip..skip + size]
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % modulus) as u8);
    backing
}

/// Reads the first `written` bytes of `path` in order, `buf.len()` at a time (with `O_DIRECT`
/// when `direct_io`; `buf` is aligned for it), for at most `time` (at least one read): MB/s.
fn read_back(
    path: &Path,
    buf: &mut [u8],
    written: u64,
    time: Duration,
    direct_io: bool,
) -> std::io::Result<f64> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(if direct_io { libc::O_DIRECT } else { 0 })
        .open(path)?;
    let mut read = 0u64;
    let started = Instant::now();
    while read + buf.len() as u64 <= written && (read == 0 || started.elapsed() < time) {
        file.read_exact(buf)?;
        read += buf.len() as u64;
    }
    Ok(mb_per_s(read, started.elapsed()))
}

fn nanos_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// Bytes over time in MB/s (10^6 bytes).
pub fn mb_per_s(bytes: u64, time: Duration) -> f64 {
    let secs = time.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        bytes as f64 / 1e6 / secs
    }
}

/// The ceiling of issue 12 item 2: every user byte crosses loopback R times and is written R
/// times to the same disk, so min(loopback, disk) / R; without a disk figure, loopback / R.
pub fn ceiling_mb_s(baseline: &Baseline, replicas: Option<u32>) -> Option<f64> {
    let replicas = f64::from(replicas.filter(|r| *r > 0)?);
    let floor = match baseline.disk_write_mb_s {
        Some(disk) => baseline.loopback_mb_s.min(disk),
        None => baseline.loopback_mb_s,
    };
    Some(floor / replicas)
}
