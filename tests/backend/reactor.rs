//! A backend driven the way the RNBD server will drive it: from a poller on a reactor,
//! submitting more IO than the queue holds, keeping refused (busy) IOs and retrying them
//! on later polls, and handling completions as they are polled.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rtrs_spdk::engine::{Ctx, PollResult, Simulation};
use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::rnbd::backend::{
    BlockBackend, BlockCompletion, BlockIo, FileBackend, FileOptions, IoBuf, IoMode, RamBackend,
};

const IOS: usize = 300;
const LEN: usize = 4096;

/// What the poller has seen.
#[derive(Default)]
struct Tally {
    busy_refusals: usize,
    completed: Vec<u32>,
    failed: usize,
}

/// Writes IOS blocks (each tagged by its index) through `backend` from a reactor poller,
/// then checks every block was completed exactly once, and reads them back.
fn drive(backend: Box<dyn BlockBackend>) {
    let mem = MemBuf::zeroed(IOS * LEN);
    for i in 0..IOS {
        // SAFETY: no IO is in flight yet.
        unsafe { std::ptr::write_bytes(mem.as_ptr().add(i * LEN), i as u8, LEN) };
    }
    let mut todo: VecDeque<BlockIo> = (0..IOS)
        .map(|i| {
            // SAFETY: `mem` outlives the simulation (dropped first, below) and every IO
            // has its own block, untouched by the test while in flight.
            let buf = unsafe { IoBuf::new(mem.as_ptr().add(i * LEN), LEN) };
            BlockIo::write(i as u64, (i * LEN) as u64, buf)
        })
        .collect();
    let depth = backend.queue_depth();
    let backend = Rc::new(RefCell::new(backend));
    let tally = Rc::new(RefCell::new(Tally::default()));
    let mut sim = Simulation::new(1, 16);
    let (b, seen) = (Rc::clone(&backend), Rc::clone(&tally));
    sim.reactor(0).register(Box::new(move |_: &mut dyn Ctx| {
        let mut backend = b.borrow_mut();
        let mut work = PollResult::Idle;
        let mut out = [BlockCompletion::default(); 32];
        let n = backend.poll(&mut out);
        for c in &out[..n] {
            let mut t = seen.borrow_mut();
            if c.result.is_err() {
                t.failed += 1;
            }
            t.completed.push(c.tag as u32);
            work = PollResult::Busy;
        }
        while let Some(io) = todo.front().copied() {
            match backend.submit(io) {
                Ok(()) => {
                    todo.pop_front();
                    work = PollResult::Busy;
                }
                Err(e) if e.is_busy() => {
                    seen.borrow_mut().busy_refusals += 1;
                    break;
                }
                Err(e) => panic!("tag {}: {e}", io.tag),
            }
        }
        assert!(backend.in_flight() <= depth);
        work
    }));
    let start = Instant::now();
    while tally.borrow().completed.len() < IOS {
        if !sim.step().is_busy() {
            std::thread::sleep(Duration::from_micros(100));
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "IO did not finish"
        );
    }
    drop(sim);
    let t = tally.borrow();
    assert_eq!(t.failed, 0);
    let mut tags = t.completed.clone();
    tags.sort_unstable();
    assert_eq!(
        tags,
        (0..IOS as u32).collect::<Vec<_>>(),
        "each IO completes once"
    );
    assert!(
        t.busy_refusals > 0,
        "{IOS} IOs never filled a queue of {depth}"
    );
    let mut backend = backend.borrow_mut();
    assert_eq!(backend.in_flight(), 0);
    let back = MemBuf::zeroed(IOS * LEN);
    // SAFETY: `back` outlives the read, which completes before it is looked at.
    let buf = unsafe { IoBuf::new(back.as_ptr(), 100 * LEN) };
    for part in 0..IOS / 100 {
        let off = part * 100 * LEN;
        let io = BlockIo::read(part as u64, off as u64, buf);
        backend.submit(io).unwrap();
        let mut out = [BlockCompletion::default(); 1];
        let start = Instant::now();
        while backend.poll(&mut out) == 0 {
            assert!(start.elapsed() < Duration::from_secs(60), "read-back stuck");
            std::thread::sleep(Duration::from_micros(100));
        }
        assert_eq!(out[0], BlockCompletion::new(part as u64, Ok(())));
        // SAFETY: the read has completed; nothing else writes `back`.
        let got = unsafe { std::slice::from_raw_parts(back.as_ptr(), 100 * LEN) };
        for i in 0..100 {
            let block = part * 100 + i;
            let ok = got[i * LEN..(i + 1) * LEN]
                .iter()
                .all(|&x| x == block as u8);
            assert!(ok, "block {block} differs");
        }
    }
}

#[test]
fn ram_from_a_reactor_poller() {
    let ram = RamBackend::new((IOS * LEN) as u64, 512)
        .unwrap()
        .with_queue_depth(16)
        .unwrap();
    drive(Box::new(ram));
}

#[test]
fn file_from_a_reactor_poller() {
    let path = std::env::temp_dir().join(format!("rtrs-backend-reactor-{}", std::process::id()));
    std::fs::File::create(&path)
        .and_then(|f| f.set_len((IOS * LEN) as u64))
        .expect("create temp file");
    for mode in [IoMode::Auto, IoMode::ThreadPool] {
        let opts = FileOptions {
            mode,
            queue_depth: 16,
            ..FileOptions::default()
        };
        drive(Box::new(FileBackend::open(&path, &opts).unwrap()));
    }
    let _ = std::fs::remove_file(&path);
}
