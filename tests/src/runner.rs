//! Running seeds and summarising them: shared by the `strand-sim` binary and the seed tests.

use serde_json::{Value, json};

use crate::sim::{Options, Report, Sim};
use crate::swarm::Swarm;

/// Fixed values that override what the seed would draw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Cluster size.
    pub replicas: Option<u8>,
    /// Partition groups besides the metadata group (the CLI's `--groups` minus one).
    pub groups: Option<u8>,
    /// Fault phase length in ticks.
    pub ticks: Option<u64>,
    /// Turn off injected IO errors on journal and superblock writes.
    pub no_io_errors: bool,
    /// Let durable entries of the faulty minority vanish (outside the fault model).
    pub lost_writes: bool,
}

/// Runs one seed to completion.
pub fn run_seed(seed: u64, overrides: Overrides, options: Options) -> Report {
    let mut swarm = Swarm::from_seed(seed, overrides.replicas, overrides.groups, overrides.ticks);
    if overrides.no_io_errors {
        swarm.write_fail_ppm = 0;
    }
    if overrides.lost_writes {
        swarm.lose_ppm = 2_000;
    }
    Sim::new(seed, swarm, options).run()
}

/// The command that replays a seed.
pub fn replay_command(seed: u64, overrides: Overrides) -> String {
    let mut s = format!("cargo run --release -p tests --bin strand-sim -- --seed {seed}");
    if let Some(r) = overrides.replicas {
        s.push_str(&format!(" --replicas {r}"));
    }
    if let Some(g) = overrides.groups {
        // `--groups` counts every group; the override holds the partition groups alone.
        s.push_str(&format!(" --groups {}", u16::from(g) + 1));
    }
    if let Some(t) = overrides.ticks {
        s.push_str(&format!(" --ticks {t}"));
    }
    if overrides.no_io_errors {
        s.push_str(" --no-io-errors");
    }
    if overrides.lost_writes {
        s.push_str(" --lost-writes");
    }
    s
}

/// Totals over many seeds.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Seeds with at least one violation (safety or liveness).
    pub failed_seeds: Vec<u64>,
    /// Safety violations over all seeds.
    pub violations: u64,
    /// Liveness failures over all seeds.
    pub stalls: u64,
    /// Sum of committed ops.
    pub committed_ops: u64,
    /// Sum of committed partition-group ops.
    pub partition_ops: u64,
    /// Sum of view changes.
    pub view_changes: u64,
    /// Sum of crashes.
    pub crashes: u64,
    /// Sum of repair requests.
    pub repairs: u64,
    /// Sum of installed state transfers.
    pub state_transfers: u64,
    /// Periodic checkpoints (journal compactions).
    pub checkpoints: u64,
    /// Sum of frames dropped.
    pub frames_dropped: u64,
    /// Sum of completed client requests.
    pub requests_completed: u64,
    /// Sum of ticks simulated.
    pub ticks: u64,
    /// Sum of frames dropped by full per-peer queues.
    pub frames_overrun: u64,
    /// Sum of torn writes.
    pub torn_writes: u64,
    /// Appends the journal refused.
    pub journal_refusals: u64,
    /// Sum of corrupted journal entries.
    pub entries_corrupted: u64,
    /// Sum of journal entries truncated by recovery (gap, torn entry or chain break).
    pub recovery_truncations: u64,
    /// Sum of wiped nodes rejoining.
    pub wiped_rejoins: u64,
    /// Sum of boot refusals.
    pub boot_refusals: u64,
    /// Sum of `Effect::Fatal`.
    pub fatals: u64,
    /// Longest time from healing to convergence.
    pub heal_ticks_max: u64,
    /// The first violation of each failed seed.
    pub failures: Vec<Value>,
}

impl Summary {
    /// Adds one seed's report.
    pub fn add(&mut self, report: &Report) {
        self.seeds += 1;
        let safety = report.violations.len() as u64 - report.stalls;
        self.violations += safety;
        self.stalls += report.stalls;
        self.committed_ops += report.committed_ops;
        self.view_changes += report.view_changes;
        self.partition_ops += report.partition_ops;
        self.crashes += report.crashes;
        self.repairs += report.repairs;
        self.state_transfers += report.state_transfers;
        self.checkpoints += report.checkpoints;
        self.frames_dropped += report.frames_dropped;
        self.requests_completed += report.requests_completed;
        self.frames_overrun += report.frames_overrun;
        self.torn_writes += report.torn_writes;
        self.journal_refusals += report.journal_refusals;
        self.entries_corrupted += report.entries_corrupted;
        self.boot_refusals += report.boot_refusals;
        self.wiped_rejoins += report.wiped_rejoins;
        self.recovery_truncations += report.recovery_truncations;
        self.fatals += report.fatals;
        self.ticks += report.ticks;
        self.heal_ticks_max = self.heal_ticks_max.max(report.heal_ticks);
        if let Some(v) = report.violations.first() {
            self.failed_seeds.push(report.seed);
            self.failures.push(json!({
                "seed": report.seed,
                "profile": report.profile,
                "replicas": report.replicas,
                "groups": report.groups,
                "tick": v.tick,
                "invariant": v.invariant.to_string(),
                "detail": v.detail,
            }));
        }
    }

    /// The final JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "seeds": self.seeds,
            "violations": self.violations,
            "stalls": self.stalls,
            "committed_ops": self.committed_ops,
            "partition_ops": self.partition_ops,
            "view_changes": self.view_changes,
            "crashes": self.crashes,
            "repairs": self.repairs,
            "state_transfers": self.state_transfers,
            "checkpoints": self.checkpoints,
            "frames_dropped": self.frames_dropped,
            "requests_completed": self.requests_completed,
            "frames_overrun": self.frames_overrun,
            "torn_writes": self.torn_writes,
            "journal_refusals": self.journal_refusals,
            "entries_corrupted": self.entries_corrupted,
            "boot_refusals": self.boot_refusals,
            "wiped_rejoins": self.wiped_rejoins,
            "recovery_truncations": self.recovery_truncations,
            "fatals": self.fatals,
            "ticks": self.ticks,
            "heal_ticks_max": self.heal_ticks_max,
            "failed_seeds": self.failed_seeds,
            "failures": self.failures,
        })
    }
}

/// Parses `A..B` (exclusive) or `A..=B` (inclusive).
pub fn parse_range(s: &str) -> Option<std::ops::Range<u64>> {
    if let Some((a, b)) = s.split_once("..=") {
        let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
        return Some(a..b.checked_add(1)?);
    }
    let (a, b) = s.split_once("..")?;
    Some(a.parse().ok()?..b.parse().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_command_names_the_groups_the_cli_was_given() {
        // `--groups 5` on the command line means the metadata group and 4 partition groups.
        let overrides = Overrides {
            replicas: Some(4),
            groups: Some(4),
            ..Overrides::default()
        };
        let command = replay_command(53286, overrides);
        assert!(
            command.ends_with("--seed 53286 --replicas 4 --groups 5"),
            "{command}"
        );
    }
}
