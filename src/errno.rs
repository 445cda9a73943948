//! [`Errno`]: one POSIX error number, whatever its sign on the wire.
//!
//! The kernel's RTRS and RNBD carry errors as negative `int`s (an IO response's status,
//! a conn_rsp's errno, a block completion); libc names them positive. An `Errno` holds
//! the positive number, so a value can never be confused with a count or a success, and
//! converts at the edges: [`Errno::from_neg`] / [`Errno::neg`] for the kernel's
//! negative convention, [`Errno::from_raw`] / [`Errno::get`] for libc's positive one.
//! A completion that may fail carries `Result<(), Errno>`.

use std::fmt;
use std::num::NonZeroI32;

/// A POSIX error number (always positive).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct Errno(NonZeroI32);

macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Errno = Errno::new(libc::$name);
            )*

            /// The symbolic name (`"ENOMEM"`), for those this crate uses.
            pub fn name(self) -> Option<&'static str> {
                match self.0.get() {
                    $(libc::$name => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    EIO,
    ENXIO,
    E2BIG,
    EAGAIN,
    ENOMEM,
    EACCES,
    EFAULT,
    EBUSY,
    EEXIST,
    ENODEV,
    EINVAL,
    ENOSPC,
    EROFS,
    ERANGE,
    EPROTO,
    EBADMSG,
    EOVERFLOW,
    EMSGSIZE,
    EPROTONOSUPPORT,
    EOPNOTSUPP,
    ECONNABORTED,
    ECONNRESET,
    ENOBUFS,
    ENOTCONN,
    ESHUTDOWN,
    ETIMEDOUT,
    ECONNREFUSED,
    EHOSTUNREACH,
    ECANCELED,
    ENOTBLK,
    EUSERS,
);

impl Errno {
    /// `errno` (positive). Panics at compile time in a `const` for 0 or a negative
    /// value; use [`from_raw`](Self::from_raw) for values from elsewhere.
    pub const fn new(errno: i32) -> Errno {
        assert!(errno > 0, "an errno is positive");
        match NonZeroI32::new(errno) {
            Some(v) => Errno(v),
            None => panic!("an errno is positive"),
        }
    }

    /// A positive errno (libc's convention); `None` for 0 or a negative value.
    pub const fn from_raw(errno: i32) -> Option<Errno> {
        if errno > 0 {
            Some(Errno::new(errno))
        } else {
            None
        }
    }

    /// The kernel's convention: 0 is success, a negative value an error. A positive
    /// value (which no kernel peer sends) is taken as an error of that number.
    pub const fn result_from_neg(value: i32) -> Result<(), Errno> {
        if value == 0 {
            Ok(())
        } else if value == i32::MIN {
            Err(Errno::EIO)
        } else {
            Err(Errno::new(value.abs()))
        }
    }

    /// A negative errno (the kernel's convention); `None` for 0 or a positive value.
    pub const fn from_neg(value: i32) -> Option<Errno> {
        if value < 0 && value != i32::MIN {
            Some(Errno::new(-value))
        } else {
            None
        }
    }

    /// The positive number.
    pub const fn get(self) -> i32 {
        self.0.get()
    }

    /// The negative number the kernel puts on the wire and returns.
    pub const fn neg(self) -> i32 {
        -self.0.get()
    }

    /// `Ok` as 0, an error as its negative number: a wire status.
    pub const fn neg_of(result: Result<(), Errno>) -> i32 {
        match result {
            Ok(()) => 0,
            Err(e) => e.neg(),
        }
    }

    /// The C library's description ("Cannot allocate memory").
    pub fn description(self) -> String {
        std::io::Error::from_raw_os_error(self.get())
            .to_string()
            .split(" (os error")
            .next()
            .unwrap_or_default()
            .to_owned()
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Errno({})", self.get()),
        }
    }
}

/// `-ENOMEM (Cannot allocate memory)`: the sign the kernel would print.
impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "-{n} ({})", self.description()),
            None => write!(f, "-{} ({})", self.get(), self.description()),
        }
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.get())
    }
}

#[cfg(test)]
mod tests {
    use super::Errno;

    #[test]
    fn signs_convert_at_the_edges() {
        assert_eq!(Errno::ENOMEM.get(), libc::ENOMEM);
        assert_eq!(Errno::ENOMEM.neg(), -libc::ENOMEM);
        assert_eq!(Errno::from_neg(-libc::EIO), Some(Errno::EIO));
        assert_eq!(Errno::from_neg(libc::EIO), None);
        assert_eq!(Errno::from_neg(0), None);
        assert_eq!(Errno::from_neg(i32::MIN), None);
        assert_eq!(Errno::from_raw(libc::EIO), Some(Errno::EIO));
        assert_eq!(Errno::from_raw(-libc::EIO), None);
        assert_eq!(Errno::result_from_neg(0), Ok(()));
        assert_eq!(
            Errno::result_from_neg(-libc::ENOTCONN),
            Err(Errno::ENOTCONN)
        );
        assert_eq!(Errno::result_from_neg(libc::ENOTCONN), Err(Errno::ENOTCONN));
        assert_eq!(Errno::result_from_neg(i32::MIN), Err(Errno::EIO));
        assert_eq!(Errno::neg_of(Ok(())), 0);
        assert_eq!(Errno::neg_of(Err(Errno::EACCES)), -libc::EACCES);
    }

    #[test]
    fn prints_name_and_description() {
        assert_eq!(format!("{:?}", Errno::ENOMEM), "ENOMEM");
        assert_eq!(Errno::ENOMEM.name(), Some("ENOMEM"));
        assert_eq!(Errno::new(4095).name(), None);
        assert_eq!(format!("{:?}", Errno::new(4095)), "Errno(4095)");
        let s = Errno::ENOMEM.to_string();
        assert!(s.starts_with("-ENOMEM ("), "{s}");
        assert!(!s.contains("os error"), "{s}");
        let io: std::io::Error = Errno::ETIMEDOUT.into();
        assert_eq!(io.raw_os_error(), Some(libc::ETIMEDOUT));
    }
}
