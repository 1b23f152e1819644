//! Properties of the manifest codec and the stream framer: round trips, reassembly under any
//! split, and no panic on arbitrary input.

use proptest::prelude::*;
use wire::framer::{Framer, FramingError, frame_size};
use wire::integrity::xxh3;
use wire::manifest::{self, ArtifactKind, ManifestEntry};

const SIZE_OFFSET: usize = 48;
const COMMAND_OFFSET: usize = 60;
const HEADER: usize = wire::HEADER_SIZE;

fn entry() -> impl Strategy<Value = ManifestEntry> {
    (any::<u8>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(kind, frontier, len, checksum)| ManifestEntry {
            kind: ArtifactKind(kind),
            frontier,
            len,
            checksum,
        },
    )
}

/// Content with a correct trailer, so decoding gets past the checksum step.
fn sealed(mut content: Vec<u8>) -> Vec<u8> {
    let trailer = xxh3(&content);
    content.extend_from_slice(&trailer.to_le_bytes());
    content
}

/// Decoding either fails or yields entries that re-encode to the input when `entry_len` is 25.
fn decode_is_consistent(bytes: &[u8]) {
    if let Ok(decoded) = manifest::decode(bytes) {
        assert_eq!(decoded.iter().len(), decoded.len());
        if decoded.entry_len() == manifest::ENTRY_LEN {
            let mut out = Vec::new();
            manifest::encode(&decoded.to_vec(), &mut out).expect("decoded count is in range");
            assert_eq!(out, bytes);
        }
    }
}

fn frame(command: u8, body: usize, fill: u8) -> Vec<u8> {
    let mut frame = vec![fill; HEADER + body];
    let size = u32::try_from(frame.len()).expect("test frame fits u32");
    frame[SIZE_OFFSET..SIZE_OFFSET + 4].copy_from_slice(&size.to_le_bytes());
    frame[COMMAND_OFFSET] = command;
    frame
}

/// Mostly small bodies, sometimes one large enough to make the buffer compact and grow.
fn body_len(max_message_size: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0..64usize,
        3 => 0..4096usize,
        1 => 0..=max_message_size - HEADER,
    ]
    .prop_map(move |body| body.min(max_message_size - HEADER))
}

fn frames(max_message_size: usize, count: usize) -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec((0..=29u8, body_len(max_message_size)), 0..count).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (command, body))| frame(command, body, i as u8))
            .collect()
    })
}

/// Feeds `stream` in reads of the given sizes (cycled), alternately through `spare`/`filled` and
/// `push`, draining after each read. Returns the frames and the error, if any.
fn feed(
    framer: &mut Framer,
    stream: &[u8],
    reads: &[(usize, bool)],
) -> (Vec<Vec<u8>>, Option<FramingError>) {
    let mut out = Vec::new();
    let mut fed = 0;
    for &(len, through_spare) in reads.iter().cycle() {
        if fed == stream.len() {
            break;
        }
        let read = &stream[fed..stream.len().min(fed + len)];
        if through_spare {
            let spare = framer.spare();
            let n = read.len().min(spare.len());
            spare[..n].copy_from_slice(&read[..n]);
            framer.filled(n);
            fed += n;
        } else {
            framer.push(read);
            fed += read.len();
        }
        while let Some(frame) = framer.next_frame() {
            match frame {
                Ok(frame) => out.push(frame.to_vec()),
                Err(error) => {
                    assert_eq!(framer.next_frame(), Some(Err(error)), "poison sticks");
                    return (out, Some(error));
                }
            }
        }
    }
    (out, None)
}

fn reads() -> impl Strategy<Value = Vec<(usize, bool)>> {
    prop::collection::vec((1..100_000usize, any::<bool>()), 1..16)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn manifest_round_trips(entries in prop::collection::vec(entry(), 0..300)) {
        let mut bytes = Vec::new();
        manifest::encode(&entries, &mut bytes).expect("at most 65 536 entries");
        prop_assert_eq!(bytes.len(), manifest::encoded_len(entries.len()));
        let decoded = manifest::decode(&bytes).expect("own encoding decodes");
        prop_assert_eq!(decoded.to_vec(), entries);
    }

    #[test]
    fn manifest_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        decode_is_consistent(&bytes);
    }

    #[test]
    fn manifest_decode_of_sealed_content_never_panics(
        count in prop_oneof![0..4u32, any::<u32>()],
        entry_len in any::<u8>(),
        tail in prop::collection::vec(any::<u8>(), 0..600),
        magic_ok in any::<bool>(),
        cut in 0..12usize,
    ) {
        let mut content = if magic_ok { manifest::MAGIC.to_vec() } else { b"ISM0".to_vec() };
        content.extend_from_slice(&count.to_le_bytes());
        content.push(entry_len);
        content.extend_from_slice(&tail);
        content.truncate(content.len().saturating_sub(cut));
        decode_is_consistent(&sealed(content));
    }

    #[test]
    fn framer_reassembles_any_split(
        frames in frames(256 * 1024, 24),
        reads in reads(),
    ) {
        let mut framer = Framer::new(256 * 1024);
        let (out, error) = feed(&mut framer, &frames.concat(), &reads);
        prop_assert_eq!(error, None);
        prop_assert_eq!(out, frames);
        prop_assert_eq!(framer.buffered(), 0);
        prop_assert!(framer.capacity() <= 2 * (256 * 1024 + wire::framer::READ_CHUNK));
    }

    #[test]
    fn framer_reassembles_single_byte_reads(frames in frames(HEADER + 40, 4)) {
        let mut framer = Framer::new(HEADER + 40);
        let (out, error) = feed(&mut framer, &frames.concat(), &[(1, true), (1, false)]);
        prop_assert_eq!(error, None);
        prop_assert_eq!(out, frames);
    }

    #[test]
    fn framer_on_arbitrary_bytes_never_panics(
        chunks in prop::collection::vec(
            prop_oneof![
                // A header whose size and command land near the limits.
                (prop_oneof![0..600u32, any::<u32>()], prop_oneof![0..32u8, any::<u8>()])
                    .prop_map(|(size, command)| {
                        let mut header = vec![0; HEADER];
                        header[SIZE_OFFSET..SIZE_OFFSET + 4].copy_from_slice(&size.to_le_bytes());
                        header[COMMAND_OFFSET] = command;
                        header
                    }),
                prop::collection::vec(any::<u8>(), 0..700),
            ],
            0..12,
        ),
        reads in reads(),
    ) {
        let max = 512;
        let stream = chunks.concat();
        let mut framer = Framer::new(max);
        let (out, error) = feed(&mut framer, &stream, &reads);
        let joined = out.concat();
        prop_assert!(stream.starts_with(&joined));
        for frame in &out {
            prop_assert_eq!(frame_size(frame, max), Ok(Some(frame.len())));
        }
        if let Some(error) = error {
            prop_assert_eq!(frame_size(&stream[joined.len()..], max), Err(error));
        }
    }
}
