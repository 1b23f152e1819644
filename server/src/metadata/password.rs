//! Password hashes: Argon2id (RFC 9106) with a per-user 16-byte salt and the cost parameters
//! stored beside the hash, so a later change of the default cost still verifies old hashes.
//!
//! Why Argon2id through the RustCrypto `argon2` crate: it is memory-hard (a GPU or ASIC
//! guessing passwords pays for memory, not only compute), it is the RFC's and OWASP's first
//! recommendation for password storage, and the crate is pure Rust, maintained by the
//! RustCrypto organisation, `#![forbid(unsafe_code)]` outside its optional SIMD paths, and
//! used without its `rand` or PHC-string features here: the salt comes in from the caller, so
//! hashing stays a pure function that every replica computes identically.
//!
//! A password never appears in a `Debug` output, a log line or a prepare body.

/// Argon2id cost parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl HashParams {
    /// OWASP's minimum for Argon2id: 19 MiB, 2 passes, 1 lane (tens of milliseconds).
    pub const DEFAULT: HashParams = HashParams {
        memory_kib: 19 * 1024,
        iterations: 2,
        parallelism: 1,
    };

    /// The cheapest parameters Argon2 allows (8 KiB, 1 pass): for tests only, where the cost
    /// would otherwise dominate; the stored parameters make such hashes verify as usual.
    pub const TEST: HashParams = HashParams {
        memory_kib: 8,
        iterations: 1,
        parallelism: 1,
    };

    /// The most memory a stored hash may ask for (1 GiB): parameters arrive in snapshots from
    /// peers, and a verification must never be able to exhaust the node.
    pub const MEMORY_KIB_MAX: u32 = 1 << 20;
    /// The most passes a stored hash may ask for.
    pub const ITERATIONS_MAX: u32 = 64;
    /// The most lanes a stored hash may ask for.
    pub const PARALLELISM_MAX: u32 = 16;

    /// Whether Argon2 accepts these parameters and they stay within the maxima above.
    pub fn is_valid(self) -> bool {
        self.memory_kib <= Self::MEMORY_KIB_MAX
            && self.iterations <= Self::ITERATIONS_MAX
            && self.parallelism <= Self::PARALLELISM_MAX
            && self.argon2().is_ok()
    }

    fn argon2(self) -> Result<argon2::Argon2<'static>, PasswordError> {
        let params = argon2::Params::new(
            self.memory_kib,
            self.iterations,
            self.parallelism,
            Some(HASH_LEN),
        )
        .map_err(|_| PasswordError::Params(self))?;
        Ok(argon2::Argon2::new(
            argon2::Algorithm::Argon2id,
            argon2::Version::V0x13,
            params,
        ))
    }
}

/// Salt length.
pub const SALT_LEN: usize = 16;
/// Hash length.
pub const HASH_LEN: usize = 32;

/// Why a password cannot be hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    /// Argon2 refuses the parameters.
    #[error("argon2 parameters {0:?} are out of range")]
    Params(HashParams),
    /// The password is longer than Argon2 accepts.
    #[error("password too long")]
    TooLong,
}

/// A stored password: parameters, salt and Argon2id output.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHash {
    /// The cost it was hashed with.
    pub params: HashParams,
    /// The salt.
    pub salt: [u8; SALT_LEN],
    /// The hash.
    pub hash: [u8; HASH_LEN],
}

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordHash")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl PasswordHash {
    /// Hashes `password` with `salt` (deterministic: the same inputs give the same hash).
    pub fn new(
        password: &str,
        salt: [u8; SALT_LEN],
        params: HashParams,
    ) -> Result<PasswordHash, PasswordError> {
        if !params.is_valid() {
            return Err(PasswordError::Params(params));
        }
        let mut hash = [0; HASH_LEN];
        params
            .argon2()?
            .hash_password_into(password.as_bytes(), &salt, &mut hash)
            .map_err(|_| PasswordError::TooLong)?;
        Ok(PasswordHash { params, salt, hash })
    }

    /// Whether `password` is the one hashed. The comparison does not stop at the first
    /// differing byte, so its time does not tell how much of a guess was right.
    pub fn verify(&self, password: &str) -> bool {
        let Ok(candidate) = PasswordHash::new(password, self.salt, self.params) else {
            return false;
        };
        let diff = candidate
            .hash
            .iter()
            .zip(self.hash.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        diff == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_the_right_password_only() {
        let stored = PasswordHash::new("secret", [7; SALT_LEN], HashParams::TEST).unwrap();
        assert!(stored.verify("secret"));
        assert!(!stored.verify("secreT"));
        assert!(!stored.verify(""));
        // The salt matters: the same password under another salt is another hash.
        let other = PasswordHash::new("secret", [8; SALT_LEN], HashParams::TEST).unwrap();
        assert_ne!(stored.hash, other.hash);
        assert!(!format!("{stored:?}").contains("secret"));
    }

    #[test]
    fn default_parameters_are_accepted() {
        let stored = PasswordHash::new("iggy", [1; SALT_LEN], HashParams::DEFAULT).unwrap();
        assert!(stored.verify("iggy"));
        assert!(!stored.verify("iggz"));
    }
}
