//! Virtual time. Ticks are the only time the simulator knows (one tick = 10 ms, consensus.md §6);
//! each replica additionally reads a realtime clock with its own offset, drift and occasional
//! steps, which only feeds prepare timestamps (never timeouts).

use crate::prng::Prng;

/// Microseconds per tick (consensus.md §6: a 10 ms tick).
pub const TICK_US: u64 = 10_000;

/// The realtime epoch of every run (2026-01-01T00:00:00Z), so timestamps look plausible.
pub const EPOCH_US: u64 = 1_767_225_600_000_000;

/// One replica's realtime clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftClock {
    /// Constant offset from true time, microseconds (may be negative).
    pub offset_us: i64,
    /// Rate error in parts per million (may be negative).
    pub drift_ppm: i64,
    /// Sum of the steps applied so far (NTP-like corrections, forwards or backwards).
    pub steps_us: i64,
}

impl DriftClock {
    /// A perfect clock.
    pub fn exact() -> DriftClock {
        DriftClock {
            offset_us: 0,
            drift_ppm: 0,
            steps_us: 0,
        }
    }

    /// A clock with an offset of up to `offset_max_us` either way and a drift of up to
    /// `drift_max_ppm` either way.
    pub fn random(prng: &mut Prng, offset_max_us: u64, drift_max_ppm: u64) -> DriftClock {
        let offset = prng.range_inclusive(0, 2 * offset_max_us) as i64 - offset_max_us as i64;
        let drift = prng.range_inclusive(0, 2 * drift_max_ppm) as i64 - drift_max_ppm as i64;
        DriftClock {
            offset_us: offset,
            drift_ppm: drift,
            steps_us: 0,
        }
    }

    /// The realtime reading at `tick`, in microseconds since the Unix epoch.
    pub fn realtime_us(&self, tick: u64) -> u64 {
        let true_us = (tick * TICK_US) as i128;
        let drifted = true_us + true_us * i128::from(self.drift_ppm) / 1_000_000;
        let value =
            EPOCH_US as i128 + drifted + i128::from(self.offset_us) + i128::from(self.steps_us);
        value.max(0) as u64
    }

    /// Steps the clock by `delta_us` (a backwards step exercises the timestamp floor).
    pub fn step(&mut self, delta_us: i64) {
        self.steps_us += delta_us;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_accumulates() {
        let fast = DriftClock {
            offset_us: 0,
            drift_ppm: 1000,
            steps_us: 0,
        };
        assert_eq!(
            fast.realtime_us(100_000) - EPOCH_US,
            100_000 * TICK_US + 1_000_000
        );
        let mut c = DriftClock::exact();
        c.step(-5_000_000);
        assert_eq!(c.realtime_us(0), EPOCH_US - 5_000_000);
    }
}
