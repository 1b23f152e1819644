//! The framer on arbitrary streams: every frame it yields passes the framing check and the
//! frames concatenate to a prefix of the input; an error names the header that follows them;
//! without an error, what is left is an incomplete frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::framer::{Framer, frame_size};

/// Small enough that fuzzed sizes land on both sides of the limit.
const MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    // Read sizes 1..=256 from the first byte, alternating the two ways of feeding.
    let read_len = usize::from(seed) + 1;
    let mut framer = Framer::new(MAX);
    let mut frames: Vec<u8> = Vec::new();
    let mut error = None;
    'reads: for (i, read) in stream.chunks(read_len).enumerate() {
        if i % 2 == 0 {
            framer.push(read);
        } else {
            let spare = framer.spare();
            assert!(spare.len() >= read.len());
            spare[..read.len()].copy_from_slice(read);
            framer.filled(read.len());
        }
        while let Some(frame) = framer.next_frame() {
            match frame {
                Ok(frame) => {
                    assert_eq!(frame_size(frame, MAX), Ok(Some(frame.len())));
                    frames.extend_from_slice(frame);
                }
                Err(e) => {
                    assert_eq!(framer.next_frame(), Some(Err(e)), "poison sticks");
                    error = Some(e);
                    break 'reads;
                }
            }
        }
    }
    assert!(stream.starts_with(&frames));
    let rest = &stream[frames.len()..];
    match error {
        Some(e) => assert_eq!(frame_size(rest, MAX), Err(e)),
        None => {
            assert_eq!(framer.buffered(), rest.len());
            match frame_size(rest, MAX) {
                Ok(None) => {}
                Ok(Some(size)) => assert!(size > rest.len()),
                Err(e) => panic!("unreported framing error {e}"),
            }
        }
    }
    assert!(
        framer.capacity() <= wire::framer::BUFFER_INITIAL.max(2 * (MAX + wire::framer::READ_CHUNK))
    );
});
