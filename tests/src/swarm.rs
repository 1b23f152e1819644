//! Swarm testing: each seed draws its own cluster shape and fault mix (simulation.md §1), so a
//! range of seeds covers calm runs, lossy runs, partition storms, crash-heavy runs, disk faults
//! and clock trouble rather than one fixed mix.

use crate::net::NetConfig;
use crate::prng::{Prng, Stream};

/// The fault mix of a seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Profile {
    /// No faults at all: the happy path must commit and never stall.
    Calm,
    /// Loss, duplication, reordering, delay.
    Lossy,
    /// Symmetric and one-way partitions, clogs.
    Partitions,
    /// Crashes and restarts (with torn tails of unreported writes).
    Crashes,
    /// Everything at once, at moderate rates.
    Mixed,
}

impl Profile {
    /// Stable lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Calm => "calm",
            Profile::Lossy => "lossy",
            Profile::Partitions => "partitions",
            Profile::Crashes => "crashes",
            Profile::Mixed => "mixed",
        }
    }
}

/// Everything a run needs to know besides the seed. Rates are ppm per tick unless named
/// otherwise; durations are ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swarm {
    /// Fault mix.
    pub profile: Profile,
    /// Cluster size (1..=6).
    pub replicas: u8,
    /// Partition groups besides the metadata group.
    pub partition_groups: u8,
    /// Ticks of the fault phase.
    pub fault_ticks: u64,
    /// Ticks allowed after healing for every outstanding request to complete and replicas to
    /// converge (the stated liveness bound).
    pub liveness_ticks: u64,
    /// Link behaviour during the fault phase.
    pub net: NetConfig,
    /// Probability per tick that the partition layout changes.
    pub partition_ppm: u32,
    /// Probability per tick that some replica crashes.
    pub crash_ppm: u32,
    /// Down time of a crashed replica, range.
    pub down_ticks: (u64, u64),
    /// Most replicas down at once during the fault phase.
    pub down_max: u8,
    /// Whether a crash may tear the last landed unreported append (on the faulty minority).
    pub torn_writes: bool,
    /// Probability per tick of a bit flip in a durable journal entry of a faulty replica.
    pub corrupt_ppm: u32,
    /// Probability per tick that a durable journal entry of a faulty replica silently vanishes
    /// (a lost write / lying fsync). Off unless asked for: the protocol cannot tell a lost
    /// entry from one never received, so this is outside the fault model (opt-in experiment).
    pub lose_ppm: u32,
    /// Replicas allowed disk faults (a minority, `< n/2` so a quorum is always clean).
    pub faulty_replicas: Vec<u8>,
    /// Storage completion latency (mean, max).
    pub disk_latency: (u64, u64),
    /// One replica whose disk is much slower, if any.
    pub slow_disk: Option<u8>,
    /// Realtime clock offset bound (µs) and drift bound (ppm).
    pub clock_offset_us: u64,
    /// Drift bound in ppm.
    pub clock_drift_ppm: u64,
    /// Probability per tick of a realtime clock step on some replica.
    pub clock_step_ppm: u32,
    /// Probability that a journal or superblock write fails with an IO error (the core retries a
    /// superblock write and fail-stops on an append it cannot roll back).
    pub write_fail_ppm: u32,
    /// `frame_cache_committed` for the replicas (small values force `Effect::Read`s).
    pub frame_cache_committed: Option<u64>,
    /// `checkpoint_interval_ops` for the replicas (small: journals compact often, so lagging
    /// or restarted replicas fall below a peer's floor and must take a state transfer).
    pub checkpoint_interval_ops: u64,
    /// Number of clients.
    pub clients: u32,
    /// Probability per tick per idle client of submitting a new request.
    pub submit_ppm: u32,
    /// Client retry timeout.
    pub client_retry_ticks: u64,
    /// Slots of every node's metadata prepare journal, also the core's `journal_slot_count`:
    /// small, so slots wrap around within a seed and the core's journal-room backpressure
    /// (decision 34) runs at its edge. At least `2 × checkpoint_interval_ops +
    /// prepare_queue_depth`, as the core's config validation requires.
    pub journal_slot_count: u64,
    /// Partition groups with ack level "memory" (decision 73): bit `p` for partition group `p`
    /// (the metadata group never). Drawn only for clusters of at least 3 replicas.
    pub memory_ack_groups: u8,
    /// Padding bytes in every partition group's main transfer artifact (decision 170): some
    /// seeds transfer artifacts many chunks long, far beyond the core's memory bound.
    pub artifact_pad: u64,
    /// Primary affinity (spec README decision 3, decision 171): the node that is metadata
    /// primary pulls its partition groups' primaries to itself.
    pub affinity: bool,
    /// `appending_bytes_max` for the replicas (decision 504), when drawn: a few prepares' worth,
    /// so a replica whose disk lags (the slow disk above, long latencies) hits the bound,
    /// skips prepares and repairs them. `None`: the core's default, never reached here.
    pub appending_bytes_max: Option<u64>,
    /// The driver's bound on every group's incomplete appends together (decision 505), when
    /// drawn: at or above it each tick, the node's replicas take new appends only into an
    /// empty backlog.
    pub node_appending_bytes_max: Option<u64>,
}

/// Largest drawn `appending_bytes_max`: a handful of the simulator's small prepares.
pub const APPENDING_BYTES_MAX_DRAWN: u64 = 4 * 1024;

/// Largest drawn artifact padding: 16 full chunks (4 MiB).
pub const ARTIFACT_PAD_MAX: u64 = 16 * consensus::constants::STATE_CHUNK_LEN_MAX as u64;

/// Largest drawn metadata journal slot count.
pub const JOURNAL_SLOT_COUNT_MAX: u64 = 256;

/// The smallest slot count the core accepts with `checkpoint_interval_ops` (and the default
/// prepare queue depth the simulator runs), at least 64.
pub fn journal_slot_count_min(checkpoint_interval_ops: u64) -> u64 {
    (2 * checkpoint_interval_ops + consensus::constants::PREPARE_QUEUE_DEPTH_DEFAULT as u64).max(64)
}

/// A rate in parts per million drawn from `low..=high` when `on`, else 0 (nothing drawn).
fn ppm_when(on: bool, p: &mut Prng, low: u64, high: u64) -> u32 {
    if on {
        p.range_inclusive(low, high) as u32
    } else {
        0
    }
}

impl Swarm {
    /// Draws a swarm configuration for `seed`; fixed values override the drawn ones.
    pub fn from_seed(
        seed: u64,
        replicas: Option<u8>,
        groups: Option<u8>,
        ticks: Option<u64>,
    ) -> Swarm {
        let mut p = Prng::new(seed, Stream::Swarm);
        let profile = *p.pick(&[
            Profile::Calm,
            Profile::Lossy,
            Profile::Lossy,
            Profile::Partitions,
            Profile::Partitions,
            Profile::Crashes,
            Profile::Crashes,
            Profile::Mixed,
            Profile::Mixed,
            Profile::Mixed,
        ]);
        let drawn_replicas = *p.pick(&[1, 2, 3, 3, 3, 4, 5, 5, 6]);
        let replicas = replicas.unwrap_or(drawn_replicas).clamp(1, 6);
        let partition_groups = groups.unwrap_or(p.range_inclusive(1, 3) as u8);
        let fault_ticks = ticks.unwrap_or(p.range_inclusive(1_500, 4_000));
        let lossy = matches!(profile, Profile::Lossy | Profile::Mixed);
        let net = NetConfig {
            delay_mean_ticks: p.range_inclusive(0, 3),
            delay_max_ticks: 40,
            loss_ppm: ppm_when(lossy, &mut p, 10_000, 200_000),
            duplicate_ppm: ppm_when(lossy, &mut p, 0, 50_000),
            reorder_ppm: ppm_when(lossy, &mut p, 0, 100_000),
            // Some seeds run tiny per-peer queues so overruns happen (repair chunks are sized
            // below the queue, as the core's config validation requires).
            peer_queue_capacity: *p.pick(&[16, 64, 256, 256]),
            frames_per_tick: *p.pick(&[8, 64]),
        };
        let partitions = matches!(profile, Profile::Partitions | Profile::Mixed);
        let crashes = matches!(profile, Profile::Crashes | Profile::Mixed);
        let f = (replicas.saturating_sub(1)) / 2;
        let faulty_count = if crashes && replicas >= 3 {
            p.range_inclusive(0, u64::from(f)) as u8
        } else {
            0
        };
        let mut ids: Vec<u8> = (0..replicas).collect();
        p.shuffle(&mut ids);
        let faulty_replicas = ids[..usize::from(faulty_count)].to_vec();
        let slow_disk = if p.chance_ppm(200_000) {
            Some(p.below(u64::from(replicas)) as u8)
        } else {
            None
        };
        let swarm = Swarm {
            profile,
            replicas,
            partition_groups,
            fault_ticks,
            liveness_ticks: 6_000,
            net,
            partition_ppm: ppm_when(partitions, &mut p, 500, 5_000),
            crash_ppm: ppm_when(crashes, &mut p, 300, 3_000),
            down_ticks: (10, p.range_inclusive(50, 1_500)),
            down_max: if crashes {
                p.range_inclusive(1, u64::from(replicas)) as u8
            } else {
                0
            },
            torn_writes: crashes,
            // Bit flips in durable interior entries of the faulty minority (detected at boot).
            corrupt_ppm: ppm_when(crashes && faulty_count > 0, &mut p, 100, 10_000),
            lose_ppm: 0,
            faulty_replicas,
            disk_latency: (p.range_inclusive(0, 3), 20),
            slow_disk,
            clock_offset_us: p.range_inclusive(0, 2_000_000),
            clock_drift_ppm: p.range_inclusive(0, 500),
            clock_step_ppm: if matches!(profile, Profile::Mixed) {
                200
            } else {
                0
            },
            write_fail_ppm: ppm_when(
                matches!(profile, Profile::Mixed) && p.chance_ppm(500_000),
                &mut p,
                1_000,
                20_000,
            ),
            frame_cache_committed: if p.chance_ppm(333_333) {
                Some(p.range_inclusive(1, 16))
            } else {
                None
            },
            clients: p.range_inclusive(1, 4) as u32,
            submit_ppm: p.range_inclusive(20_000, 200_000) as u32,
            client_retry_ticks: p.range_inclusive(100, 400),
            // Drawn last so every earlier parameter of a seed is unchanged.
            checkpoint_interval_ops: p.range_inclusive(8, 32),
            journal_slot_count: 0,
            memory_ack_groups: 0,
            artifact_pad: 0,
            affinity: true,
            appending_bytes_max: None,
            node_appending_bytes_max: None,
        };
        // After every other draw, for the same reason; it depends on the interval. Half the
        // seeds run the tightest room the core accepts, so backpressure actually binds.
        let slots_min = journal_slot_count_min(swarm.checkpoint_interval_ops);
        let journal_slot_count = if p.chance_ppm(500_000) {
            slots_min
        } else {
            p.range_inclusive(slots_min, JOURNAL_SLOT_COUNT_MAX)
        };
        // Drawn last, so every other parameter of a seed is unchanged.
        let memory_ack_groups = if replicas >= 3 {
            (0..partition_groups.min(8)).fold(0u8, |mask, g| {
                if p.chance_ppm(333_333) {
                    mask | (1 << g)
                } else {
                    mask
                }
            })
        } else {
            0
        };
        // Drawn last, so every other parameter of a seed is unchanged.
        let artifact_pad = if p.chance_ppm(250_000) {
            p.range_inclusive(1, ARTIFACT_PAD_MAX)
        } else {
            0
        };
        // Drawn last, so every other parameter of a seed is unchanged.
        let appending_bytes_max = p
            .chance_ppm(333_333)
            .then(|| p.range_inclusive(1, APPENDING_BYTES_MAX_DRAWN));
        // Drawn last, so every other parameter of a seed is unchanged.
        let node_appending_bytes_max = p
            .chance_ppm(333_333)
            .then(|| p.range_inclusive(1, 2 * APPENDING_BYTES_MAX_DRAWN));
        Swarm {
            journal_slot_count,
            memory_ack_groups,
            artifact_pad,
            appending_bytes_max,
            node_appending_bytes_max,
            ..swarm
        }
    }

    /// A fault-free swarm for scenario tests.
    pub fn calm(replicas: u8, partition_groups: u8) -> Swarm {
        Swarm {
            profile: Profile::Calm,
            replicas,
            partition_groups,
            fault_ticks: 0,
            liveness_ticks: 6_000,
            net: NetConfig::default(),
            partition_ppm: 0,
            crash_ppm: 0,
            down_ticks: (10, 100),
            down_max: 0,
            torn_writes: false,
            corrupt_ppm: 0,
            lose_ppm: 0,
            faulty_replicas: Vec::new(),
            disk_latency: (1, 5),
            slow_disk: None,
            clock_offset_us: 0,
            clock_drift_ppm: 0,
            clock_step_ppm: 0,
            write_fail_ppm: 0,
            frame_cache_committed: None,
            clients: 1,
            submit_ppm: 0,
            client_retry_ticks: 200,
            checkpoint_interval_ops: 64,
            journal_slot_count: JOURNAL_SLOT_COUNT_MAX,
            memory_ack_groups: 0,
            artifact_pad: 0,
            affinity: true,
            appending_bytes_max: None,
            node_appending_bytes_max: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_cover_every_profile_and_size() {
        let swarms: Vec<Swarm> = (0..200)
            .map(|s| Swarm::from_seed(s, None, None, None))
            .collect();
        for profile in [
            Profile::Calm,
            Profile::Lossy,
            Profile::Partitions,
            Profile::Crashes,
            Profile::Mixed,
        ] {
            assert!(swarms.iter().any(|s| s.profile == profile), "{profile:?}");
        }
        for n in 1..=6 {
            assert!(swarms.iter().any(|s| s.replicas == n), "{n}");
        }
        for s in &swarms {
            assert!(s.faulty_replicas.len() * 2 < usize::from(s.replicas).max(1));
        }
        assert_eq!(
            Swarm::from_seed(42, None, None, None),
            Swarm::from_seed(42, None, None, None)
        );
    }
}
