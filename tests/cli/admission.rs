//! Admission of connections still in their handshake, with real sockets on 127.0.0.x:
//! the tcp listener's caps per source and in total (a newcomer evicts the oldest socket
//! of its own or of the busiest source) and its handshake deadline; then the built
//! `rtrs-target` under a flood of 3 000 idle sockets from three addresses, where a
//! legitimate `rtrs-bench` must still connect with its default connect timeout and run a
//! verified workload, every idle socket must be closed by the deadline, and the log must
//! stay short; and the 5 s default deadline. Waits are bounded; nothing is timed.

use crate::cli_util;

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use cli_util::{run, start_target, start_target_logged, BENCH, LIMIT};
use rtrs_spdk::fabric::tcp::frame::{cm_frame, CmPayload, Opcode, RejectReason, V1};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{Admission, CmEvent, Fabric, Listener, PrivateData, QpCaps};

const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
};

/// A TCP connection from `src` (port chosen by the system) to `dst`, never written to,
/// non-blocking so that [`closed`] can look at it.
fn idle_from(src: &str, dst: SocketAddr) -> TcpStream {
    let s =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let src: IpAddr = src.parse().expect("source address");
    s.bind(&SocketAddr::new(src, 0).into())
        .expect("bind source");
    s.connect_timeout(&dst.into(), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("connect from {src} to {dst}: {e}"));
    let t: TcpStream = s.into();
    t.set_nonblocking(true).expect("non-blocking");
    t
}

/// Whether the peer closed the connection (EOF or reset); the listener never sends these
/// sockets anything, so data is a failure.
fn closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 64];
    match (&*s).read(&mut b) {
        Ok(0) => true,
        Ok(n) => panic!("the listener sent {n} bytes to a socket that never wrote"),
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(e) if e.kind() == ErrorKind::Interrupted => false,
        Err(_) => true,
    }
}

fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "gave up waiting: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Polls `l` for a while so that it accepts what is waiting (idle sockets only: no
/// poll may return a request).
fn drain(l: &mut dyn Listener) {
    for _ in 0..20 {
        assert!(l.poll().is_none(), "an idle socket became a request");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_full_listener_evicts_from_the_busiest_source_and_admits_a_newcomer() {
    let f = TcpFabric::new();
    let adm = Admission {
        handshake_timeout: Duration::from_secs(600),
        max_pending: 6,
        max_pending_per_source: 4,
    };
    let mut l = f
        .listen(
            "127.0.0.1:0".parse().unwrap(),
            &ListenOptions {
                admission: adm,
                ..ListenOptions::default()
            },
        )
        .expect("listen");
    let dst = l.local_addr();
    let a: Vec<TcpStream> = (0..4).map(|_| idle_from("127.0.0.2", dst)).collect();
    let b: Vec<TcpStream> = (0..2).map(|_| idle_from("127.0.0.3", dst)).collect();
    drain(&mut *l);
    assert!(a.iter().chain(&b).all(|s| !closed(s)), "under the caps");

    // A fifth socket from 127.0.0.2 is over its per-source cap: its oldest goes.
    let a5 = idle_from("127.0.0.2", dst);
    drain(&mut *l);
    until("the oldest of 127.0.0.2 closed", LIMIT, || closed(&a[0]));
    assert!(a[1..].iter().chain(&b).all(|s| !closed(s)));
    assert!(!closed(&a5));

    // The table is full (6): a real client from 127.0.0.1 evicts the oldest socket of
    // the busiest source (127.0.0.2, 4 sockets) and connects.
    let mut c = f
        .connect(dst, &ConnectOptions::new(CAPS, b"hello"))
        .expect("connect");
    let mut server_conn = None;
    let mut established = false;
    until("the newcomer connected", LIMIT, || {
        if server_conn.is_none() {
            if let Some(req) = l.poll() {
                assert_eq!(req.private_data.as_bytes(), b"hello");
                server_conn = Some(req.accept(CAPS, b"welcome").expect("accept"));
            }
        }
        if let Some(s) = server_conn.as_mut() {
            let _ = s.poll_cm();
        }
        match c.poll_cm() {
            Some(CmEvent::Established { private_data }) => {
                assert_eq!(private_data.as_bytes(), b"welcome");
                established = true;
            }
            Some(ev) => panic!("client: {ev:?}"),
            None => {}
        }
        established
    });
    until("the oldest left of 127.0.0.2 closed", LIMIT, || {
        closed(&a[1])
    });
    assert!(a[2..].iter().chain(&b).all(|s| !closed(s)), "others stay");
    assert!(!closed(&a5));
}

#[test]
fn idle_sockets_are_closed_after_the_handshake_timeout_and_slow_requests_are_not() {
    let f = TcpFabric::new();
    let adm = Admission {
        handshake_timeout: Duration::from_millis(500),
        ..Admission::default()
    };
    let mut l = f
        .listen(
            "127.0.0.1:0".parse().unwrap(),
            &ListenOptions {
                admission: adm,
                ..ListenOptions::default()
            },
        )
        .expect("listen");
    let dst = l.local_addr();
    let idle: Vec<TcpStream> = (0..3).map(|_| idle_from("127.0.0.6", dst)).collect();
    // A slow but complete connect request: half of it, a pause, the rest.
    let req = cm_frame(
        V1,
        Opcode::CmReq,
        &CmPayload::new(RejectReason::None, PrivateData::new(b"slow").unwrap()),
    );
    let mut slow = idle_from("127.0.0.6", dst);
    slow.set_nonblocking(false).unwrap();
    slow.write_all(&req[..30]).unwrap();
    drain(&mut *l);
    slow.write_all(&req[30..]).unwrap();
    let mut got = None;
    until("the slow request", LIMIT, || {
        got = l.poll();
        got.is_some()
    });
    assert_eq!(got.unwrap().private_data.as_bytes(), b"slow");
    until("the idle sockets closed", LIMIT, || {
        assert!(l.poll().is_none());
        idle.iter().all(closed)
    });
}

#[test]
fn admission_limits_out_of_range_are_refused_at_listen() {
    let f = TcpFabric::new();
    let bad = Admission {
        max_pending_per_source: 0,
        ..Admission::default()
    };
    let e = f
        .listen(
            "127.0.0.1:0".parse().unwrap(),
            &ListenOptions {
                admission: bad,
                ..ListenOptions::default()
            },
        )
        .err()
        .expect("refused");
    assert!(e.to_string().contains("max_pending_per_source"), "{e}");
}

/// Raises this process's open-file limit (inherited by the children) to `n` if the
/// hard limit allows; returns the soft limit in force.
fn raise_nofile(n: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        if r.rlim_cur < n {
            r.rlim_cur = n.min(r.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        }
    }
    r.rlim_cur
}

const FLOOD: usize = 3000;

#[test]
fn a_flood_of_idle_sockets_does_not_lock_out_a_client() {
    let limit = raise_nofile(FLOOD as u64 + 1024);
    assert!(
        limit >= FLOOD as u64 + 256,
        "open-file limit {limit} too low for {FLOOD} sockets"
    );
    let (t, log) = start_target_logged(&["vol=ram:16M"], &["--handshake-timeout", "2s"]);
    let dst: SocketAddr = format!("127.0.0.1:{}", t.port).parse().unwrap();
    let started = Instant::now();

    // The flood: sockets from three addresses, never written to, opened by a thread
    // while the client connects and runs.
    let (tx, rx) = mpsc::channel();
    let flood = thread::spawn(move || {
        let mut socks = Vec::with_capacity(FLOOD);
        for i in 0..FLOOD {
            let src = ["127.0.0.2", "127.0.0.3", "127.0.0.4"][i % 3];
            socks.push(idle_from(src, dst));
            if i == FLOOD / 3 {
                let _ = tx.send(());
            }
        }
        socks
    });
    rx.recv_timeout(LIMIT).expect("the flood is under way");

    // A legitimate client, default connect timeout, verified IO.
    let url = format!("tcp://127.0.0.1:{}", t.port);
    let out = run(
        BENCH,
        &[
            "--path", &url, "--device", "vol", "--rw", "randrw", "--bs", "4K", "--qd", "8",
            "--verify", "--time", "2s", "-m", "0x2", "--idle", "adaptive", "--json",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rtrs-bench failed: {stderr}\n{stdout}"
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");

    let socks = flood.join().expect("flood thread");
    // Every idle socket is closed by the target: evicted, or at the 2 s deadline.
    let mut open: Vec<&TcpStream> = socks.iter().collect();
    until(
        "every idle socket closed",
        Duration::from_secs(2) + LIMIT,
        || {
            open.retain(|s| !closed(s));
            open.is_empty()
        },
    );

    // The log: a few lines per second at most, and the rest counted.
    thread::sleep(Duration::from_millis(1500)); // the last window's summary
    let secs = started.elapsed().as_secs() + 1;
    let lines: Vec<String> = log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .lines()
        .map(String::from)
        .collect();
    let listener: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("tcp fabric listener"))
        .collect();
    assert!(
        listener.len() as u64 <= 6 * secs,
        "{} listener lines in {secs} s:\n{}",
        listener.len(),
        lines.join("\n")
    );
    assert!(
        lines.len() as u64 <= 12 * secs,
        "{} log lines in {secs} s:\n{}",
        lines.len(),
        lines.join("\n")
    );
    let suppressed: u64 = listener
        .iter()
        .filter_map(|l| l.split(": ").last()?.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        suppressed > 0,
        "a flood of {FLOOD} sockets must be counted, not logged:\n{}",
        lines.join("\n")
    );
    drop(t);
}

#[test]
fn the_default_handshake_timeout_closes_idle_sockets() {
    let t = start_target(&["vol=ram:1M"], &[]);
    let dst: SocketAddr = format!("127.0.0.1:{}", t.port).parse().unwrap();
    let first = Instant::now();
    let socks: Vec<TcpStream> = (0..20).map(|_| idle_from("127.0.0.5", dst)).collect();
    thread::sleep(Duration::from_secs(1));
    let still_open = socks.iter().all(|s| !closed(s));
    // A socket cannot be closed before 5 s after its connect; only check while that is
    // certain (a slow machine may have slept past it).
    if first.elapsed() < Duration::from_millis(4500) {
        assert!(still_open, "closed before the 5 s default deadline");
    }
    until(
        "idle sockets closed at the default deadline",
        Duration::from_secs(5) + LIMIT,
        || socks.iter().all(closed),
    );
}
