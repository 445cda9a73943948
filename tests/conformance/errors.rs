//! Error scenarios: remote access violations, local protection and length errors, post
//! errors, disconnect with outstanding work.

use rtrs_spdk::fabric::{
    Access, KeyScope, Mr, PostErrorKind, QpCaps, RecvWr, SendOp, Sge, WcOpcode, WcStatus,
};

use super::{
    bogus_rkey, connect, connect_with, expect, pattern, read, settle, wait_both_disconnected,
    wait_wr, wr, Backend, Pair,
};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// After a break: both sides refuse posts with `NotConnected` at index 0.
pub fn assert_posts_refused(p: &mut Pair) {
    let src = p.client.reg(64, Access::NONE);
    let sges = [src.sge(0, 64)];
    let send = [wr(900, SendOp::Send, &sges)];
    for side in [&mut p.client, &mut p.server] {
        let err = side
            .try_post_send(&send)
            .expect_err("post_send after the break");
        assert_eq!(
            (err.index, err.kind),
            (0, PostErrorKind::NotConnected),
            "{err}"
        );
        let err = side
            .conn
            .post_recv(&[RecvWr {
                wr_id: 901,
                sge: None,
            }])
            .expect_err("post_recv");
        assert_eq!(
            (err.index, err.kind),
            (0, PostErrorKind::NotConnected),
            "{err}"
        );
    }
}

/// A write the server must refuse: the client's request completes with RemoteAccess,
/// the request behind it and both sides' receives flush, both sides disconnect.
fn remote_violation(b: &dyn Backend, access: Access, target: impl Fn(&Mr) -> (u64, u32)) {
    let mut p = connect(b);
    let dst = p.server.reg(4096, access);
    let rbuf = p.server.reg(64, Access::LOCAL_WRITE);
    let src = p.client.reg(4096, Access::LOCAL_WRITE);
    src.write_at(0, &pattern(13, 64));
    p.server.post_recv(&[RecvWr {
        wr_id: 50,
        sge: Some(rbuf.sge(0, 64)),
    }]);
    p.client.post_recv(&[RecvWr {
        wr_id: 60,
        sge: Some(src.sge(1024, 64)),
    }]);
    let (remote_addr, rkey) = target(&dst);
    let sges = [src.sge(0, 64)];
    let bad = SendOp::RdmaWrite { remote_addr, rkey };
    let good_target = p.server.reg(64, RW);
    let good = SendOp::RdmaWrite {
        remote_addr: good_target.addr(),
        rkey: good_target.rkey(),
    };
    // Unsignaled: a failure generates a completion all the same.
    let mut first = wr(1, bad, &sges);
    first.signaled = false;
    p.client.post_send(&[first, wr(2, good, &sges)]);

    let wc = wait_wr(&mut p.client, &mut p.server, 1);
    expect(
        &wc,
        WcStatus::RemoteAccess,
        WcOpcode::RdmaWrite,
        "refused write",
    );
    let wc = wait_wr(&mut p.client, &mut p.server, 2);
    expect(
        &wc,
        WcStatus::WrFlush,
        WcOpcode::RdmaWrite,
        "the write behind the refused one",
    );
    let wc = wait_wr(&mut p.client, &mut p.server, 60);
    expect(
        &wc,
        WcStatus::WrFlush,
        WcOpcode::Recv,
        "client receive after the break",
    );
    let wc = wait_wr(&mut p.server, &mut p.client, 50);
    expect(
        &wc,
        WcStatus::WrFlush,
        WcOpcode::Recv,
        "server receive after the break",
    );
    wait_both_disconnected(&mut p);
    assert!(
        read(&good_target, 0, 64).iter().all(|&x| x == 0),
        "a flushed write executed"
    );
    if access.contains(Access::REMOTE_WRITE) {
        assert!(
            read(&dst, 0, 4096).iter().all(|&x| x == 0),
            "refused write touched memory"
        );
    }
    assert_posts_refused(&mut p);
}

pub fn unknown_rkey_breaks_connection(b: &dyn Backend) {
    remote_violation(b, RW, |dst| (dst.addr(), bogus_rkey(dst.rkey())));
}

pub fn write_past_region_end_is_remote_access(b: &dyn Backend) {
    remote_violation(b, RW, |dst| {
        (dst.addr() + dst.len() as u64 - 32, dst.rkey())
    });
}

pub fn write_without_remote_write_right_is_remote_access(b: &dyn Backend) {
    remote_violation(b, Access::LOCAL_WRITE, |dst| (dst.addr(), dst.rkey()));
}

/// A write whose local SGE is `bad(src)` completes with `status` (LocalProtection, but
/// see [`super::Quirks`]; a device that flushes a local error reports `WrFlush`) and
/// writes nothing.
fn local_violation(b: &dyn Backend, status: WcStatus, bad: impl Fn(&Mr) -> Sge) {
    let status = b.quirks().local_error(status);
    let mut p = connect(b);
    let dst = p.server.reg(4096, RW);
    let src = p.client.reg(4096, Access::NONE);
    src.write_at(0, &pattern(14, 4096));
    let sges = [bad(&src)];
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    p.client.post_send(&[wr(1, op, &sges)]);
    let wc = wait_wr(&mut p.client, &mut p.server, 1);
    expect(&wc, status, WcOpcode::RdmaWrite, "write from a bad SGE");
    settle(&mut p.client, &mut p.server);
    assert!(
        read(&dst, 0, 4096).iter().all(|&x| x == 0),
        "bytes from a bad SGE arrived"
    );
}

pub fn bad_lkey_is_local_protection(b: &dyn Backend) {
    local_violation(b, b.quirks().unknown_lkey(), |src| Sge {
        lkey: bogus_rkey(src.lkey()),
        ..src.sge(0, 64)
    });
}

pub fn sge_outside_region_is_local_protection(b: &dyn Backend) {
    local_violation(b, WcStatus::LocalProtection, |src| Sge {
        addr: src.addr() + src.len() as u64 - 16,
        len: 64,
        lkey: src.lkey(),
    });
}

pub fn short_receive_buffer_is_local_length(b: &dyn Backend) {
    let mut p = connect(b);
    let rbuf = p.server.reg(4096, Access::LOCAL_WRITE);
    let src = p.client.reg(4096, Access::NONE);
    p.server.post_recv(&[RecvWr {
        wr_id: 5,
        sge: Some(rbuf.sge(0, 16)),
    }]);
    let sges = [src.sge(0, 32)];
    p.client.post_send(&[wr(6, SendOp::Send, &sges)]);
    let wc = wait_wr(&mut p.server, &mut p.client, 5);
    expect(
        &wc,
        b.quirks().local_length(),
        WcOpcode::Recv,
        "32 bytes into a 16-byte receive",
    );
    let wc = wait_wr(&mut p.client, &mut p.server, 6);
    assert_ne!(
        wc.status,
        WcStatus::Success,
        "the sender of a too-long message: {wc:?}"
    );
    assert!(
        read(&rbuf, 16, 64).iter().all(|&x| x == 0),
        "bytes past the receive buffer"
    );
}

/// A receive whose buffer names an unknown lkey fails when a message lands in it.
pub fn receive_with_bad_lkey_is_local_protection(b: &dyn Backend) {
    let mut p = connect(b);
    let rbuf = p.server.reg(4096, Access::LOCAL_WRITE);
    let src = p.client.reg(4096, Access::NONE);
    let sge = Sge {
        lkey: bogus_rkey(rbuf.lkey()),
        ..rbuf.sge(0, 64)
    };
    p.server.post_recv(&[RecvWr {
        wr_id: 5,
        sge: Some(sge),
    }]);
    let sges = [src.sge(0, 16)];
    p.client.post_send(&[wr(6, SendOp::Send, &sges)]);
    let wc = wait_wr(&mut p.server, &mut p.client, 5);
    expect(
        &wc,
        b.quirks().unknown_lkey(),
        WcOpcode::Recv,
        "a SEND into a bad receive",
    );
    let wc = wait_wr(&mut p.client, &mut p.server, 6);
    assert_ne!(
        wc.status,
        WcStatus::Success,
        "the sender into a bad receive: {wc:?}"
    );
}

pub fn post_errors_name_the_index(b: &dyn Backend) {
    let caps = QpCaps {
        max_recv_wr: 8,
        ..b.caps()
    };
    let mut p = connect_with(b, caps, &[], &[]);
    let dst = p.server.reg(4096, RW);
    let src = p.client.reg(4096, Access::NONE);
    let one = [src.sge(0, 8)];
    let too_many: Vec<Sge> = (0..=p.client.conn.caps().max_send_sge as usize)
        .map(|i| src.sge(i * 8, 8))
        .collect();
    let op = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let chain = [
        wr(1, op, &one),
        wr(2, op, &one),
        wr(3, op, &too_many),
        wr(4, op, &one),
    ];
    let err = p
        .client
        .try_post_send(&chain)
        .expect_err("a chain with too many SGEs at 2");
    assert_eq!(
        (err.index, err.kind),
        (2, PostErrorKind::TooManySge),
        "{err}"
    );
    for id in [1, 2] {
        let wc = wait_wr(&mut p.client, &mut p.server, id);
        expect(
            &wc,
            WcStatus::Success,
            WcOpcode::RdmaWrite,
            "requests before the bad one",
        );
    }

    let slot = p
        .client
        .fabric
        .alloc_fast_mr(KeyScope::Connection)
        .expect("alloc_fast_mr");
    let inv = [wr(7, SendOp::LocalInv { slot: &slot }, &one)];
    let err = p
        .client
        .try_post_send(&inv)
        .expect_err("SGEs on a LOCAL_INV");
    assert_eq!(
        (err.index, err.kind),
        (0, PostErrorKind::TooManySge),
        "{err}"
    );

    let depth = p.server.conn.caps().max_recv_wr as usize;
    let recvs: Vec<RecvWr> = (0..=depth)
        .map(|i| RecvWr {
            wr_id: 100 + i as u64,
            sge: None,
        })
        .collect();
    let err = p
        .server
        .conn
        .post_recv(&recvs)
        .expect_err("one receive more than the queue holds");
    assert_eq!(
        (err.index, err.kind),
        (depth, PostErrorKind::QueueFull),
        "{err}"
    );

    settle(&mut p.client, &mut p.server);
    let late = p.client.drain_wcs();
    assert!(late.is_empty(), "refused requests completed: {late:?}");
}

/// Client sends wait on a receive-less server; the client disconnects: its sends and
/// receives flush, both sides disconnect, posts are refused.
pub fn disconnect_flushes_outstanding_work(b: &dyn Backend) {
    let mut p = connect(b);
    let src = p.client.reg(4096, Access::LOCAL_WRITE);
    p.client.post_recv(&[
        RecvWr {
            wr_id: 60,
            sge: Some(src.sge(1024, 64)),
        },
        RecvWr {
            wr_id: 61,
            sge: None,
        },
    ]);
    let sges = [src.sge(0, 64)];
    p.client.post_send(&[
        wr(1, SendOp::Send, &sges),
        wr(2, SendOp::Send, &sges),
        wr(3, SendOp::Send, &sges),
    ]);
    settle(&mut p.client, &mut p.server);
    p.client.conn.disconnect();
    for (id, opcode) in [
        (1, WcOpcode::Send),
        (2, WcOpcode::Send),
        (3, WcOpcode::Send),
        (60, WcOpcode::Recv),
        (61, WcOpcode::Recv),
    ] {
        let wc = wait_wr(&mut p.client, &mut p.server, id);
        expect(
            &wc,
            WcStatus::WrFlush,
            opcode,
            "outstanding work at disconnect",
        );
    }
    wait_both_disconnected(&mut p);
    assert_posts_refused(&mut p);
}

/// The peer of a disconnecting side flushes its posted receives.
pub fn disconnect_flushes_peer_receives(b: &dyn Backend) {
    let mut p = connect(b);
    let rbuf = p.server.reg(4096, Access::LOCAL_WRITE);
    p.server.post_recv(&[
        RecvWr {
            wr_id: 1,
            sge: Some(rbuf.sge(0, 64)),
        },
        RecvWr {
            wr_id: 2,
            sge: None,
        },
        RecvWr {
            wr_id: 3,
            sge: Some(rbuf.sge(64, 64)),
        },
    ]);
    settle(&mut p.client, &mut p.server);
    p.client.conn.disconnect();
    for id in 1..=3 {
        let wc = wait_wr(&mut p.server, &mut p.client, id);
        expect(
            &wc,
            WcStatus::WrFlush,
            WcOpcode::Recv,
            "server receive at peer disconnect",
        );
    }
    wait_both_disconnected(&mut p);
    let extra: Vec<_> = p.server.drain_wcs();
    assert!(
        extra.is_empty(),
        "more completions than posted receives: {extra:?}"
    );
}
