use super::*;
use crate::fabric::soft::MrTable;
use crate::fabric::tcp::frame::{
    cm_frame, CmPayload, Header as H, RejectReason, CM_FRAME_LEN, VERSION,
};
use crate::fabric::{Access, MemBuf, Mr, PrivateData, QpCaps, SendOp, SendWr};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

fn read_all(b: &mut UnixStream) -> Vec<u8> {
    b.set_nonblocking(true).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = b.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// A socket pair whose first end (the sender's) does not block.
fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    (a, b)
}

/// A 4 KiB registration of `table` that starts with `bytes`.
fn mr_holding(table: &Arc<MrTable>, bytes: &[u8]) -> Mr {
    let mr = table
        .register_buf(MemBuf::zeroed(4096), Access::NONE)
        .unwrap();
    mr.write_at(0, bytes);
    mr
}

fn header(bytes: &[u8]) -> H {
    H::decode(bytes[..HEADER_LEN].try_into().unwrap()).unwrap()
}

/// A queue pair that has executed one incoming operation (so it owes an ack).
fn qp_owing_an_ack(table: &Arc<MrTable>) -> SoftQp {
    let mut qp = SoftQp::new(table.clone(), QpCaps::default());
    qp.set_connected();
    let op = WireOp {
        seq: 1,
        kind: WireKind::RdmaWrite,
        len: 0,
        remote_addr: 0,
        rkey: 0,
        imm: 0,
        inv_rkey: 0,
    };
    assert!(qp.inbound(&op).unwrap().is_none());
    qp.inbound_done(&op);
    qp
}

#[test]
fn a_batch_carries_cm_frame_headers_payloads_and_the_ack() {
    let (a, mut b) = pair();
    let table = MrTable::new();
    let mr = mr_holding(&table, b"hello world!");
    let mut qp = qp_owing_an_ack(&table);
    let two = [mr.sge(0, 5), mr.sge(5, 7)];
    let one = [mr.sge(0, 3)];
    qp.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::SendWithImm { imm: 5 },
            sges: &two,
            signaled: true,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 0x300,
            },
            sges: &one,
            signaled: true,
        },
    ])
    .unwrap();
    let mut tx = Tx::new(QpCaps::default().max_send_wr, VERSION);
    let pd = PrivateData::new(b"rep").unwrap();
    tx.queue_cm(&cm_frame(
        VERSION,
        Opcode::CmRep,
        &CmPayload::new(RejectReason::None, pd),
    ));
    tx.flush(a.as_raw_fd(), Some(&mut qp)).unwrap();
    assert!(tx.drained());
    assert_eq!(qp.outbound().count(), 0, "both operations handed over");

    let got = read_all(&mut b);
    assert_eq!(
        got.len(),
        CM_FRAME_LEN + HEADER_LEN + 12 + HEADER_LEN + 3 + HEADER_LEN
    );
    assert_eq!(header(&got).opcode, Opcode::CmRep);
    let mut at = CM_FRAME_LEN;
    let h = header(&got[at..]);
    assert_eq!(
        (h.opcode, h.len, h.imm, h.seq),
        (Opcode::SendWithImm, 12, 5, 1)
    );
    at += HEADER_LEN;
    assert_eq!(&got[at..at + 12], b"hello world!");
    at += 12;
    let h = header(&got[at..]);
    assert_eq!(
        (h.opcode, h.rkey, h.remote_addr, h.seq),
        (Opcode::RdmaWrite, 0x300, 0x1000, 2)
    );
    at += HEADER_LEN + 3;
    assert_eq!(header(&got[at..]), H::ack(1), "the owed ack rides along");
}

#[test]
fn a_batch_keeps_one_handle_per_registration_and_finishes_after_they_are_dropped() {
    const LEN: usize = 64 * 1024;
    let (a, mut b) = pair();
    let table = MrTable::new();
    let mrs: Vec<_> = (0..2u8)
        .map(|i| {
            let mr = table
                .register_buf(MemBuf::zeroed(2 * LEN), Access::NONE)
                .unwrap();
            mr.write_at(0, &vec![i + 1; 2 * LEN]);
            mr
        })
        .collect();
    let mut qp = SoftQp::new(table.clone(), QpCaps::default());
    qp.set_connected();
    // Four frames, two pieces each, every piece from one of two registrations.
    let sges: Vec<[crate::fabric::Sge; 2]> = (0..4)
        .map(|i| {
            let mr = &mrs[i % 2];
            [mr.sge(0, LEN / 2), mr.sge(LEN, LEN / 2)]
        })
        .collect();
    let wrs: Vec<SendWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr {
            wr_id: i as u64,
            op: SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 0x300,
            },
            sges: s,
            signaled: true,
        })
        .collect();
    qp.post_send(&wrs).unwrap();
    let mut tx = Tx::new(QpCaps::default().max_send_wr, VERSION);
    tx.flush(a.as_raw_fd(), Some(&mut qp)).unwrap();
    assert_eq!(qp.outbound().count(), 0, "every operation in the batch");
    assert_eq!(
        tx.keep.len(),
        2,
        "one handle per registration, not per piece"
    );
    // The queue pair breaks and flushes its requests, and the registrations go, while
    // the batch is still being written: the batch's handles keep the memory.
    qp.fail();
    drop(qp);
    drop(wrs);
    drop(mrs);
    let mut got = Vec::new();
    let mut buf = vec![0u8; LEN];
    while !tx.drained() || got.len() < 4 * (HEADER_LEN + LEN) {
        tx.flush(a.as_raw_fd(), None).unwrap();
        b.set_nonblocking(true).unwrap();
        match b.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got.len(), 4 * (HEADER_LEN + LEN));
    for i in 0..4 {
        let at = i * (HEADER_LEN + LEN);
        assert_eq!(header(&got[at..]).len as usize, LEN);
        let payload = &got[at + HEADER_LEN..at + HEADER_LEN + LEN];
        assert!(payload.iter().all(|&v| v == (i % 2) as u8 + 1), "frame {i}");
    }
}

/// Batch after batch over the same registrations, the handles taken by the first are
/// kept: no reference count moves per batch (at QD1, per IO).
#[test]
fn later_batches_over_the_same_registrations_take_no_new_handle() {
    let (a, mut b) = pair();
    let table = MrTable::new();
    let mrs = [mr_holding(&table, b"one"), mr_holding(&table, b"two")];
    let mut qp = SoftQp::new(table.clone(), QpCaps::default());
    qp.set_connected();
    let mut tx = Tx::new(QpCaps::default().max_send_wr, VERSION);
    let mut buf = vec![0u8; 4096];
    for round in 0..20u64 {
        let sges = [mrs[0].sge(0, 3), mrs[1].sge(0, 3)];
        let wr = SendWr {
            wr_id: round,
            op: SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 0x300,
            },
            sges: &sges,
            signaled: true,
        };
        qp.post_send(&[wr]).unwrap();
        tx.flush(a.as_raw_fd(), Some(&mut qp)).unwrap();
        assert!(tx.drained(), "round {round}: the batch is written");
        let n = b.read(&mut buf).unwrap();
        assert_eq!(n, HEADER_LEN + 6, "round {round}");
        assert_eq!(&buf[HEADER_LEN..n], b"onetwo", "round {round}");
        assert_eq!(tx.kept, 2, "round {round}: handles taken in all");
    }
}

#[test]
fn a_lone_ack_waits_for_a_frame_or_the_delay() {
    let (a, mut b) = pair();
    let table = MrTable::new();
    let mut qp = qp_owing_an_ack(&table);
    let mut tx = Tx::new(QpCaps::default().max_send_wr, VERSION);
    tx.ack_delay = Duration::from_secs(3600);
    tx.flush(a.as_raw_fd(), Some(&mut qp)).unwrap();
    assert!(read_all(&mut b).is_empty(), "no syscall for a lone ack yet");
    tx.ack_delay = Duration::ZERO;
    let mut got = Vec::new();
    for _ in 0..ACK_CLOCK_ROUNDS {
        tx.flush(a.as_raw_fd(), Some(&mut qp)).unwrap();
        got.extend(read_all(&mut b));
    }
    assert_eq!(
        got,
        H::ack(1).to_bytes(),
        "the clock is read within the rounds"
    );
    tx.flush(a.as_raw_fd(), Some(&mut qp)).unwrap();
    assert!(read_all(&mut b).is_empty(), "an ack goes once");
}

#[test]
fn a_small_send_queue_gets_its_acks_at_once() {
    let (a, mut b) = pair();
    let table = MrTable::new();
    let mut qp = qp_owing_an_ack(&table);
    // Four send slots: an ack covering one frame is a quarter of the queue.
    let mut tx = Tx::new(4, VERSION);
    tx.ack_delay = Duration::from_secs(3600);
    tx.flush(a.as_raw_fd(), Some(&mut qp)).unwrap();
    assert_eq!(read_all(&mut b), H::ack(1).to_bytes());
}

#[test]
fn a_break_finishes_only_the_frame_in_flight() {
    let (a, mut b) = pair();
    let table = MrTable::new();
    let mr = mr_holding(&table, b"0123456789ab");
    let mut qp = SoftQp::new(table.clone(), QpCaps::default());
    qp.set_connected();
    let s = [mr.sge(0, 12)];
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sges: &s,
            signaled: true,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sges: &s,
            signaled: true,
        },
    ];
    qp.post_send(&wrs).unwrap();
    let mut tx = Tx::new(QpCaps::default().max_send_wr, VERSION);
    assert!(tx.build(Some(&mut qp)));
    // As if the socket had taken the first header and 5 payload bytes.
    tx.partial = tx.iov.consume(&mut tx.pos, HEADER_LEN + 5);
    assert!(tx.partial);
    qp.fail();
    assert!(tx.detach());
    mr.write_at(0, b"XXXXXXXXXXXX");
    tx.queue_last(H::new(Opcode::Disconnect));
    tx.flush(a.as_raw_fd(), None).unwrap();
    assert!(tx.drained());
    let got = read_all(&mut b);
    assert_eq!(
        &got[..7],
        b"56789ab",
        "the rest of the first frame, copied at the break"
    );
    assert_eq!(header(&got[7..]).opcode, Opcode::Disconnect);
    assert_eq!(got.len(), 7 + HEADER_LEN, "the second frame was dropped");
}

#[test]
fn wire_header_uses_only_the_fields_of_its_kind() {
    let op = WireOp {
        seq: 3,
        kind: WireKind::SendWithImm,
        len: 10,
        remote_addr: 99,
        rkey: 5,
        imm: 7,
        inv_rkey: 8,
    };
    let h = wire_header(&op);
    assert_eq!(
        (h.opcode, h.len, h.imm, h.seq),
        (Opcode::SendWithImm, 10, 7, 3)
    );
    assert_eq!((h.rkey, h.remote_addr, h.inv_rkey), (0, 0, 0));
    assert_eq!(H::decode(&h.to_bytes()), Ok(h));
    let w = WireOp {
        kind: WireKind::RdmaWrite,
        ..op
    };
    let h = wire_header(&w);
    assert_eq!((h.rkey, h.remote_addr, h.imm), (5, 99, 0));
    assert_eq!(H::decode(&h.to_bytes()), Ok(h));
}
