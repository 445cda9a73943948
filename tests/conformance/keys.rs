//! Fast-registration scenarios: binding a slot with REG_MR, retiring its rkey with
//! LOCAL_INV or a peer's SEND_WITH_INV, in both key scopes where both must behave alike.

use rtrs_spdk::fabric::{
    inc_rkey, Access, FastMr, KeyScope, Mr, RecvWr, SendOp, WcOpcode, WcStatus,
};

use super::{
    connect, expect, next_wc, pattern, read, wait_both_disconnected, wait_wr, wr, Backend, Pair,
};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// Posts a signaled REG_MR of `slot` to `[offset, offset+len)` of `region` on the
/// server and waits for its completion; returns the new rkey.
pub fn bind(p: &mut Pair, slot: &FastMr, region: &Mr, offset: usize, len: u32, wr_id: u64) -> u32 {
    let rkey = inc_rkey(slot.rkey());
    let op = SendOp::RegMr {
        slot,
        region,
        addr: region.addr() + offset as u64,
        len,
        access: RW,
        rkey,
    };
    p.server.post_send(&[wr(wr_id, op, &[])]);
    let wc = wait_wr(&mut p.server, &mut p.client, wr_id);
    expect(&wc, WcStatus::Success, WcOpcode::RegMr, "REG_MR");
    assert_eq!(slot.rkey(), rkey, "the slot's rkey after posting REG_MR");
    rkey
}

/// Both scopes, Domain first.
const SCOPES: [KeyScope; 2] = [KeyScope::Domain, KeyScope::Connection];

/// A fresh slot of `scope` on the server's fabric.
fn slot(p: &Pair, scope: KeyScope) -> FastMr {
    p.server
        .fabric
        .alloc_fast_mr(scope)
        .unwrap_or_else(|e| panic!("alloc_fast_mr({scope:?}): {e}"))
}

/// Retires `slot`'s key on the server with a signaled LOCAL_INV.
fn local_inv(p: &mut Pair, slot: &FastMr, wr_id: u64) {
    p.server
        .post_send(&[wr(wr_id, SendOp::LocalInv { slot }, &[])]);
    let wc = wait_wr(&mut p.server, &mut p.client, wr_id);
    expect(&wc, WcStatus::Success, WcOpcode::LocalInv, "LOCAL_INV");
}

/// The client writes `seed`'s pattern through `(addr, rkey)` followed by an imm; checks
/// the server sees the imm with the data at `region[offset..]`.
pub fn write_ok(p: &mut Pair, region: &Mr, offset: usize, rkey: u32, seed: u8) {
    let src = p.client.reg(256, Access::NONE);
    let data = pattern(seed, 256);
    src.write_at(0, &data);
    let sges = [src.sge(0, 256)];
    let remote_addr = region.addr() + offset as u64;
    p.server.post_recv(&[RecvWr {
        wr_id: 700 + seed as u64,
        sge: None,
    }]);
    let imm = SendOp::RdmaWriteWithImm {
        remote_addr: 0,
        rkey: 0,
        imm: seed as u32,
    };
    p.client.post_send(&[
        wr(
            600 + seed as u64,
            SendOp::RdmaWrite { remote_addr, rkey },
            &sges,
        ),
        wr(650 + seed as u64, imm, &[]),
    ]);
    let wc = next_wc(
        &mut p.server,
        &mut p.client,
        "the imm after a write through a fast MR",
    );
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::RecvRdmaWithImm,
        "imm after a fast-MR write",
    );
    assert_eq!(wc.imm, Some(seed as u32), "{wc:?}");
    assert_eq!(
        read(region, offset, 256),
        data,
        "data written through rkey {rkey:#x}"
    );
    for id in [600 + seed as u64, 650 + seed as u64] {
        let wc = wait_wr(&mut p.client, &mut p.server, id);
        expect(
            &wc,
            WcStatus::Success,
            WcOpcode::RdmaWrite,
            "write through a fast MR",
        );
    }
}

/// The client writes through `rkey`; the write is refused and the connection breaks.
pub fn write_refused(p: &mut Pair, region: &Mr, offset: usize, rkey: u32) {
    let src = p.client.reg(64, Access::NONE);
    let sges = [src.sge(0, 64)];
    let op = SendOp::RdmaWrite {
        remote_addr: region.addr() + offset as u64,
        rkey,
    };
    p.client.post_send(&[wr(800, op, &sges)]);
    let wc = wait_wr(&mut p.client, &mut p.server, 800);
    expect(
        &wc,
        WcStatus::RemoteAccess,
        WcOpcode::RdmaWrite,
        "write through a retired rkey",
    );
    wait_both_disconnected(p);
}

pub fn reg_mr_binds_new_rkey(b: &dyn Backend) {
    for scope in SCOPES {
        let mut p = connect(b);
        let region = p.server.reg(8192, RW);
        let slot = slot(&p, scope);
        let r1 = bind(&mut p, &slot, &region, 4096, 4096, 1);
        write_ok(&mut p, &region, 4096 + 100, r1, 1);
        // Rebinding: retire the old key, bind the slot elsewhere under the next key, in
        // one chain.
        let r2 = inc_rkey(r1);
        let op = SendOp::RegMr {
            slot: &slot,
            region: &region,
            addr: region.addr(),
            len: 4096,
            access: RW,
            rkey: r2,
        };
        p.server
            .post_send(&[wr(2, SendOp::LocalInv { slot: &slot }, &[]), wr(3, op, &[])]);
        expect(
            &wait_wr(&mut p.server, &mut p.client, 2),
            WcStatus::Success,
            WcOpcode::LocalInv,
            "LOCAL_INV",
        );
        expect(
            &wait_wr(&mut p.server, &mut p.client, 3),
            WcStatus::Success,
            WcOpcode::RegMr,
            "REG_MR",
        );
        assert_ne!(r1, r2, "rebinding changes the key ({scope:?})");
        assert_eq!(
            slot.rkey(),
            r2,
            "the slot's key after the rebinding ({scope:?})"
        );
        write_ok(&mut p, &region, 0, r2, 2);
        // And a third time: a key that served before is not reused for the next.
        local_inv(&mut p, &slot, 4);
        let r3 = bind(&mut p, &slot, &region, 0, 8192, 5);
        write_ok(&mut p, &region, 5000, r3, 6);
        write_refused(&mut p, &region, 4096 + 100, r1);
    }
}

pub fn local_inv_retires_rkey(b: &dyn Backend) {
    for scope in SCOPES {
        let mut p = connect(b);
        let region = p.server.reg(4096, RW);
        let slot = slot(&p, scope);
        let r1 = bind(&mut p, &slot, &region, 0, 4096, 1);
        write_ok(&mut p, &region, 0, r1, 3);
        local_inv(&mut p, &slot, 2);
        write_refused(&mut p, &region, 0, r1);
    }
}

/// `FabricCaps::local_ops_at_post`: a LOCAL_INV retires its key before its completion
/// is polled, so a write through the key that the peer posts right after is refused
/// (on loopback the write executes within the peer's post, before the server polls at
/// all). Fabrics that do not promise it are skipped.
pub fn local_ops_take_effect_at_post(b: &dyn Backend) {
    let mut p = connect(b);
    if !p.server.fabric.caps().local_ops_at_post {
        return;
    }
    let region = p.server.reg(4096, RW);
    let slot = slot(&p, KeyScope::Domain);
    let r1 = bind(&mut p, &slot, &region, 0, 4096, 1);
    write_ok(&mut p, &region, 0, r1, 5);
    // Posted, its completion not polled: the key refuses the client's write already.
    p.server
        .post_send(&[wr(2, SendOp::LocalInv { slot: &slot }, &[])]);
    write_refused(&mut p, &region, 0, r1);
}

/// `Conn::local_now`: where local operations take effect at post, a slot is bound and
/// its key retired at once with no work request (no completion follows either; the next
/// posted REG_MR's is the first), a write through the key works in between and is
/// refused after, and a slot that is not bound fails as a LOCAL_INV of it would,
/// breaking the connection. Elsewhere there is no such path.
pub fn local_ops_done_at_once_without_a_work_request(b: &dyn Backend) {
    for scope in SCOPES {
        let mut p = connect(b);
        let slot = slot(&p, scope);
        let region = p.server.reg(8192, RW);
        let r1 = inc_rkey(slot.rkey());
        let reg = |rkey, offset: u64| SendOp::RegMr {
            slot: &slot,
            region: &region,
            addr: region.addr() + offset,
            len: 4096,
            access: RW,
            rkey,
        };
        if !p.server.fabric.caps().local_ops_at_post {
            assert_eq!(p.server.conn.local_now(&reg(r1, 0)), None);
            assert_eq!(
                p.server.conn.local_now(&SendOp::LocalInv { slot: &slot }),
                None
            );
            return;
        }
        assert_eq!(
            p.server.conn.local_now(&reg(r1, 0)),
            Some(Ok(())),
            "{scope:?}"
        );
        assert_eq!(slot.rkey(), r1);
        write_ok(&mut p, &region, 0, r1, 7);
        assert_eq!(
            p.server.conn.local_now(&SendOp::LocalInv { slot: &slot }),
            Some(Ok(())),
            "{scope:?}"
        );
        let r2 = inc_rkey(r1);
        p.server.post_send(&[wr(3, reg(r2, 4096), &[])]);
        let wc = next_wc(
            &mut p.server,
            &mut p.client,
            "the REG_MR after the local ones",
        );
        assert_eq!(wc.wr_id, 3, "a completion before the REG_MR's: {wc:?}");
        expect(&wc, WcStatus::Success, WcOpcode::RegMr, "REG_MR");
        write_ok(&mut p, &region, 4096, r2, 8);
        write_refused(&mut p, &region, 0, r1);

        let mut p = connect(b);
        let unbound = self::slot(&p, scope);
        assert_eq!(
            p.server
                .conn
                .local_now(&SendOp::LocalInv { slot: &unbound }),
            Some(Err(WcStatus::LocalQpOperation)),
            "a slot never bound ({scope:?})"
        );
        wait_both_disconnected(&mut p);
    }
}

pub fn send_with_inv_retires_peer_rkey(b: &dyn Backend) {
    let mut p = connect(b);
    let region = p.server.reg(4096, RW);
    let slot = slot(&p, KeyScope::Connection);
    let r1 = bind(&mut p, &slot, &region, 0, 4096, 1);
    write_ok(&mut p, &region, 512, r1, 4);
    p.server.post_recv(&[RecvWr {
        wr_id: 20,
        sge: None,
    }]);
    p.client
        .post_send(&[wr(21, SendOp::SendWithInv { rkey: r1 }, &[])]);
    let wc = wait_wr(&mut p.server, &mut p.client, 20);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::Recv,
        "receive of a SEND_WITH_INV",
    );
    let reported = if b.quirks().no_invalidated_rkey {
        None
    } else {
        Some(r1)
    };
    assert_eq!((wc.byte_len, wc.invalidated_rkey), (0, reported), "{wc:?}");
    let wc = wait_wr(&mut p.client, &mut p.server, 21);
    expect(
        &wc,
        WcStatus::Success,
        WcOpcode::Send,
        "SEND_WITH_INV completion",
    );
    write_refused(&mut p, &region, 512, r1);
}

/// Sends a SEND_WITH_INV of `rkey` from the client, which the server must refuse: the
/// sender's request fails (or, on a device that does not tell the sender, the
/// receiver's receive does) and the connection breaks.
fn inv_refused(b: &dyn Backend, p: &mut Pair, rkey: u32, what: &str) {
    p.server.post_recv(&[RecvWr {
        wr_id: 30,
        sge: None,
    }]);
    p.client
        .post_send(&[wr(31, SendOp::SendWithInv { rkey }, &[])]);
    let (wc, side) = if b.quirks().refused_inv_succeeds_at_sender {
        (wait_wr(&mut p.server, &mut p.client, 30), "receiver")
    } else {
        (wait_wr(&mut p.client, &mut p.server, 31), "sender")
    };
    assert_ne!(
        wc.status,
        WcStatus::Success,
        "{what}, at the {side}: {wc:?}"
    );
    wait_both_disconnected(p);
}

/// A SEND_WITH_INV naming a key the peer cannot invalidate is refused: the sender's
/// request fails and the connection breaks.
pub fn send_with_inv_of_unknown_rkey_is_refused(b: &dyn Backend) {
    let mut p = connect(b);
    let region = p.server.reg(4096, RW);
    let rkey = super::bogus_rkey(region.rkey());
    inv_refused(b, &mut p, rkey, "invalidating an unknown key");
}

/// A `Domain` key is retired only by its owner: the peer's SEND_WITH_INV of it is
/// refused, and the key still works on a new connection.
pub fn send_with_inv_of_a_domain_key_is_refused(b: &dyn Backend) {
    let mut p = connect(b);
    let region = p.server.reg(4096, RW);
    let slot = slot(&p, KeyScope::Domain);
    let r1 = bind(&mut p, &slot, &region, 0, 4096, 1);
    write_ok(&mut p, &region, 0, r1, 7);
    inv_refused(b, &mut p, r1, "invalidating a domain key");
    let mut q = connect(b);
    write_ok(&mut q, &region, 64, r1, 8);
}

/// A `Domain` key bound by a post on one connection is valid on another connection of
/// the same fabric (the RTRS server binds a chunk's key on the connection that carried
/// the last response; the client uses it on whichever connection its core owns).
pub fn domain_key_is_valid_on_every_connection(b: &dyn Backend) {
    let mut first = connect(b);
    let mut second = connect(b);
    let region = first.server.reg(8192, RW);
    let slot = slot(&first, KeyScope::Domain);
    let r1 = bind(&mut first, &slot, &region, 0, 8192, 1);
    write_ok(&mut second, &region, 100, r1, 9);
    write_ok(&mut first, &region, 4000, r1, 10);
    // Retired on the first connection, dead on the second.
    local_inv(&mut first, &slot, 2);
    write_refused(&mut second, &region, 0, r1);
}

/// REG_MR of a range outside the region fails locally.
pub fn bind_outside_region_fails(b: &dyn Backend) {
    for scope in SCOPES {
        let mut p = connect(b);
        let region = p.server.reg(4096, RW);
        let slot = slot(&p, scope);
        let rkey = inc_rkey(slot.rkey());
        let op = SendOp::RegMr {
            slot: &slot,
            region: &region,
            addr: region.addr() + 2048,
            len: 4096,
            access: RW,
            rkey,
        };
        p.server.post_send(&[wr(40, op, &[])]);
        let wc = wait_wr(&mut p.server, &mut p.client, 40);
        expect(
            &wc,
            b.quirks().local_error(WcStatus::LocalQpOperation),
            WcOpcode::RegMr,
            "REG_MR past the region's end",
        );
    }
}

/// REG_MR of a `Connection` slot that is still bound fails locally: a binding is
/// invalidated first (LOCAL_INV or a peer's SEND_WITH_INV), as fast-registration MRs
/// and type-2 memory windows require. (A type-1 window may be rebound; RTRS never
/// rebinds a bound slot of either scope.)
pub fn rebinding_a_bound_slot_fails(b: &dyn Backend) {
    let mut p = connect(b);
    let region = p.server.reg(4096, RW);
    let slot = slot(&p, KeyScope::Connection);
    let r1 = bind(&mut p, &slot, &region, 0, 4096, 1);
    let op = SendOp::RegMr {
        slot: &slot,
        region: &region,
        addr: region.addr(),
        len: 4096,
        access: RW,
        rkey: inc_rkey(r1),
    };
    p.server.post_send(&[wr(50, op, &[])]);
    let wc = wait_wr(&mut p.server, &mut p.client, 50);
    expect(
        &wc,
        b.quirks().local_error(WcStatus::LocalQpOperation),
        WcOpcode::RegMr,
        "REG_MR of a slot that is still bound",
    );
}
