//! The CLIs' error messages: every bad argument gives one line on stderr naming what is
//! wrong, a non-zero exit code, no panic. Those needing a target share one `rtrs-target`
//! on a free port of 127.0.0.1.

mod cli_util;

use cli_util::{closed_port, one_error_line, run, start_target, BENCH, TARGET};

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
        &with(&["--listen", "rdma://127.0.0.1", "--export", "a=ram:1M"]),
        2,
        &["unsupported scheme", "rdma"],
    );
    expect_err(
        TARGET,
        &with(&["--listen", "tcp://127.0.0.1:99999", "--export", "a=ram:1M"]),
        2,
        &["port", "99999"],
    );
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
    expect_err(TARGET, &with(&["--export", "a=ram:1M"]), 2, &["--listen"]);
    expect_err(TARGET, &with(&["--bogus"]), 2, &["--bogus"]);
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
            "read",
            "--reconnect-delay",
            "soon",
        ]),
        2,
        &["--reconnect-delay", "soon"],
    );
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
        &["cannot connect", &free],
    );
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
