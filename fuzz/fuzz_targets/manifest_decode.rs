//! The manifest decoder on arbitrary bytes, as given and with a correct trailer appended (the
//! fuzzer cannot forge XXH3, so the second form reaches the checks behind the checksum). Success
//! with entry_len 25 must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::integrity::xxh3;
use wire::manifest::{self, ENTRY_LEN};

fn check(bytes: &[u8]) {
    let Ok(decoded) = manifest::decode(bytes) else {
        return;
    };
    assert_eq!(decoded.iter().len(), decoded.len());
    assert_eq!(decoded.iter().rev().count(), decoded.len());
    if decoded.entry_len() == ENTRY_LEN {
        let mut out = Vec::new();
        manifest::encode(&decoded.to_vec(), &mut out).expect("decoded count is in range");
        assert_eq!(out, bytes);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut sealed = data.to_vec();
    sealed.extend_from_slice(&xxh3(data).to_le_bytes());
    check(&sealed);
});
