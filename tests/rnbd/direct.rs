//! A direct in-process RTRS session handle for RNBD client tests (`session.rs`, `wait.rs`,
//! `write_zeroes.rs`): [`DirectPort`] carries requests straight to an RNBD server's
//! dispatcher, copying between the client's registered buffers and a chunk as RTRS does,
//! and can keep block requests (as RTRS keeps IO while no path is up), refuse them (no
//! path) or answer them with −ECONNRESET (a queue-depth change), and records every
//! request it carried ([`Sent`]). [`Rig`] steps one simulated reactor with a virtual
//! clock.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rtrs_spdk::engine::{Ctx, Simulation};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr, Sge};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::backend::{BlockCompletion, IoBuf};
use rtrs_spdk::rnbd::client::{
    completion, BlockRequest, ClientCompletion, ClientEvent, ClientIo, DevHandle, RnbdClient,
    RnbdSendError, SessionHandle, Sgl,
};
use rtrs_spdk::rnbd::server::{Dispatcher, Exports, Outcome, Request, RnbdSessions, SessionCache};
use rtrs_spdk::rnbd::Dir;
use rtrs_spdk::Errno;

pub const CHUNK: usize = 128 << 10;
/// The wait for an unreachable device of [`Rig::client`]'s ports.
pub const WAIT: Duration = Duration::from_secs(2);

/// One request as the port carried it to the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub dir: Dir,
    pub admin: bool,
    /// The RNBD user header.
    pub usr: Vec<u8>,
    /// Bytes of data (WRITE) or reply space (READ).
    pub data_len: usize,
}

/// Carries requests straight to a dispatcher; one chunk per request in flight.
pub struct DirectPort {
    /// Registers the zero buffer of emulated write-zeroes (any registration works:
    /// this port copies by address).
    fabric: LoopbackFabric,
    disp: Dispatcher,
    sessions: SessionCache<u64>,
    key: u64,
    /// Cleared: every request is refused with −ENOTCONN (a closed session).
    pub connected: bool,
    chunks: MemBuf,
    /// Free chunks (a test may take them all to leave the client without a permit).
    pub free: Vec<usize>,
    /// tag → (chunk, dir, the client's SGEs)
    inflight: HashMap<u64, (usize, Dir, Vec<Sge>)>,
    done: VecDeque<ClientCompletion>,
    /// While set, block requests are kept (as RTRS keeps IO in flight on a path that
    /// stopped answering) and sent by `replay`.
    pub hold: bool,
    /// While set, block requests are refused `Unreachable` (no path on this core now),
    /// counted in `unreachable_refused`.
    pub unreachable: bool,
    pub unreachable_refused: usize,
    /// What `path_epoch` reports.
    pub epoch: u64,
    held: Vec<(u64, Dir, Vec<u8>, Vec<Sge>)>,
    /// This many next block requests end with −ECONNRESET unexecuted (RTRS drops a
    /// waiting request at a queue-depth change).
    pub reset_next: usize,
    /// Every block request's scatter list as it came: held where its owner keeps it
    /// (`Sgl::Held`), and the address of its first entry.
    pub lists: Vec<(bool, usize)>,
    /// Block requests accepted so far (held, reset or executed).
    pub block_submits: usize,
    /// What `io_wait_timeout` reports.
    pub wait: Duration,
    /// Every request handed to the dispatcher, in order.
    pub sent: Vec<Sent>,
    /// The regions the queue announced with `use_region` (the zero buffer).
    pub regions: Vec<Arc<Mr>>,
    /// WRITE segments that lay in none of `regions`, by lkey (only the zero buffer's
    /// lkey is checked: see `zero_lkeys`).
    pub unannounced: usize,
    /// The lkeys of the zero buffers this port registered.
    zero_lkeys: std::sync::Mutex<Vec<u32>>,
}

impl DirectPort {
    pub fn new(
        ex: &Arc<Exports>,
        table: &Arc<RnbdSessions<u64>>,
        key: u64,
        depth: usize,
    ) -> DirectPort {
        DirectPort {
            fabric: LoopbackFabric::new(),
            disp: Dispatcher::new(ex.clone(), 0).unwrap(),
            sessions: SessionCache::new(table.clone()),
            key,
            connected: true,
            chunks: MemBuf::zeroed(depth * CHUNK),
            free: (0..depth).rev().collect(),
            inflight: HashMap::new(),
            done: VecDeque::new(),
            hold: false,
            held: Vec::new(),
            unreachable: false,
            unreachable_refused: 0,
            epoch: 0,
            reset_next: 0,
            block_submits: 0,
            lists: Vec::new(),
            wait: WAIT,
            sent: Vec::new(),
            regions: Vec::new(),
            unannounced: 0,
            zero_lkeys: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Sends the held block requests (the path is back).
    pub fn replay(&mut self, now: u64) {
        self.hold = false;
        for (tag, dir, usr, sgl) in std::mem::take(&mut self.held) {
            // Not counted twice: they were counted when held.
            self.block_submits -= 1;
            let io = ClientIo {
                tag,
                dir,
                usr: &usr,
                sgl: Sgl::Copy(&sgl),
                admin: false,
                wait: rtrs_spdk::client::PathWait::Session,
            };
            self.submit(now, io).unwrap();
            // Nor listed twice.
            self.lists.pop();
        }
    }

    fn chunk(&self, i: usize, len: usize) -> IoBuf {
        // SAFETY: chunk `i` belongs to one request at a time, from submit to completion.
        unsafe { IoBuf::new(self.chunks.as_ptr().add(i * CHUNK), len) }
    }

    fn finish(&mut self, tag: u64, errno: i32) {
        let result = Errno::result_from_neg(errno);
        let (i, dir, sgl) = self.inflight.remove(&tag).expect("known tag");
        if dir == Dir::Read && result.is_ok() {
            let mut off = 0;
            for s in &sgl {
                // SAFETY: the SGE names registered memory the client reserved for this
                // request (SessionHandle's contract); the chunk is this request's.
                unsafe { self.chunk(i, CHUNK).copy_out(off, sge_slice(s)) };
                off += s.len as usize;
            }
        }
        self.free.push(i);
        self.done.push_back(completion(tag, result));
    }
}

/// The memory an SGE names, as a slice.
///
/// # Safety
/// The SGE must name live memory nobody else touches while the slice is used.
#[allow(clippy::mut_from_ref)]
unsafe fn sge_slice(s: &Sge) -> &mut [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(s.addr as *mut u8, s.len as usize) }
}

impl SessionHandle for DirectPort {
    fn submit(&mut self, _now: u64, io: ClientIo<'_>) -> Result<(), RnbdSendError> {
        if !io.admin {
            self.block_submits += 1;
            self.lists
                .push((matches!(io.sgl, Sgl::Held(_)), io.sgl.as_ptr() as usize));
        }
        if self.hold && !io.admin {
            self.held
                .push((io.tag, io.dir, io.usr.to_vec(), io.sgl.to_vec()));
            return Ok(());
        }
        if self.unreachable && !io.admin {
            self.block_submits -= 1;
            self.unreachable_refused += 1;
            return Err(RnbdSendError::Unreachable);
        }
        if !self.connected {
            if !io.admin {
                self.block_submits -= 1;
            }
            return Err(RnbdSendError::Refused {
                errno: Errno::ENOTCONN,
                reason: "no path".into(),
            });
        }
        if self.reset_next > 0 && !io.admin {
            self.reset_next -= 1;
            self.done
                .push_back(completion(io.tag, Err(Errno::ECONNRESET)));
            return Ok(());
        }
        let Some(i) = self.free.pop() else {
            return Err(RnbdSendError::Busy);
        };
        let len: usize = io.sgl.iter().map(|s| s.len as usize).sum();
        assert!(len <= CHUNK);
        if io.dir == Dir::Write {
            // A segment of the zero buffer must lie in a region the queue announced:
            // a fabric without a registration table (verbs) resolves nothing else.
            let zero = self.zero_lkeys.lock().unwrap().clone();
            for s in io.sgl.iter().filter(|s| zero.contains(&s.lkey)) {
                let inside = self.regions.iter().any(|m| {
                    m.lkey() == s.lkey
                        && s.addr >= m.addr()
                        && s.addr + u64::from(s.len) <= m.addr() + m.len() as u64
                });
                if !inside {
                    self.unannounced += 1;
                }
            }
            let mut off = 0;
            for s in io.sgl.iter() {
                // SAFETY: as in finish.
                unsafe { self.chunk(i, CHUNK).copy_in(off, sge_slice(s)) };
                off += s.len as usize;
            }
        }
        self.inflight.insert(io.tag, (i, io.dir, io.sgl.to_vec()));
        self.sent.push(Sent {
            dir: io.dir,
            admin: io.admin,
            usr: io.usr.to_vec(),
            data_len: len,
        });
        let data = self.chunk(i, len);
        let req = Request {
            tag: io.tag,
            dir: io.dir,
            usr: io.usr,
            data,
            peer: None,
            paths: &[],
        };
        let sess = self.sessions.session_or_create(self.key, "clt");
        if let Outcome::Done(e) = self.disp.process_view(sess, req) {
            self.finish(io.tag, Errno::neg_of(e));
        }
        Ok(())
    }

    fn poll(&mut self, _now: u64, out: &mut [ClientCompletion]) -> usize {
        let mut cs = [BlockCompletion::default(); 16];
        let n = self.disp.poll(&mut cs);
        for c in &cs[..n] {
            self.finish(c.tag, Errno::neg_of(c.result));
        }
        let mut k = 0;
        while k < out.len() {
            let Some(c) = self.done.pop_front() else {
                break;
            };
            out[k] = c;
            k += 1;
        }
        k
    }

    fn path_epoch(&self) -> u64 {
        self.epoch
    }

    fn max_io_size(&self) -> u32 {
        CHUNK as u32
    }

    fn io_wait_timeout(&self) -> Duration {
        self.wait
    }

    fn zero_region(&self, len: usize) -> Result<Mr, RnbdSendError> {
        let mr = self
            .fabric
            .register(MemBuf::zeroed(len), Access::NONE)
            .map_err(|e| RnbdSendError::Refused {
                errno: Errno::ENOMEM,
                reason: e.to_string(),
            })?;
        self.zero_lkeys.lock().unwrap().push(mr.lkey());
        Ok(mr)
    }

    fn use_region(&mut self, mr: Arc<Mr>) {
        self.regions.push(mr);
    }
}

pub struct Rig {
    pub sim: Simulation,
    pub fabric: LoopbackFabric,
    pub ex: Arc<Exports>,
    pub table: Arc<RnbdSessions<u64>>,
}

impl Rig {
    pub fn new() -> Rig {
        let ex = Arc::new(
            Exports::ram(&[("vol", 4 << 20), ("aux", 1 << 20), ("spare", 1 << 20)]).unwrap(),
        );
        Rig {
            sim: Simulation::new(1, 16),
            fabric: LoopbackFabric::new(),
            table: Arc::new(RnbdSessions::new(ex.clone())),
            ex,
        }
    }

    pub fn mr(&self, len: usize) -> Mr {
        self.fabric
            .register(MemBuf::zeroed(len), Access::LOCAL_WRITE)
            .unwrap()
    }

    /// A client of server session `key` over a port with `depth` chunks.
    pub fn client(&self, key: u64, depth: usize) -> RnbdClient<DirectPort> {
        self.client_waiting(key, depth, WAIT)
    }

    /// As [`client`](Self::client), waiting `wait` for an unreachable device.
    pub fn client_waiting(&self, key: u64, depth: usize, wait: Duration) -> RnbdClient<DirectPort> {
        let mut port = DirectPort::new(&self.ex, &self.table, key, depth);
        port.wait = wait;
        RnbdClient::new(port, self.mr(4096)).unwrap()
    }

    /// Another core's port to server session `key`.
    pub fn port(&self, key: u64, depth: usize) -> DirectPort {
        DirectPort::new(&self.ex, &self.table, key, depth)
    }

    pub fn cx<R>(&mut self, f: impl FnOnce(&mut dyn Ctx) -> R) -> R {
        self.sim.reactor(0).with_ctx(f)
    }

    /// Polls until `want` events came (bounded: 10,000 polls and 10 s, as a file
    /// export completes on threads of its own that a busy machine may run late).
    pub fn events(&mut self, c: &mut RnbdClient<DirectPort>, want: usize) -> Vec<ClientEvent> {
        let mut got = Vec::new();
        let end = std::time::Instant::now() + Duration::from_secs(10);
        for i in 0.. {
            if i >= 10_000 && std::time::Instant::now() >= end {
                break;
            }
            if i >= 10_000 {
                std::thread::yield_now();
            }
            let mut out = vec![
                ClientEvent::Io {
                    tag: 0,
                    result: Ok(())
                };
                8
            ];
            let n = self.cx(|cx| c.poll(cx.now(), &mut out));
            got.extend(out.drain(..n));
            if got.len() >= want {
                break;
            }
        }
        assert_eq!(got.len(), want, "{got:?}");
        got
    }

    pub fn open(
        &mut self,
        c: &mut RnbdClient<DirectPort>,
        name: &str,
        mode: AccessMode,
    ) -> (DevHandle, Result<u32, i32>) {
        let h = self.cx(|cx| c.open(cx.now(), name, mode)).unwrap();
        let ev = self.events(c, if c.ver().is_none() { 2 } else { 1 });
        match ev.last().unwrap() {
            ClientEvent::Opened { dev, info, .. } => {
                assert_eq!(*dev, h);
                (h, Ok(info.device_id))
            }
            ClientEvent::OpenFailed { dev, error } => {
                assert_eq!(*dev, h);
                (h, Err(error.errno().neg()))
            }
            other => panic!("{other:?}"),
        }
    }

    /// One block request to completion: the errno.
    pub fn io(
        &mut self,
        c: &mut RnbdClient<DirectPort>,
        dev: DevHandle,
        req: BlockRequest,
        buf: &Mr,
    ) -> i32 {
        let sgl: Vec<Sge> = if req.data_len() > 0 {
            vec![buf.sge(0, req.data_len() as usize)]
        } else {
            vec![]
        };
        self.cx(|cx| c.submit(cx.now(), dev, 42, &req, &sgl))
            .unwrap();
        match &self.events(c, 1)[0] {
            ClientEvent::Io { tag: 42, result } => Errno::neg_of(*result),
            other => panic!("{other:?}"),
        }
    }
}
