//! RNBD spoken raw over the server tests' client (`tests/util/server/client.rs`), against
//! a target in another process: SESS_INFO, OPEN, CLOSE, WRITE and READ through a
//! [`TestPath`], one request at a time on chunk 0 of connection 1. For the tests that
//! play a hostile client (one that holds sessions, opens what it may not, joins another
//! client's session) against `rtrs-target` and the SPDK target. Also the target's
//! resident memory. Every wait is bounded; a path the target closes gives −ENOTCONN.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::proto::rnbd::{AccessMode, Close, Io, Open, OpenRsp, RnbdFlags, RnbdOp, SessInfo};

use crate::server_util::client::{info_req, Ids, TestPath};
use crate::server_util::{Driver, Event};

/// The client's side of a target in another process: a tcp fabric on the test thread.
pub struct Remote {
    pub fabric: Arc<dyn Fabric>,
    pub addr: SocketAddr,
}

impl Remote {
    pub fn new(addr: SocketAddr) -> Remote {
        Remote {
            fabric: Arc::new(TcpFabric::new()),
            addr,
        }
    }
}

impl Driver for Remote {
    fn step(&mut self) {
        std::thread::sleep(Duration::from_micros(200));
    }
    fn client_fabric(&self) -> Arc<dyn Fabric> {
        Arc::clone(&self.fabric)
    }
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn max_steps(&self) -> usize {
        // ~200 µs each: at least 10 s.
        50_000
    }
}

/// The chunk and connection every request here goes through.
const BUF: u16 = 0;
const CID: u16 = 1;

/// The errno of the answer to the request on [`BUF`]; −ENOTCONN when the target closed
/// the path first.
fn answer(p: &mut TestPath, d: &mut dyn Driver) -> i32 {
    for _ in 0..d.max_steps() {
        d.step();
        p.poll();
        let at = p
            .events
            .iter()
            .position(|e| matches!(e, Event::Rsp { buf_id, .. } if *buf_id == BUF));
        if let Some(Event::Rsp { errno, .. }) = at.and_then(|i| p.events.remove(i)) {
            return errno;
        }
        if p.down {
            return -libc::ENOTCONN;
        }
    }
    panic!("no answer on chunk {BUF}: {:?}", p.events);
}

/// A READ-direction request carrying `usr`, whose reply of `len` bytes is returned.
fn read_req(p: &mut TestPath, d: &mut dyn Driver, usr: &[u8], len: u32) -> (i32, Vec<u8>) {
    p.post_read(CID, BUF, usr, len, len > 0);
    let errno = answer(p, d);
    let mut out = vec![0u8; len as usize];
    p.reply.read_at(usize::from(BUF) * p.cs(), &mut out);
    (errno, out)
}

/// SESS_INFO: the errno.
pub fn sess_info(p: &mut TestPath, d: &mut dyn Driver) -> i32 {
    let usr = SessInfo { ver: 2 }.to_bytes();
    read_req(p, d, &usr, SessInfo::LEN as u32).0
}

/// SESS_INFO and OPEN of `dev` in `mode`: the device id, or the errno (−ENOTCONN when
/// the target closed the path meanwhile).
pub fn open(p: &mut TestPath, d: &mut dyn Driver, dev: &str, mode: AccessMode) -> Result<u32, i32> {
    let e = sess_info(p, d);
    if e != 0 {
        return Err(e);
    }
    let mut usr = [0u8; Open::LEN];
    Open {
        access_mode: mode,
        dev_name: dev.as_bytes(),
    }
    .encode(&mut usr)
    .expect("OPEN");
    let (errno, rsp) = read_req(p, d, &usr, OpenRsp::LEN as u32);
    if errno != 0 {
        return Err(errno);
    }
    Ok(OpenRsp::decode(&rsp).expect("OPEN_RSP").device_id)
}

/// CLOSE of `device_id`: the errno.
pub fn close(p: &mut TestPath, d: &mut dyn Driver, device_id: u32) -> i32 {
    let usr = Close { device_id }.to_bytes();
    p.post_write(CID, BUF, &usr, &[]);
    answer(p, d)
}

fn io(device_id: u32, op: RnbdOp, sector: u64, len: usize) -> [u8; Io::LEN] {
    Io {
        device_id,
        sector,
        op,
        flags: RnbdFlags::NONE,
        bi_size: len as u32,
        prio: 0,
    }
    .to_bytes()
}

/// WRITE of `data` at `sector` (512-byte units): the errno.
pub fn write(
    p: &mut TestPath,
    d: &mut dyn Driver,
    device_id: u32,
    sector: u64,
    data: &[u8],
) -> i32 {
    let usr = io(device_id, RnbdOp::Write, sector, data.len());
    p.post_write(CID, BUF, &usr, data);
    answer(p, d)
}

/// READ of `len` bytes at `sector`: the errno and the data.
pub fn read(
    p: &mut TestPath,
    d: &mut dyn Driver,
    device_id: u32,
    sector: u64,
    len: usize,
) -> (i32, Vec<u8>) {
    let usr = io(device_id, RnbdOp::Read, sector, len);
    read_req(p, d, &usr, len as u32)
}

/// What a [`refused_host`] did.
#[derive(Default)]
pub struct Attack {
    pub stop: AtomicBool,
    /// Sessions it got, and of those the target closed.
    pub made: AtomicUsize,
    pub closed: AtomicUsize,
    /// Errnos of its refused sessions and of its OPENs (0: opened).
    pub refused: Mutex<Vec<i32>>,
    pub opens: Mutex<Vec<i32>>,
}

/// A host the export's list refuses, holding every session it can: sessions from
/// 127.0.0.2 .. 127.0.0.7 in turn, each opening `dev` (refused), kept until the target
/// closes them, then made again, until `a.stop`.
pub fn refused_host(addr: SocketAddr, dev: &str, a: Arc<Attack>) -> thread::JoinHandle<()> {
    let dev = dev.to_string();
    thread::spawn(move || {
        let mut r = Remote::new(addr);
        let mut held: Vec<TestPath> = Vec::new();
        let mut n = 0usize;
        while !a.stop.load(Ordering::Acquire) {
            for p in &mut held {
                p.poll();
            }
            let before = held.len();
            held.retain(|p| !p.down);
            a.closed.fetch_add(before - held.len(), Ordering::Relaxed);
            let src = SocketAddr::from(([127, 0, 0, 2 + (n % 6) as u8], 0));
            n += 1;
            let made = TestPath::connect_info_from(
                &mut r,
                Some(src),
                addr,
                &info_req(&format!("refused-{n}")),
                2,
                Ids::random(),
                true,
            );
            match made {
                Ok(mut p) => {
                    a.made.fetch_add(1, Ordering::Relaxed);
                    let e = open(&mut p, &mut r, &dev, AccessMode::ReadOnly).err();
                    a.opens.lock().expect("opens").push(e.unwrap_or(0));
                    held.push(p);
                }
                Err(e) => a.refused.lock().expect("refused").push(e),
            }
        }
    })
}

/// Resident memory of process `pid` in bytes (VmRSS).
pub fn vm_rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    kib << 10
}
