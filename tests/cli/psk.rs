//! `--psk-file` on the built binaries, over 127.0.0.1: a target and a bench with the same
//! key run a verified workload; a wrong key, a key on one side only, are refused with one
//! line saying "authentication failed" and exit code 1; key files that are readable by
//! others, too short or not hex/base64 are refused up front with exit code 2, naming the
//! file and the problem. Waits are bounded; nothing is timed.

use crate::cli_util;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use cli_util::{one_error_line, run, start_target, BENCH, TARGET};

/// A directory of key files, removed at the end.
struct Keys(PathBuf);

impl Keys {
    fn new(tag: &str) -> Keys {
        let d = std::env::temp_dir().join(format!("rtrs-cli-psk-{tag}-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        Keys(d)
    }

    /// Writes `content` to `name` with `mode`; returns the path as text.
    fn file(&self, name: &str, content: &str, mode: u32) -> String {
        let p = self.0.join(name);
        fs::write(&p, content).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p.display().to_string()
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const KEY_A: &str = "5f1e0c6a9b3d4e2f718293a4b5c6d7e8f90112233445566778899aabbccddeef\n";
/// Another 32-byte key, in base64.
const KEY_B: &str = "q83vASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4k=\n";

fn bench_args<'a>(url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--path", url, "--device", "vol", "--idle", "adaptive", "-m", "0x2", "--time", "1s",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn the_same_key_runs_io_and_any_other_is_refused() {
    let keys = Keys::new("run");
    let a = keys.file("a.key", KEY_A, 0o600);
    let b = keys.file("b.key", KEY_B, 0o400);
    let t = start_target(&["vol=ram:8M"], &["--psk-file", &a]);
    let url = format!("tcp://127.0.0.1:{}", t.port);

    let out = run(
        BENCH,
        &bench_args(
            &url,
            &[
                "--rw",
                "randrw",
                "--verify",
                "--qd",
                "4",
                "--json",
                "--psk-file",
                &a,
            ],
        ),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");

    for (what, extra) in [
        ("another key", vec!["--psk-file", b.as_str()]),
        ("no key", vec![]),
    ] {
        let mut args = vec!["--rw", "read"];
        args.extend(extra);
        let out = run(BENCH, &bench_args(&url, &args));
        let line = one_error_line(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {line}");
        assert!(line.contains("authentication failed"), "{what}: {line}");
        assert!(line.contains(&url[6..]), "{what}: {line} names the target");
        assert!(!line.contains("5f1e0c") && !line.contains("q83v"), "{line}");
    }
    drop(t);

    // A key at the bench only, against a target without one.
    let t = start_target(&["vol=ram:8M"], &[]);
    let url = format!("tcp://127.0.0.1:{}", t.port);
    let out = run(
        BENCH,
        &bench_args(&url, &["--rw", "read", "--psk-file", &a]),
    );
    let line = one_error_line(&out);
    assert_eq!(out.status.code(), Some(1), "{line}");
    assert!(line.contains("authentication failed"), "{line}");
}

#[test]
fn bad_key_files_are_refused_up_front() {
    let keys = Keys::new("bad");
    let open = keys.file("open.key", KEY_A, 0o644);
    let group = keys.file("group.key", KEY_A, 0o640);
    let short = keys.file("short.key", "00112233445566778899aabbccddeeff\n", 0o600);
    let garbage = keys.file(
        "garbage.key",
        "this is not a key, it is a sentence\n",
        0o600,
    );
    let odd = keys.file("odd.key", &KEY_A[..63], 0o600);
    let missing = keys.0.join("missing.key").display().to_string();
    let cases: [(&str, &[&str]); 6] = [
        (&open, &["group or others", "0644", "chmod 600"]),
        (&group, &["group or others", "0640"]),
        (&short, &["16 bytes", "at least 32"]),
        (&garbage, &["neither hex nor valid base64"]),
        (&odd, &["odd number of hex digits"]),
        (&missing, &["missing.key", "No such file"]),
    ];
    for (file, words) in cases {
        for bin in [TARGET, BENCH] {
            let args: Vec<&str> = if bin == TARGET {
                vec![
                    "--listen",
                    "tcp://127.0.0.1:0",
                    "--export",
                    "v=ram:1M",
                    "--psk-file",
                    file,
                ]
            } else {
                vec![
                    "--path",
                    "tcp://127.0.0.1:1",
                    "--device",
                    "v",
                    "--rw",
                    "read",
                    "--psk-file",
                    file,
                ]
            };
            let out = run(bin, &args);
            let line = one_error_line(&out);
            assert_eq!(out.status.code(), Some(2), "{bin} {file}: {line}");
            assert!(line.contains("--psk-file"), "{line}");
            assert!(line.contains(file), "{line} names the file");
            for w in words {
                assert!(line.contains(w), "{bin}: {line:?} does not mention {w:?}");
            }
        }
    }
}
