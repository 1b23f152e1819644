//! Session forwarding as `/metrics` sees it (consensus.md section 13, decision 330): the
//! metadata pump shows every frame it sends and receives to [`ForwardCounters`], which counts
//! the four forward commands by kind and outcome. The core's behaviour is untouched: counting
//! reads the frames, it never feeds anything back.
//!
//! - on the origin (a backup a client logged in or out at): forwards sent, and the results
//!   received by outcome; a forward with no result within 5 s was answered 57 by the core's
//!   timeout, so `sent - sum(results)` is what timed out or was lost;
//! - on the primary: forwards received, and the results it sent back by outcome.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use wire::Command;
use wire::decode::{LogoutOutcome, RegisterOutcome};

/// The command byte's offset in every header (the common prefix).
const COMMAND_AT: usize = 60;
/// The outcome byte's offset in both result headers.
const OUTCOME_AT: usize = 255;
/// Outcome labels of a ForwardRegisterResult, by outcome byte.
const REGISTER_OUTCOMES: [&str; 7] = [
    "ok",
    "not_primary",
    "not_caught_up",
    "pipeline_full",
    "in_progress",
    "canceled",
    "client_id_owned_by_another_user",
];
/// Outcome labels of a ForwardLogoutResult, by outcome byte.
const LOGOUT_OUTCOMES: [&str; 5] = [
    "ok",
    "not_primary",
    "pipeline_full",
    "in_progress",
    "canceled",
];

/// Forward frames counted by kind (register, logout) and outcome.
#[derive(Debug, Default)]
pub struct ForwardCounters {
    /// ForwardRegister / ForwardLogout sent (origin).
    sent: [AtomicU64; 2],
    /// ForwardRegister / ForwardLogout received (primary).
    received: [AtomicU64; 2],
    /// Results received by outcome (origin): register outcomes, then logout outcomes.
    results_received: [AtomicU64; 12],
    /// Results sent by outcome (primary), same layout.
    results_sent: [AtomicU64; 12],
    /// Results whose outcome byte is not one the spec defines (received only; the core
    /// ignores them).
    undefined_outcome: AtomicU64,
    /// Forward frames the plane could not queue (no connection to the primary yet), held for
    /// a deferred first send ([`Deferred`]).
    pub deferred: AtomicU64,
    /// Of them, dropped unsent at the forward timeout (the core answered 57 by then).
    pub deferred_dropped: AtomicU64,
}

/// Whether `frame` is a ForwardRegister or ForwardLogout (the origin's request to the primary).
pub fn is_forward(frame: &[u8]) -> bool {
    matches!(
        frame.get(COMMAND_AT).and_then(|b| Command::from_byte(*b)),
        Some(Command::ForwardRegister | Command::ForwardLogout)
    )
}

/// Forward frames whose first send found no connection to the primary (decision 331): a
/// backup that has not connected to the primary yet (a fresh cluster, a reconnect) would
/// otherwise lose the frame and leave its client waiting the whole forward timeout (5 s) for
/// a 57. The pump offers them to the plane again after every turn until one is queued or the
/// forward timeout has passed (the core's waiter then answered 57, and a late send would
/// only make the primary propose a Register nobody waits for). Never a duplicate: a frame is
/// held only when it was not queued at all.
#[derive(Default)]
pub struct Deferred {
    held: Vec<(u8, bytes::Bytes, std::time::Instant)>,
}

impl Deferred {
    /// Holds `frame` for `peer` until `deadline`.
    pub fn hold(&mut self, peer: u8, frame: bytes::Bytes, deadline: std::time::Instant) {
        self.held.push((peer, frame, deadline));
    }

    /// Offers every held frame to `send` (true when queued); drops those past their deadline.
    /// Returns how many were dropped.
    pub fn retry(
        &mut self,
        now: std::time::Instant,
        mut send: impl FnMut(u8, &bytes::Bytes) -> bool,
    ) -> usize {
        let before = self.held.len();
        let mut dropped = 0;
        self.held.retain(|(peer, frame, deadline)| {
            if send(*peer, frame) {
                return false;
            }
            if now >= *deadline {
                dropped += 1;
                return false;
            }
            true
        });
        debug_assert!(self.held.len() + dropped <= before);
        dropped
    }

    /// Frames held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// Which way a frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The pump sent it to a peer.
    Sent,
    /// A peer's frame reached the pump.
    Received,
}

impl ForwardCounters {
    /// Counts `frame` if it is one of the four forward commands.
    pub fn observe(&self, direction: Direction, frame: &[u8]) {
        let Some(command) = frame.get(COMMAND_AT).and_then(|b| Command::from_byte(*b)) else {
            return;
        };
        let add = |a: &AtomicU64| {
            a.fetch_add(1, Ordering::Relaxed);
        };
        let outcome = frame.get(OUTCOME_AT).copied();
        let (forwards, results) = match direction {
            Direction::Sent => (&self.sent, &self.results_sent),
            Direction::Received => (&self.received, &self.results_received),
        };
        match command {
            Command::ForwardRegister => add(&forwards[0]),
            Command::ForwardLogout => add(&forwards[1]),
            Command::ForwardRegisterResult => match outcome
                .and_then(RegisterOutcome::from_byte)
                .map(|o| o as usize)
            {
                Some(i) => add(&results[i]),
                None => add(&self.undefined_outcome),
            },
            Command::ForwardLogoutResult => {
                match outcome
                    .and_then(LogoutOutcome::from_byte)
                    .map(|o| o as usize)
                {
                    Some(i) => add(&results[REGISTER_OUTCOMES.len() + i]),
                    None => add(&self.undefined_outcome),
                }
            }
            _ => {}
        }
    }

    /// Appends the Prometheus text of every counter (`strand_forwards_total{kind,role}`,
    /// `strand_forward_results_total{kind,outcome,role}`, `strand_forward_results_undefined_total`).
    pub fn render(&self, out: &mut String) {
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP strand_forwards_total session forwards (ForwardRegister, ForwardLogout) \
             sent by this node as origin or received as primary."
        );
        let _ = writeln!(out, "# TYPE strand_forwards_total counter");
        for (i, kind) in ["register", "logout"].into_iter().enumerate() {
            for (role, value) in [("origin", &self.sent[i]), ("primary", &self.received[i])] {
                let _ = writeln!(
                    out,
                    "strand_forwards_total{{kind=\"{kind}\",role=\"{role}\"}} {}",
                    read(value)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP strand_forward_results_total forward results by outcome, received as \
             origin or sent as primary."
        );
        let _ = writeln!(out, "# TYPE strand_forward_results_total counter");
        let labels = REGISTER_OUTCOMES
            .iter()
            .map(|o| ("register", *o))
            .chain(LOGOUT_OUTCOMES.iter().map(|o| ("logout", *o)));
        for (i, (kind, outcome)) in labels.enumerate() {
            for (role, value) in [
                ("origin", &self.results_received[i]),
                ("primary", &self.results_sent[i]),
            ] {
                let _ = writeln!(
                    out,
                    "strand_forward_results_total{{kind=\"{kind}\",outcome=\"{outcome}\",\
                     role=\"{role}\"}} {}",
                    read(value)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP strand_forwards_deferred_total forward frames held because the primary \
             was not connected yet, and of them dropped unsent at the forward timeout."
        );
        let _ = writeln!(out, "# TYPE strand_forwards_deferred_total counter");
        let _ = writeln!(
            out,
            "strand_forwards_deferred_total{{outcome=\"held\"}} {}",
            read(&self.deferred)
        );
        let _ = writeln!(
            out,
            "strand_forwards_deferred_total{{outcome=\"dropped\"}} {}",
            read(&self.deferred_dropped)
        );
        let _ = writeln!(out, "# TYPE strand_forward_results_undefined_total counter");
        let _ = writeln!(
            out,
            "strand_forward_results_undefined_total {}",
            read(&self.undefined_outcome)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(command: Command, outcome: u8) -> Vec<u8> {
        let mut f = vec![0u8; 256];
        f[COMMAND_AT] = command as u8;
        f[OUTCOME_AT] = outcome;
        f
    }

    #[test]
    fn deferred_frames_are_sent_once_connected_or_dropped_at_their_deadline() {
        let start = std::time::Instant::now();
        let later = start + std::time::Duration::from_secs(5);
        let mut d = Deferred::default();
        d.hold(0, bytes::Bytes::from_static(b"a"), later);
        d.hold(1, bytes::Bytes::from_static(b"b"), start);
        let mut sent = Vec::new();
        // Nothing connected: the one past its deadline goes, the other stays.
        assert_eq!(d.retry(start, |_, _| false), 1);
        assert_eq!(d.len(), 1);
        // Connected: sent once, then nothing is held.
        assert_eq!(
            d.retry(start, |peer, frame| {
                sent.push((peer, frame.clone()));
                true
            }),
            0
        );
        assert!(d.is_empty());
        assert_eq!(sent, [(0, bytes::Bytes::from_static(b"a"))]);
        assert!(is_forward(&frame(Command::ForwardLogout, 0)));
        assert!(!is_forward(&frame(Command::ForwardLogoutResult, 0)));
    }

    #[test]
    fn counts_each_forward_command_by_direction_and_outcome() {
        let c = ForwardCounters::default();
        c.observe(Direction::Sent, &frame(Command::ForwardRegister, 0));
        c.observe(
            Direction::Received,
            &frame(Command::ForwardRegisterResult, 0),
        );
        c.observe(
            Direction::Received,
            &frame(Command::ForwardRegisterResult, 1),
        );
        c.observe(Direction::Sent, &frame(Command::ForwardLogoutResult, 4));
        c.observe(Direction::Received, &frame(Command::ForwardLogout, 0));
        c.observe(Direction::Received, &frame(Command::ForwardLogoutResult, 9));
        c.observe(Direction::Sent, &frame(Command::Prepare, 0));
        c.observe(Direction::Sent, &[0u8; 10]);
        let mut text = String::new();
        c.render(&mut text);
        for line in [
            "strand_forwards_total{kind=\"register\",role=\"origin\"} 1",
            "strand_forwards_total{kind=\"register\",role=\"primary\"} 0",
            "strand_forwards_total{kind=\"logout\",role=\"primary\"} 1",
            "strand_forward_results_total{kind=\"register\",outcome=\"ok\",role=\"origin\"} 1",
            "strand_forward_results_total{kind=\"register\",outcome=\"not_primary\",role=\"origin\"} 1",
            "strand_forward_results_total{kind=\"logout\",outcome=\"canceled\",role=\"primary\"} 1",
            "strand_forward_results_undefined_total 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        // Every outcome the spec defines has its line, in both roles.
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("strand_forward_results_total{"))
                .count(),
            2 * (REGISTER_OUTCOMES.len() + LOGOUT_OUTCOMES.len())
        );
    }
}
