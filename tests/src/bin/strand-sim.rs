//! `strand-sim`: runs the deterministic simulator over one seed or a range of seeds.
//!
//! ```text
//! strand-sim --seed N [--replicas R] [--groups G] [--ticks T] [--json] [--trace]
//! strand-sim --seeds A..B [--json] [--keep-going]
//! strand-sim --random N [--replicas R] [--groups G] [--json]
//! ```
//! `--random N` draws N seeds from OS randomness and runs them all (`--keep-going`), printing
//! each failing seed with its replay command; the JSON summary lists them (`random_seeds`).
//! Exits 1 when any seed breaks an invariant or stalls, printing the seed, the invariant and the
//! command that replays it; 2 on a usage error.

use std::process::ExitCode;

use tests::runner::{Overrides, Summary, parse_range, random_seeds, replay_command, run_seed};
use tests::sim::Options;

const USAGE: &str = "usage: strand-sim (--seed N | --seeds A..B | --random N) [--replicas 1-6] [--groups G] \
[--ticks T] [--no-io-errors] [--lost-writes] [--json] [--trace] [--keep-going]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut seeds = None;
    let mut overrides = Overrides::default();
    let mut json = false;
    let mut options = Options {
        stop_at_violation: true,
        ..Options::default()
    };
    let mut keep_going = false;
    let mut drawn: Option<Vec<u64>> = None;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let parsed: Result<(), String> = (|| {
            match arg.as_str() {
                "--seed" => {
                    let n: u64 = value("--seed")?
                        .parse()
                        .map_err(|e| format!("--seed: {e}"))?;
                    seeds = Some(n..n + 1);
                }
                "--seeds" => {
                    let v = value("--seeds")?;
                    seeds = Some(parse_range(&v).ok_or(format!("--seeds: bad range {v}"))?);
                }
                "--random" => {
                    let n: usize = value("--random")?
                        .parse()
                        .map_err(|e| format!("--random: {e}"))?;
                    drawn = Some(random_seeds(n));
                }
                "--replicas" => {
                    let r: u8 = value("--replicas")?
                        .parse()
                        .map_err(|e| format!("--replicas: {e}"))?;
                    if !(1..=6).contains(&r) {
                        return Err("--replicas must be 1..=6".into());
                    }
                    overrides.replicas = Some(r);
                }
                "--groups" => {
                    let g: u8 = value("--groups")?
                        .parse()
                        .map_err(|e| format!("--groups: {e}"))?;
                    // Groups counts every group; the metadata group is always there.
                    overrides.groups = Some(g.saturating_sub(1));
                }
                "--ticks" => {
                    overrides.ticks = Some(
                        value("--ticks")?
                            .parse()
                            .map_err(|e| format!("--ticks: {e}"))?,
                    );
                }
                "--no-io-errors" => overrides.no_io_errors = true,
                "--lost-writes" => overrides.lost_writes = true,
                "--json" => json = true,
                "--trace" => options.trace = true,
                "--keep-going" => keep_going = true,
                // Checker self-tests by hand (build with `--features bug-knobs`).
                #[cfg(feature = "bug-knobs")]
                "--bug-knob" => match value("--bug-knob")?.as_str() {
                    "ack-before-append" => options.bug_knobs.ack_before_append = true,
                    "loosen-nack-quorum" => options.bug_knobs.loosen_nack_quorum = true,
                    "skip-durable-before-send" => options.bug_knobs.skip_durable_before_send = true,
                    "recover-without-probe" => options.bug_knobs.recover_without_probe = true,
                    other => return Err(format!("--bug-knob: unknown knob {other}")),
                },
                "--help" | "-h" => return Err(String::new()),
                other => return Err(format!("unknown argument {other}")),
            }
            Ok(())
        })();
        if let Err(e) = parsed {
            if !e.is_empty() {
                eprintln!("strand-sim: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    }
    let seeds: Box<dyn Iterator<Item = u64>> = match (seeds, &drawn) {
        (Some(range), None) => Box::new(range),
        (None, Some(drawn)) => {
            keep_going = true;
            Box::new(drawn.clone().into_iter())
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut summary = Summary::default();
    for seed in seeds {
        let report = run_seed(seed, overrides, options.clone());
        summary.add(&report);
        if !json {
            println!(
                "seed {seed}: {} n={} groups={} ticks={} committed={} views={} crashes={} repairs={} transfers={} dropped={} {}",
                report.profile,
                report.replicas,
                report.groups,
                report.ticks,
                report.committed_ops,
                report.view_changes,
                report.crashes,
                report.repairs,
                report.state_transfers,
                report.frames_dropped,
                if report.violations.is_empty() {
                    "ok"
                } else {
                    "FAIL"
                }
            );
        }
        if let Some(v) = report.violations.first() {
            eprintln!(
                "seed {seed}: {} violated at tick {}: {}",
                v.invariant, v.tick, v.detail
            );
            eprintln!("replay: {}", replay_command(seed, overrides));
            if !keep_going {
                break;
            }
        }
    }
    if json {
        let mut object = summary.to_json();
        if let (Some(drawn), Some(map)) = (drawn, object.as_object_mut()) {
            map.insert("random_seeds".to_owned(), serde_json::json!(drawn));
        }
        println!("{object}");
    } else {
        println!(
            "seeds {} violations {} stalls {} committed_ops {} view_changes {} crashes {} repairs {} state_transfers {} frames_dropped {} prepares_appending_behind {} pressure_ticks {}",
            summary.seeds,
            summary.violations,
            summary.stalls,
            summary.committed_ops,
            summary.view_changes,
            summary.crashes,
            summary.repairs,
            summary.state_transfers,
            summary.frames_dropped,
            summary.prepares_appending_behind,
            summary.pressure_ticks
        );
    }
    if summary.failed_seeds.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
