//! The partition WAL's recovery on images it wrote itself, then damaged, crashed and reopened
//! twice; the script and its oracles are `journal/tests/recovery_scripts` (shared with the
//! journal's property test).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../journal/tests/recovery_scripts/mod.rs"]
mod recovery_scripts;

fuzz_target!(|data: &[u8]| recovery_scripts::wal::run(data));
