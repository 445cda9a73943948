//! No writable window under always_invalidate: the RTRS server sends a READ's data from
//! a chunk with an RDMA WRITE and rebinds the chunk's key right behind it. With the
//! victim's socket held back (its client reads nothing), the WRITE's bytes stay in the
//! chunk; a write through the new key from another connection of the same protection
//! domain must then change nothing of what the victim receives.

use super::*;
use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};

/// A connection to `l` from `cf`: (client end, server end), established.
fn connect(
    l: &mut Box<dyn Listener>,
    cf: &TcpFabric,
    caps: QpCaps,
) -> (Box<dyn Conn>, Box<dyn Conn>) {
    let mut c = cf
        .connect(l.local_addr(), &ConnectOptions::new(caps, b""))
        .unwrap();
    let req = until("the connect request", || {
        c.poll_cm();
        l.poll()
    });
    let mut s = req.accept(caps, b"").unwrap();
    until("the server end established", || s.poll_cm());
    until("the client end established", || c.poll_cm());
    (c, s)
}

/// The server's chain: an RDMA WRITE of `len` bytes of `chunk` into the victim's
/// `reply` (a region of the victim's fabric, under `reply_key`), then the chunk's slot
/// rebound under `key`.
fn post_response(
    s: &mut Box<dyn Conn>,
    chunk: &Mr,
    slot: &rtrs_spdk::fabric::FastMr,
    key: u32,
    reply: (u64, u32),
    len: usize,
) {
    let src = [chunk.sge(0, len)];
    s.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: reply.0,
                rkey: reply.1,
            },
            &src,
            true,
        ),
        wr(
            2,
            SendOp::RegMr {
                slot,
                region: chunk,
                addr: chunk.addr(),
                len: len as u32,
                access: RW,
                rkey: key,
            },
            &[],
            false,
        ),
    ])
    .unwrap();
}

/// Another connection of the domain (from `af`; `peer` is its server end, polled so
/// that it executes the write) writes `fill` into the chunk through `key`; its
/// completion status.
fn write_through(
    a: &mut Box<dyn Conn>,
    peer: &mut Box<dyn Conn>,
    af: &TcpFabric,
    chunk: &Mr,
    key: u32,
    fill: u8,
) -> WcStatus {
    let src = reg(af, 4096, Access::NONE);
    src.write_at(0, &[fill; 4096]);
    let sges = [src.sge(0, 4096)];
    a.post_send(&[wr(
        9,
        SendOp::RdmaWrite {
            remote_addr: chunk.addr(),
            rkey: key,
        },
        &sges,
        true,
    )])
    .unwrap();
    let mut wcs = [Wc::default(); 4];
    until("the write's completion", || {
        peer.poll_cq(&mut wcs[..0]);
        let n = a.poll_cq(&mut wcs);
        wcs[..n].iter().find(|w| w.wr_id == 9).map(|w| w.status)
    })
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
    }
}

/// Polls `s` (the server end) `n` times: it writes what its socket takes.
fn push(s: &mut Box<dyn Conn>, n: usize) {
    let mut wcs = [Wc::default(); 8];
    for _ in 0..n {
        s.poll_cq(&mut wcs);
    }
}

/// Polls the victim until its reply holds `len` bytes that are not zero at the end.
fn drain(v: &mut Box<dyn Conn>, s: &mut Box<dyn Conn>, reply: &Mr, len: usize) {
    let mut wcs = [Wc::default(); 8];
    until("the victim's reply", || {
        v.poll_cq(&mut wcs);
        s.poll_cq(&mut wcs);
        let mut last = [0u8; 1];
        reply.read_at(len - 1, &mut last);
        (last[0] != 0).then_some(())
    });
}

/// The scene of both attacks: a victim and an attacker connected to one server fabric
/// (one protection domain), and the server's response of `len` bytes of `chunk` (filled
/// with pattern `seed`) to the victim posted, the chunk's key rebound to `key` behind it.
struct Scene {
    v: Box<dyn Conn>,
    vs: Box<dyn Conn>,
    a: Box<dyn Conn>,
    as_: Box<dyn Conn>,
    af: TcpFabric,
    reply: Mr,
    chunk: Mr,
    key: u32,
    /// The chunk's slot (the key dies with it), the fabrics and the listener.
    _keep: (
        rtrs_spdk::fabric::FastMr,
        TcpFabric,
        TcpFabric,
        Box<dyn Listener>,
    ),
}

impl Scene {
    fn respond(len: usize, seed: u8) -> Scene {
        let (sf, vf, af) = (TcpFabric::new(), TcpFabric::new(), TcpFabric::new());
        let mut l = sf.listen(localhost(), &ListenOptions::default()).unwrap();
        let (v, mut vs) = connect(&mut l, &vf, caps());
        let (a, as_) = connect(&mut l, &af, caps());
        let reply = reg(&vf, len, RW);
        let chunk = reg(&sf, len, RW);
        chunk.write_at(0, &pattern(len, seed));
        let slot = sf.alloc_fast_mr(KeyScope::Domain).unwrap();
        let key = rtrs_spdk::fabric::next_rkey(slot.rkey());
        post_response(
            &mut vs,
            &chunk,
            &slot,
            key,
            (reply.addr(), reply.rkey()),
            len,
        );
        Scene {
            v,
            vs,
            a,
            as_,
            af,
            reply,
            chunk,
            key,
            _keep: (slot, sf, vf, l),
        }
    }

    /// The attacker's write of 0xEE bytes into the chunk through the new key.
    fn attack(&mut self) -> WcStatus {
        write_through(
            &mut self.a,
            &mut self.as_,
            &self.af,
            &self.chunk,
            self.key,
            0xEE,
        )
    }

    /// What the victim received, once all of it has.
    fn received(&mut self, len: usize) -> Vec<u8> {
        drain(&mut self.v, &mut self.vs, &self.reply, len);
        let mut got = vec![0u8; len];
        self.reply.read_at(0, &mut got);
        got
    }
}

/// A large READ response: the key waits for the bytes. Until they have left the chunk,
/// a write through the new key is refused.
#[test]
fn a_key_rebound_behind_unsent_bytes_is_refused_until_they_left() {
    const LEN: usize = 32 << 20;
    let mut t = Scene::respond(LEN, 3);
    push(&mut t.vs, 200);
    assert_eq!(
        t.attack(),
        WcStatus::RemoteAccess,
        "the new key reached the chunk while its bytes were still to send"
    );
    assert!(
        t.received(LEN) == pattern(LEN, 3),
        "the victim got other bytes than the chunk's"
    );
}

/// A small READ response: the key waits for its bytes too, and goes live once the
/// server's end has written them into its socket (the victim still reading nothing);
/// what the victim receives is the chunk's bytes either way.
#[test]
fn a_key_rebound_behind_a_small_response_goes_live_once_its_bytes_are_written() {
    const LEN: usize = 4096;
    let mut early = Scene::respond(LEN, 5);
    assert_eq!(
        early.attack(),
        WcStatus::RemoteAccess,
        "the new key reached the chunk before its bytes were written"
    );
    assert_eq!(early.received(LEN), pattern(LEN, 5));
    let mut t = Scene::respond(LEN, 6);
    push(&mut t.vs, 1);
    assert_eq!(
        t.attack(),
        WcStatus::Success,
        "the key is live once the bytes are in the socket"
    );
    assert_eq!(
        t.received(LEN),
        pattern(LEN, 6),
        "the write through the new key reached the victim"
    );
}
