//! The CLIs' error messages: every bad argument gives one line on stderr naming what is
//! wrong, a non-zero exit code, no panic. Those needing a target share one `rtrs-target`
//! on a free port of 127.0.0.1.

use crate::cli_util;

use std::time::Duration;

use cli_util::{closed_port, one_error_line, run, run_within, start_target, BENCH, TARGET};

/// Runs `bin args`, expects a failure with exit code `code` and one stderr line
/// containing every one of `words`.
fn expect_err(bin: &str, args: &[&str], code: i32, words: &[&str]) {
    let out = run(bin, args);
    let line = one_error_line(&out);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {line}");
    for w in words {
        assert!(
            line.contains(w),
            "{args:?}: {line:?} does not mention {w:?}"
        );
    }
}

#[test]
fn target_bad_arguments() {
    let base = ["--idle", "adaptive", "-m", "0x1"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    expect_err(
        TARGET,
        &with(&["--listen", "127.0.0.1:1234", "--export", "a=ram:1M"]),
        2,
        &["bad URL", "127.0.0.1:1234", "tcp://"],
    );
    expect_err(
        TARGET,
        &with(&["--listen", "verbs://127.0.0.1", "--export", "a=ram:1M"]),
        2,
        &["unsupported scheme", "verbs", "rdma://"],
    );
    expect_err(
        TARGET,
        &with(&[
            "--listen",
            "tcp://127.0.0.1:0?src=127.0.0.2",
            "--export",
            "a=ram:1M",
        ]),
        2,
        &["src=", "--listen takes none"],
    );
    expect_err(
        TARGET,
        &with(&[
            "--listen",
            "tcp://127.0.0.1:0?backlog=5",
            "--export",
            "a=ram:1M",
        ]),
        2,
        &["unknown option", "\"backlog\""],
    );
    expect_err(
        TARGET,
        &with(&["--listen", "tcp://127.0.0.1:99999", "--export", "a=ram:1M"]),
        2,
        &["port", "99999"],
    );
    // Host lists: the bad pattern is named, and so is an export that does not exist.
    for (allow, words) in [
        (
            "a=localhost",
            &["\"localhost\"", "not an IPv4 or IPv6 address"][..],
        ),
        (
            "a=10.0.0.1/24",
            &["\"10.0.0.1/24\"", "the network is 10.0.0.0/24"],
        ),
        ("a=[fd00::]/129", &["\"[fd00::]/129\"", "0 to 128"]),
        ("a=sess:x.y", &["\"sess:x.y\"", "session name"]),
        ("a", &["NAME=PATTERN"]),
        (
            "b=127.0.0.2",
            &["--allow b=127.0.0.2", "no --export named 'b'"],
        ),
    ] {
        expect_err(
            TARGET,
            &with(&[
                "--listen",
                "tcp://127.0.0.1:0",
                "--export",
                "a=ram:1M",
                "--allow",
                allow,
            ]),
            2,
            words,
        );
    }
    expect_err(
        TARGET,
        &with(&["--listen", "tcp://127.0.0.1:0", "--export", "a=ram:1000"]),
        2,
        &["1000", "multiple", "512"],
    );
    expect_err(
        TARGET,
        &with(&["--listen", "tcp://127.0.0.1:0", "--export", "a=disk:x"]),
        2,
        &["a=disk:x"],
    );
    expect_err(
        TARGET,
        &with(&[
            "--listen",
            "tcp://127.0.0.1:0",
            "--export",
            "a=ram:1M",
            "--heartbeat-missed",
            "0",
        ]),
        2,
        &["--heartbeat-missed", "at least 1"],
    );
    expect_err(
        TARGET,
        &with(&[
            "--listen",
            "tcp://127.0.0.1:0",
            "--export",
            "a=ram:1M",
            "--heartbeat",
            "0ms",
        ]),
        2,
        &["--heartbeat", "must not be zero"],
    );
    expect_err(
        TARGET,
        &with(&[
            "--listen",
            "tcp://127.0.0.1:0",
            "--export",
            "a=file:/nonexistent/rtrs-cli-test",
        ]),
        1,
        &["/nonexistent/rtrs-cli-test"],
    );
    expect_err(
        TARGET,
        &with(&[
            "--listen",
            "tcp://127.0.0.1:0",
            "--export",
            "a=ram:1M",
            "--chunk-size",
            "12K",
        ]),
        2,
        &["chunk_size", "12288"],
    );
    expect_err(
        TARGET,
        &[
            "--listen",
            "tcp://127.0.0.1:0",
            "--export",
            "a=ram:1M",
            "-m",
            "0xg",
        ],
        2,
        &["cpumask", "0xg"],
    );
    let listen = ["--listen", "tcp://127.0.0.1:0", "--export", "a=ram:1M"];
    let admission = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = with(&listen);
        v.extend_from_slice(extra);
        v
    };
    expect_err(
        TARGET,
        &admission(&["--handshake-timeout", "0s"]),
        2,
        &["--handshake-timeout", "0s", "zero"],
    );
    expect_err(
        TARGET,
        &admission(&["--handshake-timeout", "2h"]),
        2,
        &["handshake_timeout", "1 hour"],
    );
    expect_err(
        TARGET,
        &admission(&["--max-pending", "0"]),
        2,
        &["max_pending", "at least 1"],
    );
    expect_err(
        TARGET,
        &admission(&["--max-pending", "8", "--max-pending-per-source", "9"]),
        2,
        &["max_pending_per_source", "9"],
    );
    expect_err(TARGET, &with(&["--export", "a=ram:1M"]), 2, &["--listen"]);
    expect_err(TARGET, &with(&["--bogus"]), 2, &["--bogus"]);
}

/// Whether this machine has an RDMA device the verbs fabric can open (then `rdma://`
/// works and its no-device error cannot be seen).
fn rdma_device_present() -> bool {
    #[cfg(feature = "verbs")]
    {
        rtrs_spdk::fabric::verbs::VerbsFabric::open(None).is_ok()
    }
    #[cfg(not(feature = "verbs"))]
    {
        false
    }
}

#[test]
fn rdma_without_a_device_fails_at_once_with_one_line() {
    if rdma_device_present() {
        eprintln!("SKIPPED: this machine has an RDMA device; rdma:// does not fail here");
        return;
    }
    expect_err(
        TARGET,
        &[
            "--listen",
            "rdma://127.0.0.1:0",
            "--export",
            "a=ram:1M",
            "-m",
            "0x1",
        ],
        1,
        &["--listen rdma://127.0.0.1:0", "no RDMA device found"],
    );
    // A tcp listener next to it does not hide the failure.
    expect_err(
        TARGET,
        &[
            "--listen",
            "tcp://127.0.0.1:0",
            "--listen",
            "rdma://127.0.0.1:0",
            "--export",
            "a=ram:1M",
            "-m",
            "0x1",
        ],
        1,
        &["no RDMA device found"],
    );
    for path in ["rdma://127.0.0.1", "rdma://127.0.0.1:7?src=127.0.0.2"] {
        expect_err(
            BENCH,
            &[
                "--path", path, "--device", "d", "--rw", "read", "-m", "0x1", "--idle", "adaptive",
            ],
            1,
            &["--path rdma://127.0.0.1:", "no RDMA device found"],
        );
    }
}

#[test]
fn bench_bad_arguments_without_a_target() {
    let free = format!("tcp://127.0.0.1:{}", closed_port());
    let common = ["--idle", "adaptive", "-m", "0x2"];
    let with = |extra: &[&str]| -> Vec<String> {
        common.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let call = |args: Vec<String>, code, words: &[&str]| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        expect_err(BENCH, &a, code, words);
    };
    call(
        with(&["--path", "localhost:1234", "--device", "d", "--rw", "read"]),
        2,
        &["bad URL"],
    );
    call(
        with(&[
            "--path",
            "verbs://127.0.0.1",
            "--device",
            "d",
            "--rw",
            "read",
        ]),
        2,
        &["unsupported scheme", "verbs"],
    );
    call(with(&["--path", &free, "--rw", "read"]), 2, &["--device"]);
    call(
        with(&[
            "--path",
            &free,
            "--device",
            "d",
            "--rw",
            "zero",
            "--write-zeroes",
            "same",
        ]),
        2,
        &["--write-zeroes", "same", "native or emulate"],
    );
    call(
        with(&[
            "--path",
            &free,
            "--device",
            "d",
            "--rw",
            "read",
            "--reconnect-delay",
            "soon",
        ]),
        2,
        &["--reconnect-delay", "soon"],
    );
    let dev_read = ["--device", "d", "--rw", "read"];
    for (url, words) in [
        (
            format!("{free}?source=127.0.0.2"),
            &["unknown option", "\"source\""][..],
        ),
        (
            format!("{free}?src=localhost"),
            &["src", "localhost", "not an IP"],
        ),
        (format!("{free}?src=[::1]"), &["::1", "IP version"]),
        (format!("{free}?src="), &["src=", "needs an address"]),
    ] {
        let mut a = vec!["--path", url.as_str()];
        a.extend_from_slice(&dev_read);
        call(with(&a), 2, words);
    }
    let rdma = "rdma://127.0.0.1:9";
    let mut a = vec!["--path", free.as_str(), "--path", rdma];
    a.extend_from_slice(&dev_read);
    call(with(&a), 2, &["one fabric", &free, rdma]);
    let long = "s".repeat(255);
    for (name, words) in [
        ("a.b", &["\"a.b\"", "'/' or '.'"][..]),
        ("x/y", &["'/' or '.'"]),
        ("", &["1 to 254 bytes"]),
        (long.as_str(), &["1 to 254 bytes"]),
    ] {
        let mut a = vec!["--path", free.as_str(), "--sessname", name];
        a.extend_from_slice(&dev_read);
        call(with(&a), 2, words);
    }
    call(with(&["--rw", "read"]), 2, &["--path", "--inline-target"]);
    call(
        with(&["--path", &free, "--device", "d", "--rw", "sideways"]),
        2,
        &["sideways", "--rw"],
    );
    call(
        with(&["--inline-target", "ram:1000", "--rw", "read"]),
        2,
        &["1000", "multiple", "512"],
    );
    call(
        with(&["--inline-target", "ram:1M", "--rw", "read", "--bs", "1000"]),
        2,
        &["--bs", "1000", "512"],
    );
    call(
        with(&[
            "--inline-target",
            "ram:1M",
            "--rw",
            "read",
            "--bs",
            "4K",
            "--qd",
            "0",
        ]),
        2,
        &["--qd"],
    );
    call(
        with(&[
            "--inline-target",
            "ram:1M",
            "--rw",
            "read",
            "--time",
            "10 parsecs",
        ]),
        2,
        &["duration", "10 parsecs"],
    );
    call(
        with(&["--inline-target", "ram:1M", "--rw", "read", "--time", "0s"]),
        2,
        &["duration", "zero"],
    );
    expect_err(
        BENCH,
        &["--inline-target", "ram:1M", "--rw", "read", "-m", "0x0"],
        2,
        &["cpumask", "0x0"],
    );
    call(
        with(&[
            "--inline-target",
            "ram:1M",
            "--rw",
            "read",
            "--policy",
            "fastest",
        ]),
        2,
        &["fastest", "policy"],
    );
    call(
        with(&[
            "--inline-target",
            "ram:1M",
            "--rw",
            "randrw",
            "--rwmixread",
            "101",
        ]),
        2,
        &["--rwmixread", "101"],
    );
    // The inline target's chunk is 256 KiB: 1 MiB does not fit.
    call(
        with(&["--inline-target", "ram:4M", "--rw", "read", "--bs", "1M"]),
        2,
        &["--bs", "largest IO"],
    );
    call(
        with(&["--path", &free, "--device", "d", "--rw", "read"]),
        1,
        &["cannot connect", &free, "Connection refused"],
    );
}

#[test]
fn bench_missing_export_is_reported_at_once() {
    let t = start_target(&["vol=ram:1M"], &[]);
    let url = format!("tcp://127.0.0.1:{}", t.port);
    // The bench would wait up to --connect-timeout (60 s) + 5 s for an answer that never
    // comes; the refusal must come long before this test's 20 s bound.
    let out = run_within(
        BENCH,
        &[
            "--path",
            &url,
            "--device",
            "gone",
            "--rw",
            "read",
            "--connect-timeout",
            "60s",
            "--idle",
            "adaptive",
            "-m",
            "0x2",
        ],
        Duration::from_secs(20),
    );
    let line = one_error_line(&out);
    assert_eq!(out.status.code(), Some(1), "{line}");
    for w in ["'gone'", "no such export", &url] {
        assert!(line.contains(w), "{line:?} does not mention {w:?}");
    }
    drop(t);
}

#[test]
fn bench_bad_arguments_against_a_target() {
    let t = start_target(&["vol=ram:4M", "tiny=ram:4K"], &[]);
    assert!(t.ready.contains("vol (ram 4 MiB)"), "{}", t.ready);
    let url = format!("tcp://127.0.0.1:{}", t.port);
    let bench = |extra: &[&str], code, words: &[&str]| {
        let mut a = vec![
            "--path", &url, "--idle", "adaptive", "-m", "0x2", "--time", "1s",
        ];
        a.extend_from_slice(extra);
        expect_err(BENCH, &a, code, words);
    };
    bench(
        &["--device", "nope", "--rw", "read"],
        1,
        &["nope", "no such export"],
    );
    bench(
        &["--device", "vol", "--rw", "read", "--bs", "128K"],
        2,
        &["--bs", "131072", "126976", "--chunk-size"],
    );
    bench(
        &["--device", "vol", "--rw", "read", "--size", "8M"],
        2,
        &["--size", "larger"],
    );
    bench(
        &[
            "--device", "vol", "--rw", "read", "--bs", "4K", "--size", "6K",
        ],
        2,
        &["--size", "multiple"],
    );
    bench(
        &["--device", "tiny", "--rw", "read", "--bs", "8K"],
        2,
        &["tiny", "fewer"],
    );
    drop(t);
}
