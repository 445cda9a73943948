//! Protocol constants of RTRS 2.0 (the kernel's `rtrs-pri.h`) and the small integer
//! helpers the wire layout is defined with (`ilog2`, the kernel's ceil-log2 idiom).
//!
//! See docs/PROTOCOL.md §1.

use super::error::{DecodeError, Expected};

/// Magic number at the start of conn_req and conn_rsp.
pub const MAGIC: u16 = 0x1BBD;
/// RTRS protocol major version; peers compare only this byte.
pub const VERSION_MAJOR: u8 = 2;
/// RTRS protocol minor version we send.
pub const VERSION_MINOR: u8 = 0;
/// The version field as sent: `(major << 8) | minor`.
pub const VERSION: u16 = ((VERSION_MAJOR as u16) << 8) | VERSION_MINOR as u16;

/// Bytes of CM private data on REQ, REP and REJ (conn_req / conn_rsp).
pub const CM_PRIVATE_DATA_LEN: usize = 56;

/// Largest session queue depth (conn_rsp.queue_depth is a le16).
pub const MAX_SESS_QUEUE_DEPTH: u16 = 65535;
/// Default server session queue depth (`sess_queue_depth`).
pub const DEFAULT_SESS_QUEUE_DEPTH: u16 = 512;
/// Receive depth of the service connection (cid 0); also caps `signal_interval`.
pub const SERVICE_CON_QUEUE_DEPTH: u32 = 512;
/// Paths per session, client and server.
pub const MAX_PATHS_NUM: usize = 128;
/// Largest `cid_num` a server accepts in conn_req.
pub const MAX_CID_NUM: u16 = 4096;
/// Smallest server chunk size (`max_chunk_size` lower bound; also a power of two).
pub const MIN_CHUNK_SIZE: u32 = 8192;
/// Default server chunk size (`max_chunk_size`).
pub const DEFAULT_MAX_CHUNK_SIZE: u32 = 128 * 1024;
/// Default `MAX_HDR_SIZE` (the server's page size on 4 KiB-page machines).
pub const DEFAULT_MAX_HDR_SIZE: u32 = 4096;
/// Client scatter-gather limit per request (`RTRS_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: u32 = 128;

/// Heartbeat period.
pub const HB_INTERVAL_MS: u64 = 5000;
/// Missed heartbeats tolerated; the error fires when the count exceeds this.
pub const HB_MISSED_MAX: u32 = 5;
/// Timeout of each connection-establishment step.
pub const CONNECT_TIMEOUT_MS: u64 = 30_000;
/// Sleep at the start of each reconnect attempt.
pub const RECONNECT_BACKOFF_MS: u64 = 1000;
/// The kernel server's timeout after which a path stuck connecting is a zombie (this
/// server closes it after `ServerConfig::admission`'s handshake timeout, 5 s by default).
pub const MAX_CONN_TIMEOUT_MS: u64 = 30_000;
/// Default RTRS/RNBD port.
pub const DEFAULT_PORT: u16 = 1234;

/// `RTRS_MSG_NEED_INVAL_F`: in `rtrs_msg_rdma_read.flags`, the client wants its reply
/// MR invalidated remotely (SEND_WITH_INV).
pub const MSG_NEED_INVAL_F: u16 = 0x1;
/// `RTRS_MSG_NEW_RKEY_F`: in `conn_rsp.flags`, the server sends a new rkey with every
/// response (always_invalidate).
pub const MSG_NEW_RKEY_F: u32 = 0x2;

/// Bits of the immediate data used by the type.
pub const IMM_TYPE_BITS: u32 = 4;
/// Bits of the immediate data used by the payload.
pub const IMM_PAYLOAD_BITS: u32 = 28;
/// Mask of the payload bits.
pub const IMM_PAYLOAD_MASK: u32 = (1 << IMM_PAYLOAD_BITS) - 1;

/// The le16 `type` of RTRS messages (`enum rtrs_msg_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum MsgType {
    /// INFO_REQ (client → server, cid 0).
    InfoReq = 0,
    /// INFO_RSP (server → client, cid 0).
    InfoRsp = 1,
    /// `rtrs_msg_rdma_write` trailer in a chunk.
    Write = 2,
    /// `rtrs_msg_rdma_read` trailer in a chunk.
    Read = 3,
    /// RKEY_RSP (server → client, with NEW_RKEY_F).
    RkeyRsp = 4,
}

impl MsgType {
    /// All type codes, for error messages.
    pub const CODES: &'static [u64] = &[0, 1, 2, 3, 4];

    /// Maps a wire code to a type.
    pub fn from_u16(v: u16) -> Option<MsgType> {
        Some(match v {
            0 => MsgType::InfoReq,
            1 => MsgType::InfoRsp,
            2 => MsgType::Write,
            3 => MsgType::Read,
            4 => MsgType::RkeyRsp,
            _ => return None,
        })
    }

    pub(crate) fn expect(v: u16, want: MsgType, msg: &'static str) -> Result<(), DecodeError> {
        if v == want as u16 {
            Ok(())
        } else {
            Err(DecodeError::field(
                msg,
                "type",
                v,
                Expected::Eq(want as u64),
            ))
        }
    }
}

/// `ceil(log2(n))` as the kernel computes it (`ilog2(n - 1) + 1`), with 0 for n <= 1.
pub const fn ceil_log2(n: u64) -> u32 {
    if n <= 1 {
        0
    } else {
        64 - (n - 1).leading_zeros()
    }
}

/// Bits of an IO_REQ imm payload that carry the buffer id for a session of
/// `queue_depth` chunks: `ceil_log2(queue_depth)`, 0 when the depth is 1.
pub const fn chunk_bits(queue_depth: u16) -> u32 {
    ceil_log2(queue_depth as u64)
}

/// Bits of an IO_REQ imm payload left for the offset inside the chunk.
pub const fn mem_bits(queue_depth: u16) -> u32 {
    IMM_PAYLOAD_BITS - chunk_bits(queue_depth)
}

/// The server's bit-budget rule: `ceil_log2(queue_depth) + ceil_log2(chunk_size) <= 28`,
/// so that every (buf_id, offset < chunk_size) pair fits an IO_REQ payload.
pub const fn fits_imm_budget(queue_depth: u16, chunk_size: u64) -> bool {
    chunk_bits(queue_depth) + ceil_log2(chunk_size) <= IMM_PAYLOAD_BITS
}

/// `signal_interval = min(queue_depth, 512)`: every n-th send WR is signaled.
pub const fn signal_interval(queue_depth: u16) -> u32 {
    let qd = queue_depth as u32;
    if qd < SERVICE_CON_QUEUE_DEPTH {
        qd
    } else {
        SERVICE_CON_QUEUE_DEPTH
    }
}

const _: () = assert!(VERSION == 0x0200);
const _: () = assert!(chunk_bits(512) == 9 && mem_bits(512) == 19);
const _: () = assert!(chunk_bits(1) == 0 && chunk_bits(2) == 1 && chunk_bits(3) == 2);
const _: () = assert!(chunk_bits(65535) == 16);
const _: () = assert!(fits_imm_budget(
    DEFAULT_SESS_QUEUE_DEPTH,
    DEFAULT_MAX_CHUNK_SIZE as u64
));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_log2_matches_the_kernel_idiom() {
        // ilog2(n - 1) + 1 for n >= 2.
        for n in 2u64..5000 {
            assert_eq!(ceil_log2(n), (n - 1).ilog2() + 1, "n = {n}");
        }
        assert_eq!(ceil_log2(0), 0);
        assert_eq!(ceil_log2(1), 0);
        assert_eq!(ceil_log2(131072), 17);
        assert_eq!(ceil_log2(131073), 18);
    }

    #[test]
    fn budget_and_signal_interval() {
        assert!(fits_imm_budget(512, 131072));
        assert!(fits_imm_budget(2048, 131072)); // 11 + 17 = 28
        assert!(!fits_imm_budget(2049, 131072)); // 12 + 17 = 29
        assert!(!fits_imm_budget(1, 1 << 29));
        assert_eq!(signal_interval(1), 1);
        assert_eq!(signal_interval(128), 128);
        assert_eq!(signal_interval(4096), 512);
    }

    #[test]
    fn msg_type_codes() {
        for code in 0u16..=4 {
            assert_eq!(MsgType::from_u16(code).map(|t| t as u16), Some(code));
        }
        assert_eq!(MsgType::from_u16(5), None);
        assert!(MsgType::expect(3, MsgType::Read, "x").is_ok());
        assert!(MsgType::expect(2, MsgType::Read, "x").is_err());
    }
}
