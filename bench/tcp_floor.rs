//! Plain-TCP floor for `bench/spdk_vs_nvmf.sh`: the best any TCP transport can do for one
//! block-IO shape on this machine, measured in the same run as the transports it bounds.
//!
//! Two threads over 127.0.0.1, each pinned to one core (the server on the target's core,
//! the client on the initiator's). The client keeps `--qd` requests of `--req` bytes in
//! flight; the server answers each with `--resp` bytes. Messages have fixed sizes, so
//! neither side parses anything: the server counts complete requests in what one `recv`
//! returned and writes that many responses in one `send`; the client counts complete
//! responses, records their latency and writes as many new requests in one `send`. That
//! is batching as deep as the queue depth with no user work beyond the syscalls and the
//! kernel's copies — no framing, no buffer management, no completion bookkeeping.
//!
//! Two ways to wait (`--mode`): `poll`, non-blocking sockets busy-polled as SPDK's posix
//! sock and the tcp fabric do, and `block`, blocking sockets (each side sleeps in `recv`).
//! Paired runs on the 2-CPU machine while other builds ran (load 2 to 4): `poll` was the
//! faster for 4 KiB reads at QD32 (1.2 to 2.5 times) and, at load 2, at QD1 (4 times: no
//! wake-up per message); `block` matched or beat it at 128 KiB QD8, and for 4 KiB writes
//! at load 4, where a spinning thread loses its core to the other jobs. With a core to
//! itself, as each side has here on an idle machine, spinning costs nothing and saves the
//! wake-up, so `poll` is the default; `block` stays to recheck that on an idle machine.
//!
//! Prints one JSON line: IOs, IOPS, average / p50 / p99 latency (µs, from a log-linear
//! histogram within 1.6 %), and each side's syscalls (every `recv` and `send`, idle ones
//! included) per IO.
//!
//! `cargo run --release --example tcp_floor -- --qd 32 --req 64 --resp 4160 --time 6`

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Poll,
    Block,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Block => "block",
        }
    }
}

#[derive(Clone, Copy)]
struct Opts {
    qd: usize,
    req: usize,
    resp: usize,
    secs: f64,
    warmup: f64,
    server_core: usize,
    client_core: usize,
    port: u16,
    mode: Mode,
}

const USAGE: &str = "usage: tcp_floor [--qd N] [--req BYTES] [--resp BYTES] [--time SECS] \
[--warmup SECS] [--server-core C] [--client-core C] [--port P] [--mode poll|block]";

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        qd: 32,
        req: 64,
        resp: 4096 + 64,
        secs: 5.0,
        warmup: 1.0,
        server_core: 0,
        client_core: 1,
        port: 0,
        mode: Mode::Poll,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--bench" {
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))?;
        let num = |what: &str| -> Result<usize, String> {
            v.parse().map_err(|_| format!("{a}: {v:?} is not {what}"))
        };
        let secs = || -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| format!("{a}: {v:?} is not a number of seconds"))
        };
        match a.as_str() {
            "--qd" => o.qd = num("a queue depth")?,
            "--req" => o.req = num("a size in bytes")?,
            "--resp" => o.resp = num("a size in bytes")?,
            "--time" => o.secs = secs()?,
            "--warmup" => o.warmup = secs()?,
            "--server-core" => o.server_core = num("a core number")?,
            "--client-core" => o.client_core = num("a core number")?,
            "--port" => {
                o.port = v
                    .parse()
                    .map_err(|_| format!("--port: {v:?} is not a port"))?
            }
            "--mode" => {
                o.mode = match v.as_str() {
                    "poll" => Mode::Poll,
                    "block" => Mode::Block,
                    _ => return Err(format!("--mode: {v:?} is neither poll nor block")),
                }
            }
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    if o.qd == 0 || o.req == 0 || o.resp == 0 || o.secs <= 0.0 {
        return Err(format!(
            "--qd, --req, --resp and --time must be positive\n{USAGE}"
        ));
    }
    Ok(o)
}

/// Pins the calling thread to `core`; a core this process may not use is an error, since
/// an unpinned floor would not be the same set-up as the runs it bounds.
fn pin(core: usize) -> Result<(), String> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let id = ids
        .into_iter()
        .find(|c| c.id == core)
        .ok_or_else(|| format!("core {core} is not available to this process"))?;
    if core_affinity::set_for_current(id) {
        Ok(())
    } else {
        Err(format!("could not pin a thread to core {core}"))
    }
}

/// Latency histogram, log-linear: exact below 128 ns, then 64 buckets per power of two.
struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
}

const SUB: u32 = 6; // 2^6 = 64 sub-buckets per octave

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: vec![0; 128 + 64 * 64],
            total: 0,
            sum_ns: 0,
        }
    }

    fn index(ns: u64) -> usize {
        if ns < 128 {
            return ns as usize;
        }
        let msb = 63 - ns.leading_zeros();
        let shift = msb - SUB;
        let mantissa = (ns >> shift) as usize; // in [64, 128)
        128 + (msb as usize - 7) * 64 + (mantissa - 64)
    }

    /// The middle of bucket `i`, in nanoseconds.
    fn value(i: usize) -> f64 {
        if i < 128 {
            return i as f64;
        }
        let octave = (i - 128) / 64;
        let mantissa = ((i - 128) % 64 + 64) as u64;
        let shift = octave as u32 + 7 - SUB;
        ((mantissa << shift) as f64) + ((1u64 << shift) as f64) / 2.0
    }

    fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum_ns += u128::from(ns);
    }

    fn reset(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.total = 0;
        self.sum_ns = 0;
    }

    fn percentile_us(&self, p: f64) -> f64 {
        let want = ((self.total as f64) * p / 100.0).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::value(i) / 1000.0;
            }
        }
        0.0
    }

    fn avg_us(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.total as f64 / 1000.0
        }
    }
}

/// The server: reads requests, answers each complete one with `resp` bytes. Publishes its
/// syscall count (a plain store per loop, read by the client at the window's edges) and
/// ends when the client closes the connection.
fn serve(mut s: TcpStream, o: Opts, calls: &AtomicU64) -> Result<(), String> {
    pin(o.server_core)?;
    let mut rbuf = vec![0u8; (o.qd * o.req).max(64 * 1024)];
    let sbuf = vec![0x5au8; o.qd * o.resp];
    let (mut partial, mut pending, mut n_calls) = (0usize, 0usize, 0u64);
    loop {
        n_calls += 1;
        match s.read(&mut rbuf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                partial += n;
                pending += partial / o.req * o.resp;
                partial %= o.req;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) if closed(&e) => return Ok(()),
            Err(e) => return Err(format!("server recv: {e}")),
        }
        while pending > 0 {
            n_calls += 1;
            match s.write(&sbuf[..pending.min(sbuf.len())]) {
                Ok(n) => pending -= n,
                // Poll mode: the socket is full; read more before trying again.
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if closed(&e) => return Ok(()),
                Err(e) => return Err(format!("server send: {e}")),
            }
            if o.mode == Mode::Poll {
                break;
            }
        }
        calls.store(n_calls, Ordering::Relaxed);
    }
}

fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted
    )
}

struct Outcome {
    ios: u64,
    secs: f64,
    hist: Histogram,
    client_calls: u64,
    server_calls: u64,
}

/// The client: keeps `qd` requests in flight for the warm-up and the measured window.
fn drive(mut c: TcpStream, o: Opts, server_calls: &AtomicU64) -> Result<Outcome, String> {
    pin(o.client_core)?;
    let sbuf = vec![0xa5u8; o.qd * o.req];
    let mut rbuf = vec![0u8; (o.qd * o.resp).max(64 * 1024)];
    // Submission times of the requests in flight, oldest first (responses come in order).
    let mut stamps = vec![0u64; o.qd];
    let (mut head, mut inflight, mut unsent, mut partial) = (0usize, 0usize, 0usize, 0usize);
    let mut hist = Histogram::new();
    let mut calls = 0u64;
    let t0 = Instant::now();
    let warm_end = (o.warmup * 1e9) as u64;
    let end = warm_end + (o.secs * 1e9) as u64;
    let mut measuring = false;
    let (mut ios, mut calls0, mut server0, mut start_ns) = (0u64, 0u64, 0u64, 0u64);
    let mut now = 0u64;
    loop {
        // Fill the queue: every free slot becomes a request stamped now.
        while inflight < o.qd {
            stamps[(head + inflight) % o.qd] = now;
            inflight += 1;
            unsent += o.req;
        }
        while unsent > 0 {
            calls += 1;
            match c.write(&sbuf[..unsent.min(sbuf.len())]) {
                Ok(n) => unsent -= n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(format!("client send: {e}")),
            }
            if o.mode == Mode::Poll {
                break;
            }
        }
        calls += 1;
        let got = match c.read(&mut rbuf) {
            Ok(0) => return Err("server closed the connection".into()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
            Err(e) => return Err(format!("client recv: {e}")),
        };
        now = t0.elapsed().as_nanos() as u64;
        partial += got;
        let done = partial / o.resp;
        partial %= o.resp;
        for _ in 0..done {
            if measuring {
                hist.record(now - stamps[head]);
            }
            head = (head + 1) % o.qd;
        }
        inflight -= done;
        if measuring {
            ios += done as u64;
        }
        if !measuring && now >= warm_end {
            measuring = true;
            hist.reset();
            start_ns = now;
            calls0 = calls;
            server0 = server_calls.load(Ordering::Relaxed);
        }
        if measuring && now >= end {
            let server = server_calls.load(Ordering::Relaxed) - server0;
            return Ok(Outcome {
                ios,
                secs: (now - start_ns) as f64 / 1e9,
                hist,
                client_calls: calls - calls0,
                server_calls: server,
            });
        }
    }
}

fn run(o: Opts) -> Result<Outcome, String> {
    let l = TcpListener::bind(("127.0.0.1", o.port))
        .map_err(|e| format!("bind 127.0.0.1:{}: {e}", o.port))?;
    let addr = l.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    let c = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let (s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
    for t in [&c, &s] {
        t.set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        t.set_nonblocking(o.mode == Mode::Poll)
            .map_err(|e| format!("O_NONBLOCK: {e}"))?;
    }
    let server_calls = Arc::new(AtomicU64::new(0));
    let server = {
        let calls = Arc::clone(&server_calls);
        thread::spawn(move || serve(s, o, &calls))
    };
    let closer = c.try_clone().map_err(|e| format!("socket clone: {e}"))?;
    let outcome = drive(c, o, &server_calls);
    // Ends the server whichever way the client ended (a blocked recv or send returns).
    let _ = closer.shutdown(Shutdown::Both);
    let served = server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?;
    let outcome = outcome?;
    served?;
    Ok(outcome)
}

fn main() -> ExitCode {
    let o = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(o) {
        Ok(r) => {
            let per_io = |n: u64| {
                if r.ios == 0 {
                    0.0
                } else {
                    n as f64 / r.ios as f64
                }
            };
            println!(
                "{{\"mode\":\"{}\",\"qd\":{},\"req_bytes\":{},\"resp_bytes\":{},\"secs\":{:.3},\
\"ios\":{},\"iops\":{:.0},\"lat_avg_us\":{:.2},\"lat_p50_us\":{:.2},\"lat_p99_us\":{:.2},\
\"client_syscalls_per_io\":{:.3},\"server_syscalls_per_io\":{:.3}}}",
                o.mode.name(),
                o.qd,
                o.req,
                o.resp,
                r.secs,
                r.ios,
                r.ios as f64 / r.secs,
                r.hist.avg_us(),
                r.hist.percentile_us(50.0),
                r.hist.percentile_us(99.0),
                per_io(r.client_calls),
                per_io(r.server_calls),
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tcp_floor: {e}");
            ExitCode::FAILURE
        }
    }
}
