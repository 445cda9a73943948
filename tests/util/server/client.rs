//! A minimal RTRS client for the server tests: one path, written on `proto` and the
//! fabric directly, stepping the server's simulation while it waits.

use rtrs_spdk::fabric::ConnectOptions;
use std::collections::VecDeque;

use rtrs_spdk::common::{random_uuid, IuPool, Uuid};
use rtrs_spdk::fabric::{
    inc_rkey, Access, CmEvent, Conn, FastMr, KeyScope, MemBuf, Mr, QpCaps, RecvWr, SendOp, SendWr,
    Wc, WcOpcode, WcStatus,
};
use rtrs_spdk::proto::{
    ConnAccept, ConnReq, ConnRsp, Imm, ImmLayout, InfoReq, InfoRsp, RdmaRead, RdmaWrite, RkeyRsp,
    SgDesc, HB_ACK_IMM,
};

use super::Driver;

const WR_INFO: u64 = 1 << 40;
const WR_EMPTY: u64 = 2 << 40;

/// The path's identity in conn_req.
#[derive(Debug, Clone, Copy)]
pub struct Ids {
    pub paths_uuid: Uuid,
    pub sess_uuid: Uuid,
    pub recon_cnt: u16,
}

impl Ids {
    pub fn random() -> Ids {
        Ids {
            paths_uuid: random_uuid(),
            sess_uuid: random_uuid(),
            recon_cnt: 1,
        }
    }
}

/// What the client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Rsp {
        cid: u16,
        buf_id: u16,
        errno: i32,
        w_inv: bool,
    },
    Inv {
        cid: u16,
        rkey: u32,
    },
    HbMsg,
    HbAck,
    Down {
        cid: u16,
    },
    Error {
        cid: u16,
        status: WcStatus,
    },
}

/// The 272 INFO_REQ bytes for `name`.
pub fn info_req(name: &str) -> [u8; InfoReq::LEN] {
    let mut b = [0u8; InfoReq::LEN];
    InfoReq::new(name).encode(&mut b).expect("info_req");
    b
}

/// Connects one raw connection with `req` as private data; the accepted connection
/// or the reject errno.
pub fn raw_connect(h: &mut dyn Driver, req: &[u8]) -> Result<(Box<dyn Conn>, ConnAccept), i32> {
    let addr = h.addr();
    raw_connect_to(h, addr, req)
}

/// [`raw_connect`] to a given server address.
pub fn raw_connect_to(
    h: &mut dyn Driver,
    addr: std::net::SocketAddr,
    req: &[u8],
) -> Result<(Box<dyn Conn>, ConnAccept), i32> {
    raw_connect_from(h, None, addr, req)
}

/// [`raw_connect_to`] from source address `src`.
pub fn raw_connect_from(
    h: &mut dyn Driver,
    src: Option<std::net::SocketAddr>,
    addr: std::net::SocketAddr,
    req: &[u8],
) -> Result<(Box<dyn Conn>, ConnAccept), i32> {
    let caps = QpCaps {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        max_send_sge: 2,
    };
    let mut c = h
        .client_fabric()
        .connect(addr, &ConnectOptions::new(caps, req).from(src))
        .expect("connect");
    for _ in 0..h.max_steps() {
        h.step();
        match c.poll_cm() {
            Some(CmEvent::Established { private_data }) => {
                let acc = ConnRsp::decode_accept(private_data.as_bytes(), 64).expect("conn_rsp");
                return Ok((c, acc));
            }
            Some(CmEvent::Rejected { private_data }) => {
                return Err(ConnRsp::reject_errno(private_data.as_bytes()))
            }
            Some(ev) => panic!("connect: {ev:?}"),
            None => {}
        }
    }
    panic!("connect: no answer");
}

pub struct TestPath {
    pub cons: Vec<Box<dyn Conn>>,
    pub acc: ConnAccept,
    pub layout: ImmLayout,
    pub rbuf: Vec<(u64, u32)>,
    /// Per buf id, chunk-sized: what the client writes to the server.
    pub stage: Mr,
    /// Per buf id, chunk-sized: where READ replies land.
    pub reply: Mr,
    pub fast: Vec<FastMr>,
    /// Per cid: RKEY_RSP receive buffers (NEW_RKEY_F).
    pub rkey_bufs: Vec<Option<IuPool>>,
    pub ids: Ids,
    pub down: bool,
    pub events: VecDeque<Event>,
}

impl TestPath {
    /// Full handshake: every cid, then INFO_REQ `name`. Err: reject errno, or -1 if the
    /// server closed the path during INFO.
    pub fn connect(
        h: &mut dyn Driver,
        name: &str,
        cid_num: u16,
        ids: Ids,
        first_conn: bool,
    ) -> Result<TestPath, i32> {
        let addr = h.addr();
        TestPath::connect_info(h, addr, &info_req(name), cid_num, ids, first_conn)
    }

    /// [`TestPath::connect`] to a given server address.
    pub fn connect_to(
        h: &mut dyn Driver,
        addr: std::net::SocketAddr,
        name: &str,
        cid_num: u16,
        ids: Ids,
        first_conn: bool,
    ) -> Result<TestPath, i32> {
        TestPath::connect_info(h, addr, &info_req(name), cid_num, ids, first_conn)
    }

    pub fn connect_info(
        h: &mut dyn Driver,
        addr: std::net::SocketAddr,
        info: &[u8; InfoReq::LEN],
        cid_num: u16,
        ids: Ids,
        first_conn: bool,
    ) -> Result<TestPath, i32> {
        TestPath::connect_info_from(h, None, addr, info, cid_num, ids, first_conn)
    }

    /// [`TestPath::connect_info`] with every connection bound to source `src`.
    pub fn connect_info_from(
        h: &mut dyn Driver,
        src: Option<std::net::SocketAddr>,
        addr: std::net::SocketAddr,
        info: &[u8; InfoReq::LEN],
        cid_num: u16,
        ids: Ids,
        first_conn: bool,
    ) -> Result<TestPath, i32> {
        let mut cons = Vec::new();
        let mut acc = None;
        for cid in 0..cid_num {
            let req = ConnReq::new(
                cid,
                cid_num,
                ids.recon_cnt,
                ids.sess_uuid,
                ids.paths_uuid,
                first_conn,
            )
            .to_bytes()
            .unwrap();
            let (c, a) = raw_connect_from(h, src, addr, &req)?;
            cons.push(c);
            acc.get_or_insert(a);
        }
        let acc = acc.expect("cid_num >= 1");
        let qd = acc.queue_depth;
        let cs = acc.chunk_size() as u32;
        let f = h.client_fabric();
        let pool = IuPool::new(
            &*f,
            2,
            InfoRsp::wire_len(qd).max(InfoReq::LEN),
            Access::LOCAL_WRITE,
        )
        .unwrap();
        cons[0].post_recv(&[pool.recv_wr(0, WR_INFO)]).unwrap();
        pool.write(1, info);
        let sge = [pool.sge(1, InfoReq::LEN)];
        cons[0]
            .post_send(&[SendWr {
                wr_id: 0,
                op: SendOp::Send,
                sges: &sge,
                signaled: true,
            }])
            .unwrap();
        let mut wcs = [Wc::default(); 16];
        let mut got = None;
        'wait: for _ in 0..h.max_steps() {
            h.step();
            while let Some(ev) = cons[0].poll_cm() {
                if ev == CmEvent::Disconnected {
                    return Err(-1);
                }
            }
            let n = cons[0].poll_cq(&mut wcs);
            for wc in &wcs[..n] {
                if wc.wr_id == WR_INFO {
                    if wc.status != WcStatus::Success {
                        return Err(-1);
                    }
                    got = Some(wc.byte_len);
                    break 'wait;
                }
            }
        }
        let len = got.expect("INFO_RSP never came") as usize;
        let mut b = vec![0u8; len];
        pool.read(0, &mut b);
        let info = InfoRsp::decode(&b, qd, cs).expect("INFO_RSP");
        let rbuf: Vec<(u64, u32)> = info.chunks().collect();
        assert_eq!(rbuf.len(), usize::from(qd));
        let layout = acc.imm_layout().unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let size = usize::from(qd) * cs as usize;
        let stage = f
            .register(MemBuf::zeroed(size), Access::LOCAL_WRITE)
            .unwrap();
        let reply = f.register(MemBuf::zeroed(size), all).unwrap();
        let fast = (0..qd)
            .map(|_| f.alloc_fast_mr(KeyScope::Connection).unwrap())
            .collect();
        let mut rkey_bufs = Vec::new();
        for (cid, c) in cons.iter_mut().enumerate() {
            let depth = if cid == 0 { 1024 } else { 2 * usize::from(qd) };
            if acc.new_rkey {
                let p = IuPool::new(&*f, depth, RkeyRsp::LEN, Access::LOCAL_WRITE).unwrap();
                let wrs: Vec<RecvWr> = (0..depth).map(|i| p.recv_wr(i, i as u64)).collect();
                c.post_recv(&wrs).unwrap();
                rkey_bufs.push(Some(p));
            } else {
                let wrs = vec![
                    RecvWr {
                        wr_id: WR_EMPTY,
                        sge: None
                    };
                    depth
                ];
                c.post_recv(&wrs).unwrap();
                rkey_bufs.push(None);
            }
        }
        Ok(TestPath {
            cons,
            acc,
            layout,
            rbuf,
            stage,
            reply,
            fast,
            rkey_bufs,
            ids,
            down: false,
            events: VecDeque::new(),
        })
    }

    pub fn cs(&self) -> usize {
        self.acc.chunk_size() as usize
    }

    /// Writes `bytes` at `remote_off` of chunk `buf_id` with `imm` (anything goes).
    pub fn post_raw(&mut self, cid: u16, buf_id: u16, remote_off: u32, bytes: &[u8], imm: u32) {
        let base = usize::from(buf_id) * self.cs();
        let (addr, rkey) = self.rbuf[usize::from(buf_id)];
        let sges;
        let sg: &[rtrs_spdk::fabric::Sge] = if bytes.is_empty() {
            &[]
        } else {
            self.stage.write_at(base, bytes);
            sges = [self.stage.sge(base, bytes.len())];
            &sges
        };
        let posted = self.cons[usize::from(cid)].post_send(&[SendWr {
            wr_id: 9,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: addr + u64::from(remote_off),
                rkey,
                imm,
            },
            sges: sg,
            signaled: false,
        }]);
        self.refused_post(cid, posted);
    }

    /// A post the connection refused: only because the server closed it (the path is
    /// down then, which every wait reports).
    fn refused_post(&mut self, cid: u16, posted: Result<(), rtrs_spdk::fabric::PostError>) {
        if let Err(e) = posted {
            assert_ne!(
                self.cons[usize::from(cid)].state(),
                rtrs_spdk::fabric::ConnState::Connected,
                "post refused on a connected path: {e:?}"
            );
            self.down = true;
            self.events.push_back(Event::Down { cid });
        }
    }

    /// A WRITE request with `usr` and `data`.
    pub fn post_write(&mut self, cid: u16, buf_id: u16, usr: &[u8], data: &[u8]) {
        let mut b = data.to_vec();
        b.extend_from_slice(usr);
        b.extend_from_slice(
            &RdmaWrite {
                usr_len: usr.len() as u16,
            }
            .to_bytes(),
        );
        let imm = self
            .layout
            .io_req(buf_id, (data.len() + usr.len()) as u32)
            .unwrap();
        self.post_raw(cid, buf_id, 0, &b, imm);
    }

    /// A READ request of `len` bytes with `usr`; the reply lands in `reply` at the
    /// chunk's slot, under a fast-registered key with `need_inval`.
    pub fn post_read(&mut self, cid: u16, buf_id: u16, usr: &[u8], len: u32, need_inval: bool) {
        let base = usize::from(buf_id) * self.cs();
        let addr = self.reply.addr() + base as u64;
        let key = if need_inval {
            let slot = &self.fast[usize::from(buf_id)];
            let rkey = inc_rkey(slot.rkey());
            let posted = self.cons[usize::from(cid)].post_send(&[SendWr {
                wr_id: 8,
                op: SendOp::RegMr {
                    slot,
                    region: &self.reply,
                    addr,
                    len,
                    access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    rkey,
                },
                sges: &[],
                signaled: false,
            }]);
            self.refused_post(cid, posted);
            rkey
        } else {
            self.reply.rkey()
        };
        let trailer = RdmaRead {
            usr_len: usr.len() as u16,
            desc: (len > 0).then_some(SgDesc { addr, key, len }),
            need_inval: need_inval && len > 0,
        };
        let mut b = usr.to_vec();
        let mut t = [0u8; 24];
        let n = trailer.encode(&mut t).unwrap();
        b.extend_from_slice(&t[..n]);
        let imm = self.layout.io_req(buf_id, len + usr.len() as u32).unwrap();
        self.post_raw(cid, buf_id, len, &b, imm);
    }

    /// Takes every completion and CM event, reposting receives.
    pub fn poll(&mut self) {
        let mut wcs = [Wc::default(); 32];
        let qd = self.acc.queue_depth;
        for cid in 0..self.cons.len() {
            while let Some(ev) = self.cons[cid].poll_cm() {
                if ev == CmEvent::Disconnected {
                    self.down = true;
                    self.events.push_back(Event::Down { cid: cid as u16 });
                }
            }
            loop {
                let n = self.cons[cid].poll_cq(&mut wcs);
                if n == 0 {
                    break;
                }
                for wc in &wcs[..n] {
                    self.on_wc(cid, qd, wc);
                }
            }
        }
    }

    fn on_wc(&mut self, cid: usize, qd: u16, wc: &Wc) {
        let c16 = cid as u16;
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlush {
                self.events.push_back(Event::Error {
                    cid: c16,
                    status: wc.status,
                });
            }
            self.down = true;
            return;
        }
        if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            return;
        }
        let mut rkey_rsp = None;
        let repost = match &self.rkey_bufs[cid] {
            Some(p) => {
                let mut b = [0u8; 8];
                p.read(wc.wr_id as usize, &mut b);
                rkey_rsp = Some(b);
                p.recv_wr(wc.wr_id as usize, wc.wr_id)
            }
            None => RecvWr {
                wr_id: WR_EMPTY,
                sge: None,
            },
        };
        let _ = self.cons[cid].post_recv(&[repost]);
        if let Some(rkey) = wc.invalidated_rkey {
            self.events.push_back(Event::Inv { cid: c16, rkey });
            return;
        }
        let Some(imm) = wc.imm else {
            return;
        };
        match Imm::decode(imm).expect("imm from the server") {
            Imm::IoRsp(r) => {
                let r = r.check_msg_id(qd).expect("msg_id");
                if wc.opcode == WcOpcode::Recv {
                    let b = rkey_rsp.expect("SEND_WITH_IMM without NEW_RKEY");
                    let k = RkeyRsp::decode(&b, qd, r.msg_id()).expect("rkey_rsp");
                    self.rbuf[usize::from(k.buf_id)].1 = k.rkey;
                }
                self.events.push_back(Event::Rsp {
                    cid: c16,
                    buf_id: r.msg_id() as u16,
                    errno: r.errno(),
                    w_inv: r.w_inv(),
                });
            }
            Imm::HbMsg => {
                self.events.push_back(Event::HbMsg);
                let _ = self.cons[cid].post_send(&[SendWr {
                    wr_id: 7,
                    op: SendOp::RdmaWriteWithImm {
                        remote_addr: 0,
                        rkey: 0,
                        imm: HB_ACK_IMM,
                    },
                    sges: &[],
                    signaled: false,
                }]);
            }
            Imm::HbAck => self.events.push_back(Event::HbAck),
            Imm::IoReq { .. } => panic!("server sent an IO_REQ imm"),
        }
    }

    /// Steps until the response for `buf_id` arrives.
    pub fn wait_rsp(&mut self, h: &mut dyn Driver, buf_id: u16) -> Event {
        for _ in 0..h.max_steps() {
            h.step();
            self.poll();
            if let Some(i) = self
                .events
                .iter()
                .position(|e| matches!(e, Event::Rsp { buf_id: b, .. } if *b == buf_id))
            {
                return self.events.remove(i).unwrap();
            }
            assert!(
                !self.down,
                "path went down waiting for buf {buf_id}: {:?}",
                self.events
            );
        }
        panic!("no response for buf {buf_id}: {:?}", self.events);
    }

    /// WRITE `data` at RAM offset `off` through chunk `buf_id`; the errno.
    pub fn write(
        &mut self,
        h: &mut dyn Driver,
        cid: u16,
        buf_id: u16,
        off: u64,
        data: &[u8],
    ) -> i32 {
        self.post_write(cid, buf_id, &off.to_le_bytes(), data);
        match self.wait_rsp(h, buf_id) {
            Event::Rsp { errno, w_inv, .. } => {
                assert!(!w_inv, "W_INV for a WRITE");
                errno
            }
            e => panic!("{e:?}"),
        }
    }

    /// READ `len` bytes at RAM offset `off` through chunk `buf_id`; errno and data.
    pub fn read(
        &mut self,
        h: &mut dyn Driver,
        cid: u16,
        buf_id: u16,
        off: u64,
        len: u32,
        need_inval: bool,
    ) -> (i32, Vec<u8>) {
        self.post_read(cid, buf_id, &off.to_le_bytes(), len, need_inval);
        let errno = match self.wait_rsp(h, buf_id) {
            Event::Rsp { errno, w_inv, .. } => {
                assert_eq!(
                    w_inv,
                    need_inval && len > 0,
                    "W_INV iff the READ asked for invalidation"
                );
                errno
            }
            e => panic!("{e:?}"),
        };
        let mut out = vec![0u8; len as usize];
        let base = usize::from(buf_id) * self.cs();
        self.reply.read_at(base, &mut out);
        (errno, out)
    }

    /// Steps until the server closes this path; false if it never does.
    pub fn wait_down(&mut self, h: &mut dyn Driver) -> bool {
        for _ in 0..h.max_steps() {
            h.step();
            self.poll();
            if self.down {
                return true;
            }
        }
        false
    }
}
