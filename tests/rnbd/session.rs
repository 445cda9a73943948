//! `RnbdClient` over a direct in-process port to the server's dispatcher (a stand-in
//! for RTRS that copies between the client's registered buffers and a chunk, as RTRS
//! does): SESS_INFO/OPEN/CLOSE as admin requests, access modes across two client
//! sessions, data, flush/discard/write-zeroes, busy retries, and a disconnect followed by
//! a re-open that adopts a new device id.

use crate::direct;

use std::time::Duration;

use direct::{Rig, CHUNK};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{BlockRequest, ClientEvent, DevState, IoError};

#[test]
fn two_sessions_modes_data_and_close() {
    let mut rig = Rig::new();
    let mut a = rig.client(1, 8);
    let mut b = rig.client(2, 8);
    let (a_rw, id) = rig.open(&mut a, "vol", AccessMode::ReadWrite);
    assert_eq!(id, Ok(0));
    assert_eq!(a.ver(), Some(2));
    assert_eq!(
        rig.open(&mut b, "vol", AccessMode::ReadWrite).1,
        Err(-libc::EPERM)
    );
    let (b_ro, id) = rig.open(&mut b, "vol", AccessMode::ReadOnly);
    // The failed RW open left no mapping, so the read-only one gets id 0.
    assert_eq!(id, Ok(0));
    assert_eq!(
        rig.open(&mut b, "nope", AccessMode::ReadOnly).1,
        Err(-libc::ENOENT)
    );
    let info = *a.device(a_rw).unwrap().info().unwrap();
    assert_eq!((info.size, info.max_io_size), (4 << 20, CHUNK as u32));

    let buf = rig.mr(CHUNK);
    let back = rig.mr(CHUNK);
    let mut len = 512;
    let mut off = 0u64;
    while len <= CHUNK {
        let pattern: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
        buf.write_at(0, &pattern);
        assert_eq!(
            rig.io(
                &mut a,
                a_rw,
                BlockRequest::write(off, len as u32).fua(),
                &buf
            ),
            0
        );
        // The other session's read-only mapping sees it.
        assert_eq!(
            rig.io(&mut b, b_ro, BlockRequest::read(off, len as u32), &back),
            0
        );
        let mut got = vec![0; len];
        back.read_at(0, &mut got);
        assert_eq!(got, pattern, "len {len}");
        off += len as u64;
        len *= 2;
    }
    assert_eq!(rig.io(&mut a, a_rw, BlockRequest::flush(), &buf), 0);
    assert_eq!(
        rig.io(&mut a, a_rw, BlockRequest::discard(0, 4096), &buf),
        0
    );
    assert_eq!(
        rig.io(
            &mut a,
            a_rw,
            BlockRequest::write_zeroes(4096, 4096).nounmap(),
            &buf
        ),
        0
    );
    assert_eq!(rig.io(&mut b, b_ro, BlockRequest::read(0, 8192), &back), 0);
    let mut got = vec![1; 8192];
    back.read_at(0, &mut got);
    assert!(got.iter().all(|&x| x == 0));
    // Client-side refusals.
    let e = rig.cx(|cx| {
        b.submit(
            cx.now(),
            b_ro,
            1,
            &BlockRequest::write(0, 512),
            &[buf.sge(0, 512)],
        )
    });
    assert_eq!(e.unwrap_err().errno().neg(), -libc::EROFS);
    let e = rig.cx(|cx| {
        a.submit(
            cx.now(),
            a_rw,
            1 << 63,
            &BlockRequest::read(0, 512),
            &[buf.sge(0, 512)],
        )
    });
    assert!(matches!(e, Err(IoError::BadTag { .. })));
    let e = rig.cx(|cx| {
        a.submit(
            cx.now(),
            a_rw,
            1,
            &BlockRequest::read(0, 1024),
            &[buf.sge(0, 512)],
        )
    });
    assert!(matches!(
        e,
        Err(IoError::SglLength {
            have: 512,
            want: 1024
        })
    ));

    // Close: the writer leaves, the other session may now write.
    rig.cx(|cx| a.close(cx.now(), a_rw)).unwrap();
    assert_eq!(
        rig.events(&mut a, 1),
        vec![ClientEvent::Closed { dev: a_rw }]
    );
    assert!(a.device(a_rw).is_none());
    let e = rig.cx(|cx| {
        a.submit(
            cx.now(),
            a_rw,
            1,
            &BlockRequest::read(0, 512),
            &[buf.sge(0, 512)],
        )
    });
    assert!(matches!(e, Err(IoError::NoDevice)));
    let (b_rw, id) = rig.open(&mut b, "aux", AccessMode::Migration);
    assert_eq!(id, Ok(1));
    // A name already open in the session is refused locally.
    let e = rig
        .cx(|cx| b.open(cx.now(), "vol", AccessMode::ReadWrite))
        .unwrap_err();
    assert_eq!(e.errno().neg(), -libc::EEXIST);
    assert_eq!(rig.io(&mut b, b_rw, BlockRequest::write(0, 512), &buf), 0);
    let vol = rig.ex.lookup(b"vol").unwrap();
    assert_eq!(rig.ex.writers(vol), 0);
}

#[test]
fn reconnect_reopens_with_new_ids() {
    let mut rig = Rig::new();
    // No wait for an unreachable device: IO is refused while disconnected (the wait is
    // tested in wait.rs).
    let mut c = rig.client_waiting(7, 4, Duration::ZERO);
    let (x, _) = rig.open(&mut c, "aux", AccessMode::ReadWrite);
    let (y, id) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    assert_eq!(id, Ok(1));
    let buf = rig.mr(4096);
    buf.write_at(0, &[9; 4096]);
    assert_eq!(rig.io(&mut c, y, BlockRequest::write(8192, 4096), &buf), 0);
    rig.cx(|cx| c.close(cx.now(), x)).unwrap();
    rig.events(&mut c, 1);

    // All paths lost: the server session ends, the client's devices wait.
    c.session_mut().connected = false;
    rig.table.remove(7);
    c.link_down();
    assert_eq!(c.device(y).unwrap().state(), DevState::MappedDisconnected);
    let e = rig.cx(|cx| {
        c.submit(
            cx.now(),
            y,
            1,
            &BlockRequest::read(0, 512),
            &[buf.sge(0, 512)],
        )
    });
    assert_eq!(e.unwrap_err().errno().neg(), -libc::ENOTCONN);
    assert_eq!(rig.ex.writers(rig.ex.lookup(b"vol").unwrap()), 0);

    // Back: SESS_INFO, then the re-open, which now gets id 0.
    c.session_mut().connected = true;
    rig.cx(|cx| c.link_up(cx.now()));
    let ev = rig.events(&mut c, 2);
    assert_eq!(ev[0], ClientEvent::SessInfo(Ok(2)));
    match &ev[1] {
        ClientEvent::Opened { dev, info, remap } => {
            assert_eq!((*dev, info.device_id, *remap), (y, 0, true));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.device(y).unwrap().device_id(), Some(0));
    let back = rig.mr(4096);
    assert_eq!(rig.io(&mut c, y, BlockRequest::read(8192, 4096), &back), 0);
    let mut got = vec![0; 4096];
    back.read_at(0, &mut got);
    assert_eq!(got, vec![9; 4096]);
}

/// 64 writes through a session of two chunks (at most two requests in flight): with a
/// wait configured, every submit is accepted and the queue sends them as chunks free up;
/// without one, the caller is told busy and submits again after polling. Either way all
/// 64 complete once and land.
#[test]
fn requests_beyond_the_ports_are_kept_or_retried() {
    for wait in [true, false] {
        writes_through_two_chunks(wait);
    }
}

fn writes_through_two_chunks(wait: bool) {
    let mut rig = Rig::new();
    // Two chunks: at most two requests in flight.
    let mut c = if wait {
        rig.client(3, 2)
    } else {
        rig.client_waiting(3, 2, std::time::Duration::ZERO)
    };
    let (d, _) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    let buf = rig.mr(64 * 512);
    for i in 0..64 {
        buf.write_at(i * 512, &[i as u8; 512]);
    }
    let mut next = 0usize;
    let mut done = 0usize;
    let mut busy = 0usize;
    let mut out = vec![
        ClientEvent::Io {
            tag: 0,
            result: Ok(())
        };
        8
    ];
    for _ in 0..10_000 {
        while next < 64 {
            let req = BlockRequest::write(next as u64 * 512, 512);
            match rig.cx(|cx| c.submit(cx.now(), d, next as u64, &req, &[buf.sge(next * 512, 512)]))
            {
                Ok(()) => next += 1,
                Err(e) if e.is_busy() => {
                    busy += 1;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        let n = rig.cx(|cx| c.poll(cx.now(), &mut out));
        for e in &out[..n] {
            assert!(matches!(e, ClientEvent::Io { result: Ok(()), .. }), "{e:?}");
        }
        done += n;
        if done == 64 {
            break;
        }
    }
    assert_eq!(done, 64);
    if wait {
        assert_eq!(busy, 0, "a queue with a wait keeps what it cannot send yet");
    } else {
        assert!(busy > 0, "no wait: the caller retries");
    }
    let back = rig.mr(64 * 512);
    let mut off = 0;
    while off < 64 * 512 {
        let len = 64 * 512 - off;
        let req = BlockRequest::read(off as u64, len as u32);
        let sgl = [back.sge(off, len)];
        rig.cx(|cx| c.submit(cx.now(), d, 5, &req, &sgl))
            .expect("the read-back is accepted");
        rig.events(&mut c, 1);
        off += len;
    }
    let mut got = vec![0; 64 * 512];
    back.read_at(0, &mut got);
    for i in 0..64 {
        assert!(got[i * 512..(i + 1) * 512].iter().all(|&x| x == i as u8));
    }
}

#[test]
fn a_name_is_opened_once_per_session() {
    let mut rig = Rig::new();
    let mut c = rig.client(12, 4);
    let (_, id) = rig.open(&mut c, "vol", AccessMode::ReadOnly);
    assert_eq!(id, Ok(0));
    let e = rig
        .cx(|cx| c.open(cx.now(), "vol", AccessMode::ReadWrite))
        .unwrap_err();
    assert_eq!(e.errno().neg(), -libc::EEXIST);
}
