//! The client's data path does not allocate: once a session is connected, submitting
//! and polling reads and writes (single- and multi-segment, both response forms) makes
//! no heap allocation. Counted with a per-thread counting allocator that only counts
//! inside calls into the client.

use crate::counting;
use crate::util;

use util::{Harness, Setup};

fn measure(on: bool) {
    counting::set_counting(on);
}

#[test]
fn submit_and_poll_do_not_allocate() {
    // Count only inside submit/poll (the harness turns counting on around them).
    counting::set_counting(false);
    for (new_rkey, direct) in [(false, false), (true, false), (true, true)] {
        let mut h = Harness::new(Setup {
            paths: 2,
            new_rkey,
            direct,
            load_qd: 16,
            sizes: vec![512, 4096, 16384, 60000],
            ..Setup::default()
        });
        for l in &h.loads {
            l.borrow_mut().measure = Some(measure);
        }
        counting::reset();
        h.connect();
        h.start_load(0);
        assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 200));
        // The counter works: taking the connections in sized the per-permit state.
        assert!(counting::allocations() > 0);
        counting::reset();
        h.verify_more(1000, 400_000);
        let n = counting::allocations();
        assert_eq!(
            n, 0,
            "allocations inside submit/poll over 1000+ verified IOs (new_rkey {new_rkey})"
        );
        h.drain(100_000, 1000);
        let t = h.total();
        assert!(
            t.errors.is_empty() && t.mismatches == 0 && t.strays == 0,
            "{t:?}"
        );
    }
}
