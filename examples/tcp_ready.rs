//! Shared tcp CQ readiness: the message rate of many connections on one shared CQ per
//! side, for each way the CQ watches its sockets (`uring`, `epoll`, `none`; see
//! `docs/ARCHITECTURE.md`, "Completion queues").
//!
//! Two threads over 127.0.0.1, each pinned to one core, each with one tcp fabric and one
//! shared CQ. The client keeps `--qd` requests in flight spread over `--conns`
//! connections: a SEND_WITH_IMM (the client's slot) of `--len` bytes into a receive
//! buffer the server posted; the server answers each with an RDMA_WRITE_WITH_IMM of
//! `--len` bytes into that slot of the client's memory. Only the CQs are polled (no per-connection calls), as a reactor does.
//! With `--private` each connection has its own CQ instead (`Fabric::connect` with `ConnectOptions::from`,
//! `ConnRequest::accept`), polled through `Conn::poll_cq` one after the other, as the
//! SPDK bdev polls its connections (see `docs/ARCHITECTURE.md`, "The tcp fabric").
//!
//! Prints one JSON line per mode: operations in the timed window and per second, and
//! `total_ops` (warm-up included), the divisor for a syscall count of the whole process
//! taken outside (`examples/tcp_ready.sh` runs each mode under
//! `perf stat -e raw_syscalls:sys_enter`).
//!
//! `cargo run --release --example tcp_ready -- --mode uring --conns 8 --qd 32 --secs 5`

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::tcp::{TcpFabric, TcpReadiness};
use rtrs_spdk::fabric::{
    Access, CmEvent, Conn, Cq, Fabric, MemBuf, QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode,
    WcStatus,
};

const USAGE: &str = "usage: tcp_ready [--mode uring|epoll|none|all] [--conns N] [--qd N] \
                     [--len BYTES] [--secs S] [--warmup S] [--server-core C] [--client-core C] \
                     [--private]";

struct Opts {
    modes: Vec<TcpReadiness>,
    conns: usize,
    qd: usize,
    len: usize,
    secs: f64,
    warmup: f64,
    server_core: usize,
    client_core: usize,
    /// A private CQ per connection instead of one shared CQ per side.
    private: bool,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        modes: vec![TcpReadiness::None, TcpReadiness::Epoll, TcpReadiness::Uring],
        conns: 8,
        qd: 32,
        len: 4096,
        secs: 5.0,
        warmup: 1.0,
        server_core: 0,
        client_core: 1,
        private: false,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--bench" {
            continue;
        }
        if a == "--private" {
            o.private = true;
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
                .filter(|s| *s >= 0.0)
                .ok_or_else(|| format!("{a}: {v:?} is not a duration in seconds"))
        };
        match a.as_str() {
            "--mode" if v == "all" => {}
            "--mode" => {
                o.modes = vec![TcpReadiness::parse(v)
                    .ok_or_else(|| format!("--mode: {v:?} is not uring, epoll, none or all"))?]
            }
            "--conns" => o.conns = num("a connection count")?.max(1),
            "--qd" => o.qd = num("a queue depth")?.max(1),
            "--len" => o.len = num("a length")?.max(1),
            "--secs" => o.secs = secs()?,
            "--warmup" => o.warmup = secs()?,
            "--server-core" => o.server_core = num("a core number")?,
            "--client-core" => o.client_core = num("a core number")?,
            _ => return Err(format!("unknown option {a}\n{USAGE}")),
        }
    }
    o.qd = o.qd.max(o.conns);
    Ok(o)
}

fn pin(core: usize) {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    if let Some(id) = ids.get(core % ids.len().max(1)) {
        core_affinity::set_for_current(*id);
    }
}

fn caps(per_conn: usize) -> QpCaps {
    let n = (2 * per_conn + 8) as u32;
    QpCaps {
        max_send_wr: n,
        max_recv_wr: n,
        max_send_sge: 1,
    }
}

/// Polls once, the shared CQ or else each connection's private CQ, putting the
/// completions in `out`; false if one failed (the peer went).
fn gather<'a>(
    cq: Option<&mut Cq>,
    conns: impl Iterator<Item = &'a mut Box<dyn Conn>>,
    wcs: &mut [Wc],
    out: &mut Vec<Wc>,
) -> bool {
    out.clear();
    match cq {
        Some(cq) => {
            let n = cq.poll(wcs);
            out.extend_from_slice(&wcs[..n]);
        }
        None => {
            for c in conns {
                let n = c.poll_cq(wcs);
                out.extend_from_slice(&wcs[..n]);
            }
        }
    }
    out.iter().all(|w| w.status == WcStatus::Success)
}

/// The server: accepts `conns` connections on its CQ and answers every request.
fn server(o: &Opts, mode: TcpReadiness, addr_tx: mpsc::Sender<SocketAddr>, stop: &AtomicBool) {
    pin(o.server_core);
    let per = o.qd.div_ceil(o.conns);
    let fabric = TcpFabric::with_readiness(mode);
    let mut cq = (!o.private).then(|| fabric.create_cq(4 * (o.qd as u32) + 64).expect("server cq"));
    let mut l = fabric
        .listen(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &ListenOptions::default(),
        )
        .expect("listen");
    addr_tx.send(l.local_addr()).expect("client waits");
    let slots = o.conns * per;
    let rx = fabric
        .register(MemBuf::zeroed(slots * o.len), Access::LOCAL_WRITE)
        .expect("register");
    let tx = fabric
        .register(MemBuf::zeroed(slots * o.len), Access::NONE)
        .expect("register");
    // Per connection: the handle, its qp_num, the client's target address and rkey.
    let mut conns: Vec<(Box<dyn Conn>, u32, u64, u32)> = Vec::new();
    let mut wcs = vec![Wc::default(); 64];
    let mut got = Vec::with_capacity(64 * o.conns);
    let mut answers: Vec<(usize, u64, u32)> = Vec::with_capacity(64);
    let mut rounds = 0u32;
    let mut last = Instant::now();
    let mut told = false;
    loop {
        // Accepting goes on inside the loop: a connection's requests may arrive while the
        // next one is being accepted, and each must be answered.
        if conns.len() < o.conns {
            if let Some(req) = l.poll() {
                let pd = req.private_data.as_bytes();
                let addr = u64::from_le_bytes(pd[..8].try_into().expect("8 bytes"));
                let rkey = u32::from_le_bytes(pd[8..12].try_into().expect("4 bytes"));
                let mut c = match &cq {
                    Some(cq) => req.accept_into(&fabric, Some(&cq.share()), caps(per), &[]),
                    None => req.accept(caps(per), &[]),
                }
                .expect("accept");
                let i = conns.len();
                let recvs: Vec<RecvWr> = (0..per)
                    .map(|k| {
                        let slot = i * per + k;
                        RecvWr {
                            wr_id: slot as u64,
                            sge: Some(rx.sge(slot * o.len, o.len)),
                        }
                    })
                    .collect();
                c.post_recv(&recvs).expect("post_recv");
                let q = c.qp_num();
                conns.push((c, q, addr, rkey));
            }
            last = Instant::now();
        }
        answers.clear();
        // A failure is the client closing at the end of its run.
        if !gather(
            cq.as_mut(),
            conns.iter_mut().map(|c| &mut c.0),
            &mut wcs,
            &mut got,
        ) {
            return;
        }
        for w in &got {
            if w.opcode == WcOpcode::Recv {
                let i = conns
                    .iter()
                    .position(|c| c.1 == w.qp_num)
                    .expect("a connection of ours");
                answers.push((i, w.wr_id, w.imm.expect("the client's slot")));
            }
        }
        if !answers.is_empty() {
            last = Instant::now();
        } else if last.elapsed() > Duration::from_secs(1) && !told {
            told = true;
            let states: Vec<_> = conns.iter().map(|c| c.0.state()).collect();
            eprintln!("server: no request for 1 s; connections {states:?}");
        }
        for &(i, slot, theirs) in &answers {
            let (c, _, addr, rkey) = &mut conns[i];
            let s = slot as usize;
            let re = c.post_recv(&[RecvWr {
                wr_id: slot,
                sge: Some(rx.sge(s * o.len, o.len)),
            }]);
            let sge = [tx.sge(s * o.len, o.len)];
            let answer = c.post_send(&[SendWr {
                wr_id: slot,
                op: SendOp::RdmaWriteWithImm {
                    remote_addr: *addr + u64::from(theirs) * o.len as u64,
                    rkey: *rkey,
                    imm: theirs,
                },
                sges: &sge,
                signaled: true,
            }]);
            if re.is_err() || answer.is_err() {
                // The client closed at the end of its run.
                return;
            }
        }
        rounds = rounds.wrapping_add(1);
        if rounds % 1024 == 0 && stop.load(Ordering::Relaxed) {
            return;
        }
    }
}

struct Run {
    ops: u64,
    total: u64,
    elapsed: f64,
}

/// The client: `conns` connections on its CQ, `qd` requests in flight.
fn client(o: &Opts, mode: TcpReadiness, addr: SocketAddr) -> Run {
    pin(o.client_core);
    let per = o.qd.div_ceil(o.conns);
    let fabric = TcpFabric::with_readiness(mode);
    let mut cq = (!o.private).then(|| fabric.create_cq(4 * (o.qd as u32) + 64).expect("client cq"));
    let slots = o.conns * per;
    let target = fabric
        .register(
            MemBuf::zeroed(slots * o.len),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .expect("register");
    let src = fabric
        .register(MemBuf::zeroed(slots * o.len), Access::NONE)
        .expect("register");
    let mut pd = [0u8; 12];
    pd[..8].copy_from_slice(&target.addr().to_le_bytes());
    pd[8..].copy_from_slice(&target.rkey().to_le_bytes());
    let mut conns: Vec<Box<dyn Conn>> = (0..o.conns)
        .map(|_| {
            match &cq {
                Some(cq) => {
                    fabric.connect(addr, &ConnectOptions::new(caps(per), &pd).on(&cq.share()))
                }
                None => fabric.connect(addr, &ConnectOptions::new(caps(per), &pd)),
            }
            .expect("connect")
        })
        .collect();
    let mut wcs = vec![Wc::default(); 64];
    let mut got = Vec::with_capacity(64 * o.conns);
    let mut up = vec![false; o.conns];
    let start = Instant::now();
    while !up.iter().all(|&u| u) {
        assert!(
            gather(cq.as_mut(), conns.iter_mut(), &mut wcs, &mut got),
            "a failed completion"
        );
        for (c, u) in conns.iter_mut().zip(&mut up) {
            while let Some(ev) = c.poll_cm() {
                match ev {
                    CmEvent::Established { .. } => *u = true,
                    ev => panic!("connect: {ev:?}"),
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "connect timed out"
        );
    }
    if let Some(ms) = std::env::var("TCP_READY_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
    let send = |c: &mut Box<dyn Conn>, slot: usize| {
        let sge = [src.sge(slot * o.len, o.len)];
        c.post_send(&[SendWr {
            wr_id: slot as u64,
            op: SendOp::SendWithImm { imm: slot as u32 },
            sges: &sge,
            signaled: true,
        }])
        .expect("request");
    };
    for (i, c) in conns.iter_mut().enumerate() {
        let recvs: Vec<RecvWr> = (0..per)
            .map(|k| RecvWr {
                wr_id: (i * per + k) as u64,
                sge: None,
            })
            .collect();
        c.post_recv(&recvs).expect("post_recv");
        for k in 0..per {
            send(c, i * per + k);
        }
    }
    let mut total = 0u64;
    let mut replies: Vec<usize> = Vec::with_capacity(64);
    let t0 = Instant::now();
    let warm = Duration::from_secs_f64(o.warmup);
    let end = warm + Duration::from_secs_f64(o.secs);
    let mut at_warm = None;
    let mut last_reply = Instant::now();
    let mut stall_told = false;
    loop {
        replies.clear();
        let ok = gather(cq.as_mut(), conns.iter_mut(), &mut wcs, &mut got);
        assert!(ok, "a failed completion");
        for w in &got {
            if w.opcode == WcOpcode::RecvRdmaWithImm {
                replies.push(w.imm.expect("an immediate") as usize);
            }
        }
        for &slot in &replies {
            let c = &mut conns[slot / per];
            c.post_recv(&[RecvWr {
                wr_id: slot as u64,
                sge: None,
            }])
            .expect("re-post");
            send(c, slot);
        }
        total += replies.len() as u64;
        if !replies.is_empty() {
            last_reply = Instant::now();
        } else if last_reply.elapsed() > Duration::from_secs(1) && !stall_told {
            stall_told = true;
            let states: Vec<_> = conns.iter().map(|c| c.state()).collect();
            eprintln!("client: no reply for 1 s after {total} operations; connections {states:?}");
        }
        if total & 0xff < replies.len() as u64 || replies.is_empty() {
            let t = t0.elapsed();
            if at_warm.is_none() && t >= warm {
                at_warm = Some((total, t));
            }
            if t >= end {
                let (w_ops, w_t) = at_warm.unwrap_or((0, Duration::ZERO));
                return Run {
                    ops: total - w_ops,
                    total,
                    elapsed: (t - w_t).as_secs_f64(),
                };
            }
        }
    }
}

fn main() -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let o = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    for &mode in &o.modes {
        let stop = AtomicBool::new(false);
        let (addr_tx, addr_rx) = mpsc::channel();
        let (o, stop) = (&o, &stop);
        let r = std::thread::scope(|s| {
            let srv = s.spawn(move || server(o, mode, addr_tx, stop));
            let addr = addr_rx.recv().expect("the server listens");
            let r = s.spawn(move || client(o, mode, addr)).join();
            stop.store(true, Ordering::Relaxed);
            let _ = srv.join();
            r
        });
        let Ok(r) = r else {
            eprintln!("{mode:?}: the client failed");
            return ExitCode::FAILURE;
        };
        let mode_name = format!("{mode:?}").to_lowercase();
        println!(
            "{{\"mode\":\"{mode_name}\",\"private\":{},\"conns\":{},\"qd\":{},\"len\":{},\"ops\":{},\"ops_per_s\":{:.0},\"total_ops\":{}}}",
            o.private,
            o.conns,
            o.qd,
            o.len,
            r.ops,
            r.ops as f64 / r.elapsed.max(1e-9),
            r.total
        );
    }
    ExitCode::SUCCESS
}
