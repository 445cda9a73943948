//! The RNBD workload two tests share (`rnbd`'s `tcp` against our own server, `spdk_target`
//! against the SPDK plugin's target): two client reactors; the home core (0) maps a
//! device, writes 256 blocks of 4 KiB and reads them back at queue depth 16 (`rounds`
//! times) while core 1 reads and verifies the same data through its own connection; then
//! flush, discard, write-zeroes, a read checking the zeroes, and close. Every wait is
//! bounded (seconds); nothing is timed.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtrs_spdk::client::{ClientConfig, PathAddr, SessionCore};
use rtrs_spdk::engine::{Ctx, Engine, Msg, PollResult};
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    completion_result, open_rnbd_session, BlockRequest, ClientCompletion, ClientEvent, DevHandle,
    RnbdClient, RnbdClientSession, RnbdQueue,
};

pub const BS: usize = 4096;
pub const BLOCKS: usize = 256;
pub const QD: usize = 16;
pub const WAIT: Duration = Duration::from_secs(60);
/// The home core's progress message after each write+read pass.
const ROUND: &str = "round";

type Report = mpsc::Sender<Result<String, String>>;

/// The byte of block `b` at position `i`.
fn pattern(b: usize, i: usize) -> u8 {
    (b * 7 + i / 64 + 1) as u8
}

/// Shared between the two cores' workloads.
#[derive(Default)]
struct Flags {
    dev: Mutex<Option<DevHandle>>,
    written: AtomicBool,
    verified: AtomicBool,
}

/// Runs up to QD requests over a buffer of QD block slots.
struct Window {
    buf: Mr,
    free: Vec<usize>,
    next: usize,
    done: usize,
}

impl Window {
    fn new(buf: Mr) -> Window {
        Window {
            buf,
            free: (0..QD).collect(),
            next: 0,
            done: 0,
        }
    }

    fn reset(&mut self) {
        self.next = 0;
        self.done = 0;
    }

    /// Block and slot of a finished tag; checks a read slot's contents.
    fn finish(&mut self, tag: u64, verify: bool) -> Result<(), String> {
        let (block, slot) = ((tag >> 16) as usize, (tag & 0xffff) as usize);
        if verify {
            let mut got = vec![0u8; BS];
            self.buf.read_at(slot * BS, &mut got);
            if let Some(i) = (0..BS).find(|&i| got[i] != pattern(block, i)) {
                return Err(format!(
                    "block {block} byte {i}: {} != {}",
                    got[i],
                    pattern(block, i)
                ));
            }
        }
        self.free.push(slot);
        self.done += 1;
        Ok(())
    }
}

/// Core 0: the client's home core.
struct Home {
    rnbd: RnbdClient<SessionCore>,
    win: Window,
    phase: u8,
    flags: Arc<Flags>,
    tx: Report,
    failed: bool,
    /// Write+read passes still to run on the home core.
    rounds: u32,
}

impl Home {
    fn fail(&mut self, why: String) {
        if !self.failed {
            self.failed = true;
            let _ = self.tx.send(Err(format!("core 0: {why}")));
        }
    }

    fn step(&mut self, cx: &mut dyn Ctx) -> Result<bool, String> {
        let mut ev = vec![
            ClientEvent::Io {
                tag: 0,
                result: Ok(())
            };
            32
        ];
        let n = self.rnbd.poll(cx.now(), &mut ev);
        for e in &ev[..n] {
            match e {
                ClientEvent::SessInfo(Ok(_)) => {}
                ClientEvent::Opened { dev: d, .. } => {
                    *self.flags.dev.lock().unwrap() = Some(*d);
                    self.phase = 1;
                }
                // Flush/discard/write-zeroes and the final read use no window slot.
                ClientEvent::Io { result: Ok(()), .. } if self.phase >= 3 => self.win.done += 1,
                ClientEvent::Io {
                    tag,
                    result: Ok(()),
                } => self.win.finish(*tag, self.phase == 2)?,
                ClientEvent::Closed { .. } => {
                    self.phase = 9;
                    let _ = self.tx.send(Ok("core 0 done".into()));
                }
                other => return Err(format!("unexpected {other:?}")),
            }
        }
        let Some(dev) = *self.flags.dev.lock().unwrap() else {
            return Ok(n > 0);
        };
        match self.phase {
            // Write every block, then read them back.
            1 | 2 => {
                let read = self.phase == 2;
                while self.win.next < BLOCKS {
                    let Some(slot) = self.win.free.pop() else {
                        break;
                    };
                    let b = self.win.next;
                    if !read {
                        let data: Vec<u8> = (0..BS).map(|i| pattern(b, i)).collect();
                        self.win.buf.write_at(slot * BS, &data);
                    }
                    let off = (b * BS) as u64;
                    let req = if read {
                        BlockRequest::read(off, BS as u32)
                    } else {
                        BlockRequest::write(off, BS as u32)
                    };
                    let sge = [self.win.buf.sge(slot * BS, BS)];
                    match self
                        .rnbd
                        .submit(cx.now(), dev, (b << 16 | slot) as u64, &req, &sge)
                    {
                        Ok(()) => self.win.next += 1,
                        Err(e) if e.is_busy() => {
                            self.win.free.push(slot);
                            break;
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
                if self.win.done == BLOCKS {
                    self.flags.written.store(true, Ordering::Release);
                    self.phase += 1;
                    if self.phase == 3 && self.rounds > 1 {
                        self.rounds -= 1;
                        self.phase = 1;
                        // Progress: the wait bound applies per pass, not to the whole run.
                        let _ = self.tx.send(Ok(ROUND.into()));
                    }
                    self.win.reset();
                }
            }
            // Wait for core 1's verification, then flush, discard and write-zeroes.
            3 if self.flags.verified.load(Ordering::Acquire) => {
                let reqs = [
                    BlockRequest::flush(),
                    BlockRequest::discard(0, (8 * BS) as u32),
                    BlockRequest::write_zeroes((8 * BS) as u64, (8 * BS) as u32).nounmap(),
                ];
                for (i, r) in reqs.iter().enumerate() {
                    self.rnbd
                        .submit(cx.now(), dev, (1 << 40) + i as u64, r, &[])
                        .map_err(|e| e.to_string())?;
                }
                self.phase = 4;
            }
            4 if self.win.done == 3 => {
                self.win.done = 0;
                let sge = [self.win.buf.sge(0, 16 * BS)];
                let req = BlockRequest::read(0, (16 * BS) as u32);
                self.rnbd
                    .submit(cx.now(), dev, 1 << 41, &req, &sge)
                    .map_err(|e| e.to_string())?;
                self.phase = 5;
            }
            5 if self.win.done == 1 => {
                let mut got = vec![1u8; 16 * BS];
                self.win.buf.read_at(0, &mut got);
                if got.iter().any(|&x| x != 0) {
                    return Err("discarded / zeroed blocks are not zero".into());
                }
                self.rnbd.close(cx.now(), dev).map_err(|e| e.to_string())?;
                self.phase = 6;
            }
            _ => {}
        }
        Ok(n > 0)
    }
}

/// Core 1: reads every block through its own connection once core 0 wrote them.
struct Other {
    core: RnbdQueue<SessionCore>,
    win: Window,
    flags: Arc<Flags>,
    tx: Report,
    state: u8,
}

impl Other {
    fn step(&mut self, cx: &mut dyn Ctx) -> Result<bool, String> {
        let mut done = [ClientCompletion::default(); 32];
        let n = self.core.poll(cx.now(), &mut done);
        for c in &done[..n] {
            if let Err(e) = completion_result(c) {
                return Err(format!("read tag {:#x}: errno {}", c.tag, e.neg()));
            }
            self.win.finish(c.tag, true)?;
        }
        if self.state != 0 || !self.flags.written.load(Ordering::Acquire) {
            return Ok(n > 0);
        }
        let dev = self
            .flags
            .dev
            .lock()
            .unwrap()
            .expect("device known once written");
        while self.win.next < BLOCKS {
            let Some(slot) = self.win.free.pop() else {
                break;
            };
            let b = self.win.next;
            let req = BlockRequest::read((b * BS) as u64, BS as u32);
            let sge = [self.win.buf.sge(slot * BS, BS)];
            match self
                .core
                .submit(cx.now(), dev, (b << 16 | slot) as u64, &req, &sge)
            {
                Ok(()) => self.win.next += 1,
                Err(e) if e.is_busy() => {
                    self.win.free.push(slot);
                    break;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        if self.win.done == BLOCKS {
            self.state = 1;
            self.flags.verified.store(true, Ordering::Release);
            let _ = self.tx.send(Ok("core 1 verified".into()));
        }
        Ok(n > 0)
    }
}

fn busy(b: bool) -> PollResult {
    if b {
        PollResult::Busy
    } else {
        PollResult::Idle
    }
}

/// Runs the workload on `engine` (two reactors) over `fabric`: one session named
/// `sessname` with one path per address of `addrs` (each leaving from `src` when
/// given), device `dev` opened read-write.
/// Returns the progress messages (`["core 1 verified", "core 0 done"]` when all went well)
/// and the first failure, if any.
///
/// # Panics
/// When the session does not open or nothing progresses within [`WAIT`].
pub fn run(
    engine: &Engine,
    fabric: &Arc<dyn Fabric>,
    sessname: &str,
    addrs: &[SocketAddr],
    src: Option<IpAddr>,
    dev: &str,
    rounds: u32,
) -> (Vec<String>, Option<String>) {
    let paths = addrs
        .iter()
        .map(|&dst| PathAddr {
            src: src.map(|ip| SocketAddr::new(ip, 0)),
            dst,
        })
        .collect();
    run_with(
        engine,
        fabric,
        ClientConfig::new(sessname, paths),
        dev,
        rounds,
    )
}

/// [`run`] with a client configuration of the caller's (paths, keys, ...).
pub fn run_with(
    engine: &Engine,
    fabric: &Arc<dyn Fabric>,
    cfg: ClientConfig,
    dev: &str,
    rounds: u32,
) -> (Vec<String>, Option<String>) {
    let (tx, rx) = mpsc::channel();
    let flags = Arc::new(Flags::default());
    let (f, tx0, fl) = (Arc::clone(fabric), tx.clone(), Arc::clone(&flags));
    let (stx, srx) = mpsc::channel();
    let open_name = dev.to_string();
    let start = Msg::new(move |cx: &mut dyn Ctx| {
        let RnbdClientSession {
            session,
            admin,
            mut queues,
        } = open_rnbd_session(cx, 2, Arc::clone(&f), cfg).expect("session open");
        let reg = |len: usize| {
            f.register(MemBuf::zeroed(len), Access::LOCAL_WRITE)
                .unwrap()
        };
        let other = queues.pop().unwrap();
        let mut rnbd = RnbdClient::from_parts(admin, queues.pop().unwrap());
        rnbd.open(cx.now(), &open_name, AccessMode::ReadWrite)
            .unwrap();
        // The final check reads 16 blocks into the home window.
        const _: () = assert!(QD >= 16);
        let (buf0, buf1) = (reg(QD * BS), reg(QD * BS));
        let mut home = Home {
            rnbd,
            win: Window::new(buf0),
            phase: 0,
            flags: Arc::clone(&fl),
            tx: tx0.clone(),
            failed: false,
            rounds,
        };
        cx.register(Box::new(move |cx: &mut dyn Ctx| match home.step(cx) {
            Ok(b) => busy(b),
            Err(e) => {
                home.fail(e);
                PollResult::Idle
            }
        }));
        let mut other = Other {
            core: other,
            win: Window::new(buf1),
            flags: fl,
            tx: tx0,
            state: 0,
        };
        let _ = stx.send(session);
        cx.defer(1, move |cx: &mut dyn Ctx| {
            let mut failed = false;
            cx.register(Box::new(move |cx: &mut dyn Ctx| match other.step(cx) {
                Ok(b) => busy(b),
                Err(e) => {
                    if !failed {
                        failed = true;
                        let _ = other.tx.send(Err(format!("core 1: {e}")));
                    }
                    PollResult::Idle
                }
            }));
        })
        .expect("mailbox");
    });
    engine.send(0, start).expect("mailbox");
    let session = srx.recv_timeout(WAIT).expect("session opened");
    let mut got = Vec::new();
    let mut failure = None;
    while got.len() < 2 && failure.is_none() {
        match rx.recv_timeout(WAIT) {
            Ok(Ok(m)) if m == ROUND => {}
            Ok(Ok(m)) => got.push(m),
            Ok(Err(e)) => failure = Some(e),
            Err(e) => panic!("no progress within {WAIT:?} ({e}); so far {got:?}"),
        }
    }
    session.close();
    (got, failure)
}
