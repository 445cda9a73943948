//! Export specs as the server's command line takes them: `NAME=ram:SIZE` or
//! `NAME=file:PATH[:ro]`. The name is what clients put in `rnbd_msg_open.dev_name`
//! (the kernel server resolves it under `dev_search_path` instead; here exports are
//! declared up front).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::error::{OpenError, SpecError, SpecProblem};
use super::{BlockBackend, FileBackend, FileOptions, RamBackend};

/// Block size of RAM exports.
pub const RAM_BLOCK_SIZE: u32 = 512;
/// Longest export name: `dev_name` is 255 bytes with its NUL.
pub const MAX_NAME_LEN: usize = 254;

/// What backs an export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    Ram { size: u64 },
    File { path: PathBuf, read_only: bool },
}

/// One parsed `NAME=...` export spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSpec {
    pub name: String,
    pub backend: BackendSpec,
}

impl ExportSpec {
    /// Parses `NAME=ram:SIZE` or `NAME=file:PATH[:ro]`.
    ///
    /// # Errors
    /// A [`SpecError`] quoting the spec and naming the part that is wrong.
    pub fn parse(spec: &str) -> Result<ExportSpec, SpecError> {
        let fail = |problem| SpecError {
            spec: spec.to_string(),
            problem,
        };
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| fail(SpecProblem::Shape))?;
        check_name(name).map_err(|why| {
            fail(SpecProblem::BadName {
                name: name.to_string(),
                why,
            })
        })?;
        let (kind, arg) = rest
            .split_once(':')
            .ok_or_else(|| fail(SpecProblem::Shape))?;
        let backend = match kind {
            "ram" => {
                let size = parse_size(arg).ok_or_else(|| {
                    fail(SpecProblem::BadSize {
                        size: arg.to_string(),
                    })
                })?;
                if size == 0 || size % u64::from(RAM_BLOCK_SIZE) != 0 {
                    return Err(fail(SpecProblem::SizeNotMultiple {
                        size,
                        block_size: RAM_BLOCK_SIZE,
                    }));
                }
                BackendSpec::Ram { size }
            }
            "file" => {
                let (path, read_only) = match arg.strip_suffix(":ro") {
                    Some(path) => (path, true),
                    None => (arg.strip_suffix(":rw").unwrap_or(arg), false),
                };
                if path.is_empty() {
                    return Err(fail(SpecProblem::MissingPath));
                }
                BackendSpec::File {
                    path: PathBuf::from(path),
                    read_only,
                }
            }
            other => {
                return Err(fail(SpecProblem::UnknownKind {
                    kind: other.to_string(),
                }))
            }
        };
        Ok(ExportSpec {
            name: name.to_string(),
            backend,
        })
    }

    /// Creates the backend: a RAM disk, or the file opened with `file_opts` (whose
    /// `read_only` is or-ed with the spec's `:ro`).
    ///
    /// # Errors
    /// What [`RamBackend::new`] or [`FileBackend::open`] report (a missing file is an
    /// [`OpenError::Open`] naming the path).
    pub fn open(&self, file_opts: &FileOptions) -> Result<Box<dyn BlockBackend>, OpenError> {
        Ok(match &self.backend {
            BackendSpec::Ram { size } => Box::new(RamBackend::new(*size, RAM_BLOCK_SIZE)?),
            BackendSpec::File { path, read_only } => {
                let opts = FileOptions {
                    read_only: file_opts.read_only || *read_only,
                    ..file_opts.clone()
                };
                Box::new(FileBackend::open(path, &opts)?)
            }
        })
    }
}

impl FromStr for ExportSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<ExportSpec, SpecError> {
        ExportSpec::parse(s)
    }
}

impl fmt::Display for ExportSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.backend {
            BackendSpec::Ram { size } => write!(f, "{}=ram:{size}", self.name),
            BackendSpec::File { path, read_only } => {
                let ro = if *read_only { ":ro" } else { "" };
                write!(f, "{}=file:{}{ro}", self.name, path.display())
            }
        }
    }
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("longer than 254 bytes");
    }
    if name.contains("..") {
        return Err("contains '..', which the server refuses");
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("contains whitespace or control characters");
    }
    Ok(())
}

/// Parses a byte count: digits with an optional binary unit `K`, `M`, `G`, `T` (also
/// `KiB`/`KB`-style suffixes, case-insensitive). `None` when malformed or overflowing.
pub fn parse_size(s: &str) -> Option<u64> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("2t"), Some(2 << 40));
        assert_eq!(parse_size("3GiB"), Some(3 << 30));
        for bad in [
            "",
            "G",
            "12Q",
            "1.5G",
            "-1",
            " 1G",
            "99999999999999999999",
            "20000000T",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_size_message_names_export_and_size() {
        let e = ExportSpec::parse("x=ram:12Q").unwrap_err();
        assert_eq!(
            e.to_string(),
            "export 'x=ram:12Q': bad size '12Q' (use e.g. 512M, 1G)"
        );
    }
}
