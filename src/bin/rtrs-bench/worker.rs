//! One core's share of the benchmark (fio's job on one CPU): a fixed window of IO slots
//! over one registered buffer, a disjoint region of the device, its own random stream,
//! histogram and counters. It runs as part of a reactor poller and submits through the
//! core's RNBD handle, so nothing is allocated and nothing is shared per IO except
//! relaxed counter updates for the progress line.
//!
//! Phases: an optional prefill (`--verify` with reads or discards: every unit of the
//! region is written once, stamped, so every read has something to check; or
//! `--warmup-write`),
//! the timed run, the
//! drain of what is in flight, an optional read-back (`--verify` with writes: every
//! unit written is read and checked), then a report to the main thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use rtrs_spdk::fabric::{Mr, Sge};
use rtrs_spdk::rnbd::client::{BlockRequest, IoError, WriteZeroesMode};
use rtrs_spdk::Errno;

use crate::hist::Hist;
use crate::stamp;

/// The IO pattern (`--rw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Rw {
    Read,
    Write,
    Randread,
    Randwrite,
    Randrw,
    /// Sequential write-zeroes of `--bs` each (sent as `--write-zeroes` says).
    Zero,
    /// Sequential discards of `--bs` each; with `--verify` every unit is written first
    /// and must read back as its data or as zeros.
    Trim,
    /// Flushes (no data).
    Flush,
}

impl Rw {
    pub fn name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::Randread => "randread",
            Rw::Randwrite => "randwrite",
            Rw::Randrw => "randrw",
            Rw::Zero => "zero",
            Rw::Trim => "trim",
            Rw::Flush => "flush",
        }
    }
    pub fn random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite | Rw::Randrw)
    }
    pub fn reads(self) -> bool {
        matches!(self, Rw::Read | Rw::Randread | Rw::Randrw)
    }
    pub fn writes(self) -> bool {
        matches!(
            self,
            Rw::Write | Rw::Randwrite | Rw::Randrw | Rw::Zero | Rw::Trim
        )
    }
}

/// What every core runs.
#[derive(Clone, Copy, Debug)]
pub struct JobSpec {
    pub rw: Rw,
    /// Percentage of reads for randrw.
    pub mix_read: u8,
    pub bs: u32,
    pub verify: bool,
    /// Write the whole region once before the timed run (`--warmup-write`).
    pub warmup: bool,
    pub time_ns: u64,
    /// Identifies this run's stamps.
    pub run_id: u64,
    /// How write-zeroes go on the wire (`--write-zeroes`).
    pub write_zeroes: WriteZeroesMode,
}

impl JobSpec {
    /// Whether the region is written once before the timed run: `--warmup-write`, or
    /// `--verify` with reads or discards, so that every read has something to check.
    pub fn prefills(&self) -> bool {
        self.warmup || (self.verify && (self.rw.reads() || self.rw == Rw::Trim))
    }
}

/// One core's share: `units` IO units of `bs` bytes from `start`, `qd` in flight.
#[derive(Clone, Copy, Debug)]
pub struct JobPlan {
    pub start: u64,
    pub units: u64,
    pub qd: usize,
}

/// Counters the main thread reads for the progress line: written by their core alone
/// (`bump`, no read-modify-write), on a cache line pair of their own.
#[derive(Default, Debug)]
#[repr(align(128))]
pub struct Live {
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Prefill and read-back requests (not measured), for the stall watchdog.
    pub untimed: AtomicU64,
}

/// Adds to a counter only this core writes: a plain load and store.
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// What a core reports at the end.
#[derive(Debug)]
pub struct CoreReport {
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub errors: u64,
    pub first_errno: i32,
    /// Why the first failed request failed, when the RNBD client said more than the
    /// errno (a device unreachable for `--io-wait-timeout`).
    pub first_error: Option<String>,
    pub mismatches: u64,
    pub first_bad: Option<u64>,
    pub elapsed_ns: u64,
    pub hist: Hist,
}

impl CoreReport {
    /// A report with nothing counted yet.
    pub fn empty() -> CoreReport {
        CoreReport {
            reads: 0,
            writes: 0,
            bytes: 0,
            errors: 0,
            first_errno: 0,
            first_error: None,
            mismatches: 0,
            first_bad: None,
            elapsed_ns: 0,
            hist: Hist::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobPhase {
    Prefill,
    Run,
    Drain,
    Readback,
    Done,
}

#[derive(Clone, Copy, Debug, Default)]
struct Issued {
    busy: bool,
    write: bool,
    /// Counts in the measurement (not prefill or read-back).
    timed: bool,
    unit: u64,
    gen: u32,
    start: u64,
}

/// How a worker sends one block request (the core's RNBD handle).
pub type SubmitFn<'a> = dyn FnMut(u64, u64, &BlockRequest, &[Sge]) -> Result<(), IoError> + 'a;

pub struct Worker {
    spec: JobSpec,
    plan: JobPlan,
    buf: Arc<Mr>,
    slots: Vec<Issued>,
    free: Vec<usize>,
    /// Generation last written per unit (0: unknown); only with `--verify`.
    gens: Vec<u32>,
    /// Units discarded since their last write (`--rw trim --verify`): they read back as
    /// that write's data or as zeros.
    discarded: Vec<bool>,
    rng: u64,
    next_seq: u64,
    phase: JobPhase,
    inflight: usize,
    /// The timed run has begun (at `start`).
    running: bool,
    start: u64,
    deadline: u64,
    last_done: u64,
    live: Arc<Live>,
    /// Set on SIGINT/SIGTERM: end the timed run now.
    stop: Arc<AtomicBool>,
    tx: mpsc::Sender<CoreReport>,
    r: CoreReport,
}

impl Worker {
    /// A worker over `buf` (registered, at least `plan.qd × spec.bs` bytes).
    pub fn new(
        spec: JobSpec,
        plan: JobPlan,
        buf: Arc<Mr>,
        seed: u64,
        live: Arc<Live>,
        stop: Arc<AtomicBool>,
        tx: mpsc::Sender<CoreReport>,
    ) -> Worker {
        let phase = if spec.prefills() {
            JobPhase::Prefill
        } else {
            JobPhase::Run
        };
        let gens = if spec.verify {
            vec![0; plan.units as usize]
        } else {
            Vec::new()
        };
        let discarded = if spec.verify && spec.rw == Rw::Trim {
            vec![false; plan.units as usize]
        } else {
            Vec::new()
        };
        Worker {
            spec,
            plan,
            buf,
            slots: vec![Issued::default(); plan.qd],
            free: (0..plan.qd).rev().collect(),
            gens,
            discarded,
            rng: seed | 1,
            next_seq: 0,
            phase,
            inflight: 0,
            running: false,
            start: 0,
            deadline: 0,
            last_done: 0,
            live,
            stop,
            tx,
            r: CoreReport::empty(),
        }
    }

    /// The IO buffer (announced to the RTRS client for zero-copy reads).
    pub fn buffer(&self) -> Arc<Mr> {
        Arc::clone(&self.buf)
    }

    fn rand(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn in_flight(&self, unit: u64) -> bool {
        self.slots.iter().any(|s| s.busy && s.unit == unit)
    }

    /// The next unit and direction of the timed run, or `None` to wait for completions.
    fn pick(&mut self) -> Option<(u64, bool)> {
        let write = match self.spec.rw {
            Rw::Read | Rw::Randread => false,
            Rw::Write | Rw::Randwrite | Rw::Zero | Rw::Trim | Rw::Flush => true,
            Rw::Randrw => self.rand() % 100 >= u64::from(self.spec.mix_read),
        };
        for _ in 0..16 {
            let unit = if self.spec.rw.random() {
                self.rand() % self.plan.units
            } else {
                let u = self.next_seq;
                self.next_seq = (u + 1) % self.plan.units;
                u
            };
            // Verified data must not be read or written by two requests at once.
            if !self.spec.verify || !self.in_flight(unit) {
                return Some((unit, write));
            }
            if !self.spec.rw.random() {
                self.next_seq = unit;
                return None;
            }
        }
        None
    }

    /// Sends what the phase allows; returns whether anything was sent.
    pub fn pump(&mut self, now: u64, submit: &mut SubmitFn<'_>) -> bool {
        let mut sent = false;
        loop {
            match self.phase {
                JobPhase::Prefill | JobPhase::Readback => {
                    if self.next_seq < self.plan.units && self.stop.load(Ordering::Relaxed) {
                        self.next_seq = self.plan.units;
                    }
                    if self.next_seq >= self.plan.units {
                        if self.inflight > 0 {
                            return sent;
                        }
                        self.next_seq = 0;
                        if self.phase == JobPhase::Prefill {
                            self.phase = JobPhase::Run;
                            continue;
                        }
                        self.finish();
                        return sent;
                    }
                    if self.free.is_empty() {
                        return sent;
                    }
                    let unit = self.next_seq;
                    self.next_seq += 1;
                    let write = self.phase == JobPhase::Prefill;
                    if !write && self.gens[unit as usize] == 0 {
                        continue;
                    }
                    if !self.send(submit, unit, write, false, now) {
                        return sent;
                    }
                    sent = true;
                }
                JobPhase::Run => {
                    if !self.running {
                        tracing::info!(
                            "the timed run begins on this core, qd {}",
                            self.slots.len()
                        );
                        self.running = true;
                        self.start = now;
                        self.deadline = now + self.spec.time_ns;
                        self.last_done = now;
                    }
                    if now >= self.deadline || self.stop.load(Ordering::Relaxed) {
                        self.phase = JobPhase::Drain;
                        continue;
                    }
                    if self.free.is_empty() {
                        return sent;
                    }
                    let Some((unit, write)) = self.pick() else {
                        return sent;
                    };
                    if !self.send(submit, unit, write, true, now) {
                        return sent;
                    }
                    sent = true;
                }
                JobPhase::Drain => {
                    if self.inflight > 0 {
                        return sent;
                    }
                    self.r.elapsed_ns = self.last_done.saturating_sub(self.start).max(1);
                    if self.spec.verify && self.spec.rw.writes() && self.r.errors == 0 {
                        self.phase = JobPhase::Readback;
                        self.next_seq = 0;
                        continue;
                    }
                    self.finish();
                    return sent;
                }
                JobPhase::Done => return sent,
            }
        }
    }

    fn finish(&mut self) {
        self.phase = JobPhase::Done;
        let r = std::mem::replace(&mut self.r, CoreReport::empty());
        let _ = self.tx.send(r);
    }

    /// Submits one request in a free slot; false when the session has no permit now
    /// or refused it (then the run ends: counted as an error).
    fn send(
        &mut self,
        submit: &mut SubmitFn<'_>,
        unit: u64,
        write: bool,
        timed: bool,
        now: u64,
    ) -> bool {
        let Some(i) = self.free.pop() else {
            return false;
        };
        let bs = self.spec.bs as usize;
        let off = self.plan.start + unit * u64::from(self.spec.bs);
        // The timed run of --rw zero zeroes (trim discards, flush flushes); prefill and
        // read-back write and read.
        let special = if write && timed {
            self.spec.rw
        } else {
            Rw::Write
        };
        let mut gen = 0;
        if special == Rw::Zero {
            gen = stamp::ZEROED;
        } else if self.spec.verify && write && !matches!(special, Rw::Trim | Rw::Flush) {
            gen = stamp::next_gen(self.gens[unit as usize]);
            stamp::stamp(&self.buf, i * bs, off, bs, self.spec.run_id, gen);
        }
        let req = match special {
            Rw::Zero => BlockRequest::write_zeroes(off, self.spec.bs),
            Rw::Trim => BlockRequest::discard(off, self.spec.bs),
            Rw::Flush => BlockRequest::flush(),
            _ if write => BlockRequest::write(off, self.spec.bs),
            _ => BlockRequest::read(off, self.spec.bs),
        };
        let sge = [self.buf.sge(i * bs, bs)];
        let sgl: &[Sge] = if req.data_len() > 0 { &sge } else { &[] };
        match submit(now, i as u64, &req, sgl) {
            Ok(()) => {
                self.slots[i] = Issued {
                    busy: true,
                    write,
                    timed,
                    unit,
                    gen,
                    start: now,
                };
                self.inflight += 1;
                true
            }
            Err(e) if e.is_busy() => {
                self.free.push(i);
                false
            }
            Err(e) => {
                self.free.push(i);
                tracing::error!(offset = off, "submit refused: {e}");
                self.error(e.errno());
                if self.phase == JobPhase::Run {
                    self.phase = JobPhase::Drain;
                } else if self.phase != JobPhase::Drain {
                    self.next_seq = self.plan.units;
                }
                false
            }
        }
    }

    /// The client's account of a request that waited for its device in vain, kept for
    /// the report if the first error was such a request's (−ENOTCONN).
    pub fn explain(&mut self, why: Option<&IoError>) {
        if self.r.first_errno != Errno::ENOTCONN.neg() || self.r.first_error.is_some() {
            return;
        }
        if let Some(e @ IoError::Unreachable { .. }) = why {
            self.r.first_error = Some(e.to_string());
        }
    }

    fn error(&mut self, errno: Errno) {
        self.r.errors += 1;
        if self.r.first_errno == 0 {
            self.r.first_errno = errno.neg();
        }
        bump(&self.live.errors, 1);
    }

    /// A request of this worker ended.
    pub fn complete(&mut self, now: u64, tag: u64, result: Result<(), Errno>) {
        let i = tag as usize;
        let Some(s) = self.slots.get(i).copied().filter(|s| s.busy) else {
            tracing::error!(tag, "completion for a slot not in flight");
            self.error(Errno::EIO);
            return;
        };
        self.slots[i].busy = false;
        self.free.push(i);
        self.inflight -= 1;
        let bs = self.spec.bs as usize;
        // A timed write of --rw trim or flush carried no data (gen 0).
        let dataless = s.write && s.timed && matches!(self.spec.rw, Rw::Trim | Rw::Flush);
        if let Err(errno) = result {
            self.error(errno);
            if self.spec.verify && s.write && self.spec.rw != Rw::Flush {
                self.gens[s.unit as usize] = 0;
            }
        } else if self.spec.verify {
            let u = s.unit as usize;
            if dataless {
                if let Some(d) = self.discarded.get_mut(u) {
                    *d = true;
                }
            } else if s.write {
                self.gens[u] = s.gen;
                if let Some(d) = self.discarded.get_mut(u) {
                    *d = false;
                }
            } else {
                let gen = self.gens[u];
                let off = self.plan.start + s.unit * u64::from(self.spec.bs);
                let run = self.spec.run_id;
                let bad = match (gen, self.discarded.get(u).copied().unwrap_or(false)) {
                    (0, _) => None,
                    (_, true) => stamp::check_discarded(&self.buf, i * bs, off, bs, run, gen),
                    (_, false) => stamp::check(&self.buf, i * bs, off, bs, run, gen),
                };
                if let Some(bad) = bad {
                    self.r.mismatches += 1;
                    self.r.first_bad.get_or_insert(bad);
                }
            }
        }
        if s.timed {
            self.last_done = now;
            self.r.hist.record(now.saturating_sub(s.start));
            if s.write {
                self.r.writes += 1;
            } else {
                self.r.reads += 1;
            }
            self.r.bytes += bs as u64;
            bump(&self.live.ios, 1);
            bump(&self.live.bytes, bs as u64);
        } else {
            bump(&self.live.untimed, 1);
        }
    }
}
