//! `strand start` and `strand dev`.

use std::path::Path;
use std::process::{Child, ExitCode};
use std::time::Duration;

use anyhow::Context;
use shard::{MeshCapacity, Runtime, RuntimeConfig, ShardContext, Sharding};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{error, info, warn};

use crate::{DevArgs, StartArgs};
use server::config::{self, Config, Overrides};

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

/// `strand start`: validate, boot the shards, wait for SIGTERM/SIGINT, stop them, exit 0.
pub fn start(args: StartArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let config = load(&args)?;
    // Registered before any shard exists, so an early signal stops the node cleanly instead of
    // killing it.
    let mut signals = Signals::new([SIGTERM, SIGINT]).context("installing signal handlers")?;
    let (soft, hard) = shard::runtime::raise_memlock_limit().context("reading RLIMIT_MEMLOCK")?;
    let node = config.node();
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
        data_dir = %config.system.path.display(),
        memlock_soft = soft,
        memlock_hard = hard,
        "config valid"
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
    // Each shard runs its pump; nothing travels between shards and no consensus runs on the
    // ticks yet.
    let runtime = Runtime::<()>::start(&runtime_config, |ctx: ShardContext<()>| async move {
        let stats = shard::pump::run(&ctx.mesh, &ctx.stop, &mut Idle).await;
        info!(shard = ctx.id, ticks = stats.ticks, "shard stopped");
    })
    .context("starting the shards")?;
    let registered = (0..runtime.stats().shards())
        .filter(|&s| {
            runtime.stats().registration(s as u16) == shard::BufferRegistration::Registered
        })
        .count();
    warn!(
        "replication is not wired yet: this node runs its shards and waits; it listens on no \
         port and does not open {}",
        config.system.path.display()
    );
    info!(
        shards = runtime.stats().shards(),
        registered_io_buffers = registered,
        "strand node ready; SIGTERM or SIGINT stops it"
    );
    let signal = signals.forever().next().unwrap_or(SIGTERM);
    info!(signal, "stopping");
    match runtime.stop_and_join(config.system.shutdown_join_timeout) {
        Ok(_) => {
            info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            error!(error = %e, "shards did not stop cleanly");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The pump handler until consensus is wired: ticks do nothing, and no message is sent to a
/// shard yet.
struct Idle;

impl shard::pump::Handler<()> for Idle {
    fn on_tick(&mut self) {}
    fn on_main(&mut self, _: shard::Envelope<()>) {}
    fn on_reply(&mut self, _: shard::Envelope<()>) {}
}

/// `strand dev`: N child nodes on loopback from the embedded config.
pub fn dev(args: DevArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let text = config::dev_config(args.replicas);
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
        "{} nodes started (replication is not wired yet: they boot their shards and wait); \
         Ctrl-C stops them",
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
