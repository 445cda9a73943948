//! Unit tests of the receive engine over a socket pair: staged and direct payloads,
//! acks, RNR stall and resume, refusal, garbage.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use super::*;
use crate::fabric::soft::MrTable;
use crate::fabric::{Access, MemBuf, Mr, QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

struct Setup {
    table: Arc<MrTable>,
    qp: SoftQp,
    rx: Rx,
    ours: UnixStream,
    peer: UnixStream,
}

fn setup() -> Setup {
    let (ours, peer) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let table = MrTable::new();
    let mut qp = SoftQp::new(table.clone(), QpCaps::default());
    qp.set_connected();
    Setup {
        table,
        qp,
        rx: Rx::new(VERSION),
        ours,
        peer,
    }
}

fn write_frame(peer: &mut UnixStream, h: Header, payload: &[u8]) {
    peer.write_all(&h.to_bytes()).unwrap();
    peer.write_all(payload).unwrap();
}

fn write_op(seq: u64, dst: &Mr, at: usize, len: u32, with_imm: Option<u32>) -> Header {
    let opcode = if with_imm.is_some() {
        Opcode::RdmaWriteWithImm
    } else {
        Opcode::RdmaWrite
    };
    Header {
        len,
        rkey: dst.rkey(),
        remote_addr: dst.addr() + at as u64,
        imm: with_imm.unwrap_or(0),
        seq,
        ..Header::new(opcode)
    }
}

fn wcs(qp: &mut SoftQp) -> Vec<Wc> {
    let mut w = [Wc::default(); 16];
    let n = qp.poll(&mut w);
    w[..n].to_vec()
}

#[test]
fn small_and_large_payloads_land_in_place() {
    let mut s = setup();
    let dst = s.table.register_buf(MemBuf::zeroed(1 << 20), RW).unwrap();
    s.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sge: None,
    }])
    .unwrap();
    let small: Vec<u8> = (0..100u8).collect();
    let large: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    write_frame(&mut s.peer, write_op(1, &dst, 0, 100, None), &small);
    let big = write_op(2, &dst, 4096, large.len() as u32, Some(9));
    // The large payload is written from another thread: it exceeds the socket buffer.
    let mut peer = s.peer.try_clone().unwrap();
    let data = large.clone();
    let writer = std::thread::spawn(move || write_frame(&mut peer, big, &data));
    let mut got = Vec::new();
    for _ in 0..1_000_000 {
        assert!(matches!(
            s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
            RxStop::Idle
        ));
        got.extend(wcs(&mut s.qp));
        if !got.is_empty() {
            break;
        }
        std::thread::yield_now();
    }
    writer.join().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].opcode, got[0].imm, got[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(9), 300_000)
    );
    let mut out = vec![0u8; 100];
    dst.read_at(0, &mut out);
    assert_eq!(out, small);
    let mut out = vec![0u8; large.len()];
    dst.read_at(4096, &mut out);
    assert!(out == large, "large payload corrupted");
    assert_eq!(s.qp.take_ack(), Some(2));
}

#[test]
fn after_a_large_payload_reads_stay_short() {
    let mut s = setup();
    let dst = s.table.register_buf(MemBuf::zeroed(1 << 20), RW).unwrap();
    let large: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
    let small: Vec<u8> = (0..100u8).collect();
    let len = large.len() as u32;
    write_frame(&mut s.peer, write_op(1, &dst, 0, len, None), &large);
    let progress = |s: &mut Setup| {
        assert!(matches!(
            s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
            RxStop::Idle
        ));
    };
    progress(&mut s);
    assert!(s.rx.bulk > 0, "a 20 KB payload makes the stream bulk");
    // The next large payload and a small frame: only a little is read ahead into the
    // staging buffer, the rest of the large payload goes straight into place.
    write_frame(&mut s.peer, write_op(2, &dst, 32_768, len, None), &large);
    write_frame(&mut s.peer, write_op(3, &dst, 65_536, 100, None), &small);
    let before = s.rx.copied;
    progress(&mut s);
    let copied = s.rx.copied - before;
    assert!(
        copied <= (BULK_READ_AHEAD + small.len()) as u64,
        "{copied} payload bytes went through the staging buffer"
    );
    assert_eq!(
        s.rx.bulk,
        BULK_SMALL_FRAMES - 1,
        "a small payload counts bulk mode down"
    );
    let mut out = vec![0u8; large.len()];
    for at in [0, 32_768] {
        dst.read_at(at, &mut out);
        assert!(out == large, "large payload at {at} corrupted");
    }
    let mut out = vec![0u8; 100];
    dst.read_at(65_536, &mut out);
    assert_eq!(out, small);
    assert_eq!(s.qp.take_ack(), Some(3));
}

/// Large READ responses one after another: each one's data, then its small frames (a
/// zero-length SEND_WITH_INV and an 8-byte SEND_WITH_IMM). The small frames keep the
/// stream bulk, so every response's data is read into place, not through the staging
/// buffer; a run of small payloads alone ends bulk mode.
#[test]
fn small_frames_between_large_payloads_keep_the_stream_bulk() {
    let mut s = setup();
    let dst = s.table.register_buf(MemBuf::zeroed(1 << 20), RW).unwrap();
    let large: Vec<u8> = (0..20_000u32).map(|i| (i % 249) as u8).collect();
    let rbuf = s.table.register_buf(MemBuf::zeroed(4096), RW).unwrap();
    let len = large.len() as u32;
    let progress = |s: &mut Setup| {
        let stop =
            s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default());
        assert!(matches!(stop, RxStop::Idle), "{stop:?}");
    };
    write_frame(&mut s.peer, write_op(1, &dst, 0, len, None), &large);
    progress(&mut s);
    assert_eq!(s.rx.bulk, BULK_SMALL_FRAMES);
    // Each response arrives after the previous one was read (the socket empty between
    // them, as a READ at a time finds it).
    let mut seq = 2;
    let mut copied = 0;
    for round in 0..3u64 {
        let recvs: Vec<RecvWr> = (0..2)
            .map(|k| RecvWr {
                wr_id: round * 2 + k,
                sge: Some(rbuf.sge(16 * (round * 2 + k) as usize, 16)),
            })
            .collect();
        s.qp.post_recv(&recvs).unwrap();
        let rsp = Header {
            seq: seq + 2,
            imm: 7,
            len: 8,
            ..Header::new(Opcode::SendWithImm)
        };
        let inv = Header {
            seq: seq + 1,
            ..Header::new(Opcode::Send)
        };
        let at = 32_768 * (round as usize + 1);
        write_frame(&mut s.peer, write_op(seq, &dst, at, len, None), &large);
        write_frame(&mut s.peer, inv, &[]);
        write_frame(&mut s.peer, rsp, b"rkey-rsp");
        seq += 3;
        let before = s.rx.copied;
        progress(&mut s);
        copied += s.rx.copied - before;
    }
    // Per response at most the read-ahead of a large payload, and the 8-byte frame.
    assert!(
        copied <= 3 * (BULK_READ_AHEAD as u64 + 8),
        "{copied} payload bytes of three responses went through the staging buffer"
    );
    assert_eq!(s.qp.take_ack(), Some(seq - 1), "every frame executed");
    let mut out = vec![0u8; large.len()];
    for round in 0..3 {
        dst.read_at(32_768 * (round + 1), &mut out);
        assert!(out == large, "response {round}'s data corrupted");
    }
    assert_eq!(
        s.rx.bulk,
        BULK_SMALL_FRAMES - 1,
        "after the last 8-byte frame"
    );
    // Small payloads alone: bulk mode ends after BULK_SMALL_FRAMES of them.
    for _ in 0..BULK_SMALL_FRAMES {
        write_frame(&mut s.peer, write_op(seq, &dst, 0, 64, None), &large[..64]);
        seq += 1;
    }
    progress(&mut s);
    assert_eq!(s.rx.bulk, 0, "small payloads alone end bulk mode");
    assert_eq!(s.qp.take_ack(), Some(seq - 1));
}

#[test]
fn rnr_stalls_the_stream_until_a_receive_is_posted() {
    let mut s = setup();
    let dst = s.table.register_buf(MemBuf::zeroed(4096), RW).unwrap();
    write_frame(
        &mut s.peer,
        Header {
            seq: 1,
            imm: 5,
            ..Header::new(Opcode::SendWithImm)
        },
        &[],
    );
    write_frame(&mut s.peer, write_op(2, &dst, 0, 4, None), b"abcd");
    for _ in 0..10 {
        assert!(matches!(
            s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
            RxStop::Idle
        ));
    }
    assert!(wcs(&mut s.qp).is_empty());
    let mut out = [0u8; 4];
    dst.read_at(0, &mut out);
    assert_eq!(out, [0; 4], "the write behind the stalled send waits");
    s.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }])
    .unwrap();
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Idle
    ));
    assert_eq!(wcs(&mut s.qp)[0].imm, Some(5));
    dst.read_at(0, &mut out);
    assert_eq!(&out, b"abcd");
}

#[test]
fn a_departed_peer_breaks_a_stalled_stream() {
    let mut s = setup();
    write_frame(
        &mut s.peer,
        Header {
            seq: 1,
            ..Header::new(Opcode::Send)
        },
        &[],
    );
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Idle
    ));
    s.peer.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Eof
    ));
}

#[test]
fn acks_naks_refusals_and_garbage() {
    let mut s = setup();
    let src = s
        .table
        .register_buf(MemBuf::zeroed(64), Access::NONE)
        .unwrap();
    let sg = [src.sge(0, 8)];
    s.qp.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sges: &sg,
            signaled: true,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sges: &sg,
            signaled: true,
        },
    ])
    .unwrap();
    s.qp.mark_transmitted(2);
    write_frame(&mut s.peer, Header::ack(1), &[]);
    write_frame(&mut s.peer, Header::nak(2, WcStatus::RemoteAccess), &[]);
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::PeerNak
    ));
    let w = wcs(&mut s.qp);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::Success));
    assert_eq!((w[1].wr_id, w[1].status), (2, WcStatus::RemoteAccess));

    // A write to a key that does not exist is refused before any payload is read.
    let mut s = setup();
    let h = Header {
        len: 8,
        rkey: 0x4200,
        remote_addr: 64,
        seq: 1,
        ..Header::new(Opcode::RdmaWrite)
    };
    write_frame(&mut s.peer, h, &[1; 8]);
    match s
        .rx
        .progress(&mut s.ours, &mut s.qp, &mut ReadGate::default())
    {
        RxStop::Refused {
            op,
            status: WcStatus::RemoteAccess,
        } if op.seq == 1 && op.rkey == 0x4200 && op.remote_addr == 64 && op.len == 8 => {}
        other => panic!("{other:?}"),
    }

    // Garbage and frames out of place end the connection.
    let mut s = setup();
    s.peer.write_all(&[0xee; HEADER_LEN]).unwrap();
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Garbage(FrameError::BadMagic { .. })
    ));
    let mut s = setup();
    write_frame(
        &mut s.peer,
        Header {
            len: 96,
            ..Header::new(Opcode::CmReq)
        },
        &[0; 96],
    );
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Unexpected(Opcode::CmReq)
    ));
    let mut s = setup();
    write_frame(
        &mut s.peer,
        Header {
            len: 32,
            ..Header::new(Opcode::CmProof)
        },
        &[0; 32],
    );
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Unexpected(Opcode::CmProof)
    ));
    // A frame of another version on this connection is garbage.
    let mut s = setup();
    s.peer.write_all(&Header::ack(0).to_bytes_as(V1)).unwrap();
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Garbage(FrameError::WrongVersion { .. })
    ));
    let mut s = setup();
    drop(s.peer);
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut ReadGate::default()),
        RxStop::Eof
    ));
}

/// A watched receive side reads only while its gate is open: an empty read closes it,
/// a readiness event opens it, and frames already staged are executed with it closed.
#[test]
fn a_watched_receive_side_reads_only_while_its_gate_is_open() {
    let mut s = setup();
    let dst = s.table.register_buf(MemBuf::zeroed(4096), RW).unwrap();
    let mut gate = ReadGate::default();
    gate.set_watched(true);
    let reads = || READS.with(|r| r.get());

    // Joining opens the gate once; the read finds nothing and closes it.
    let r0 = reads();
    assert!(matches!(
        s.rx.progress(&mut s.ours, &mut s.qp, &mut gate),
        RxStop::Idle
    ));
    assert_eq!(reads() - r0, 1, "one read, EAGAIN");
    assert!(!gate.readable, "an empty read closes the gate");

    // Closed: data waiting in the socket is not read, whatever the number of polls.
    write_frame(&mut s.peer, write_op(1, &dst, 0, 8, None), &[1; 8]);
    write_frame(&mut s.peer, write_op(2, &dst, 8, 8, None), &[2; 8]);
    let r1 = reads();
    for _ in 0..10 {
        s.rx.progress(&mut s.ours, &mut s.qp, &mut gate);
    }
    assert_eq!(reads(), r1, "no read while closed");
    assert_eq!(s.qp.take_ack(), None, "nothing executed");

    // An event opens it: one read takes both frames (fewer bytes than asked: the socket
    // is drained) and closes it again.
    gate.set_readable();
    s.rx.progress(&mut s.ours, &mut s.qp, &mut gate);
    assert_eq!(reads() - r1, 1, "a single short read");
    assert!(!gate.readable, "a short read closes the gate");
    assert_eq!(s.qp.take_ack(), Some(2), "both frames executed");
    let mut out = [0u8; 16];
    dst.read_at(0, &mut out);
    assert_eq!(out, [[1u8; 8], [2u8; 8]].concat()[..]);

    // Unwatched, the gate is always open (a private CQ reads on every poll).
    gate.set_watched(false);
    let r2 = reads();
    s.rx.progress(&mut s.ours, &mut s.qp, &mut gate);
    s.rx.progress(&mut s.ours, &mut s.qp, &mut gate);
    assert_eq!(reads() - r2, 2, "a read per poll");
}
