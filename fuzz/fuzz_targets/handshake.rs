//! The handshake machines on arbitrary peer input. The first bytes choose the configuration
//! (auth on or off, ids, binding); the rest is cut into frames that are fed to an acceptor and
//! to a dialer. Properties: no panic, a closed or accepted machine stays finished, an accepted
//! peer obeys the directional rule, and with auth on an acceptor never accepts a peer whose
//! finish MAC it did not verify.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::handshake::{
    Acceptor, AcceptorConfig, Binding, Dialer, DialerConfig, Keys, Reason, Step,
};

const SECRET: &[u8] = b"fuzzing-secret-fuzzing-secret-32";

fuzz_target!(|data: &[u8]| {
    let Some((config, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let [flags, self_id, count, split] = *config;
    let auth_on = flags & 1 == 1;
    let auth = auth_on.then(|| Keys::new(SECRET, None).expect("valid secret"));
    let binding = if flags & 2 == 2 { Binding::Tls { exporter: [flags; 32] } } else { Binding::Plaintext };
    let cluster = u128::from(flags >> 2);
    let frames: Vec<&[u8]> = rest.chunks(256 + usize::from(split)).collect();

    let mut acceptor = Acceptor::new(
        AcceptorConfig::new(cluster, self_id % 8, count % 8, auth.clone(), binding),
        [0x5a; 32],
    );
    let mut finished = false;
    for frame in &frames {
        let step = acceptor.on_frame(frame);
        if finished {
            assert_eq!(step, Step::Close { send: None, reason: Reason::Finished });
            continue;
        }
        match step {
            Step::Continue { .. } => {}
            Step::Accept { peer, .. } => {
                assert!(peer < self_id % 8 && peer < count % 8);
                // The fuzzer cannot compute a BLAKE3 keyed hash under a key it never sees: with
                // auth on, an accept would mean a MAC was accepted without verification.
                assert!(!auth_on, "acceptor accepted an unauthenticated peer");
                finished = true;
            }
            Step::Close { .. } => finished = true,
        }
    }

    let mut dialer = Dialer::new(DialerConfig::new(cluster, self_id % 8, count, auth, binding, split));
    let mut done = matches!(dialer.start([0xa5; 32]), Step::Accept { .. } | Step::Close { .. });
    for frame in &frames {
        let step = dialer.on_frame(frame);
        assert!(!matches!(step, Step::Accept { .. }) || !auth_on, "dialer accepted a forged challenge");
        if done {
            assert!(matches!(step, Step::Close { send: None, .. }));
        }
        done = !matches!(step, Step::Continue { .. });
    }
});
