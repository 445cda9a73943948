//! A pre-5.18 kernel client's WRITE_SAME, spoken raw over its own RTRS session (the
//! library's client never sends one): SESS_INFO, OPEN, RNBD op 5 carrying one logical
//! block of data for 300 blocks (more than one `writev` of the SPDK backend), READs of
//! the first and the last 16 blocks checking the block came back each time, the same op
//! with two blocks of data (refused: −EINVAL), CLOSE. Runs on core 0 of a
//! two-reactor engine (core 1 keeps its handle of the session polled). Every wait is
//! bounded.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rtrs_spdk::client::{
    ClientCompletion, ClientConfig, ClientIo, ClientSession, PathAddr, SessionCore, Sgl,
    SubmitError,
};
use rtrs_spdk::engine::{Ctx, Engine, Msg, PollResult};
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr};
use rtrs_spdk::proto::rnbd::{
    AccessMode, Close, Io, Open, OpenRsp, RnbdFlags, RnbdOp, SessInfo, SessInfoRsp,
};
use rtrs_spdk::rnbd::client::LinkListener;
use rtrs_spdk::rnbd::Dir;

const WAIT: Duration = Duration::from_secs(60);
/// Blocks the WRITE_SAME covers.
const BLOCKS: usize = 300;
/// Blocks of each read-back.
const READ: usize = 16;
/// Where it writes: past what the shared workload uses (2 MiB in).
const OFFSET: u64 = 2 << 20;

fn pattern(lbs: usize) -> Vec<u8> {
    (0..lbs).map(|i| (i * 13 + 5) as u8 | 0x80).collect()
}

/// The request in flight and what to do next.
struct Legacy {
    core: SessionCore,
    buf: Mr,
    step: u8,
    dev: String,
    device_id: u32,
    lbs: usize,
    tx: mpsc::Sender<Result<String, String>>,
    done: bool,
}

impl Legacy {
    /// Sends one request; `false` when it must be tried again (not connected yet, busy).
    fn send(&mut self, cx: &mut dyn Ctx, dir: Dir, usr: &[u8], len: usize) -> Result<bool, String> {
        let sge = [self.buf.sge(0, len)];
        let io = ClientIo {
            tag: u64::from(self.step),
            dir,
            usr,
            sgl: Sgl::Copy(if len == 0 { &[] } else { &sge }),
            admin: false,
            wait: rtrs_spdk::client::PathWait::Session,
        };
        match self.core.submit(cx.now(), io) {
            Ok(()) => Ok(true),
            Err(SubmitError::Busy { .. }) => Ok(false),
            Err(SubmitError::NoPath) if self.core.max_io_size() == 0 => Ok(false),
            Err(e) => Err(format!("step {}: {e}", self.step)),
        }
    }

    fn io(&self, op: RnbdOp, first: usize, blocks: usize) -> [u8; 32] {
        Io {
            device_id: self.device_id,
            sector: (OFFSET + (first * self.lbs) as u64) / 512,
            op,
            flags: RnbdFlags::SYNC,
            bi_size: (blocks * self.lbs) as u32,
            prio: 0,
        }
        .to_bytes()
    }

    /// Even steps send, odd steps wait for their answer.
    fn poll(&mut self, cx: &mut dyn Ctx) -> Result<bool, String> {
        let mut out = [ClientCompletion::default(); 4];
        let n = self.core.poll(cx.now(), &mut out);
        for c in &out[..n] {
            self.answer(rtrs_spdk::Errno::neg_of(c.result))?;
        }
        let sent = match self.step {
            0 => {
                let m = SessInfo { ver: 2 }.to_bytes();
                self.send(cx, Dir::Read, &m, SessInfoRsp::LEN)?
            }
            2 => {
                let mut m = [0u8; Open::LEN];
                Open {
                    access_mode: AccessMode::ReadWrite,
                    dev_name: self.dev.as_bytes(),
                }
                .encode(&mut m)
                .map_err(|e| e.to_string())?;
                self.send(cx, Dir::Read, &m, OpenRsp::LEN)?
            }
            4 => {
                self.buf.write_at(0, &pattern(self.lbs));
                let m = self.io(RnbdOp::WriteZeroes, 0, BLOCKS);
                self.send(cx, Dir::Write, &m, self.lbs)?
            }
            6 | 8 => {
                let first = if self.step == 6 { 0 } else { BLOCKS - READ };
                let m = self.io(RnbdOp::Read, first, READ);
                self.send(cx, Dir::Read, &m, READ * self.lbs)?
            }
            10 => {
                let m = self.io(RnbdOp::WriteZeroes, 0, BLOCKS);
                self.send(cx, Dir::Write, &m, 2 * self.lbs)?
            }
            12 => {
                let m = Close {
                    device_id: self.device_id,
                }
                .to_bytes();
                self.send(cx, Dir::Write, &m, 0)?
            }
            _ => false,
        };
        if sent {
            self.step += 1;
        }
        Ok(n > 0 || sent)
    }

    fn answer(&mut self, errno: i32) -> Result<(), String> {
        let want = if self.step == 11 { -libc::EINVAL } else { 0 };
        if errno != want {
            return Err(format!(
                "step {}: errno {errno}, expected {want}",
                self.step
            ));
        }
        match self.step {
            3 => {
                let mut b = [0u8; OpenRsp::LEN];
                self.buf.read_at(0, &mut b);
                let rsp = OpenRsp::decode(&b).map_err(|e| e.to_string())?;
                self.device_id = rsp.device_id;
                self.lbs = usize::from(rsp.logical_block_size);
            }
            7 | 9 => {
                let want = pattern(self.lbs);
                let mut got = vec![0u8; READ * self.lbs];
                self.buf.read_at(0, &mut got);
                if let Some(k) = got.chunks(self.lbs).position(|b| b != want.as_slice()) {
                    let first = if self.step == 7 { 0 } else { BLOCKS - READ };
                    return Err(format!(
                        "WRITE_SAME: block {} is not the block sent",
                        first + k
                    ));
                }
            }
            13 => {
                self.done = true;
                let _ = self.tx.send(Ok(format!(
                    "WRITE_SAME of one {}-byte block over {BLOCKS} blocks: first and last \
                     {READ} read back; two blocks of data refused",
                    self.lbs
                )));
            }
            _ => {}
        }
        self.step += 1;
        Ok(())
    }
}

/// Runs the exchange against device `dev` at `addrs` on `engine` (two reactors);
/// `Ok` with a summary, or what went wrong.
///
/// # Panics
/// When the session does not open or nothing is reported within a minute.
pub fn write_same(
    engine: &Engine,
    fabric: &Arc<dyn Fabric>,
    sessname: &'static str,
    addrs: &[SocketAddr],
    dev: &str,
) -> Result<String, String> {
    let (tx, rx) = mpsc::channel();
    let dev = dev.to_string();
    let (stx, srx) = mpsc::channel();
    let (f, addrs) = (Arc::clone(fabric), addrs.to_vec());
    let start = Msg::new(move |cx: &mut dyn Ctx| {
        let paths = addrs.iter().map(|&a| PathAddr::new(a)).collect();
        let cfg = ClientConfig::new(sessname, paths);
        let (session, mut cores) =
            ClientSession::open(cx, Arc::clone(&f), cfg, Box::new(LinkListener::new()))
                .expect("session open");
        let mut other = cores.pop().expect("two cores");
        let buf = f
            .register(MemBuf::zeroed(128 << 10), Access::LOCAL_WRITE)
            .expect("register");
        let mut legacy = Legacy {
            core: cores.pop().expect("two cores"),
            buf,
            step: 0,
            dev,
            device_id: 0,
            lbs: 512,
            tx,
            done: false,
        };
        cx.register(Box::new(move |cx: &mut dyn Ctx| {
            if legacy.done {
                return PollResult::Idle;
            }
            match legacy.poll(cx) {
                Ok(true) => PollResult::Busy,
                Ok(false) => PollResult::Idle,
                Err(e) => {
                    legacy.done = true;
                    let _ = legacy.tx.send(Err(e));
                    PollResult::Idle
                }
            }
        }));
        cx.defer(1, move |cx: &mut dyn Ctx| {
            cx.register(Box::new(move |cx: &mut dyn Ctx| {
                let mut out = [ClientCompletion::default(); 4];
                if other.poll(cx.now(), &mut out) > 0 {
                    PollResult::Busy
                } else {
                    PollResult::Idle
                }
            }));
        })
        .expect("mailbox");
        let _ = stx.send(session);
    });
    engine.send(0, start).expect("mailbox");
    let session = srx.recv_timeout(WAIT).expect("session opened");
    let r = rx
        .recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("legacy WRITE_SAME: nothing within {WAIT:?} ({e})"));
    session.close();
    r
}
