//! What the process holds of the machine, for the caps' arithmetic
//! (docs/ARCHITECTURE.md, "Caps and what they cost"): memory, file descriptors left
//! under the limit, and freed heap memory handed back to the system.

/// `MemTotal` of /proc/meminfo in bytes; 16 GiB where it cannot be read.
pub fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(16 << 30, |kib| kib << 10)
}

/// The soft and hard `RLIMIT_NOFILE`; `None` when it cannot be read.
pub fn nofile() -> Option<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives on this stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    Some((r.rlim_cur, r.rlim_max))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one (a service started with systemd's
/// soft 1024 may open as many as its hard limit allows); returns the soft limit in
/// force after.
///
/// # Errors
/// The failing call, when the limit cannot be read or set.
pub fn raise_nofile() -> std::io::Result<u64> {
    let (soft, hard) = nofile().ok_or_else(std::io::Error::last_os_error)?;
    if soft >= hard {
        return Ok(soft);
    }
    let r = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct it is given, which lives on this stack.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(hard)
}

/// File descriptors this process may still open: its soft `RLIMIT_NOFILE` less those
/// open now (/proc/self/fd); `None` when either cannot be read.
pub fn fds_left() -> Option<u64> {
    let (soft, _) = nofile()?;
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(soft.saturating_sub(open))
}

/// Hands the heap memory freed so far back to the system (glibc's `malloc_trim`): the
/// allocator otherwise keeps what closed connections freed for later, so a target's
/// memory would stay at its peak. Walks the allocator's free lists: call it on the
/// control path, not per IO. Nothing on other C libraries.
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free pages of the allocator's own arenas; it
    // touches no memory in use and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
