//! The readiness set's backends, and a shared tcp CQ that reads no idle socket.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;
use crate::fabric::soft::cq::DIRECT_IDLE_POLLS;
use crate::fabric::tcp::rx::READS;
use crate::fabric::tcp::{TcpConn, TcpFabric};
use crate::fabric::{
    Access, CmEvent, Conn, ConnRequest, ConnectOptions, Cq, Fabric, ListenOptions, Listener,
    MemBuf, Mr, QpCaps, RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};

const WAIT: Duration = Duration::from_secs(5);

fn backends() -> Vec<Box<dyn Readiness>> {
    vec![
        Box::new(ReadyUring::new().expect("io_uring (kernel.io_uring_disabled = 0)")),
        Box::new(Epoll::new().expect("epoll")),
    ]
}

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    a.set_nonblocking(true).expect("nonblocking");
    b.set_nonblocking(true).expect("nonblocking");
    (a, b)
}

fn key(gen: u32, slot: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(slot)
}

/// Collects for up to `rounds` polls (a few ms apart), returning every key seen.
fn collect_for(set: &mut dyn Readiness, rounds: usize) -> Vec<u64> {
    let mut seen = Vec::new();
    for _ in 0..rounds {
        set.collect(&mut |k| seen.push(k));
        std::thread::sleep(Duration::from_millis(2));
    }
    seen
}

/// Collects until `want` is reported, panicking after [`WAIT`].
fn wait_for(set: &mut dyn Readiness, want: u64) -> Vec<u64> {
    let start = Instant::now();
    let mut seen = Vec::new();
    while !seen.contains(&want) {
        assert!(
            start.elapsed() < WAIT,
            "{}: no event for {want:#x} (saw {seen:x?})",
            set.name()
        );
        set.collect(&mut |k| seen.push(k));
        std::thread::yield_now();
    }
    seen
}

fn drain(s: &mut UnixStream) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) => panic!("read: {e}"),
        }
    }
}

#[test]
fn event_after_data_and_none_when_idle() {
    for mut set in backends() {
        let name = set.name();
        let (mut a, mut b) = pair();
        let k = key(1, 3);
        set.watch(a.as_raw_fd(), k).expect("watch");
        assert_eq!(
            collect_for(set.as_mut(), 5),
            Vec::<u64>::new(),
            "{name}: idle"
        );
        b.write_all(b"x").expect("write");
        let seen = wait_for(set.as_mut(), k);
        assert!(
            seen.iter().all(|&s| s == k),
            "{name}: only our key: {seen:x?}"
        );
        drain(&mut a);
        assert_eq!(
            collect_for(set.as_mut(), 5),
            Vec::<u64>::new(),
            "{name}: drained, nothing new"
        );
        // A second arrival raises a second event (the poll stays armed).
        b.write_all(b"y").expect("write");
        wait_for(set.as_mut(), k);
        // So does the peer going away.
        drain(&mut a);
        drop(b);
        wait_for(set.as_mut(), k);
    }
}

#[test]
fn a_removed_socket_reports_nothing() {
    for mut set in backends() {
        let name = set.name();
        let (a, mut b) = pair();
        let k = key(1, 0);
        set.watch(a.as_raw_fd(), k).expect("watch");
        set.unwatch(a.as_raw_fd(), k);
        b.write_all(b"x").expect("write");
        assert_eq!(collect_for(set.as_mut(), 10), Vec::<u64>::new(), "{name}");
    }
}

#[test]
fn stale_events_of_a_slot_reused_are_ignored() {
    for mut set in backends() {
        let name = set.name();
        let (a, mut b) = pair();
        let (c, _d) = pair();
        let old = key(1, 2);
        set.watch(a.as_raw_fd(), old).expect("watch");
        b.write_all(b"x").expect("write");
        // Let the event reach the ring or the ready list before the socket leaves.
        std::thread::sleep(Duration::from_millis(5));
        set.unwatch(a.as_raw_fd(), old);
        let new = key(2, 2);
        set.watch(c.as_raw_fd(), new).expect("watch");
        let seen = collect_for(set.as_mut(), 10);
        assert!(
            !seen.contains(&old),
            "{name}: stale key reported: {seen:x?}"
        );
        assert!(
            !seen.contains(&new),
            "{name}: idle socket reported: {seen:x?}"
        );
    }
}

#[test]
fn uring_rearms_a_multishot_poll_that_ended() {
    let mut set = ReadyUring::new().expect("io_uring");
    let (mut a, mut b) = pair();
    let k = key(1, 1);
    set.watch(a.as_raw_fd(), k).expect("watch");
    set.end_multishot(k).expect("end the poll");
    // The ending completion (no F_MORE) is reported as a possible event and re-armed.
    wait_for(&mut set, k);
    assert!(set.rearm.is_empty(), "re-armed");
    assert_eq!(collect_for(&mut set, 5), Vec::<u64>::new(), "idle after");
    b.write_all(b"x").expect("write");
    wait_for(&mut set, k);
    drain(&mut a);
}

/// A thread that writes one byte into one of its sockets when told, and says so, both by
/// spinning: between telling it and the collect after, the test's thread makes no system
/// call (whose return would run the ring's task work).
struct Writer {
    /// Sequence number << 1 | which socket; `u64::MAX` ends the thread.
    order: std::sync::Arc<std::sync::atomic::AtomicU64>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    seq: u64,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn new(mut peers: [UnixStream; 2]) -> Writer {
        use std::sync::atomic::AtomicU64;
        let order = std::sync::Arc::new(AtomicU64::new(0));
        let done = std::sync::Arc::new(AtomicU64::new(0));
        let (o, d) = (order.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            let mut last = 0;
            loop {
                let v = o.load(Ordering::Acquire);
                if v == u64::MAX {
                    return;
                }
                if v >> 1 != last {
                    last = v >> 1;
                    peers[(v & 1) as usize].write_all(b"x").expect("write");
                    d.store(last, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        });
        Writer {
            order,
            done,
            seq: 0,
            thread: Some(thread),
        }
    }

    /// Has a byte written into peer `which` (0 or 1), and waits until it is.
    fn write(&mut self, which: u64) {
        self.seq += 1;
        self.order.store(self.seq << 1 | which, Ordering::Release);
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) != self.seq {
            assert!(start.elapsed() < WAIT, "the writer thread did not write");
            std::hint::spin_loop();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.order.store(u64::MAX, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The calling thread's involuntary context switches so far.
fn preempted() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("thread status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("nonvoluntary_ctxt_switches in /proc/thread-self/status")
}

#[test]
fn uring_reads_the_last_socket_first_on_task_work_alone() {
    let mut set = ReadyUring::new().expect("io_uring");
    let (mut a, a_peer) = pair();
    let (mut c, c_peer) = pair();
    let (ka, kc) = (key(1, 1), key(1, 2));
    set.watch(a.as_raw_fd(), ka).expect("watch");
    set.watch(c.as_raw_fd(), kc).expect("watch");
    let mut w = Writer::new([a_peer, c_peer]);
    // Makes `a` the socket of the last event, everything read and collected.
    let reset = |set: &mut ReadyUring, w: &mut Writer, a: &mut UnixStream, c: &mut UnixStream| {
        w.write(0);
        wait_for(set, ka);
        drain(a);
        drain(c);
        let _ = collect_for(set, 2);
        assert_eq!(set.hot, Some(ka), "the last event was a's");
    };
    // Guesses made when `a` woke (right) and when `c` did (wrong); and tries in which the
    // thread ran from the write to the collect without being switched out, yet the ring
    // had more than task work (a switch back to this thread runs the work first, and
    // the ring then holds the event itself).
    let (mut right, mut wrong, mut unguessed) = (0, 0, 0);
    let start = Instant::now();
    while (right == 0 || wrong == 0) && unguessed < 20 && start.elapsed() < WAIT {
        for which in [0, 1] {
            reset(&mut set, &mut w, &mut a, &mut c);
            let before = preempted();
            w.write(which);
            let mut seen = Vec::new();
            set.collect(&mut |k| seen.push(k));
            let guessed = set.early;
            if !guessed && preempted() == before {
                unguessed += 1;
            }
            let woke = if which == 0 { ka } else { kc };
            if guessed {
                // Reported on task work alone, before the ring's completion was posted:
                // the last socket's key only...
                assert_eq!(seen, vec![ka], "the guess names the last socket only");
                // ...and the next collect takes the ring's events: the socket that woke.
                let mut next = Vec::new();
                set.collect(&mut |k| next.push(k));
                assert!(!set.early, "no two guesses in a row");
                assert_eq!(next, vec![woke], "the event after the guess");
                if which == 0 {
                    right += 1;
                } else {
                    wrong += 1;
                }
            } else {
                // The work ran first: the event itself, and no other.
                if !seen.contains(&woke) {
                    seen.extend(wait_for(&mut set, woke));
                }
                assert!(
                    seen.iter().all(|&k| k == woke),
                    "only {woke:#x} woke: {seen:x?}"
                );
            }
        }
    }
    // A machine too busy to leave the thread alone for a few microseconds cannot show
    // the guess; one that did, twenty times, without it, shows it missing.
    assert!(
        (right > 0 && wrong > 0) || unguessed < 20,
        "task work alone was never read early: right guesses {right}, wrong {wrong}, \
         {unguessed} undisturbed tries without a guess"
    );
}

// --- A shared tcp CQ end to end ---

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

struct Ends {
    cqs: [Cq; 2],
    /// Client's, server's.
    conns: [Box<dyn Conn>; 2],
    fabrics: [std::sync::Arc<TcpFabric>; 2],
}

/// A connected client and server, on shared ([`Ends`]) or private ([`Private`]) CQs.
trait Pair {
    fn fabrics(&self) -> &[std::sync::Arc<TcpFabric>; 2];
    /// Client's, server's.
    fn conns(&mut self) -> [&mut dyn Conn; 2];
    /// Polls both ends' CQs once, adding their completions to `got`.
    fn poll(&mut self, got: &mut Vec<Wc>);
}

impl Pair for Ends {
    fn fabrics(&self) -> &[std::sync::Arc<TcpFabric>; 2] {
        &self.fabrics
    }

    fn conns(&mut self) -> [&mut dyn Conn; 2] {
        let [c, s] = &mut self.conns;
        [c.as_mut(), s.as_mut()]
    }

    fn poll(&mut self, got: &mut Vec<Wc>) {
        let mut wcs = [Wc::default(); 16];
        for cq in &mut self.cqs {
            let n = cq.poll(&mut wcs);
            got.extend_from_slice(&wcs[..n]);
        }
    }
}

fn listen(server: &TcpFabric) -> Box<dyn Listener> {
    server
        .listen(
            "127.0.0.1:0".parse().expect("address"),
            &ListenOptions::default(),
        )
        .expect("listen")
}

/// Polls `l` (and `c`'s CM, which sends the request) until `c`'s request arrives.
fn await_request(l: &mut dyn Listener, c: &mut dyn Conn) -> ConnRequest {
    let start = Instant::now();
    loop {
        if let Some(r) = l.poll() {
            return r;
        }
        c.poll_cm();
        assert!(start.elapsed() < WAIT, "no request");
    }
}

/// Polls both ends until both are established (bounded).
fn establish(p: &mut impl Pair) {
    let start = Instant::now();
    let mut est = [false, false];
    while !(est[0] && est[1]) {
        assert!(start.elapsed() < WAIT, "not established");
        p.poll(&mut Vec::new());
        for (conn, est) in p.conns().into_iter().zip(&mut est) {
            while let Some(ev) = conn.poll_cm() {
                *est |= matches!(ev, CmEvent::Established { .. });
            }
        }
    }
}

fn connected(mode: TcpReadiness) -> Ends {
    let client = std::sync::Arc::new(TcpFabric::with_readiness(mode));
    let server = std::sync::Arc::new(TcpFabric::with_readiness(mode));
    let ccq = client.create_cq(256).expect("client cq");
    let scq = server.create_cq(256).expect("server cq");
    let mut l = listen(&server);
    let caps = QpCaps::default();
    let mut c = client
        .connect(
            l.local_addr(),
            &ConnectOptions::new(caps, &[]).on(&ccq.share()),
        )
        .expect("connect_on");
    let s = await_request(l.as_mut(), c.as_mut())
        .accept_into(&*server, Some(&scq.share()), caps, &[])
        .expect("accept on the server's CQ");
    let mut e = Ends {
        cqs: [ccq, scq],
        conns: [c, s],
        fabrics: [client, server],
    };
    establish(&mut e);
    e
}

/// Registers `len` bytes on each side, the client's filled with `imm`'s low byte, and
/// posts a receive on the server and an RDMA_WRITE_WITH_IMM of it all from the client.
/// Returns the client's and the server's registration.
fn post_write_imm(p: &mut impl Pair, len: u32, imm: u32) -> (Mr, Mr) {
    let [client, server] = p.fabrics().clone();
    let src = client
        .register(MemBuf::zeroed(len as usize), RW)
        .expect("register");
    src.write_at(0, &vec![imm as u8; len as usize]);
    let dst = server
        .register(MemBuf::zeroed(len as usize), RW)
        .expect("register");
    let [c, s] = p.conns();
    s.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }])
    .expect("post_recv");
    let sge = [Sge {
        addr: src.addr(),
        len,
        lkey: src.lkey(),
    }];
    c.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::RdmaWriteWithImm {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
            imm,
        },
        sges: &sge,
        signaled: true,
    }])
    .expect("post_send");
    (src, dst)
}

/// One 64 KiB RDMA_WRITE_WITH_IMM client → server, both completions awaited (bounded).
fn exchange(p: &mut impl Pair, imm: u32) {
    exchange_of(p, 64 * 1024, imm);
}

/// One RDMA_WRITE_WITH_IMM of `len` bytes client → server, both completions awaited
/// (bounded); the polls it took.
fn exchange_of(p: &mut impl Pair, len: u32, imm: u32) -> u64 {
    let (_src, dst) = post_write_imm(p, len, imm);
    let mut got = Vec::new();
    let start = Instant::now();
    let mut polls = 0;
    while got.len() < 2 {
        assert!(start.elapsed() < WAIT, "exchange {imm}: {got:?}");
        p.poll(&mut got);
        polls += 1;
    }
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    let recv = got
        .iter()
        .find(|w| w.opcode == WcOpcode::RecvRdmaWithImm)
        .expect("the server's completion");
    assert_eq!((recv.imm, recv.byte_len), (Some(imm), len), "{recv:?}");
    let mut back = vec![0u8; len as usize];
    dst.read_at(0, &mut back);
    assert!(back.iter().all(|&b| b == imm as u8), "payload landed");
    polls
}

/// Reads per poll of connections read on every poll: small frames, each taken whole by
/// one read, cost each connection at most one read per poll (a short read closes the
/// gate until the next poll: no empty read after the data). `connections` is how many
/// sockets a poll of the pair reads.
fn reads_while_busy(mut p: impl Pair, connections: u64) -> (u64, u64) {
    // The first exchange takes both connections out of their readiness sources.
    exchange_of(&mut p, 4096, 1);
    let before = READS.with(|r| r.get());
    let mut polls = 0;
    for imm in 2..50 {
        polls += exchange_of(&mut p, 4096, imm);
    }
    (READS.with(|r| r.get()) - before, polls * connections)
}

#[test]
fn a_busy_socket_is_read_once_per_poll_that_drains_it() {
    let (reads, most) = reads_while_busy(connected(TcpReadiness::Uring), 2);
    assert!(reads <= most, "shared CQ: {reads} reads, at most {most}");
    let (reads, most) = reads_while_busy(private_pair(TcpReadiness::Uring), 2);
    assert!(reads <= most, "private CQs: {reads} reads, at most {most}");
    // The count can exceed it: ungated, a poll that finds data reads once more.
    let (reads, most) = reads_while_busy(private_pair(TcpReadiness::None), 2);
    assert!(
        reads > most,
        "ungated: {reads} reads, {most} polls × connections"
    );
}

/// Lets the last ACKs arrive and be read.
fn settle(p: &mut impl Pair) {
    for _ in 0..50 {
        p.poll(&mut Vec::new());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Socket reads of 100 polls of both ends right after an exchange, and of 1000 idle
/// polls once the connections have found no work for `DIRECT_IDLE_POLLS` polls (until
/// then, where no thread sleeps on the readiness set, a connection that found work is
/// read on every poll); then a check that the next arrival is still seen.
fn busy_and_idle_reads(mut p: impl Pair) -> (u64, u64) {
    exchange(&mut p, 7);
    let count = |p: &mut dyn FnMut(), n: u32| {
        let before = READS.with(|r| r.get());
        for _ in 0..n {
            p();
        }
        READS.with(|r| r.get()) - before
    };
    let busy = count(&mut || p.poll(&mut Vec::new()), 100);
    settle(&mut p);
    for _ in 0..=DIRECT_IDLE_POLLS {
        p.poll(&mut Vec::new());
    }
    let idle = count(&mut || p.poll(&mut Vec::new()), 1000);
    exchange(&mut p, 9);
    (busy, idle)
}

fn idle_reads(p: impl Pair) -> u64 {
    busy_and_idle_reads(p).1
}

#[test]
fn an_idle_shared_cq_reads_no_socket() {
    for mode in [TcpReadiness::Uring, TcpReadiness::Epoll] {
        assert_eq!(
            idle_reads(connected(mode)),
            0,
            "{mode:?}: reads of 1000 idle polls"
        );
    }
    // Until idle, the ring's connections that found work are read on every poll (no
    // thread sleeps on a ring); an epoll set, which a thread may sleep on, keeps them.
    let (busy, _) = busy_and_idle_reads(connected(TcpReadiness::Uring));
    assert!(busy >= 100, "uring: {busy} reads in 100 polls after work");
    // The counter does count: without a set every poll reads both sockets.
    assert!(
        idle_reads(connected(TcpReadiness::None)) >= 2000,
        "none: every poll reads"
    );
}

/// Polls armed by one thread, collected by another while the first is busy in user
/// space: events come at once (the ring moves its polls to the thread that collects),
/// not at the first thread's next timer tick.
#[test]
fn uring_events_follow_the_collecting_thread() {
    let (mut a, mut b) = pair();
    let fd = a.as_raw_fd();
    let k = key(1, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spin = done.clone();
    let armer = std::thread::spawn(move || {
        let mut set = ReadyUring::new().expect("io_uring");
        set.watch(fd, k).expect("watch");
        set.collect(&mut |_| {});
        tx.send(set).expect("the test waits");
        // Alive and busy in user space, never entering the kernel, until the test ends.
        while !spin.load(std::sync::atomic::Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    });
    let mut set = rx.recv().expect("the set");
    // The first events move the polls here (their removal completes through the other
    // thread's task work, at its next timer tick).
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(100) {
        b.write_all(b"x").expect("write");
        wait_for(&mut set, k);
        drain(&mut a);
    }
    let mut lat = Vec::new();
    for _ in 0..31 {
        let t = Instant::now();
        b.write_all(b"x").expect("write");
        // Spin without system calls of our own, as an idle reactor does.
        let mut seen = false;
        while !seen {
            set.collect(&mut |x| seen |= x == k);
            assert!(t.elapsed() < WAIT, "no event");
        }
        lat.push(t.elapsed());
        drain(&mut a);
    }
    lat.sort();
    // Left with the busy thread, an event waits for its timer tick (milliseconds); once
    // moved, microseconds. The median tolerates a few deschedulings on a loaded machine.
    assert!(
        lat[15] < Duration::from_millis(1),
        "event latencies {lat:?}"
    );
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    armer.join().expect("armer");
}

// --- Private-CQ connections and their own ring ---

/// A connection's own ring, armed by a thread that then stays busy in user space, and
/// collected by another: the first collect there re-arms the poll from there under a new
/// key (and reports the socket possibly readable), so events come without that thread.
#[test]
fn own_ring_rearms_on_the_polling_thread() {
    let (mut a, mut b) = pair();
    let fd = a.as_raw_fd();
    let (tx, rx) = std::sync::mpsc::channel();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spin = done.clone();
    let armer = std::thread::spawn(move || {
        let mut own = Own::new();
        assert!(own.join(fd), "watch");
        assert!(!own.collect(), "idle on the arming thread");
        tx.send(own).expect("the test waits");
        while !spin.load(std::sync::atomic::Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    });
    let mut own = rx.recv().expect("the ring");
    let old = own.key();
    assert!(own.collect(), "a move reports the socket possibly readable");
    assert!(own.watching(), "still watched");
    assert_ne!(own.key(), old, "a new key");
    let ring = own.ring.as_ref().expect("ring");
    assert!(!ring.armed_elsewhere(), "armed by this thread");
    assert_eq!(ring.watched(own.key()), Some(fd));
    assert_eq!(ring.watched(old), None, "the old poll left");
    for _ in 0..3 {
        b.write_all(b"x").expect("write");
        let start = Instant::now();
        while !own.collect() {
            assert!(start.elapsed() < WAIT, "no event after the move");
        }
        drain(&mut a);
    }
    own.leave();
    assert!(!own.watching());
    b.write_all(b"y").expect("write");
    for _ in 0..5 {
        assert!(!own.collect(), "no event once left");
        std::thread::sleep(Duration::from_millis(2));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    armer.join().expect("armer");
}

/// A connected pair with private CQs: the client (unboxed, for its test hooks) and the
/// server.
struct Private {
    client: TcpConn,
    server: Box<dyn Conn>,
    fabrics: [std::sync::Arc<TcpFabric>; 2],
}

impl Pair for Private {
    fn fabrics(&self) -> &[std::sync::Arc<TcpFabric>; 2] {
        &self.fabrics
    }

    fn conns(&mut self) -> [&mut dyn Conn; 2] {
        [&mut self.client, self.server.as_mut()]
    }

    fn poll(&mut self, got: &mut Vec<Wc>) {
        let mut wcs = [Wc::default(); 16];
        for c in self.conns() {
            let n = c.poll_cq(&mut wcs);
            got.extend_from_slice(&wcs[..n]);
        }
    }
}

fn private_pair(mode: TcpReadiness) -> Private {
    let client = std::sync::Arc::new(TcpFabric::with_readiness(mode));
    let server = std::sync::Arc::new(TcpFabric::with_readiness(mode));
    let mut l = listen(&server);
    let caps = QpCaps::default();
    let mut c = client
        .start_connect(None, l.local_addr(), caps, &[], None)
        .expect("connect")
        .with_own_readiness(mode);
    let s = await_request(l.as_mut(), &mut c)
        .accept(caps, &[])
        .expect("accept");
    let mut p = Private {
        client: c,
        server: s,
        fabrics: [client, server],
    };
    establish(&mut p);
    p
}

#[test]
fn an_idle_private_cq_reads_no_socket() {
    let (busy, idle) = busy_and_idle_reads(private_pair(TcpReadiness::Uring));
    assert_eq!(idle, 0, "uring: reads of 1000 idle polls");
    assert!(busy >= 100, "uring: {busy} reads in 100 polls after work");
    // Epoll gains nothing on a private CQ: it reads on every poll, as does none.
    for mode in [TcpReadiness::Epoll, TcpReadiness::None] {
        assert!(
            idle_reads(private_pair(mode)) >= 2000,
            "{mode:?}: every poll reads"
        );
    }
}

/// Polls `conn` until `want` says its CM event came (bounded).
fn await_cm(conn: &mut dyn Conn, want: fn(&CmEvent) -> bool, what: &str) {
    let start = Instant::now();
    loop {
        let mut wcs = [Wc::default(); 16];
        conn.poll_cq(&mut wcs);
        if let Some(ev) = conn.poll_cm() {
            if want(&ev) {
                return;
            }
        }
        assert!(start.elapsed() < WAIT, "{what}: not seen");
    }
}

/// An idle gated connection sees its peer's EOF, and its peer's reset.
#[test]
fn an_idle_private_cq_sees_eof_and_reset() {
    // EOF: the peer half-closes its socket (no frame).
    let mut p = private_pair(TcpReadiness::Uring);
    exchange(&mut p, 1);
    settle(&mut p);
    p.client.shutdown_socket(std::net::Shutdown::Write);
    await_cm(
        p.server.as_mut(),
        |e| matches!(e, CmEvent::Disconnected),
        "EOF",
    );
    assert_eq!(p.server.state(), crate::fabric::ConnState::Disconnected);

    // Reset: the peer disconnects (a reset); and the gated side closing its socket is
    // seen by its peer at once (the ring let go of the socket before it closed).
    let mut p = private_pair(TcpReadiness::Uring);
    exchange(&mut p, 2);
    settle(&mut p);
    p.client.disconnect();
    await_cm(
        p.server.as_mut(),
        |e| matches!(e, CmEvent::Disconnected),
        "reset",
    );
    let mut p = private_pair(TcpReadiness::Uring);
    exchange(&mut p, 3);
    settle(&mut p);
    p.server.disconnect();
    await_cm(
        &mut p.client,
        |e| matches!(e, CmEvent::Disconnected),
        "the gated side's close",
    );
}

/// A gated private connection armed on one thread (which then stays busy in user space)
/// and polled on another after `release_thread` still gets its data.
#[test]
fn a_private_cq_polled_from_another_thread_gets_its_data() {
    let (tx, rx) = std::sync::mpsc::channel();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spin = done.clone();
    let armer = std::thread::spawn(move || {
        let mut p = private_pair(TcpReadiness::Uring);
        exchange(&mut p, 4);
        settle(&mut p);
        p.client.release_thread();
        p.server.release_thread();
        tx.send(p).expect("the test waits");
        while !spin.load(std::sync::atomic::Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    });
    let mut p = rx.recv().expect("the pair");
    for imm in 5..10 {
        exchange(&mut p, imm);
    }
    // Idle here too, once moved.
    settle(&mut p);
    for _ in 0..=DIRECT_IDLE_POLLS {
        p.poll(&mut Vec::new());
    }
    let before = READS.with(|r| r.get());
    for _ in 0..1000 {
        p.poll(&mut Vec::new());
    }
    assert_eq!(READS.with(|r| r.get()) - before, 0, "idle after the move");
    exchange(&mut p, 10);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    armer.join().expect("armer");
}

/// Posts 32 RDMA_WRITEs of 1 MiB on `from` (the client, of `fabrics[0]`) into memory of
/// `fabrics[1]`.
fn post_bulk(from: &mut dyn Conn, fabrics: &[std::sync::Arc<TcpFabric>; 2]) {
    let src = fabrics[0]
        .register(MemBuf::zeroed(1 << 20), RW)
        .expect("register");
    let dst = fabrics[1]
        .register(MemBuf::zeroed(1 << 20), RW)
        .expect("register");
    let s = [Sge {
        addr: src.addr(),
        len: 1 << 20,
        lkey: src.lkey(),
    }];
    let wrs: Vec<SendWr> = (0..32)
        .map(|i| SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            sges: &s,
            signaled: true,
        })
        .collect();
    from.post_send(&wrs).expect("post_send");
}

/// A peer's reset that arrives behind data (the read that drains the data is short and
/// closes the gate; the reset's event came before it) is still seen: a hung-up socket
/// stays reported until it leaves the set.
#[test]
fn a_reset_behind_data_is_seen_on_a_shared_cq() {
    for mode in [TcpReadiness::Uring, TcpReadiness::Epoll] {
        let mut e = connected(mode);
        post_bulk(e.conns[0].as_mut(), &e.fabrics);
        e.poll(&mut Vec::new());
        e.conns[0].disconnect();
        let start = Instant::now();
        while e.conns[1].state() != crate::fabric::ConnState::Disconnected {
            assert!(start.elapsed() < WAIT, "{mode:?}: the reset was not seen");
            e.poll(&mut Vec::new());
        }
    }
}

/// As above on private CQs, for a reset and for an EOF behind data.
#[test]
fn a_reset_or_eof_behind_data_is_seen_on_a_private_cq() {
    for eof in [false, true] {
        let mut p = private_pair(TcpReadiness::Uring);
        post_bulk(&mut p.client, &p.fabrics);
        p.poll(&mut Vec::new());
        if eof {
            // The client keeps sending what it can, then half-closes.
            for _ in 0..20 {
                p.poll(&mut Vec::new());
            }
            p.client.shutdown_socket(std::net::Shutdown::Write);
        } else {
            p.client.disconnect();
        }
        let start = Instant::now();
        while p.server.state() != crate::fabric::ConnState::Disconnected {
            assert!(start.elapsed() < WAIT, "eof {eof}: not seen");
            let mut wcs = [Wc::default(); 64];
            p.server.poll_cq(&mut wcs);
        }
    }
}

// --- Descriptors a sleeping poller waits on ---

/// Whether `fd` is readable within `ms` milliseconds (`poll`, as a sleeping thread's
/// `epoll_wait` would see it).
fn readable_within(fd: std::os::fd::RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(r >= 0, "poll: {}", std::io::Error::last_os_error());
    r > 0 && p.revents & libc::POLLIN != 0
}

#[test]
fn an_epoll_cq_wait_fd_is_readable_exactly_while_data_waits() {
    let mut e = connected(TcpReadiness::Epoll);
    exchange(&mut e, 3);
    // Polled until quiet: the server's CQ has nothing to wait for.
    settle(&mut e);
    let fd = e.cqs[1]
        .wait_fd()
        .expect("an epoll CQ has a descriptor to wait on");
    assert!(!readable_within(fd, 0), "readable with nothing arrived");
    // The client writes; the server's descriptor wakes a sleeper without any poll of it.
    let _mrs = post_write_imm(&mut e, 4096, 11);
    // Only the client's CQ is polled (it transmits there), never the server's.
    let start = Instant::now();
    while !readable_within(fd, 10) {
        assert!(
            start.elapsed() < WAIT,
            "the server's wait descriptor never woke"
        );
        let mut wcs = [Wc::default(); 16];
        let _ = e.cqs[0].poll(&mut wcs);
    }
    // The poll it wakes finds the request, and the descriptor is quiet again after.
    let mut got = Vec::new();
    while !got
        .iter()
        .any(|w: &Wc| w.opcode == WcOpcode::RecvRdmaWithImm)
    {
        assert!(
            start.elapsed() < WAIT,
            "no completion after the wake: {got:?}"
        );
        let mut wcs = [Wc::default(); 16];
        let n = e.cqs[1].poll(&mut wcs);
        got.extend_from_slice(&wcs[..n]);
        let _ = e.cqs[0].poll(&mut wcs);
    }
    settle(&mut e);
    assert!(
        !readable_within(fd, 0),
        "still readable after the data was read"
    );
}

#[test]
fn only_an_epoll_cq_offers_a_wait_fd() {
    let uring = TcpFabric::with_readiness(TcpReadiness::Uring);
    let none = TcpFabric::with_readiness(TcpReadiness::None);
    // A ring's events need task work of the polling thread: no descriptor to sleep on.
    assert!(uring.create_cq(64).expect("cq").wait_fd().is_none());
    assert!(none.create_cq(64).expect("cq").wait_fd().is_none());
    let epoll = TcpFabric::with_readiness(TcpReadiness::Epoll);
    assert!(epoll.create_cq(64).expect("cq").wait_fd().is_some());
}

#[test]
fn a_listener_wait_fd_wakes_for_a_connection_and_its_handshake() {
    let fabric = std::sync::Arc::new(TcpFabric::with_readiness(TcpReadiness::Epoll));
    let mut l = listen(&fabric);
    let fd = l
        .wait_fd()
        .expect("a tcp listener has a descriptor to wait on");
    assert!(!readable_within(fd, 0), "readable before any connection");
    assert!(l.poll().is_none());
    // A bare TCP connection, no handshake bytes yet: the listening socket wakes it.
    let mut raw = std::net::TcpStream::connect(l.local_addr()).expect("connect");
    assert!(readable_within(fd, 5000), "no wake for a new connection");
    assert!(l.poll().is_none(), "a request without its handshake");
    // Accepted and waiting for its handshake: quiet until the peer sends.
    assert!(
        !readable_within(fd, 0),
        "readable with the handshake not begun"
    );
    raw.write_all(&[0u8; 1]).expect("write");
    assert!(
        readable_within(fd, 5000),
        "no wake for the handshake's bytes"
    );
    // A real client: its request is produced after a wake, with no busy polling.
    let client = TcpFabric::with_readiness(TcpReadiness::Epoll);
    let mut c = client
        .connect(l.local_addr(), &ConnectOptions::new(QpCaps::default(), &[]))
        .expect("connect");
    let start = Instant::now();
    let req = loop {
        assert!(start.elapsed() < WAIT, "no request");
        c.poll_cm();
        if readable_within(fd, 10) {
            if let Some(r) = l.poll() {
                break r;
            }
        }
    };
    drop(req);
    drop(raw);
}
