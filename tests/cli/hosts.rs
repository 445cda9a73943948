//! `rtrs-target --allow NAME=PATTERN` with real `rtrs-bench` runs on 127.0.0.x: an
//! export restricted to an address and a session name opens to those and refuses the
//! rest (one line naming the device and saying access was denied, exit code 1; the
//! target logs why), an export without `--allow` stays open to all; the one warning a target gives
//! when it listens on a non-loopback address with open exports. Waits are bounded;
//! nothing is timed.

use crate::cli_util;

use cli_util::{one_error_line, run, start_target, BENCH};

/// A short verified bench from `src` on `dev` with extra arguments; its output.
fn bench(port: u16, src: &str, dev: &str, extra: &[&str]) -> std::process::Output {
    let url = format!("tcp://127.0.0.1:{port}?src={src}");
    let mut a = vec![
        "--path", &url, "--device", dev, "--rw", "randrw", "--bs", "4K", "--qd", "4", "--verify",
        "--time", "500ms", "--idle", "adaptive", "-m", "0x2", "--json",
    ];
    a.extend_from_slice(extra);
    run(BENCH, &a)
}

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn allow_by_address_and_session_name_refuse_the_rest() {
    let t = start_target(
        &["vol=ram:16M", "pub=ram:16M"],
        &["--allow", "vol=127.0.0.2", "--allow", "vol=sess:bench-ok"],
    );
    ok(&bench(t.port, "127.0.0.2", "vol", &[]));
    ok(&bench(
        t.port,
        "127.0.0.3",
        "vol",
        &["--sessname", "bench-ok"],
    ));
    ok(&bench(t.port, "127.0.0.3", "pub", &[]));
    let out = bench(t.port, "127.0.0.3", "vol", &["--sessname", "bench-no"]);
    assert_eq!(out.status.code(), Some(1));
    let line = one_error_line(&out);
    assert!(
        line.contains("'vol'") && line.contains("EACCES") && line.contains("access denied"),
        "{line}"
    );
    // The target saw the one OPEN and said why it refused it.
    t.wait_log(&["open refused", "access denied", "bench-no"]);
    // Listening on 127.0.0.1 only: no warning about open exports.
    let log = t.log.lock().unwrap().clone();
    assert!(!log.contains("open to any host"), "{log}");
}

#[test]
fn a_non_loopback_listener_warns_about_open_exports() {
    let t = start_target(
        &["vol=ram:4M", "pub=ram:4M"],
        &["--listen", "tcp://0.0.0.0:0", "--allow", "vol=10.0.0.0/8"],
    );
    let line = t.wait_log(&["open to any host", "pub", "--allow"]);
    assert!(!line.contains("vol"), "{line}");
}
