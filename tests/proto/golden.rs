//! Golden bytes for every RTRS and RNBD message and imm encoding, written out by hand
//! from the layouts in docs/PROTOCOL.md (§1, §2, §2.10), checked in both directions:
//! our encoder produces exactly these bytes and our decoder reads them back.

use rtrs_spdk::proto::rnbd::{
    AccessMode, CachePolicy, Close, Io, Open, OpenRsp, RnbdFlags, RnbdMsg, RnbdOp, SessInfo,
    SessInfoRsp,
};
use rtrs_spdk::proto::{
    ChunkOp, ChunkReq, ConnAccept, ConnReq, ConnRsp, Imm, ImmLayout, InfoReq, InfoRsp, IoReq,
    IoRsp, RdmaRead, RdmaWrite, RkeyRsp, SgDesc, HB_ACK_IMM, HB_MSG_IMM,
};

/// `prefix` followed by zeros up to `N` bytes.
fn padded<const N: usize>(prefix: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a[..prefix.len()].copy_from_slice(prefix);
    a
}

#[test]
fn conn_req_golden() {
    #[rustfmt::skip]
    let golden: [u8; 56] = padded(&[
        0x00, 0x00,             // __cma_version, __ip_version: must be zero
        0xBD, 0x1B,             // magic 0x1BBD
        0x00, 0x02,             // version 0x0200
        0x01, 0x00,             // cid 1
        0x05, 0x00,             // cid_num 5
        0x03, 0x00,             // recon_cnt 3
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, // sess_uuid
        0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E, 0x1F,
        0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, // paths_uuid
        0x28, 0x29, 0x2A, 0x2B, 0x2C, 0x2D, 0x2E, 0x2F,
        0x01,                   // first_conn
        // 11 reserved zero bytes
    ]);
    let sess: [u8; 16] = core::array::from_fn(|i| 0x10 + i as u8);
    let paths: [u8; 16] = core::array::from_fn(|i| 0x20 + i as u8);
    let req = ConnReq::new(1, 5, 3, sess, paths, true);
    assert_eq!(req.to_bytes().unwrap(), golden);
    assert_eq!(ConnReq::decode(&golden), Ok(req));
}

#[test]
fn conn_rsp_accept_golden() {
    #[rustfmt::skip]
    let golden: [u8; 56] = padded(&[
        0xBD, 0x1B,             // magic
        0x00, 0x02,             // version
        0x00, 0x00,             // errno 0
        0x00, 0x02,             // queue_depth 512
        0x00, 0xF0, 0x01, 0x00, // max_io_size 126976 = 131072 - 4096
        0x00, 0x10, 0x00, 0x00, // max_hdr_size 4096
        0x02, 0x00, 0x00, 0x00, // flags NEW_RKEY_F
        // 36 reserved zero bytes
    ]);
    let rsp = ConnRsp::accept(512, 126_976, 4096, true);
    assert_eq!(rsp.to_bytes().unwrap(), golden);
    assert_eq!(ConnRsp::decode(&golden), Ok(rsp));
    let acc = ConnRsp::decode_accept(&golden, 32).unwrap();
    assert_eq!(
        acc,
        ConnAccept {
            queue_depth: 512,
            max_io_size: 126_976,
            max_hdr_size: 4096,
            new_rkey: true
        }
    );
    assert_eq!(acc.chunk_size(), 131_072);
}

#[test]
fn conn_rsp_reject_golden() {
    // −ECONNRESET (−104) stored as int16: 0xFF98.
    let golden: [u8; 56] = padded(&[0xBD, 0x1B, 0x00, 0x02, 0x98, 0xFF]);
    assert_eq!(ConnRsp::reject(-104).to_bytes().unwrap(), golden);
    assert_eq!(ConnRsp::reject(104).to_bytes().unwrap(), golden);
    assert_eq!(ConnRsp::decode(&golden), Ok(ConnRsp::reject(-104)));
    assert_eq!(ConnRsp::reject_errno(&golden), -104);
    // −ENXIO (−6) and −EEXIST (−17).
    let enxio: [u8; 56] = padded(&[0xBD, 0x1B, 0x00, 0x02, 0xFA, 0xFF]);
    assert_eq!(ConnRsp::reject(-6).to_bytes().unwrap(), enxio);
    let eexist: [u8; 56] = padded(&[0xBD, 0x1B, 0x00, 0x02, 0xEF, 0xFF]);
    assert_eq!(ConnRsp::reject_errno(&eexist), -17);
}

#[test]
fn info_req_golden() {
    let mut prefix = vec![0x00, 0x00]; // type INFO_REQ
    prefix.extend_from_slice(b"sess1"); // pathname, NUL-padded to 255, then 15 reserved
    let golden: [u8; 272] = padded(&prefix);
    let mut out = [0xAAu8; 272];
    assert_eq!(InfoReq::new("sess1").encode(&mut out), Ok(272));
    assert_eq!(out, golden);
    assert_eq!(InfoReq::decode(&golden).unwrap().pathname, b"sess1");
}

#[test]
fn info_rsp_golden() {
    #[rustfmt::skip]
    let golden: [u8; 40] = [
        0x01, 0x00,             // type INFO_RSP
        0x02, 0x00,             // sg_cnt 2
        0x00, 0x00, 0x00, 0x00, // reserved
        // desc[0]: addr 0x7F12_3456_0000, key 0xAABBCCDD, len 0x40000 (2 chunks)
        0x00, 0x00, 0x56, 0x34, 0x12, 0x7F, 0x00, 0x00,
        0xDD, 0xCC, 0xBB, 0xAA,
        0x00, 0x00, 0x04, 0x00,
        // desc[1]: addr 0x80000, key 0x11, len 0x20000 (1 chunk)
        0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x11, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x02, 0x00,
    ];
    let descs = [
        SgDesc {
            addr: 0x7F12_3456_0000,
            key: 0xAABB_CCDD,
            len: 0x40000,
        },
        SgDesc {
            addr: 0x80000,
            key: 0x11,
            len: 0x20000,
        },
    ];
    let mut out = [0u8; 8 + 16 * 3]; // the client's receive buffer for qd 3
    assert_eq!(InfoRsp::encode(descs, &mut out), Ok(40));
    assert_eq!(out[..40], golden);
    let rsp = InfoRsp::decode(&out, 3, 131_072).unwrap();
    assert!(rsp.descs().eq(descs));
    let chunks: Vec<(u64, u32)> = rsp.chunks().collect();
    assert_eq!(
        chunks,
        [
            (0x7F12_3456_0000, 0xAABB_CCDD),
            (0x7F12_3458_0000, 0xAABB_CCDD),
            (0x80000, 0x11)
        ]
    );
}

#[test]
fn rkey_rsp_golden() {
    // type RKEY_RSP, buf_id 7, rkey 0x01020304
    let golden = [0x04, 0x00, 0x07, 0x00, 0x04, 0x03, 0x02, 0x01];
    let k = RkeyRsp {
        buf_id: 7,
        rkey: 0x0102_0304,
    };
    assert_eq!(k.to_bytes(), golden);
    assert_eq!(RkeyRsp::decode(&golden, 512, 7), Ok(k));
}

#[test]
fn rdma_write_golden() {
    let golden = [0x02, 0x00, 0x20, 0x00]; // type WRITE, usr_len 32
    assert_eq!(RdmaWrite { usr_len: 32 }.to_bytes(), golden);
    assert_eq!(RdmaWrite::decode(&golden), Ok(RdmaWrite { usr_len: 32 }));
}

#[test]
fn rdma_read_golden() {
    #[rustfmt::skip]
    let with_desc = [
        0x03, 0x00,             // type READ
        0x20, 0x00,             // usr_len 32
        0x01, 0x00,             // flags NEED_INVAL_F
        0x01, 0x00,             // sg_cnt 1
        0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // addr 0x1000
        0x55, 0x00, 0x00, 0x00, // key 0x55
        0x24, 0x00, 0x00, 0x00, // len 36
    ];
    let rd = RdmaRead {
        usr_len: 32,
        desc: Some(SgDesc {
            addr: 0x1000,
            key: 0x55,
            len: 36,
        }),
        need_inval: true,
    };
    let mut out = [0u8; 24];
    assert_eq!(rd.encode(&mut out), Ok(24));
    assert_eq!(out, with_desc);
    assert_eq!(RdmaRead::decode(&with_desc), Ok(rd));

    // A flush: READ with no descriptor.
    let bare = [0x03, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00];
    let rd = RdmaRead {
        usr_len: 32,
        desc: None,
        need_inval: false,
    };
    assert_eq!(rd.encode(&mut out), Ok(8));
    assert_eq!(out[..8], bare);
    assert_eq!(RdmaRead::decode(&bare), Ok(rd));
}

#[test]
fn chunk_layout_golden() {
    // A 36-byte SESS_INFO read: [0,36) reply area, usr header at 36, trailer at 72.
    let mut chunk = [0u8; 8192];
    let sess = SessInfo { ver: 2 }.to_bytes();
    chunk[36..72].copy_from_slice(&sess);
    #[rustfmt::skip]
    chunk[72..96].copy_from_slice(&[
        0x03, 0x00, 0x24, 0x00, 0x01, 0x00, 0x01, 0x00,
        0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x99, 0x00, 0x00, 0x00, 0x24, 0x00, 0x00, 0x00,
    ]);
    let l = ImmLayout::new(512, 8192).unwrap();
    let imm = l.io_req(0, 72).unwrap();
    assert_eq!(imm, 0x0000_0048);
    let req = l.decode_io_req_imm(imm).unwrap();
    let c = ChunkReq::decode_in_chunk(&chunk, req.offset).unwrap();
    assert_eq!((c.data_len(), c.usr_range()), (36, 36..72));
    assert_eq!(
        c.op,
        ChunkOp::Read {
            desc: Some(SgDesc {
                addr: 0x2000,
                key: 0x99,
                len: 36
            }),
            need_inval: true
        }
    );
    assert_eq!(
        RnbdMsg::decode(&chunk[c.usr_range()]),
        Ok(RnbdMsg::SessInfo(SessInfo { ver: 2 }))
    );
}

#[test]
fn imm_golden() {
    // qd 512: chunk_bits 9, mem_bits 19; buf_id 3, offset 0x1F004 → payload 0x19F004.
    let l = ImmLayout::new(512, 131_072).unwrap();
    assert_eq!(l.mem_off(3), Ok(0x18_0000));
    assert_eq!(l.io_req(3, 0x1F004), Ok(0x0019_F004));
    assert_eq!(
        l.decode_io_req_imm(0x0019_F004),
        Ok(IoReq {
            buf_id: 3,
            offset: 0x1F004
        })
    );
    // msg 5 failing with EIO: 0x10280005; success 0x10000005; W_INV type 2.
    assert_eq!(IoRsp::new(5, -5, false).unwrap().to_imm(), 0x1028_0005);
    assert_eq!(IoRsp::new(5, 0, false).unwrap().to_imm(), 0x1000_0005);
    assert_eq!(IoRsp::new(5, 0, true).unwrap().to_imm(), 0x2000_0005);
    let Ok(Imm::IoRsp(r)) = Imm::decode(0x1028_0005) else {
        panic!("IO_RSP imm not decoded");
    };
    assert_eq!((r.msg_id(), r.errno(), r.w_inv()), (5, -5, false));
    // Heartbeats.
    assert_eq!((HB_MSG_IMM, HB_ACK_IMM), (0x8000_0000, 0x9000_0000));
    assert_eq!(Imm::decode(0x8000_0000), Ok(Imm::HbMsg));
    assert_eq!(Imm::decode(0x9000_0000), Ok(Imm::HbAck));
    // On the wire (verbs imm_data) the value is big-endian.
    assert_eq!(0x1028_0005u32.to_be_bytes(), [0x10, 0x28, 0x00, 0x05]);
}

#[test]
fn rnbd_sess_info_golden() {
    let golden: [u8; 36] = padded(&[0x00, 0x00, 0x00, 0x00, 0x02]);
    assert_eq!(SessInfo { ver: 2 }.to_bytes(), golden);
    assert_eq!(SessInfo::decode(&golden), Ok(SessInfo { ver: 2 }));
    let golden_rsp: [u8; 36] = padded(&[0x01, 0x00, 0x00, 0x00, 0x02]);
    assert_eq!(SessInfoRsp { ver: 2 }.to_bytes(), golden_rsp);
    assert_eq!(SessInfoRsp::decode(&golden_rsp), Ok(SessInfoRsp { ver: 2 }));
}

#[test]
fn rnbd_open_golden() {
    let mut prefix = vec![0x02, 0x00, 0x00, 0x00, 0x01, 0x00]; // type OPEN, hdr pad, rw, resv1
    prefix.extend_from_slice(b"nvme0n1"); // dev_name NUL-padded to 255, then 3 reserved
    let golden: [u8; 264] = padded(&prefix);
    let o = Open {
        access_mode: AccessMode::ReadWrite,
        dev_name: b"nvme0n1",
    };
    let mut out = [0xEEu8; 264];
    assert_eq!(o.encode(&mut out), Ok(264));
    assert_eq!(out, golden);
    assert_eq!(Open::decode(&golden), Ok(o));
    assert_eq!(RnbdMsg::decode(&golden), Ok(RnbdMsg::Open(o)));
}

#[test]
fn rnbd_open_rsp_golden() {
    #[rustfmt::skip]
    let golden: [u8; 56] = padded(&[
        0x03, 0x00, 0x00, 0x00, // hdr: type OPEN_RSP
        0x07, 0x00, 0x00, 0x00, // device_id 7
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // nsectors 2^32 (2 TiB)
        0x00, 0x01, 0x00, 0x00, // max_hw_sectors 256
        0x00, 0x00, 0x01, 0x00, // max_write_zeroes_sectors 65536
        0x00, 0x00, 0x02, 0x00, // max_discard_sectors 131072
        0x00, 0x10, 0x00, 0x00, // discard_granularity 4096
        0x00, 0x00, 0x00, 0x00, // discard_alignment 0
        0x00, 0x10,             // physical_block_size 4096
        0x00, 0x02,             // logical_block_size 512
        0x80, 0x00,             // max_segments 128
        0x01, 0x00,             // secure_discard 1
        0x00,                   // obsolete_rotational
        0x03,                   // cache_policy FUA | WRITEBACK
        // 10 reserved zero bytes
    ]);
    let rsp = OpenRsp {
        device_id: 7,
        nsectors: 1 << 32,
        max_hw_sectors: 256,
        max_write_zeroes_sectors: 65_536,
        max_discard_sectors: 131_072,
        discard_granularity: 4096,
        discard_alignment: 0,
        physical_block_size: 4096,
        logical_block_size: 512,
        max_segments: 128,
        secure_discard: 1,
        cache_policy: CachePolicy {
            fua: true,
            writeback: true,
        },
    };
    let mut out = [0xEEu8; 56];
    assert_eq!(rsp.encode(&mut out), Ok(56));
    assert_eq!(out, golden);
    assert_eq!(OpenRsp::decode(&golden), Ok(rsp));
}

#[test]
fn rnbd_close_golden() {
    let golden = [0x05, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00];
    assert_eq!(Close { device_id: 7 }.to_bytes(), golden);
    assert_eq!(
        RnbdMsg::decode(&golden),
        Ok(RnbdMsg::Close(Close { device_id: 7 }))
    );
}

#[test]
fn rnbd_io_golden() {
    #[rustfmt::skip]
    let golden: [u8; 32] = [
        0x04, 0x00, 0x00, 0x00, // hdr: type IO
        0x07, 0x00, 0x00, 0x00, // device_id 7
        0x9A, 0x78, 0x56, 0x34, 0x12, 0x00, 0x00, 0x00, // sector 0x12_3456_789A
        0x05, 0x09, 0x00, 0x00, // rw: WRITE_ZEROES | SYNC | NOUNMAP = 0x905
        0x00, 0x00, 0x10, 0x00, // bi_size 1 MiB
        0x04, 0x60,             // prio 0x6004
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // padding (zeroed)
    ];
    let io = Io {
        device_id: 7,
        sector: 0x12_3456_789A,
        op: RnbdOp::WriteZeroes,
        flags: RnbdFlags::SYNC | RnbdFlags::NOUNMAP,
        bi_size: 0x10_0000,
        prio: 0x6004,
    };
    assert_eq!(io.rw(), 0x905);
    assert_eq!(io.to_bytes(), golden);
    assert_eq!(Io::decode(&golden), Ok(io));
    assert_eq!(RnbdMsg::decode(&golden), Ok(RnbdMsg::Io(io)));
    // A 24-byte (pre-prio) header decodes with prio 0.
    assert_eq!(Io::decode(&golden[..24]), Ok(Io { prio: 0, ..io }));
    // The flag bits: SYNC 0x100, FUA 0x200, PREFLUSH 0x400, NOUNMAP 0x800.
    let all = RnbdFlags::SYNC | RnbdFlags::FUA | RnbdFlags::PREFLUSH | RnbdFlags::NOUNMAP;
    assert_eq!(
        (
            RnbdFlags::SYNC.bits(),
            RnbdFlags::FUA.bits(),
            RnbdFlags::PREFLUSH.bits()
        ),
        (0x100, 0x200, 0x400)
    );
    assert_eq!((RnbdFlags::NOUNMAP.bits(), all), (0x800, RnbdFlags::ALL));
}
