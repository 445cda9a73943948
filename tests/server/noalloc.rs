//! The server's data path does not allocate: after a warm-up, READ and WRITE requests
//! with always_invalidate on and off are received, dispatched and answered without a
//! heap allocation in the server's reactors (counted per thread, only while the
//! simulation steps; the test client's own work is outside the count).

use crate::counting;
use crate::server_util;

use server_util::{Event, Harness, TestPath};

fn allocs() -> u64 {
    counting::allocations()
}

/// Steps until `buf_id` is answered; returns the allocations made inside the steps.
fn answer(h: &mut Harness, p: &mut TestPath, buf_id: u16) -> u64 {
    let mut n = 0;
    for _ in 0..server_util::MAX_STEPS {
        let before = allocs();
        h.step();
        n += allocs() - before;
        p.poll();
        if let Some(i) = p
            .events
            .iter()
            .position(|e| matches!(e, Event::Rsp { buf_id: b, errno: 0, .. } if *b == buf_id))
        {
            p.events.remove(i);
            return n;
        }
        assert!(!p.down, "path closed: {:?}", p.events);
    }
    panic!("no answer for buf {buf_id}");
}

fn steady_state(always_invalidate: bool) {
    let mut h = Harness::new(2, Harness::config(always_invalidate));
    let mut p = h.connect("noalloc", 3);
    let data = vec![0x5a; 4096];
    let round = |h: &mut Harness, p: &mut TestPath| -> u64 {
        let mut n = 0;
        for buf in 0..16u16 {
            let cid = 1 + buf % 2;
            let off = u64::from(buf) * 4096;
            p.post_write(cid, buf, &off.to_le_bytes(), &data);
            n += answer(h, p, buf);
            p.post_read(cid, buf, &off.to_le_bytes(), 4096, buf % 3 == 0);
            n += answer(h, p, buf);
        }
        p.events.clear();
        n
    };
    for _ in 0..3 {
        round(&mut h, &mut p);
    }
    let n: u64 = (0..5).map(|_| round(&mut h, &mut p)).sum();
    assert_eq!(n, 0, "allocations in the server's steps over 160 requests");
    h.stop();
}

#[test]
fn data_path_does_not_allocate_always_invalidate() {
    steady_state(true);
}

#[test]
fn data_path_does_not_allocate_plain() {
    steady_state(false);
}
