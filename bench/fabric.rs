//! Fabric benchmark: ping-pong latency and 4 KiB RDMA_WRITE_WITH_IMM message rate over
//! the `loopback` and `tcp` fabrics, with plain TCP over 127.0.0.1 measured in the same
//! run as the floor. Two threads, pinned to different cores when there are two.
//!
//! Also the cost of one idle poll round over 1–3 connections: a `recv` per socket
//! (EAGAIN, what the tcp fabric does) against one `epoll_wait(0)` over all of them (what
//! a poll group would do), so the choice between them rests on a figure.
//!
//! `cargo bench --bench fabric [-- --secs N] [--samples N]`

// Test code: a failed unwrap is a failed test (or bench setup) that names its line.
#![allow(clippy::unwrap_used)]

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{
    Access, CmEvent, Conn, Fabric, MemBuf, Mr, QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode,
};

const PING_LEN: usize = 64;
const MSG_LEN: usize = 4096;
const WINDOW: usize = 64;
const SIGNAL_EVERY: u64 = 16;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

struct Opts {
    secs: f64,
    samples: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        secs: 2.0,
        samples: 20_000,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let val = args.get(i + 1);
        match (args[i].as_str(), val) {
            ("--secs", Some(v)) => o.secs = v.parse().expect("--secs takes seconds"),
            ("--samples", Some(v)) => o.samples = v.parse().expect("--samples takes a count"),
            ("--bench", _) => {
                i += 1;
                continue;
            }
            (other, _) => panic!("unknown argument {other:?} (use --secs N, --samples N)"),
        }
        i += 2;
    }
    o
}

/// A result row.
struct Row {
    fabric: &'static str,
    test: &'static str,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    ops: Option<f64>,
    mib_s: Option<f64>,
}

/// The cores this process may run on, read once before any thread pins itself (a thread
/// spawned by a pinned thread inherits its one-core mask).
fn cores() -> &'static [core_affinity::CoreId] {
    static CORES: OnceLock<Vec<core_affinity::CoreId>> = OnceLock::new();
    CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

fn pin(core: usize) {
    let cores = cores();
    if cores.len() > 1 {
        core_affinity::set_for_current(cores[core % cores.len()]);
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// Connects a pair over `server`/`client`, driving both ends from this thread.
fn connect(
    server: &Arc<dyn Fabric>,
    client: &Arc<dyn Fabric>,
    caps: QpCaps,
) -> (Box<dyn Conn>, Box<dyn Conn>) {
    let mut listener = server
        .listen("127.0.0.1:0".parse().unwrap(), &ListenOptions::default())
        .expect("listen");
    let addr = listener.local_addr();
    let mut c = client
        .connect(addr, &ConnectOptions::new(caps, b"bench"))
        .expect("connect");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s: Option<Box<dyn Conn>> = None;
    let (mut c_up, mut s_up) = (false, false);
    while !(c_up && s_up) {
        assert!(
            Instant::now() < deadline,
            "connection over {addr} not established in 10 s"
        );
        if s.is_none() {
            if let Some(req) = listener.poll() {
                s = Some(req.accept(caps, b"ok").expect("accept"));
            }
        }
        match c.poll_cm() {
            Some(CmEvent::Established { .. }) => c_up = true,
            Some(ev) => panic!("client: {ev:?}"),
            None => {}
        }
        if let Some(s) = s.as_mut() {
            match s.poll_cm() {
                Some(CmEvent::Established { .. }) => s_up = true,
                Some(ev) => panic!("server: {ev:?}"),
                None => {}
            }
        }
    }
    (c, s.unwrap())
}

/// Remote buffer of a peer: where to write and with which key.
#[derive(Clone, Copy)]
struct Target {
    addr: u64,
    rkey: u32,
}

fn target(mr: &Mr) -> Target {
    Target {
        addr: mr.addr(),
        rkey: mr.rkey(),
    }
}

fn post_empty_recvs(conn: &mut dyn Conn, n: usize) {
    let wrs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sge: None,
        })
        .collect();
    conn.post_recv(&wrs).expect("post_recv");
}

/// Posts one WRITE_WITH_IMM of `len` bytes, polling for send slots if the queue is full.
fn write_imm(
    conn: &mut dyn Conn,
    src: &Mr,
    len: usize,
    to: Target,
    seq: u64,
    wcs: &mut [Wc],
) -> usize {
    let sges = [src.sge(0, len)];
    let wr = SendWr {
        wr_id: seq,
        op: SendOp::RdmaWriteWithImm {
            remote_addr: to.addr,
            rkey: to.rkey,
            imm: seq as u32,
        },
        sges: &sges,
        signaled: seq % SIGNAL_EVERY == 0,
    };
    let mut received = 0;
    loop {
        match conn.post_send(&[wr]) {
            Ok(()) => return received,
            Err(e) if e.kind == rtrs_spdk::fabric::PostErrorKind::QueueFull => {
                let n = conn.poll_cq(wcs);
                received += count_recvs(conn, &wcs[..n]);
            }
            Err(e) => panic!("post_send: {e}"),
        }
    }
}

/// Counts receive completions and reposts their receives; panics on errors.
fn count_recvs(conn: &mut dyn Conn, wcs: &[Wc]) -> usize {
    let mut n = 0;
    for wc in wcs {
        assert!(wc.status.is_ok(), "completion failed: {wc:?}");
        if wc.opcode == WcOpcode::RecvRdmaWithImm {
            conn.post_recv(&[RecvWr {
                wr_id: wc.wr_id,
                sge: None,
            }])
            .expect("repost");
            n += 1;
        }
    }
    n
}

fn fabric_pingpong(
    name: &'static str,
    server: Arc<dyn Fabric>,
    client: Arc<dyn Fabric>,
    o: &Opts,
) -> Row {
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 2,
    };
    let (mut c, mut s) = connect(&server, &client, caps);
    let c_mr = client.register(MemBuf::zeroed(PING_LEN), RW).unwrap();
    let s_mr = server.register(MemBuf::zeroed(PING_LEN), RW).unwrap();
    let (c_t, s_t) = (target(&c_mr), target(&s_mr));
    post_empty_recvs(&mut *c, 128);
    post_empty_recvs(&mut *s, 128);
    let samples = o.samples;
    let echo = thread::spawn(move || {
        pin(0);
        let mut wcs = [Wc::default(); 32];
        let mut seq = 0u64;
        while seq < samples as u64 + 1000 {
            let n = s.poll_cq(&mut wcs);
            let got = count_recvs(&mut *s, &wcs[..n]);
            for _ in 0..got {
                seq += 1;
                write_imm(&mut *s, &s_mr, PING_LEN, c_t, seq, &mut wcs);
            }
        }
        // Keep the connection serviced until the client has read the last reply.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            s.poll_cq(&mut wcs);
        }
        s
    });
    pin(1);
    let mut wcs = [Wc::default(); 32];
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples as u64 + 1000 {
        let t0 = Instant::now();
        let mut got = write_imm(&mut *c, &c_mr, PING_LEN, s_t, i + 1, &mut wcs);
        while got == 0 {
            let n = c.poll_cq(&mut wcs);
            got += count_recvs(&mut *c, &wcs[..n]);
        }
        if i >= 1000 {
            lat.push(t0.elapsed().as_nanos() as u64);
        }
    }
    let _s = echo.join().expect("echo thread");
    lat.sort_unstable();
    Row {
        fabric: name,
        test: "ping-pong 64 B",
        p50_us: Some(percentile(&lat, 0.50)),
        p99_us: Some(percentile(&lat, 0.99)),
        ops: None,
        mib_s: None,
    }
}

fn fabric_rate(
    name: &'static str,
    server: Arc<dyn Fabric>,
    client: Arc<dyn Fabric>,
    o: &Opts,
) -> Row {
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 512,
        max_send_sge: 2,
    };
    let (mut c, mut s) = connect(&server, &client, caps);
    let c_mr = client.register(MemBuf::zeroed(MSG_LEN), RW).unwrap();
    let s_mr = server
        .register(MemBuf::zeroed(MSG_LEN * WINDOW), RW)
        .unwrap();
    let s_t = target(&s_mr);
    post_empty_recvs(&mut *s, 512);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(2));
    let (stop2, start2) = (stop.clone(), start.clone());
    let sink = thread::spawn(move || {
        pin(0);
        let mut wcs = [Wc::default(); 64];
        let mut got = 0u64;
        start2.wait();
        while !stop2.load(Ordering::Relaxed) {
            let n = s.poll_cq(&mut wcs);
            got += count_recvs(&mut *s, &wcs[..n]) as u64;
        }
        let _keep = s_mr;
        (got, s)
    });
    pin(1);
    let mut wcs = [Wc::default(); 64];
    start.wait();
    let t0 = Instant::now();
    let mut seq = 0u64;
    while t0.elapsed().as_secs_f64() < o.secs {
        for _ in 0..WINDOW {
            seq += 1;
            let slot = (seq as usize % WINDOW) * MSG_LEN;
            let to = Target {
                addr: s_t.addr + slot as u64,
                rkey: s_t.rkey,
            };
            write_imm(&mut *c, &c_mr, MSG_LEN, to, seq, &mut wcs);
        }
        c.poll_cq(&mut wcs);
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let (got, _s) = sink.join().expect("sink thread");
    let ops = got as f64 / elapsed;
    Row {
        fabric: name,
        test: "4 KiB write+imm rate",
        p50_us: None,
        p99_us: None,
        ops: Some(ops),
        mib_s: Some(ops * MSG_LEN as f64 / (1 << 20) as f64),
    }
}

fn plain_tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let c = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    for t in [&c, &s] {
        t.set_nodelay(true).unwrap();
        t.set_nonblocking(true).unwrap();
    }
    (c, s)
}

/// Busy-polls a non-blocking socket until `buf` is full (as a polled engine would).
fn read_full(t: &mut TcpStream, buf: &mut [u8]) {
    let mut at = 0;
    while at < buf.len() {
        match t.read(&mut buf[at..]) {
            Ok(0) => panic!("peer closed"),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn write_full(t: &mut TcpStream, buf: &[u8]) {
    let mut at = 0;
    while at < buf.len() {
        match t.write(&buf[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("write: {e}"),
        }
    }
}

fn tcp_pingpong(o: &Opts) -> Row {
    let (mut c, mut s) = plain_tcp_pair();
    let n = o.samples + 1000;
    let echo = thread::spawn(move || {
        pin(0);
        let mut buf = [0u8; PING_LEN];
        for _ in 0..n {
            read_full(&mut s, &mut buf);
            write_full(&mut s, &buf);
        }
    });
    pin(1);
    let mut buf = [0u8; PING_LEN];
    let mut lat = Vec::with_capacity(o.samples);
    for i in 0..n {
        let t0 = Instant::now();
        write_full(&mut c, &buf);
        read_full(&mut c, &mut buf);
        if i >= 1000 {
            lat.push(t0.elapsed().as_nanos() as u64);
        }
    }
    echo.join().unwrap();
    lat.sort_unstable();
    Row {
        fabric: "plain tcp",
        test: "ping-pong 64 B",
        p50_us: Some(percentile(&lat, 0.50)),
        p99_us: Some(percentile(&lat, 0.99)),
        ops: None,
        mib_s: None,
    }
}

fn tcp_rate(o: &Opts) -> Row {
    let (mut c, mut s) = plain_tcp_pair();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sink = thread::spawn(move || {
        pin(0);
        let mut buf = vec![0u8; 256 * 1024];
        let mut bytes = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        bytes
    });
    pin(1);
    let msg = [0u8; MSG_LEN];
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < o.secs {
        write_full(&mut c, &msg);
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let bytes = sink.join().unwrap();
    let ops = bytes as f64 / MSG_LEN as f64 / elapsed;
    Row {
        fabric: "plain tcp",
        test: "4 KiB writes, 1/syscall",
        p50_us: None,
        p99_us: None,
        ops: Some(ops),
        mib_s: Some(ops * MSG_LEN as f64 / (1 << 20) as f64),
    }
}

fn cell(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.prec$}"))
}

/// Nanoseconds per idle poll round over `n` connected, idle, non-blocking sockets: one
/// `recv` (EAGAIN) per socket, and one `epoll_wait` with zero timeout over all of them.
/// The best of several alternating batches (interference from other work only adds).
fn idle_poll_round_ns(n: usize) -> (f64, f64) {
    const ROUNDS: u32 = 20_000;
    let pairs: Vec<(TcpStream, TcpStream)> = (0..n).map(|_| plain_tcp_pair()).collect();
    // SAFETY: epoll_create1 with valid flags; the fd is closed below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(
        ep >= 0,
        "epoll_create1: {}",
        std::io::Error::last_os_error()
    );
    for (i, (ours, _)) in pairs.iter().enumerate() {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        // SAFETY: `ep` and the socket are open fds; `ev` is a valid event for the call.
        let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, ours.as_raw_fd(), &mut ev) };
        assert_eq!(r, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
    }
    let mut buf = [0u8; 64];
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
    let (mut best_recv, mut best_epoll) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..ROUNDS {
            for (ours, _) in &pairs {
                let mut s = ours;
                assert!(s.read(&mut buf).is_err(), "an idle socket had data");
            }
        }
        best_recv = best_recv.min(t.elapsed().as_nanos() as f64 / f64::from(ROUNDS));
        let t = Instant::now();
        for _ in 0..ROUNDS {
            // SAFETY: `events` has room for 4 entries, as the call is told.
            let r = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 4, 0) };
            assert_eq!(r, 0, "an idle socket was ready");
        }
        best_epoll = best_epoll.min(t.elapsed().as_nanos() as f64 / f64::from(ROUNDS));
    }
    // SAFETY: `ep` is ours and not used after this.
    unsafe { libc::close(ep) };
    (best_recv, best_epoll)
}

fn main() {
    let o = opts();
    let ncores = cores().len();
    let loopback = || -> Arc<dyn Fabric> { Arc::new(LoopbackFabric::new()) };
    let tcp = || -> Arc<dyn Fabric> { Arc::new(TcpFabric::new()) };
    let lb = loopback();
    let rows = vec![
        tcp_pingpong(&o),
        fabric_pingpong("loopback", lb.clone(), lb.clone(), &o),
        fabric_pingpong("tcp", tcp(), tcp(), &o),
        tcp_rate(&o),
        fabric_rate("loopback", lb.clone(), lb, &o),
        fabric_rate("tcp", tcp(), tcp(), &o),
    ];
    let floor = rows[0].p50_us.expect("plain tcp p50");
    println!(
        "\n{:<10} {:<22} {:>9} {:>9} {:>11} {:>10} {:>12}",
        "fabric", "test", "p50 us", "p99 us", "ops/s", "MiB/s", "p50/floor"
    );
    for r in &rows {
        let ratio = r.p50_us.map(|p| p / floor);
        println!(
            "{:<10} {:<22} {:>9} {:>9} {:>11} {:>10} {:>12}",
            r.fabric,
            r.test,
            cell(r.p50_us, 2),
            cell(r.p99_us, 2),
            cell(r.ops, 0),
            cell(r.mib_s, 1),
            cell(ratio, 2),
        );
    }
    println!(
        "\n{} cores (peers pinned to different cores when 2+); {} s per rate test, {} ping-pong samples; floor = plain TCP ping-pong p50 over 127.0.0.1",
        ncores,
        o.secs,
        o.samples
    );
    println!("\nidle poll round (best of 5 batches): connections, recv per socket, epoll_wait(0)");
    for n in 1..=3 {
        let (recv, epoll) = idle_poll_round_ns(n);
        println!("{n} idle connection(s): {recv:>7.0} ns  {epoll:>7.0} ns");
    }
}
