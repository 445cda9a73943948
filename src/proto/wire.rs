//! Little-endian field access for the codecs (the kernel's `le16_to_cpu`/`cpu_to_le32`
//! family), plus the bounds checks every decoder starts with.
//!
//! Decoders first take a fixed-size view of the input with [`head`] (which fails with
//! [`DecodeError::Truncated`]), then read fields at constant offsets of that array.

use super::error::{BadString, DecodeError, EncodeError};

/// The first `N` bytes of `buf` as an array, or `Truncated` naming `msg`.
#[inline]
pub(crate) fn head<'a, const N: usize>(
    buf: &'a [u8],
    msg: &'static str,
) -> Result<&'a [u8; N], DecodeError> {
    buf.get(..N)
        .and_then(|s| <&[u8; N]>::try_from(s).ok())
        .ok_or(DecodeError::Truncated {
            msg,
            need: N,
            have: buf.len(),
        })
}

/// The first `N` bytes of `out` as a mutable array, or `BufferTooSmall` naming `msg`.
#[inline]
pub(crate) fn head_mut<'a, const N: usize>(
    out: &'a mut [u8],
    msg: &'static str,
) -> Result<&'a mut [u8; N], EncodeError> {
    let have = out.len();
    out.get_mut(..N)
        .and_then(|s| <&mut [u8; N]>::try_from(s).ok())
        .ok_or(EncodeError::BufferTooSmall { msg, need: N, have })
}

#[inline]
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

#[inline]
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Validates a NUL-terminated name inside a fixed field: returns the bytes before the
/// first NUL. Fails if there is no NUL in the field or the name is empty.
pub(crate) fn c_name<'a>(
    field_bytes: &'a [u8],
    msg: &'static str,
    field: &'static str,
) -> Result<&'a [u8], DecodeError> {
    let Some(end) = field_bytes.iter().position(|&c| c == 0) else {
        return Err(BadString::new(
            msg,
            field,
            "no NUL terminator inside the field",
            field_bytes.len(),
        )
        .into());
    };
    if end == 0 {
        return Err(BadString::new(msg, field, "empty name", 0).into());
    }
    Ok(&field_bytes[..end])
}

/// Checks a name we are about to put into a fixed `cap`-byte NUL-terminated field.
pub(crate) fn check_c_name(
    name: &[u8],
    cap: usize,
    msg: &'static str,
    field: &'static str,
) -> Result<(), EncodeError> {
    if name.is_empty() {
        return Err(BadString::new(msg, field, "empty name", 0).into());
    }
    if name.len() >= cap {
        return Err(BadString::new(
            msg,
            field,
            "name too long for the field (the NUL must fit)",
            cap - 1,
        )
        .into());
    }
    if let Some(pos) = name.iter().position(|&c| c == 0) {
        return Err(BadString::new(msg, field, "name contains a NUL byte", pos).into());
    }
    Ok(())
}
