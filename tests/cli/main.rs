//! The built binaries (`rtrs-target`, `rtrs-bench`) run as a user runs them, on
//! 127.0.0.x: real runs in every IO pattern, error messages, PSK files, host lists, a
//! path that never connects, a target restarting under load, floods of sessions and of
//! idle sockets (with the tcp listener's admission caps they rely on), clients without a
//! key trying to take the target's session slots, connections and descriptors or to join
//! another client's session (every refusal in the log), and the target's control socket
//! steering a running bench. Paths broken by the operating system have binaries of their
//! own: under load (`tests/failover_os.rs`) and at bring-up (`tests/bringup_os.rs`).
//!
//! One test binary; each module is one capability. Run one module with e.g.
//! `cargo test --test cli run::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

#[path = "../util/cli.rs"]
mod cli_util;
// The flood and hostile-client tests use the server tests' client (its handshake and
// INFO exchange, against the built target); its harness and RAM handler go unused.
#[allow(dead_code, unused_imports)]
#[path = "../util/server/mod.rs"]
mod server_util;
// RNBD spoken raw over that client.
#[allow(dead_code)]
#[path = "../util/rnbd_raw.rs"]
mod rnbd_raw;

mod admission;
mod connections;
mod control;
mod errors;
mod flood;
mod hosts;
mod join;
mod paths;
mod psk;
mod refusals;
mod restart;
mod run;
mod slots;
