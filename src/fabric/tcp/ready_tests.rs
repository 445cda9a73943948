//! The readiness set's backends, and a shared tcp CQ that reads no idle socket.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::*;
use crate::fabric::tcp::rx::READS;
use crate::fabric::tcp::TcpFabric;
use crate::fabric::{
    Access, CmEvent, Conn, Cq, Fabric, MemBuf, QpCaps, RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode,
    WcStatus,
};

const WAIT: Duration = Duration::from_secs(5);

fn backends() -> Vec<Box<dyn Readiness>> {
    vec![
        Box::new(Uring::new().expect("io_uring (kernel.io_uring_disabled = 0)")),
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
    let mut set = Uring::new().expect("io_uring");
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

// --- A shared tcp CQ end to end ---

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

struct Ends {
    cqs: [Cq; 2],
    /// Client's, server's.
    conns: [Box<dyn Conn>; 2],
    fabrics: [std::sync::Arc<TcpFabric>; 2],
}

fn poll(e: &mut Ends, got: &mut Vec<Wc>) {
    let mut wcs = [Wc::default(); 16];
    for cq in &mut e.cqs {
        let n = cq.poll(&mut wcs);
        got.extend_from_slice(&wcs[..n]);
    }
}

fn connected(mode: TcpReadiness) -> Ends {
    let client = std::sync::Arc::new(TcpFabric::with_readiness(mode));
    let server = std::sync::Arc::new(TcpFabric::with_readiness(mode));
    let ccq = client.create_cq(256).expect("client cq");
    let scq = server.create_cq(256).expect("server cq");
    let mut l = server
        .listen("127.0.0.1:0".parse().expect("address"))
        .expect("listen");
    let caps = QpCaps::default();
    let mut c = client
        .connect_on(&ccq.share(), None, l.local_addr(), caps, &[], None)
        .expect("connect_on");
    let start = Instant::now();
    let req = loop {
        if let Some(r) = l.poll() {
            break r;
        }
        c.poll_cm();
        assert!(start.elapsed() < WAIT, "no request");
    };
    let s = req.accept_on(&scq.share(), caps, &[]).expect("accept_on");
    let mut est = [false, false];
    let mut e = Ends {
        cqs: [ccq, scq],
        conns: [c, s],
        fabrics: [client, server],
    };
    while !(est[0] && est[1]) {
        assert!(start.elapsed() < WAIT, "not established");
        poll(&mut e, &mut Vec::new());
        for (conn, est) in e.conns.iter_mut().zip(&mut est) {
            while let Some(ev) = conn.poll_cm() {
                *est |= matches!(ev, CmEvent::Established { .. });
            }
        }
    }
    e
}

/// One 64 KiB RDMA_WRITE_WITH_IMM client → server, both completions awaited.
fn exchange(e: &mut Ends, imm: u32) {
    let src = e.fabrics[0]
        .register(MemBuf::zeroed(64 * 1024), RW)
        .expect("register");
    src.write_at(0, &vec![imm as u8; 64 * 1024]);
    let dst = e.fabrics[1]
        .register(MemBuf::zeroed(64 * 1024), RW)
        .expect("register");
    e.conns[1]
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: None,
        }])
        .expect("post_recv");
    let sge = [Sge {
        addr: src.addr(),
        len: 64 * 1024,
        lkey: src.lkey(),
    }];
    e.conns[0]
        .post_send(&[SendWr {
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
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < 2 {
        assert!(start.elapsed() < WAIT, "exchange {imm}: {got:?}");
        poll(e, &mut got);
    }
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    let recv = got
        .iter()
        .find(|w| w.opcode == WcOpcode::RecvRdmaWithImm)
        .expect("the server's completion");
    assert_eq!(
        (recv.imm, recv.byte_len),
        (Some(imm), 64 * 1024),
        "{recv:?}"
    );
    let mut back = vec![0u8; 64 * 1024];
    dst.read_at(0, &mut back);
    assert!(back.iter().all(|&b| b == imm as u8), "payload landed");
}

fn idle_reads(mode: TcpReadiness) -> u64 {
    let mut e = connected(mode);
    exchange(&mut e, 7);
    // Let the last ACK arrive and be read.
    for _ in 0..50 {
        poll(&mut e, &mut Vec::new());
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = READS.with(|r| r.get());
    for _ in 0..1000 {
        poll(&mut e, &mut Vec::new());
    }
    let reads = READS.with(|r| r.get()) - before;
    // Still alive: the next arrival is seen.
    exchange(&mut e, 9);
    reads
}

#[test]
fn an_idle_shared_cq_reads_no_socket() {
    for mode in [TcpReadiness::Uring, TcpReadiness::Epoll] {
        assert_eq!(idle_reads(mode), 0, "{mode:?}: reads of 1000 idle polls");
    }
    // The counter does count: without a set every poll reads both sockets.
    assert!(
        idle_reads(TcpReadiness::None) >= 2000,
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
        let mut set = Uring::new().expect("io_uring");
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
