//! `rtrs-target`: a standalone RNBD target over RTRS (the kernel's `rnbd_server` +
//! `rtrs_server` with their module parameters, as one process on our reactors).
//!
//! ```text
//! rtrs-target --listen tcp://127.0.0.1:1234 --export vol=ram:1G [--export d=file:/dev/x:ro]
//!             [--listen rdma://10.0.0.1] [--queue-depth 512] [--chunk-size 128K]
//!             [--no-always-invalidate] [-m 0x1]
//!             [--handshake-timeout 5s] [--max-pending 256] [--max-pending-per-source 32]
//!             [--psk-file KEYFILE]
//!             [--allow vol=10.0.0.0/24 --allow vol=sess:host1 ...]
//!             [--max-sessions N] [--max-sessions-per-source 16] [--open-grace 10s]
//!             [--max-path-connections 513] [--max-connections N]
//!             [--max-connections-per-source N]
//!             [--control-socket PATH]
//! rtrs-target ctl --socket PATH openers [--export NAME] | force-close EXPORT SESSNAME
//!             | disconnect SESSNAME [PATH] | sessions
//! ```
//! `tcp://` listens on the software fabric, `rdma://` on the RDMA device of its address (verbs);
//! both at once run one RTRS server per fabric over the same exports. Connections that have
//! not completed their handshake within `--handshake-timeout` are closed; at most
//! `--max-pending` of them are held per listener, at most `--max-pending-per-source` from
//! one address (a newcomer evicts the oldest of the busiest source, so a flood of idle
//! connections cannot lock clients out). It prints one line when ready (`listening on
//! tcp://127.0.0.1:1234, exports: vol (ram 1 GiB)`) and stops cleanly on SIGINT or SIGTERM:
//! the servers close every session, their pollers finish, the reactors drain, exit code 0.
//! Sessions and connections are capped (`--max-sessions`, `--max-connections`, per source
//! and per path); a session with no device open holds its slot for `--open-grace` at most
//! and gives way to a newcomer at a cap (docs/ARCHITECTURE.md, "Session slots"). The soft
//! limit on file descriptors is raised to the hard one at start, and the connection caps
//! keep a margin below it.
//! `--allow NAME=PATTERN` restricts export NAME to the hosts its patterns match (an
//! address, a network, or `sess:SESSNAME`; checked at OPEN, others get −EACCES; a `sess:`
//! pattern identifies a client, it does not authenticate it, since clients name their own
//! sessions: use it with `--psk-file`); an export without any stays open to every host, as
//! the kernel's are, and a target listening on a non-loopback address says so in one
//! warning. With `-v` each path that connects is logged with its session name and
//! `client@server` addresses. With `--psk-file` every client must prove the key on connect
//! (`docs/tcp-fabric.md`, "Authentication"); the data itself travels in clear. Bad
//! arguments give one line on stderr and exit code 2; a failure to start (no RDMA device
//! for `rdma://`, an address in use), one line and exit code 1.
//!
//! `--control-socket PATH` makes a Unix socket (mode 0600) through which `rtrs-target ctl`
//! lists each export's openers, closes one session's mapping of an export (the kernel
//! server's `force_close`) and disconnects a session or one of its paths
//! (`rtrs_spdk::cli::control`; docs/ARCHITECTURE.md, "Steering a running target").

// clap turns the argument docs into --help, where `[:PORT]` and the like are optional
// parts of a value, not links.
#![allow(rustdoc::broken_intra_doc_links)]

use rtrs_spdk::cli;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rtrs_spdk::engine::{CpuMask, Engine};
use rtrs_spdk::fabric::admission::{DEFAULT_MAX_PENDING, DEFAULT_MAX_PENDING_PER_SOURCE};
use rtrs_spdk::fabric::Admission;
use rtrs_spdk::rnbd::backend::ExportSpec;
use rtrs_spdk::rnbd::server::HostPattern;
use rtrs_spdk::server::{ServerConfig, DEFAULT_MAX_PATH_CONNECTIONS};

use cli::target::Listen;
use cli::url::{parse_url, FabricUrl};
use cli::{fail, Idle, EXIT_FAILED, EXIT_USAGE};

const PROG: &str = "rtrs-target";

/// A standalone RNBD/RTRS target.
#[derive(Parser, Debug)]
#[command(
    name = "rtrs-target",
    version,
    about,
    max_term_width = 100,
    after_help = "Steer a running target (with --control-socket): rtrs-target ctl --help"
)]
struct Args {
    /// Address to listen on, tcp://HOST[:PORT] or rdma://HOST[:PORT] (port 1234 when
    /// omitted; 0 picks a free one, printed in the ready line). Repeatable.
    #[arg(long, value_name = "URL", required = true, value_parser = listen_arg)]
    listen: Vec<FabricUrl>,
    /// An export: NAME=ram:SIZE (zero-filled memory, on transparent huge pages where the
    /// kernel has them, committed 2 MiB at a time as it is written) or
    /// NAME=file:PATH[:ro]. Repeatable.
    #[arg(long, value_name = "SPEC", required = true, value_parser = export_arg)]
    export: Vec<ExportSpec>,
    /// Chunks per session (the server's queue depth, the kernel's sess_queue_depth).
    #[arg(long, value_name = "N", default_value_t = 512)]
    queue_depth: u16,
    /// Bytes per chunk, a power of two ≥ 8K; the largest IO is this minus 4 KiB.
    #[arg(long, value_name = "BYTES", default_value = "128K", value_parser = chunk_arg)]
    chunk_size: u32,
    /// Do not register a new key per IO (always_invalidate off).
    #[arg(long)]
    no_always_invalidate: bool,
    /// Require every client to prove this pre-shared key on connect: a file readable by
    /// its owner only, holding at least 32 random bytes as hex or base64 (e.g. made with
    /// `openssl rand -hex 32`). Authenticates connections; does not encrypt data.
    #[arg(long, value_name = "PATH", value_parser = cli::psk_file_arg)]
    psk_file: Option<rtrs_spdk::fabric::Psk>,
    /// Heartbeat interval (500ms, 5s): a path silent for --heartbeat-missed intervals is
    /// closed.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = cli::duration_arg)]
    heartbeat: Duration,
    /// Silent heartbeat intervals after which a path is closed.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = cli::missed_arg)]
    heartbeat_missed: u32,
    /// Reactor cores, a hex mask (0x3) or a list ([0-1]); default every core.
    #[arg(short = 'm', long, value_name = "MASK", value_parser = cli::cpumask_arg)]
    cpumask: Option<CpuMask>,
    /// Idle reactors busy-poll (default, as SPDK) or sleep with backoff.
    #[arg(long, value_enum, default_value_t = Idle::Busy)]
    idle: Idle,
    /// Close a connection that has not completed its handshake this long after it was
    /// accepted (the RTRS handshake: from a path's first connection to its INFO_REQ).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = cli::duration_arg)]
    handshake_timeout: Duration,
    /// Most connections still in their handshake, per listener; at the cap a newcomer
    /// evicts the oldest one of the busiest source address.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PENDING)]
    max_pending: usize,
    /// Most connections still in their handshake from one source address (IPv6: one
    /// /64); beyond, the source's oldest is closed.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PENDING_PER_SOURCE)]
    max_pending_per_source: usize,
    /// Most established sessions, each holding queue-depth × chunk-size bytes of chunks;
    /// beyond, a new one is refused (EUSERS). 0: as many as fit in a quarter of the
    /// machine's memory (at least 4, at most 1024).
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_sessions: usize,
    /// Most established sessions from one client address (IPv6: one /64).
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_sessions_per_source: usize,
    /// Close a session that has no device open this long after it connected or closed
    /// its last device; at the session and connection caps such sessions give way to
    /// new ones at once.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = cli::duration_arg)]
    open_grace: Duration,
    /// Most connections one path may ask for (the kernel's client makes one per CPU
    /// plus one); a path asking for more is refused (EINVAL).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PATH_CONNECTIONS)]
    max_path_connections: u16,
    /// Most connections in all; beyond, sessions without a device give way, else a new
    /// path is refused (EUSERS). 0: what an eighth of the memory holds (about 3 MiB a
    /// connection at most) and two fifths of the file descriptors left, the smaller.
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_connections: usize,
    /// Most connections of the sessions from one client address. 0: half of
    /// --max-connections.
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_connections_per_source: usize,
    /// Only hosts matching PATTERN may open export NAME: an address (127.0.0.2,
    /// [fd00::1]) or network (10.0.0.0/24, [fd00::]/64) matched against the client's
    /// source address, or sess:SESSNAME matched against its session name (which the
    /// client chooses: it identifies, it does not authenticate; pair it with
    /// --psk-file). Repeatable; an export without any is open to every host.
    #[arg(long, value_name = "NAME=PATTERN", value_parser = allow_arg)]
    allow: Vec<(String, HostPattern)>,
    /// A Unix socket (made with mode 0600) through which `rtrs-target ctl --socket PATH`
    /// lists openers, closes a session's mapping of an export and disconnects sessions
    /// or paths.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// More log output (repeatable); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

/// `rtrs-target ctl`: steers a running target through its --control-socket; prints the
/// answer as JSON.
#[derive(Parser, Debug)]
#[command(name = "rtrs-target ctl", version, max_term_width = 100)]
struct CtlArgs {
    /// The running target's --control-socket.
    #[arg(short, long, value_name = "PATH")]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: CtlCmd,
}

#[derive(Subcommand, Debug)]
enum CtlCmd {
    /// Each export's openers: session, access mode, device id, paths (addresses and
    /// RDMA devices), since when (opened_at, Unix seconds).
    Openers {
        /// Only this export.
        #[arg(long, value_name = "NAME")]
        export: Option<String>,
    },
    /// Closes session SESSNAME's mapping of EXPORT (the kernel's force_close): its
    /// writer slot is free at once, its IO fails, and its next OPEN is checked against
    /// the host list and access rules again.
    ForceClose { export: String, sessname: String },
    /// Disconnects session SESSNAME, or only its PATH (client@server as `openers` shows
    /// it, or the client's address); the client reconnects under its own policy.
    Disconnect {
        sessname: String,
        path: Option<String>,
    },
    /// Every session and path with its statistics.
    Sessions,
}

fn ctl(args: CtlArgs) -> Result<ExitCode, (String, u8)> {
    use serde_json::json;
    let (method, params) = match args.cmd {
        CtlCmd::Openers { export } => ("get_openers", json!({ "export_name": export })),
        CtlCmd::ForceClose { export, sessname } => (
            "force_close",
            json!({ "export_name": export, "sessname": sessname }),
        ),
        CtlCmd::Disconnect { sessname, path } => {
            ("disconnect", json!({ "sessname": sessname, "path": path }))
        }
        CtlCmd::Sessions => ("get_sessions", json!({})),
    };
    let v = cli::control::request(&args.socket, method, params).map_err(|e| (e, EXIT_FAILED))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string())
    );
    Ok(ExitCode::SUCCESS)
}

fn listen_arg(s: &str) -> Result<FabricUrl, String> {
    let u = parse_url(s)?;
    if u.src.is_some() {
        return Err(format!(
            "{s:?}: src= is the local address a client path binds; --listen takes none \
             (listen on the address itself)"
        ));
    }
    Ok(u)
}

fn export_arg(s: &str) -> Result<ExportSpec, String> {
    ExportSpec::parse(s).map_err(|e| e.to_string())
}

fn allow_arg(s: &str) -> Result<(String, HostPattern), String> {
    let (name, pattern) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=PATTERN, e.g. vol=10.0.0.0/24"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: the export NAME before '=' is empty"));
    }
    let p = pattern.parse::<HostPattern>().map_err(|e| e.to_string())?;
    Ok((name.to_string(), p))
}

fn chunk_arg(s: &str) -> Result<u32, String> {
    let n = cli::size_arg(s)?;
    u32::try_from(n).map_err(|_| format!("chunk size {s:?} is above 4 GiB"))
}

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "ctl") {
        let argv = std::iter::once("rtrs-target ctl".into()).chain(std::env::args_os().skip(2));
        let args: CtlArgs = match cli::parse_args_from(PROG, argv) {
            Ok(a) => a,
            Err(code) => return code,
        };
        return match ctl(args) {
            Ok(code) => code,
            Err((msg, code)) => fail(PROG, msg, code),
        };
    }
    let args: Args = match cli::parse_args(PROG) {
        Ok(a) => a,
        Err(code) => return code,
    };
    cli::init_logging(tracing::Level::WARN, args.verbose);
    match run(args) {
        Ok(code) => code,
        Err((msg, code)) => fail(PROG, msg, code),
    }
}

fn run(args: Args) -> Result<ExitCode, (String, u8)> {
    let config = ServerConfig {
        queue_depth: args.queue_depth,
        chunk_size: args.chunk_size,
        always_invalidate: !args.no_always_invalidate,
        admission: Admission {
            handshake_timeout: args.handshake_timeout,
            max_pending: args.max_pending,
            max_pending_per_source: args.max_pending_per_source,
        },
        psk: args.psk_file.clone(),
        hb: cli::hb_config(args.heartbeat, args.heartbeat_missed),
        max_sessions: args.max_sessions,
        max_sessions_per_source: args.max_sessions_per_source,
        open_grace: args.open_grace,
        max_path_connections: args.max_path_connections,
        max_connections: args.max_connections,
        max_connections_per_source: args.max_connections_per_source,
        ..ServerConfig::default()
    };
    config.validate().map_err(|e| (e.to_string(), EXIT_USAGE))?;
    let engine_cfg = cli::engine_config(args.cpumask, args.idle).map_err(|e| (e, EXIT_USAGE))?;

    // Signals first, so a SIGTERM during start-up is not lost.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(|e| {
            (
                format!("cannot install the handler of signal {sig}: {e}"),
                EXIT_FAILED,
            )
        })?;
    }

    // One fabric per scheme, opened before any reactor starts: no RDMA device is one
    // line and exit code 1 at once.
    let mut listen: Vec<Listen> = Vec::new();
    for u in &args.listen {
        match listen.iter_mut().find(|l| l.scheme == u.scheme.as_str()) {
            Some(l) => l.addrs.push(u.addr),
            None => listen.push(Listen {
                scheme: u.scheme.as_str(),
                fabric: u
                    .scheme
                    .open()
                    .map_err(|e| (format!("--listen {u}: {e}"), EXIT_FAILED))?,
                addrs: vec![u.addr],
            }),
        }
    }

    for (name, pattern) in &args.allow {
        if !args.export.iter().any(|e| &e.name == name) {
            return Err((
                format!("--allow {name}={pattern}: no --export named '{name}'"),
                EXIT_USAGE,
            ));
        }
    }
    let open: Vec<&str> = args
        .export
        .iter()
        .filter(|e| !args.allow.iter().any(|(n, _)| *n == e.name))
        .map(|e| e.name.as_str())
        .collect();
    let exposed: Vec<String> = args
        .listen
        .iter()
        .filter(|u| !u.addr.ip().is_loopback())
        .map(ToString::to_string)
        .collect();
    if !open.is_empty() && !exposed.is_empty() {
        tracing::warn!(
            "exports open to any host while listening on {}: {} (restrict them with \
             --allow NAME=PATTERN)",
            exposed.join(", "),
            open.join(", ")
        );
    }

    // A service started under systemd gets a soft limit of 1024 descriptors and a far
    // higher hard one: take the hard one, then size the connection caps by it.
    let nofile = match rtrs_spdk::process::raise_nofile() {
        Ok(n) => n.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let config_admission = config.admission;
    let session_cap = config.session_cap();
    let (conn_cap, conn_cap_per_source) = config.connection_cap();
    let engine =
        Engine::start(engine_cfg).map_err(|e| (format!("starting reactors: {e}"), EXIT_FAILED))?;
    let target = match cli::target::start_target(&engine, listen, &args.export, &args.allow, config)
    {
        Ok(t) => t,
        Err(e) => {
            let _ = engine.shutdown();
            return Err((e, EXIT_FAILED));
        }
    };
    let _control = match &args.control_socket {
        Some(path) => {
            let servers = target.servers.clone();
            match cli::control::ControlSocket::serve(path, target.control(), servers) {
                Ok(c) => Some(c),
                Err(e) => {
                    target.stop(Duration::from_secs(5));
                    let _ = engine.shutdown();
                    return Err((e, EXIT_FAILED));
                }
            }
        }
        None => None,
    };
    let urls = target.urls();
    println!(
        "listening on {}, exports: {}",
        urls.join(", "),
        target.described.join(", ")
    );
    let _ = std::io::stdout().flush();
    tracing::info!(
        cores = engine.cores(),
        queue_depth = args.queue_depth,
        chunk_size = args.chunk_size,
        always_invalidate = !args.no_always_invalidate,
        admission = %config_admission,
        max_sessions = session_cap,
        max_sessions_per_source = args.max_sessions_per_source,
        open_grace = ?args.open_grace,
        max_path_connections = args.max_path_connections,
        max_connections = conn_cap,
        max_connections_per_source = conn_cap_per_source,
        nofile = %nofile,
        authentication = args.psk_file.is_some(),
        "target ready"
    );

    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::info!("signal received: stopping");
    let stats: Vec<String> = target
        .servers
        .iter()
        .map(|(scheme, s)| format!("{scheme}: {}", s.stats().to_json()))
        .collect();
    if !target.stop(Duration::from_secs(5)) {
        tracing::warn!("server pollers still busy after 5 s; shutting the reactors down anyway");
    }
    for s in stats {
        tracing::debug!("server statistics at stop: {s}");
    }
    match engine.shutdown() {
        Ok(_) => {
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err((format!("stopping reactors: {e}"), EXIT_FAILED)),
    }
}
