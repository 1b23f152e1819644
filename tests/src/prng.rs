//! The simulator's only source of randomness: a xoshiro256** generator seeded through splitmix64.
//!
//! One `u64` seed drives a run. Each concern (network, storage, faults, clients, scheduling, ...)
//! draws from its own stream, derived from the seed and a salt, so adding a draw in one concern
//! never shifts the numbers another concern sees (STYLE.md §6).

/// Salts of the independent streams. Never reuse a salt for a second concern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u64)]
pub enum Stream {
    /// The swarm configuration drawn once per seed (cluster size, fault rates).
    Swarm = 0x5157_4152_4d00_0001,
    /// Per-frame network decisions (delay, loss, duplication).
    Network = 0x4e45_5457_4f52_4b02,
    /// Partition and clog schedule.
    Partitions = 0x5041_5254_4954_4903,
    /// Storage completion latencies.
    Storage = 0x5354_4f52_4147_4504,
    /// Crash, restart and disk-fault schedule.
    Crashes = 0x4352_4153_4845_5305,
    /// Client submissions and retries.
    Clients = 0x434c_4945_4e54_5306,
    /// Order in which replicas and inputs are stepped.
    Schedule = 0x5343_4845_4455_4c07,
    /// Clock offsets and drift.
    Clocks = 0x434c_4f43_4b53_0008,
    /// Identifiers handed to replicas (incarnations, nonces).
    Identity = 0x4944_454e_5449_5409,
}

/// splitmix64 step; used to expand seeds.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** (Blackman and Vigna): small, fast, and good enough for fault schedules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prng {
    s: [u64; 4],
}

impl Prng {
    /// The stream `stream` of run `seed`.
    pub fn new(seed: u64, stream: Stream) -> Prng {
        Prng::from_parts(seed, stream as u64)
    }

    /// A stream keyed by an arbitrary salt (for per-replica sub-streams).
    pub fn from_parts(seed: u64, salt: u64) -> Prng {
        let mut state = seed ^ salt.rotate_left(17) ^ 0xD1B5_4A32_D192_ED03;
        let mut s = [0; 4];
        for word in &mut s {
            *word = splitmix64(&mut state);
        }
        if s == [0; 4] {
            s[0] = 1;
        }
        Prng { s }
    }

    /// A child stream, derived from this one's next output and `salt`.
    pub fn fork(&mut self, salt: u64) -> Prng {
        let base = self.next_u64();
        Prng::from_parts(base, salt)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// 128 random bits, never zero (incarnations and nonces must be non-zero).
    pub fn next_u128_nonzero(&mut self) -> u128 {
        loop {
            let v = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
            if v != 0 {
                return v;
            }
        }
    }

    /// Uniform in `0..bound` (`bound > 0`), by Lemire's multiply-shift (bias below 2^-64 * bound).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "below(0)");
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// Uniform in `low..=high`.
    pub fn range_inclusive(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high);
        if high - low == u64::MAX {
            return self.next_u64();
        }
        low + self.below(high - low + 1)
    }

    /// True with probability `ppm / 1_000_000` (rates are parts per million, never floats, so a
    /// run does not depend on float formatting or rounding).
    pub fn chance_ppm(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.below(1_000_000) < u64::from(ppm)
    }

    /// A uniformly chosen element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// An exponential-ish delay with the given mean, capped at `max`: the sum of a uniform part
    /// and, rarely, a long tail. Integer only.
    pub fn delay(&mut self, mean: u64, max: u64) -> u64 {
        if mean == 0 {
            return 0;
        }
        let base = self.range_inclusive(0, mean * 2);
        let tail = if self.chance_ppm(50_000) {
            self.range_inclusive(0, mean * 8)
        } else {
            0
        };
        (base + tail).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_independent_and_reproducible() {
        let mut a = Prng::new(7, Stream::Network);
        let mut b = Prng::new(7, Stream::Network);
        let mut c = Prng::new(7, Stream::Storage);
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn below_stays_in_range() {
        let mut p = Prng::new(1, Stream::Swarm);
        for bound in 1..200 {
            assert!(p.below(bound) < bound);
        }
        let hits = (0..100_000).filter(|_| p.chance_ppm(250_000)).count();
        assert!((20_000..30_000).contains(&hits), "{hits}");
    }
}
