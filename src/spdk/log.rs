//! The project's `tracing` events written to SPDK's log (`spdk_log`), so messages of the
//! engine, RTRS and RNBD appear with the host application's own, at its log levels:
//! error → `SPDK_LOG_ERROR`, warn → `SPDK_LOG_WARN`, info → `SPDK_LOG_NOTICE`; debug and
//! trace are dropped (SPDK's debug flags are per component and need a debug build).
//! Spans are not tracked: events carry everything a reader needs. An event is enabled
//! only if SPDK will write it (to stderr or syslog, at their levels of the moment), so a
//! rate limiter asking `tracing::enabled!` counts only lines printed.

use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

use super::sys;

/// Installs the bridge as the process-wide `tracing` subscriber (once; later calls and
/// a subscriber already set by the host are left alone).
pub fn install() {
    let _ = tracing::subscriber::set_global_default(SpdkLog {
        next_span: AtomicU64::new(1),
    });
}

struct SpdkLog {
    next_span: AtomicU64,
}

/// Collects an event's fields as `message key=value ...`.
#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

/// SPDK's level for a `tracing` level (INFO and above; the rest is dropped).
fn spdk_level(level: Level) -> Option<sys::spdk_log_level> {
    match level {
        Level::ERROR => Some(sys::spdk_log_level_SPDK_LOG_ERROR),
        Level::WARN => Some(sys::spdk_log_level_SPDK_LOG_WARN),
        Level::INFO => Some(sys::spdk_log_level_SPDK_LOG_NOTICE),
        _ => None,
    }
}

impl Subscriber for SpdkLog {
    /// Asked per event, not cached per call site: SPDK's levels change at run time
    /// (`log_set_print_level`).
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        match spdk_level(*metadata.level()) {
            Some(_) => Interest::sometimes(),
            None => Interest::never(),
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let Some(level) = spdk_level(*metadata.level()) else {
            return false;
        };
        // SAFETY: plain getters of SPDK's log levels, callable from any thread.
        let (print, syslog) =
            unsafe { (sys::spdk_log_get_print_level(), sys::spdk_log_get_level()) };
        level <= print.max(syslog)
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(self.next_span.fetch_add(1, Ordering::Relaxed).max(1))
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let level = spdk_level(*meta.level()).unwrap_or(sys::spdk_log_level_SPDK_LOG_NOTICE);
        let mut line = Line::default();
        event.record(&mut line);
        line.0.push('\n');
        let text = CString::new(line.0.replace('\0', " ")).unwrap_or_default();
        let file = CString::new(meta.file().unwrap_or("rtrs")).unwrap_or_default();
        let func = CString::new(meta.target()).unwrap_or_default();
        let line_no = meta.line().map_or(0, |l| i32::try_from(l).unwrap_or(0));
        // SAFETY: every pointer is a valid C string for the call; "%s" consumes exactly
        // the one vararg given.
        unsafe {
            sys::spdk_log(
                level,
                file.as_ptr(),
                line_no,
                func.as_ptr(),
                c"%s".as_ptr(),
                text.as_ptr(),
            );
        }
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
