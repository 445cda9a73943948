//! A scripted RTRS server for client tests, built from `proto` and the loopback fabric
//! only: accepts paths (conn_req/conn_rsp), answers INFO_REQ with one descriptor over
//! the session's chunks, acknowledges heartbeats, and serves a RAM block device whose
//! user header is an 8-byte little-endian byte offset. Responses follow docs/PROTOCOL.md
//! §4.5 (RDMA_WRITE of the reply, SEND_WITH_INV when asked, then the response imm, as
//! an empty write-with-imm or an RKEY_RSP under NEW_RKEY_F). One session, answered at
//! once; enough to drive every client path deterministically.

use rtrs_spdk::fabric::ListenOptions;
use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::common::{IuPool, RtrsCon};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{
    Access, CmEvent, Fabric, Listener, MemBuf, Mr, QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode,
    WcStatus,
};
use rtrs_spdk::proto::{
    ChunkOp, ChunkReq, ConnReq, ConnRsp, Imm, ImmLayout, InfoRsp, IoRsp, RkeyRsp, SgDesc,
    HB_ACK_IMM,
};

pub struct SConn {
    pub con: RtrsCon,
    pub cid: u16,
    pub listener: usize,
    pub alive: bool,
    info: Option<IuPool>,
}

/// `wr_id` of [`FakeServer::late_write`]'s write.
const LATE_WR: u64 = 0x1a7e;

/// Counters the tests look at.
#[derive(Debug, Default, Clone)]
pub struct FakeStats {
    pub accepted: u64,
    pub writes: u64,
    pub reads: u64,
    /// READs whose trailer asked for remote invalidation (`NEED_INVAL_F`).
    pub reads_need_inval: u64,
    pub hb_acks: u64,
    pub info: u64,
}

pub struct FakeServer {
    pub fabric: Arc<dyn Fabric>,
    /// The loopback fabric, when the server runs on one (fault injection).
    pub lo: Option<Arc<LoopbackFabric>>,
    pub addrs: Vec<SocketAddr>,
    listeners: Vec<Option<Box<dyn Listener>>>,
    pub qd: u16,
    pub chunk: u32,
    pub max_hdr: u32,
    pub new_rkey: bool,
    chunks: Option<Mr>,
    rkey_bufs: Option<IuPool>,
    info_buf: Option<IuPool>,
    pub disk: Vec<u8>,
    pub conns: Vec<SConn>,
    pub stats: FakeStats,
    /// Stop answering heartbeats (a server that lost interest, for timeouts).
    pub mute_hb: bool,
    /// Hostile behaviour for the next response.
    pub evil: Option<Evil>,
    /// Answer READs without SEND_WITH_INV (the client then invalidates locally).
    pub no_inv: bool,
    /// Hostile: after answering the next READ with a descriptor, write through its key
    /// once more at the next poll, when the client has seen the response.
    pub late_write: bool,
    /// The late write waiting for the next poll: (connection, address, key, length).
    late: Option<(usize, u64, u32, u32)>,
    /// How the late write completed.
    pub late_status: Option<WcStatus>,
    /// Reject this many connection requests with `reject_errno`.
    pub reject_next: u32,
    pub reject_errno: i32,
    /// Connection requests seen, accepted or not.
    pub requests: u64,
    /// Leave the connection requests of this listener unanswered (a path whose
    /// requests are lost on the way) until cleared.
    pub ignore_listener: Option<usize>,
    /// Every cid-0 request, in arrival order: (listener, `first_conn`, connections
    /// accepted before the server polled it, on any listener: requests that arrive
    /// together see the same count).
    pub first_requests: Vec<(usize, bool, u64)>,
    /// Break a path at a step of its bring-up (loopback only).
    pub bringup_fault: Option<BringUpFault>,
    /// Bring-up faults injected so far.
    pub faults_hit: u32,
}

/// Where in a path's bring-up [`FakeServer::bringup_fault`] breaks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BringUpStep {
    /// Right after accepting connection `cid` (answered, then broken at once).
    Accepted(u16),
    /// On INFO_REQ: every connection of the path breaks instead of an answer.
    InfoReq,
}

/// Breaks every connection of path `path` at `step`, the next `times` times the path
/// gets there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BringUpFault {
    pub path: usize,
    pub step: BringUpStep,
    pub times: u32,
}

/// Protocol violations the server can commit once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evil {
    /// Answer a WRITE with IO_RSP_W_INV.
    WInvOnWrite,
    /// Send an imm of unknown type 5 instead of the response.
    UnknownImm,
    /// RKEY_RSP naming another buf_id than the imm.
    RkeyBufIdMismatch,
    /// Send the response twice (the second must be ignored).
    Duplicate,
    /// Send a response for a msg_id beyond the queue depth first (must be ignored).
    BadMsgId,
}

impl FakeServer {
    /// Listens on `n` loopback addresses (one per path).
    pub fn new(
        fabric: Arc<LoopbackFabric>,
        n: usize,
        qd: u16,
        chunk: u32,
        new_rkey: bool,
        disk: usize,
    ) -> FakeServer {
        let f: Arc<dyn Fabric> = fabric.clone();
        FakeServer::on(f, Some(fabric), n, qd, chunk, new_rkey, disk)
    }

    /// On any fabric (fault injection only with `lo`).
    #[allow(clippy::too_many_arguments)]
    pub fn on(
        fabric: Arc<dyn Fabric>,
        lo: Option<Arc<LoopbackFabric>>,
        n: usize,
        qd: u16,
        chunk: u32,
        new_rkey: bool,
        disk: usize,
    ) -> FakeServer {
        let mut s = FakeServer {
            fabric,
            lo,
            addrs: Vec::new(),
            listeners: Vec::new(),
            qd,
            chunk,
            max_hdr: 4096,
            new_rkey,
            chunks: None,
            rkey_bufs: None,
            info_buf: None,
            disk: vec![0; disk],
            conns: Vec::new(),
            stats: FakeStats::default(),
            mute_hb: false,
            evil: None,
            no_inv: false,
            late_write: false,
            late: None,
            late_status: None,
            reject_next: 0,
            reject_errno: -6,
            requests: 0,
            ignore_listener: None,
            first_requests: Vec::new(),
            bringup_fault: None,
            faults_hit: 0,
        };
        for _ in 0..n {
            let l = s
                .fabric
                .listen("127.0.0.1:0".parse().unwrap(), &ListenOptions::default())
                .expect("listen");
            s.addrs.push(l.local_addr());
            s.listeners.push(Some(l));
        }
        s
    }

    pub fn max_io(&self) -> u32 {
        self.chunk - self.max_hdr
    }

    fn layout(&self) -> ImmLayout {
        ImmLayout::new(self.qd, self.chunk).unwrap()
    }

    /// Breaks every connection of path `i` (as a transport failure).
    pub fn break_path(&mut self, i: usize) {
        for c in self.conns.iter().filter(|c| c.listener == i && c.alive) {
            if let Some(f) = self.lo.as_ref().and_then(|lo| lo.faults(c.con.conn())) {
                f.break_now();
            }
        }
    }

    /// Whether path `path` is to break at `step` now (and counts it).
    fn fault_due(&mut self, path: usize, step: BringUpStep) -> bool {
        match &mut self.bringup_fault {
            Some(f) if f.path == path && f.step == step && f.times > 0 => {
                f.times -= 1;
                self.faults_hit += 1;
                true
            }
            _ => false,
        }
    }

    /// Makes path `i` silent: everything vanishes, nobody is told.
    pub fn blackhole_path(&mut self, i: usize) {
        for c in self.conns.iter().filter(|c| c.listener == i && c.alive) {
            if let Some(f) = self.lo.as_ref().and_then(|lo| lo.faults(c.con.conn())) {
                f.blackhole();
            }
        }
    }

    /// The target goes away: every connection breaks, nothing is accepted.
    pub fn stop(&mut self) {
        for i in 0..self.listeners.len() {
            self.break_path(i);
        }
        self.listeners.iter_mut().for_each(|l| *l = None);
        self.chunks = None;
    }

    /// The target comes back on the same addresses (the disk is kept).
    pub fn restart(&mut self) {
        for (i, a) in self.addrs.iter().enumerate() {
            self.listeners[i] = Some(
                self.fabric
                    .listen(*a, &ListenOptions::default())
                    .expect("re-listen"),
            );
        }
    }

    fn ensure_session(&mut self) {
        if self.chunks.is_none() {
            let len = usize::from(self.qd) * self.chunk as usize;
            let mr = self
                .fabric
                .register(
                    MemBuf::zeroed(len),
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )
                .unwrap();
            self.chunks = Some(mr);
            self.rkey_bufs = Some(
                IuPool::new(&*self.fabric, usize::from(self.qd), 8, Access::LOCAL_WRITE).unwrap(),
            );
            self.info_buf = Some(
                IuPool::new(&*self.fabric, 1, InfoRsp::wire_len(1), Access::LOCAL_WRITE).unwrap(),
            );
        }
    }

    pub fn poll(&mut self) -> bool {
        let mut busy = false;
        // Every request waiting now, from every listener, before any is answered: what
        // a client asks at once arrives in one batch (`first_requests` tells).
        let mut batch = Vec::new();
        for li in 0..self.listeners.len() {
            if self.ignore_listener == Some(li) {
                continue;
            }
            while let Some(req) = self.listeners[li].as_mut().and_then(|l| l.poll()) {
                if let Ok(cr) = ConnReq::decode(req.private_data.as_bytes()) {
                    if cr.cid == 0 {
                        self.first_requests
                            .push((li, cr.first_conn, self.stats.accepted));
                    }
                }
                batch.push((li, req));
            }
        }
        for (li, req) in batch {
            {
                busy = true;
                let Ok(cr) = ConnReq::decode(req.private_data.as_bytes()) else {
                    let _ = req.reject(&ConnRsp::reject(104).to_bytes().unwrap());
                    continue;
                };
                self.requests += 1;
                if self.reject_next > 0 {
                    self.reject_next -= 1;
                    let _ = req.reject(&ConnRsp::reject(self.reject_errno).to_bytes().unwrap());
                    continue;
                }
                self.ensure_session();
                let rsp = ConnRsp::accept(self.qd, self.max_io(), self.max_hdr, self.new_rkey)
                    .to_bytes()
                    .unwrap();
                let caps = QpCaps {
                    max_send_wr: 4096,
                    max_recv_wr: 4096,
                    max_send_sge: 2,
                };
                let conn = req.accept(caps, &rsp).expect("accept");
                let mut con = RtrsCon::new(cr.cid, conn, u32::from(self.qd.min(512)));
                let info = if cr.cid == 0 {
                    let pool = IuPool::new(&*self.fabric, 1, 272, Access::LOCAL_WRITE).unwrap();
                    con.post_recv(&[pool.recv_wr(0, 1)]).unwrap();
                    con.post_recv_empty(1024, 0).unwrap();
                    Some(pool)
                } else {
                    con.post_recv_empty(2 * u32::from(self.qd), 0).unwrap();
                    None
                };
                self.stats.accepted += 1;
                self.conns.push(SConn {
                    con,
                    cid: cr.cid,
                    listener: li,
                    alive: true,
                    info,
                });
                if self.fault_due(li, BringUpStep::Accepted(cr.cid)) {
                    self.break_path(li);
                }
            }
        }
        if let Some((ci, addr, rkey, len)) = self.late.take() {
            let mr = self.chunks.as_ref().unwrap();
            let sge = [mr.sge(0, len as usize)];
            let _ = self.conns[ci].con.post_send(&[SendWr {
                wr_id: LATE_WR,
                op: SendOp::RdmaWrite {
                    remote_addr: addr,
                    rkey,
                },
                sges: &sge,
                signaled: true,
            }]);
        }
        let mut wcs = [Wc::default(); 32];
        for ci in 0..self.conns.len() {
            if !self.conns[ci].alive {
                continue;
            }
            while let Some(ev) = self.conns[ci].con.poll_cm() {
                if matches!(ev, CmEvent::Disconnected | CmEvent::Error { .. }) {
                    self.conns[ci].alive = false;
                }
            }
            let n = self.conns[ci].con.poll(&mut wcs);
            // A request received before the connection broke cannot be answered on it
            // (the loopback executes at post time, so such receives complete).
            let alive = self.conns[ci].alive;
            for wc in &wcs[..n] {
                busy = true;
                if wc.wr_id == LATE_WR {
                    self.late_status = Some(wc.status);
                }
                if wc.status.is_ok() && alive {
                    self.on_wc(ci, wc);
                }
            }
        }
        busy
    }

    fn on_wc(&mut self, ci: usize, wc: &Wc) {
        match wc.opcode {
            WcOpcode::Recv if wc.wr_id == 1 => {
                // INFO_REQ: answer with one descriptor covering all chunks.
                self.stats.info += 1;
                let li = self.conns[ci].listener;
                if self.fault_due(li, BringUpStep::InfoReq) {
                    self.break_path(li);
                    return;
                }
                let mr = self.chunks.as_ref().unwrap();
                let desc = SgDesc {
                    addr: mr.addr(),
                    key: mr.rkey(),
                    len: u32::from(self.qd) * self.chunk,
                };
                let mut b = [0u8; 24];
                let n = InfoRsp::encode([desc], &mut b).unwrap();
                let ib = self.info_buf.as_ref().unwrap();
                ib.write(0, &b[..n]);
                let sge = [ib.sge(0, n)];
                let c = &mut self.conns[ci];
                c.con
                    .post_send(&[SendWr {
                        wr_id: 0,
                        op: SendOp::Send,
                        sges: &sge,
                        signaled: true,
                    }])
                    .unwrap();
                let _ = c.info.take();
            }
            WcOpcode::RecvRdmaWithImm => {
                let _ = self.conns[ci].con.post_recv(&[RecvWr {
                    wr_id: 0,
                    sge: None,
                }]);
                match Imm::decode(wc.imm.unwrap_or(0)) {
                    Ok(Imm::HbMsg) if !self.mute_hb => {
                        self.stats.hb_acks += 1;
                        let _ = self.conns[ci].con.post_imm_empty(0, HB_ACK_IMM);
                    }
                    Ok(Imm::IoReq { payload }) => self.serve(ci, payload),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn serve(&mut self, ci: usize, payload: u32) {
        let req = self.layout().decode_io_req(payload).expect("valid IO_REQ");
        let mr = self.chunks.as_ref().unwrap();
        let base = usize::from(req.buf_id) * self.chunk as usize;
        let mut chunk = vec![0u8; self.chunk as usize];
        mr.read_at(base, &mut chunk);
        let cr = ChunkReq::decode_in_chunk(&chunk, req.offset).expect("valid chunk request");
        let mut off = [0u8; 8];
        off.copy_from_slice(&chunk[cr.usr_range()][..8]);
        let disk_off = u64::from_le_bytes(off) as usize;
        let len = cr.data_len() as usize;
        let mut w_inv = false;
        let mut chain: Vec<SendWr<'_>> = Vec::new();
        let sge;
        match cr.op {
            ChunkOp::Write => {
                self.stats.writes += 1;
                self.disk[disk_off..disk_off + len].copy_from_slice(&chunk[..len]);
            }
            ChunkOp::Read { desc, need_inval } => {
                self.stats.reads += 1;
                self.stats.reads_need_inval += u64::from(need_inval);
                mr.write_at(base, &self.disk[disk_off..disk_off + len]);
                if let Some(d) = desc {
                    if std::mem::take(&mut self.late_write) {
                        self.late = Some((ci, d.addr, d.key, d.len));
                    }
                    sge = [mr.sge(base, d.len as usize)];
                    chain.push(SendWr {
                        wr_id: 0,
                        op: SendOp::RdmaWrite {
                            remote_addr: d.addr,
                            rkey: d.key,
                        },
                        sges: &sge,
                        signaled: false,
                    });
                    if need_inval && !self.no_inv {
                        w_inv = true;
                        chain.push(SendWr {
                            wr_id: 0,
                            op: SendOp::SendWithInv { rkey: d.key },
                            sges: &[],
                            signaled: false,
                        });
                    }
                }
            }
        }
        let evil = self.evil.take();
        if evil == Some(Evil::WInvOnWrite) && !cr.is_read() {
            w_inv = true;
        }
        let mut imm = IoRsp::new(u32::from(req.buf_id), 0, w_inv)
            .unwrap()
            .to_imm();
        if evil == Some(Evil::UnknownImm) {
            imm = 0x5000_0000 | u32::from(req.buf_id);
        }
        let rkey_buf_id = if evil == Some(Evil::RkeyBufIdMismatch) {
            (req.buf_id + 1) % self.qd
        } else {
            req.buf_id
        };
        let rk;
        if self.new_rkey {
            let pool = self.rkey_bufs.as_ref().unwrap();
            pool.write(
                usize::from(req.buf_id),
                &RkeyRsp {
                    buf_id: rkey_buf_id,
                    rkey: mr.rkey(),
                }
                .to_bytes(),
            );
            rk = [pool.sge(usize::from(req.buf_id), 8)];
            chain.push(SendWr {
                wr_id: 0,
                op: SendOp::SendWithImm { imm },
                sges: &rk,
                signaled: false,
            });
        } else {
            chain.push(SendWr::imm_only(0, imm));
        }
        if evil == Some(Evil::Duplicate) {
            let last = *chain.last().unwrap();
            chain.push(last);
        }
        if evil == Some(Evil::BadMsgId) {
            let bad = IoRsp::new(u32::from(self.qd) + 5, 0, false)
                .unwrap()
                .to_imm();
            chain.insert(
                0,
                SendWr {
                    wr_id: 0,
                    op: SendOp::RdmaWriteWithImm {
                        remote_addr: 0,
                        rkey: 0,
                        imm: bad,
                    },
                    sges: &[],
                    signaled: false,
                },
            );
        }
        let c = &mut self.conns[ci];
        if let Err(e) = c.con.post_send(&chain) {
            panic!("fake server: response post failed on cid {}: {e}", c.cid);
        }
    }
}
