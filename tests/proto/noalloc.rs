//! The wire codecs never allocate: a counting global allocator watches this thread while
//! every decoder (on valid and invalid input) and every IO-path encoder runs.

use crate::counting;

use rtrs_spdk::proto::rnbd::{
    AccessMode, Close, Io, Open, OpenRsp, RnbdFlags, RnbdMsg, RnbdOp, SessInfo,
};
use rtrs_spdk::proto::{
    read_placement, write_placement, ChunkReq, ConnReq, ConnRsp, Imm, ImmLayout, InfoReq, InfoRsp,
    IoRsp, RdmaRead, RdmaWrite, RkeyRsp, SgDesc,
};

fn allocs() -> u64 {
    counting::allocations()
}

#[test]
fn codecs_do_not_allocate() {
    // The counter sees this thread's allocations.
    let start = allocs();
    let probe = std::hint::black_box(Box::new(1u64));
    assert!(allocs() > start);
    drop(probe);

    // Inputs are built before counting starts.
    let conn_req = ConnReq::new(0, 2, 1, [1; 16], [2; 16], true)
        .to_bytes()
        .unwrap();
    let conn_rsp = ConnRsp::accept(512, 126_976, 4096, true)
        .to_bytes()
        .unwrap();
    let mut info_req = [0u8; 272];
    InfoReq::new("sess").encode(&mut info_req).unwrap();
    let descs = [SgDesc {
        addr: 0x1000,
        key: 1,
        len: 4 * 8192,
    }];
    let mut info_rsp = [0u8; 8 + 16 * 4];
    InfoRsp::encode(descs, &mut info_rsp).unwrap();
    let mut chunk = vec![0u8; 8192];
    let read = RdmaRead {
        usr_len: 32,
        desc: Some(SgDesc {
            addr: 0x2000,
            key: 2,
            len: 512,
        }),
        need_inval: true,
    };
    read.encode(&mut chunk[512 + 32..]).unwrap();
    let io = Io {
        device_id: 1,
        sector: 2,
        op: RnbdOp::Read,
        flags: RnbdFlags::SYNC,
        bi_size: 512,
        prio: 0,
    }
    .to_bytes();
    let mut open = [0u8; 264];
    Open {
        access_mode: AccessMode::ReadWrite,
        dev_name: b"disk",
    }
    .encode(&mut open)
    .unwrap();
    let garbage = [0xA5u8; 300];
    let mut out = [0u8; 512];

    let before = allocs();
    let mut ok = 0usize;
    for input in [&garbage[..], &garbage[..3]] {
        ok += usize::from(ConnReq::decode(input).is_ok());
        ok += usize::from(ConnRsp::decode(input).is_ok());
        ok += usize::from(InfoReq::decode(input).is_ok());
        ok += usize::from(InfoRsp::decode(input, 4, 8192).is_ok());
        ok += usize::from(RnbdMsg::decode(input).is_ok());
        ok += usize::from(ChunkReq::decode(input, 0, 8192).is_ok());
        ok += usize::from(OpenRsp::decode(input).is_ok());
    }
    assert_eq!(ok, 0);
    assert!(ConnReq::decode(&conn_req).is_ok());
    assert!(ConnRsp::decode_accept(&conn_rsp, 264).is_ok());
    assert!(InfoReq::decode(&info_req).is_ok());
    let rsp = InfoRsp::decode(&info_rsp, 4, 8192).unwrap();
    assert_eq!(rsp.chunks().count(), 4);
    let l = ImmLayout::new(512, 8192).unwrap();
    let imm = l.io_req(7, 512 + 32).unwrap();
    let req = l.decode_io_req_imm(imm).unwrap();
    let c = ChunkReq::decode_in_chunk(&chunk, req.offset).unwrap();
    assert_eq!(c.data_len(), 512);
    assert!(matches!(
        Imm::decode(IoRsp::new(7, -5, true).unwrap().to_imm()),
        Ok(Imm::IoRsp(_))
    ));
    assert!(RkeyRsp::decode(&RkeyRsp { buf_id: 7, rkey: 9 }.to_bytes(), 512, 7).is_ok());
    assert!(matches!(RnbdMsg::decode(&io), Ok(RnbdMsg::Io(_))));
    assert!(matches!(RnbdMsg::decode(&open), Ok(RnbdMsg::Open(_))));
    assert!(RnbdMsg::decode(&Close { device_id: 1 }.to_bytes()).is_ok());
    assert!(RnbdMsg::decode(&SessInfo { ver: 2 }.to_bytes()).is_ok());
    let p = read_placement(512, 32, 1, 8192, 4096).unwrap();
    let w = write_placement(4096, 32, 8192, 4096).unwrap();
    assert!(read.encode(&mut out).is_ok());
    assert!(RdmaWrite { usr_len: 32 }.encode(&mut out).is_ok());
    assert!(ConnReq::new(1, 2, 1, [1; 16], [2; 16], false)
        .encode(&mut out)
        .is_ok());
    assert!(InfoRsp::encode(rsp.descs(), &mut out).is_ok());
    let after = allocs();

    assert_eq!((p.imm_offset, w.imm_offset), (544, 4128));
    assert_eq!(
        after - before,
        0,
        "the codecs allocated {} times",
        after - before
    );
}
