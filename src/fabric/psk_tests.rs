//! Unit tests of key parsing and key-file checks.

use super::*;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

const HEX32: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn key_file(content: &[u8], mode: u32) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let p = std::env::temp_dir().join(format!(
        "rtrs-psk-unit-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::write(&p, content).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    p
}

#[test]
fn hex_and_base64_give_the_same_key() {
    let hex = Psk::from_text("a", HEX32.as_bytes()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode((0u8..32).collect::<Vec<u8>>());
    let b64 = Psk::from_text("b", format!("  {b64}\n").as_bytes()).unwrap();
    assert_eq!(hex.bytes(), (0u8..32).collect::<Vec<u8>>().as_slice());
    assert_eq!(hex, b64);
    assert_eq!(
        Psk::from_text("c", HEX32.to_uppercase().as_bytes()).unwrap(),
        hex
    );
    let other = Psk::from_text("d", HEX32.replace("1f", "20").as_bytes()).unwrap();
    assert_ne!(hex, other);
}

#[test]
fn base64_may_span_lines() {
    let b64 = base64::engine::general_purpose::STANDARD.encode([7u8; 48]);
    let wrapped = format!("{}\n{}\n", &b64[..32], &b64[32..]);
    assert_eq!(
        Psk::from_text("k", wrapped.as_bytes()).unwrap().bytes(),
        &[7u8; 48]
    );
}

#[test]
fn bad_text_is_refused_with_the_reason() {
    let short = &HEX32[..62];
    let e = Psk::from_text("k", short.as_bytes()).unwrap_err();
    assert!(matches!(e, PskError::TooShort { len: 31, .. }), "{e}");
    assert!(e.to_string().contains("31 bytes"), "{e}");
    let e = Psk::from_text("k", &HEX32.as_bytes()[..63]).unwrap_err();
    assert!(e.to_string().contains("odd number of hex digits"), "{e}");
    let e = Psk::from_text("k", b"not a key at all!").unwrap_err();
    assert!(
        e.to_string().contains("neither hex nor valid base64"),
        "{e}"
    );
    let e = Psk::from_text("k", b" \n").unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    let long = "ab".repeat(MAX_KEY_LEN + 1);
    let e = Psk::from_text("k", long.as_bytes()).unwrap_err();
    assert!(matches!(e, PskError::TooLong { .. }), "{e}");
    // Nothing of the text appears in the messages.
    let e = Psk::from_text("k", b"secretsecret!!").unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
}

#[test]
fn a_key_file_must_be_private_and_well_formed() {
    let good = key_file(format!("{HEX32}\n").as_bytes(), 0o600);
    let k = Psk::from_file(&good).unwrap();
    assert_eq!(k.name(), good.display().to_string());
    assert!(!format!("{k:?}").contains("0102"), "{k:?}");

    for mode in [0o640, 0o604, 0o644, 0o660] {
        let p = key_file(HEX32.as_bytes(), mode);
        let e = Psk::from_file(&p).unwrap_err();
        assert!(matches!(e, PskError::Permissions { .. }), "{e}");
        assert!(e.to_string().contains("group or others"), "{e}");
        assert!(e.to_string().contains(&format!("{mode:04o}")), "{e}");
        fs::remove_file(p).unwrap();
    }
    let short = key_file(b"0011", 0o400);
    let e = Psk::from_file(&short).unwrap_err();
    assert!(matches!(e, PskError::TooShort { len: 2, .. }), "{e}");
    assert!(e.to_string().contains(&short.display().to_string()), "{e}");
    let garbage = key_file(b"\x00\x01binary", 0o600);
    let e = Psk::from_file(&garbage).unwrap_err();
    assert!(matches!(e, PskError::Encoding { .. }), "{e}");
    let big = key_file(&vec![b'a'; 5000], 0o600);
    assert!(matches!(
        Psk::from_file(&big).unwrap_err(),
        PskError::FileTooLarge { .. }
    ));
    let missing = std::env::temp_dir().join("rtrs-psk-unit-no-such-file");
    let e = Psk::from_file(&missing).unwrap_err();
    assert!(matches!(e, PskError::Read { .. }), "{e}");
    assert!(e.to_string().contains("rtrs-psk-unit-no-such-file"), "{e}");
    let e = Psk::from_file(&std::env::temp_dir()).unwrap_err();
    assert!(matches!(e, PskError::NotAFile { .. }), "{e}");
    for p in [good, short, garbage, big] {
        fs::remove_file(p).unwrap();
    }
}
