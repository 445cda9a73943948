//! Pre-shared keys ([`Psk`]) that authenticate tcp-fabric connections (the
//! challenge-response of `docs/tcp-fabric.md`, "Authentication"), and how they are read:
//! from a key file (`--psk-file`, with the checks SPDK's `keyring_file` makes) or from
//! text handed over by SPDK's keyring.
//!
//! A key is at least [`MIN_KEY_LEN`] bytes, written as hex or base64. The bytes are held
//! once, shared by every clone, and wiped when the last clone goes; nothing here ever
//! prints them: `Debug` and every error name the key (its file or keyring name) only.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// Fewest key bytes accepted (256 bits, the strength of HMAC-SHA256).
pub const MIN_KEY_LEN: usize = 32;
/// Most key bytes accepted (longer keys add nothing: HMAC hashes them down).
pub const MAX_KEY_LEN: usize = 1024;
/// Largest key file read (the longest key in base64 with line breaks fits easily).
const MAX_FILE_LEN: u64 = 4096;

/// Why a key could not be used. The messages name the key's file or keyring name, never
/// its content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PskError {
    #[error("key file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("key file {path} is not a regular file")]
    NotAFile { path: String },
    #[error(
        "key file {path} is accessible by group or others (mode {mode:04o}); \
         a key file must be readable by its owner only: chmod 600 {path}"
    )]
    Permissions { path: String, mode: u32 },
    #[error("key file {path} is larger than {MAX_FILE_LEN} bytes: not a key file")]
    FileTooLarge { path: String },
    #[error("key {name}: {reason} (a key is hex or base64 text of at least {MIN_KEY_LEN} random bytes, e.g. `openssl rand -hex 32`)")]
    Encoding { name: String, reason: String },
    #[error("key {name} is {len} bytes long: at least {MIN_KEY_LEN} random bytes are required (e.g. `openssl rand -hex 32`)")]
    TooShort { name: String, len: usize },
    #[error("key {name} is {len} bytes long: at most {MAX_KEY_LEN} bytes are accepted")]
    TooLong { name: String, len: usize },
}

struct Inner {
    name: String,
    key: Zeroizing<Vec<u8>>,
}

/// A pre-shared key: cheap to clone, wiped from memory when the last clone is dropped.
#[derive(Clone)]
pub struct Psk(Arc<Inner>);

impl Psk {
    /// A key from its raw bytes; `name` says where it came from in messages.
    ///
    /// # Errors
    /// [`PskError::TooShort`] or [`PskError::TooLong`].
    pub fn from_bytes(name: impl Into<String>, key: &[u8]) -> Result<Psk, PskError> {
        let name = name.into();
        if key.len() < MIN_KEY_LEN {
            return Err(PskError::TooShort {
                name,
                len: key.len(),
            });
        }
        if key.len() > MAX_KEY_LEN {
            return Err(PskError::TooLong {
                name,
                len: key.len(),
            });
        }
        Ok(Psk(Arc::new(Inner {
            name,
            key: Zeroizing::new(key.to_vec()),
        })))
    }

    /// A key from its text form: hex (an even number of hex digits) or base64 (standard
    /// alphabet, padded), surrounding whitespace ignored, line breaks allowed in base64.
    /// Text that is all hex digits is read as hex.
    ///
    /// # Errors
    /// [`PskError::Encoding`], [`PskError::TooShort`] or [`PskError::TooLong`].
    pub fn from_text(name: impl Into<String>, text: &[u8]) -> Result<Psk, PskError> {
        let name = name.into();
        let bad = |reason: &str| PskError::Encoding {
            name: name.clone(),
            reason: reason.to_string(),
        };
        let text = text.trim_ascii();
        if text.is_empty() {
            return Err(bad("the key is empty"));
        }
        let bytes = if text.iter().all(u8::is_ascii_hexdigit) {
            if text.len() % 2 != 0 {
                return Err(bad("odd number of hex digits"));
            }
            Zeroizing::new(
                text.chunks(2)
                    .map(|p| (hex_val(p[0]) << 4) | hex_val(p[1]))
                    .collect::<Vec<u8>>(),
            )
        } else {
            let compact: Zeroizing<Vec<u8>> = Zeroizing::new(
                text.iter()
                    .copied()
                    .filter(|c| !matches!(c, b'\n' | b'\r'))
                    .collect(),
            );
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(&*compact)
                .map_err(|_| bad("neither hex nor valid base64"))?;
            Zeroizing::new(decoded)
        };
        Psk::from_bytes(name, &bytes)
    }

    /// Reads a key file: a regular file readable by its owner only (as SPDK's
    /// `keyring_file` requires), holding the key's text (see [`Psk::from_text`]).
    ///
    /// # Errors
    /// [`PskError::Read`], [`PskError::NotAFile`], [`PskError::Permissions`],
    /// [`PskError::FileTooLarge`] and the errors of [`Psk::from_text`].
    pub fn from_file(path: &Path) -> Result<Psk, PskError> {
        let shown = path.display().to_string();
        let read_err = |source| PskError::Read {
            path: shown.clone(),
            source,
        };
        // The checks look at the opened file itself, so it cannot be swapped between
        // the check and the read.
        let mut file = File::open(path).map_err(read_err)?;
        let meta = file.metadata().map_err(read_err)?;
        if !meta.is_file() {
            return Err(PskError::NotAFile { path: shown });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(PskError::Permissions { path: shown, mode });
        }
        if meta.len() > MAX_FILE_LEN {
            return Err(PskError::FileTooLarge { path: shown });
        }
        let mut text = Zeroizing::new(Vec::with_capacity(meta.len() as usize));
        (&mut file)
            .take(MAX_FILE_LEN + 1)
            .read_to_end(&mut text)
            .map_err(read_err)?;
        if text.len() as u64 > MAX_FILE_LEN {
            return Err(PskError::FileTooLarge { path: shown });
        }
        Psk::from_text(shown, &text)
    }

    /// Where the key came from (its file or keyring name), for messages.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The key bytes, for the authentication code only.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0.key
    }
}

fn hex_val(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psk({:?})", self.0.name)
    }
}

/// Two keys are equal when their bytes are (compared in constant time); names do not
/// matter.
impl PartialEq for Psk {
    fn eq(&self, other: &Psk) -> bool {
        self.bytes().ct_eq(other.bytes()).into()
    }
}

impl Eq for Psk {}

#[cfg(test)]
mod tests {
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
}
