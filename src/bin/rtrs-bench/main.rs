//! `rtrs-bench`: block IO against an RNBD device over RTRS, measured (fio's job shape
//! for this stack).
//!
//! ```text
//! rtrs-bench --path tcp://127.0.0.1:1234 --device vol --rw randread --bs 4K --qd 32 --time 10s
//! rtrs-bench --path rdma://10.0.0.1?src=10.0.0.2 --path rdma://10.0.1.1?src=10.0.1.2 \
//!            --sessname host1 --device vol --rw randwrite --bs 4K --qd 32
//! rtrs-bench --inline-target ram:1G --rw randwrite --bs 4K --qd 1 --time 10s --json
//! rtrs-bench --path tcp://127.0.0.1:1234 --device vol --rw zero --write-zeroes native
//! ```
//! Every `--path` of a run uses one fabric (`tcp://` or `rdma://`); `?src=ADDR` binds the
//! path's local address. `--sessname` names the RTRS session (the kernel's `sessname=`;
//! 1 to 254 bytes without `/` or `.`); the default is `rtrs-bench-PID`.
//! The client session is opened on reactor 0 with one IO connection per reactor of the
//! cpumask; the device is mapped there. `--qd` is the total queue depth, spread over the
//! reactors (reactor k gets qd/n, the first qd mod n one more; with fewer than n the
//! first qd reactors get one each), each reactor working on its own slice of the device.
//! Every reactor owns one registered buffer of its share × bs, so no IO allocates.
//! `--warmup-write` writes the region once before the timed run (RAM disks get backed,
//! reads find data); `--size` limits the region to the first SIZE bytes.
//! `--rw zero` sends write-zeroes of `--bs` (`--verify` reads them back as zeros): as
//! zero-filled WRITEs by default, or as RNBD op 5 with `--write-zeroes native` (only for
//! targets on Linux 6.8+ or rtrs-target; docs/ARCHITECTURE.md, "RNBD op 5 across kernel versions").
//! `--inline-target` runs an RNBD target in the same process on the same reactors over
//! the loopback fabric: the engine's cost without a network.
//! `--psk-file KEYFILE` proves a pre-shared key to the target (which must use the same
//! key) and requires the target to prove it too (`docs/tcp-fabric.md`, "Authentication");
//! a refusal ("authentication failed") is reported at once, not retried.
//! While the device is unreachable (the target restarting, every path down, the device
//! not re-opened yet after a reconnect) IO waits, up to `--io-wait-timeout` (30 s) after
//! its submission, and is sent again once the device is back; only then does it fail,
//! counted as an IO error with the reason ("device 'vol' unreachable for 30 s: ...").
//!
//! Output: a live progress line on stderr when it is a terminal; at the end IOPS, MiB/s,
//! latency (average, p50, p99, p99.9, max; from a log-linear histogram), errors and
//! verify mismatches, as text or (`--json`) one JSON object on stdout.
//! SIGINT or SIGTERM ends the run early: what was measured is reported (another one, a
//! second or more later, exits at once; one within that second is the same signal delivered
//! again, as `timeout` does: to its child and then to the child's process group).
//! A path that fails, while the session is being set up or later, is reconnected after
//! `--reconnect-delay`, up to `--max-reconnect-attempts` times in a row (for ever by
//! default); the summary warns about every `--path` not connected at the end, with why
//! (`client_stats.paths[]` of the JSON has the same: `state`, `failure`, `last_error`),
//! and `--require-all-paths` makes that a failure.
//! Exit codes: 0 success, 1 IO errors / verify mismatches / target unreachable / device
//! refused / a path not connected at the end with `--require-all-paths`, 2 bad arguments,
//! 130 interrupted.

// clap turns the argument docs into --help, where `[:PORT]` and the like are optional
// parts of a value, not links.
#![allow(rustdoc::broken_intra_doc_links)]

use rtrs_spdk::cli;
use rtrs_spdk::sync::lock;

mod hist;
mod plan;
mod progress;
mod report;
mod run;
mod stamp;
mod wait;
mod worker;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use clap::Parser;
use rtrs_spdk::client::{ClientConfig, ClientSession, MpPolicy, PathAddr, PathState};
use rtrs_spdk::engine::{CpuMask, Engine};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::backend::ExportSpec;
use rtrs_spdk::rnbd::client::{WriteZeroesMode, WriteZeroesParseError};
use rtrs_spdk::server::ServerConfig;

use cli::target::{Listen, StandaloneTarget};
use cli::url::{parse_url, FabricUrl};
use cli::{fail, Idle, EXIT_FAILED, EXIT_USAGE};
use progress::Progress;
use report::{RunInfo, Totals};
use run::Setup;
use worker::{JobSpec, Rw};

const PROG: &str = "rtrs-bench";
/// The device name of `--inline-target`.
const INLINE_DEVICE: &str = "bench";
/// Chunk size of the inline target: 256 KiB, so 128 KiB IO fits (max IO = chunk − 4 KiB).
const INLINE_CHUNK: u32 = 256 << 10;
/// Exit code after SIGINT/SIGTERM (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

/// Signals closer than this to the first are that signal delivered again, not a second one.
const SIGNAL_AGAIN: Duration = Duration::from_secs(1);

/// SIGINT/SIGTERM: the first sets `stop` (the run ends, what was measured is reported);
/// another, [`SIGNAL_AGAIN`] or more after it, exits at once with [`EXIT_INTERRUPTED`].
/// `timeout(1)` sends its signal to the child and then to its process group, so the child
/// may see it twice within microseconds: that is one request to stop, not two.
fn watch_signals(stop: Arc<AtomicBool>) -> Result<(), Failure> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| failed(format!("installing the SIGINT/SIGTERM handler: {e}")))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first: Option<Instant> = None;
            for sig in signals.forever() {
                match first {
                    None => {
                        first = Some(Instant::now());
                        stop.store(true, Ordering::Release);
                    }
                    Some(at) if at.elapsed() >= SIGNAL_AGAIN => {
                        eprintln!("{PROG}: signal {sig} again: exiting at once, nothing reported");
                        signal_hook::low_level::exit(i32::from(EXIT_INTERRUPTED));
                    }
                    Some(_) => {}
                }
            }
        })
        .map_err(|e| failed(format!("starting the signal thread: {e}")))?;
    Ok(())
}

/// Block IO benchmark over RTRS/RNBD.
#[derive(Parser, Debug)]
#[command(
    name = "rtrs-bench",
    version,
    about,
    max_term_width = 100,
    after_help = "SIGINT or SIGTERM ends the run early and reports what was measured (exit \
                  code 130); another one, a second or more later, exits at once.\n\
                  Exit codes: 0 success; 1 IO errors, verify mismatches, the target \
                  unreachable, the device refused, or a path not connected at the end with \
                  --require-all-paths; 2 bad arguments; 130 interrupted."
)]
struct Args {
    /// A path to the target, tcp://HOST[:PORT] or rdma://HOST[:PORT] (port 1234 when
    /// omitted), with ?src=ADDR to bind the local address. Repeatable (multipath; one
    /// fabric for all).
    #[arg(long, value_name = "URL", value_parser = parse_url)]
    path: Vec<FabricUrl>,
    /// The RTRS session name the target sees (1 to 254 bytes, no '/' or '.');
    /// default rtrs-bench-PID.
    #[arg(long, value_name = "NAME", value_parser = sessname_arg)]
    sessname: Option<String>,
    /// The exported device to map.
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// IO pattern.
    #[arg(long, value_enum)]
    rw: Rw,
    /// Percentage of reads for randrw.
    #[arg(long, value_name = "PCT", default_value_t = 50,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    rwmixread: u8,
    /// Block size of every IO (a multiple of 512).
    #[arg(long, value_name = "SIZE", default_value = "4K", value_parser = cli::size_arg)]
    bs: u64,
    /// Total queue depth, spread over the reactors.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    qd: u32,
    /// How long to measure (500ms, 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = cli::duration_arg)]
    time: Duration,
    /// Stamp every written sector and check every read (see the module doc).
    #[arg(long)]
    verify: bool,
    /// Before the timed run, write the whole region once sequentially (not measured), so
    /// reads find written data and RAM disks are backed.
    #[arg(long)]
    warmup_write: bool,
    /// How write-zeroes are sent: emulate (zero-filled writes, safe with every target)
    /// or native (RNBD op 5: only for targets on Linux 6.8+ or rtrs-target).
    #[arg(long, value_name = "MODE", default_value = "emulate", value_parser = write_zeroes_arg)]
    write_zeroes: WriteZeroesMode,
    /// Multipath policy.
    #[arg(long, value_name = "POLICY", default_value = "min-inflight", value_parser = policy_arg)]
    policy: MpPolicy,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Run a target in this process over the loopback fabric with this backend
    /// (ram:SIZE or file:PATH); --path and --device are then implied.
    #[arg(long, value_name = "BACKEND", value_parser = inline_arg, conflicts_with = "path")]
    inline_target: Option<ExportSpec>,
    /// Use only the first SIZE bytes of the device (default: all of it).
    #[arg(long, value_name = "SIZE", value_parser = cli::size_arg)]
    size: Option<u64>,
    /// Reactor cores, a hex mask (0x2) or a list ([1]); default every core.
    #[arg(short = 'm', long, value_name = "MASK", value_parser = cli::cpumask_arg)]
    cpumask: Option<CpuMask>,
    /// Idle reactors busy-poll (default) or sleep with backoff.
    #[arg(long, value_enum, default_value_t = Idle::Busy)]
    idle: Idle,
    /// Prove this pre-shared key to the target on connect (and require the target to
    /// prove it too): a file readable by its owner only, holding at least 32 random
    /// bytes as hex or base64. The target must use the same key (`--psk-file`).
    #[arg(long, value_name = "PATH", value_parser = cli::psk_file_arg,
          conflicts_with = "inline_target")]
    psk_file: Option<rtrs_spdk::fabric::Psk>,
    /// Heartbeat interval (500ms, 5s): a path silent for --heartbeat-missed intervals is
    /// declared dead and its IO fails over to the other paths.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = cli::duration_arg)]
    heartbeat: Duration,
    /// Silent heartbeat intervals after which a path is declared dead.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = cli::missed_arg)]
    heartbeat_missed: u32,
    /// Delay before reconnecting a failed path, plus random jitter of up to 200 ms (and at
    /// most the delay itself).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = cli::duration_arg)]
    reconnect_delay: Duration,
    /// Reconnect attempts in a row before a failed path is closed for good: -1 for ever,
    /// 0 never (the kernel's max_reconnect_attempts). A path failing while the session is
    /// set up counts alike.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1..=9999))]
    max_reconnect_attempts: i32,
    /// Fail (exit code 1) when any --path is not connected at the end of the run (closed
    /// after its reconnect attempts, or still reconnecting); the result is printed all
    /// the same.
    #[arg(long)]
    require_all_paths: bool,
    /// How long each connection of the session and its handshake may take (a target
    /// closes connections slower than its --handshake-timeout, 5 s by default); mapping
    /// the device may take 5 s more.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = cli::duration_arg)]
    connect_timeout: Duration,
    /// How long an IO waits while the device is unreachable (target restarting, every
    /// path down, device not re-opened yet) before it fails; 0 fails it at once.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = cli::duration_arg)]
    io_wait_timeout: Duration,
    /// More log output (repeatable); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn policy_arg(s: &str) -> Result<MpPolicy, String> {
    s.parse()
        .map_err(|e: rtrs_spdk::client::PolicyParseError| e.to_string())
}

fn write_zeroes_arg(s: &str) -> Result<WriteZeroesMode, String> {
    s.parse().map_err(|e: WriteZeroesParseError| e.to_string())
}

fn sessname_arg(s: &str) -> Result<String, String> {
    rtrs_spdk::client::check_sessname(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

fn inline_arg(s: &str) -> Result<ExportSpec, String> {
    ExportSpec::parse(&format!("{INLINE_DEVICE}={s}"))
        .map_err(|e| format!("{e} (expected ram:SIZE or file:PATH)"))
}

type Failure = (String, u8);

fn usage(msg: impl Into<String>) -> Failure {
    (msg.into(), EXIT_USAGE)
}

fn failed(msg: impl Into<String>) -> Failure {
    (msg.into(), EXIT_FAILED)
}

fn main() -> ExitCode {
    let args: Args = match cli::parse_args(PROG) {
        Ok(a) => a,
        Err(code) => return code,
    };
    cli::init_logging(tracing::Level::ERROR, args.verbose);
    match run(args) {
        Ok(code) => code,
        Err((msg, code)) => fail(PROG, msg, code),
    }
}

/// Everything that must be stopped on the way out, in order.
struct Teardown {
    engine: Option<Engine>,
    target: Option<StandaloneTarget>,
    session: Option<ClientSession>,
    setup: Option<Arc<Setup>>,
}

impl Teardown {
    fn finish(&mut self) {
        if let Some(setup) = self.setup.take() {
            setup.unmap.store(true, Ordering::Release);
            wait_for(Duration::from_secs(5), || {
                setup.unmapped.load(Ordering::Acquire)
            });
        }
        if let Some(s) = self.session.take() {
            s.close();
            // Let the paths go down in order before the reactors stop.
            wait_for(Duration::from_secs(5), || {
                s.paths()
                    .iter()
                    .all(|(_, st)| matches!(st, PathState::Closed | PathState::Dead))
            });
        }
        if let Some(t) = self.target.take() {
            t.stop(Duration::from_secs(5));
        }
        if let Some(e) = self.engine.take() {
            if let Err(err) = e.shutdown() {
                tracing::warn!("stopping reactors: {err}");
            }
        }
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        self.finish();
    }
}

fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn run(args: Args) -> Result<ExitCode, Failure> {
    // Everything that can be checked without a target.
    let bs = u32::try_from(args.bs)
        .ok()
        .filter(|b| b % 512 == 0)
        .ok_or_else(|| {
            usage(format!(
                "--bs {}: must be a multiple of 512 bytes below 4 GiB",
                args.bs
            ))
        })?;
    if args.inline_target.is_none() {
        if args.path.is_empty() {
            return Err(usage(
                "give --path tcp://HOST:PORT with --device NAME, or --inline-target ram:SIZE",
            ));
        }
        if args.device.is_none() {
            return Err(usage("--device NAME is required with --path"));
        }
        if let Some(u) = args.path.iter().find(|u| u.scheme != args.path[0].scheme) {
            return Err(usage(format!(
                "--path {} and --path {u}: the paths of a session use one fabric, \
                 give only {}:// or only {}:// paths",
                args.path[0],
                args.path[0].scheme.as_str(),
                u.scheme.as_str()
            )));
        }
    }
    if let Some(size) = args.size {
        if size % u64::from(bs) != 0 {
            return Err(usage(format!(
                "--size {size}: must be a multiple of --bs {bs}"
            )));
        }
    }
    let engine_cfg = cli::engine_config(args.cpumask.clone(), args.idle).map_err(usage)?;
    let cores = engine_cfg.cpumask.len();
    let cpumask = engine_cfg.cpumask.to_string();
    let job = JobSpec {
        rw: args.rw,
        mix_read: args.rwmixread,
        bs,
        verify: args.verify,
        warmup: args.warmup_write,
        time_ns: u64::try_from(args.time.as_nanos()).unwrap_or(u64::MAX),
        run_id: rtrs_spdk::common::random_u64(),
        write_zeroes: args.write_zeroes,
    };

    let mut td = Teardown {
        engine: Some(
            Engine::start(engine_cfg).map_err(|e| failed(format!("starting reactors: {e}")))?,
        ),
        target: None,
        session: None,
        setup: None,
    };
    let engine = td.engine.as_ref().expect("engine just started");

    // The fabric and the paths: a target of our own over loopback, or the paths' fabric.
    let (fabric, paths, device, target_text): (Arc<dyn Fabric>, Vec<PathAddr>, String, String) =
        match &args.inline_target {
            Some(spec) => {
                let fabric: Arc<dyn Fabric> = Arc::new(LoopbackFabric::new());
                let config = ServerConfig {
                    chunk_size: INLINE_CHUNK,
                    ..ServerConfig::default()
                };
                let listen = Listen {
                    scheme: "loopback",
                    fabric: Arc::clone(&fabric),
                    addrs: vec!["127.0.0.1:1234".parse().expect("literal address")],
                };
                let t = cli::target::start_target(
                    engine,
                    vec![listen],
                    std::slice::from_ref(spec),
                    &[],
                    config,
                )
                .map_err(|e| failed(format!("inline target: {e}")))?;
                let paths = t
                    .servers
                    .iter()
                    .flat_map(|(_, s)| s.local_addrs().iter().copied().map(PathAddr::new))
                    .collect();
                let text = format!("inline target {}", t.described.join(", "));
                td.target = Some(t);
                (fabric, paths, INLINE_DEVICE.to_string(), text)
            }
            None => {
                let scheme = args.path[0].scheme;
                (
                    scheme
                        .open()
                        .map_err(|e| failed(format!("--path {}: {e}", args.path[0])))?,
                    args.path
                        .iter()
                        .map(|u| PathAddr {
                            src: u.src,
                            dst: u.addr,
                        })
                        .collect(),
                    args.device.clone().expect("checked above"),
                    scheme.as_str().to_string(),
                )
            }
        };
    let path_text: Vec<String> = match &args.inline_target {
        Some(_) => paths.iter().map(|a| format!("loopback:{a}")).collect(),
        None => args.path.iter().map(ToString::to_string).collect(),
    };
    // Each path as the session's statistics name it, with how the user gave it.
    let given: Vec<(String, String)> = paths
        .iter()
        .map(ToString::to_string)
        .zip(path_text.iter().cloned())
        .collect();

    let mode = if args.rw.writes() || args.verify || args.warmup_write {
        AccessMode::ReadWrite
    } else {
        AccessMode::ReadOnly
    };
    let (rtx, rrx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(Arc::clone(&stop))?;
    // The session's own protection domain: its buffers are registered there and its
    // connections made from it, so no other session's keys reach them.
    let fabric = fabric
        .domain()
        .map_err(|e| failed(format!("the session's protection domain: {e}")))?;
    let setup = Setup::new(
        fabric,
        device.clone(),
        mode,
        job,
        cores,
        Arc::clone(&stop),
        rtx,
    );
    td.setup = Some(Arc::clone(&setup));
    let sessname = args
        .sessname
        .clone()
        .unwrap_or_else(|| format!("rtrs-bench-{}", std::process::id()));
    let mut ccfg = ClientConfig::new(sessname, paths);
    ccfg.mp_policy = args.policy;
    if let Some(psk) = &args.psk_file {
        ccfg.set_psk(psk);
    }
    // Every path is retried alike, while the session is set up and later; an unreachable
    // target is still reported at once (`wait_device`).
    ccfg.max_reconnect_attempts = args.max_reconnect_attempts;
    ccfg.reconnect_delay = args.reconnect_delay;
    ccfg.hb = cli::hb_config(args.heartbeat, args.heartbeat_missed);
    ccfg.reconnect_jitter = args.reconnect_delay.min(Duration::from_millis(200));
    ccfg.io_wait_timeout = args.io_wait_timeout;
    ccfg.connect_timeout = args.connect_timeout;
    let (stx, srx) = mpsc::channel();
    engine
        .send(0, run::start_msg(Arc::clone(&setup), ccfg, stx))
        .map_err(|e| failed(format!("starting the session on reactor 0: {e}")))?;
    let session = srx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| failed("reactor 0 did not answer within 10 s"))?
        .map_err(|e| failed(format!("opening the session: {e}")))?;
    td.session = Some(session.clone());

    let targets = path_text.join(", ");
    let info = wait::device(&setup, &session, &stop, &targets, args.connect_timeout)?;
    if args.rw == Rw::Zero && u64::from(bs) > info.max_write_zeroes {
        return Err(failed(format!(
            "device '{device}' takes write-zeroes of at most {} bytes with --write-zeroes \
             {} (the target's limit; 0: none), --bs is {bs}: use --write-zeroes emulate",
            info.max_write_zeroes, args.write_zeroes
        )));
    }
    if args.rw == Rw::Trim && u64::from(bs) > info.max_discard {
        return Err(failed(format!(
            "device '{device}' takes discards of at most {} bytes (the target's limit; 0: \
             none), --bs is {bs}",
            info.max_discard
        )));
    }
    let (region, plans) = plan::plan(&info, &device, bs, args.size, args.qd as usize, cores)?;
    let active = plans.iter().flatten().count();
    *lock(&setup.plans) = plans;
    setup.go.store(true, Ordering::Release);
    tracing::info!(
        "IO begins: {} for {:?} on {active} core(s), qd {} each{}",
        args.rw.name(),
        args.time,
        args.qd,
        if job.prefills() {
            ", after a prefill"
        } else {
            ""
        }
    );

    // Progress until every active core reported.
    // Waiting IO completes within the wait: only a longer silence is a stall.
    let stall = progress::STALL.max(args.io_wait_timeout + Duration::from_secs(30));
    let mut progress = Progress::new(args.rw.name(), stall);
    let mut reports = Vec::with_capacity(active);
    while reports.len() < active {
        match rrx.recv_timeout(Duration::from_millis(100)) {
            Ok(r) => reports.push(r),
            Err(mpsc::RecvTimeoutError::Timeout) => progress
                .tick(&setup.lives)
                .map_err(|e| failed(format!("{e} on {targets}: giving up")))?,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    progress.clear();
    let stats = session.stats();
    let paths_down = report::paths_down(&stats, &given);
    let client_stats = serde_json::to_value(&stats).unwrap_or(serde_json::Value::Null);
    tracing::info!("client statistics: {client_stats}");
    td.finish();

    let totals = Totals::sum(&reports);
    let info = RunInfo {
        rw: args.rw.name(),
        rwmixread: (args.rw == Rw::Randrw).then_some(args.rwmixread),
        bs,
        qd: args.qd as usize,
        cores,
        active_cores: active,
        cpumask,
        time_s: args.time.as_secs_f64(),
        target: target_text,
        paths: path_text,
        device,
        device_size: info.size,
        region,
        policy: args.policy.name(),
        verify: args.verify,
        interrupted: stop.load(Ordering::Acquire),
        client_stats,
        paths_down,
    };
    if args.json {
        println!("{}", report::json(&info, &totals));
        // stdout is the JSON object alone; the warning of the text summary goes here.
        if let Some(w) = report::paths_warning(&info) {
            eprintln!("{PROG}: {w}");
        }
    } else {
        print!("{}", report::text(&info, &totals));
    }
    let missing = args.require_all_paths && !info.paths_down.is_empty();
    if totals.failed() || missing {
        let mut why = Vec::new();
        if totals.errors > 0 {
            why.push(format!(
                "{} IO error(s) (first: {})",
                totals.errors, totals.first_error
            ));
        }
        if totals.mismatches > 0 {
            why.push(format!(
                "{} verify mismatch(es), first bad offset {}",
                totals.mismatches,
                totals.first_bad.unwrap_or(0)
            ));
        }
        if missing {
            why.push(format!(
                "{} of {} paths not connected at the end (--require-all-paths)",
                info.paths_down.len(),
                info.paths.len()
            ));
        }
        return Err(failed(why.join(", ")));
    }
    if stop.load(Ordering::Acquire) {
        return Err((
            format!("interrupted after {:.1} s", totals.elapsed_s),
            EXIT_INTERRUPTED,
        ));
    }
    Ok(ExitCode::SUCCESS)
}
