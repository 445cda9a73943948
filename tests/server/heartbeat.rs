//! Heartbeats on the virtual clock: a live path stays up for minutes of silence while
//! the client answers heartbeats; a blackholed path (no traffic, no RST) is closed
//! after the missed limit; the server answers the client's heartbeats.

use crate::server_util;

use rtrs_spdk::proto::HB_MSG_IMM;
use rtrs_spdk::server::LinkEvent;
use server_util::{Event, Harness};

const SEC: u64 = 1_000_000_000;

/// Advances virtual time by `ns` in 100 ms ticks, polling the client between ticks.
fn run(h: &mut Harness, p: &mut server_util::TestPath, ns: u64) {
    let end = h.sim.now() + ns;
    while h.sim.now() < end {
        h.sim.advance(SEC / 10);
        h.step();
        p.poll();
    }
}

#[test]
fn answered_heartbeats_keep_an_idle_path_up() {
    let mut h = Harness::new(2, Harness::config(true));
    let mut p = h.connect("alive", 3);
    run(&mut h, &mut p, 120 * SEC);
    let hbs = p.events.iter().filter(|e| **e == Event::HbMsg).count();
    // One heartbeat per 5 s interval while the client answers each one.
    assert!((20..=25).contains(&hbs), "{hbs} heartbeats in 120 s");
    assert!(!p.down);
    assert_eq!(p.write(&mut h, 1, 0, 0, b"still"), 0);
    h.stop();
}

#[test]
fn server_acks_client_heartbeat() {
    let mut h = Harness::new(1, Harness::config(false));
    let mut p = h.connect("hb", 2);
    p.post_raw(0, 0, 0, &[], HB_MSG_IMM);
    for _ in 0..100 {
        h.step();
        p.poll();
    }
    assert!(p.events.contains(&Event::HbAck), "{:?}", p.events);
    h.stop();
}

#[test]
fn blackholed_path_is_closed_by_heartbeat_timeout() {
    let mut h = Harness::new(2, Harness::config(true));
    let mut good = h.connect("good", 3);
    let mut p = h.connect("silent", 3);
    for c in &p.cons {
        h.fabric.faults(&**c).expect("loopback conn").blackhole();
    }
    // Four silent ticks are tolerated (one heartbeat sent), the fifth declares death:
    // dead within interval (5 s) x missed_max (5) of going silent.
    run(&mut h, &mut p, 20 * SEC);
    let names = |h: &Harness| -> Vec<String> {
        h.server
            .stats()
            .sessions
            .iter()
            .map(|s| s.name.clone())
            .collect()
    };
    assert!(
        names(&h).contains(&"silent".to_string()),
        "closed too early"
    );
    // Keep the good session alive meanwhile by polling it (it answers heartbeats).
    let end = h.sim.now() + 5 * SEC + SEC / 2;
    while h.sim.now() < end {
        h.sim.advance(SEC / 10);
        h.step();
        good.poll();
    }
    h.sim.run_until_idle(1000);
    assert_eq!(names(&h), ["good".to_string()], "{:?}", h.server.stats());
    let ev = h.shared.events.lock().unwrap().clone();
    assert!(ev
        .iter()
        .any(|e| e.1 == "silent" && e.2 == LinkEvent::Disconnected));
    assert_eq!(good.write(&mut h, 2, 3, 0, b"fine"), 0);
    h.stop();
}
