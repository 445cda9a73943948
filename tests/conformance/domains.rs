//! Protection domains (`Fabric::domain`): a key is valid only on connections of the domain
//! it was registered in, whichever device they share; the device's completion queues
//! take connections of all its domains.

use rtrs_spdk::fabric::{Access, KeyScope};

use super::keys::{bind, write_ok, write_refused};
use super::{connect_into, Backend};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// Two sessions' domains on one device: each one's region and slot keys work on its own
/// connections and are refused, breaking the connection, on the other's.
pub fn keys_of_another_domain_are_refused(b: &dyn Backend) {
    let root = b.server_fabric();
    let (d1, d2) = (
        root.domain().expect("a first domain"),
        root.domain().expect("a second domain"),
    );
    let mut own = connect_into(b, d1.clone(), None);
    let region = own.server.reg(8192, RW);
    write_ok(&mut own, &region, 0, region.rkey(), 1);
    let slot = d1.alloc_fast_mr(KeyScope::Domain).expect("alloc_fast_mr");
    let key = bind(&mut own, &slot, &region, 4096, 4096, 2);
    write_ok(&mut own, &region, 4096, key, 2);

    // The other domain's connection: neither the region's key nor the slot's reaches.
    let mut other = connect_into(b, d2.clone(), None);
    write_refused(&mut other, &region, 0, region.rkey());
    let mut other = connect_into(b, d2.clone(), None);
    write_refused(&mut other, &region, 4096, key);
    // Nor the root domain's.
    let mut rooted = connect_into(b, root.clone(), None);
    write_refused(&mut rooted, &region, 100, region.rkey());
    // The owner's connections are unaffected.
    write_ok(&mut own, &region, 200, region.rkey(), 3);
    write_ok(&mut own, &region, 4096 + 200, key, 4);
}

/// A completion queue of the device takes a connection accepted into any of its domains.
pub fn a_domain_shares_its_device_completion_queues(b: &dyn Backend) {
    let root = b.server_fabric();
    let Ok(mut cq) = root.create_cq(64) else {
        return;
    };
    let d = root.domain().expect("a domain");
    let mut p = connect_into(b, d, Some(&cq.share()));
    // The connection is on the CQ (its completions come out of it): a write into the
    // domain's region with an imm completes a receive there.
    let region = p.server.reg(4096, RW);
    let recv = rtrs_spdk::fabric::RecvWr {
        wr_id: 9,
        sge: None,
    };
    p.server.post_recv(&[recv]);
    let src = p.client.reg(64, Access::NONE);
    let sges = [src.sge(0, 64)];
    let op = rtrs_spdk::fabric::SendOp::RdmaWriteWithImm {
        remote_addr: region.addr(),
        rkey: region.rkey(),
        imm: 5,
    };
    p.client.post_send(&[super::wr(1, op, &sges)]);
    let end = std::time::Instant::now() + super::DEADLINE;
    let mut wcs = [rtrs_spdk::fabric::Wc::default(); 4];
    loop {
        p.client.pump();
        p.server.pump();
        let n = cq.poll(&mut wcs);
        if let Some(w) = wcs[..n].iter().find(|w| w.wr_id == 9) {
            assert!(w.status.is_ok(), "{w:?}");
            assert_eq!(w.imm, Some(5));
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "the write's receive never came out of the device's CQ"
        );
        std::thread::yield_now();
    }
}
