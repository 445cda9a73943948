//! cargo-fuzz target: every RTRS/RNBD wire decoder on one input.
//!
//! The first 12 bytes choose the session context (queue depth, chunk size, msg_id,
//! chunk offset, largest user header), the rest is the message; the whole input is
//! also tried as a message with the same context. The oracle in `../roundtrip.rs`
//! (shared with `tests/proto/fuzz.rs`) asserts no panic and byte-exact re-encoding of
//! everything that decodes.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../roundtrip.rs"]
mod roundtrip;

fuzz_target!(|data: &[u8]| {
    let (ctx, msg) = roundtrip::split_input(data);
    roundtrip::check_all(&ctx, msg);
    roundtrip::check_all(&ctx, data);
});
