//! A mapping the target's operator closes (the kernel server's `force_close`) while the
//! session stays up, as the client sees it: the IO that finds the id gone reports the
//! device closed by the server (not a reconnect to wait for), later IO fails at once,
//! and a remap (the kernel's `remap_device`) maps it again only if the export's host
//! list and access rules allow it now; a refused remap leaves it closed.

use crate::direct;

use direct::Rig;
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{BlockRequest, ClientEvent, DevState, DeviceError, RnbdClient};
use rtrs_spdk::rnbd::server::HostPattern;
use rtrs_spdk::Errno;

/// Polls until nothing moves (bounded); the events that came.
fn drain(rig: &mut Rig, c: &mut RnbdClient<direct::DirectPort>) -> Vec<ClientEvent> {
    let mut got = Vec::new();
    for _ in 0..200 {
        let mut out = vec![
            ClientEvent::Io {
                tag: 0,
                result: Ok(())
            };
            8
        ];
        let n = rig.cx(|cx| c.poll(cx.now(), &mut out));
        got.extend(out.drain(..n));
    }
    got
}

#[test]
fn a_forced_close_is_seen_and_a_remap_follows_the_host_list() {
    let mut rig = Rig::new();
    let mut c = rig.client(31, 8);
    let (vol, id) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    let id = id.unwrap();
    let buf = rig.mr(4096);
    assert_eq!(rig.io(&mut c, vol, BlockRequest::write(0, 4096), &buf), 0);

    // The operator closes the mapping; the session stays up.
    let export = rig.ex.lookup(b"vol").unwrap();
    assert!(rig.table.get(31).unwrap().force_close(id).is_some());
    assert_eq!(rig.ex.writers(export), 0);

    // The next IO finds the id gone: it fails (not after the 2 s wait), and the device
    // is closed by the server.
    let sgl = [buf.sge(0, 4096)];
    rig.cx(|cx| c.submit(cx.now(), vol, 7, &BlockRequest::read(0, 4096), &sgl))
        .unwrap();
    let ev = drain(&mut rig, &mut c);
    assert!(
        ev.contains(&ClientEvent::ServerClosed { dev: vol }),
        "{ev:?}"
    );
    assert!(
        ev.contains(&ClientEvent::Io {
            tag: 7,
            result: Err(Errno::ENOTCONN)
        }),
        "{ev:?}"
    );
    assert_eq!(c.device(vol).unwrap().state(), DevState::ServerClosed);
    assert_eq!(
        c.device(vol).unwrap().state().to_string(),
        "closed by the server"
    );
    // Later IO fails at once, saying so.
    let err = rig
        .cx(|cx| c.submit(cx.now(), vol, 8, &BlockRequest::read(0, 4096), &sgl))
        .unwrap_err();
    assert!(err.to_string().contains("closed by the server"), "{err}");

    // The host list now leaves this client out: the remap is refused, the device stays
    // closed.
    rig.ex
        .hosts(export)
        .add("sess:someone-else".parse::<HostPattern>().unwrap());
    rig.cx(|cx| c.remap(cx.now(), vol)).unwrap();
    let ev = drain(&mut rig, &mut c);
    match &ev[..] {
        [ClientEvent::OpenFailed { dev, error }] => {
            assert_eq!((*dev, error.errno()), (vol, Errno::EACCES), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.device(vol).unwrap().state(), DevState::ServerClosed);

    // Allowed again: the remap maps it and IO flows.
    rig.ex
        .hosts(export)
        .add("sess:clt".parse::<HostPattern>().unwrap());
    rig.cx(|cx| c.remap(cx.now(), vol)).unwrap();
    let ev = drain(&mut rig, &mut c);
    assert!(
        matches!(&ev[..], [ClientEvent::Remapped { dev, .. }] if *dev == vol),
        "{ev:?}"
    );
    assert_eq!(c.device(vol).unwrap().state(), DevState::Mapped);
    assert_eq!(rig.ex.writers(export), 1);
    assert_eq!(rig.io(&mut c, vol, BlockRequest::read(0, 4096), &buf), 0);

    // A remap of a mapped device is the same mapping, its size read again.
    rig.cx(|cx| c.remap(cx.now(), vol)).unwrap();
    assert!(matches!(
        rig.cx(|cx| c.remap(cx.now(), vol)),
        Err(DeviceError::Opening { .. })
    ));
    let ev = drain(&mut rig, &mut c);
    match &ev[..] {
        [ClientEvent::Remapped { info, .. }] => assert_eq!(info.size, 4 << 20),
        other => panic!("{other:?}"),
    }
}

#[test]
fn enotconn_after_a_reconnect_is_not_a_forced_close() {
    let mut rig = Rig::new();
    let mut c = rig.client(32, 8);
    let (vol, _) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    let buf = rig.mr(4096);
    // Requests held while the path is down reach the new server session, which knows no
    // device yet (−ENOTCONN): they wait for the re-open, the device is not "closed".
    c.session_mut().hold = true;
    let sgl = [buf.sge(0, 4096)];
    rig.cx(|cx| c.submit(cx.now(), vol, 9, &BlockRequest::read(0, 4096), &sgl))
        .unwrap();
    rig.table.remove(32);
    c.link_down();
    rig.cx(|cx| c.session_mut().replay(cx.now()));
    rig.cx(|cx| c.link_up(cx.now()));
    let ev = drain(&mut rig, &mut c);
    assert!(
        !ev.iter()
            .any(|e| matches!(e, ClientEvent::ServerClosed { .. })),
        "{ev:?}"
    );
    assert!(
        ev.contains(&ClientEvent::Io {
            tag: 9,
            result: Ok(())
        }),
        "{ev:?}"
    );
    assert_eq!(c.device(vol).unwrap().state(), DevState::Mapped);
}
