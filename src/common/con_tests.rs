use super::*;
use crate::fabric::loopback::LoopbackFabric;
use crate::fabric::{ConnectOptions, ListenOptions};
use crate::fabric::{Fabric, QpCaps, WcStatus};

fn pair(send_wr: u32) -> (RtrsCon, RtrsCon) {
    let f = LoopbackFabric::new();
    let mut l = f
        .listen("127.0.0.1:0".parse().unwrap(), &ListenOptions::default())
        .unwrap();
    let caps = QpCaps {
        max_send_wr: send_wr,
        max_recv_wr: 4096,
        max_send_sge: 2,
    };
    let mut c = f
        .connect(l.local_addr(), &ConnectOptions::new(caps, &[1]))
        .unwrap();
    let req = (0..1000).find_map(|_| {
        c.poll_cm();
        l.poll()
    });
    let s = req.expect("request").accept(caps, &[2]).unwrap();
    let mut s = RtrsCon::new(0, s, 512);
    let mut est = false;
    for _ in 0..1000 {
        s.poll_cm();
        if let Some(CmEvent::Established { .. }) = c.poll_cm() {
            est = true;
            break;
        }
    }
    assert!(est, "client never established");
    (RtrsCon::new(0, c, 512), s)
}

#[test]
fn interval_capped_by_queue() {
    let (c, _s) = pair(16);
    assert_eq!(c.signal_interval(), 8);
    assert_eq!(c.sq_avail(), 16);
}

#[test]
fn budget_refuses_then_recovers_without_fabric_queue_full() {
    let (mut c, mut s) = pair(16);
    s.post_recv_empty(1000, 5).unwrap();
    let mut wcs = [Wc::default(); 64];
    let mut got = 0u32;
    let drain = |s: &mut RtrsCon, got: &mut u32| {
        let mut w = [Wc::default(); 64];
        let n = s.poll(&mut w);
        for wc in &w[..n] {
            assert_eq!(wc.imm, Some(*got));
            *got += 1;
        }
    };
    let mut sent = 0u32;
    let mut refused = 0u32;
    let mut rounds = 0;
    while sent < 200 {
        rounds += 1;
        assert!(rounds < 100_000, "stuck at {sent} sent, {c:?}");
        match c.post_imm_empty(sent.into(), sent) {
            Ok(()) => sent += 1,
            Err(e) => {
                assert!(e.is_budget(), "{e}");
                refused += 1;
                let n = c.poll(&mut wcs);
                assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
            }
        }
        drain(&mut s, &mut got);
    }
    assert!(refused > 0, "a 16-slot queue must run out with 200 posts");
    // Everything arrives, in order.
    for _ in 0..10_000 {
        c.poll(&mut wcs);
        drain(&mut s, &mut got);
        if got == 200 {
            break;
        }
    }
    assert_eq!(got, 200);
}

#[test]
fn caller_signaled_stays_signaled() {
    let (mut c, mut s) = pair(64);
    s.post_recv_empty(RECV_BATCH as u32 * 2 + 3, 0).unwrap();
    c.post_send(&[SendWr {
        wr_id: 77,
        op: SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm: 1,
        },
        sges: &[],
        signaled: true,
    }])
    .unwrap();
    assert_eq!(c.sq_avail(), 63);
    let mut wcs = [Wc::default(); 8];
    let mut seen = None;
    for _ in 0..1000 {
        s.poll(&mut wcs);
        let n = c.poll(&mut wcs);
        if n > 0 {
            seen = Some(wcs[0]);
            break;
        }
    }
    let wc = seen.expect("signaled completion");
    assert_eq!((wc.wr_id, wc.status), (77, WcStatus::Success));
    assert_eq!(c.sq_avail(), 64);
}
