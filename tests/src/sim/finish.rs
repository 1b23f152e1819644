//! The end of a run: healing after the fault phase, the convergence test, the run loop that
//! waits for it (or declares a stall), the checks on converged replicas, and the closing of the
//! report.

use std::collections::BTreeSet;

use consensus::{GroupId, Status};

use super::{Report, Sim};
use crate::net::NetConfig;

impl Sim {
    /// Ends the fault phase: heals the network, calms the links, restarts every replica.
    pub fn heal(&mut self) {
        self.healed_at = Some(self.tick);
        self.net.heal();
        self.net.config = NetConfig {
            loss_ppm: 0,
            duplicate_ppm: 0,
            reorder_ppm: 0,
            ..self.swarm.net.clone()
        };
        for r in 0..self.swarm.replicas {
            let host = &mut self.hosts[usize::from(r)];
            if !host.up {
                host.restart_at = self.tick;
            }
        }
        self.trace(format_args!("heal"));
    }

    /// Whether every group has converged: every replica up, Normal, in the same view, with
    /// `commit_min == commit_max == op` equal everywhere and an empty pipeline.
    pub fn converged(&self) -> bool {
        self.groups
            .iter()
            .filter(|g| !self.memory_over_budget.contains(g))
            .all(|&g| self.group_converged(g))
    }

    fn group_converged(&self, group: u64) -> bool {
        let mut first: Option<(u32, u64)> = None;
        for host in &self.hosts {
            let Some(live) = host.live.get(&group) else {
                return false;
            };
            let r = &live.replica;
            if r.status() != Status::Normal
                || r.commit_min() != r.commit_max()
                || r.commit_min() != r.op()
                || r.pipeline_len() != 0
                || r.is_transferring()
            {
                return false;
            }
            let key = (r.view(), r.commit_min());
            match first {
                None => first = Some(key),
                Some(f) if f != key => return false,
                Some(_) => {}
            }
        }
        true
    }

    /// Requests not yet answered.
    pub fn outstanding(&self) -> usize {
        self.clients
            .iter()
            .filter(|c| c.outstanding.is_some())
            .count()
    }

    fn clients_done(&self) -> bool {
        // A request stuck on a memory-ack group over its budget is excused with the group.
        self.clients.iter().all(|c| match &c.outstanding {
            None => c.done_after_heal,
            Some(o) => self.memory_over_budget.contains(&o.group),
        })
    }

    /// Runs the whole seed: the fault phase, healing, then the liveness phase until the cluster
    /// converges or the bound passes (a stall).
    pub fn run(mut self) -> Report {
        loop {
            self.run_tick();
            if self.options.stop_at_violation && !self.checker.violations.is_empty() {
                break;
            }
            let Some(healed) = self.healed_at else {
                continue;
            };
            if self.clients_done() && self.converged() {
                self.report.heal_ticks = self.tick - healed;
                self.check_converged_state();
                break;
            }
            if self.tick >= healed + self.swarm.liveness_ticks {
                let detail = self.stall_detail();
                self.checker.on_liveness(self.tick, detail);
                break;
            }
        }
        self.finish()
    }

    /// Replicas that converged must hold the same state machine.
    fn check_converged_state(&mut self) {
        for &group in &self.groups {
            if self.memory_over_budget.contains(&group) {
                // Excused from converging (`track_memory_ack_budget`).
                continue;
            }
            let digests: BTreeSet<u64> = self
                .hosts
                .iter()
                .filter_map(|h| h.live.get(&group))
                .map(|l| l.replica.state_machine().inner.digest)
                .collect();
            let tables: BTreeSet<Vec<u8>> = self
                .hosts
                .iter()
                .filter_map(|h| h.live.get(&group))
                .map(|l| mask_client_table(&l.replica.client_table_encoded()))
                .collect();
            if tables.len() > 1 {
                let detail =
                    format!("group {group:#x}: converged replicas hold different client tables");
                self.checker.on_state_divergence(self.tick, detail);
            }
            if digests.len() > 1 {
                let detail = format!(
                    "group {group:#x}: converged replicas hold different state digests {digests:x?}"
                );
                self.checker.on_state_divergence(self.tick, detail);
            }
        }
    }

    fn stall_detail(&self) -> String {
        let mut s = format!(
            "no convergence within {} ticks of healing (outstanding requests {})",
            self.swarm.liveness_ticks,
            self.outstanding()
        );
        for &group in &self.groups {
            let converged = if self.group_converged(group) {
                " converged"
            } else {
                ""
            };
            s.push_str(&format!("; group {group:#x}{converged}:"));
            for host in &self.hosts {
                match host.live.get(&group) {
                    Some(l) => {
                        let r = &l.replica;
                        s.push_str(&format!(
                            " r{} {:?} v{} lv{} op{} cmin{} cmax{} pipe{} appending{}",
                            host.id,
                            r.status(),
                            r.view(),
                            r.log_view(),
                            r.op(),
                            r.commit_min(),
                            r.commit_max(),
                            r.pipeline_len(),
                            r.appending_bytes()
                        ));
                    }
                    None => s.push_str(&format!(" r{} down", host.id)),
                }
            }
        }
        s
    }

    /// Closes the report.
    pub fn finish(mut self) -> Report {
        self.report.ticks = self.tick;
        self.report.committed_ops = self.checker.committed_ops();
        self.report.partition_ops = self
            .checker
            .committed
            .keys()
            .filter(|(g, _)| !GroupId(*g).is_metadata())
            .count() as u64;
        self.report.frames_dropped = self.net.stats.dropped();
        self.report.frames_overrun = self.net.stats.dropped_overrun;
        self.report.torn_writes = self.hosts.iter().map(|h| h.disk.stats.torn).sum();
        self.report.journal_refusals = self.hosts.iter().map(|h| h.disk.stats.refused).sum();
        self.report.violations = self.checker.violations.clone();
        self.report.stalls = self
            .checker
            .violations
            .iter()
            .filter(|v| v.invariant == crate::check::Invariant::Liveness)
            .count() as u64;
        self.report
    }
}

/// The encoded client table with the view bytes (52..56) of every cached reply zeroed and the
/// trailer dropped: replicas may journal one prepare under different views (wire.md §11.6), so
/// equivalence is checked modulo those bytes. Layout (consensus `client_table.rs`): magic
/// `ICT2`, u32 count, per session client u128, epoch u64, user_id u32, watermark u64,
/// watermark_checksum u128, u8 replies, per reply u32 length + frame; u64 trailer.
fn mask_client_table(encoded: &[u8]) -> Vec<u8> {
    let mut out = encoded[..encoded.len().saturating_sub(8)].to_vec();
    let mut at = 8usize;
    let count = out
        .get(4..8)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    for _ in 0..count {
        at += 16 + 8 + 4 + 8 + 16;
        let Some(&replies) = out.get(at) else {
            return encoded.to_vec();
        };
        at += 1;
        for _ in 0..replies {
            let Some(len) = out.get(at..at + 4) else {
                return encoded.to_vec();
            };
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            at += 4;
            if at + len > out.len() || len < 56 {
                return encoded.to_vec();
            }
            out[at + 52..at + 56].fill(0);
            at += len;
        }
    }
    out
}
