//! Tick-counted timers and the seeded PRNG for jitter and nonces. No clocks, no OS randomness.

/// A countdown in ticks. Expires on the tick whose decrement reaches zero (§6). A tick first
/// counts down every timer ([`Timer::tick`]), then fires the expired ones ([`Timer::fire`]):
/// a timer that a firing handler (re)starts is not counted down by the tick that started it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Timer {
    /// `Some(0)`: expired on this tick, not fired yet.
    remaining: Option<u64>,
}

impl Timer {
    /// (Re)starts the timer to fire after `ticks` ticks (at least 1).
    pub fn start(&mut self, ticks: u64) {
        self.remaining = Some(ticks.max(1));
    }

    pub fn stop(&mut self) {
        self.remaining = None;
    }

    pub fn is_running(&self) -> bool {
        self.remaining.is_some()
    }

    /// Counts one tick.
    pub fn tick(&mut self) {
        if let Some(ticks) = self.remaining.as_mut() {
            *ticks = ticks.saturating_sub(1);
        }
    }

    /// `true` if the timer expired on this tick and was not restarted or stopped since (it then
    /// stops; callers restart it).
    pub fn fire(&mut self) -> bool {
        if self.remaining == Some(0) {
            self.remaining = None;
            true
        } else {
            false
        }
    }
}

/// SplitMix64: small, fast, deterministic; seeded from `(cluster, replica, group, incarnation)`.
#[derive(Debug, Clone)]
pub(crate) struct Prng {
    state: u64,
}

impl Prng {
    pub fn new(cluster: u128, replica: u8, group: u64, incarnation: u128) -> Prng {
        let mut seed = Vec::with_capacity(16 + 1 + 8 + 16);
        seed.extend_from_slice(&cluster.to_le_bytes());
        seed.push(replica);
        seed.extend_from_slice(&group.to_le_bytes());
        seed.extend_from_slice(&incarnation.to_le_bytes());
        Prng {
            state: xxhash_rust::xxh3::xxh3_64(&seed),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max` (modulo bias is irrelevant for jitter).
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            self.next_u64()
        } else {
            self.next_u64() % (max + 1)
        }
    }

    /// A non-zero u128 (nonces).
    pub fn nonce(&mut self) -> u128 {
        loop {
            let value = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
            if value != 0 {
                return value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_fires_on_the_kth_tick() {
        let mut t = Timer::default();
        t.tick();
        assert!(!t.fire());
        t.start(3);
        for _ in 0..2 {
            t.tick();
            assert!(!t.fire());
        }
        t.tick();
        assert!(t.fire());
        assert!(!t.is_running());
        // Restarted (or stopped) between the tick and the firing: it does not fire.
        t.start(1);
        t.tick();
        t.start(2);
        assert!(!t.fire());
        t.tick();
        t.stop();
        assert!(!t.fire());
    }

    #[test]
    fn prng_is_deterministic_and_seeded() {
        let mut a = Prng::new(1, 0, 5, 9);
        let mut b = Prng::new(1, 0, 5, 9);
        let mut c = Prng::new(1, 1, 5, 9);
        let xs: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
        assert!(a.up_to(5) <= 5);
    }
}
