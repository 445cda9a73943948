//! The op table of one core: a slot per request from its IO_REQ imm to its response
//! (the kernel's `struct rtrs_srv_op`, one per buf id there; here per core, since a
//! core serves the connections of many paths). A slot's generation moves when it is
//! freed, so an id or a LOCAL_INV completion of a finished request is recognised.

use super::conn::PathRef;

use super::handler::IoId;
use super::session::Path;
use super::wr::WrId;
use crate::proto::ChunkReq;
use crate::Errno;

/// Where a request is (docs/ARCHITECTURE.md, "The server's core poller").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Free,
    /// LOCAL_INV posted, waiting for its completion.
    Inv,
    /// Waiting for the chunk to be released by another path.
    Waiting,
    /// With the handler.
    Handler,
    /// Answered; the response waits for send slots.
    RspQueued,
}

/// One request on this core.
pub(crate) struct Op {
    pub gen: u32,
    pub stage: Stage,
    pub path: Option<PathRef>,
    /// The connection (index in the core's connections) it came on.
    pub con: usize,
    pub buf_id: u16,
    pub req: Option<ChunkReq>,
    pub result: Result<(), Errno>,
    /// Counted once in `failover_waits`.
    pub counted_wait: bool,
    /// The chunk's count of finished executions when the request arrived.
    pub ticket: u32,
    /// When the handler got it (ns).
    pub t0: u64,
    /// It claimed its chunk ([`ServerSession::try_own`](super::session::ServerSession::try_own)
    /// succeeded) and releases it when it ends.
    pub owns: bool,
}

impl Op {
    fn free(gen: u32) -> Op {
        Op {
            gen,
            stage: Stage::Free,
            path: None,
            con: 0,
            buf_id: 0,
            req: None,
            result: Ok(()),
            counted_wait: false,
            ticket: 0,
            t0: 0,
            owns: false,
        }
    }
}

/// The requests of one core, by slot.
pub(crate) struct OpTable {
    ops: Vec<Op>,
    free: Vec<u32>,
    /// The core, for the per-core counters of a dropped request.
    core: usize,
}

impl OpTable {
    /// A table for `core`, with room for `n` requests before it grows.
    pub fn new(core: usize, n: usize) -> OpTable {
        OpTable {
            ops: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            core,
        }
    }

    /// Takes a slot for a request for chunk `buf_id` of `path` that came on connection
    /// `con`; it waits for its LOCAL_INV ([`Stage::Inv`]).
    pub fn alloc(&mut self, path: PathRef, con: usize, buf_id: u16, req: ChunkReq) -> u32 {
        path.counters.hold(self.core);
        let ticket = path.sess.done_ticket(buf_id);
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.ops.push(Op::free(0));
                (self.ops.len() - 1) as u32
            }
        };
        let op = &mut self.ops[idx as usize];
        op.stage = Stage::Inv;
        op.path = Some(path);
        op.con = con;
        op.buf_id = buf_id;
        op.req = Some(req);
        op.result = Ok(());
        op.counted_wait = false;
        op.ticket = ticket;
        op.owns = false;
        idx
    }

    /// Ends request `idx`: releases its chunk and buf id and frees the slot. `dropped`
    /// counts it as dropped unanswered.
    pub fn end(&mut self, idx: u32, dropped: bool) {
        let op = &mut self.ops[idx as usize];
        if op.stage == Stage::Free {
            return;
        }
        let path = op.path.take();
        self.finish(idx, path.as_deref().map(|p| &**p), dropped);
    }

    /// As [`end`](Self::end), for a request whose path the caller has taken out of the
    /// slot (`Op::path` is `None`) and still holds: no reference count moves.
    pub fn end_taken(&mut self, idx: u32, path: &Path, dropped: bool) {
        if self.ops[idx as usize].stage == Stage::Free {
            return;
        }
        self.finish(idx, Some(path), dropped);
    }

    fn finish(&mut self, idx: u32, path: Option<&Path>, dropped: bool) {
        let op = &mut self.ops[idx as usize];
        if let Some(p) = path {
            if op.owns {
                p.sess.release_owned(op.buf_id);
            }
            p.clear_busy(op.buf_id);
            if dropped {
                p.counters.core(self.core).dropped.add(1);
            }
            p.counters.unhold(self.core);
        }
        op.stage = Stage::Free;
        op.gen = op.gen.wrapping_add(1);
        self.free.push(idx);
    }

    pub fn get(&self, idx: u32) -> &Op {
        &self.ops[idx as usize]
    }

    pub fn get_mut(&mut self, idx: u32) -> &mut Op {
        &mut self.ops[idx as usize]
    }

    /// The handler's id of request `idx`.
    pub fn id(&self, idx: u32) -> IoId {
        IoId::new(idx, self.ops[idx as usize].gen)
    }

    /// The slot an answer with `id` is for: the request must still be with the
    /// handler (a late or repeated answer is `None`).
    pub fn answered(&self, id: IoId) -> Option<u32> {
        let idx = id.slot();
        self.ops
            .get(idx as usize)
            .is_some_and(|o| o.gen == id.gen() && o.stage == Stage::Handler)
            .then_some(idx)
    }

    /// Whether slot `idx` still holds the request a LOCAL_INV with generation `gen24`
    /// ([`WrId::Inv`]) was posted for.
    pub fn inv_matches(&self, idx: u32, gen24: u32) -> bool {
        self.ops
            .get(idx as usize)
            .is_some_and(|o| o.stage == Stage::Inv && WrId::same_gen(gen24, o.gen))
    }

    /// Ends every request waiting for a LOCAL_INV on connection `con` (gone).
    pub fn end_invs_on(&mut self, con: usize) {
        for idx in 0..self.ops.len() as u32 {
            let o = &self.ops[idx as usize];
            if o.stage == Stage::Inv && o.con == con {
                self.end(idx, false);
            }
        }
    }

    /// Whether no request is in the table.
    pub fn is_empty(&self) -> bool {
        self.free.len() == self.ops.len()
    }
}
