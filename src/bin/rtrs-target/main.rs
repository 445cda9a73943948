//! `rtrs-target`: a standalone RNBD target over RTRS (the kernel's `rnbd_server` +
//! `rtrs_server` with their module parameters, as one process on our reactors).
//!
//! ```text
//! rtrs-target --listen tcp://127.0.0.1:1234 --export vol=ram:1G [--export d=file:/dev/x:ro]
//!             [--queue-depth 512] [--chunk-size 128K] [--no-always-invalidate] [-m 0x1]
//! ```
//! It prints one line when ready (`listening on tcp://127.0.0.1:1234, exports: vol (ram
//! 1 GiB)`) and stops cleanly on SIGINT or SIGTERM: the server closes every session,
//! its pollers finish, the reactors drain, exit code 0. Bad arguments give one line on
//! stderr and exit code 2; a failure to start, exit code 1.

#[path = "../shared/mod.rs"]
#[allow(dead_code)]
mod shared;

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rtrs_spdk::engine::{CpuMask, Engine};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::rnbd::backend::ExportSpec;
use rtrs_spdk::server::ServerConfig;

use shared::url::{parse_url, FabricUrl};
use shared::{fail, Idle, EXIT_FAILED, EXIT_USAGE};

const PROG: &str = "rtrs-target";

/// A standalone RNBD/RTRS target.
#[derive(Parser, Debug)]
#[command(name = "rtrs-target", version, about, max_term_width = 100)]
struct Args {
    /// Address to listen on, tcp://HOST[:PORT] (port 1234 when omitted; 0 picks a free
    /// one, printed in the ready line). Repeatable.
    #[arg(long, value_name = "URL", required = true, value_parser = parse_url)]
    listen: Vec<FabricUrl>,
    /// An export: NAME=ram:SIZE or NAME=file:PATH[:ro]. Repeatable.
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
    /// Heartbeat interval (500ms, 5s): a path silent for --heartbeat-missed intervals is
    /// closed.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = shared::duration_arg)]
    heartbeat: Duration,
    /// Silent heartbeat intervals after which a path is closed.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = shared::missed_arg)]
    heartbeat_missed: u32,
    /// Reactor cores, a hex mask (0x3) or a list ([0-1]); default every core.
    #[arg(short = 'm', long, value_name = "MASK", value_parser = shared::cpumask_arg)]
    cpumask: Option<CpuMask>,
    /// Idle reactors busy-poll (default, as SPDK) or sleep with backoff.
    #[arg(long, value_enum, default_value_t = Idle::Busy)]
    idle: Idle,
    /// More log output (repeatable); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn export_arg(s: &str) -> Result<ExportSpec, String> {
    ExportSpec::parse(s).map_err(|e| e.to_string())
}

fn chunk_arg(s: &str) -> Result<u32, String> {
    let n = shared::size_arg(s)?;
    u32::try_from(n).map_err(|_| format!("chunk size {s:?} is above 4 GiB"))
}

fn main() -> ExitCode {
    let args: Args = match shared::parse_args(PROG) {
        Ok(a) => a,
        Err(code) => return code,
    };
    shared::init_logging(tracing::Level::WARN, args.verbose);
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
        hb: shared::hb_config(args.heartbeat, args.heartbeat_missed),
        ..ServerConfig::default()
    };
    config.validate().map_err(|e| (e.to_string(), EXIT_USAGE))?;
    let engine_cfg = shared::engine_config(args.cpumask, args.idle).map_err(|e| (e, EXIT_USAGE))?;

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

    let engine =
        Engine::start(engine_cfg).map_err(|e| (format!("starting reactors: {e}"), EXIT_FAILED))?;
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let listen: Vec<_> = args.listen.iter().map(|u| u.addr).collect();
    let target = match shared::target::start_target(&engine, fabric, &listen, &args.export, config)
    {
        Ok(t) => t,
        Err(e) => {
            let _ = engine.shutdown();
            return Err((e, EXIT_FAILED));
        }
    };
    let urls: Vec<String> = target
        .server
        .local_addrs()
        .iter()
        .map(|a| format!("tcp://{a}"))
        .collect();
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
        "target ready"
    );

    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::info!("signal received: stopping");
    let stats = target.server.stats();
    if !target.stop(Duration::from_secs(5)) {
        tracing::warn!("server pollers still busy after 5 s; shutting the reactors down anyway");
    }
    tracing::debug!("server statistics at stop: {}", stats.to_json());
    match engine.shutdown() {
        Ok(_) => {
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err((format!("stopping reactors: {e}"), EXIT_FAILED)),
    }
}
