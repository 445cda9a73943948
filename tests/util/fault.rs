//! Faults made by the operating system, for the tests that break paths the way a user's
//! network does: `ss -K` on a path's sockets (either side), an `nft` drop rule that makes
//! a path silent (a table of its own, deleted when dropped) or holds a connection at a
//! step of its set-up (rules on the segments' data), and a watch on how long
//! processes waited for a CPU (a crowded machine can starve a heartbeat). Everything is
//! narrowed to one address and port, so tests of others on the same machine are not
//! touched.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Prefix of the nft tables made here (then the pid and a number).
const NFT_PREFIX: &str = "rtrs_failover_";

/// Runs a command; its stdout, or why it failed.
pub fn cmd(prog: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut c = Command::new(prog);
    c.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("{prog}: {e}"))?;
    if let (Some(text), Some(mut w)) = (stdin, child.stdin.take()) {
        w.write_all(text.as_bytes())
            .map_err(|e| format!("{prog} stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{prog}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{prog} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An nft table dropping every packet to and from `addr:port`; deleted when dropped.
pub struct Silence {
    table: String,
}

impl Silence {
    pub fn start(addr: &str, port: u16, n: usize) -> Result<Silence, String> {
        let table = format!("{NFT_PREFIX}{}_{n}", std::process::id());
        let script = format!(
            "table inet {table} {{\n chain input {{\n  type filter hook input priority -10; policy accept;\n  \
             ip daddr {addr} tcp dport {port} drop\n  ip saddr {addr} tcp sport {port} drop\n }}\n}}\n"
        );
        cmd("nft", &["-f", "-"], Some(&script))?;
        Ok(Silence { table })
    }
}

impl Drop for Silence {
    fn drop(&mut self) {
        if let Err(e) = cmd("nft", &["delete", "table", "inet", &self.table], None) {
            eprintln!("failover_os: cannot delete nft table {}: {e}", self.table);
        }
    }
}

/// An nft table that drops, and counts, what a client sends to a listener when the
/// segment's data matches (nft payload expressions on the data, `@ih,BIT,BITS VALUE`):
/// a connection being set up is held at a known step (the tcp fabric's frames,
/// `docs/tcp-fabric.md`). Deleted when dropped.
pub struct Hold {
    table: String,
}

impl Hold {
    /// One rule per `(addr, port, match)`; `n` makes the table's name unique.
    pub fn start(rules: &[(&str, u16, &str)], n: usize) -> Result<Hold, String> {
        let table = format!("{NFT_PREFIX}{}_{n}", std::process::id());
        let rules: String = rules
            .iter()
            .map(|(addr, port, m)| format!("  ip daddr {addr} tcp dport {port} {m} counter drop\n"))
            .collect();
        let script = format!(
            "table inet {table} {{\n chain input {{\n  type filter hook input priority -10; policy accept;\n\
             {rules} }}\n}}\n"
        );
        cmd("nft", &["-f", "-"], Some(&script))?;
        Ok(Hold { table })
    }

    /// Packets each rule dropped so far, in the order given (empty if nft fails).
    pub fn dropped(&self) -> Vec<u64> {
        let out = cmd("nft", &["list", "table", "inet", &self.table], None).unwrap_or_default();
        out.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                w.by_ref().find(|w| *w == "packets")?;
                w.next()?.parse().ok()
            })
            .collect()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Err(e) = cmd("nft", &["delete", "table", "inet", &self.table], None) {
            eprintln!("cannot delete nft table {}: {e}", self.table);
        }
    }
}

/// Deletes tables left by test processes that died before cleaning up.
pub fn remove_orphan_tables() {
    let Ok(list) = cmd("nft", &["list", "tables"], None) else {
        return;
    };
    for name in list
        .split_whitespace()
        .filter(|w| w.starts_with(NFT_PREFIX))
    {
        let pid = name[NFT_PREFIX.len()..].split('_').next().unwrap_or("");
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = cmd("nft", &["delete", "table", "inet", name], None);
        }
    }
}

/// Whether `ss -K` and nft work here; why not otherwise.
pub fn tools_usable() -> Result<(), String> {
    let l = TcpListener::bind("127.0.0.3:0").map_err(|e| format!("bind 127.0.0.3: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    let mut c = TcpStream::connect(("127.0.0.3", port)).map_err(|e| format!("connect: {e}"))?;
    let _server_side = l.accept().map_err(|e| format!("accept: {e}"))?;
    cmd(
        "ss",
        &[
            "-K",
            "-t",
            "-4",
            "dst",
            "127.0.0.3",
            "dport",
            "=",
            &format!(":{port}"),
        ],
        None,
    )?;
    c.set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|e| e.to_string())?;
    match c.read(&mut [0u8; 1]) {
        Ok(0) => {}
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        _ => return Err("ss -K left the socket open (no SOCK_DESTROY support?)".into()),
    }
    drop(Silence::start("127.0.0.3", port, 0)?);
    Ok(())
}

/// Bytes received by the busiest of the client's sockets to `addr:port`, and how many
/// there are (established).
pub fn client_sockets(addr: &str, port: u16) -> (usize, u64) {
    let out = cmd(
        "ss",
        &[
            "-Htni",
            "state",
            "established",
            "dst",
            addr,
            "dport",
            "=",
            &format!(":{port}"),
        ],
        None,
    )
    .unwrap_or_default();
    let n = out
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .count();
    let most = out
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("bytes_received:"))
        .filter_map(|v| v.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    (n, most)
}

/// Established sockets to (`client`) or from `addr:port`.
pub fn count_with(addr: &str, port: &str, client: bool) -> usize {
    let (a, p) = if client {
        ("dst", "dport")
    } else {
        ("src", "sport")
    };
    cmd(
        "ss",
        &["-Htn", "state", "established", a, addr, p, "=", port],
        None,
    )
    .map_or(usize::MAX, |o| o.lines().count())
}

/// Breaks path `addr:port` once: `ss -K` on the client's (`how` 0) or the server's (1)
/// sockets, or (2) silence until both sides have given the path up (at most
/// `silence_max`); `n` makes the nft table's name unique.
pub fn break_path(
    addr: &str,
    port: u16,
    how: u64,
    n: usize,
    silence_max: Duration,
) -> Result<&'static str, String> {
    let port_arg = format!(":{port}");
    let kill = |dir: &str, p: &str| {
        cmd(
            "ss",
            &[
                "-K",
                "-t",
                "-4",
                "state",
                "established",
                dir,
                addr,
                p,
                "=",
                &port_arg,
            ],
            None,
        )
    };
    match how {
        0 => kill("dst", "dport").map(|_| "ss -K (client side)"),
        1 => kill("src", "sport").map(|_| "ss -K (server side)"),
        _ => {
            let s = Silence::start(addr, port, n)?;
            // Both heartbeats give the path up (each side then closes its sockets);
            // bounded, the checks afterwards tell whether they did.
            let start = Instant::now();
            while start.elapsed() < silence_max
                && (count_with(addr, &port_arg, true) > 0 || count_with(addr, &port_arg, false) > 0)
            {
                thread::sleep(Duration::from_millis(50));
            }
            drop(s);
            Ok("nft drop until both sides gave the path up")
        }
    }
}

/// Watches the threads of some processes for the longest time one of them waited for a
/// CPU while ready to run (`/proc/PID/task/TID/schedstat`: the run-queue wait, which the
/// kernel adds up when the thread gets the CPU; sampled every 10 ms, so one large step
/// is one long wait), so that a failure on a crowded machine says whether the processes
/// were starved.
pub struct CpuWatch {
    stop: Arc<AtomicBool>,
    done: thread::JoinHandle<Vec<Duration>>,
}

impl CpuWatch {
    pub fn start(pids: Vec<u32>) -> CpuWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let done = thread::spawn(move || {
            let mut worst = vec![0u64; pids.len()];
            let mut seen: HashMap<(usize, String), u64> = HashMap::new();
            while !flag.load(Ordering::Relaxed) {
                for (k, pid) in pids.iter().enumerate() {
                    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                        continue;
                    };
                    for t in tasks.flatten() {
                        let tid = t.file_name().to_string_lossy().into_owned();
                        let Ok(st) = std::fs::read_to_string(t.path().join("schedstat")) else {
                            continue;
                        };
                        let wait: u64 = st
                            .split_whitespace()
                            .nth(1)
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        if let Some(prev) = seen.insert((k, tid), wait) {
                            worst[k] = worst[k].max(wait.saturating_sub(prev));
                        }
                    }
                }
                thread::sleep(Duration::from_millis(10));
            }
            worst.into_iter().map(Duration::from_nanos).collect()
        });
        CpuWatch { stop, done }
    }

    /// The longest wait of each process, in the order given.
    pub fn finish(self) -> Vec<Duration> {
        self.stop.store(true, Ordering::Relaxed);
        self.done.join().unwrap_or_default()
    }
}
