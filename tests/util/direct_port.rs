//! `DirectPort`: an [`RtrsPort`] that carries RNBD requests straight to a server
//! dispatcher in the same thread (a stand-in for RTRS that copies between the client's
//! registered buffers and a chunk, as RTRS does), recording every user header sent.
//! Shared by the RNBD client tests.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use rtrs_spdk::engine::Ctx;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr, Sge};
use rtrs_spdk::rnbd::backend::IoBuf;
use rtrs_spdk::rnbd::client::{PortCompletion, PortError, PortIo, RtrsPort};
use rtrs_spdk::rnbd::server::{
    Completion, Dispatcher, Exports, Outcome, Request, SessionCache, SessionTable,
};
use rtrs_spdk::rnbd::Dir;

pub const CHUNK: usize = 128 << 10;

/// One request as the port saw it.
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
    fabric: LoopbackFabric,
    disp: Dispatcher,
    sessions: SessionCache<u64>,
    key: u64,
    pub connected: bool,
    chunks: MemBuf,
    free: Vec<usize>,
    /// tag → (chunk, dir, the client's SGEs)
    inflight: HashMap<u64, (usize, Dir, Vec<Sge>)>,
    done: VecDeque<PortCompletion>,
    /// While set, block requests are kept (as RTRS keeps IO while no path is up) and
    /// sent by `replay`.
    pub hold: bool,
    held: Vec<(u64, Dir, Vec<u8>, Vec<Sge>)>,
    /// Every request handed to the dispatcher, in order.
    pub sent: Vec<Sent>,
    /// Requests in flight at once, at most (a piece of evidence for pipelining).
    pub max_inflight: usize,
}

impl DirectPort {
    pub fn new(
        fabric: &LoopbackFabric,
        ex: &Arc<Exports>,
        table: &Arc<SessionTable<u64>>,
        key: u64,
        depth: usize,
    ) -> DirectPort {
        DirectPort {
            fabric: fabric.clone(),
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
            sent: Vec::new(),
            max_inflight: 0,
        }
    }

    /// Sends the held block requests (the path is back).
    pub fn replay(&mut self, cx: &mut dyn Ctx) {
        self.hold = false;
        for (tag, dir, usr, sgl) in std::mem::take(&mut self.held) {
            let io = PortIo {
                tag,
                dir,
                usr: &usr,
                sgl: &sgl,
                admin: false,
            };
            self.submit(cx, io).unwrap();
        }
    }

    fn chunk(&self, i: usize, len: usize) -> IoBuf {
        // SAFETY: chunk `i` belongs to one request at a time, from submit to completion.
        unsafe { IoBuf::new(self.chunks.as_ptr().add(i * CHUNK), len) }
    }

    fn finish(&mut self, tag: u64, errno: i32) {
        let (i, dir, sgl) = self.inflight.remove(&tag).expect("known tag");
        if dir == Dir::Read && errno == 0 {
            let mut off = 0;
            for s in &sgl {
                // SAFETY: the SGE names registered memory the client reserved for this
                // request (RtrsPort's contract); the chunk is this request's.
                unsafe { self.chunk(i, CHUNK).copy_out(off, sge_slice(s)) };
                off += s.len as usize;
            }
        }
        self.free.push(i);
        self.done.push_back(PortCompletion { tag, errno });
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

impl RtrsPort for DirectPort {
    fn submit(&mut self, _cx: &mut dyn Ctx, io: PortIo<'_>) -> Result<(), PortError> {
        if self.hold && !io.admin {
            self.held
                .push((io.tag, io.dir, io.usr.to_vec(), io.sgl.to_vec()));
            return Ok(());
        }
        if !self.connected {
            return Err(PortError::Refused {
                errno: -libc::ENOTCONN,
                reason: "no path".into(),
            });
        }
        let Some(i) = self.free.pop() else {
            return Err(PortError::Busy);
        };
        let len: usize = io.sgl.iter().map(|s| s.len as usize).sum();
        assert!(len <= CHUNK);
        if io.dir == Dir::Write {
            let mut off = 0;
            for s in io.sgl {
                // SAFETY: as in finish.
                unsafe { self.chunk(i, CHUNK).copy_in(off, sge_slice(s)) };
                off += s.len as usize;
            }
        }
        self.inflight.insert(io.tag, (i, io.dir, io.sgl.to_vec()));
        self.max_inflight = self.max_inflight.max(self.inflight.len());
        self.sent.push(Sent {
            dir: io.dir,
            admin: io.admin,
            usr: io.usr.to_vec(),
            data_len: len,
        });
        let data = self.chunk(i, len);
        let sess = self.sessions.session_or_create(self.key, "clt").clone();
        let req = Request {
            tag: io.tag,
            dir: io.dir,
            usr: io.usr,
            data,
            peer: None,
        };
        if let Outcome::Done(e) = self.disp.process(&sess, req) {
            self.finish(io.tag, e);
        }
        Ok(())
    }

    fn poll(&mut self, _cx: &mut dyn Ctx, out: &mut [PortCompletion]) -> usize {
        let mut cs = [Completion::default(); 16];
        let n = self.disp.poll(&mut cs);
        for c in &cs[..n] {
            self.finish(c.tag, c.errno);
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

    fn max_io_size(&self) -> u32 {
        CHUNK as u32
    }

    fn zero_region(&self, len: usize) -> Result<Mr, PortError> {
        self.fabric
            .register(MemBuf::zeroed(len), Access::NONE)
            .map_err(|e| PortError::Refused {
                errno: -libc::ENOMEM,
                reason: e.to_string(),
            })
    }
}
