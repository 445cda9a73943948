//! A device whose export changes size under a client (a file that grows or shrinks): the
//! client learns the size at a remap (the idempotent re-open answers the size as it is
//! now) and at the re-open after a reconnect; grown, IO reaches the new end; shrunk below
//! data the client had written, IO beyond the new end fails at once naming the size, and
//! IO inside it goes on.

use std::sync::Arc;

use crate::direct;

use direct::Rig;
use rtrs_spdk::engine::Simulation;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::backend::{BackendSpec, ExportSpec, FileOptions};
use rtrs_spdk::rnbd::client::{BlockRequest, ClientEvent};
use rtrs_spdk::rnbd::server::{Exports, RnbdSessions};

const MIB: u64 = 1 << 20;

#[test]
fn remaps_and_reconnects_follow_the_exports_size() {
    let path = std::env::temp_dir().join(format!("rtrs-resize-{}.img", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(2 * MIB).unwrap();
    let spec = ExportSpec {
        name: "vol".into(),
        backend: BackendSpec::File {
            path: path.clone(),
            read_only: false,
        },
    };
    let ex = Arc::new(Exports::new(&[spec], &FileOptions::default()).unwrap());
    let mut rig = Rig {
        sim: Simulation::new(1, 16),
        fabric: LoopbackFabric::new(),
        table: Arc::new(RnbdSessions::new(Arc::clone(&ex))),
        ex,
    };
    let mut c = rig.client(51, 8);
    let (vol, _) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    let size = |c: &rtrs_spdk::rnbd::client::RnbdClient<direct::DirectPort>| {
        c.device(vol).unwrap().info().unwrap().size
    };
    assert_eq!(size(&c), 2 * MIB);
    let buf = rig.mr(4096);
    let far = 3 * MIB;
    // Beyond the end: refused by the client itself, naming the size.
    let sgl = [buf.sge(0, 4096)];
    let e = rig
        .cx(|cx| c.submit(cx.now(), vol, 1, &BlockRequest::write(far, 4096), &sgl))
        .unwrap_err();
    assert!(
        e.to_string().contains("beyond the device's 2097152 bytes"),
        "{e}"
    );

    // Grown: the remap brings the new size; IO reaches the new end.
    file.set_len(4 * MIB).unwrap();
    assert_eq!(size(&c), 2 * MIB, "nothing changes before an OPEN");
    rig.cx(|cx| c.remap(cx.now(), vol)).unwrap();
    match &rig.events(&mut c, 1)[..] {
        [ClientEvent::Remapped { dev, info }] => assert_eq!((*dev, info.size), (vol, 4 * MIB)),
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.io(&mut c, vol, BlockRequest::write(far, 4096), &buf), 0);

    // Shrunk below that data, seen at the re-open after a reconnect: IO beyond the new
    // end fails at once, IO inside goes on.
    file.set_len(MIB).unwrap();
    rig.table.remove(51);
    c.link_down();
    rig.cx(|cx| c.link_up(cx.now()));
    let ev = rig.events(&mut c, 2);
    assert!(
        ev.iter().any(
            |e| matches!(e, ClientEvent::Opened { info, remap: true, .. } if info.size == MIB)
        ),
        "{ev:?}"
    );
    let e = rig
        .cx(|cx| c.submit(cx.now(), vol, 2, &BlockRequest::read(far, 4096), &sgl))
        .unwrap_err();
    assert!(
        e.to_string().contains("beyond the device's 1048576 bytes"),
        "{e}"
    );
    assert_eq!(rig.io(&mut c, vol, BlockRequest::read(0, 4096), &buf), 0);
    drop(file);
    let _ = std::fs::remove_file(&path);
}
