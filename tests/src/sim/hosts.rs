//! Host lifecycle: starting a node's replicas from what its disk recovered, crashes and
//! power cuts, wiping a data directory, scheduled restarts, and landing checkpoints on disk.
//! Also the scenario DSL's handles on these (crash, restart, wipe, corrupt a replica).

use std::collections::BTreeMap;

use consensus::{Frame, GroupId, Recovered, Replica};
use wire::Message;

use super::{Host, Live, PendingCheckpoint, Sim};
use crate::machine::SimMachine;
use crate::net::Node;
use crate::storage::{Disk, GroupBoot, journal_config};

impl Sim {
    pub(super) fn start_host(&mut self, r: u8) {
        let groups = self.groups.clone();
        let mut recovered_groups = Vec::new();
        let wiped = self.hosts[usize::from(r)].wiped;
        if wiped {
            // Rejoin from a clean directory: nothing on disk, but a prior life that may have
            // acknowledged prepares (the core must not vote before adopting a view).
            self.hosts[usize::from(r)].wiped = false;
            self.checker.on_wipe(r);
            self.report.wiped_rejoins += 1;
            self.trace(format_args!("r{r} rejoins from a wiped directory"));
            for &group in &groups {
                let incarnation = self.prng_identity.next_u128_nonzero();
                recovered_groups.push((group, Recovered::wiped(incarnation)));
            }
        }
        let boots = if wiped {
            Ok(BTreeMap::new())
        } else {
            self.hosts[usize::from(r)].disk.boot(&groups)
        };
        let refusal = match boots {
            Ok(mut boots) => {
                let host = &mut self.hosts[usize::from(r)];
                if host.disk.rejoin_formatted() && boots.values().all(|b| b.state.is_some()) {
                    host.disk.rejoin_marked();
                }
                let mut refusal = None;
                for &group in groups.iter().filter(|_| !wiped) {
                    let boot = boots.remove(&group).unwrap_or_default();
                    match self.recover(r, group, boot) {
                        Ok(recovered) => recovered_groups.push((group, recovered)),
                        Err(why) => {
                            refusal = Some(why);
                            break;
                        }
                    }
                }
                refusal
            }
            Err(why) => Some(why),
        };
        if let Some(why) = refusal {
            // Interior damage: boot is refused (journal.md G3). The operator wipes the data
            // directory and the node rejoins a while later.
            let delay = self.prng_crashes.range_inclusive(50, 500);
            self.wipe_host(r);
            self.hosts[usize::from(r)].restart_at = self.tick + delay;
            self.report.boot_refusals += 1;
            self.trace(format_args!(
                "r{r} refuses boot: {why}; wiped, rejoins in {delay} ticks"
            ));
            return;
        }
        if wiped {
            // A wiped directory boots empty, formatted for the rejoin: its stamp says so before
            // any group writes its lost-state mark, so a crash before a mark is durable still
            // boots that group in lost state (decision 230).
            let groups = self.groups.clone();
            let disk = &mut self.hosts[usize::from(r)].disk;
            disk.format_for_rejoin();
            disk.boot(&groups).expect("an empty directory boots");
        }
        self.hosts[usize::from(r)].up = true;
        self.net.set_down(Node::Replica(r), false);
        self.checker.on_restart(r);
        for (group, recovered) in recovered_groups {
            let snapshot_op = recovered.snapshot_op;
            let mut state: SimMachine = self.hosts[usize::from(r)]
                .snapshots
                .get(&group)
                .map(|s| s.state.clone())
                .unwrap_or_default();
            // A partition group's machine offers (and accepts) a SEGMENT_LOG artifact, padded
            // to the seed's artifact size (decision 170).
            state.inner.partition = matches!(GroupId(group).kind(), wire::GroupKind::Partition(_));
            state.artifact_pad = if state.inner.partition {
                self.swarm.artifact_pad
            } else {
                0
            };
            if let Some(sb) = recovered.superblock.as_ref() {
                self.checker
                    .on_durable_view(self.tick, r, group, sb.view, sb.log_view);
            }
            let config = self.config(r, group);
            let mut outbox = std::mem::take(&mut self.outbox);
            let replica = Replica::new(config, recovered, state, &mut outbox);
            self.outbox = outbox;
            if self.is_memory_ack(group) && replica.is_lost_state() && !wiped {
                // Acked from memory in its previous life: rejoins as lost state (decision 73).
                self.report.memory_ack_rejoins += 1;
                self.trace(format_args!(
                    "r{r} group {group:#x} (ack memory) rejoins in lost state"
                ));
            }
            self.hosts[usize::from(r)].live.insert(
                group,
                Live {
                    replica,
                    checked_commit: snapshot_op,
                    applied_cursor: 0,
                    was_normal_primary: false,
                    transfers_counted: 0,
                },
            );
            self.after_step(r, group);
        }
        // The bus dials every reachable peer; tell the replicas who is not connected.
        self.hosts[usize::from(r)].connected =
            (0..self.swarm.replicas).filter(|&p| p != r).collect();
        self.sync_connections();
    }

    /// The operator moves replica `r`'s data directory aside: its next start rejoins from an
    /// empty one (`Recovered::wiped`).
    fn wipe_host(&mut self, r: u8) {
        let identity = self.disk_identity(r);
        let host = &mut self.hosts[usize::from(r)];
        host.wiped = true;
        host.disk = Disk::new(
            identity,
            journal_config(self.swarm.journal_slot_count),
            self.options.lying_sync,
        );
        host.snapshots.clear();
    }

    fn disk_identity(&self, r: u8) -> journal::Identity {
        journal::Identity {
            cluster: self.cluster,
            replica_id: r,
            replica_count: self.swarm.replicas,
        }
    }

    /// What the journal's recovery found for `group`, handed to the core: the superblock, the
    /// snapshot, and every intact entry above it (holes allowed: entries above a hole may have
    /// been acknowledged; the core replays the unbroken chain and asks for a Truncate at a
    /// chain break). A damaged entry that the journal knows was written is acknowledged data
    /// when an intact entry follows it: boot is refused (journal.md G3). A damaged tail whose
    /// headers the ring holds is handed over as held but faulty (decision 62); a torn tail the
    /// ring never knew is cut.
    fn recover(&mut self, r: u8, group: u64, boot: GroupBoot) -> Result<Recovered, String> {
        let incarnation = self.prng_identity.next_u128_nonzero();
        let host = &mut self.hosts[usize::from(r)];
        let snapshot = host.snapshots.get(&group).cloned();
        let mut recovered = Recovered::fresh(incarnation);
        if let Some(s) = &snapshot {
            recovered.snapshot_op = s.op;
            recovered.client_table = s.client_table.clone();
            // The prepare identity comes from the replica's own superblock, nowhere else.
            if let Some(sb) = boot.state.as_ref().filter(|sb| sb.snapshot_op == s.op) {
                recovered.snapshot_checksum = sb.snapshot_checksum;
                recovered.snapshot_timestamp = sb.snapshot_timestamp;
            }
            if s.transferred {
                self.report.restarts_from_transferred_snapshot += 1;
                if recovered.snapshot_checksum != 0 {
                    self.report.restarts_from_transferred_snapshot_identified += 1;
                }
            }
        }
        recovered.superblock = boot.state.clone();
        if boot.state.is_none() && host.disk.rejoin_formatted() {
            // The rejoin's lost-state mark never landed: this group's prior life (before the
            // wipe) may have acknowledged prepares, so it rejoins in lost state (decision 230).
            recovered.lost_state = true;
            self.trace(format_args!(
                "r{r} group {group:#x}: no superblock in a directory formatted by a rejoin; \
                 lost state"
            ));
        }
        self.trace(format_args!(
            "r{r} boot group {group:#x}: state {:?} checkpoint {} entries {:?} damaged {:?}",
            boot.state,
            boot.checkpoint_op,
            boot.entries.keys().collect::<Vec<_>>(),
            boot.damaged
        ));
        // The entry at the snapshot op, kept by compaction (G4): handed over for its header
        // when intact; a damaged one is simply not handed over (nothing depends on its body).
        let first = recovered.snapshot_op + 1;
        if recovered.snapshot_op > 0
            && let Some(bytes) = boot.entries.get(&recovered.snapshot_op)
        {
            recovered.frames.push(Frame::new(bytes.clone()));
        }
        let mut damaged = boot.damaged.clone();
        for (&op, bytes) in boot.entries.range(first..) {
            let valid = matches!(wire::decode_replica(bytes, wire::MAX_MESSAGE_SIZE_DEFAULT), Ok(Message::Prepare { header, .. })
                if header.op.get() == op && header.group.get() == group);
            if valid {
                recovered.frames.push(Frame::new(bytes.clone()));
            } else {
                damaged.insert(op);
            }
        }
        let Some(&lowest) = damaged.range(first..).next() else {
            return Ok(recovered);
        };
        self.trace(format_args!(
            "r{r} recovery: group {group:#x} damaged entries {damaged:?}"
        ));
        if boot.entries.range(lowest + 1..).next().is_some() {
            return Err(format!(
                "interior journal damage in group {group:#x} at op {lowest}"
            ));
        }
        // The damaged tail (decision 62): an entry whose header the ring still holds was
        // durable once (the ring is written after the prepare's sync), so possibly acked: it
        // goes to the core as held but faulty, to be repaired from peers. A damaged entry the
        // ring does not vouch for below one it does is a hole; above the last one it vouches
        // for, a torn write: cut.
        let top_faulty = damaged
            .range(first..)
            .rev()
            .find(|op| boot.faulty.contains_key(op))
            .copied();
        for (&op, header) in boot.faulty.range(first..) {
            if let Some(h) = <wire::header::PrepareHeader as wire::Layout>::view(header) {
                recovered.faulty.push(*h);
                self.report.faulty_entries_held += 1;
                self.trace(format_args!(
                    "r{r} recovery: group {group:#x} op {op} held but faulty"
                ));
            }
        }
        let cut = damaged
            .range(top_faulty.map_or(first, |t| t + 1)..)
            .next()
            .copied();
        if let Some(from) = cut {
            // The cut entries are never nacked (decision 51), so the ceiling is durable before
            // they go.
            let ceiling = damaged.iter().next_back().copied().unwrap_or(from);
            self.hosts[usize::from(r)]
                .disk
                .raise_truncation_ceiling(group, ceiling);
            if let Some(sb) = recovered.superblock.as_mut() {
                sb.held_ceiling = sb.held_ceiling.max(ceiling);
            }
            let cut = self.hosts[usize::from(r)].disk.truncate_now(group, from);
            debug_assert!(cut, "nothing is pending at boot");
            self.report.recovery_truncations += 1;
        }
        Ok(recovered)
    }

    pub(super) fn crash(&mut self, r: u8, why: &str) {
        // Only the faulty minority tears writes: repair appends below the head can put a torn
        // entry before complete ones, which recovery must treat as interior corruption (boot
        // refused), and more than f nodes gone for good is outside what VSR can survive.
        let may_tear = self.swarm.torn_writes && self.swarm.faulty_replicas.contains(&r);
        let host = &mut self.hosts[usize::from(r)];
        if !host.up {
            return;
        }
        host.up = false;
        host.live.clear();
        host.metadata_primary_since = None;
        host.takeover_at.clear();
        host.reads.clear();
        let landed: Vec<PendingCheckpoint> = std::mem::take(&mut host.checkpoints);
        for c in landed {
            if self.prng_crashes.chance_ppm(500_000) {
                Self::install_checkpoint(host, &c);
            }
        }
        host.disk.crash(&mut self.prng_crashes, may_tear);
        self.net.set_down(Node::Replica(r), true);
        self.report.crashes += 1;
        self.trace(format_args!("crash r{r} ({why})"));
        self.sync_connections();
    }

    /// Lands a checkpoint (journal.md G4): the snapshot is durable first, then the journal is
    /// compacted below its op (the entry at the op itself is kept). Checkpoints of one group may
    /// land out of order; an older one than the durable snapshot changes nothing.
    pub(super) fn install_checkpoint(host: &mut Host, c: &PendingCheckpoint) {
        if host
            .snapshots
            .get(&c.group)
            .is_some_and(|s| s.op >= c.snapshot.op)
        {
            return;
        }
        host.snapshots.insert(c.group, c.snapshot.clone());
        host.disk.install_checkpoint(
            c.group,
            c.snapshot.op,
            c.snapshot.bytes_checksum(),
            c.snapshot.prepare,
        );
    }

    /// Crashes replica `r` now (scenario DSL).
    pub fn crash_replica(&mut self, r: u8) {
        self.crash(r, "scenario");
    }

    /// Crashes replica `r` now, losing every write whose completion it has not seen (a power
    /// cut with a volatile write cache; scenario DSL). Writes already durable stay.
    pub fn crash_replica_losing_writes(&mut self, r: u8) {
        if self.hosts[usize::from(r)].up {
            self.hosts[usize::from(r)].disk.forget_unreported();
            self.hosts[usize::from(r)].checkpoints.clear();
        }
        self.crash(r, "scenario, unreported writes lost");
    }

    /// Cuts replica `r`'s power now (scenario DSL): every append its disk had not reported
    /// lands, and the last one of each file is torn.
    pub fn power_cut_replica(&mut self, r: u8) {
        self.hosts[usize::from(r)].disk.tear_last_on_crash = true;
        self.crash(r, "power cut");
    }

    /// Wipes the data directory of replica `r`, which must be down: its next start rejoins
    /// from an empty directory (scenario DSL).
    pub fn wipe_replica(&mut self, r: u8) {
        assert!(
            !self.hosts[usize::from(r)].up,
            "wipe a replica that is down"
        );
        self.wipe_host(r);
        self.trace(format_args!("wipe r{r}"));
    }

    /// Restarts replica `r` now if it is down (scenario DSL).
    pub fn restart_replica(&mut self, r: u8) {
        if !self.hosts[usize::from(r)].up {
            self.trace(format_args!("restart r{r}"));
            self.start_host(r);
        }
    }

    /// Damages the newest durable metadata entry on replica `r`'s disk (scenario DSL).
    pub fn corrupt_newest_entry(&mut self, r: u8) -> Option<u64> {
        let op = self.hosts[usize::from(r)]
            .disk
            .corrupt_newest(GroupId::METADATA.0)?;
        self.report.entries_corrupted += 1;
        self.trace(format_args!("corrupt r{r} newest metadata op {op}"));
        Some(op)
    }

    /// Writes torn by crashes on replica `r`'s disk so far.
    pub fn hosts_torn_writes(&self, r: u8) -> u64 {
        self.hosts[usize::from(r)].disk.stats.torn
    }

    pub(super) fn restart_due(&mut self) {
        for r in 0..self.swarm.replicas {
            let host = &self.hosts[usize::from(r)];
            if !host.up && host.restart_at != 0 && host.restart_at <= self.tick {
                self.trace(format_args!("restart r{r}"));
                self.hosts[usize::from(r)].restart_at = 0;
                self.start_host(r);
            }
        }
    }
}
