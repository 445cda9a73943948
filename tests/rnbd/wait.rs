//! Block IO of the RNBD client while its device is unreachable, over the direct port of
//! `direct.rs` on one simulated reactor with a virtual clock, through both the
//! home core's `RnbdClient` and another core's `RnbdQueue`: IO submitted while the session
//! is down waits and completes after the re-open; IO in flight when the session dropped
//! comes back from the new server session with −ENOTCONN and is sent again, once, to the
//! re-opened device; −ECONNRESET is sent again at once; IO the session has no path for
//! waits in the queue until the session gets one; a wait that runs out fails with
//! −ENOTCONN and an error saying how long the device was unreachable; closing the device
//! fails its waiting IO at once. Every request completes exactly once.

use crate::direct;

use direct::{DirectPort, Rig, WAIT};
use rtrs_spdk::fabric::{Mr, Sge};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    completion_result, BlockRequest, ClientCompletion, ClientEvent, DevHandle, DevState,
    RnbdClient, RnbdQueue, SglRef,
};
use rtrs_spdk::Errno;

type Client = RnbdClient<DirectPort>;
type Core = RnbdQueue<DirectPort>;

const WAIT_NS: u64 = WAIT.as_nanos() as u64;
const MS: u64 = 1_000_000;

/// Polls the client and the other core's handle until nothing moves any more (bounded);
/// returns the block completions (tag, errno; sorted) and the client's other events.
fn settle(rig: &mut Rig, c: &mut Client, o: &mut Core) -> (Vec<(u64, i32)>, Vec<ClientEvent>) {
    let mut done = Vec::new();
    let mut events = Vec::new();
    let mut quiet = 0;
    for _ in 0..1000 {
        let mut ev = vec![
            ClientEvent::Io {
                tag: 0,
                result: Ok(())
            };
            8
        ];
        let mut comps = [ClientCompletion::default(); 8];
        let n = rig.cx(|cx| c.poll(cx.now(), &mut ev));
        let m = rig.cx(|cx| o.poll(cx.now(), &mut comps));
        for e in ev.drain(..n) {
            match e {
                ClientEvent::Io { tag, result } => done.push((tag, Errno::neg_of(result))),
                other => events.push(other),
            }
        }
        done.extend(
            comps[..m]
                .iter()
                .map(|c| (c.tag, Errno::neg_of(completion_result(c)))),
        );
        quiet = if n + m == 0 { quiet + 1 } else { 0 };
        if quiet == 20 {
            break;
        }
    }
    done.sort_unstable();
    (done, events)
}

fn sge(buf: &Mr, len: u32) -> [Sge; 1] {
    [buf.sge(0, len as usize)]
}

/// A client of server session `key` with device "vol" open read-write, and another
/// core's handle of the same session.
fn setup(rig: &mut Rig, key: u64) -> (Client, Core, DevHandle) {
    let mut c = rig.client(key, 8);
    let (vol, id) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    assert_eq!(id, Ok(0));
    let o = RnbdQueue::new(rig.port(key, 8), c.table());
    (c, o, vol)
}

/// Every path lost: the server session ends, the client marks its devices disconnected.
fn lose(rig: &mut Rig, key: u64, c: &mut Client, o: &mut Core) {
    c.session_mut().connected = false;
    o.session_mut().connected = false;
    rig.table.remove(key);
    c.link_down();
}

/// A path is back: SESS_INFO, then the re-open (once nothing is in flight).
fn regain(rig: &mut Rig, c: &mut Client, o: &mut Core) {
    c.session_mut().connected = true;
    o.session_mut().connected = true;
    rig.cx(|cx| c.link_up(cx.now()));
}

fn remapped(ev: &[ClientEvent]) -> Vec<(DevHandle, u32)> {
    ev.iter()
        .filter_map(|e| match e {
            ClientEvent::Opened {
                dev,
                info,
                remap: true,
            } => Some((*dev, info.device_id)),
            _ => None,
        })
        .collect()
}

fn read_back(rig: &mut Rig, c: &mut Client, dev: DevHandle, off: u64) -> Vec<u8> {
    let back = rig.mr(4096);
    assert_eq!(rig.io(c, dev, BlockRequest::read(off, 4096), &back), 0);
    let mut got = vec![0; 4096];
    back.read_at(0, &mut got);
    got
}

#[test]
fn io_submitted_while_disconnected_waits_for_the_reopen() {
    let mut rig = Rig::new();
    let (mut c, mut o, vol) = setup(&mut rig, 21);
    let a = rig.mr(4096);
    a.write_at(0, &[0x5a; 4096]);
    assert_eq!(rig.io(&mut c, vol, BlockRequest::write(0, 4096), &a), 0);

    lose(&mut rig, 21, &mut c, &mut o);
    assert!(o.is_idle(), "a queue that holds no request is idle");
    let b = rig.mr(4096);
    b.write_at(0, &[0xb6; 4096]);
    let r = rig.mr(4096);
    let w = BlockRequest::write(8192, 4096);
    let rd = BlockRequest::read(0, 4096);
    rig.cx(|cx| c.submit(cx.now(), vol, 1, &w, &sge(&b, 4096)))
        .expect("accepted while disconnected");
    rig.cx(|cx| o.submit(cx.now(), vol, 2, &rd, &sge(&r, 4096)))
        .expect("accepted while disconnected");
    // Half the wait later: nothing completed, nothing was sent.
    rig.sim.advance(WAIT_NS / 2);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
    assert_eq!(c.session().block_submits, 1);
    assert_eq!(o.session().block_submits, 0);
    // A waiting request keeps the queue busy (its poller must not sleep).
    assert!(!o.is_idle(), "a waiting request left the queue idle");

    regain(&mut rig, &mut c, &mut o);
    let (done, ev) = settle(&mut rig, &mut c, &mut o);
    assert_eq!(done, [(1, 0), (2, 0)], "{ev:?}");
    assert!(o.is_idle(), "the queue still holds a completed request");
    assert_eq!(ev[0], ClientEvent::SessInfo(Ok(2)));
    assert_eq!(remapped(&ev), [(vol, 0)]);
    // Each was sent once, after the re-open.
    assert_eq!(
        (c.session().block_submits, o.session().block_submits),
        (2, 1)
    );
    let mut got = [0u8; 4096];
    r.read_at(0, &mut got);
    assert_eq!(got, [0x5a; 4096]);
    assert_eq!(read_back(&mut rig, &mut c, vol, 8192), [0xb6; 4096]);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
}

#[test]
fn io_in_flight_is_sent_again_once_to_the_reopened_device() {
    let mut rig = Rig::new();
    let mut c = rig.client(11, 8);
    let mut o = RnbdQueue::new(rig.port(11, 8), c.table());
    // Ids: spare 0, vol 1, aux 2; spare closes, so a re-open in order makes vol 0 and
    // aux 1, the old id of vol.
    let (spare, _) = rig.open(&mut c, "spare", AccessMode::ReadOnly);
    let (vol, id_vol) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    let (aux, id_aux) = rig.open(&mut c, "aux", AccessMode::ReadWrite);
    assert_eq!((id_vol, id_aux), (Ok(1), Ok(2)));
    rig.cx(|cx| c.close(cx.now(), spare)).unwrap();
    rig.events(&mut c, 1);

    // A write to vol is in flight (kept by the transport) when the session drops.
    let buf = rig.mr(512);
    buf.write_at(0, &[0xaa; 512]);
    c.session_mut().hold = true;
    let w = BlockRequest::write(0, 512);
    rig.cx(|cx| c.submit(cx.now(), vol, 1, &w, &sge(&buf, 512)))
        .unwrap();
    lose(&mut rig, 11, &mut c, &mut o);
    assert_eq!(c.table().in_flight(), 1);

    // The path is back, the write still in flight: SESS_INFO goes, the re-opens do not.
    regain(&mut rig, &mut c, &mut o);
    let (done, ev) = settle(&mut rig, &mut c, &mut o);
    assert_eq!((done, ev), (vec![], vec![ClientEvent::SessInfo(Ok(2))]));
    assert_eq!(c.device(vol).unwrap().state(), DevState::MappedDisconnected);
    assert!(rig.table.get(11).unwrap().mappings().is_empty());

    // The write goes out with its old id, which the new server session does not know
    // (−ENOTCONN): it waits, the devices are re-opened with new ids, and it is sent
    // again with vol's new one.
    rig.cx(|cx| c.session_mut().replay(cx.now()));
    let (done, ev) = settle(&mut rig, &mut c, &mut o);
    assert_eq!(done, [(1, 0)], "{ev:?}");
    assert_eq!(remapped(&ev), [(vol, 0), (aux, 1)]);
    // Once held, once re-sent.
    assert_eq!(c.session().block_submits, 2);
    assert_eq!(c.table().in_flight(), 0);
    assert_eq!(read_back(&mut rig, &mut c, vol, 0)[..512], [0xaa; 512]);
    assert_eq!(read_back(&mut rig, &mut c, aux, 0), [0; 4096]);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
}

#[test]
fn io_dropped_with_econnreset_is_sent_again_at_once() {
    let mut rig = Rig::new();
    let (mut c, mut o, vol) = setup(&mut rig, 22);
    let buf = rig.mr(4096);
    buf.write_at(0, &[0x11; 4096]);
    c.session_mut().reset_next = 1;
    o.session_mut().reset_next = 1;
    let w = BlockRequest::write(0, 4096);
    let w2 = BlockRequest::write(4096, 4096);
    rig.cx(|cx| c.submit(cx.now(), vol, 3, &w, &sge(&buf, 4096)))
        .unwrap();
    rig.cx(|cx| o.submit(cx.now(), vol, 4, &w2, &sge(&buf, 4096)))
        .unwrap();
    assert_eq!(
        settle(&mut rig, &mut c, &mut o),
        (vec![(3, 0), (4, 0)], vec![])
    );
    assert_eq!(
        (c.session().block_submits, o.session().block_submits),
        (2, 2)
    );
    assert_eq!(read_back(&mut rig, &mut c, vol, 4096), [0x11; 4096]);
}

#[test]
fn a_wait_that_runs_out_fails_and_says_why() {
    let mut rig = Rig::new();
    let (mut c, mut o, vol) = setup(&mut rig, 23);
    let buf = rig.mr(4096);
    // One write in flight (kept by the transport) and two reads submitted while down.
    c.session_mut().hold = true;
    let w = BlockRequest::write(0, 4096);
    rig.cx(|cx| c.submit(cx.now(), vol, 7, &w, &sge(&buf, 4096)))
        .unwrap();
    lose(&mut rig, 23, &mut c, &mut o);
    let rd = BlockRequest::read(0, 4096);
    rig.cx(|cx| c.submit(cx.now(), vol, 5, &rd, &sge(&buf, 4096)))
        .unwrap();
    rig.cx(|cx| o.submit(cx.now(), vol, 6, &rd, &sge(&buf, 4096)))
        .unwrap();
    rig.sim.advance(WAIT_NS - MS);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
    rig.sim.advance(2 * MS);
    let (done, ev) = settle(&mut rig, &mut c, &mut o);
    let enotconn = -libc::ENOTCONN;
    assert_eq!((done, ev), (vec![(5, enotconn), (6, enotconn)], vec![]));
    let why = "device 'vol' unreachable for 2 s: no connection to the server (waiting for a \
               reconnect and the device's re-open)";
    for e in [c.last_wait_error(), o.last_wait_error()] {
        let e = e.expect("the reason is kept");
        assert_eq!(e.to_string(), why);
        assert_eq!(e.errno().neg(), enotconn);
    }
    // The write in flight comes back after its wait ran out: it fails at once, and the
    // device is re-opened for new IO.
    regain(&mut rig, &mut c, &mut o);
    rig.cx(|cx| c.session_mut().replay(cx.now()));
    let (done, ev) = settle(&mut rig, &mut c, &mut o);
    assert_eq!(done, [(7, enotconn)]);
    assert_eq!(remapped(&ev), [(vol, 0)]);
    let e = c.last_wait_error().unwrap().to_string();
    assert!(
        e.starts_with("device 'vol' unreachable for 2 s: ")
            && e.ends_with("last attempt: Transport endpoint is not connected (os error 107))"),
        "{e}"
    );
    buf.write_at(0, &[0x77; 4096]);
    assert_eq!(rig.io(&mut c, vol, BlockRequest::write(0, 4096), &buf), 0);
    assert_eq!(read_back(&mut rig, &mut c, vol, 0), [0x77; 4096]);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
}

/// No path on a core while the device stays mapped (the session refuses the request
/// `Unreachable`): the request waits in the queue, its one place, and is not offered
/// again until the session got a path (`path_epoch` moved); then it goes once and
/// completes. One whose wait runs out fails with −ENOTCONN, saying no path was there.
#[test]
fn io_without_a_path_waits_in_the_queue_for_one() {
    let mut rig = Rig::new();
    let (mut c, mut o, vol) = setup(&mut rig, 25);
    let buf = rig.mr(4096);
    buf.write_at(0, &[0x5a; 4096]);
    o.session_mut().unreachable = true;
    let w = BlockRequest::write(8192, 4096);
    rig.cx(|cx| o.submit(cx.now(), vol, 11, &w, &sge(&buf, 4096)))
        .unwrap();
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
    rig.sim.advance(WAIT_NS / 2);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
    assert_eq!(
        o.session().unreachable_refused,
        1,
        "not offered again while no path came"
    );
    // A path: sent once, done.
    o.session_mut().unreachable = false;
    o.session_mut().epoch += 1;
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![(11, 0)], vec![]));
    assert_eq!(
        (o.session().unreachable_refused, o.session().block_submits),
        (1, 1)
    );
    assert_eq!(read_back(&mut rig, &mut c, vol, 8192), [0x5a; 4096]);
    // No path again, and none comes within the wait.
    o.session_mut().unreachable = true;
    let rd = BlockRequest::read(0, 4096);
    rig.cx(|cx| o.submit(cx.now(), vol, 12, &rd, &sge(&buf, 4096)))
        .unwrap();
    rig.sim.advance(WAIT_NS - MS);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
    rig.sim.advance(2 * MS);
    assert_eq!(
        settle(&mut rig, &mut c, &mut o),
        (vec![(12, -libc::ENOTCONN)], vec![])
    );
    assert_eq!(
        o.last_wait_error().map(ToString::to_string).as_deref(),
        Some(
            "device 'vol' unreachable for 2 s: no path of the session connected on this core \
             (waiting for one)"
        )
    );
    assert_eq!(o.session().unreachable_refused, 2);
}

#[test]
fn closing_the_device_fails_its_waiting_io_at_once() {
    let mut rig = Rig::new();
    let (mut c, mut o, vol) = setup(&mut rig, 24);
    lose(&mut rig, 24, &mut c, &mut o);
    let buf = rig.mr(4096);
    let rd = BlockRequest::read(0, 4096);
    rig.cx(|cx| c.submit(cx.now(), vol, 8, &rd, &sge(&buf, 4096)))
        .unwrap();
    rig.cx(|cx| o.submit(cx.now(), vol, 9, &rd, &sge(&buf, 4096)))
        .unwrap();
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
    rig.cx(|cx| c.close(cx.now(), vol)).unwrap();
    let (done, ev) = settle(&mut rig, &mut c, &mut o);
    assert_eq!(done, [(8, -libc::ENODEV), (9, -libc::ENODEV)]);
    assert_eq!(ev, [ClientEvent::Closed { dev: vol }]);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
}

/// More requests than the session has permits: every one is accepted (none is handed
/// back as busy), those beyond the permits wait in the queue and go out in order as
/// permits free up, and each completes once. One that finds no permit before its wait
/// runs out fails with −ENOTCONN, saying why.
#[test]
fn requests_beyond_the_permits_wait_in_the_queue() {
    let mut rig = Rig::new();
    let mut c = rig.client(31, 8);
    let (vol, id) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    assert_eq!(id, Ok(0));
    let mut o = RnbdQueue::new(rig.port(31, 2), c.table());
    let bufs: Vec<Mr> = (0..6u8)
        .map(|k| {
            let b = rig.mr(4096);
            b.write_at(0, &[k + 1; 4096]);
            b
        })
        .collect();
    for (k, b) in bufs.iter().enumerate() {
        let w = BlockRequest::write(k as u64 * 4096, 4096);
        rig.cx(|cx| o.submit(cx.now(), vol, 100 + k as u64, &w, &sge(b, 4096)))
            .expect("accepted, not busy");
    }
    // Two in flight, four waiting for a permit: busy.
    assert!(!o.is_idle(), "requests in flight left the queue idle");
    let (done, _) = settle(&mut rig, &mut c, &mut o);
    assert_eq!(done, (0..6).map(|k| (100 + k, 0)).collect::<Vec<_>>());
    assert!(
        o.is_idle(),
        "every request completed, the queue is not idle"
    );
    for k in 0..6u8 {
        assert_eq!(
            read_back(&mut rig, &mut c, vol, u64::from(k) * 4096),
            [k + 1; 4096]
        );
    }

    // Every chunk of the transport taken and never given back: the next request waits
    // for a permit until its wait runs out.
    o.session_mut().free.clear();
    let rd = BlockRequest::read(0, 4096);
    let r = rig.mr(4096);
    rig.cx(|cx| o.submit(cx.now(), vol, 3, &rd, &sge(&r, 4096)))
        .expect("accepted, not busy");
    rig.sim.advance(WAIT_NS - MS);
    assert_eq!(settle(&mut rig, &mut c, &mut o), (vec![], vec![]));
    rig.sim.advance(2 * MS);
    let (done, _) = settle(&mut rig, &mut c, &mut o);
    assert_eq!(done, [(3, -libc::ENOTCONN)]);
    let e = o.last_wait_error().expect("the reason is kept").to_string();
    assert!(e.contains("no free request slot on the session"), "{e}");
}

/// A request's scatter list is kept in one place: given with `submit_held`, the queue
/// hands the session the caller's own list, at the first send and at the re-send after
/// the re-open; given with `submit`, it is copied once, into the queue's entry, and both
/// sends name that one copy. Each write lands.
#[test]
fn a_scatter_list_is_read_where_it_is_kept() {
    let mut rig = Rig::new();
    let (mut c, mut o, vol) = setup(&mut rig, 21);
    let a = rig.mr(512);
    let b = rig.mr(512);
    a.write_at(0, &[0x5a; 512]);
    b.write_at(0, &[0xa5; 512]);
    let kept = sge(&a, 512);
    let passed = sge(&b, 512);
    let w0 = BlockRequest::write(0, 512);
    let w1 = BlockRequest::write(4096, 512);

    // Both in flight (kept by the transport) when every path goes.
    o.session_mut().hold = true;
    // SAFETY: `kept` lives, unchanged, until the end of the test, after the completion.
    let held = unsafe { SglRef::new(&kept) };
    rig.cx(|cx| o.submit_held(cx.now(), vol, 1, &w0, held))
        .unwrap();
    rig.cx(|cx| o.submit(cx.now(), vol, 2, &w1, &passed))
        .unwrap();
    lose(&mut rig, 21, &mut c, &mut o);
    regain(&mut rig, &mut c, &mut o);
    settle(&mut rig, &mut c, &mut o);
    // Sent with the old id: −ENOTCONN, kept, re-sent to the re-opened device.
    rig.cx(|cx| o.session_mut().replay(cx.now()));
    let (done, _) = settle(&mut rig, &mut c, &mut o);
    assert_eq!(done, [(1, 0), (2, 0)]);

    let lists = &o.session().lists;
    assert_eq!(lists.len(), 4, "{lists:?}");
    let mine = kept.as_ptr() as usize;
    let of_held: Vec<_> = lists.iter().filter(|l| l.1 == mine).collect();
    assert_eq!(of_held, [&(true, mine), &(true, mine)], "{lists:?}");
    let others: Vec<_> = lists.iter().filter(|l| l.1 != mine).collect();
    assert_eq!(others.len(), 2, "{lists:?}");
    assert!(
        others
            .iter()
            .all(|l| l.0 && l.1 != passed.as_ptr() as usize && l.1 == others[0].1),
        "submit's list is copied once, into the entry, and that copy is sent: {lists:?}"
    );
    assert_eq!(read_back(&mut rig, &mut c, vol, 0)[..512], [0x5a; 512]);
    assert_eq!(read_back(&mut rig, &mut c, vol, 4096)[..512], [0xa5; 512]);
}
