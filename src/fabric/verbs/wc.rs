//! Translations between the fabric contract and verbs values: completion status and
//! opcode (`ib_wc_status`/`ib_wc_opcode` as the kernel's `rtrs.c` completion handlers
//! read them), access flags, and the errno of a refused post.
//!
//! Pure functions, tested here without a device.

use rdma_sys as ffi;

use super::sys::RawWc;
use crate::fabric::{Access, PostErrorKind, Wc, WcOpcode, WcStatus};

// The contract defines Access bits as the IBV_ACCESS_* values; keep that true.
const _: () =
    assert!(Access::LOCAL_WRITE.bits() == ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
const _: () =
    assert!(Access::REMOTE_WRITE.bits() == ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
const _: () =
    assert!(Access::REMOTE_READ.bits() == ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);

/// Access bits of a memory registration: the requested rights plus `MW_BIND`, so that
/// type-2 windows (our fast-registration slots) can be bound to it.
pub(super) fn mr_access(access: Access) -> u32 {
    access.bits() | ffi::ibv_access_flags::IBV_ACCESS_MW_BIND.0
}

/// Access bits of a window binding: only remote rights mean anything there.
pub(super) fn mw_access(access: Access) -> u32 {
    access.bits() & (Access::REMOTE_WRITE | Access::REMOTE_READ).bits()
}

/// What a refused `ibv_post_send`/`ibv_post_recv` errno means to a caller.
pub(super) fn post_error_kind(errno: i32) -> PostErrorKind {
    match errno {
        libc::ENOMEM => PostErrorKind::QueueFull,
        libc::ENOTCONN => PostErrorKind::NotConnected,
        _ => PostErrorKind::Invalid,
    }
}

pub(super) fn status(raw: u32) -> WcStatus {
    use ffi::ibv_wc_status::*;
    match raw {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalProtection,
        IBV_WC_LOC_QP_OP_ERR | IBV_WC_LOC_EEC_OP_ERR | IBV_WC_MW_BIND_ERR => {
            WcStatus::LocalQpOperation
        }
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
        IBV_WC_REM_INV_REQ_ERR | IBV_WC_REM_OP_ERR | IBV_WC_REM_INV_RD_REQ_ERR => {
            WcStatus::RemoteInvalidRequest
        }
        IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlush,
        _ => WcStatus::Transport,
    }
}

/// The contract's opcode. Verbs defines the opcode only for successful completions;
/// when the provider left it unset, `Send` stands in here and the connection replaces
/// it with the posted request's opcode (see `slots.rs`).
pub(super) fn opcode(raw: Option<u32>) -> WcOpcode {
    use ffi::ibv_wc_opcode::*;
    match raw {
        Some(IBV_WC_RDMA_WRITE) => WcOpcode::RdmaWrite,
        Some(IBV_WC_BIND_MW) => WcOpcode::RegMr,
        Some(IBV_WC_LOCAL_INV) => WcOpcode::LocalInv,
        Some(IBV_WC_RECV) => WcOpcode::Recv,
        Some(IBV_WC_RECV_RDMA_WITH_IMM) => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}

pub(super) fn completion(raw: &RawWc) -> Wc {
    let with_imm = raw.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    let with_inv = raw.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0;
    let status = status(raw.status);
    Wc {
        wr_id: raw.wr_id,
        status,
        opcode: opcode(raw.opcode),
        byte_len: if status.is_ok() { raw.byte_len } else { 0 },
        imm: (status.is_ok() && with_imm).then(|| u32::from_be(raw.imm_or_rkey)),
        invalidated_rkey: (status.is_ok() && with_inv).then_some(raw.imm_or_rkey),
        qp_num: raw.qp_num,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ffi::ibv_wc_opcode::*;
    use ffi::ibv_wc_status::*;

    fn raw(status: u32, opcode: Option<u32>, flags: u32, ex: u32) -> RawWc {
        RawWc {
            wr_id: 42,
            status,
            opcode,
            byte_len: 100,
            wc_flags: flags,
            imm_or_rkey: ex,
            qp_num: 7,
        }
    }

    #[test]
    fn write_with_imm_receive_reports_host_order_imm() {
        let flags = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        let wc = completion(&raw(
            IBV_WC_SUCCESS,
            Some(IBV_WC_RECV_RDMA_WITH_IMM),
            flags,
            0x1234_5678u32.to_be(),
        ));
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc.imm, Some(0x1234_5678));
        assert_eq!(
            (wc.wr_id, wc.byte_len, wc.invalidated_rkey),
            (42, 100, None)
        );
    }

    #[test]
    fn send_with_inv_receive_reports_the_rkey_unswapped() {
        let flags = ffi::ibv_wc_flags::IBV_WC_WITH_INV.0;
        let wc = completion(&raw(IBV_WC_SUCCESS, Some(IBV_WC_RECV), flags, 0xabcd_ef01));
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.invalidated_rkey, Some(0xabcd_ef01));
        assert_eq!(wc.imm, None);
    }

    #[test]
    fn failed_completion_has_no_payload_fields() {
        let flags = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        let wc = completion(&raw(IBV_WC_WR_FLUSH_ERR, None, flags, 7));
        assert_eq!(wc.status, WcStatus::WrFlush);
        assert_eq!(wc.opcode, WcOpcode::Send);
        assert_eq!((wc.byte_len, wc.imm, wc.invalidated_rkey), (0, None, None));
    }

    #[test]
    fn statuses_map_to_the_contract() {
        assert_eq!(status(IBV_WC_REM_ACCESS_ERR), WcStatus::RemoteAccess);
        assert_eq!(status(IBV_WC_LOC_PROT_ERR), WcStatus::LocalProtection);
        assert_eq!(status(IBV_WC_MW_BIND_ERR), WcStatus::LocalQpOperation);
        assert_eq!(status(IBV_WC_REM_OP_ERR), WcStatus::RemoteInvalidRequest);
        assert_eq!(status(IBV_WC_LOC_LEN_ERR), WcStatus::LocalLength);
        assert_eq!(status(IBV_WC_RETRY_EXC_ERR), WcStatus::Transport);
        assert_eq!(status(IBV_WC_RNR_RETRY_EXC_ERR), WcStatus::Transport);
    }

    #[test]
    fn send_side_opcodes() {
        assert_eq!(opcode(Some(IBV_WC_SEND)), WcOpcode::Send);
        assert_eq!(opcode(Some(IBV_WC_RDMA_WRITE)), WcOpcode::RdmaWrite);
        assert_eq!(opcode(Some(IBV_WC_BIND_MW)), WcOpcode::RegMr);
        assert_eq!(opcode(Some(IBV_WC_LOCAL_INV)), WcOpcode::LocalInv);
    }

    #[test]
    fn access_bits() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        assert_eq!(mr_access(a), 1 | 2 | 16);
        assert_eq!(mw_access(a), 2);
        assert_eq!(post_error_kind(libc::ENOMEM), PostErrorKind::QueueFull);
        assert_eq!(post_error_kind(libc::EINVAL), PostErrorKind::Invalid);
    }
}
