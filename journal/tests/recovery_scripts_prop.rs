//! The storage fuzz targets' recovery scripts on random inputs (a short, deterministic taste
//! of `cargo fuzz run wal_recover` / `metadata_recover` in every test run), plus the inputs
//! with which the fuzzer found bugs, kept as regressions.

mod recovery_scripts;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn wal_recovery_hands_back_only_what_was_written(data in prop::collection::vec(any::<u8>(), 0..320)) {
        recovery_scripts::wal::run(&data);
    }

    #[test]
    fn metadata_recovery_hands_back_only_what_was_appended(data in prop::collection::vec(any::<u8>(), 0..320)) {
        recovery_scripts::metadata::run(&data);
    }
}

/// A truncated last WAL file whose first window head is damaged came back clean and empty.
#[test]
fn fuzz_finding_truncated_file_with_a_damaged_first_window() {
    recovery_scripts::wal::run(&[
        9, 3, 39, 39, 39, 11, 0, 235, 0, 39, 39, 235, 0, 39, 39, 39, 39, 39, 39, 11, 0, 235,
    ]);
}

/// A window grown past the file size lost records its commit had reported durable.
#[test]
fn fuzz_finding_window_larger_than_a_file() {
    recovery_scripts::wal::run(&[
        143, 186, 49, 141, 186, 255, 186, 186, 186, 186, 186, 186, 186, 235, 186, 186, 186, 186,
        186, 186, 186, 186, 154, 186, 186, 154,
    ]);
}
