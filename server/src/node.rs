//! `strand start` and `strand dev`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode};
use std::rc::Rc;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::Context;
use journal::FileStorage;
use journal::dma::DmaStorage;
use server::boot::{self, MetadataBoot, Stamp};
use server::client_core::{self, ClientCore, NodeInfo};
use server::metadata::view::MetadataHandle;
use server::metadata::{Genesis, MetadataStateMachine, password::HashParams};
use server::metadata_group::{self as metadata, Inbox, MetadataSink, Outcome, Pump};
use server::metrics::{self, Gauges, Sources};
use server::partition_group::{self as partitions, PartitionGauges};
use server::routing::ShardSink;
use server::shard_msg::ShardMsg;
use shard::net::plane::NodeShared;
use shard::net::{Counters, NetConfig, Plane, Sink};
use shard::{Lane, MeshCapacity, Runtime, RuntimeConfig, ShardContext, Sharding};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{error, info, warn};

use crate::{DevArgs, StartArgs};
use server::config::{self, Config, Overrides};
use server::wiring;

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`); glommio's own `log` records are
/// forwarded too (its buffer-registration warning among them).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn load(args: &StartArgs) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let mut overrides =
        Overrides::from_environment(args.replica_id).context("reading the allowed CPUs")?;
    overrides.cores = args.cores.clone();
    overrides.shards = args.shards;
    overrides.data_dir = args.data_dir.clone();
    config::load(&text, &overrides).with_context(|| format!("in {}", args.config.display()))
}

/// Starts faulting in `system.memory_prefault_bytes` (at most half the memory available) on a
/// thread of its own, so the caches grow into pages the node has (decision 512) while the node
/// boots and serves (decision 513). The progress is `strand_memory_prefault_pending_bytes`.
fn prefault(wanted: u64) -> Arc<server::memory::Prefault> {
    let progress = Arc::new(server::memory::Prefault::default());
    if wanted == 0 {
        return progress;
    }
    let budget = server::memory::prefault_budget(wanted, server::memory::available_bytes());
    if budget < wanted {
        warn!(
            wanted,
            bytes = budget,
            "system.memory_prefault_bytes is above half the memory available: prefaulting less"
        );
    }
    let started = server::memory::prefault_in_background(budget, progress.clone(), |done| {
        info!(
            bytes = done.bytes,
            took_ms = done.took.as_millis() as u64,
            "memory prefaulted for the caches"
        );
    });
    match started {
        Ok(_) => info!(bytes = budget, "memory prefault started in the background"),
        Err(e) => warn!(error = %e, "memory prefault not started: no thread for it"),
    }
    progress
}

/// `strand start`: validate, check or format the data directory, boot the shards with the
/// replica plane on `tcp_replica` and the metadata replica on shard 0, serve `/metrics` on the
/// `http` port, then run until SIGTERM/SIGINT (drain, exit 0) or a fatal failure (exit
/// [`server::EXIT_FATAL`]).
pub fn start(args: StartArgs) -> anyhow::Result<ExitCode> {
    // Before any thread exists: a thread that allocated already has its arena.
    let allocator = server::memory::keep_freed_memory();
    init_logging();
    match allocator {
        Ok(()) => info!("allocator: one arena, freed memory kept for reuse (decision 512)"),
        Err(e) => warn!(error = %e, "allocator: freed memory may go back to the kernel"),
    }
    let config = load(&args)?;
    let prefaulting = prefault(config.system.memory_prefault_bytes);
    // Registered before any shard exists, so an early signal stops the node cleanly instead of
    // killing it.
    let signals = Signals::new([SIGTERM, SIGINT]).context("installing signal handlers")?;
    let (soft, hard) = shard::runtime::raise_memlock_limit().context("reading RLIMIT_MEMLOCK")?;
    // A name the kernel does not have (or does not allow) stops the node here, before any
    // socket: a listener would fail later with a less clear error, a dial every second.
    if let Some(congestion) = &config.network.tcp_congestion_control {
        congestion
            .check()
            .context("config key `network.tcp_congestion_control`")?;
    }
    let node = config.node().clone();
    if consensus::INVARIANT_SWEEP && !cfg!(debug_assertions) {
        warn!(
            "this release build runs the consensus core's invariant sweep after every step \
             (feature consensus/invariants, pulled in by building the tests package with it): \
             slower; build the server with `cargo build --release -p server`"
        );
    }
    let sharding = match &config.system.sharding {
        Sharding::Pinned(cores) => format!("{} pinned on cores {cores}", cores.len()),
        Sharding::Unpinned(n) => format!("{n} unpinned"),
    };
    info!(
        replica = config.replica_id,
        name = %node.name,
        cluster = %config.cluster.name,
        replicas = config.cluster.nodes.len(),
        shards = %sharding,
        lanes = config.cluster.replica_lanes,
        tcp_congestion_control = config
            .network
            .tcp_congestion_control
            .as_ref()
            .map_or("kernel default", |c| c.name()),
        data_dir = %config.system.path.display(),
        memlock_soft = soft,
        memlock_hard = hard,
        "config valid"
    );
    let data = config.system.path.clone();
    let stamp = Stamp {
        cluster_name: config.cluster.name.clone(),
        cluster_id: wire::cluster_id(&config.cluster.name),
        replica_id: config.replica_id,
        replica_count: u8::try_from(config.cluster.nodes.len()).context("roster size")?,
        layout: boot::ShardLayout {
            shards: u16::try_from(config.system.sharding.shards()).context("shard count")?,
            replica_lanes: config.cluster.replica_lanes,
        },
        rejoin: args.rejoin,
    };
    if args.rejoin {
        boot::check_rejoin(&data)?;
        warn!(data_dir = %data.display(), "--rejoin: formatting as a replica that lost its state (decision 191)");
    }
    if boot::check_or_format(&data, &stamp)? {
        info!(data_dir = %data.display(), "formatted a fresh data directory");
    }
    // Decision 382: the partition WAL's file size is the directory's for its whole life.
    server::wal_size::check_or_record(&data, config.partition.wal_size)?;
    // Decision 240: the stamp, durable before any group boots, says whether this directory is
    // a rejoin; `--rejoin` only wrote it.
    let rejoin = boot::stamp_records_rejoin(&data)?;
    if rejoin {
        warn!(data_dir = %data.display(), "the stamp records a rejoin: groups without a superblock boot in lost state (decision 240)");
    }
    let shards = config.system.sharding.shards();
    let net = Arc::new(wiring::net_config(&config)?);
    net.validate(shards)
        .map_err(|e| anyhow::anyhow!("the replica plane's config: {e}"))?;
    let consensus_config = wiring::metadata_config(&config)?;
    let partition_config = wiring::partition_config(&config)?;
    let lanes = config.cluster.replica_lanes;
    let ack_overrides: partitions::AckOverrides = config
        .partition
        .topic_ack
        .iter()
        .map(|(key, ack)| (key.clone(), *ack == config::Ack::Memory))
        .collect();
    let partition_gauges: Arc<Vec<Arc<PartitionGauges>>> = Arc::new(
        (0..shards)
            .map(|_| Arc::new(PartitionGauges::default()))
            .collect(),
    );
    let runtime_config = RuntimeConfig {
        sharding: config.system.sharding.clone(),
        io_memory: config.system.io_memory,
        ring_depth: config.system.ring_depth,
        mesh: MeshCapacity {
            main: config.system.inbox_capacity,
            reply: config.system.reply_inbox_capacity,
        },
        stop_poll_interval: config.system.shutdown_poll_interval,
    };
    let gauges = Arc::new(Gauges::default());
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(usize, Arc<Counters>), String>>();
    let ready_tx = Arc::new(Mutex::new(ready_tx));
    let fatal: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    record_panics_as_fatal(fatal.clone());
    let shared = NodeShared::default();
    let listen = SocketAddr::new(node.ip, node.ports.tcp_replica);
    let close_bound = config.message_bus.close_peer_timeout;
    let slots = config.metadata.journal_slots;
    let superblock_wedged = config.cluster.superblock_wedged_fatal_timeout;
    // The metadata state machine's genesis (the root user) is built here, once, and moves to
    // shard 0 at boot; its read handle goes to every shard (decision 126).
    let machine = MetadataStateMachine::new(&Genesis {
        cluster_id: stamp.cluster_id,
        root: config.metadata.root.clone(),
        params: HashParams::DEFAULT,
    })
    .map_err(|e| anyhow::anyhow!("hashing the root password: {e}"))?;
    let metadata_handle = machine.handle().clone();
    // Partition groups boot only once the metadata replica caught up in this process life
    // (decision 397); shard 0's metadata pump clears this.
    metadata_handle.await_catch_up();
    let client_counters = Arc::new(client_core::Counters::default());
    let node_info = NodeInfo {
        addresses: Arc::default(),
        config: Arc::new(config.clone()),
        reader: machine.reader(),
        gauges: gauges.clone(),
        counters: client_counters.clone(),
        started: std::time::SystemTime::now(),
        partitions: partition_gauges.clone(),
    };
    let machine = Arc::new(Mutex::new(Some(consensus::Buffered::new(machine))));
    let clients = SocketAddr::new(node.ip, node.ports.tcp);
    let test_register_ticks = match std::env::var(metadata::TEST_REGISTER_ENV) {
        Ok(ms) => {
            let ms: u64 = ms.parse().with_context(|| {
                format!("environment variable `{}`", metadata::TEST_REGISTER_ENV)
            })?;
            warn!(
                interval_ms = ms,
                "test hook {} is set: the metadata primary submits its own Register requests",
                metadata::TEST_REGISTER_ENV
            );
            Some((ms / consensus::constants::TICK_MS).max(1))
        }
        Err(_) => None,
    };
    let rejoin_metadata = server::metadata::view::MetadataReader::new(metadata_handle.clone());
    let body = {
        let gauges = gauges.clone();
        let fatal = fatal.clone();
        let data = data.clone();
        let partition_gauges = partition_gauges.clone();
        move |ctx: ShardContext<ShardMsg>| {
            let shard = Shard {
                net: net.clone(),
                shared: shared.clone(),
                gauges: gauges.clone(),
                ready: ready_tx.clone(),
                fatal: fatal.clone(),
                data: data.clone(),
                identity: stamp.identity(),
                consensus: consensus_config.clone(),
                listen,
                close_bound,
                slots,
                test_register_ticks,
                superblock_wedged,
                rejoin,
                machine: machine.clone(),
                metadata_handle: metadata_handle.clone(),
                node_info: node_info.clone(),
                clients,
                partition_core: partition_config.clone(),
                partition_gauges: partition_gauges[usize::from(ctx.id)].clone(),
                // Partition groups follow the committed metadata (decision 165).
                metadata: server::metadata::view::MetadataReader::new(metadata_handle.clone()),
                lanes,
                ack_overrides: ack_overrides.clone(),
            };
            shard.run(ctx)
        }
    };
    let runtime = Runtime::<()>::start(&runtime_config, body).context("starting the shards")?;
    let registered = (0..runtime.stats().shards())
        .filter(|&s| {
            runtime.stats().registration(s as u16) == shard::BufferRegistration::Registered
        })
        .count();
    // Every shard reports its plane (and shard 0 its boot) before the node is ready.
    let mut planes = Vec::new();
    for _ in 0..shards {
        match ready_rx.recv_timeout(BOOT_TIMEOUT) {
            Ok(Ok(plane)) => planes.push(plane),
            Ok(Err(refusal)) => {
                let _ = runtime.stop_and_join(config.system.shutdown_join_timeout);
                return Err(anyhow::anyhow!(refusal));
            }
            Err(_) => {
                let _ = runtime.stop_and_join(config.system.shutdown_join_timeout);
                anyhow::bail!("the shards did not report ready within {BOOT_TIMEOUT:?}");
            }
        }
    }
    // Reports arrive in any order; the endpoint labels each plane with its shard id.
    planes.sort_by_key(|(shard, _)| *shard);
    let metrics_addr = SocketAddr::new(node.ip, node.ports.http);
    let sources = Sources {
        gauges: gauges.clone(),
        planes: planes.into_iter().map(|(_, counters)| counters).collect(),
        clients: Some(client_counters),
        partitions: partition_gauges.to_vec(),
        prefault: prefaulting,
    };
    if let Err(e) = metrics::serve(metrics_addr, sources) {
        let _ = runtime.stop_and_join(config.system.shutdown_join_timeout);
        return Err(anyhow::anyhow!("binding /metrics on {metrics_addr}: {e}"));
    }
    info!(
        shards = runtime.stats().shards(),
        registered_io_buffers = registered,
        replicas = %listen,
        clients = %clients,
        metrics = %format!("http://{metrics_addr}/metrics"),
        "strand node ready; SIGTERM or SIGINT stops it"
    );
    // Decision 290: the stamp's rejoin goes once every group of the old life carries its mark.
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if rejoin {
        let flag = stopping.clone();
        server::rejoin_mark::spawn(server::rejoin_mark::Watcher {
            data: data.clone(),
            gauges: gauges.clone(),
            metadata: rejoin_metadata,
            partitions: partition_gauges.to_vec(),
            lanes,
            stopping: Box::new(move || flag.load(std::sync::atomic::Ordering::Relaxed)),
        })
        .err()
        .inspect(|e| warn!(error = %e, "cannot start the rejoin mark's watcher; the mark stays"));
    }
    let cause = wait_for_stop(signals, &fatal);
    stopping.store(true, std::sync::atomic::Ordering::Relaxed);
    match &cause {
        Stop::Signal(signal) => info!(signal, "stopping"),
        Stop::Fatal(cause) => error!(cause = %cause, "fatal; stopping the node"),
    }
    let joined = runtime.stop_and_join(config.system.shutdown_join_timeout);
    // A fatal report may also arrive while the shards stop.
    let late = fatal.lock().map(|f| f.clone()).unwrap_or(None);
    match (cause, late, joined) {
        (Stop::Fatal(cause), _, _) | (_, Some(cause), _) => {
            error!(cause = %cause, exit = server::EXIT_FATAL, "stopped by a fatal failure");
            Ok(ExitCode::from(server::EXIT_FATAL))
        }
        (_, None, Ok(_)) => {
            info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        (_, None, Err(e)) => {
            error!(error = %e, "shards did not stop cleanly");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Test-only: the shard with this id panics right after it reported ready, so a test can show
/// that a panicking shard stops the whole node (exit [`server::EXIT_FATAL`]) instead of leaving
/// a process that answers `/metrics` while its shard serves nothing.
const TEST_PANIC_SHARD_ENV: &str = "STRAND_TEST_PANIC_SHARD";

/// A panic on any thread (a shard's executor above all: its groups, connections and client
/// core die with it) becomes the node's fatal cause, so the main thread stops the node with
/// exit [`server::EXIT_FATAL`] and a log line naming the panic, instead of running on without
/// that shard. The default hook still prints the panic and its location first. `try_lock`: a
/// panic while the fatal slot is held must not deadlock; the holder is reporting a fatal cause
/// anyway.
fn record_panics_as_fatal(fatal: Arc<Mutex<Option<String>>>) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let thread = std::thread::current();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        // One line, so the log line of the stop names the panic whole.
        let cause = format!(
            "thread {} panicked at {at}: {}",
            thread.name().unwrap_or("unnamed"),
            message.replace('\n', " ")
        );
        if let Ok(mut slot) = fatal.try_lock() {
            slot.get_or_insert(cause);
        }
    }));
}

/// How long `strand start` waits for every shard to bind, boot and report.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// How often the main thread looks for a signal or a fatal report.
const STOP_POLL: Duration = Duration::from_millis(20);

enum Stop {
    Signal(i32),
    Fatal(String),
}

fn wait_for_stop(mut signals: Signals, fatal: &Mutex<Option<String>>) -> Stop {
    loop {
        if let Some(signal) = signals.pending().next() {
            return Stop::Signal(signal);
        }
        if let Some(cause) = fatal.lock().ok().and_then(|f| f.clone()) {
            return Stop::Fatal(cause);
        }
        std::thread::sleep(STOP_POLL);
    }
}

/// Each shard's report: its plane's counters once it serves, or why it refused to boot.
type ReadySender = mpsc::Sender<Result<(usize, Arc<Counters>), String>>;

/// What every shard's body gets (Send + Sync, cloned per shard).
struct Shard {
    net: Arc<NetConfig>,
    shared: NodeShared,
    gauges: Arc<Gauges>,
    ready: Arc<Mutex<ReadySender>>,
    fatal: Arc<Mutex<Option<String>>>,
    data: PathBuf,
    identity: journal::Identity,
    consensus: consensus::Config,
    listen: SocketAddr,
    close_bound: Duration,
    slots: u32,
    test_register_ticks: Option<u64>,
    superblock_wedged: Option<Duration>,
    rejoin: bool,
    /// The metadata state machine, taken by shard 0 at boot.
    machine: Arc<Mutex<Option<consensus::Buffered<MetadataStateMachine>>>>,
    /// Where shard 0's pump publishes committed sessions.
    metadata_handle: Arc<MetadataHandle>,
    /// What every shard's client core shares.
    node_info: NodeInfo,
    /// The client port (`ports.tcp`), bound by every shard.
    clients: SocketAddr,
    partition_core: consensus::RawConfig,
    partition_gauges: Arc<PartitionGauges>,
    metadata: server::metadata::view::MetadataReader,
    lanes: u16,
    ack_overrides: partitions::AckOverrides,
}

impl Shard {
    fn report(&self, result: Result<(usize, Arc<Counters>), String>) {
        if let Ok(tx) = self.ready.lock() {
            let _ = tx.send(result);
        }
    }

    async fn run(self, ctx: ShardContext<ShardMsg>) {
        let id = usize::from(ctx.id);
        let inbox = Rc::new(Inbox::new(self.gauges.clone()));
        let shards = u16::try_from(ctx.shards).expect("shard counts fit u16");
        let host = partitions::Host::new(ctx.id, shards, self.lanes, self.partition_gauges.clone());
        // Partition primaries follow the metadata primary (decision 221).
        let metadata_gauges = self.gauges.clone();
        host.set_metadata_lead(Rc::new(move || metadata_gauges.metadata_lead()));
        // Each partition's in-memory tail (decision 280).
        let cache = self.node_info.config.partition.read_cache_bytes;
        host.set_read_cache_bytes(usize::try_from(cache).unwrap_or(usize::MAX));
        let shard_cache = self.node_info.config.partition.read_cache_shard_bytes;
        host.set_read_cache_shard_bytes(usize::try_from(shard_cache).unwrap_or(usize::MAX));
        host.set_appending_shard_bytes_max(
            self.node_info.config.partition.appending_shard_bytes_max,
        );
        let mesh = Rc::new(ctx.mesh);
        // Frames route by group: metadata, this shard's partition groups, another shard's
        // (forwarded over the mesh), or unknown (decision 166).
        let sink: Rc<dyn Sink> = Rc::new(ShardSink {
            shard: ctx.id,
            metadata: (id == 0).then(|| MetadataSink {
                inbox: inbox.clone(),
            }),
            partitions: host.clone(),
            forward: {
                let mesh = mesh.clone();
                Box::new(move |target, message| mesh.try_send(target, Lane::Main, message).is_ok())
            },
            gauges: self.gauges.clone(),
        });
        let plane = Plane::new(self.net.clone(), id, ctx.shards, self.shared.clone(), sink);
        {
            let mesh = mesh.clone();
            plane.set_handoff(Box::new(move |target, handed| {
                let target = u16::try_from(target).expect("shard ids fit u16");
                mesh.try_send(target, Lane::Main, ShardMsg::Handed(handed))
                    .map_err(|e| match e.body {
                        ShardMsg::Handed(handed) => handed,
                        _ => unreachable!("sent a Handed"),
                    })
            }));
        }
        // The client core of this shard: partition requests go to this shard's partition host
        // (or to the shard that owns the group), whose pump replies through the core's
        // registry.
        let core = {
            let mesh = mesh.clone();
            ClientCore::new(
                ctx.id,
                shards,
                self.node_info.clone(),
                host.clone(),
                Box::new(move |to, lane, message| {
                    mesh.try_send(to, lane, message).map_err(|e| e.body)
                }),
            )
        };
        if id == 0 {
            let inbox = inbox.clone();
            core.set_metadata(Box::new(move |request| inbox.push_request(request)));
        }
        // Shard 0 boots the metadata group first: a refusal stops the node before it listens.
        let metadata = if id == 0 {
            match self.boot_metadata().await {
                Ok(boot) => Some(boot),
                Err(refusal) => {
                    self.report(Err(refusal));
                    return;
                }
            }
        } else {
            None
        };
        if id == 0 {
            match shard::net::socket::listener(self.listen, self.net.congestion.as_ref()) {
                Ok(listener) => plane.serve(listener),
                Err(e) => {
                    self.report(Err(format!(
                        "binding the replica plane on {}: {e}",
                        self.listen
                    )));
                    return;
                }
            }
        }
        // The client listeners run under the replica plane's congestion control too: one
        // `network.tcp_congestion_control` for every socket of the node (decision 501).
        match shard::net::socket::listener(self.clients, self.net.congestion.as_ref()) {
            Ok(listener) => core.serve(listener, ctx.stop.clone()),
            Err(e) => {
                self.report(Err(format!(
                    "binding the client port on {} (shard {id}): {e}",
                    self.clients
                )));
                return;
            }
        }
        plane.start_connector();
        self.report(Ok((id, plane.counters().clone())));
        if std::env::var(TEST_PANIC_SHARD_ENV).is_ok_and(|v| v.parse() == Ok(id)) {
            warn!(
                shard = id,
                "test hook {TEST_PANIC_SHARD_ENV} is set: this shard panics now"
            );
            panic!("test hook {TEST_PANIC_SHARD_ENV}: shard {id} panics after it reported ready");
        }
        let pump = metadata.map(|booted| match booted {
            Booted::Dma(boot) => self.spawn_pump(boot, &plane, &inbox, &ctx.stop, &core),
            Booted::File(boot) => self.spawn_pump(boot, &plane, &inbox, &ctx.stop, &core),
        });
        let partition_pump = self.spawn_partitions(id, &host, &plane, &ctx.stop, &core);
        // The shard's mesh pump: connections handed over by the accepting shard, frames of
        // this shard's groups forwarded by another.
        let mut adopt = Adopt {
            plane: plane.clone(),
            core: core.clone(),
            partitions: host.clone(),
        };
        let stats = shard::pump::run(&mesh, &ctx.stop, &mut adopt).await;
        if let Some(pump) = pump
            && pump.await == Some(Outcome::Stopped)
        {
            info!("metadata replica stopped");
        }
        if let Some(pump) = partition_pump
            && pump.await == Some(partitions::Outcome::Stopped)
        {
            info!(
                shard = id,
                "partition groups stopped; committed data flushed"
            );
        }
        let left = plane.drain(self.close_bound).await;
        info!(
            shard = id,
            ticks = stats.ticks,
            dropped_at_close = left,
            "shard stopped"
        );
    }

    /// Spawns the metadata pump on this executor; a fatal outcome is reported at once (the
    /// main thread stops the node on it).
    fn spawn_pump<S: journal::Storage + 'static>(
        &self,
        boot: MetadataBoot<S, consensus::Buffered<MetadataStateMachine>>,
        plane: &Rc<Plane>,
        inbox: &Rc<Inbox>,
        stop: &shard::StopSignal,
        core: &Rc<ClientCore>,
    ) -> glommio::task::JoinHandle<Outcome> {
        let run = metadata::run(Pump {
            config: self.consensus.clone(),
            boot,
            plane: plane.clone(),
            inbox: inbox.clone(),
            stop: stop.clone(),
            gauges: self.gauges.clone(),
            test_register_ticks: self.test_register_ticks,
            superblock_wedged: self.superblock_wedged,
            replies: Some(core.reply_sink()),
            sessions: Some(self.metadata_handle.clone()),
            dead_node_sessions: self.node_info.config.cluster.dead_node_session_timeout,
        });
        let fatal = self.fatal.clone();
        glommio::spawn_local(async move {
            let outcome = run.await;
            if let Outcome::Fatal(cause) = &outcome
                && let Ok(mut f) = fatal.lock()
            {
                f.get_or_insert(cause.clone());
            }
            outcome
        })
        .detach()
    }

    /// Spawns the shard's partition pump over `DIR/shard-N/{wal,partitions}` (decision 161), on
    /// the DMA backend where `O_DIRECT` opens, else std; a fatal outcome is reported at once.
    fn spawn_partitions(
        &self,
        id: usize,
        host: &Rc<partitions::Host>,
        plane: &Rc<Plane>,
        stop: &shard::StopSignal,
        core: &Rc<ClientCore>,
    ) -> Option<glommio::task::JoinHandle<partitions::Outcome>> {
        let root = self.data.join(format!("shard-{id}"));
        let (wal_dir, part_dir) = (root.join("wal"), root.join("partitions"));
        for dir in [&wal_dir, &part_dir] {
            if let Err(e) = std::fs::create_dir_all(dir) {
                self.fatal_now(format!("creating {}: {e}", dir.display()));
                return None;
            }
        }
        let flag = stop.clone();
        let transport = Rc::new(partitions::PlaneTransport {
            plane: plane.clone(),
            lanes: self.lanes,
        });
        // SendMessages replies leave in their raw client-plane form (decision 211).
        let replies: Rc<dyn server::groups::ReplySink> =
            Rc::new(server::partition::machine::ClientReplies(core.reply_sink()));
        let identity = self.identity;
        macro_rules! pump {
            ($wal:expr, $parts:expr) => {
                partitions::run(partitions::Pump {
                    host: host.clone(),
                    core: self.partition_core.clone(),
                    identity,
                    disk: partitions::ShardDisk {
                        partitions: $parts,
                        wal: $wal,
                    },
                    wal: journal::wal::WalConfig {
                        file_size_max: self.node_info.config.partition.wal_size,
                        ..journal::wal::WalConfig::default()
                    },
                    metadata: self.metadata.clone(),
                    transport,
                    replies,
                    stop: Box::new(move || flag.is_set()),
                    limits: partitions::ReclaimLimits::default(),
                    ack_overrides: self.ack_overrides.clone(),
                    rejoin: self.rejoin,
                })
            };
        }
        let outcome: std::pin::Pin<Box<dyn std::future::Future<Output = partitions::Outcome>>> =
            if direct_io_works(&wal_dir) && direct_io_works(&part_dir) {
                match (DmaStorage::new(&wal_dir), DmaStorage::new(&part_dir)) {
                    (Ok(w), Ok(p)) => Box::pin(pump!(w, p)),
                    (Err(e), _) | (_, Err(e)) => {
                        self.fatal_now(format!("{}: {e}", root.display()));
                        return None;
                    }
                }
            } else {
                match (
                    FileStorage::new(&wal_dir, false),
                    FileStorage::new(&part_dir, false),
                ) {
                    (Ok(w), Ok(p)) => Box::pin(pump!(w, p)),
                    (Err(e), _) | (_, Err(e)) => {
                        self.fatal_now(format!("{}: {e}", root.display()));
                        return None;
                    }
                }
            };
        let fatal = self.fatal.clone();
        Some(
            glommio::spawn_local(async move {
                let outcome = outcome.await;
                if let partitions::Outcome::Fatal(cause) = &outcome
                    && let Ok(mut f) = fatal.lock()
                {
                    f.get_or_insert(cause.clone());
                }
                outcome
            })
            .detach(),
        )
    }

    fn fatal_now(&self, cause: String) {
        error!(cause = %cause, "partition storage cannot start");
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(cause);
        }
    }

    /// Recovers the metadata group: on the glommio DMA backend (io_uring, `O_DIRECT`) where
    /// `O_DIRECT` opens, else on the std backend through the page cache (still fdatasync'ed).
    async fn boot_metadata(&self) -> Result<Booted, String> {
        let dir = boot::metadata_dir(&self.data);
        let at = |e: journal::StorageError| format!("{}: {e}", dir.display());
        if direct_io_works(&dir) {
            let storage = DmaStorage::new(&dir).map_err(at)?;
            Ok(Booted::Dma(
                self.recover(storage, &dir, "glommio DMA").await?,
            ))
        } else {
            let storage = FileStorage::new(&dir, false).map_err(at)?;
            Ok(Booted::File(
                self.recover(storage, &dir, "std, page cache").await?,
            ))
        }
    }

    async fn recover<S: journal::Storage + Clone>(
        &self,
        storage: S,
        dir: &Path,
        backend: &'static str,
    ) -> Result<MetadataBoot<S, consensus::Buffered<MetadataStateMachine>>, String> {
        let journal = journal::JournalConfig {
            slot_count: u64::from(self.slots),
            slot_size: boot::METADATA_SLOT_SIZE,
        };
        let machine = self
            .machine
            .lock()
            .ok()
            .and_then(|mut m| m.take())
            .ok_or("the metadata state machine was already taken")?;
        let mut boot = boot::recover(storage, dir, self.identity, journal, machine)
            .await
            .map_err(|e| e.to_string())?;
        if boot::boots_lost_by_stamp(self.rejoin, boot.recovered.superblock.as_ref()) {
            boot::mark_lost_state(&mut boot, dir)
                .await
                .map_err(|e| e.to_string())?;
        }
        let r = &boot.recovered;
        let faulty: Vec<u64> = r.faulty.iter().map(|h| h.op.get()).collect();
        info!(
            superblock = ?r.superblock,
            snapshot_op = r.snapshot_op,
            journaled = r.frames.len(),
            cut_from = ?boot.cut_from,
            faulty = ?faulty,
            lost_state = r.lost_state || r.superblock.as_ref().is_some_and(|s| s.lost_state),
            backend,
            "metadata group recovered from {}",
            dir.display()
        );
        Ok(boot)
    }
}

/// The metadata group's boot on the storage backend it runs on (built once per node, so the
/// variants' size difference costs nothing).
#[allow(clippy::large_enum_variant)]
enum Booted {
    Dma(MetadataBoot<DmaStorage, consensus::Buffered<MetadataStateMachine>>),
    File(MetadataBoot<FileStorage, consensus::Buffered<MetadataStateMachine>>),
}

/// Whether `O_DIRECT` opens in `dir` (tmpfs refuses it); without it the journal still
/// `fdatasync`s every write.
fn direct_io_works(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(".direct-probe");
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    if !ok {
        warn!(dir = %dir.display(), "O_DIRECT refused here; journal writes go through the page cache (still fdatasync'ed)");
    }
    ok
}

/// The mesh pump's handler: adopt connections handed over by the accepting shard; deliver
/// replica frames another shard forwarded; the client core's cross-shard requests and replies.
struct Adopt {
    plane: Rc<Plane>,
    core: Rc<ClientCore>,
    partitions: Rc<partitions::Host>,
}

impl shard::pump::Handler<ShardMsg> for Adopt {
    fn on_tick(&mut self) {}
    fn on_main(&mut self, envelope: shard::Envelope<ShardMsg>) {
        match envelope.body {
            ShardMsg::Handed(handed) => self.plane.adopt(handed),
            ShardMsg::Replica { from, group, bytes } => {
                server::routing::deliver_forwarded(&self.partitions, from, group, bytes);
            }
            other => self.core.on_mesh(other),
        }
    }
    fn on_reply(&mut self, envelope: shard::Envelope<ShardMsg>) {
        self.core.on_mesh(envelope.body);
    }
}

/// `strand dev`: N child nodes on loopback from the embedded config.
pub fn dev(args: DevArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    if let Some(congestion) = &args.tcp_congestion {
        congestion.check().context("--tcp-congestion")?;
    }
    let mut text = config::dev_config(args.replicas, args.tcp_congestion.as_ref());
    // Every node sees the same free memory at start; they share it (decision 512).
    let prefault =
        server::memory::local_prefault_bytes(args.replicas, server::memory::available_bytes());
    text.push_str(&format!(
        "\n[system]\nmemory_prefault_bytes = \"{prefault}\"\n"
    ));
    // Validate every node's view before starting any.
    for i in 0..args.replicas {
        let overrides = Overrides {
            replica_id: u64::from(i),
            shards: Some(1),
            available_cpus: shard::cores::thread_allowed_cpus()?,
            ..Overrides::default()
        };
        config::load(&text, &overrides).context("the embedded dev config")?;
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let config_path = args.data_dir.join("strand-dev.toml");
    std::fs::write(&config_path, &text)
        .with_context(|| format!("writing {}", config_path.display()))?;
    let mut signals = Signals::new([SIGTERM, SIGINT]).context("installing signal handlers")?;
    let exe = std::env::current_exe().context("locating the strand binary")?;
    let mut children: Vec<Child> = Vec::new();
    for i in 0..args.replicas {
        match spawn_node(&exe, &config_path, &args.data_dir, i) {
            Ok(child) => children.push(child),
            Err(e) => {
                stop_children(&mut children);
                return Err(e);
            }
        }
        let step = config::DEV_PORT_STEP * u16::from(i);
        let p = config::DEV_BASE_PORTS;
        println!(
            "node {i}: clients tcp 127.0.0.1:{}, http 127.0.0.1:{}, replicas 127.0.0.1:{}, data {}",
            p.tcp + step,
            p.http + step,
            p.tcp_replica + step,
            args.data_dir.join(format!("node-{i}")).display()
        );
    }
    println!(
        "{} nodes started (log in as root, iggy/iggy unless IGGY_ROOT_USERNAME / \
         IGGY_ROOT_PASSWORD say otherwise); Ctrl-C stops them",
        args.replicas
    );
    // Wait for a signal, or for a node to end on its own (then stop the rest and fail).
    let mut early = None;
    'wait: loop {
        if signals.pending().next().is_some() {
            break;
        }
        for (i, child) in children.iter_mut().enumerate() {
            if let Some(status) = child.try_wait()? {
                early = Some((i, status));
                break 'wait;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let clean = stop_children(&mut children);
    match early {
        Some((i, status)) => {
            error!(node = i, %status, "a node stopped on its own; stopped the others");
            Ok(ExitCode::FAILURE)
        }
        None if clean => Ok(ExitCode::SUCCESS),
        None => Ok(ExitCode::FAILURE),
    }
}

fn spawn_node(exe: &Path, config: &Path, data_dir: &Path, i: u8) -> anyhow::Result<Child> {
    let dir = data_dir.join(format!("node-{i}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::process::Command::new(exe)
        .arg("start")
        .arg("--config")
        .arg(config)
        .args([
            "--replica-id",
            &i.to_string(),
            "--shards",
            "1",
            "--data-dir",
        ])
        .arg(&dir)
        .spawn()
        .with_context(|| format!("starting node {i}"))
}

/// SIGTERM to every child still running, then waits for each; true if all exited 0.
fn stop_children(children: &mut [Child]) -> bool {
    for child in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            let Ok(pid) = i32::try_from(child.id()) else {
                continue;
            };
            // SAFETY: kill(2) on our own child's pid; it has not been reaped (try_wait said it
            // is running), so the pid still names it.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
    let mut clean = true;
    for child in children.iter_mut() {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => {
                warn!(pid = child.id(), %status, "node exited unclean");
                clean = false;
            }
            Err(e) => {
                warn!(pid = child.id(), error = %e, "waiting for a node");
                clean = false;
            }
        }
    }
    clean
}
