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

/// Declares [`Summary`] with the report counters it adds up over seeds, each listed once: a
/// field, summed by [`Summary::add`] and written under its own name by [`Summary::to_json`].
macro_rules! summary_with_counters {
    ($($(#[doc = $doc:expr])* $name:ident,)*) => {
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
            $($(#[doc = $doc])* pub $name: u64,)*
            /// Longest time from healing to convergence.
            pub heal_ticks_max: u64,
            /// Largest artifact prefix served in any seed.
            pub transfer_artifact_max: u64,
            /// Most artifact bytes any core held at once for a transfer, over all seeds.
            pub transfer_bytes_peak: u64,
            /// The first violation of each failed seed.
            pub failures: Vec<Value>,
        }

        impl Summary {
            fn add_counters(&mut self, report: &Report) {
                $(self.$name += report.$name;)*
            }

            fn counters_json(&self, object: &mut serde_json::Map<String, Value>) {
                $(object.insert(stringify!($name).to_owned(), json!(self.$name));)*
            }
        }
    };
}

summary_with_counters! {
    /// Sum of committed ops.
    committed_ops,
    /// Sum of committed partition-group ops.
    partition_ops,
    /// Sum of view changes.
    view_changes,
    /// Sum of crashes.
    crashes,
    /// Sum of repair requests.
    repairs,
    /// Sum of installed state transfers.
    state_transfers,
    /// Periodic checkpoints (journal compactions).
    checkpoints,
    /// Sum of frames dropped.
    frames_dropped,
    /// Sum of completed client requests.
    requests_completed,
    /// Sum of ticks simulated.
    ticks,
    /// Sum of frames dropped by full per-peer queues.
    frames_overrun,
    /// Sum of torn writes.
    torn_writes,
    /// Appends the journal refused.
    journal_refusals,
    /// Sum of corrupted journal entries.
    entries_corrupted,
    /// Sum of journal entries truncated by recovery (gap, torn entry or chain break).
    recovery_truncations,
    /// Damaged newest journal entries recovered as held but faulty (decision 62).
    faulty_entries_held,
    /// Sum of wiped nodes rejoining.
    wiped_rejoins,
    /// Group boots from a snapshot a state transfer installed.
    restarts_from_transferred_snapshot,
    /// Of which with the snapshot's prepare identity read from the superblock.
    restarts_from_transferred_snapshot_identified,
    /// Sum of boot refusals.
    boot_refusals,
    /// Sum of `Effect::Fatal`.
    fatals,
    /// Live prepares refused for a timestamp beyond the backup's clock window (decision 72).
    prepares_clock_ahead,
    /// Prepares skipped while a replica's appends were behind (decision 504).
    prepares_appending_behind,
    /// Node ticks under storage pressure (decision 505).
    pressure_ticks,
    /// Memory-ack group restarts rejoining in lost state (decision 73).
    memory_ack_rejoins,
    /// Memory-ack groups excused from liveness: more replicas down or lost than tolerated.
    memory_ack_over_budget,
    /// Partition ops served by repair from below the server's checkpoint (decision 71).
    repair_floor_served,
    /// Partition RangeEvicted above the commit point that became a state transfer.
    repair_floor_transfers,
    /// State-transfer artifact bytes served.
    transfer_bytes,
    /// Partition view changes started by primary affinity.
    takeovers,
}

impl Summary {
    /// Adds one seed's report.
    pub fn add(&mut self, report: &Report) {
        self.seeds += 1;
        let safety = report.violations.len() as u64 - report.stalls;
        self.violations += safety;
        self.stalls += report.stalls;
        self.add_counters(report);
        self.heal_ticks_max = self.heal_ticks_max.max(report.heal_ticks);
        self.transfer_artifact_max = self.transfer_artifact_max.max(report.transfer_artifact_max);
        self.transfer_bytes_peak = self.transfer_bytes_peak.max(report.transfer_bytes_peak);
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
        let mut object = serde_json::Map::new();
        object.insert("seeds".to_owned(), json!(self.seeds));
        object.insert("violations".to_owned(), json!(self.violations));
        object.insert("stalls".to_owned(), json!(self.stalls));
        self.counters_json(&mut object);
        object.insert("heal_ticks_max".to_owned(), json!(self.heal_ticks_max));
        object.insert(
            "transfer_artifact_max".to_owned(),
            json!(self.transfer_artifact_max),
        );
        object.insert(
            "transfer_bytes_peak".to_owned(),
            json!(self.transfer_bytes_peak),
        );
        object.insert("failed_seeds".to_owned(), json!(self.failed_seeds));
        object.insert("failures".to_owned(), json!(self.failures));
        // The core's own invariant sweep ran after every step of every replica (decision 70).
        object.insert(
            "invariant_sweep".to_owned(),
            json!(consensus::INVARIANT_SWEEP),
        );
        Value::Object(object)
    }
}

/// `count` distinct seeds drawn from OS randomness: a counter hashed with std's `RandomState`,
/// whose SipHash keys the OS supplies (`getrandom`) once per thread, so every run draws seeds
/// nobody ran before and replays them by number.
pub fn random_seeds(count: usize) -> Vec<u64> {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    let mut seen = BTreeSet::new();
    let mut seeds = Vec::with_capacity(count);
    let mut i = 0u64;
    while seeds.len() < count {
        let mut h = state.build_hasher();
        h.write_u64(i);
        i += 1;
        let seed = h.finish();
        if seen.insert(seed) {
            seeds.push(seed);
        }
    }
    seeds
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
    fn random_seeds_are_distinct_and_differ_between_draws() {
        let a = random_seeds(64);
        let b = random_seeds(64);
        assert_eq!(a.len(), 64);
        assert_eq!(
            a.iter().collect::<std::collections::BTreeSet<_>>().len(),
            64
        );
        assert_ne!(a, b, "two draws from OS randomness");
    }

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
