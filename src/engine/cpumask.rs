//! CPU masks in SPDK's notation: which cores get a reactor.
//!
//! Corresponds to SPDK's `spdk_cpuset_parse` (the `-m`/`--cpumask` option). Two forms:
//! - a hex mask, with or without `0x`: `"0x3"`, `"3"`, `"0xF0"` (bit *n* selects CPU *n*);
//! - a list of CPUs and inclusive ranges, in brackets as SPDK writes them (`"[0-1]"`,
//!   `"[0,2-3]"`) or bare when it contains a comma or a dash (`"0,1"`, `"2-3"`). A bare
//!   single number is a hex mask, as in SPDK: `"1"` is CPU 0, `"[1]"` is CPU 1.
//!
//! Reactors are numbered by their rank in the mask: mask `0x5` gives reactor 0 on CPU 0
//! and reactor 1 on CPU 2. [`Ctx::core`](super::Ctx::core) returns that reactor index.

use std::fmt;

use super::error::CpuMaskError;

/// CPUs are numbered below this bound (SPDK's `SPDK_CPUSET_SIZE`).
pub const MAX_CPUS: usize = 1024;

/// A non-empty, sorted set of CPU numbers.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CpuMask {
    cpus: Vec<usize>,
}

impl CpuMask {
    /// Parses a hex mask (`"0x3"`) or a CPU list (`"[0-1]"`, `"0,1"`); see the module doc.
    ///
    /// # Errors
    /// [`CpuMaskError`] naming the offending character, element or CPU number, or
    /// [`CpuMaskError::NoCpu`] when the mask selects nothing.
    pub fn parse(input: &str) -> Result<CpuMask, CpuMaskError> {
        let s = input.trim();
        if s.is_empty() {
            return Err(CpuMaskError::Empty);
        }
        let mut bits = vec![false; MAX_CPUS];
        let bracketed = s.starts_with('[') && s.ends_with(']') && s.len() >= 2;
        if bracketed || s.contains(',') || s.contains('-') {
            let body = if bracketed { &s[1..s.len() - 1] } else { s };
            if body.trim().is_empty() {
                return Err(CpuMaskError::Empty);
            }
            parse_list(input, body, &mut bits)?;
        } else {
            parse_hex(input, s, &mut bits)?;
        }
        let cpus: Vec<usize> = (0..MAX_CPUS).filter(|&c| bits[c]).collect();
        if cpus.is_empty() {
            return Err(CpuMaskError::NoCpu {
                input: input.to_owned(),
            });
        }
        Ok(CpuMask { cpus })
    }

    /// A mask of the given CPUs (duplicates removed).
    ///
    /// # Errors
    /// [`CpuMaskError::NoCpu`] for an empty list, [`CpuMaskError::CpuOutOfRange`] for a
    /// CPU at or above [`MAX_CPUS`].
    pub fn from_cpus(cpus: &[usize]) -> Result<CpuMask, CpuMaskError> {
        let input = format!("{cpus:?}");
        if let Some(&cpu) = cpus.iter().find(|&&c| c >= MAX_CPUS) {
            return Err(CpuMaskError::CpuOutOfRange {
                input,
                cpu,
                max: MAX_CPUS,
            });
        }
        let mut cpus = cpus.to_vec();
        cpus.sort_unstable();
        cpus.dedup();
        if cpus.is_empty() {
            return Err(CpuMaskError::NoCpu { input });
        }
        Ok(CpuMask { cpus })
    }

    /// The CPUs, ascending; index *i* is the CPU of reactor *i*.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// How many reactors this mask gives.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Always false: a parsed mask selects at least one CPU.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
}

fn parse_hex(input: &str, s: &str, bits: &mut [bool]) -> Result<(), CpuMaskError> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() {
        return Err(CpuMaskError::Empty);
    }
    // The rightmost digit holds CPUs 0-3.
    for (pos, ch) in digits.chars().rev().enumerate() {
        let nibble = ch.to_digit(16).ok_or_else(|| CpuMaskError::BadHexDigit {
            input: input.to_owned(),
            bad: ch,
        })?;
        for bit in 0..4 {
            if nibble & (1 << bit) == 0 {
                continue;
            }
            let cpu = pos * 4 + bit;
            if cpu >= MAX_CPUS {
                return Err(CpuMaskError::CpuOutOfRange {
                    input: input.to_owned(),
                    cpu,
                    max: MAX_CPUS,
                });
            }
            bits[cpu] = true;
        }
    }
    Ok(())
}

fn parse_list(input: &str, body: &str, bits: &mut [bool]) -> Result<(), CpuMaskError> {
    let bad = |element: &str| CpuMaskError::BadElement {
        input: input.to_owned(),
        element: element.to_owned(),
    };
    let cpu = |text: &str, element: &str| -> Result<usize, CpuMaskError> {
        let n: usize = text.trim().parse().map_err(|_| bad(element))?;
        if n >= MAX_CPUS {
            return Err(CpuMaskError::CpuOutOfRange {
                input: input.to_owned(),
                cpu: n,
                max: MAX_CPUS,
            });
        }
        Ok(n)
    };
    for element in body.split(',') {
        let element = element.trim();
        if element.is_empty() {
            return Err(bad(element));
        }
        let (low, high) = match element.split_once('-') {
            Some((l, h)) => (cpu(l, element)?, cpu(h, element)?),
            None => {
                let n = cpu(element, element)?;
                (n, n)
            }
        };
        if low > high {
            return Err(CpuMaskError::ReversedRange {
                input: input.to_owned(),
                low,
                high,
            });
        }
        bits[low..=high].iter_mut().for_each(|b| *b = true);
    }
    Ok(())
}

impl fmt::Debug for CpuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuMask({self})")
    }
}

/// Prints the mask as SPDK does: hex with `0x`.
impl fmt::Display for CpuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let top = self.cpus.last().copied().unwrap_or(0);
        let mut digits = String::new();
        for nib in (0..=top / 4).rev() {
            let mut v = 0u32;
            for bit in 0..4 {
                if self.cpus.binary_search(&(nib * 4 + bit)).is_ok() {
                    v |= 1 << bit;
                }
            }
            digits.push(char::from_digit(v, 16).unwrap_or('0'));
        }
        write!(f, "0x{digits}")
    }
}

impl std::str::FromStr for CpuMask {
    type Err = CpuMaskError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuMask::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(s: &str) -> Vec<usize> {
        CpuMask::parse(s).unwrap().cpus().to_vec()
    }

    #[test]
    fn hex_masks() {
        assert_eq!(cpus("0x3"), [0, 1]);
        assert_eq!(cpus("3"), [0, 1]);
        assert_eq!(cpus("0X5"), [0, 2]);
        assert_eq!(cpus("0xf0"), [4, 5, 6, 7]);
        assert_eq!(cpus("1"), [0]);
        assert_eq!(cpus("0x100000000"), [32]);
    }

    #[test]
    fn lists_and_ranges() {
        assert_eq!(cpus("[0-1]"), [0, 1]);
        assert_eq!(cpus("0,1"), [0, 1]);
        assert_eq!(cpus("[1]"), [1]);
        assert_eq!(cpus("[0, 2-3, 3]"), [0, 2, 3]);
        assert_eq!(cpus("4-5"), [4, 5]);
    }

    #[test]
    fn display_is_hex() {
        assert_eq!(CpuMask::parse("[0,2-3]").unwrap().to_string(), "0xd");
        assert_eq!(CpuMask::parse("[4]").unwrap().to_string(), "0x10");
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(CpuMask::parse(" "), Err(CpuMaskError::Empty));
        assert_eq!(CpuMask::parse("[]"), Err(CpuMaskError::Empty));
        assert_eq!(CpuMask::parse("0x"), Err(CpuMaskError::Empty));
        assert!(matches!(
            CpuMask::parse("0xg1"),
            Err(CpuMaskError::BadHexDigit { bad: 'g', .. })
        ));
        assert!(matches!(
            CpuMask::parse("[0,x]"),
            Err(CpuMaskError::BadElement { ref element, .. }) if element == "x"
        ));
        assert!(matches!(
            CpuMask::parse("[3-1]"),
            Err(CpuMaskError::ReversedRange {
                low: 3,
                high: 1,
                ..
            })
        ));
        assert!(matches!(
            CpuMask::parse("[2000]"),
            Err(CpuMaskError::CpuOutOfRange { cpu: 2000, .. })
        ));
        assert!(matches!(
            CpuMask::parse("0x0"),
            Err(CpuMaskError::NoCpu { .. })
        ));
        assert!(matches!(
            CpuMask::parse("0,"),
            Err(CpuMaskError::BadElement { .. })
        ));
        let msg = CpuMask::parse("[3-1]").unwrap_err().to_string();
        assert!(msg.contains("3-1"), "{msg}");
    }

    #[test]
    fn from_cpus_sorts_and_checks() {
        assert_eq!(CpuMask::from_cpus(&[2, 0, 2]).unwrap().cpus(), [0, 2]);
        assert!(CpuMask::from_cpus(&[]).is_err());
        assert!(CpuMask::from_cpus(&[MAX_CPUS]).is_err());
    }
}
