//! Failover under faults made by the operating system, as a user meets them: the built
//! `rtrs-target` (always_invalidate on, then off) listening on 127.0.0.1 and 127.0.0.2,
//! and `rtrs-bench --verify` over both paths (read, write, randrw); one reactor on each
//! side with always_invalidate on, two on each side with it off (the two sides then
//! share this machine's cores, each IO core with a connection of its own per path). While it runs, the
//! paths are broken alternately at random moments: every TCP socket of the path killed
//! with `ss -K` (the client's or the server's side), or (once in every other run) the
//! path made silent by an `nft` drop rule until both heartbeats (shortened to 2 s × 4,
//! which still outlasts the 5 s a process here sometimes waits for a CPU) have declared
//! it dead. A path is broken only once it carries IO again and the other path is up, so IO
//! always has a path to fail over to.
//!
//! Checked: no IO error, no verify mismatch, and every path reconnected exactly as many
//! times as it was broken and ends connected — a path that was not broken was never
//! closed. At least 50 breaks in all (more runs are added if the machine was too slow to
//! fit them in). A run during which the bench or the target got no CPU for as long as
//! the heartbeat needs to declare a path dead (measured from the kernel's scheduler
//! statistics) proves nothing and is repeated, at most three times, saying so.
//!
//! Only this test's own ports are touched (the target picks free ones); each nft table
//! has a name of its own and is deleted when the break ends, also on a panic (tables of
//! a test process that died are removed at the next start). Without root, `ss -K` or
//! nft support the test prints one SKIPPED line and passes.

// Only the CLI tests' child handle and binary paths are used here.
#[allow(dead_code)]
#[path = "util/cli.rs"]
mod cli_util;
// Not every OS fault is used here.
#[allow(dead_code)]
#[path = "util/fault.rs"]
mod fault_util;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use cli_util::{Kid, BENCH, TARGET};
use fault_util::{break_path, client_sockets, remove_orphan_tables, tools_usable, CpuWatch};
use serde_json::Value;

const ADDRS: [&str; 2] = ["127.0.0.1", "127.0.0.2"];
/// Heartbeat of both sides: a silent path is dead within 8 s (interval × missed).
const HB: &str = "2s";
const HB_MISSED: &str = "4";
/// Silence (or a wait for a CPU) that can get a path declared dead: the probe goes out
/// at the first tick of a silence, the path is dead three ticks later (missed − 1).
const STARVED: Duration = Duration::from_secs(6);
/// Longest silence: both heartbeats give the path up well before.
const SILENCE_MAX: Duration = Duration::from_secs(15);
/// The bench's measured time per run (with a silence: longer, it lasts up to 8 s); breaks
/// stop a little before its end.
const RUN: Duration = Duration::from_secs(6);
const RUN_SILENCE: Duration = Duration::from_secs(14);
const MIN_BREAKS: usize = 50;
/// Bound of every wait for a path or a process.
const WAIT: Duration = Duration::from_secs(30);

/// xorshift64*: the moments and kinds of the breaks (the seed is printed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Waits until path `addr:port` is connected and carries IO: all `cons` connections
/// established and one of them received 16 KiB (the IO connection's responses; cid 0
/// gets about 8 KiB of INFO_RSP and little else). False after [`WAIT`], or when the
/// bench has exited.
fn wait_carrying_io(addr: &str, port: u16, cons: usize, bench: &mut Kid) -> bool {
    let start = Instant::now();
    while start.elapsed() < WAIT {
        let (n, most) = client_sockets(addr, port);
        if n == cons && most >= 16 << 10 {
            return true;
        }
        if bench
            .0
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
        {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Reads a child's pipe to its end on a thread.
fn drain(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx
}

struct Target {
    kid: Kid,
    ports: [u16; 2],
    log: mpsc::Receiver<String>,
}

/// The reactors of both sides: one each (target core 0, bench core 1), or two each.
fn masks(two_reactors: bool) -> (&'static str, &'static str) {
    if two_reactors {
        ("0x3", "0x3")
    } else {
        ("0x1", "0x2")
    }
}

fn start_target(always_invalidate: bool) -> Target {
    let mut c = Command::new(TARGET);
    let (mask, _) = masks(!always_invalidate);
    c.args(["-m", mask, "--idle", "adaptive", "--export", "vol=ram:16M"]);
    for a in ADDRS {
        c.args(["--listen", &format!("tcp://{a}:0")]);
    }
    c.args(["--heartbeat", HB, "--heartbeat-missed", HB_MISSED]);
    if !always_invalidate {
        c.arg("--no-always-invalidate");
    }
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rtrs-target");
    let out = child.stdout.take().expect("stdout");
    let log = drain(child.stderr.take().expect("stderr"));
    let kid = Kid(Some(child));
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let ready = rx
        .recv_timeout(WAIT)
        .expect("rtrs-target printed no ready line");
    let port = |a: &str| -> u16 {
        ready
            .split(&format!("tcp://{a}:"))
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port of {a} in the ready line {ready:?}"))
    };
    Target {
        kid,
        ports: [port(ADDRS[0]), port(ADDRS[1])],
        log,
    }
}

/// The breaks of one run, per path, and the requests failed over in it.
struct Outcome {
    breaks: [usize; 2],
    failovers: u64,
}

/// What one run saw: its verdict, and the longest time the bench or the target waited
/// for a CPU meanwhile.
struct Observed {
    verdict: Result<Outcome, String>,
    starved: Duration,
}

/// `Err(msg)` unless `cond`.
fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// One run: target, bench, breaks until shortly before the bench's end, checks.
fn run(
    always_invalidate: bool,
    rw: &str,
    silence: bool,
    rng: &mut Rng,
    first_table: usize,
) -> Observed {
    let t = start_target(always_invalidate);
    let urls: Vec<String> = (0..2)
        .map(|k| format!("tcp://{}:{}", ADDRS[k], t.ports[k]))
        .collect();
    let run_for = if silence { RUN_SILENCE } else { RUN };
    let time = format!("{}s", run_for.as_secs());
    let two = !always_invalidate;
    let mut args = vec![
        "-m",
        masks(two).1,
        "--idle",
        "adaptive",
        "--device",
        "vol",
        "--path",
        &urls[0],
        "--path",
        &urls[1],
        "--rw",
        rw,
        "--bs",
        "4K",
        "--qd",
        "16",
        "--size",
        "8M",
        "--time",
        &time,
        "--verify",
        "--json",
        "--heartbeat",
        HB,
        "--heartbeat-missed",
        HB_MISSED,
        "--reconnect-delay",
        "100ms",
        // Path errors and reconnects on stderr (shown when a check fails).
        "-vv",
    ];
    if rw == "read" {
        args.push("--warmup-write");
    }
    let mut child = Command::new(BENCH)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rtrs-bench");
    let out = drain(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let mut bench = Kid(Some(child));
    let started = Instant::now();
    let watch = CpuWatch::start(vec![bench.pid(), t.kid.pid()]);

    // One IO connection per bench core plus cid 0, per path.
    let cons = if two { 3 } else { 2 };
    let mut breaks = [0usize; 2];
    let mut log = Vec::new();
    let mut p = rng.below(2) as usize;
    let mut up = (0..2).all(|k| wait_carrying_io(ADDRS[k], t.ports[k], cons, &mut bench));
    // Breaks end well before the bench's measured time does (it starts after the
    // device is mapped), so the last broken path is back while the bench still runs.
    while up && started.elapsed() + Duration::from_millis(1500) < run_for {
        thread::sleep(Duration::from_millis(20 + rng.below(130)));
        // The second break of a `silence` run silences its path; the others kill its
        // sockets on the client's or the server's side.
        let nth = breaks.iter().sum::<usize>();
        let how = if silence && nth == 1 { 2 } else { rng.below(2) };
        let what = break_path(
            ADDRS[p],
            t.ports[p],
            how,
            first_table + nth + 1,
            SILENCE_MAX,
        )
        .unwrap_or_else(|e| panic!("breaking path {}: {e}", ADDRS[p]));
        breaks[p] += 1;
        log.push(format!(
            "{:.2}s {} {what}",
            started.elapsed().as_secs_f64(),
            ADDRS[p]
        ));
        up = wait_carrying_io(ADDRS[p], t.ports[p], cons, &mut bench);
        p ^= 1;
    }
    let status = bench.wait(run_for + WAIT * 2);
    let starved = watch.finish();
    let stdout = out.recv_timeout(WAIT).unwrap_or_default();
    let stderr = err.recv_timeout(WAIT).unwrap_or_default();
    drop(t.kid);
    let tlog = t.log.recv_timeout(WAIT).unwrap_or_default();
    let ctx = format!(
        "always_invalidate {always_invalidate}, {rw}; longest wait for a CPU: bench {:?}, \
         target {:?}; breaks:\n  {}\nbench: {status:?}\n{stderr}{stdout}\ntarget log:\n{tlog}",
        starved.first().copied().unwrap_or_default(),
        starved.get(1).copied().unwrap_or_default(),
        log.join("\n  ")
    );
    let verdict = (|| {
        ensure(up, || format!("a path did not come back within {WAIT:?}"))?;
        ensure(status.success(), || "the bench failed".into())?;
        let v: Value = serde_json::from_str(stdout.trim())
            .map_err(|e| format!("not one JSON object ({e})"))?;
        ensure(v["errors"].as_u64() == Some(0), || "IO errors".into())?;
        ensure(v["verify_mismatches"].as_u64() == Some(0), || {
            "verify mismatches".into()
        })?;
        ensure(v["ios"].as_u64().unwrap_or(0) > 0, || "no IO".into())?;
        let paths = v["client_stats"]["paths"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ensure(paths.len() == 2, || "not two paths in client_stats".into())?;
        let mut failovers = 0;
        for (k, addr) in ADDRS.iter().enumerate() {
            let want = format!("{addr}:{}", t.ports[k]);
            let ps = paths
                .iter()
                .find(|s| s["path"].as_str().is_some_and(|s| s.contains(&want)))
                .ok_or_else(|| format!("no statistics of path {want}"))?;
            ensure(ps["state"] == "connected", || {
                format!("path {want} ends {}", ps["state"])
            })?;
            let rec = ps["reconnects"]["successful"].as_u64();
            ensure(rec == Some(breaks[k] as u64), || {
                format!(
                    "path {want} reconnected {rec:?} times: it was closed other than by \
                     its {} breaks",
                    breaks[k]
                )
            })?;
            failovers += ps["rdma"]["failover_cnt"].as_u64().unwrap_or(0);
        }
        eprintln!(
            "failover_os: always_invalidate {always_invalidate}, {rw}, reactors per side {}: \
             breaks {breaks:?}, failed-over requests {failovers}, ios {}, longest wait for a \
             CPU {:?}",
            if two { 2 } else { 1 },
            v["ios"],
            starved.iter().max().copied().unwrap_or_default()
        );
        Ok(Outcome { breaks, failovers })
    })()
    .map_err(|why: String| format!("{why}: {ctx}"));
    Observed {
        verdict,
        starved: starved.iter().max().copied().unwrap_or_default(),
    }
}

#[test]
fn os_level_breaks_never_lose_io_or_close_the_healthy_path() {
    if let Err(why) = tools_usable() {
        eprintln!("\n*** failover_os: SKIPPED: ss -K / nft unusable here: {why} ***\n");
        return;
    }
    remove_orphan_tables();
    let seed = std::env::var("FAILOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("failover_os: seed {seed} (FAILOVER_SEED reproduces the schedule)");
    let mut rng = Rng(seed);
    // Every IO pattern with always_invalidate on and off; every other run has a silence.
    let mut plan: Vec<(bool, &str, bool)> = Vec::new();
    for ai in [true, false] {
        for rw in ["randrw", "write", "read"] {
            plan.push((ai, rw, plan.len() % 2 == 0));
        }
    }
    let (mut total, mut failovers, mut k, mut repeats) = (0, 0, 0, 0);
    // More randrw runs while the breaks are short of the minimum (a slow machine), bounded.
    while k < plan.len() || (total < MIN_BREAKS && k < plan.len() + 4) {
        let (ai, rw, silence) = plan
            .get(k)
            .copied()
            .unwrap_or((k % 2 == 0, "randrw", false));
        let o = run(ai, rw, silence, &mut rng, total + repeats * 100);
        match o.verdict {
            Ok(o) => {
                total += o.breaks.iter().sum::<usize>();
                failovers += o.failovers;
                k += 1;
            }
            // A process that got no CPU for as long as a heartbeat takes to declare a
            // path dead makes a healthy path look dead: that run proves nothing, so it is
            // run again (a few times at most). Any other failure fails the test.
            Err(why) if o.starved >= STARVED && repeats < 3 => {
                repeats += 1;
                eprintln!(
                    "failover_os: a process waited {:?} for a CPU (the heartbeat declares \
                     a path dead after {STARVED:?} of silence): repeating the run. It failed \
                     with: {}",
                    o.starved,
                    why.lines().next().unwrap_or("")
                );
            }
            Err(why) => panic!("{why}"),
        }
    }
    eprintln!(
        "failover_os: {total} breaks, {failovers} failed-over requests in {k} runs \
         ({repeats} repeated after CPU starvation)"
    );
    assert!(total >= MIN_BREAKS, "only {total} breaks in {k} runs");
    assert!(failovers > 0, "no request was ever failed over");
}
