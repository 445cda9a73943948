//! One core's RNBD request processing, independent of the transport: a user header, the
//! request's data area and its RTRS direction in; an immediate result (with a reply
//! written into the data area) or a block IO started on this core's backend out, its
//! [`BlockCompletion`] reported later by [`Dispatcher::poll`]. The kernel's `rnbd_srv_rdma_ev` with
//! `process_msg_sess_info`, `process_msg_open`, `process_msg_close` and `process_rdma`
//! (bio flags from `rnbd_to_bio_flags`), plus the checks docs/PROTOCOL.md §9.8 adds.
//!
//! Op 5 means WRITE_SAME to clients older than Linux 5.18 and WRITE_ZEROES to clients
//! from 6.8 on; the version on the wire cannot tell them apart, the data can: an old
//! client's WRITE_SAME carries the one logical block to repeat, a WRITE_ZEROES carries
//! nothing. So op 5 with data is a [`BlockOp::WriteSame`] (data of exactly one logical
//! block, else −EINVAL) and op 5 without data a [`BlockOp::WriteZeroes`].

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use super::exports::{Exports, ExportsError};
use super::session::{lookup_fresh, RnbdServerSession, SessionView};
use super::ExportId;
use crate::proto::rnbd::{AccessMode, Io, OpenRsp, RnbdFlags, RnbdMsg, RnbdOp, SessInfoRsp};
use crate::ratelimit::{log_limited, process_ns, RateLimit};
use crate::rnbd::backend::{
    drain_completions, BlockBackend, BlockCompletion, BlockFlags, BlockIo, BlockOp,
    BlockSubmitError, IoBuf, SECTOR_SIZE,
};
use crate::rnbd::Dir;
use crate::Errno;

/// One request as the transport hands it over.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Comes back in the [`BlockCompletion`] of a submitted IO.
    pub tag: u64,
    pub dir: Dir,
    /// The RTRS user header: an RNBD message.
    pub usr: &'a [u8],
    /// The request's data area (its length is RTRS's `datalen`, possibly 0). The
    /// dispatcher writes replies into it and hands it to the backend; the caller keeps
    /// it valid and untouched until the request is answered.
    pub data: IoBuf,
    /// Source address of the path the request came on (`None`: unknown); an OPEN is
    /// checked against the export's host list with it.
    pub peer: Option<IpAddr>,
    /// The source addresses of every path of the session (empty: unknown): an OPEN is
    /// checked against the host list with each, as each can carry the device's IO.
    pub paths: &'a [IpAddr],
}

/// OPENs refused (host lists, names, writers, modes): a client provokes them at will,
/// so their lines are rate-limited (counting lines printed).
static OPEN_REFUSALS: LazyLock<RateLimit> =
    LazyLock::new(|| RateLimit::per_second("rnbd server: open refusals"));

/// What [`Dispatcher::process`] did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answer now with this result; any reply is in the data area.
    Done(Result<(), Errno>),
    /// A block IO is under way; its completion comes from [`Dispatcher::poll`].
    Submitted,
}

/// Completions made ready outside a backend, before the queue has to grow.
const READY_CAPACITY: usize = 64;
/// IOs queued for a busy backend before the queue has to grow.
const WAIT_CAPACITY: usize = 1024;

/// One core's request processor: this core's instance of every export's backend, and
/// the IOs waiting for a busy one. Exports added at run time are opened on this core at
/// their first IO here; the instance of a removed export is dropped once it has no IO
/// in flight, and a resized export's instance takes its new size (both when
/// [`Exports::generation`] moves).
pub struct Dispatcher {
    exports: Arc<Exports>,
    core: usize,
    /// Indexed by [`ExportId::index`](super::ExportId::index); `None`: not opened here
    /// yet, or dropped after removal.
    backends: Vec<Option<Box<dyn BlockBackend>>>,
    /// The exports generation the backends were last synced with.
    seen_gen: u64,
    /// A removed export's instance still had IO in flight at the last check.
    closing: bool,
    open_failures: u64,
    /// Refused with `Busy`: `(backend index, io)`, retried on every poll.
    waiting: VecDeque<(usize, BlockIo)>,
    /// Completions produced outside a backend (a retried IO refused for good).
    ready: VecDeque<BlockCompletion>,
    bad_headers: u64,
    /// IOs the backend refused as invalid (logged at powers of two).
    refused: u64,
    /// Backends opened on this core so far ([`Dispatcher::opened`]).
    opened: u64,
}

impl Dispatcher {
    /// Opens this core's backends of `exports`.
    ///
    /// # Errors
    /// What [`Exports::open_core`] reports.
    pub fn new(exports: Arc<Exports>, core: usize) -> Result<Dispatcher, ExportsError> {
        let seen_gen = exports.generation();
        let backends = exports.open_core(core)?;
        let opened = backends.iter().flatten().count() as u64;
        Ok(Dispatcher {
            exports,
            core,
            backends,
            seen_gen,
            closing: false,
            open_failures: 0,
            waiting: VecDeque::with_capacity(WAIT_CAPACITY),
            ready: VecDeque::with_capacity(READY_CAPACITY),
            bad_headers: 0,
            refused: 0,
            opened,
        })
    }

    pub fn exports(&self) -> &Arc<Exports> {
        &self.exports
    }

    pub fn core(&self) -> usize {
        self.core
    }

    /// How many backends this core has opened so far (at its making and for exports
    /// added since): each may have registered pollers of its own (an SPDK bdev channel).
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// Requests submitted and not yet returned by [`poll`](Self::poll).
    pub fn in_flight(&self) -> usize {
        self.backends
            .iter()
            .flatten()
            .map(|b| b.in_flight())
            .sum::<usize>()
            + self.waiting.len()
            + self.ready.len()
    }

    /// Handles one request of the session `view` shows, looking an IO's device up in
    /// this core's copy of the session's devices (no lock unless the copy is stale):
    /// SESS_INFO and OPEN answer at once with their reply in the data area, CLOSE answers
    /// 0, IO starts on this core's backend (docs/PROTOCOL.md §7). Every field is checked
    /// first; a malformed header is −EINVAL.
    pub fn process_view(&mut self, view: &mut SessionView, req: Request<'_>) -> Outcome {
        let (sess, devices) = view.parts();
        self.handle(sess, req, |id| lookup_fresh(sess, devices, id))
    }

    /// As [`process_view`](Self::process_view) for a caller that keeps no per-core copy:
    /// an IO looks its device up under the session's lock.
    pub fn process(&mut self, sess: &RnbdServerSession, req: Request<'_>) -> Outcome {
        self.handle(sess, req, |id| sess.lookup(id))
    }

    fn handle(
        &mut self,
        sess: &RnbdServerSession,
        req: Request<'_>,
        lookup: impl FnOnce(u32) -> Option<(ExportId, AccessMode)>,
    ) -> Outcome {
        let msg = match RnbdMsg::decode(req.usr) {
            Ok(msg) => msg,
            Err(e) => {
                self.bad_headers += 1;
                if self.bad_headers.is_power_of_two() {
                    tracing::warn!(
                        session = sess.name(),
                        count = self.bad_headers,
                        "rnbd: refusing request with a bad header: {e}"
                    );
                }
                return Outcome::Done(Err(Errno::EINVAL));
            }
        };
        match msg {
            RnbdMsg::SessInfo(info) => {
                if req.dir != Dir::Read || req.data.len() < SessInfoRsp::LEN {
                    return Outcome::Done(Err(Errno::EINVAL));
                }
                let ver = sess.set_client_ver(info.ver);
                put_reply(req.data, &SessInfoRsp { ver }.to_bytes());
                Outcome::Done(Ok(()))
            }
            RnbdMsg::Open(open) => {
                // Checked before anything changes: a refused reply must not leave a mapping.
                if req.dir != Dir::Read || req.data.len() < OpenRsp::LEN {
                    return Outcome::Done(Err(Errno::EINVAL));
                }
                tracing::debug!(peer = ?req.peer, device = %String::from_utf8_lossy(open.dev_name), "OPEN request");
                match sess.open_from(&open, req.peer, req.paths) {
                    Ok(rsp) => {
                        let mut b = [0u8; OpenRsp::LEN];
                        match rsp.encode(&mut b) {
                            Ok(_) => {
                                put_reply(req.data, &b);
                                Outcome::Done(Ok(()))
                            }
                            // Backends only report block sizes a client accepts.
                            Err(_) => Outcome::Done(Err(Errno::EINVAL)),
                        }
                    }
                    Err(e) => {
                        log_limited!(
                            OPEN_REFUSALS,
                            process_ns(),
                            WARN,
                            session = sess.name(),
                            peer = ?req.peer,
                            dev = %String::from_utf8_lossy(open.dev_name),
                            mode = open.access_mode.as_str(),
                            "rnbd: open refused: {e} ({:?})",
                            e.errno()
                        );
                        Outcome::Done(Err(e.errno()))
                    }
                }
            }
            RnbdMsg::Close(close) => {
                sess.close(close.device_id);
                Outcome::Done(Ok(()))
            }
            RnbdMsg::Io(io) => {
                let device = lookup(io.device_id);
                self.start_io(sess, req, &io, device)
            }
        }
    }

    #[inline]
    fn start_io(
        &mut self,
        sess: &RnbdServerSession,
        req: Request<'_>,
        io: &Io,
        device: Option<(ExportId, AccessMode)>,
    ) -> Outcome {
        let Some((export, mode)) = device else {
            return Outcome::Done(Err(Errno::ENOTCONN));
        };
        let io_block = match to_block_io(req, io, mode) {
            Ok(Some(b)) => b,
            Ok(None) => return Outcome::Done(Ok(())),
            Err(e) => return Outcome::Done(Err(e)),
        };
        let index = export.index();
        let Some(backend) = self.backend(export) else {
            return Outcome::Done(Err(Errno::EIO));
        };
        match backend.submit(io_block) {
            Ok(()) => Outcome::Submitted,
            Err(e) if e.is_busy() => {
                self.waiting.push_back((index, io_block));
                Outcome::Submitted
            }
            Err(e) => {
                self.refused += 1;
                if self.refused.is_power_of_two() {
                    tracing::warn!(
                        session = sess.name(),
                        count = self.refused,
                        "rnbd: refusing IO: {e}"
                    );
                }
                Outcome::Done(Err(e.errno()))
            }
        }
    }

    /// This core's instance of `export`, opened here on first use; `None` (the IO fails
    /// with −EIO) for a removed export or one that cannot be opened on this core.
    fn backend(&mut self, export: ExportId) -> Option<&mut Box<dyn BlockBackend>> {
        // Once synced with the generation (one Acquire load per IO) every instance here
        // has its export's size, and none is of a removed export unless it still has IO
        // in flight (`closing`); one dropped there is opened again below only if its
        // export is still open.
        if self.exports.generation() != self.seen_gen {
            self.sync_exports();
        }
        if self.closing && self.exports.is_closed(export) {
            return None;
        }
        let index = export.index();
        if index >= self.backends.len() {
            self.backends.resize_with(index + 1, || None);
        }
        if self.backends[index].is_none() {
            match self.exports.open_slot(export, self.core) {
                Ok(b) => {
                    self.opened += u64::from(b.is_some());
                    self.backends[index] = b;
                }
                Err(e) => {
                    self.open_failures += 1;
                    if self.open_failures.is_power_of_two() {
                        tracing::error!(
                            core = self.core,
                            count = self.open_failures,
                            "rnbd: {e}; failing its IO with EIO"
                        );
                    }
                }
            }
        }
        self.backends[index].as_mut()
    }

    /// Gives this core's instances their exports' current sizes, and drops those of
    /// removed exports that have nothing in flight, after failing the IOs still waiting
    /// for them.
    fn sync_exports(&mut self) {
        self.seen_gen = self.exports.generation();
        self.closing = false;
        for index in 0..self.backends.len() {
            let Some(b) = self.backends[index].as_mut() else {
                continue;
            };
            if !self.exports.is_closed(ExportId(index)) {
                let size = self.exports.geometry(ExportId(index)).size;
                if b.geometry().size != size {
                    b.set_size(size);
                }
                continue;
            }
            for _ in 0..self.waiting.len() {
                let Some((i, io)) = self.waiting.pop_front() else {
                    break;
                };
                if i == index {
                    self.ready
                        .push_back(BlockCompletion::new(io.tag, Err(Errno::EIO)));
                } else {
                    self.waiting.push_back((i, io));
                }
            }
            if self.backends[index]
                .as_ref()
                .is_some_and(|b| b.in_flight() == 0)
            {
                self.backends[index] = None;
            } else {
                self.closing = true;
            }
        }
    }

    /// Moves finished requests into `out` and retries IOs that found their backend
    /// busy; returns how many were written. Never blocks.
    pub fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        if self.closing || self.exports.generation() != self.seen_gen {
            self.sync_exports();
        }
        let mut n = drain_completions(&mut self.ready, out);
        // Straight into `out`: the backend's completion is the one the wire gets.
        for backend in self.backends.iter_mut().flatten() {
            if n == out.len() {
                break;
            }
            n += backend.poll(&mut out[n..]);
        }
        // Each waiting IO gets one try per poll; a busy backend keeps its order.
        for _ in 0..self.waiting.len() {
            let Some((index, io)) = self.waiting.pop_front() else {
                break;
            };
            let Some(backend) = self.backends.get_mut(index).and_then(Option::as_mut) else {
                self.ready
                    .push_back(BlockCompletion::new(io.tag, Err(Errno::EIO)));
                continue;
            };
            match backend.submit(io) {
                Ok(()) => {}
                Err(e) if e.is_busy() => self.waiting.push_back((index, io)),
                Err(e) => self.finish_early(io.tag, e),
            }
        }
        n + drain_completions(&mut self.ready, &mut out[n..])
    }

    fn finish_early(&mut self, tag: u64, e: BlockSubmitError) {
        self.ready
            .push_back(BlockCompletion::new(tag, Err(e.errno())));
    }
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("core", &self.core)
            .field("exports", &self.exports)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// Writes a reply at the start of a READ request's data area (length checked by the
/// caller).
fn put_reply(data: IoBuf, reply: &[u8]) {
    // SAFETY: the transport gives the data area to the dispatcher until the request is
    // answered (Request::data), and nobody else touches it meanwhile; copy_in checks
    // the bounds.
    unsafe { data.copy_in(0, reply) }
}

/// Turns an RNBD IO into a block IO (`process_rdma` + `rnbd_to_bio_flags`): `Ok(None)`
/// for an IO with nothing to do, `Err(errno)` for one that must be refused.
fn to_block_io(req: Request<'_>, io: &Io, mode: AccessMode) -> Result<Option<BlockIo>, Errno> {
    let datalen = req.data.len();
    // Op 5 with data is an old client's WRITE_SAME: one block for the whole range (see
    // the module doc; the backend checks the block's length).
    let write_same = io.op == RnbdOp::WriteZeroes && datalen != 0;
    // With data, the chunk is the bio and must be exactly `bi_size` long; without, the
    // size comes from the message (docs/PROTOCOL.md §7.3).
    if datalen != 0 && datalen != io.bi_size as usize && !write_same {
        return Err(Errno::EINVAL);
    }
    // Only ops with a range have a position: the kernel's client sends a flush with the
    // block layer's flush request's sector, −1 (`rnbd_client_xfer_request`).
    let offset = || io.sector.checked_mul(SECTOR_SIZE).ok_or(Errno::EIO);
    let mut flags = BlockFlags::NONE;
    if io.flags.contains(RnbdFlags::FUA) {
        flags = flags | BlockFlags::FUA;
    }
    if io.flags.contains(RnbdFlags::PREFLUSH) {
        flags = flags | BlockFlags::PREFLUSH;
    }
    if io.op == RnbdOp::WriteZeroes && !write_same && io.flags.contains(RnbdFlags::NOUNMAP) {
        flags = flags | BlockFlags::NOUNMAP;
    }
    // The kernel lets the block layer decide; a read-only mapping refusing to change the
    // device is the point of the mode.
    if mode == AccessMode::ReadOnly && io.op.is_rtrs_write() {
        return Err(Errno::EROFS);
    }
    if write_same {
        // The data is the client's: it must come as a WRITE.
        if req.dir != Dir::Write {
            return Err(Errno::EINVAL);
        }
        return Ok(Some(
            BlockIo::write_same(req.tag, offset()?, io.bi_size, req.data).with_flags(flags),
        ));
    }
    let op = match io.op {
        RnbdOp::Read => BlockOp::Read,
        RnbdOp::Write => BlockOp::Write,
        // An empty write with preflush (the kernel's REQ_OP_WRITE | REQ_PREFLUSH).
        RnbdOp::Flush => return Ok(Some(BlockIo::flush(req.tag).with_flags(flags))),
        RnbdOp::Discard => BlockOp::Discard,
        RnbdOp::SecureErase => BlockOp::SecureErase,
        RnbdOp::WriteZeroes => BlockOp::WriteZeroes,
    };
    if op == BlockOp::Read || op == BlockOp::Write {
        let want = if op == BlockOp::Read {
            Dir::Read
        } else {
            Dir::Write
        };
        if io.bi_size == 0 {
            // A data-less read or write: at most a cache flush (a write with PREFLUSH
            // or FUA and no data is how a block layer may express a flush).
            if datalen == 0 && flags != BlockFlags::NONE && op == BlockOp::Write {
                return Ok(Some(BlockIo::flush(req.tag).with_flags(flags)));
            }
            return Ok(None);
        }
        // Data must be where the direction puts it: reply space for a read, the
        // client's bytes for a write.
        if datalen == 0 || req.dir != want {
            return Err(Errno::EINVAL);
        }
        return Ok(Some(
            BlockIo {
                tag: req.tag,
                op,
                offset: offset()?,
                len: io.bi_size,
                buf: Some(req.data),
                flags: BlockFlags::NONE,
            }
            .with_flags(flags),
        ));
    }
    Ok(Some(
        BlockIo::range(req.tag, op, offset()?, io.bi_size).with_flags(flags),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(op: RnbdOp, flags: RnbdFlags, bi_size: u32) -> Io {
        Io {
            device_id: 0,
            sector: 8,
            op,
            flags,
            bi_size,
            prio: 0,
        }
    }

    fn req(dir: Dir, data: IoBuf) -> Request<'static> {
        Request {
            tag: 5,
            dir,
            usr: &[],
            data,
            peer: None,
            paths: &[],
        }
    }

    #[test]
    fn op_and_flag_mapping() {
        let mem = crate::fabric::mem::MemBuf::zeroed(4096);
        // SAFETY: `mem` outlives the test; the IOs are never run.
        let data = unsafe { IoBuf::from_mem(&mem) };
        // SAFETY: a zero-length view of the same memory.
        let none = unsafe { IoBuf::new(mem.as_ptr(), 0) };
        let rw = AccessMode::ReadWrite;
        let w = to_block_io(
            req(Dir::Write, data),
            &io(
                RnbdOp::Write,
                RnbdFlags::FUA | RnbdFlags::PREFLUSH | RnbdFlags::SYNC,
                4096,
            ),
            rw,
        )
        .unwrap()
        .unwrap();
        assert_eq!((w.op, w.offset, w.len), (BlockOp::Write, 4096, 4096));
        assert_eq!(w.flags, BlockFlags::FUA | BlockFlags::PREFLUSH);
        let f = to_block_io(
            req(Dir::Read, none),
            &io(RnbdOp::Flush, RnbdFlags::NONE, 0),
            rw,
        )
        .unwrap()
        .unwrap();
        assert_eq!(f.op, BlockOp::Flush);
        // The kernel's client: its flush request's sector is -1, its PREFLUSH reads as
        // FUA (`rq_to_rnbd_flags`); the write behind an empty PREFLUSH write likewise.
        for (op, dir) in [(RnbdOp::Flush, Dir::Read), (RnbdOp::Write, Dir::Write)] {
            let kernel = Io {
                sector: u64::MAX,
                ..io(op, RnbdFlags::FUA | RnbdFlags::SYNC, 0)
            };
            let f = to_block_io(req(dir, none), &kernel, rw).unwrap().unwrap();
            assert_eq!((f.op, f.flags), (BlockOp::Flush, BlockFlags::FUA), "{op:?}");
        }
        // A range op with such a sector is refused.
        let far = Io {
            sector: u64::MAX,
            ..io(RnbdOp::Discard, RnbdFlags::NONE, 512)
        };
        assert_eq!(
            to_block_io(req(Dir::Write, none), &far, rw),
            Err(Errno::EIO)
        );
        let z = to_block_io(
            req(Dir::Write, none),
            &io(RnbdOp::WriteZeroes, RnbdFlags::NOUNMAP, 65536),
            rw,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (z.op, z.len, z.flags, z.buf),
            (BlockOp::WriteZeroes, 65536, BlockFlags::NOUNMAP, None)
        );
        // NOUNMAP only means something for write-zeroes.
        let d = to_block_io(
            req(Dir::Write, none),
            &io(RnbdOp::Discard, RnbdFlags::NOUNMAP, 512),
            rw,
        )
        .unwrap()
        .unwrap();
        assert_eq!((d.op, d.flags), (BlockOp::Discard, BlockFlags::NONE));
        // datalen must equal bi_size when present.
        assert_eq!(
            to_block_io(
                req(Dir::Write, data),
                &io(RnbdOp::Write, RnbdFlags::NONE, 512),
                rw
            ),
            Err(Errno::EINVAL)
        );
        // A read needs reply space, a write its data, in the right direction.
        assert_eq!(
            to_block_io(
                req(Dir::Read, none),
                &io(RnbdOp::Read, RnbdFlags::NONE, 512),
                rw
            ),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            to_block_io(
                req(Dir::Read, data),
                &io(RnbdOp::Write, RnbdFlags::NONE, 4096),
                rw
            ),
            Err(Errno::EINVAL)
        );
        // Empty write with preflush is a flush; an empty read does nothing.
        let e = to_block_io(
            req(Dir::Write, none),
            &io(RnbdOp::Write, RnbdFlags::PREFLUSH, 0),
            rw,
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.op, BlockOp::Flush);
        assert_eq!(
            to_block_io(
                req(Dir::Read, none),
                &io(RnbdOp::Read, RnbdFlags::NONE, 0),
                rw
            ),
            Ok(None)
        );
        // Read-only mappings refuse writes but not reads or flushes.
        let ro = AccessMode::ReadOnly;
        assert_eq!(
            to_block_io(
                req(Dir::Write, none),
                &io(RnbdOp::Discard, RnbdFlags::NONE, 512),
                ro
            ),
            Err(Errno::EROFS)
        );
        assert!(to_block_io(
            req(Dir::Read, none),
            &io(RnbdOp::Flush, RnbdFlags::NONE, 0),
            ro
        )
        .is_ok());
        assert!(to_block_io(
            req(Dir::Read, data),
            &io(RnbdOp::Read, RnbdFlags::NONE, 4096),
            ro
        )
        .is_ok());
        // A sector whose byte offset overflows is out of range.
        let mut far = io(RnbdOp::Discard, RnbdFlags::NONE, 512);
        far.sector = u64::MAX / 2;
        assert_eq!(
            to_block_io(req(Dir::Write, none), &far, rw),
            Err(Errno::EIO)
        );
    }
}
