//! The wire operations: sends, writes, immediates, invalidation, RNR, large and many.

use super::*;

#[test]
fn send_and_send_with_imm_into_receive_buffers() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 4096, Access::NONE);
    let dst = reg(&p.sf, 4096, Access::LOCAL_WRITE);
    src.write_at(0, &pattern(300, 1));
    p.s.post_recv(&[
        RecvWr {
            wr_id: 10,
            sge: Some(dst.sge(0, 1024)),
        },
        RecvWr {
            wr_id: 11,
            sge: Some(dst.sge(1024, 1024)),
        },
    ])
    .unwrap();
    let sges = [src.sge(0, 100), src.sge(100, 200)];
    p.c.post_send(&[
        wr(1, SendOp::Send, &sges, true),
        wr(
            2,
            SendOp::SendWithImm { imm: 0xfeed_beef },
            &sges[..1],
            true,
        ),
    ])
    .unwrap();
    p.wait("two receives and two sends", |p| {
        p.sw.len() == 2 && p.cw.len() == 2
    });
    assert_eq!(
        (p.sw[0].wr_id, p.sw[0].status, p.sw[0].opcode),
        (10, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!((p.sw[0].byte_len, p.sw[0].imm), (300, None));
    assert_eq!(
        (p.sw[1].wr_id, p.sw[1].byte_len, p.sw[1].imm),
        (11, 100, Some(0xfeed_beef))
    );
    let mut out = vec![0u8; 300];
    dst.read_at(0, &mut out);
    assert_eq!(out, pattern(300, 1));
    dst.read_at(1024, &mut out[..100]);
    assert_eq!(out[..100], pattern(100, 1)[..]);
    assert!(p
        .cw
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send));
    assert_eq!((p.cw[0].wr_id, p.cw[1].wr_id), (1, 2));
}

#[test]
fn write_data_is_visible_before_the_immediate() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 64 * 1024, Access::NONE);
    let dst = reg(&p.sf, 64 * 1024, RW);
    src.write_at(0, &pattern(64 * 1024, 7));
    p.s.post_recv(&[
        RecvWr {
            wr_id: 1,
            sge: None,
        },
        RecvWr {
            wr_id: 2,
            sge: None,
        },
    ])
    .unwrap();
    let a = [src.sge(0, 60_000)];
    let b = [src.sge(60_000, 4096)];
    p.c.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &a,
            false,
        ),
        wr(
            2,
            SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr() + 60_000,
                rkey: dst.rkey(),
                imm: 42,
            },
            &b,
            true,
        ),
    ])
    .unwrap();
    let mut out = vec![0u8; 64_096];
    let wc = until("the immediate", || {
        let mut wcs = [Wc::default(); 4];
        p.c.poll_cq(&mut wcs);
        (p.s.poll_cq(&mut wcs) == 1).then_some(wcs[0])
    });
    // Checked right at the completion: every byte of both writes is already there.
    dst.read_at(0, &mut out);
    assert_eq!(out[..], pattern(64 * 1024, 7)[..64_096]);
    assert_eq!(
        (wc.opcode, wc.imm, wc.byte_len, wc.wr_id),
        (WcOpcode::RecvRdmaWithImm, Some(42), 4096, 1)
    );
    p.wait("the write completion", |p| p.cw.len() == 1);
    assert_eq!(
        (p.cw[0].wr_id, p.cw[0].status, p.cw[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
}

#[test]
fn zero_length_write_with_imm() {
    let mut p = Pair::new(QpCaps::default());
    p.s.post_recv(&[RecvWr {
        wr_id: 3,
        sge: None,
    }])
    .unwrap();
    p.c.post_send(&[wr(
        9,
        SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm: 7,
        },
        &[],
        true,
    )])
    .unwrap();
    p.wait("the zero-length write", |p| {
        p.sw.len() == 1 && p.cw.len() == 1
    });
    assert_eq!(
        (p.sw[0].opcode, p.sw[0].byte_len, p.sw[0].imm),
        (WcOpcode::RecvRdmaWithImm, 0, Some(7))
    );
    assert_eq!((p.cw[0].wr_id, p.cw[0].status), (9, WcStatus::Success));
}

#[test]
fn send_with_inv_invalidates_the_rkey() {
    let mut p = Pair::new(QpCaps::default());
    let region = reg(&p.sf, 8192, RW);
    let slot = p.sf.alloc_fast_mr(KeyScope::Connection).unwrap();
    let rkey = inc_rkey(slot.rkey());
    p.s.post_send(&[wr(
        1,
        SendOp::RegMr {
            slot: &slot,
            region: &region,
            addr: region.addr(),
            len: 4096,
            access: RW,
            rkey,
        },
        &[],
        true,
    )])
    .unwrap();
    p.wait("the registration", |p| p.sw.len() == 1);
    assert_eq!(
        (p.sw[0].opcode, p.sw[0].status),
        (WcOpcode::RegMr, WcStatus::Success)
    );
    p.sw.clear();

    let src = reg(&p.cf, 4096, Access::NONE);
    src.write_at(0, b"through the fast registration");
    p.s.post_recv(&[RecvWr {
        wr_id: 2,
        sge: None,
    }])
    .unwrap();
    let s = [src.sge(0, 29)];
    p.c.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: region.addr() + 8,
                rkey,
            },
            &s,
            false,
        ),
        wr(2, SendOp::SendWithInv { rkey }, &[], true),
    ])
    .unwrap();
    p.wait("the invalidating send", |p| {
        p.sw.len() == 1 && p.cw.len() == 1
    });
    assert_eq!(p.sw[0].invalidated_rkey, Some(rkey));
    let mut out = [0u8; 29];
    region.read_at(8, &mut out);
    assert_eq!(&out, b"through the fast registration");

    // The key is retired: a write with it is a remote access error, and both break.
    p.c.post_send(&[wr(
        3,
        SendOp::RdmaWrite {
            remote_addr: region.addr(),
            rkey,
        },
        &s,
        true,
    )])
    .unwrap();
    p.wait("the refused write", |p| p.cw.len() == 2);
    assert_eq!((p.cw[1].wr_id, p.cw[1].status), (3, WcStatus::RemoteAccess));
    p.both_disconnected();
}

#[test]
fn rnr_stalls_then_delivers_in_order() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 4096, Access::NONE);
    let dst = reg(&p.sf, 4096, RW);
    src.write_at(0, &pattern(64, 3));
    let s = [src.sge(0, 64)];
    p.c.post_send(&[
        wr(1, SendOp::SendWithImm { imm: 1 }, &[], true),
        wr(
            2,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &s,
            true,
        ),
        wr(
            3,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 3,
            },
            &[],
            true,
        ),
    ])
    .unwrap();
    for _ in 0..200 {
        p.drive();
    }
    assert!(
        p.sw.is_empty() && p.cw.is_empty(),
        "nothing executes without a receive"
    );
    assert!(p.cev.is_empty() && p.sev.is_empty(), "RNR is not an error");
    let mut out = [0u8; 64];
    dst.read_at(0, &mut out);
    assert_eq!(out, [0; 64], "the write behind the stalled send waits too");
    p.s.post_recv(&[RecvWr {
        wr_id: 10,
        sge: None,
    }])
    .unwrap();
    p.wait("the first receive", |p| p.sw.len() == 1 && p.cw.len() == 2);
    assert_eq!(p.sw[0].imm, Some(1));
    dst.read_at(0, &mut out);
    assert_eq!(out[..], pattern(64, 3)[..]);
    p.s.post_recv(&[RecvWr {
        wr_id: 11,
        sge: None,
    }])
    .unwrap();
    p.wait("the second receive", |p| p.sw.len() == 2 && p.cw.len() == 3);
    assert_eq!((p.sw[1].wr_id, p.sw[1].imm), (11, Some(3)));
    assert_eq!(p.cw.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
}

#[test]
fn a_large_write_arrives_intact() {
    const LEN: usize = 3 * 1024 * 1024 + 123;
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, LEN, Access::NONE);
    let dst = reg(&p.sf, LEN + 4096, RW);
    let data = pattern(LEN, 99);
    src.write_at(0, &data);
    p.s.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }])
    .unwrap();
    let s = [src.sge(0, LEN / 2), src.sge(LEN / 2, LEN - LEN / 2)];
    p.c.post_send(&[wr(
        1,
        SendOp::RdmaWriteWithImm {
            remote_addr: dst.addr() + 1,
            rkey: dst.rkey(),
            imm: 5,
        },
        &s,
        true,
    )])
    .unwrap();
    p.wait("the large write", |p| p.sw.len() == 1 && p.cw.len() == 1);
    assert_eq!(p.sw[0].byte_len as usize, LEN);
    let mut out = vec![0u8; LEN];
    dst.read_at(1, &mut out);
    assert!(out == data, "payload corrupted");
}

#[test]
fn thousands_of_operations_in_flight_in_order() {
    const N: u64 = 3000;
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 4096,
        max_send_sge: 2,
    };
    let mut p = Pair::new(caps);
    let src = reg(&p.cf, 8 * N as usize, Access::NONE);
    let dst = reg(&p.sf, 8 * N as usize, RW);
    let recvs: Vec<RecvWr> = (0..N)
        .map(|i| RecvWr {
            wr_id: i,
            sge: None,
        })
        .collect();
    p.s.post_recv(&recvs).unwrap();
    for i in 0..N {
        src.write_at(8 * i as usize, &i.to_le_bytes());
    }
    let mut next = 0u64;
    until("all operations", || {
        while next < N {
            let at = 8 * next as usize;
            let s = [src.sge(at, 8)];
            // Alternate a plain write with a write-with-imm naming the same bytes; signal
            // every 16th so the unsignaled ones are retired by later completions.
            let op = if next % 2 == 0 {
                SendOp::RdmaWrite {
                    remote_addr: dst.addr() + at as u64,
                    rkey: dst.rkey(),
                }
            } else {
                SendOp::RdmaWriteWithImm {
                    remote_addr: dst.addr() + at as u64,
                    rkey: dst.rkey(),
                    imm: next as u32,
                }
            };
            match p
                .c
                .post_send(&[wr(next, op, &s, next % 16 == 15 || next == N - 1)])
            {
                Ok(()) => next += 1,
                Err(e) if e.kind == PostErrorKind::QueueFull => break,
                Err(e) => panic!("{e}"),
            }
        }
        p.drive();
        (p.sw.len() as u64 == N / 2 && p.cw.last().is_some_and(|w| w.wr_id == N - 1)).then_some(())
    });
    for (k, w) in p.sw.iter().enumerate() {
        let i = 2 * k as u64 + 1;
        assert_eq!(
            (w.wr_id, w.imm, w.status),
            (k as u64, Some(i as u32), WcStatus::Success)
        );
        let mut b = [0u8; 8];
        dst.read_at(8 * (i - 1) as usize, &mut b);
        assert_eq!(
            u64::from_le_bytes(b),
            i - 1,
            "the write before imm {i} is in place"
        );
    }
    assert!(p.cw.iter().all(|w| w.status == WcStatus::Success));
    let ids: Vec<u64> = p.cw.iter().map(|w| w.wr_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn the_data_path_does_not_allocate() {
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
    };
    let mut p = Pair::new(caps);
    let src = reg(&p.cf, 8192, Access::NONE);
    let dst = reg(&p.sf, 8192, RW);
    let rbuf = reg(&p.sf, 8192, Access::LOCAL_WRITE);
    let sges = [src.sge(0, 2048), src.sge(4096, 2048)];
    let write = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        imm: 1,
    };
    let mut wcs = [Wc::default(); 16];
    let mut round = |i: u64, c: &mut Box<dyn Conn>, s: &mut Box<dyn Conn>| {
        s.post_recv(&[
            RecvWr {
                wr_id: i,
                sge: None,
            },
            RecvWr {
                wr_id: i,
                sge: Some(rbuf.sge(0, 4096)),
            },
        ])
        .unwrap();
        let ops = [
            wr(i, write, &sges, i % 4 == 0),
            wr(i, SendOp::SendWithImm { imm: 2 }, &sges[..1], true),
        ];
        c.post_send(&ops).unwrap();
        let mut got = 0;
        let start = Instant::now();
        while got < 2 {
            got += s.poll_cq(&mut wcs);
            c.poll_cq(&mut wcs);
            assert!(start.elapsed() < DEADLINE, "round {i} stuck");
        }
    };
    for i in 0..100 {
        round(i, &mut p.c, &mut p.s);
    }
    let probe = counting::allocations();
    drop(std::hint::black_box(vec![0u8; 16]));
    assert!(
        counting::allocations() > probe,
        "the allocation counter counts"
    );
    let before = counting::allocations();
    for i in 100..2100 {
        round(i, &mut p.c, &mut p.s);
    }
    assert_eq!(
        counting::allocations() - before,
        0,
        "allocations on the tcp data path"
    );
}
