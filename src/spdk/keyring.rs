//! Pre-shared keys from SPDK's keyring: a key added with `keyring_file_add_key` (or any
//! other keyring module) is named in an RPC (`psk`) and read here into a [`Psk`], the
//! way SPDK's NVMe-oF reads its TLS and DH-HMAC-CHAP keys. The key's text is the same as
//! in a `--psk-file` (hex or base64 of at least 32 bytes). Only the name is ever kept in
//! configuration (`save_config`); the key is read when the listener or path is set up.

use std::ffi::CString;

use zeroize::Zeroizing;

use super::sys;
use crate::fabric::Psk;

/// Largest key text read from the keyring.
const MAX_KEY_TEXT: usize = 4096;

/// The key named `name` in SPDK's keyring (`keyring:name` picks a keyring, as
/// `spdk_keyring_get_key` documents).
///
/// # Errors
/// A message naming the key: not in the keyring, unreadable (the keyring module's
/// errno), or not a valid key (see [`Psk::from_text`]). Never the key's content.
pub fn psk(name: &str) -> Result<Psk, String> {
    let cname = CString::new(name).map_err(|_| format!("key name {name:?} contains a NUL byte"))?;
    // SAFETY: a NUL-terminated name; the reference returned (or null) is ours to put.
    let key = unsafe { sys::spdk_keyring_get_key(cname.as_ptr()) };
    if key.is_null() {
        return Err(format!(
            "no key {name:?} in SPDK's keyring (add it first, e.g. with keyring_file_add_key)"
        ));
    }
    let mut buf = Zeroizing::new(vec![0u8; MAX_KEY_TEXT]);
    // SAFETY: `key` is a live reference; `buf` is writable for its whole length.
    let rc = unsafe { sys::spdk_key_get_key(key, buf.as_mut_ptr().cast(), MAX_KEY_TEXT as i32) };
    // SAFETY: releases the reference taken above, once.
    unsafe { sys::spdk_keyring_put_key(key) };
    if rc < 0 {
        return Err(format!(
            "key {name:?} cannot be read from SPDK's keyring: {}",
            std::io::Error::from_raw_os_error(-rc)
        ));
    }
    let len = (rc as usize).min(MAX_KEY_TEXT);
    Psk::from_text(format!("keyring key {name:?}"), &buf[..len]).map_err(|e| e.to_string())
}
