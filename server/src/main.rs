//! `strand`: the Strand server binary.
//!
//! `strand start` validates the config, boots the shard executors, the replica plane and the
//! metadata replica on shard 0 and every shard's partition groups from its data directory,
//! serves clients on the `tcp` port and `/metrics`; `strand dev` runs a local cluster of such
//! nodes; `strand inspect` decodes wire bytes and data directories.

mod inspect;
mod inspect_dir;
mod node;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use server::config;
use shard::CoreList;

/// Strand: a thread-per-core replica server for the Iggy binary protocol 0.11.0.
#[derive(Debug, Parser)]
#[command(name = "strand", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start one node from a config file.
    ///
    /// The node checks (or formats) its data directory, boots one glommio executor per shard,
    /// listens on tcp_replica, runs the metadata group's replica on shard 0 and the partition
    /// groups of each shard, serves clients on the tcp port and /metrics on the http port;
    /// SIGTERM or SIGINT drains and exits 0, a fatal failure exits 3. Partially wired: a
    /// partition's primary does not follow the metadata primary yet (after a failover a
    /// client may have to send a partition's messages to another node), and consumer groups
    /// are not served.
    Start(StartArgs),
    /// Run an N-node cluster on 127.0.0.1 with no config file (node i on every default port
    /// plus 100 x i, one unpinned shard each, each a child `strand start`).
    ///
    /// The nodes form a cluster and replicate the metadata group and the partition groups
    /// (partially wired, as `strand start`); Ctrl-C stops them.
    Dev(DevArgs),
    /// Decode wire bytes and data directories for operators.
    #[command(subcommand)]
    Inspect(inspect::Inspect),
    /// The load harness: baselines, then producers and consumers against --address or a
    /// --spawn'ed local cluster, then a report (JSON, SVG chart, latency distributions).
    ///
    /// The nodes must serve the client plane and partition groups; a run against nodes that
    /// do not names the step that failed (connecting, or a partition not answering).
    Bench(Box<server::bench::BenchArgs>),
}

#[derive(Debug, Args)]
struct StartArgs {
    /// The node's TOML config (spec architecture.md section 10; keys and defaults in the
    /// README).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// This node's entry in [[cluster.nodes]].
    #[arg(long, value_name = "N")]
    replica_id: u64,
    /// Pin one shard to each listed core, in order: ranges and commas, e.g. 0-3 or 0,2.
    /// Overrides system.sharding.
    #[arg(long, value_name = "LIST", value_parser = parse_cores, conflicts_with = "shards")]
    cores: Option<CoreList>,
    /// Run N unpinned shards. Overrides system.sharding.
    #[arg(long, value_name = "N")]
    shards: Option<u64>,
    /// The data directory (default: system.path).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Rejoin as a replica that lost its state: format the (empty) data directory with
    /// lost_state set, so the node never votes or helps form a quorum until it holds the
    /// current view's log again. Use it after wiping or replacing a damaged directory of a
    /// node that has run in this cluster; refused on a directory that holds data.
    #[arg(long)]
    rejoin: bool,
}

#[derive(Debug, Args)]
struct DevArgs {
    /// Nodes to run (1..=9).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u8).range(1..=i64::from(config::DEV_REPLICAS_MAX)))]
    replicas: u8,
    /// Where the nodes keep their data: DIR/node-0, DIR/node-1, ... and the generated config.
    #[arg(long, value_name = "DIR", default_value = "local_data/dev")]
    data_dir: PathBuf,
    /// A TCP congestion control (e.g. `cubic`) for every socket of the nodes: their
    /// `network.tcp_congestion_control` (decision 501). Default: the kernel's.
    #[arg(long, value_name = "NAME", value_parser = server::bench::parse_congestion)]
    tcp_congestion: Option<shard::net::CongestionControl>,
}

fn parse_cores(text: &str) -> Result<CoreList, String> {
    CoreList::parse(text).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Start(args) => node::start(args),
        Command::Dev(args) => node::dev(args),
        Command::Inspect(what) => inspect::run(what, &mut std::io::stdout().lock()),
        Command::Bench(args) => std::env::current_exe()
            .map_err(anyhow::Error::from)
            .and_then(|exe| server::bench::main(*args, &exe, &mut std::io::stdout().lock()))
            .map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(verdict) => verdict,
        Err(error) => {
            eprintln!("strand: {error:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("strand").chain(args.iter().copied()))
    }

    fn start(args: &[&str]) -> StartArgs {
        let mut all = vec!["start", "--config", "c.toml", "--replica-id", "1"];
        all.extend_from_slice(args);
        match parse(&all).unwrap().command {
            Command::Start(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn start_flags() {
        let args = start(&["--cores", "0-3", "--data-dir", "/d"]);
        assert_eq!(args.config, PathBuf::from("c.toml"));
        assert_eq!(args.replica_id, 1);
        assert_eq!(args.cores.unwrap().ids(), [0, 1, 2, 3]);
        assert_eq!(args.shards, None);
        assert_eq!(args.data_dir, Some(PathBuf::from("/d")));
        assert_eq!(start(&["--cores", "0,2"]).cores.unwrap().ids(), [0, 2]);
        assert_eq!(start(&["--cores", "3,0-1"]).cores.unwrap().ids(), [3, 0, 1]);
        let args = start(&["--shards", "2"]);
        assert_eq!((args.shards, args.cores), (Some(2), None));
        let args = start(&[]);
        assert_eq!((args.shards, args.cores, args.data_dir), (None, None, None));
        assert!(!args.rejoin);
        assert!(start(&["--rejoin"]).rejoin);
    }

    #[test]
    fn start_refusals() {
        let kind = |args: &[&str]| parse(args).unwrap_err().kind();
        let base = ["start", "--config", "c.toml", "--replica-id", "0"];
        fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
            [base, extra].concat()
        }
        let with = |extra: &[&'static str]| with(&base, extra);
        assert_eq!(
            kind(&with(&["--cores", "0-1", "--shards", "2"])),
            ErrorKind::ArgumentConflict
        );
        let error = parse(&with(&["--cores", "2-1"])).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ValueValidation);
        assert!(
            error.to_string().contains("range `2-1` runs backwards"),
            "{error}"
        );
        let error = parse(&with(&["--cores", "0,0"])).unwrap_err();
        assert!(
            error.to_string().contains("core 0 is listed twice"),
            "{error}"
        );
        assert_eq!(kind(&with(&["--cores", "x"])), ErrorKind::ValueValidation);
        assert_eq!(kind(&with(&["--shards", "-1"])), ErrorKind::UnknownArgument);
        assert_eq!(
            kind(&with(&["--shards", "two"])),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind(&["start", "--replica-id", "0"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            kind(&["start", "--config", "c.toml"]),
            ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn dev_flags() {
        let dev = |args: &[&str]| match parse(&[&["dev"], args].concat()).map(|c| c.command) {
            Ok(Command::Dev(args)) => Ok((args.replicas, args.data_dir)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(dev(&[]), Ok((3, PathBuf::from("local_data/dev"))));
        assert_eq!(
            dev(&["--replicas", "5", "--data-dir", "/x"]),
            Ok((5, PathBuf::from("/x")))
        );
        assert_eq!(dev(&["--replicas", "0"]), Err(ErrorKind::ValueValidation));
        assert_eq!(dev(&["--replicas", "10"]), Err(ErrorKind::ValueValidation));
    }

    /// The README's flag table names every subcommand and every long flag the CLI accepts, so
    /// it cannot drift from the code (issue 10 item 7).
    #[test]
    fn the_readme_names_every_command_and_flag() {
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let table: String = readme
            .lines()
            .filter(|l| l.starts_with("| `strand ") || l.starts_with("| `--"))
            .collect::<Vec<_>>()
            .join("\n");
        fn walk(command: &clap::Command, path: &str, table: &str, seen: &mut usize) {
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                assert!(
                    table.contains(&format!("`{path}")),
                    "README lacks `{path}`:\n{table}"
                );
                *seen += 1;
                for arg in sub.get_arguments() {
                    if let Some(long) = arg.get_long() {
                        assert!(
                            table.contains(&format!("--{long}")),
                            "README lacks `{path} --{long}`:\n{table}"
                        );
                        *seen += 1;
                    }
                }
                walk(sub, &path, table, seen);
            }
        }
        let mut seen = 0;
        walk(
            &<Cli as clap::CommandFactory>::command(),
            "strand",
            &table,
            &mut seen,
        );
        assert!(seen >= 12, "{seen}");
    }

    #[test]
    fn help_says_what_is_not_wired() {
        let mut command = <Cli as clap::CommandFactory>::command();
        let start = command
            .find_subcommand_mut("start")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(start.contains("Partially wired"), "{start}");
        let dev = command
            .find_subcommand_mut("dev")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(dev.contains("partially wired"), "{dev}");
    }
}
