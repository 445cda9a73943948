//! Unit tests of the queue pair with the simplest transport: both endpoints in one test,
//! operations moved by hand.

use super::*;
use crate::fabric::soft::Leases;
use crate::fabric::{inc_rkey, FastMr, KeyScope, MemBuf, Mr, Sge};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

struct Pair {
    table: Arc<MrTable>,
    a: SoftQp,
    b: SoftQp,
}

fn pair(caps: QpCaps) -> Pair {
    let table = MrTable::new();
    let mut a = SoftQp::new(table.clone(), caps);
    let mut b = SoftQp::new(table.clone(), caps);
    a.set_connected();
    b.set_connected();
    Pair { table, a, b }
}

/// Moves everything `from` has to send into `to`, as a transport would; returns the
/// number of operations moved and the refusal, if any.
fn pump(from: &mut SoftQp, to: &mut SoftQp) -> (usize, Option<(u64, WcStatus)>) {
    pump_with(from, to, Exec::Inbound)
}

/// How a transport executes an operation that arrived.
#[derive(Clone, Copy, Debug)]
enum Exec {
    /// [`SoftQp::inbound`], the payload placed, [`SoftQp::inbound_done`].
    Inbound,
    /// [`SoftQp::execute`], the payload copied from the sender's memory.
    OneStep,
    /// [`SoftQp::execute_staged`], the payload first copied into a buffer of ours.
    Staged,
}

/// [`pump`], executing each operation as `how` says.
fn pump_with(from: &mut SoftQp, to: &mut SoftQp, how: Exec) -> (usize, Option<(u64, WcStatus)>) {
    let ops: Vec<(WireOp, Vec<MemRef>)> = from.outbound().map(|(w, s)| (w, s.to_vec())).collect();
    let mut moved = 0;
    let mut nak = None;
    for (op, srcs) in &ops {
        let result = match how {
            Exec::OneStep => to.execute(op, srcs),
            Exec::Staged => {
                let mut payload = Vec::new();
                for s in srcs {
                    let mut piece = vec![0u8; s.len()];
                    s.read_into(&mut piece);
                    payload.extend(piece);
                }
                to.execute_staged(op, &payload)
            }
            Exec::Inbound => to.inbound(op).map(|place| {
                if let Some(p) = place {
                    p.gather_prefix(p.len(), srcs);
                    to.recycle(p);
                }
                to.inbound_done(op);
            }),
        };
        match result {
            Ok(()) => {
                moved += 1;
            }
            Err(InboundError::NotReady) => break,
            Err(InboundError::Refuse(s)) => {
                moved += 1;
                nak = Some((op.seq, s));
                break;
            }
        }
    }
    from.mark_transmitted(moved);
    if let Some(seq) = to.take_ack() {
        from.on_ack(seq).expect("an ack for what was handed over");
    }
    if let Some((seq, s)) = nak {
        from.on_nak(seq, s);
    }
    (moved, nak)
}

fn drain(qp: &mut SoftQp) -> Vec<Wc> {
    let mut wcs = [Wc::default(); 64];
    let n = qp.poll(&mut wcs);
    wcs[..n].to_vec()
}

fn buf(p: &Pair, len: usize, access: Access) -> Mr {
    p.table.register_buf(MemBuf::zeroed(len), access).unwrap()
}

/// A REG_MR binding `slot` to the first 4 KiB of `region`, read-write, under `rkey`.
fn bind_4k<'a>(slot: &'a FastMr, region: &'a Mr, rkey: u32) -> SendOp<'a> {
    SendOp::RegMr {
        slot,
        region,
        addr: region.addr(),
        len: 4096,
        access: RW,
        rkey,
    }
}

/// Whether a peer could write the first 64 bytes of `region` through `key` now.
/// `n` domain-scope fast-registration slots and the next key of each.
fn slots_with_next_keys(p: &Pair, n: usize) -> (Vec<FastMr>, Vec<u32>) {
    let slots: Vec<FastMr> = (0..n)
        .map(|_| p.table.alloc_fast_mr(KeyScope::Domain).unwrap())
        .collect();
    let keys = slots
        .iter()
        .map(|s| crate::fabric::next_rkey(s.rkey()))
        .collect();
    (slots, keys)
}

fn writable(table: &MrTable, key: u32, region: &Mr) -> bool {
    table
        .remote(
            &mut Leases::default(),
            0,
            key,
            region.addr(),
            64,
            Access::REMOTE_WRITE,
        )
        .is_ok()
}

fn wr<'a>(
    wr_id: u64,
    op: SendOp<'a>,
    sges: &'a [crate::fabric::Sge],
    signaled: bool,
) -> SendWr<'a> {
    SendWr {
        wr_id,
        op,
        sges,
        signaled,
    }
}

#[test]
fn send_lands_in_the_posted_receive() {
    let mut p = pair(QpCaps::default());
    let src = buf(&p, 64, Access::NONE);
    let dst = buf(&p, 64, RW);
    src.write_at(0, b"ping");
    p.b.post_recv(&[RecvWr {
        wr_id: 7,
        sge: Some(dst.sge(0, 64)),
    }])
    .unwrap();
    p.a.post_send(&[wr(
        1,
        SendOp::SendWithImm { imm: 0xabcd },
        &[src.sge(0, 4)],
        true,
    )])
    .unwrap();
    assert_eq!(pump(&mut p.a, &mut p.b), (1, None));
    let wcs = drain(&mut p.b);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].byte_len, wcs[0].imm),
        (7, 4, Some(0xabcd))
    );
    assert_eq!(wcs[0].opcode, WcOpcode::Recv);
    let mut out = [0u8; 4];
    dst.read_at(0, &mut out);
    assert_eq!(&out, b"ping");
    let sent = drain(&mut p.a);
    assert_eq!(
        (sent[0].wr_id, sent[0].status, sent[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
}

#[test]
fn write_data_is_in_place_before_the_imm() {
    let mut p = pair(QpCaps::default());
    let src = buf(&p, 4096, Access::NONE);
    let dst = buf(&p, 4096, RW);
    src.write_at(0, &[0x5a; 4096]);
    p.b.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }])
    .unwrap();
    let chain = [
        wr(
            10,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &[],
            false,
        ),
        wr(
            11,
            SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
                imm: 9,
            },
            &[],
            true,
        ),
    ];
    let sges = [src.sge(0, 4096)];
    let chain = [
        SendWr {
            sges: &sges,
            ..chain[0]
        },
        chain[1],
    ];
    p.a.post_send(&chain).unwrap();
    pump(&mut p.a, &mut p.b);
    let wcs = drain(&mut p.b);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].opcode, wcs[0].imm, wcs[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(9), 0)
    );
    let mut out = vec![0u8; 4096];
    dst.read_at(0, &mut out);
    assert!(out.iter().all(|&x| x == 0x5a));
    // Only the signaled request completes.
    let sent = drain(&mut p.a);
    assert_eq!(sent.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![11]);
}

#[test]
fn receive_not_ready_stalls_then_delivers_in_order() {
    let mut p = pair(QpCaps::default());
    let src = buf(&p, 64, Access::NONE);
    let dst = buf(&p, 64, RW);
    p.a.post_send(&[
        wr(1, SendOp::Send, &[], false),
        wr(
            2,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 5,
            },
            &[],
            true,
        ),
    ])
    .unwrap();
    let _ = (&src, &dst);
    assert_eq!(pump(&mut p.a, &mut p.b), (0, None));
    assert!(drain(&mut p.b).is_empty());
    p.b.post_recv(&[RecvWr {
        wr_id: 100,
        sge: None,
    }])
    .unwrap();
    assert_eq!(
        pump(&mut p.a, &mut p.b),
        (1, None),
        "second op still waits for a receive"
    );
    p.b.post_recv(&[RecvWr {
        wr_id: 101,
        sge: None,
    }])
    .unwrap();
    assert_eq!(pump(&mut p.a, &mut p.b), (1, None));
    let got: Vec<_> = drain(&mut p.b).iter().map(|w| (w.wr_id, w.imm)).collect();
    assert_eq!(got, vec![(100, None), (101, Some(5))]);
    assert_eq!(drain(&mut p.a).len(), 1);
}

#[test]
fn bad_rkey_naks_the_sender_and_flushes_both_sides() {
    let mut p = pair(QpCaps::default());
    let src = buf(&p, 64, Access::NONE);
    let dst = buf(&p, 64, RW);
    p.b.post_recv(&[RecvWr {
        wr_id: 50,
        sge: None,
    }])
    .unwrap();
    let sges = [src.sge(0, 8)];
    p.a.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &sges,
            false,
        ),
        wr(
            2,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey() ^ 0x100,
            },
            &sges,
            false,
        ),
        wr(3, SendOp::Send, &[], false),
    ])
    .unwrap();
    let (_, nak) = pump(&mut p.a, &mut p.b);
    assert_eq!(nak, Some((2, WcStatus::RemoteAccess)));
    let sent: Vec<_> = drain(&mut p.a)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        sent,
        vec![(2, WcStatus::RemoteAccess), (3, WcStatus::WrFlush)]
    );
    assert_eq!(p.a.state(), ConnState::Disconnected);
    assert!(p.a.take_disconnect() && !p.a.take_disconnect());
    let recv: Vec<_> = drain(&mut p.b)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(recv, vec![(50, WcStatus::WrFlush)]);
    assert!(p.b.take_disconnect());
    let err =
        p.a.post_send(&[wr(4, SendOp::Send, &[], true)])
            .unwrap_err();
    assert_eq!(
        err,
        PostError {
            index: 0,
            kind: PostErrorKind::NotConnected
        }
    );
}

#[test]
fn send_queue_slots_are_held_until_acked() {
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 16,
        max_send_sge: 1,
    };
    let mut p = pair(caps);
    let ops: Vec<_> = (0..4).map(|i| wr(i, SendOp::Send, &[], i == 3)).collect();
    p.a.post_send(&ops).unwrap();
    let err =
        p.a.post_send(&[wr(9, SendOp::Send, &[], true)])
            .unwrap_err();
    assert_eq!(err.kind, PostErrorKind::QueueFull);
    p.b.post_recv(
        &(0..4)
            .map(|i| RecvWr {
                wr_id: i,
                sge: None,
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    pump(&mut p.a, &mut p.b);
    assert_eq!(
        drain(&mut p.a).len(),
        1,
        "one signaled completion frees four slots"
    );
    p.a.post_send(&ops).unwrap();
}

#[test]
fn an_ack_beyond_what_was_handed_over_is_not_believed() {
    let mut p = pair(QpCaps::default());
    let ops: Vec<_> = (0..3).map(|i| wr(i, SendOp::Send, &[], true)).collect();
    p.a.post_send(&ops).unwrap();
    // Posted, none handed to the transport: no ack can be true.
    assert_eq!(p.a.on_ack(1), Err(BadAck { acked: 1, sent: 0 }));
    p.a.mark_transmitted(2);
    assert_eq!(p.a.on_ack(3), Err(BadAck { acked: 3, sent: 2 }));
    assert!(
        drain(&mut p.a).is_empty(),
        "a refused ack completes nothing"
    );
    // What was handed over may be acked, again and again.
    assert_eq!(p.a.on_ack(2), Ok(()));
    assert_eq!(p.a.on_ack(1), Ok(()));
    let done: Vec<_> = drain(&mut p.a)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(done, [(0, WcStatus::Success), (1, WcStatus::Success)]);
}

#[test]
fn the_send_ring_grows_on_demand_and_keeps_its_order() {
    let caps = QpCaps {
        max_send_wr: 1000,
        max_recv_wr: 1024,
        max_send_sge: 1,
    };
    let mut p = pair(caps);
    assert_eq!(p.a.sq.len(), SQ_INITIAL, "a new queue pair holds few slots");
    p.b.post_recv(
        &(0..1000)
            .map(|i| RecvWr {
                wr_id: i,
                sge: None,
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    // Some in flight, the ring's head moved, then more than it holds: it doubles,
    // in order, up to the caps rounded up.
    let ops: Vec<_> = (0..40).map(|i| wr(i, SendOp::Send, &[], true)).collect();
    p.a.post_send(&ops).unwrap();
    pump(&mut p.a, &mut p.b);
    assert_eq!(drain(&mut p.a).len(), 40);
    let ops: Vec<_> = (40..1040).map(|i| wr(i, SendOp::Send, &[], true)).collect();
    p.a.post_send(&ops).unwrap();
    assert_eq!(p.a.sq.len(), 1024);
    assert_eq!(
        p.a.post_send(&[wr(9999, SendOp::Send, &[], true)])
            .unwrap_err()
            .kind,
        PostErrorKind::QueueFull
    );
    pump(&mut p.a, &mut p.b);
    let ids: Vec<u64> = drain_all(&mut p.a).iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        (40..1000).collect::<Vec<_>>(),
        "the receiver had 1000 receives"
    );
    let got: Vec<u64> = drain_all(&mut p.b).iter().map(|w| w.wr_id).collect();
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
}

fn drain_all(qp: &mut SoftQp) -> Vec<Wc> {
    let mut all = Vec::new();
    loop {
        let got = drain(qp);
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

#[test]
fn chain_errors_name_the_index() {
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
    };
    let mut p = pair(caps);
    let src = buf(&p, 64, Access::NONE);
    let two = [src.sge(0, 1), src.sge(1, 1)];
    let err =
        p.a.post_send(&[
            wr(1, SendOp::Send, &[], false),
            wr(2, SendOp::Send, &two, true),
        ])
        .unwrap_err();
    assert_eq!(
        err,
        PostError {
            index: 1,
            kind: PostErrorKind::TooManySge
        }
    );
    assert_eq!(
        p.a.outbound().count(),
        1,
        "the request before the bad one was accepted"
    );
}

#[test]
fn bad_lkey_completes_with_local_protection() {
    let mut p = pair(QpCaps::default());
    let src = buf(&p, 64, Access::NONE);
    let mut sge = src.sge(0, 64);
    sge.lkey ^= 0x100;
    p.a.post_send(&[wr(1, SendOp::Send, &[sge], false)])
        .unwrap();
    let wcs = drain(&mut p.a);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::LocalProtection)
    );
    assert_eq!(p.a.state(), ConnState::Disconnected);
}

#[test]
fn too_small_receive_is_a_local_length_error() {
    let mut p = pair(QpCaps::default());
    let src = buf(&p, 64, Access::NONE);
    let dst = buf(&p, 64, RW);
    p.b.post_recv(&[RecvWr {
        wr_id: 5,
        sge: Some(dst.sge(0, 8)),
    }])
    .unwrap();
    p.a.post_send(&[wr(1, SendOp::Send, &[src.sge(0, 9)], true)])
        .unwrap();
    let (_, nak) = pump(&mut p.a, &mut p.b);
    assert_eq!(nak, Some((1, WcStatus::RemoteInvalidRequest)));
    let wcs = drain(&mut p.b);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::LocalLength));
}

#[test]
fn fast_registration_and_remote_invalidation() {
    let mut p = pair(QpCaps::default());
    let region = buf(&p, 8192, RW);
    let slot = p.table.alloc_fast_mr(KeyScope::Connection).unwrap();
    let key = inc_rkey(slot.rkey());
    // B binds a window over its region (a REG_MR posted on its own send queue) ...
    p.b.post_send(&[wr(1, bind_4k(&slot, &region, key), &[], true)])
        .unwrap();
    assert_eq!(drain(&mut p.b)[0].opcode, WcOpcode::RegMr);
    // ... A writes through it, then invalidates it with a SEND_WITH_INV ...
    let src = buf(&p, 64, Access::NONE);
    src.write_at(0, b"abc");
    p.b.post_recv(&[RecvWr {
        wr_id: 2,
        sge: None,
    }])
    .unwrap();
    let sges = [src.sge(0, 3)];
    p.a.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: region.addr() + 10,
                rkey: key,
            },
            &sges,
            false,
        ),
        wr(2, SendOp::SendWithInv { rkey: key }, &[], true),
    ])
    .unwrap();
    assert_eq!(pump(&mut p.a, &mut p.b), (2, None));
    let wcs = drain(&mut p.b);
    assert_eq!((wcs[0].wr_id, wcs[0].invalidated_rkey), (2, Some(key)));
    let mut out = [0u8; 3];
    region.read_at(10, &mut out);
    assert_eq!(&out, b"abc");
    // ... after which the key is dead.
    p.a.post_send(&[wr(
        3,
        SendOp::RdmaWrite {
            remote_addr: region.addr(),
            rkey: key,
        },
        &sges,
        true,
    )])
    .unwrap();
    assert_eq!(
        pump(&mut p.a, &mut p.b).1,
        Some((3, WcStatus::RemoteAccess))
    );
}

#[test]
fn local_invalidate_of_an_unbound_slot_fails_and_breaks() {
    let mut p = pair(QpCaps::default());
    let slot = p.table.alloc_fast_mr(KeyScope::Connection).unwrap();
    p.a.post_send(&[wr(1, SendOp::LocalInv { slot: &slot }, &[], false)])
        .unwrap();
    let wcs = drain(&mut p.a);
    assert_eq!(
        (wcs[0].opcode, wcs[0].status),
        (WcOpcode::LocalInv, WcStatus::LocalQpOperation)
    );
    assert_eq!(p.a.state(), ConnState::Disconnected);
}

/// `SoftQp::local_now`: a REG_MR and a LOCAL_INV done at once have the effect a posted
/// one has at post, with no send slot and no completion; a REG_MR that a posted one
/// would make wait (bytes still to leave the range it exposes, or an earlier REG_MR
/// waiting) and any other operation are left to be posted (`None`); a failed check
/// breaks the connection as a failed posted one does.
#[test]
fn local_operations_done_at_once_as_posted_ones_are_at_post() {
    let mut p = pair(QpCaps::default());
    let chunk = buf(&p, 8192, RW);
    let dst = buf(&p, 8192, RW);
    let (slots, keys) = slots_with_next_keys(&p, 3);
    let bind = |i: usize, region| bind_4k(&slots[i], region, keys[i]);
    assert_eq!(p.b.local_now(&bind(0, &chunk)), Some(Ok(())));
    assert_eq!(slots[0].rkey(), keys[0]);
    assert!(writable(&p.table, keys[0], &chunk), "bound at once");
    assert_eq!(
        p.b.local_now(&SendOp::LocalInv { slot: &slots[0] }),
        Some(Ok(()))
    );
    assert!(!writable(&p.table, keys[0], &chunk), "retired at once");
    assert!(drain(&mut p.b).is_empty(), "no completion for either");
    assert!(!p.b.has_outbound(), "no send slot for either");
    assert_eq!(p.b.local_now(&SendOp::Send), None, "not a local operation");

    // An RDMA WRITE from the chunk not yet handed over: a REG_MR exposing the chunk
    // must wait for its bytes, one exposing other memory need not.
    let src = [chunk.sge(0, 64)];
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr() + 4096,
        rkey: dst.rkey(),
    };
    p.b.post_send(&[wr(1, write, &src, false)]).unwrap();
    assert_eq!(
        p.b.local_now(&bind(1, &chunk)),
        None,
        "bytes still in the chunk"
    );
    assert!(!writable(&p.table, keys[1], &chunk));
    assert_eq!(p.b.local_now(&bind(2, &dst)), Some(Ok(())), "other memory");
    assert!(writable(&p.table, keys[2], &dst));
    // Posted, the chunk's REG_MR waits; a REG_MR behind it, whatever it exposes, too.
    p.b.post_send(&[wr(2, bind(1, &chunk), &[], false)])
        .unwrap();
    assert_eq!(
        p.b.local_now(&SendOp::LocalInv { slot: &slots[2] }),
        Some(Ok(())),
        "an invalidation does not wait"
    );
    let (more_slots, more_keys) = slots_with_next_keys(&p, 1);
    let other = SendOp::RegMr {
        slot: &more_slots[0],
        region: &dst,
        addr: dst.addr(),
        len: 64,
        access: RW,
        rkey: more_keys[0],
    };
    assert_eq!(p.b.local_now(&other), None, "an earlier REG_MR waits");
    assert_eq!(pump(&mut p.b, &mut p.a).0, 1, "the WRITE");
    p.b.sent_left();
    assert!(
        writable(&p.table, keys[1], &chunk),
        "made once the bytes left"
    );
    assert_eq!(p.b.local_now(&other), Some(Ok(())), "nothing waits now");
    assert_eq!(p.b.state(), ConnState::Connected);

    // A slot bound already: the REG_MR fails and breaks the connection.
    assert_eq!(
        p.b.local_now(&other),
        Some(Err(WcStatus::LocalQpOperation)),
        "rebinding a bound slot"
    );
    assert_eq!(p.b.state(), ConnState::Disconnected);
    assert_eq!(
        p.b.local_now(&SendOp::LocalInv { slot: &slots[1] }),
        Some(Err(WcStatus::WrFlush)),
        "nothing is done on a broken connection"
    );
    assert!(writable(&p.table, keys[1], &chunk), "and the key stays");
}

#[test]
fn fail_flushes_transmitted_but_unacked_sends() {
    let mut p = pair(QpCaps::default());
    p.a.post_send(&[
        wr(1, SendOp::Send, &[], false),
        wr(2, SendOp::Send, &[], false),
    ])
    .unwrap();
    p.a.mark_transmitted(2);
    p.a.post_recv(&[RecvWr {
        wr_id: 9,
        sge: None,
    }])
    .unwrap();
    p.a.fail();
    let wcs: Vec<_> = drain(&mut p.a)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        wcs,
        vec![
            (1, WcStatus::WrFlush),
            (2, WcStatus::WrFlush),
            (9, WcStatus::WrFlush)
        ]
    );
    assert_eq!(p.a.outbound().count(), 0);
    assert!(p
        .a
        .post_recv(&[RecvWr {
            wr_id: 1,
            sge: None
        }])
        .is_err());
}

#[test]
fn unsignaled_slots_wait_for_a_later_completion() {
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 16,
        max_send_sge: 1,
    };
    let mut p = pair(caps);
    p.b.post_recv(
        &(0..8)
            .map(|i| RecvWr {
                wr_id: i,
                sge: None,
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let unsignaled: Vec<_> = (0..3).map(|i| wr(i, SendOp::Send, &[], false)).collect();
    p.a.post_send(&unsignaled).unwrap();
    pump(&mut p.a, &mut p.b);
    assert!(drain(&mut p.a).is_empty());
    // Executed by the peer, but their slots are still held: one slot is left.
    p.a.post_send(&[wr(3, SendOp::Send, &[], true)]).unwrap();
    let err =
        p.a.post_send(&[wr(4, SendOp::Send, &[], false)])
            .unwrap_err();
    assert_eq!(err.kind, PostErrorKind::QueueFull);
    // The signaled one's completion frees all four.
    pump(&mut p.a, &mut p.b);
    let wcs = drain(&mut p.a);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![3]);
    p.a.post_send(&unsignaled).unwrap();
    p.a.post_send(&[wr(5, SendOp::Send, &[], true)]).unwrap();
}

#[test]
fn a_bound_slot_must_be_invalidated_before_rebinding() {
    let mut p = pair(QpCaps::default());
    let region = buf(&p, 4096, RW);
    let slot = p.table.alloc_fast_mr(KeyScope::Connection).unwrap();
    let k1 = inc_rkey(slot.rkey());
    let bind = |rkey| bind_4k(&slot, &region, rkey);
    p.a.post_send(&[wr(1, bind(k1), &[], false)]).unwrap();
    p.a.post_send(&[
        wr(2, SendOp::LocalInv { slot: &slot }, &[], false),
        wr(3, bind(inc_rkey(k1)), &[], true),
    ])
    .unwrap();
    assert_eq!(drain(&mut p.a)[0].status, WcStatus::Success);
    p.a.post_send(&[wr(4, bind(inc_rkey(inc_rkey(k1))), &[], true)])
        .unwrap();
    let wcs = drain(&mut p.a);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (4, WcStatus::LocalQpOperation)
    );
}

/// One scenario through both ways of executing incoming operations: a SEND into a
/// posted receive, a WRITE and a WRITE_WITH_IMM, a SEND_WITH_INV, a stall for want of a
/// receive, then a bad rkey. Returns both sides' completions and the bytes that landed.
fn execute_scenario(how: Exec) -> (Vec<Wc>, Vec<Wc>, Vec<u8>) {
    let mut p = pair(QpCaps::default());
    let src = buf(&p, 64, Access::NONE);
    src.write_at(0, &[7; 64]);
    let dst = buf(&p, 64, RW);
    let rbuf = buf(&p, 64, Access::LOCAL_WRITE);
    let slot = p.table.alloc_fast_mr(KeyScope::Connection).unwrap();
    let key = inc_rkey(slot.rkey());
    p.b.post_send(&[wr(
        1,
        SendOp::RegMr {
            slot: &slot,
            region: &dst,
            addr: dst.addr(),
            len: 64,
            access: RW,
            rkey: key,
        },
        &[],
        false,
    )])
    .unwrap();
    p.b.post_recv(&[
        RecvWr {
            wr_id: 20,
            sge: Some(rbuf.sge(0, 64)),
        },
        RecvWr {
            wr_id: 21,
            sge: None,
        },
        RecvWr {
            wr_id: 22,
            sge: Some(rbuf.sge(0, 64)),
        },
    ])
    .unwrap();
    let s8 = [src.sge(0, 8)];
    let s16 = [src.sge(0, 16)];
    let write = |wr_id, imm: Option<u32>, rkey| {
        let (remote_addr, sges): (u64, &[crate::fabric::Sge]) = (dst.addr() + 8, &s16);
        let op = match imm {
            Some(imm) => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            None => SendOp::RdmaWrite { remote_addr, rkey },
        };
        wr(wr_id, op, sges, true)
    };
    p.a.post_send(&[
        wr(10, SendOp::Send, &s8, true),
        write(11, None, key),
        write(12, Some(5), key),
        wr(13, SendOp::SendWithInv { rkey: key }, &s8, true),
        // No receive left for this one: it stalls until one is posted.
        wr(14, SendOp::SendWithImm { imm: 6 }, &[], true),
    ])
    .unwrap();
    assert_eq!(pump_with(&mut p.a, &mut p.b, how), (4, None));
    p.b.post_recv(&[RecvWr {
        wr_id: 23,
        sge: None,
    }])
    .unwrap();
    assert_eq!(pump_with(&mut p.a, &mut p.b, how), (1, None));
    // The slot's key was retired by the SEND_WITH_INV: a write through it is refused.
    p.a.post_send(&[write(15, None, key)]).unwrap();
    assert_eq!(
        pump_with(&mut p.a, &mut p.b, how),
        (1, Some((6, WcStatus::RemoteAccess)))
    );
    let mut landed = vec![0u8; 64];
    dst.read_at(0, &mut landed);
    let mut got = vec![0u8; 64];
    rbuf.read_at(0, &mut got);
    landed.extend(got);
    // Keys are random: the invalidated one must be the slot's, then compares as 0.
    let mut b = drain(&mut p.b);
    for w in &mut b {
        w.invalidated_rkey = w.invalidated_rkey.map(|k| {
            assert_eq!(k, key, "the key the SEND_WITH_INV named");
            0
        });
    }
    (drain(&mut p.a), b, landed)
}

#[test]
fn execute_in_one_step_or_staged_matches_inbound_then_done() {
    let (a1, b1, m1) = execute_scenario(Exec::Inbound);
    for how in [Exec::OneStep, Exec::Staged] {
        let (a2, b2, m2) = execute_scenario(how);
        assert_eq!(a1, a2, "sender completions, {how:?}");
        assert_eq!(b1, b2, "responder completions, {how:?}");
        assert_eq!(m1, m2, "memory, {how:?}");
    }
    // And the scenario did what it says.
    let ids = |w: &[Wc]| w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>();
    assert_eq!(
        ids(&a1),
        [
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success),
            (13, WcStatus::Success),
            (14, WcStatus::Success),
            (15, WcStatus::RemoteAccess)
        ]
    );
    assert!(b1[2].invalidated_rkey.is_some());
    assert_eq!(
        (b1[1].opcode, b1[1].imm),
        (WcOpcode::RecvRdmaWithImm, Some(5))
    );
    assert_eq!(
        (b1[3].wr_id, b1[3].imm, b1[3].status),
        (23, Some(6), WcStatus::Success)
    );
    assert_eq!(&m1[8..24], &[7; 16], "the writes landed");
    assert_eq!(&m1[64..72], &[7; 8], "the sends landed");
}

#[test]
fn a_staged_payload_of_the_wrong_length_is_refused_and_writes_nothing() {
    let mut p = pair(QpCaps::default());
    let dst = buf(&p, 64, RW);
    let op = WireOp {
        seq: 1,
        kind: WireKind::RdmaWrite,
        len: 8,
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        imm: 0,
        inv_rkey: 0,
    };
    assert!(matches!(
        p.b.execute_staged(&op, &[9u8; 7]),
        Err(InboundError::Refuse(WcStatus::RemoteInvalidRequest))
    ));
    let mut landed = [0u8; 8];
    dst.read_at(0, &mut landed);
    assert_eq!(landed, [0; 8]);
    assert_eq!(p.b.state(), ConnState::Disconnected, "the queue pair broke");
}

/// What `FabricCaps::local_ops_at_post` promises for the software fabrics: a REG_MR
/// grants, and a LOCAL_INV revokes, remote access before its completion is polled.
#[test]
fn local_operations_take_effect_at_post() {
    let mut p = pair(QpCaps::default());
    let region = buf(&p, 4096, RW);
    let slot = p.table.alloc_fast_mr(KeyScope::Connection).unwrap();
    let k1 = inc_rkey(slot.rkey());
    let bind = bind_4k(&slot, &region, k1);
    let qp = p.a.qp_num();
    let remote = |t: &MrTable| {
        let mut leases = Leases::default();
        t.remote(
            &mut leases,
            qp,
            k1,
            region.addr() + 64,
            64,
            Access::REMOTE_WRITE,
        )
    };
    assert!(remote(&p.table).is_err(), "an unbound key");
    p.a.post_send(&[wr(1, bind, &[], true)]).unwrap();
    assert!(remote(&p.table).is_ok(), "bound once the REG_MR is posted");
    p.a.post_send(&[wr(2, SendOp::LocalInv { slot: &slot }, &[], true)])
        .unwrap();
    assert_eq!(
        remote(&p.table).err(),
        Some(WcStatus::RemoteAccess),
        "retired once the LOCAL_INV is posted"
    );
    // Both completions still come, in order, successful.
    let wcs = drain(&mut p.a);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// A REG_MR posted behind an operation whose bytes have not left their source (the RTRS
/// server's READ response: RDMA WRITE from a chunk, then the chunk's next key), small or
/// large, takes effect only once they have: until then nobody can write the chunk through
/// the key.
#[test]
fn a_reg_mr_behind_unsent_bytes_waits_for_them() {
    for size in [64, 4096, 256 << 10] {
        reg_mr_behind_unsent_bytes(size);
    }
}

fn reg_mr_behind_unsent_bytes(size: usize) {
    const BIG: usize = 256 << 10;
    let mut p = pair(QpCaps::default());
    let chunk = buf(&p, BIG, RW);
    let dst = buf(&p, BIG, RW);
    chunk.write_at(0, &[9; 64]);
    let slot = p.table.alloc_fast_mr(KeyScope::Domain).unwrap();
    let key = crate::fabric::next_rkey(slot.rkey());
    let src = [chunk.sge(0, size)];
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let bind = SendOp::RegMr {
        slot: &slot,
        region: &chunk,
        addr: chunk.addr(),
        len: BIG as u32,
        access: RW,
        rkey: key,
    };
    p.b.post_send(&[
        wr(1, write, &src, false),
        wr(2, bind, &[], true),
        wr(3, SendOp::Send, &[], true),
    ])
    .unwrap();
    assert_eq!(
        slot.rkey(),
        key,
        "the slot carries the key it was posted with"
    );
    let table = p.table.clone();
    let reach = || writable(&table, key, &chunk);
    assert!(!reach(), "not while the WRITE's bytes are in the chunk");
    // The SEND behind the REG_MR goes to the transport in the same batch: the transport
    // says when the WRITE has left, before the SEND can be whole at the peer.
    let seqs: Vec<u64> = p.b.outbound().map(|(w, _)| w.seq).collect();
    assert_eq!(seqs.len(), 2, "the WRITE and the SEND");
    p.b.mark_transmitted(2);
    assert!(
        !reach(),
        "handed to the transport is not gone from the chunk"
    );
    p.b.left_through(seqs[0] - 1);
    assert!(!reach(), "nothing of the WRITE said to have left");
    p.b.left_through(seqs[0]);
    assert!(
        reach(),
        "made once the transport says the WRITE's bytes left"
    );
    assert_eq!(p.b.outbound().count(), 0, "everything was handed over");
    // Its completion comes in send-queue order, after the WRITE's ack.
    assert!(drain(&mut p.b).is_empty());
    p.b.on_ack(1).unwrap();
    let wcs = drain(&mut p.b);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(2, WcStatus::Success)]
    );
}

/// The same ordering with a transport that only learns it from acks: the peer executing
/// the WRITE makes the binding.
#[test]
fn an_ack_of_the_bytes_before_a_reg_mr_makes_it() {
    let mut p = pair(QpCaps::default());
    let chunk = buf(&p, 4096, RW);
    let dst = buf(&p, 4096, RW);
    let slot = p.table.alloc_fast_mr(KeyScope::Domain).unwrap();
    let key = crate::fabric::next_rkey(slot.rkey());
    let src = [chunk.sge(0, 64)];
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    p.b.post_send(&[
        wr(1, write, &src, false),
        wr(2, bind_4k(&slot, &chunk, key), &[], true),
    ])
    .unwrap();
    assert!(drain(&mut p.b).is_empty(), "the REG_MR waits");
    assert_eq!(pump(&mut p.b, &mut p.a), (1, None));
    let wcs = drain(&mut p.b);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(2, WcStatus::Success)]
    );
    assert!(p
        .table
        .remote(
            &mut Leases::default(),
            0,
            key,
            chunk.addr(),
            64,
            Access::REMOTE_WRITE
        )
        .is_ok());
}

/// Unsent bytes of other memory hold no REG_MR back, however many; unsent bytes of the
/// range it exposes do, also behind those (the bounds of the pending sources cover both),
/// and once everything has left a REG_MR of that range goes at once again.
#[test]
fn only_unsent_bytes_of_the_exposed_range_hold_a_reg_mr() {
    const BIG: usize = 256 << 10;
    let mut p = pair(QpCaps::default());
    let chunk = buf(&p, BIG, RW);
    let other = buf(&p, BIG, RW);
    let dst = buf(&p, BIG, RW);
    let (slots, keys) = slots_with_next_keys(&p, 3);
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let bind = |k: usize| SendOp::RegMr {
        slot: &slots[k],
        region: &chunk,
        addr: chunk.addr(),
        len: BIG as u32,
        access: RW,
        rkey: keys[k],
    };
    let table = p.table.clone();
    let reach = |key: u32| writable(&table, key, &chunk);
    let from_other = [other.sge(0, BIG)];
    let from_chunk = [chunk.sge(0, BIG)];
    p.b.post_send(&[
        wr(1, write, &from_other, false),
        wr(2, write, &from_other, false),
        wr(3, bind(0), &[], false),
    ])
    .unwrap();
    assert!(reach(keys[0]), "other memory's bytes hold nothing back");
    p.b.post_send(&[
        wr(4, write, &from_chunk, false),
        wr(5, write, &from_other, false),
        wr(6, bind(1), &[], false),
    ])
    .unwrap();
    assert!(!reach(keys[1]), "the chunk's own bytes are still in it");
    let seqs: Vec<u64> = p.b.outbound().map(|(w, _)| w.seq).collect();
    assert_eq!(seqs.len(), 4, "four WRITEs handed over");
    p.b.mark_transmitted(4);
    p.b.left_through(seqs[3]);
    assert!(reach(keys[1]), "made once every byte before it has left");
    p.b.post_send(&[wr(7, bind(2), &[], true)]).unwrap();
    assert!(reach(keys[2]), "nothing is pending: at once");
}

/// A batch of READ responses, each an RDMA WRITE from its own chunk and that chunk's next
/// key: every REG_MR waits for its own WRITE, and as the transport says how far its write
/// got, exactly the bindings whose WRITE has left are made, in send-queue order.
#[test]
fn a_batch_of_reg_mrs_is_made_as_far_as_the_bytes_have_left() {
    const N: usize = 8;
    let mut p = pair(QpCaps::default());
    let chunks: Vec<Mr> = (0..N).map(|_| buf(&p, 4096, RW)).collect();
    let dst = buf(&p, 4096, RW);
    let (slots, keys) = slots_with_next_keys(&p, N);
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let srcs: Vec<[Sge; 1]> = chunks.iter().map(|c| [c.sge(0, 512)]).collect();
    for k in 0..N {
        let id = 3 * k as u64;
        p.b.post_send(&[
            wr(id + 1, write, &srcs[k], false),
            wr(id + 2, bind_4k(&slots[k], &chunks[k], keys[k]), &[], true),
            wr(id + 3, SendOp::Send, &[], false),
        ])
        .unwrap();
    }
    let table = p.table.clone();
    let made = || {
        (0..N)
            .map(|k| writable(&table, keys[k], &chunks[k]))
            .collect::<Vec<_>>()
    };
    assert_eq!(made(), [false; N], "every chunk's bytes are still in it");
    let seqs: Vec<u64> = p.b.outbound().map(|(w, _)| w.seq).collect();
    assert_eq!(seqs.len(), 2 * N, "every WRITE and SEND goes in one batch");
    p.b.mark_transmitted(seqs.len());
    // The socket took the first three responses and the fourth WRITE's header only.
    p.b.left_through(seqs[5]);
    let mut want = [false; N];
    want[..3].fill(true);
    assert_eq!(made(), want, "the first three WRITEs have left");
    // Everything is in the socket now.
    p.b.sent_left();
    assert_eq!(made(), [true; N], "every WRITE has left");
    // The REG_MRs complete, signaled, in order, once the peer acks what was before them.
    p.b.on_ack(*seqs.last().unwrap()).unwrap();
    let wcs = drain(&mut p.b);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..N)
            .map(|k| (3 * k as u64 + 2, WcStatus::Success))
            .collect::<Vec<_>>()
    );
}

/// The handles a queue pair makes per operation (a send's sources, a receive's buffer,
/// a payload's destination) go back to its leases when done with and are handed out
/// again: once warm, operations clone no handle (no reference count moves per IO);
/// the data is in place either way.
#[test]
fn handles_go_back_to_their_lease_and_are_made_again_from_it() {
    for how in [Exec::OneStep, Exec::Staged, Exec::Inbound] {
        let mut p = pair(QpCaps {
            max_recv_wr: 256,
            max_send_wr: 256,
            ..QpCaps::default()
        });
        let src = buf(&p, 64, Access::NONE);
        let dst = buf(&p, 64 * 100, RW);
        src.write_at(0, b"ping");
        let sends = |p: &mut Pair, n: u64, first: u64| {
            for i in first..first + n {
                p.b.post_recv(&[RecvWr {
                    wr_id: i,
                    sge: Some(dst.sge(64 * i as usize, 64)),
                }])
                .unwrap();
                p.a.post_send(&[wr(i, SendOp::Send, &[src.sge(0, 4)], true)])
                    .unwrap();
                assert_eq!(pump_with(&mut p.a, &mut p.b, how), (1, None));
                assert_eq!(drain(&mut p.a).len(), 1, "{how:?}: the send completed");
            }
        };
        sends(&mut p, 3, 0);
        let warm = (p.a.leases.cloned, p.b.leases.cloned);
        assert!(warm.0 > 0 && warm.1 > 0, "{how:?}: {warm:?}");
        sends(&mut p, 90, 3);
        assert_eq!(
            (p.a.leases.cloned, p.b.leases.cloned),
            warm,
            "{how:?}: handles cloned once warm (sender, receiver)"
        );
        assert_eq!(
            drain_all(&mut p.b).len(),
            93,
            "{how:?}: every receive completed"
        );
        let mut out = [0u8; 4];
        dst.read_at(64 * 92, &mut out);
        assert_eq!(&out, b"ping", "{how:?}: the last payload landed");
    }
}
