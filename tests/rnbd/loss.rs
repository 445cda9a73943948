//! The loss timeout (SPDK bdev_nvme's `ctrlr_loss_timeout_sec`): once the session has had
//! no path for that long its devices are lost: the IO waiting for a reconnect fails at
//! once (well before its own wait would end), later IO fails at once, and a path coming
//! back does not re-open them. Without a timeout nothing is lost.

use std::time::Duration;

use crate::direct;

use direct::Rig;
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{BlockRequest, ClientEvent, DevState};
use rtrs_spdk::Errno;

const SEC: u64 = 1_000_000_000;

#[test]
fn devices_are_lost_after_the_loss_timeout() {
    let mut rig = Rig::new();
    // IO would wait 60 s for the device; the loss timeout is 3 s.
    let mut c = rig.client_waiting(41, 8, Duration::from_secs(60));
    let (vol, _) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    c.set_loss_timeout(Some(Duration::from_secs(3)));
    let buf = rig.mr(4096);
    let sgl = [buf.sge(0, 4096)];

    c.session_mut().connected = false;
    rig.table.remove(41);
    c.link_down();
    rig.cx(|cx| c.submit(cx.now(), vol, 1, &BlockRequest::write(0, 4096), &sgl))
        .unwrap();
    assert!(rig.events(&mut c, 0).is_empty());
    rig.sim.advance(2 * SEC);
    assert!(rig.events(&mut c, 0).is_empty(), "not lost before 3 s");
    rig.sim.advance(2 * SEC);
    let ev = rig.events(&mut c, 2);
    assert!(ev.contains(&ClientEvent::Lost { dev: vol }), "{ev:?}");
    assert!(
        ev.contains(&ClientEvent::Io {
            tag: 1,
            result: Err(Errno::ENOTCONN)
        }),
        "{ev:?}"
    );
    assert_eq!(c.device(vol).unwrap().state(), DevState::Lost);
    // Later IO fails at once; a path coming back re-opens nothing.
    assert!(rig
        .cx(|cx| c.submit(cx.now(), vol, 2, &BlockRequest::read(0, 4096), &sgl))
        .is_err());
    c.session_mut().connected = true;
    rig.cx(|cx| c.link_up(cx.now()));
    let ev = rig.events(&mut c, 1);
    assert!(matches!(ev[..], [ClientEvent::SessInfo(Ok(_))]), "{ev:?}");
    assert_eq!(c.device(vol).unwrap().state(), DevState::Lost);
    // Unmapping a lost device needs no CLOSE on the wire.
    rig.cx(|cx| c.close(cx.now(), vol)).unwrap();
    assert_eq!(rig.events(&mut c, 1), [ClientEvent::Closed { dev: vol }]);
}

#[test]
fn without_a_loss_timeout_devices_wait() {
    let mut rig = Rig::new();
    let mut c = rig.client_waiting(42, 8, Duration::from_secs(60));
    let (vol, _) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    c.session_mut().connected = false;
    rig.table.remove(42);
    c.link_down();
    assert!(rig.events(&mut c, 0).is_empty());
    rig.sim.advance(30 * SEC);
    assert!(rig.events(&mut c, 0).is_empty());
    assert_eq!(c.device(vol).unwrap().state(), DevState::MappedDisconnected);
    // A timeout set later counts from when the last path went.
    c.set_loss_timeout(Some(Duration::from_secs(10)));
    let ev = rig.events(&mut c, 1);
    assert_eq!(ev, [ClientEvent::Lost { dev: vol }]);
}
