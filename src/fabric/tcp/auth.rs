//! The cryptography of PSK authentication (frame version 2, `docs/tcp-fabric.md`,
//! "Authentication"): fresh nonces from the operating system, and the proofs each side
//! sends, HMAC-SHA256 under the pre-shared key over both nonces, both addresses and the
//! direction, checked in constant time. The exchange itself (who sends what when) is the
//! listener's [`super::handshake`] and the initiator's [`super::conn`]; this module is
//! pure apart from the random source.
//!
//! What a proof binds, and why: the direction (a listener's proof is never a valid
//! initiator's proof, so a proof cannot be reflected back to its sender), both nonces (a
//! proof is good for one connection only, so it cannot be replayed), and both endpoint
//! addresses as each side sees them (a proof obtained by relaying one connection onto
//! another between other addresses does not verify).

use std::net::{IpAddr, SocketAddr};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::frame::{NONCE_LEN, PROOF_LEN};
use crate::fabric::Psk;

/// A nonce: fresh random bytes of one side for one connection.
pub(crate) type Nonce = [u8; NONCE_LEN];
/// A proof of the key.
pub(crate) type Proof = [u8; PROOF_LEN];

/// The first bytes of every proof's input: the protocol and its version.
const LABEL: &[u8; 16] = b"RTRS-TCP-AUTH-V2";

/// Who makes a proof (its byte in the proof's input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Role {
    Listener = 1,
    Initiator = 2,
}

/// What both sides prove knowledge of the key over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transcript {
    pub nonce_i: Nonce,
    pub nonce_l: Nonce,
    /// The initiator's address (the listener's peer address).
    pub initiator: SocketAddr,
    /// The listener's address (the initiator's peer address).
    pub listener: SocketAddr,
}

/// A fresh nonce from the operating system's random source.
///
/// # Errors
/// The random source's failure, as text (it does not fail on Linux once booted).
pub(crate) fn fresh_nonce() -> Result<Nonce, String> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| format!("no random bytes for a nonce: {e}"))?;
    Ok(n)
}

/// An address as 16 bytes of IPv6 (IPv4 as `::ffff:a.b.c.d`, so that a dual-stack
/// listener and an IPv4 initiator agree) and the port, big-endian.
fn addr_bytes(a: SocketAddr) -> [u8; 18] {
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut out = [0u8; 18];
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&a.port().to_be_bytes());
    out
}

fn mac(psk: &Psk, role: Role, t: &Transcript) -> Hmac<Sha256> {
    let mut m =
        <Hmac<Sha256> as Mac>::new_from_slice(psk.bytes()).expect("HMAC takes keys of any length");
    m.update(LABEL);
    m.update(&[role as u8]);
    m.update(&t.nonce_i);
    m.update(&t.nonce_l);
    m.update(&addr_bytes(t.initiator));
    m.update(&addr_bytes(t.listener));
    m
}

/// The proof `role` sends for `t`.
pub(crate) fn prove(psk: &Psk, role: Role, t: &Transcript) -> Proof {
    mac(psk, role, t).finalize().into_bytes().into()
}

/// Whether `proof` is `role`'s proof for `t`, compared in constant time.
pub(crate) fn verify(psk: &Psk, role: Role, t: &Transcript, proof: &[u8]) -> bool {
    mac(psk, role, t).verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Psk {
        Psk::from_bytes("test", &[b; 32]).unwrap()
    }

    fn transcript() -> Transcript {
        Transcript {
            nonce_i: [1; NONCE_LEN],
            nonce_l: [2; NONCE_LEN],
            initiator: "127.0.0.2:40000".parse().unwrap(),
            listener: "127.0.0.1:1234".parse().unwrap(),
        }
    }

    /// Known answer, computed independently (Python's `hmac` module) from the input
    /// layout documented in docs/tcp-fabric.md.
    #[test]
    fn golden_proof() {
        let p = prove(&key(0x11), Role::Listener, &transcript());
        let hex: String = p.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "e27136bc8213f63720df32097e7692f92df3029cc5f3700745e20cd19134bdaf"
        );
        let p = prove(&key(0x11), Role::Initiator, &transcript());
        let hex: String = p.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "d81e565c53a95ebf8c26fc547788db15ce44d0777f1d6c199429d5f50c7a321c"
        );
    }

    #[test]
    fn a_proof_verifies_only_for_its_key_role_nonces_and_addresses() {
        let t = transcript();
        let k = key(0x11);
        let p = prove(&k, Role::Listener, &t);
        assert!(verify(&k, Role::Listener, &t, &p));
        assert!(!verify(&key(0x12), Role::Listener, &t, &p), "other key");
        assert!(!verify(&k, Role::Initiator, &t, &p), "reflected");
        let mut t2 = t;
        t2.nonce_i[0] ^= 1;
        assert!(
            !verify(&k, Role::Listener, &t2, &p),
            "other initiator nonce"
        );
        let mut t2 = t;
        t2.nonce_l[31] ^= 1;
        assert!(!verify(&k, Role::Listener, &t2, &p), "other listener nonce");
        let mut t2 = t;
        t2.initiator = "127.0.0.3:40000".parse().unwrap();
        assert!(!verify(&k, Role::Listener, &t2, &p), "other initiator");
        let mut t2 = t;
        t2.listener = "127.0.0.1:1235".parse().unwrap();
        assert!(!verify(&k, Role::Listener, &t2, &p), "other listener port");
        assert!(!verify(&k, Role::Listener, &t, &p[..31]), "truncated");
        assert!(!verify(&k, Role::Listener, &t, &[0; PROOF_LEN]), "zeros");
    }

    #[test]
    fn ipv4_and_its_mapped_ipv6_form_agree() {
        let t = transcript();
        let mut t6 = t;
        t6.initiator = "[::ffff:127.0.0.2]:40000".parse().unwrap();
        t6.listener = "[::ffff:127.0.0.1]:1234".parse().unwrap();
        let k = key(7);
        assert_eq!(
            prove(&k, Role::Initiator, &t),
            prove(&k, Role::Initiator, &t6)
        );
    }

    #[test]
    fn nonces_are_fresh() {
        let a = fresh_nonce().unwrap();
        let b = fresh_nonce().unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0; NONCE_LEN]);
    }
}
