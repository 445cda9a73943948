//! Deterministic fuzz loop over every wire decoder, run in the normal test suite.
//!
//! Each decoder gets `PER_TARGET` inputs from a seeded xorshift generator: half purely
//! random bytes (lengths clustered around the message size), half valid encodings with
//! random field values, mutated (bit flips, byte sets, truncation, extension). Every
//! input goes through the round-trip oracle in `fuzz/roundtrip.rs` (shared with the
//! cargo-fuzz target): no panic, and whatever decodes re-encodes to the same
//! meaningful bytes. Every unmutated valid encoding must decode.

#[path = "../../fuzz/roundtrip.rs"]
mod roundtrip;

use roundtrip::{check, Ctx, Target, TARGETS};
use rtrs_spdk::proto::rnbd::{
    AccessMode, CachePolicy, Close, Io, Open, OpenRsp, RnbdFlags, RnbdOp, SessInfo, SessInfoRsp,
};
use rtrs_spdk::proto::{
    read_placement, write_placement, ConnReq, ConnRsp, Imm, ImmLayout, InfoReq, InfoRsp, IoRsp,
    RdmaRead, RdmaWrite, RkeyRsp, SgDesc,
};

/// Inputs per decoder; 16 decoders × 65536 = 1,048,576 inputs in total.
const PER_TARGET: usize = 65_536;
const _: () = assert!(PER_TARGET * TARGETS.len() >= 1_000_000);

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: u64, hi_incl: u64) -> u64 {
        lo + self.below(hi_incl - lo + 1)
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    fn uuid(&mut self) -> [u8; 16] {
        let mut u = [0; 16];
        self.fill(&mut u);
        u
    }
    fn name(&mut self, max: usize) -> Vec<u8> {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_-";
        let len = self.range(1, max as u64) as usize;
        (0..len)
            .map(|_| CHARS[self.below(CHARS.len() as u64) as usize])
            .collect()
    }
}

fn wire_size(t: Target) -> usize {
    match t {
        Target::ConnReq | Target::ConnRsp => 56,
        Target::InfoReq => 272,
        Target::InfoRsp => 8 + 16 * 4,
        Target::RkeyRsp | Target::Close => 8,
        Target::RdmaWrite | Target::Imm => 4,
        Target::RdmaRead | Target::Chunk => 24,
        Target::SessInfo | Target::SessInfoRsp => 36,
        Target::Open => 264,
        Target::OpenRsp => 56,
        Target::Io => 32,
        Target::RnbdMsg => 36,
    }
}

fn random_ctx(r: &mut Rng) -> Ctx {
    let queue_depth = match r.below(4) {
        0 => 1,
        1 => r.range(1, 64) as u16,
        2 => 512,
        _ => r.range(1, 65535) as u16,
    };
    let chunk_size = if r.chance(8) {
        r.range(1, 40) as u32
    } else if r.chance(4) {
        r.range(1, 1 << 20) as u32
    } else {
        1 << r.range(12, 20)
    };
    Ctx {
        queue_depth,
        chunk_size,
        msg_id: r.below(u64::from(queue_depth) + 2) as u32,
        offset: r.below(u64::from(chunk_size)) as u32,
        max_usr_hdr: r.below(600) as u32,
    }
}

/// A valid encoding for `t` with random fields; adjusts `ctx` to the session it needs.
fn valid(t: Target, r: &mut Rng, ctx: &mut Ctx, out: &mut Vec<u8>) {
    out.clear();
    match t {
        Target::ConnReq => {
            let cid_num = r.range(1, 4096) as u16;
            let q = ConnReq::new(
                r.below(u64::from(cid_num)) as u16,
                cid_num,
                r.next() as u16,
                r.uuid(),
                r.uuid(),
                r.chance(2),
            );
            out.extend_from_slice(&q.to_bytes().unwrap());
        }
        Target::ConnRsp => {
            let rsp = if r.chance(3) {
                ConnRsp::reject(-(r.range(1, 32767) as i32))
            } else {
                let qd = r.range(1, 2048) as u16;
                let hdr = 1u32 << r.range(9, 16);
                ctx.max_usr_hdr = r.below(u64::from(hdr) - 24) as u32;
                let max_io = (1u32 << r.range(12, 17)).saturating_sub(hdr).max(1);
                ConnRsp::accept(qd, max_io, hdr, r.chance(2))
            };
            match rsp.to_bytes() {
                Ok(b) => out.extend_from_slice(&b),
                Err(_) => out.extend_from_slice(&ConnRsp::reject(104).to_bytes().unwrap()),
            }
        }
        Target::InfoReq => {
            let name = r.name(254);
            out.resize(InfoReq::LEN, 0);
            InfoReq { pathname: &name }.encode(out).unwrap();
        }
        Target::InfoRsp => {
            let qd = r.range(1, 64) as u16;
            let cs = 1u32 << r.range(12, 17);
            *ctx = Ctx {
                queue_depth: qd,
                chunk_size: cs,
                ..*ctx
            };
            let sg_cnt = r.range(1, u64::from(qd));
            // Split qd chunks into sg_cnt non-empty runs.
            let mut left = u64::from(qd);
            let mut descs = Vec::new();
            for i in 0..sg_cnt {
                let rest = sg_cnt - i - 1;
                let n = if rest == 0 {
                    left
                } else {
                    r.range(1, left - rest)
                };
                left -= n;
                descs.push(SgDesc {
                    addr: r.next() & 0x0000_ffff_ffff_f000,
                    key: r.next() as u32,
                    len: (n as u32) * cs,
                });
            }
            out.resize(InfoRsp::wire_len(sg_cnt as u16), 0);
            InfoRsp::encode(descs.iter().copied(), out).unwrap();
        }
        Target::RkeyRsp => {
            ctx.msg_id = r.below(u64::from(ctx.queue_depth)) as u32;
            let k = RkeyRsp {
                buf_id: ctx.msg_id as u16,
                rkey: r.next() as u32,
            };
            out.extend_from_slice(&k.to_bytes());
        }
        Target::RdmaWrite => out.extend_from_slice(
            &RdmaWrite {
                usr_len: r.next() as u16,
            }
            .to_bytes(),
        ),
        Target::RdmaRead | Target::Chunk => {
            let cs = 1u32 << r.range(13, 17);
            let usr_len = r.below(300) as u16;
            let data_len = r.below(u64::from(cs / 2)) as u32;
            ctx.chunk_size = cs;
            ctx.offset = data_len + u32::from(usr_len);
            if t == Target::Chunk && r.chance(2) {
                write_placement(data_len, usr_len, cs, 4096).unwrap();
                out.extend_from_slice(&RdmaWrite { usr_len }.to_bytes());
            } else {
                let with_desc =
                    (data_len > 0 && r.chance(2)) || (t == Target::RdmaRead && r.chance(2));
                read_placement(data_len, usr_len, with_desc as u16, cs, 4096).unwrap();
                let desc = with_desc.then(|| SgDesc {
                    addr: r.next(),
                    key: r.next() as u32,
                    len: r.range(1, u64::from(data_len.max(1))) as u32,
                });
                let rd = RdmaRead {
                    usr_len,
                    desc,
                    need_inval: desc.is_some() && r.chance(2),
                };
                out.resize(rd.wire_len(), 0);
                rd.encode(out).unwrap();
            }
        }
        Target::Imm => {
            let imm = match r.below(4) {
                0 => {
                    let l = ImmLayout::new(ctx.queue_depth, ctx.chunk_size)
                        .unwrap_or_else(|_| ImmLayout::for_queue_depth(ctx.queue_depth).unwrap());
                    *ctx = Ctx {
                        chunk_size: l.chunk_size(),
                        ..*ctx
                    };
                    let buf_id = r.below(u64::from(l.queue_depth())) as u16;
                    let off = r.below(u64::from(l.chunk_size())) as u32;
                    l.io_req(buf_id, off).unwrap()
                }
                1 => IoRsp::new(r.below(1 << 19) as u32, -(r.below(512) as i32), r.chance(2))
                    .unwrap()
                    .to_imm(),
                2 => Imm::HbMsg.to_imm(),
                _ => Imm::HbAck.to_imm(),
            };
            out.extend_from_slice(&imm.to_le_bytes());
        }
        Target::SessInfo => out.extend_from_slice(
            &SessInfo {
                ver: r.next() as u8,
            }
            .to_bytes(),
        ),
        Target::SessInfoRsp => out.extend_from_slice(
            &SessInfoRsp {
                ver: r.next() as u8,
            }
            .to_bytes(),
        ),
        Target::Open | Target::RnbdMsg if t == Target::Open || r.chance(4) => {
            let name = r.name(254);
            let o = Open {
                access_mode: AccessMode::from_u8(r.below(3) as u8).unwrap(),
                dev_name: &name,
            };
            out.resize(Open::LEN, 0);
            o.encode(out).unwrap();
        }
        Target::OpenRsp => {
            let lbs = 1u16 << r.range(9, 15);
            let o = OpenRsp {
                device_id: r.next() as u32,
                nsectors: r.next(),
                max_hw_sectors: r.next() as u32,
                max_write_zeroes_sectors: r.next() as u32,
                max_discard_sectors: r.next() as u32,
                discard_granularity: r.next() as u32,
                discard_alignment: r.next() as u32,
                physical_block_size: lbs.saturating_mul(1 << r.below(3)),
                logical_block_size: lbs,
                max_segments: r.next() as u16,
                secure_discard: r.next() as u16,
                cache_policy: CachePolicy::from_bits(r.next() as u8),
            };
            out.resize(OpenRsp::LEN, 0);
            o.encode(out).unwrap();
        }
        Target::Close | Target::RnbdMsg if t == Target::Close || r.chance(3) => out
            .extend_from_slice(
                &Close {
                    device_id: r.next() as u32,
                }
                .to_bytes(),
            ),
        Target::Io | Target::RnbdMsg if t == Target::Io || r.chance(2) => {
            let io = Io {
                device_id: r.next() as u32,
                sector: r.next(),
                op: RnbdOp::from_u8(r.below(6) as u8).unwrap(),
                flags: RnbdFlags::from_rw_truncate(r.next() as u32),
                bi_size: r.next() as u32,
                prio: r.next() as u16,
            };
            out.extend_from_slice(&io.to_bytes());
            if r.chance(3) {
                out.truncate(r.range(24, 31) as usize);
            }
        }
        Target::Open | Target::Close | Target::Io | Target::RnbdMsg => {
            out.extend_from_slice(&SessInfo { ver: 2 }.to_bytes())
        }
    }
}

fn mutate(r: &mut Rng, buf: &mut Vec<u8>) {
    for _ in 0..r.range(1, 4) {
        match r.below(6) {
            0 | 1 if !buf.is_empty() => {
                let i = r.below(buf.len() as u64) as usize;
                buf[i] ^= 1 << r.below(8);
            }
            2 if !buf.is_empty() => {
                let i = r.below(buf.len() as u64) as usize;
                buf[i] = [0, 0xff, 1, 2, 0x80, r.next() as u8][r.below(6) as usize];
            }
            3 if !buf.is_empty() => {
                // Short inputs matter most: cut near the end more often.
                let cut = r.below(buf.len() as u64 + 1) as usize;
                buf.truncate(if r.chance(2) {
                    buf.len().saturating_sub(1)
                } else {
                    cut
                });
            }
            4 => {
                let n = r.range(1, 20) as usize;
                for _ in 0..n {
                    buf.push(r.next() as u8);
                }
            }
            _ => {
                // Overwrite a little-endian 16-bit field at an even offset with an edge value.
                if buf.len() >= 2 {
                    let i = (r.below(buf.len() as u64 / 2) * 2) as usize;
                    let v: u16 = [0, 1, 2, 0xffff, 0x8000, r.next() as u16][r.below(6) as usize];
                    buf[i..i + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// Runs `PER_TARGET` inputs through decoder `t`; returns (inputs, accepted).
fn run(t: Target, seed: u64) -> (usize, usize) {
    let mut r = Rng::new(seed);
    let mut buf = Vec::with_capacity(2048);
    let mut accepted = 0;
    for i in 0..PER_TARGET {
        let mut ctx = random_ctx(&mut r);
        if i % 2 == 0 {
            let n = if r.chance(2) {
                (wire_size(t) as i64 + r.range(0, 16) as i64 - 8).max(0) as usize
            } else {
                r.below(300) as usize
            };
            buf.resize(n, 0);
            r.fill(&mut buf);
            // Give random bytes a chance to pass the type check of type-led messages.
            if n >= 2 && r.chance(2) {
                buf[0] = r.below(6) as u8;
                buf[1] = 0;
            }
        } else {
            valid(t, &mut r, &mut ctx, &mut buf);
            if i % 8 == 1 {
                assert!(
                    check(t, &ctx, &buf),
                    "{t:?}: valid encoding refused: {buf:02x?} ctx {ctx:?}"
                );
                accepted += 1;
                continue;
            }
            mutate(&mut r, &mut buf);
        }
        accepted += usize::from(check(t, &ctx, &buf));
    }
    (PER_TARGET, accepted)
}

macro_rules! fuzz_tests {
    ($($name:ident => $target:expr, $seed:expr;)*) => {$(
        #[test]
        fn $name() {
            let (n, ok) = run($target, $seed);
            eprintln!("{:?}: {n} inputs, {ok} decoded and round-tripped", $target);
            assert_eq!(n, PER_TARGET);
            // The unmutated valid encodings alone are an eighth of the inputs.
            assert!(ok >= PER_TARGET / 8, "{:?}: only {ok} of {n} decoded", $target);
        }
    )*};
}

fuzz_tests! {
    fuzz_conn_req => Target::ConnReq, 0x9e37_79b9_7f4a_7c15;
    fuzz_conn_rsp => Target::ConnRsp, 0xbf58_476d_1ce4_e5b9;
    fuzz_info_req => Target::InfoReq, 0x94d0_49bb_1331_11eb;
    fuzz_info_rsp => Target::InfoRsp, 0x2545_f491_4f6c_dd1d;
    fuzz_rkey_rsp => Target::RkeyRsp, 0x1405_7b7e_f767_814f;
    fuzz_rdma_write => Target::RdmaWrite, 0xd6e8_feb8_6659_fd93;
    fuzz_rdma_read => Target::RdmaRead, 0xa076_1d64_78bd_642f;
    fuzz_chunk => Target::Chunk, 0xe703_7ed1_a0b4_28db;
    fuzz_imm => Target::Imm, 0x8ebc_6af0_9c88_c6e3;
    fuzz_rnbd_sess_info => Target::SessInfo, 0x5899_65cc_7537_4cc3;
    fuzz_rnbd_sess_info_rsp => Target::SessInfoRsp, 0x1d8e_4e27_c47d_124f;
    fuzz_rnbd_open => Target::Open, 0xc2b2_ae3d_27d4_eb4f;
    fuzz_rnbd_open_rsp => Target::OpenRsp, 0x1656_67b1_9e37_79f9;
    fuzz_rnbd_close => Target::Close, 0x27d4_eb2f_1656_67c5;
    fuzz_rnbd_io => Target::Io, 0x85eb_ca77_c2b2_ae63;
    fuzz_rnbd_msg => Target::RnbdMsg, 0x61c8_8646_80b5_83eb;
}

#[test]
fn fuzzer_input_splitting_feeds_every_decoder() {
    // The cargo-fuzz entry point: context prefix + message, all decoders.
    let mut r = Rng::new(42);
    let mut buf = vec![0u8; 400];
    let mut accepted = 0;
    for _ in 0..2000 {
        let n = r.below(400) as usize;
        r.fill(&mut buf[..n]);
        let (ctx, msg) = roundtrip::split_input(&buf[..n]);
        assert!(ctx.queue_depth >= 1 && ctx.offset < ctx.chunk_size);
        accepted += roundtrip::check_all(&ctx, msg);
    }
    // Random 4-byte prefixes are often valid imms.
    assert!(accepted > 0);
}
