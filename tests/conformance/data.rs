//! Data-path scenarios: SEND into receives, RDMA WRITE with and without immediate,
//! ordering, signaling and send-queue slots, receive-not-ready.

use rtrs_spdk::fabric::{
    Access, Mr, PostErrorKind, QpCaps, RecvWr, SendOp, Wc, WcOpcode, WcStatus,
};

use super::{
    connect, connect_with, expect, next_wc, pattern, post_send_retrying, read, settle, wait_wr, wr,
    wr_unsignaled, Backend, Side,
};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

pub fn send_into_posted_receive(b: &dyn Backend) {
    let mut p = connect(b);
    let rbuf = p.server.reg(4096, Access::LOCAL_WRITE);
    let sbuf = p.client.reg(4096, Access::NONE);
    let (a, c) = (pattern(3, 24), pattern(4, 16));
    sbuf.write_at(0, &a);
    sbuf.write_at(100, &c);
    p.server.post_recv(&[RecvWr {
        wr_id: 7,
        sge: Some(rbuf.sge(8, 64)),
    }]);
    let sges = [sbuf.sge(0, 24), sbuf.sge(100, 16)];
    p.client.post_send(&[wr(1, SendOp::Send, &sges)]);

    let wc = wait_wr(&mut p.server, &mut p.client, 7);
    expect(&wc, WcStatus::Success, WcOpcode::Recv, "receive of a SEND");
    assert_eq!(wc.byte_len, 40, "byte_len of a 24+16 byte SEND");
    assert_eq!(
        (wc.imm, wc.invalidated_rkey),
        (None, None),
        "plain SEND: {wc:?}"
    );
    assert_eq!(read(&rbuf, 8, 40), [a, c].concat(), "received bytes");
    assert!(
        read(&rbuf, 48, 24).iter().all(|&x| x == 0),
        "bytes past the message untouched"
    );

    let wc = wait_wr(&mut p.client, &mut p.server, 1);
    expect(&wc, WcStatus::Success, WcOpcode::Send, "SEND completion");
}

pub fn send_with_imm_reports_imm(b: &dyn Backend) {
    let mut p = connect(b);
    let rbuf = p.server.reg(4096, Access::LOCAL_WRITE);
    let sbuf = p.client.reg(4096, Access::NONE);
    let msg = pattern(5, 100);
    sbuf.write_at(0, &msg);
    p.server.post_recv(&[RecvWr {
        wr_id: 3,
        sge: Some(rbuf.sge(0, 4096)),
    }]);
    let sges = [sbuf.sge(0, 100)];
    p.client
        .post_send(&[wr(2, SendOp::SendWithImm { imm: 0xdead_beef }, &sges)]);

    let wc = wait_wr(&mut p.server, &mut p.client, 3);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::Recv,
        "receive of a SEND_WITH_IMM",
    );
    assert_eq!((wc.byte_len, wc.imm), (100, Some(0xdead_beef)), "{wc:?}");
    assert_eq!(read(&rbuf, 0, 100), msg);
    let wc = wait_wr(&mut p.client, &mut p.server, 2);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::Send,
        "SEND_WITH_IMM completion",
    );
}

pub fn write_then_imm_is_ordered(b: &dyn Backend) {
    const LEN: usize = 1 << 20;
    let mut p = connect(b);
    let dst = p.server.reg(LEN, RW);
    let src = p.client.reg(LEN, Access::NONE);
    let data = pattern(6, LEN);
    src.write_at(0, &data);
    p.server.post_recv(&[RecvWr {
        wr_id: 9,
        sge: None,
    }]);
    let sges = [src.sge(0, LEN)];
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let imm = SendOp::RdmaWriteWithImm {
        remote_addr: 0,
        rkey: 0,
        imm: 42,
    };
    p.client
        .post_send(&[wr_unsignaled(1, write, &sges), wr(2, imm, &[])]);

    let wc = next_wc(&mut p.server, &mut p.client, "the imm after a 1 MiB write");
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RecvRdmaWithImm,
        "imm after write",
    );
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (9, 0, Some(42)), "{wc:?}");
    assert!(
        read(&dst, 0, LEN) == data,
        "write data not in place when the imm was seen"
    );
    let wc = next_wc(&mut p.client, &mut p.server, "the signaled write-with-imm");
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
        "write-with-imm completion",
    );
    assert_eq!(wc.wr_id, 2, "only the signaled request completes");
}

pub fn many_operations_stay_in_order(b: &dyn Backend) {
    const N: usize = 128;
    const SLOT: usize = 64;
    let caps = b.caps();
    assert!(
        caps.max_recv_wr as usize >= N && caps.max_send_wr >= 16,
        "caps too small: {caps:?}"
    );
    let mut p = connect(b);
    let dst = p.server.reg(N * SLOT, RW);
    let src = p.client.reg(N * SLOT, Access::NONE);
    for i in 0..N {
        src.write_at(i * SLOT, &pattern(i as u8, SLOT));
    }
    let recvs: Vec<RecvWr> = (0..N)
        .map(|i| RecvWr {
            wr_id: 1000 + i as u64,
            sge: None,
        })
        .collect();
    p.server.post_recv(&recvs);
    for i in 0..N {
        let sges = [src.sge(i * SLOT, SLOT)];
        let remote_addr = dst.addr() + (i * SLOT) as u64;
        let write = SendOp::RdmaWrite {
            remote_addr,
            rkey: dst.rkey(),
        };
        let imm = SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm: i as u32,
        };
        let mut second = wr_unsignaled(i as u64, imm, &[]);
        second.signaled = i % 8 == 7;
        post_send_retrying(
            &mut p.client,
            &mut p.server,
            &[wr_unsignaled(0, write, &sges), second],
        );
    }
    for i in 0..N {
        let wc = next_wc(&mut p.server, &mut p.client, "the next imm");
        expect(
            &wc,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            "in-order imm",
        );
        assert_eq!(
            (wc.wr_id, wc.imm),
            (1000 + i as u64, Some(i as u32)),
            "imm order: {wc:?}"
        );
        assert_eq!(
            read(&dst, i * SLOT, SLOT),
            pattern(i as u8, SLOT),
            "slot {i} at its imm"
        );
    }
    for k in 0..N / 8 {
        let wc = next_wc(&mut p.client, &mut p.server, "the next signaled completion");
        expect(
            &wc,
            WcStatus::Success,
            WcOpcode::RdmaWrite,
            "signaled write-with-imm",
        );
        assert_eq!(wc.wr_id, (k * 8 + 7) as u64, "completion order");
    }
}

pub fn write_with_imm_reports_len_and_imm(b: &dyn Backend) {
    let mut p = connect(b);
    let dst = p.server.reg(8192, RW);
    let src = p.client.reg(8192, Access::NONE);
    let data = pattern(8, 3000);
    src.write_at(0, &data[..1000]);
    src.write_at(5000, &data[1000..]);
    p.server.post_recv(&[RecvWr {
        wr_id: 4,
        sge: None,
    }]);
    let sges = [src.sge(0, 1000), src.sge(5000, 2000)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr() + 512,
        rkey: dst.rkey(),
        imm: 77,
    };
    p.client.post_send(&[wr(5, op, &sges)]);

    let wc = wait_wr(&mut p.server, &mut p.client, 4);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RecvRdmaWithImm,
        "write-with-imm receive",
    );
    assert_eq!((wc.byte_len, wc.imm), (3000, Some(77)), "{wc:?}");
    assert_eq!(read(&dst, 512, 3000), data);
    let wc = wait_wr(&mut p.client, &mut p.server, 5);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
        "write-with-imm completion",
    );
}

pub fn zero_length_write_with_imm_needs_no_key(b: &dyn Backend) {
    let mut p = connect(b);
    p.server.post_recv(&[
        RecvWr {
            wr_id: 1,
            sge: None,
        },
        RecvWr {
            wr_id: 2,
            sge: None,
        },
    ]);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: 0,
        rkey: 0,
        imm: 0x1234_5678,
    };
    let plain = SendOp::RdmaWrite {
        remote_addr: 0,
        rkey: 0,
    };
    p.client
        .post_send(&[wr(9, plain, &[]), wr(10, op, &[]), wr(11, op, &[])]);
    let wc = wait_wr(&mut p.client, &mut p.server, 9);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
        "zero-length write with rkey 0",
    );
    for (recv, send) in [(1, 10), (2, 11)] {
        let wc = wait_wr(&mut p.server, &mut p.client, recv);
        expect(
            &wc,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            "zero-length imm receive",
        );
        assert_eq!((wc.byte_len, wc.imm), (0, Some(0x1234_5678)), "{wc:?}");
        let wc = wait_wr(&mut p.client, &mut p.server, send);
        expect(
            &wc,
            WcStatus::Success,
            WcOpcode::RdmaWrite,
            "zero-length imm completion",
        );
    }
}

pub fn unsignaled_requests_free_slots(b: &dyn Backend) {
    let caps = QpCaps {
        max_send_wr: 8,
        ..b.caps()
    };
    let mut p = connect_with(b, caps, &[], &[]);
    let depth = p.client.conn.caps().max_send_wr as usize;
    let dst = p.server.reg(64, RW);
    let src = p.client.reg(64, Access::NONE);
    let sges = [src.sge(0, 64)];
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    for round in 0..5u64 {
        for i in 0..depth as u64 {
            let mut w = wr_unsignaled(round * 1000 + i, op, &sges);
            w.signaled = i + 1 == depth as u64;
            if let Err(e) = p.client.try_post_send(&[w]) {
                panic!("round {round}, request {i} of {depth}: {e} (slots not freed?)");
            }
        }
        let wc = wait_wr(
            &mut p.client,
            &mut p.server,
            round * 1000 + depth as u64 - 1,
        );
        expect(
            &wc,
            WcStatus::Success,
            WcOpcode::RdmaWrite,
            "signaled write",
        );
    }
    settle(&mut p.client, &mut p.server);
    let extra = p.client.drain_wcs();
    assert!(
        extra.is_empty(),
        "unsignaled requests generated completions: {extra:?}"
    );
}

pub fn queue_full_without_signaling(b: &dyn Backend) {
    let caps = QpCaps {
        max_send_wr: 8,
        ..b.caps()
    };
    let mut p = connect_with(b, caps, &[], &[]);
    let depth = p.client.conn.caps().max_send_wr as usize;
    let dst = p.server.reg(64 * (depth + 1), RW);
    let src = p.client.reg(64, Access::NONE);
    src.write_at(0, &pattern(9, 64));
    let sges = [src.sge(0, 64)];
    let ops: Vec<SendOp> = (0..=depth)
        .map(|i| SendOp::RdmaWrite {
            remote_addr: dst.addr() + 64 * i as u64,
            rkey: dst.rkey(),
        })
        .collect();
    let wrs: Vec<_> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| wr_unsignaled(i as u64, *op, &sges))
        .collect();
    let err = p
        .client
        .try_post_send(&wrs)
        .expect_err("a chain one longer than the send queue");
    assert_eq!(
        (err.index, err.kind),
        (depth, PostErrorKind::QueueFull),
        "{err}"
    );
    settle(&mut p.client, &mut p.server);
    // The accepted requests still execute; the refused one does not.
    for i in 0..depth {
        assert_eq!(
            read(&dst, 64 * i, 64),
            pattern(9, 64),
            "unsignaled write {i}"
        );
    }
    assert!(
        read(&dst, 64 * depth, 64).iter().all(|&x| x == 0),
        "refused write executed"
    );
    assert!(
        p.client.drain_wcs().is_empty(),
        "unsignaled writes completed"
    );
}

/// The contract: a slot is held "until a completion is generated for it or for a later
/// request", not merely until the peer executed the request (verbs frees send-queue
/// entries only as completions are polled).
pub fn unsignaled_slots_held_until_a_completion(b: &dyn Backend) {
    let caps = QpCaps {
        max_send_wr: 8,
        ..b.caps()
    };
    let mut p = connect_with(b, caps, &[], &[]);
    let depth = p.client.conn.caps().max_send_wr as usize;
    let dst = p.server.reg(64, RW);
    let src = p.client.reg(64, Access::NONE);
    let sges = [src.sge(0, 64)];
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let wrs: Vec<_> = (0..depth as u64)
        .map(|i| wr_unsignaled(i, op, &sges))
        .collect();
    p.client.post_send(&wrs);
    settle(&mut p.client, &mut p.server);
    let err = p.client.try_post_send(&[wr(99, op, &sges)]).expect_err(
        "posting after the peer executed unsignaled requests that no completion covered",
    );
    assert_eq!(
        (err.index, err.kind),
        (0, PostErrorKind::QueueFull),
        "{err}"
    );
}

/// `writer` writes `len` bytes of `seed`'s pattern into a new region of `reader` with
/// RDMA_WRITE_WITH_IMM `imm` (send wr_id 2), into a receive posted there (wr_id 1);
/// returns the written region, the bytes, and the writer's source region, which the
/// caller keeps registered until the write completes: a device may read it at any time
/// until then (rxe on Linux 6.12 reads it from a work queue, after the post returned).
fn post_write_with_imm(
    writer: &mut Side,
    reader: &mut Side,
    len: usize,
    seed: u8,
    imm: u32,
) -> (Mr, Vec<u8>, Mr) {
    let dst = reader.reg(len, RW);
    let src = writer.reg(len, Access::NONE);
    let data = pattern(seed, len);
    src.write_at(0, &data);
    reader.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }]);
    let sges = [src.sge(0, len)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        imm,
    };
    writer.post_send(&[wr(2, op, &sges)]);
    (dst, data, src)
}

/// The reader's completion `wc` of [`post_write_with_imm`]: `data` with `imm` in `dst`.
fn expect_write_with_imm(wc: &Wc, dst: &Mr, data: &[u8], imm: u32, what: &str) {
    expect(wc, WcStatus::Success, WcOpcode::RecvRdmaWithImm, what);
    assert_eq!(
        (wc.byte_len as usize, wc.imm),
        (data.len(), Some(imm)),
        "{wc:?}"
    );
    assert!(read(dst, 0, data.len()) == data, "data of the {what}");
}

/// The acceptor writes into the connector's memory (RTRS's read path), with an imm.
pub fn server_writes_into_client(b: &dyn Backend) {
    let mut p = connect(b);
    let (dst, data, _src) = post_write_with_imm(&mut p.server, &mut p.client, 65536, 15, 3);
    let wc = wait_wr(&mut p.client, &mut p.server, 1);
    expect_write_with_imm(&wc, &dst, &data, 3, "server's write-with-imm");
    let wc = wait_wr(&mut p.server, &mut p.client, 2);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
        "server's write completion",
    );
}

/// `Conn::push`: what was posted goes out without the poster polling again, so the
/// peer alone, polling, receives it (a fabric that sent only at the next poll would never
/// deliver it here).
pub fn push_transmits_without_another_poll(b: &dyn Backend) {
    let mut p = connect(b);
    let (dst, data, _src) = post_write_with_imm(&mut p.client, &mut p.server, 4096, 21, 21);
    p.client.conn.push();
    let start = std::time::Instant::now();
    while !p.server.pending_wcs().iter().any(|w| w.wr_id == 1) {
        if start.elapsed() >= super::DEADLINE {
            // The writer's completions tell a write that was never sent from one that
            // failed.
            p.client.pump();
            panic!(
                "the pushed write never reached the peer polling alone; the writer's \
                 completions, polled afterwards: {:?}",
                p.client.pending_wcs()
            );
        }
        if !p.server.pump() {
            std::thread::yield_now();
        }
    }
    let wc = wait_wr(&mut p.server, &mut p.client, 1);
    expect_write_with_imm(&wc, &dst, &data, 21, "pushed write-with-imm");
    let wc = wait_wr(&mut p.client, &mut p.server, 2);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RdmaWrite,
        "pushed write's completion",
    );
}

pub fn receive_not_ready_waits(b: &dyn Backend) {
    let mut p = connect(b);
    let rbuf = p.server.reg(4096, RW);
    let src = p.client.reg(4096, Access::NONE);
    let (a, x, c) = (pattern(10, 32), pattern(11, 64), pattern(12, 48));
    src.write_at(0, &a);
    src.write_at(100, &x);
    src.write_at(200, &c);
    let (sa, sx, sc) = ([src.sge(0, 32)], [src.sge(100, 64)], [src.sge(200, 48)]);
    let write = SendOp::RdmaWrite {
        remote_addr: rbuf.addr() + 1024,
        rkey: rbuf.rkey(),
    };
    p.client.post_send(&[
        wr(1, SendOp::Send, &sa),
        wr(2, write, &sx),
        wr(3, SendOp::SendWithImm { imm: 5 }, &sc),
    ]);
    settle(&mut p.client, &mut p.server);
    assert!(
        p.server.drain_wcs().is_empty(),
        "receive completions with no receive posted"
    );
    assert!(
        p.client.drain_wcs().is_empty(),
        "a SEND completed before the peer had a receive"
    );
    assert!(
        read(&rbuf, 1024, 64).iter().all(|&v| v == 0),
        "a write overtook a waiting SEND"
    );

    p.server.post_recv(&[
        RecvWr {
            wr_id: 11,
            sge: Some(rbuf.sge(0, 128)),
        },
        RecvWr {
            wr_id: 12,
            sge: Some(rbuf.sge(128, 128)),
        },
    ]);
    let wc = next_wc(&mut p.server, &mut p.client, "the delayed SEND");
    expect(&wc, WcStatus::Success, WcOpcode::Recv, "delayed SEND");
    assert_eq!((wc.wr_id, wc.byte_len), (11, 32), "{wc:?}");
    let wc = next_wc(&mut p.server, &mut p.client, "the SEND_WITH_IMM behind it");
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::Recv,
        "SEND_WITH_IMM behind",
    );
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (12, 48, Some(5)), "{wc:?}");
    assert_eq!(read(&rbuf, 0, 32), a);
    assert_eq!(read(&rbuf, 1024, 64), x, "the write behind the SEND");
    assert_eq!(read(&rbuf, 128, 48), c);
    for id in 1..=3 {
        let wc = next_wc(&mut p.client, &mut p.server, "the sends, in order");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
}
