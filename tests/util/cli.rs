//! Shared by the CLI tests: running the built `rtrs-target` / `rtrs-bench` binaries with
//! bounded waits, killing every child on the way out (also when a test fails).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub const TARGET: &str = env!("CARGO_BIN_EXE_rtrs-target");
pub const BENCH: &str = env!("CARGO_BIN_EXE_rtrs-bench");
/// Upper bound of any one wait (never a timing assertion).
pub const LIMIT: Duration = Duration::from_secs(120);

/// A child process killed (and reaped) when dropped.
pub struct Kid(pub Option<Child>);

impl Kid {
    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("child").id()
    }

    /// SIGKILL, and reaps it.
    pub fn kill(&mut self) {
        let mut c = self.0.take().expect("child");
        c.kill().expect("SIGKILL");
        let _ = c.wait();
    }

    /// Waits at most `limit` for the exit; kills it after that and panics.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        let child = self.0.as_mut().expect("child");
        loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                self.0 = None;
                return st;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                self.0 = None;
                panic!("child did not exit within {limit:?}");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A running `rtrs-target` and the port it listens on.
pub struct TargetProc {
    pub kid: Kid,
    /// The first listening port.
    pub port: u16,
    /// Every listening port, in the ready line's order.
    pub ports: Vec<u16>,
    pub ready: String,
    /// Everything the target wrote on stderr so far (its log).
    pub log: Arc<Mutex<String>>,
}

impl TargetProc {
    /// Waits (at most [`LIMIT`]) until the target's log has a line containing every
    /// one of `words`; returns that line, or panics with the whole log.
    pub fn wait_log(&self, words: &[&str]) -> String {
        let start = Instant::now();
        loop {
            {
                let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(l) = log.lines().find(|l| words.iter().all(|w| l.contains(w))) {
                    return l.to_string();
                }
                assert!(
                    start.elapsed() < LIMIT,
                    "no target log line with {words:?} within {LIMIT:?}; log:\n{log}"
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `rtrs-target` on 127.0.0.1 with a free port (port 0; the bound one is read
/// from the ready line) on core 0, sleeping when idle. Its stderr is collected in
/// [`TargetProc::log`] (and copied to the test's stderr with `CLI_TEST_LOG` set).
pub fn start_target(exports: &[&str], extra: &[&str]) -> TargetProc {
    spawn_target("tcp://127.0.0.1:0", exports, extra, false)
}

/// As [`start_target`], listening on `listen` (`tcp://127.0.0.1:PORT`).
pub fn start_target_at(listen: &str, exports: &[&str], extra: &[&str]) -> TargetProc {
    spawn_target(listen, exports, extra, false)
}

/// [`start_target`] with the target at its default log level (`RUST_LOG` is not passed
/// on); returns the collected log as well.
pub fn start_target_logged(exports: &[&str], extra: &[&str]) -> (TargetProc, Arc<Mutex<String>>) {
    let t = spawn_target("tcp://127.0.0.1:0", exports, extra, true);
    let log = Arc::clone(&t.log);
    (t, log)
}

/// [`start_target`] under an address-space limit of `bytes` (`ulimit -v`).
pub fn start_target_limited(exports: &[&str], extra: &[&str], bytes: u64) -> TargetProc {
    start_target_rlimit(exports, extra, libc::RLIMIT_AS, bytes, false)
}

/// [`start_target`] under `resource`'s limit `value` (soft and hard: the target cannot
/// raise it), at its default log level when `default_log`.
pub fn start_target_rlimit(
    exports: &[&str],
    extra: &[&str],
    resource: libc::__rlimit_resource_t,
    value: u64,
    default_log: bool,
) -> TargetProc {
    let mut cmd = Command::new(TARGET);
    // SAFETY: between fork and exec the closure only calls setrlimit, which is
    // async-signal-safe, and touches no memory of the parent's but its own stack.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            let lim = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            if libc::setrlimit(resource, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    spawn_with(cmd, "tcp://127.0.0.1:0", exports, extra, default_log)
}

fn spawn_target(listen: &str, exports: &[&str], extra: &[&str], default_log: bool) -> TargetProc {
    spawn_with(Command::new(TARGET), listen, exports, extra, default_log)
}

fn spawn_with(
    mut cmd: Command,
    listen: &str,
    exports: &[&str],
    extra: &[&str],
    default_log: bool,
) -> TargetProc {
    if default_log {
        cmd.env_remove("RUST_LOG");
    }
    cmd.args(["--listen", listen, "-m", "0x1", "--idle", "adaptive"]);
    for e in exports {
        cmd.args(["--export", e]);
    }
    cmd.args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn rtrs-target");
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let kid = Kid(Some(child));
    let log = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&log);
    let echo = std::env::var_os("CLI_TEST_LOG").is_some();
    thread::spawn(move || {
        let mut r = BufReader::new(err);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            if echo {
                eprint!("{line}");
            }
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&line);
            line.clear();
        }
    });
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        // Keep draining so the target never blocks on a full pipe.
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let ready = rx
        .recv_timeout(LIMIT)
        .expect("rtrs-target printed no ready line");
    // "listening on tcp://ADDR:PORT, ...": each listener's port, whatever its address.
    let ports: Vec<u16> = ready
        .split("tcp://")
        .skip(1)
        .filter_map(|s| s.split([' ', ',']).next())
        .filter_map(|a| a.rsplit(':').next())
        .filter_map(|p| p.parse().ok())
        .collect();
    let port = *ports
        .first()
        .unwrap_or_else(|| panic!("no port in the ready line {ready:?}"));
    TargetProc {
        kid,
        port,
        ports,
        ready,
        log,
    }
}

/// Runs a binary to its end (bounded by [`LIMIT`]; killed after it).
pub fn run(bin: &str, args: &[&str]) -> Output {
    run_within(bin, args, LIMIT)
}

/// Runs a binary to its end; killed after `limit`, and then the test fails.
pub fn run_within(bin: &str, args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t1 = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let mut kid = Kid(Some(child));
    let status = kid.wait(limit);
    Output {
        status,
        stdout: t1.join().expect("stdout reader"),
        stderr: t2.join().expect("stderr reader"),
    }
}

/// The one line a failed command printed on stderr; checks the exit code is non-zero
/// and nothing looks like a panic.
pub fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "expected a failure, got success; stderr: {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "panic output: {err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {err}");
    lines[0].to_string()
}

/// A TCP port on 127.0.0.1 with nobody listening (bound once, then released).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}
