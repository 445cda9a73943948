//! `rtrs-bench`: block IO against an RNBD device over RTRS, measured (fio's job shape
//! for this stack).
//!
//! ```text
//! rtrs-bench --path tcp://127.0.0.1:1234 --device vol --rw randread --bs 4K --qd 32 --time 10s
//! rtrs-bench --inline-target ram:1G --rw randwrite --bs 4K --qd 1 --time 10s --json
//! ```
//! The client session is opened on reactor 0 with one IO connection per reactor of the
//! cpumask; the device is mapped there. `--qd` is the total queue depth, spread over the
//! reactors (reactor k gets qd/n, the first qd mod n one more; with fewer than n the
//! first qd reactors get one each), each reactor working on its own slice of the device.
//! Every reactor owns one registered buffer of its share × bs, so no IO allocates.
//! `--warmup-write` writes the region once before the timed run (RAM disks get backed,
//! reads find data); `--size` limits the region to the first SIZE bytes.
//! `--inline-target` runs an RNBD target in the same process on the same reactors over
//! the loopback fabric: the engine's cost without a network.
//!
//! Output: a live progress line on stderr when it is a terminal; at the end IOPS, MiB/s,
//! latency (average, p50, p99, p99.9, max; from a log-linear histogram), errors and
//! verify mismatches, as text or (`--json`) one JSON object on stdout.
//! SIGINT or SIGTERM ends the run early: what was measured is reported (a second one
//! exits at once).
//! Exit codes: 0 success, 1 IO errors / verify mismatches / target unreachable / device
//! refused, 2 bad arguments, 130 interrupted.

#[path = "../shared/mod.rs"]
#[allow(dead_code)]
mod shared;

mod hist;
mod progress;
mod report;
mod run;
mod stamp;
mod worker;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use clap::Parser;
use rtrs_spdk::client::{ClientConfig, MpPolicy, PathAddr, PathState, Session};
use rtrs_spdk::engine::{CpuMask, Engine};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::backend::ExportSpec;
use rtrs_spdk::rnbd::client::DeviceInfo;
use rtrs_spdk::server::ServerConfig;

use progress::Progress;
use report::{RunInfo, Totals};
use run::Setup;
use shared::target::Target;
use shared::url::{parse_url, FabricUrl};
use shared::{fail, Idle, EXIT_FAILED, EXIT_USAGE};
use worker::{JobSpec, Plan, Rw};

const PROG: &str = "rtrs-bench";
/// The device name of `--inline-target`.
const INLINE_DEVICE: &str = "bench";
/// Chunk size of the inline target: 256 KiB, so 128 KiB IO fits (max IO = chunk − 4 KiB).
const INLINE_CHUNK: u32 = 256 << 10;
/// Exit code after SIGINT/SIGTERM (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

/// Block IO benchmark over RTRS/RNBD.
#[derive(Parser, Debug)]
#[command(name = "rtrs-bench", version, about, max_term_width = 100)]
struct Args {
    /// A path to the target, tcp://HOST[:PORT] (port 1234 when omitted). Repeatable
    /// (multipath).
    #[arg(long, value_name = "URL", value_parser = parse_url)]
    path: Vec<FabricUrl>,
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
    #[arg(long, value_name = "SIZE", default_value = "4K", value_parser = shared::size_arg)]
    bs: u64,
    /// Total queue depth, spread over the reactors.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    qd: u32,
    /// How long to measure (500ms, 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = shared::duration_arg)]
    time: Duration,
    /// Stamp every written sector and check every read (see the module doc).
    #[arg(long)]
    verify: bool,
    /// Before the timed run, write the whole region once sequentially (not measured), so
    /// reads find written data and RAM disks are backed.
    #[arg(long)]
    warmup_write: bool,
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
    #[arg(long, value_name = "SIZE", value_parser = shared::size_arg)]
    size: Option<u64>,
    /// Reactor cores, a hex mask (0x2) or a list ([1]); default every core.
    #[arg(short = 'm', long, value_name = "MASK", value_parser = shared::cpumask_arg)]
    cpumask: Option<CpuMask>,
    /// Idle reactors busy-poll (default) or sleep with backoff.
    #[arg(long, value_enum, default_value_t = Idle::Busy)]
    idle: Idle,
    /// Heartbeat interval (500ms, 5s): a path silent for --heartbeat-missed intervals is
    /// declared dead and its IO fails over to the other paths.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = shared::duration_arg)]
    heartbeat: Duration,
    /// Silent heartbeat intervals after which a path is declared dead.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = shared::missed_arg)]
    heartbeat_missed: u32,
    /// Delay before reconnecting a failed path, plus random jitter of up to 200 ms (and at
    /// most the delay itself).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = shared::duration_arg)]
    reconnect_delay: Duration,
    /// How long to wait for the target to answer and the device to be mapped.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = shared::duration_arg)]
    connect_timeout: Duration,
    /// More log output (repeatable); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn policy_arg(s: &str) -> Result<MpPolicy, String> {
    s.parse()
        .map_err(|e: rtrs_spdk::client::PolicyParseError| e.to_string())
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
    let args: Args = match shared::parse_args(PROG) {
        Ok(a) => a,
        Err(code) => return code,
    };
    shared::init_logging(tracing::Level::ERROR, args.verbose);
    match run(args) {
        Ok(code) => code,
        Err((msg, code)) => fail(PROG, msg, code),
    }
}

/// Everything that must be stopped on the way out, in order.
struct Teardown {
    engine: Option<Engine>,
    target: Option<Target>,
    session: Option<Session>,
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
    }
    if let Some(size) = args.size {
        if size % u64::from(bs) != 0 {
            return Err(usage(format!(
                "--size {size}: must be a multiple of --bs {bs}"
            )));
        }
    }
    let engine_cfg = shared::engine_config(args.cpumask.clone(), args.idle).map_err(usage)?;
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

    // The fabric and the paths: a target of our own over loopback, or tcp.
    let (fabric, paths, device, target_text): (Arc<dyn Fabric>, Vec<SocketAddr>, String, String) =
        match &args.inline_target {
            Some(spec) => {
                let fabric: Arc<dyn Fabric> = Arc::new(LoopbackFabric::new());
                let config = ServerConfig {
                    chunk_size: INLINE_CHUNK,
                    ..ServerConfig::default()
                };
                let t = shared::target::start_target(
                    engine,
                    Arc::clone(&fabric),
                    &["127.0.0.1:1234".parse().expect("literal address")],
                    std::slice::from_ref(spec),
                    config,
                )
                .map_err(|e| failed(format!("inline target: {e}")))?;
                let paths = t.server.local_addrs().to_vec();
                let text = format!("inline target {}", t.described.join(", "));
                td.target = Some(t);
                (fabric, paths, INLINE_DEVICE.to_string(), text)
            }
            None => (
                Arc::new(TcpFabric::new()),
                args.path.iter().map(|u| u.addr).collect(),
                args.device.clone().expect("checked above"),
                "tcp".to_string(),
            ),
        };
    let path_text: Vec<String> = match &args.inline_target {
        Some(_) => paths.iter().map(|a| format!("loopback:{a}")).collect(),
        None => args.path.iter().map(ToString::to_string).collect(),
    };

    let mode = if args.rw.writes() || args.verify || args.warmup_write {
        AccessMode::ReadWrite
    } else {
        AccessMode::ReadOnly
    };
    let (rtx, rrx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal exits at once; the first ends the run.
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop));
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
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
    let mut ccfg = ClientConfig::new(
        format!("rtrs-bench-{}", std::process::id()),
        paths.iter().copied().map(PathAddr::new).collect(),
    );
    ccfg.mp_policy = args.policy;
    // No retry until the first connect: an unreachable target is reported at once.
    ccfg.max_reconnect_attempts = 0;
    ccfg.reconnect_delay = args.reconnect_delay;
    ccfg.hb = shared::hb_config(args.heartbeat, args.heartbeat_missed);
    ccfg.reconnect_jitter = args.reconnect_delay.min(Duration::from_millis(200));
    ccfg.io_wait_timeout = Duration::from_secs(10);
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
    let info = wait_device(&setup, &session, &stop, &targets, args.connect_timeout)?;
    session.set_max_reconnect_attempts(-1);
    let (region, plans) = plan(&info, &device, bs, args.size, args.qd as usize, cores)?;
    let active = plans.iter().flatten().count();
    *setup.plans.lock().unwrap_or_else(|e| e.into_inner()) = plans;
    setup.go.store(true, Ordering::Release);

    // Progress until every active core reported.
    let mut progress = Progress::new(args.rw.name());
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
    let client_stats = session.stats().to_json();
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
    };
    if args.json {
        println!("{}", report::json(&info, &totals));
    } else {
        print!("{}", report::text(&info, &totals));
    }
    if totals.failed() {
        let mut why = Vec::new();
        if totals.errors > 0 {
            why.push(format!("{} IO error(s)", totals.errors));
        }
        if totals.mismatches > 0 {
            why.push(format!(
                "{} verify mismatch(es), first bad offset {}",
                totals.mismatches,
                totals.first_bad.unwrap_or(0)
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

/// Waits for core 0 to map the device: its limits, or why not (refused, unreachable,
/// no answer in time, interrupted).
fn wait_device(
    setup: &Setup,
    session: &Session,
    stop: &AtomicBool,
    targets: &str,
    connect_timeout: Duration,
) -> Result<DeviceInfo, Failure> {
    let limit = Instant::now() + connect_timeout + Duration::from_secs(5);
    loop {
        if stop.load(Ordering::Acquire) {
            return Err((String::from("interrupted"), EXIT_INTERRUPTED));
        }
        if let Some(r) = setup
            .opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            return r.map_err(|e| failed(format!("{e} (on {targets})")));
        }
        if session
            .paths()
            .iter()
            .all(|(_, s)| matches!(s, PathState::Closed | PathState::Dead))
        {
            return Err(failed(format!(
                "cannot connect to {targets}: connection failed \
                 (is rtrs-target running there? -v shows why)"
            )));
        }
        if Instant::now() > limit {
            return Err(failed(format!(
                "no answer from {targets} within {connect_timeout:?}: the device '{}' was not mapped",
                setup.device
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Checks the run against the device and splits it: the region used, and per reactor
/// its slice (contiguous, whole blocks) and queue depth; reactors beyond `qd` get none.
fn plan(
    info: &DeviceInfo,
    device: &str,
    bs: u32,
    size: Option<u64>,
    qd: usize,
    cores: usize,
) -> Result<(u64, Vec<Option<Plan>>), Failure> {
    if bs % info.logical_block_size != 0 {
        return Err(usage(format!(
            "--bs {bs} is not a multiple of device '{device}''s {}-byte logical block",
            info.logical_block_size
        )));
    }
    if bs > info.max_io_size {
        return Err(usage(format!(
            "--bs {bs} exceeds the largest IO of device '{device}' over this session, {} bytes \
             (the target's chunk size minus 4 KiB: start it with a larger --chunk-size)",
            info.max_io_size
        )));
    }
    let bs = u64::from(bs);
    let region = size.unwrap_or(info.size / bs * bs);
    if region > info.size {
        return Err(usage(format!(
            "--size {region} is larger than device '{device}' ({} bytes)",
            info.size
        )));
    }
    let active = cores.min(qd);
    let units = region / bs;
    if units < active as u64 {
        return Err(usage(format!(
            "device '{device}' ({} bytes) holds fewer than {active} blocks of --bs {bs}, \
             one per reactor",
            info.size
        )));
    }
    let a = active as u64;
    let plans = (0..cores)
        .map(|k| {
            let k64 = k as u64;
            (k < active).then(|| Plan {
                start: k64 * units / a * bs,
                units: (k64 + 1) * units / a - k64 * units / a,
                qd: qd / active + usize::from(k < qd % active),
            })
        })
        .collect();
    Ok((region, plans))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(size: u64, lbs: u32, max_io: u32) -> DeviceInfo {
        DeviceInfo {
            device_id: 0,
            size,
            logical_block_size: lbs,
            physical_block_size: lbs,
            max_io_size: max_io,
            max_discard: 0,
            discard_granularity: 0,
            discard_alignment: 0,
            max_write_zeroes: 0,
            max_secure_erase: 0,
            write_cache: false,
            fua: false,
        }
    }

    #[test]
    fn plans_split_the_region_and_the_queue_depth() {
        let d = dev(1 << 20, 512, 126_976);
        let (region, p) = plan(&d, "v", 4096, None, 5, 2).unwrap();
        assert_eq!(region, 1 << 20);
        let p: Vec<Plan> = p.into_iter().flatten().collect();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].start, p[0].units, p[0].qd), (0, 128, 3));
        assert_eq!((p[1].start, p[1].units, p[1].qd), (128 * 4096, 128, 2));
        // QD 1 on two reactors: one works, on the whole region.
        let (_, p) = plan(&d, "v", 4096, Some(64 << 10), 1, 2).unwrap();
        assert!(p[1].is_none());
        assert_eq!(p[0].map(|p| (p.units, p.qd)), Some((16, 1)));
        for (bs, size, words) in [
            (131_072, None, "largest IO"),
            (4096, Some(2 << 20), "larger"),
            (2048, None, "logical block"),
        ] {
            let d = dev(1 << 20, 4096, 126_976);
            let e = plan(&d, "v", bs, size, 1, 1).unwrap_err();
            assert!(e.0.contains(words), "{}", e.0);
        }
        let e = plan(&dev(4096, 512, 126_976), "v", 4096, None, 2, 2).unwrap_err();
        assert!(e.0.contains("fewer than 2 blocks"), "{}", e.0);
    }
}
