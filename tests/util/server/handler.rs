//! The test handler: a RAM disk addressed by an 8-byte little-endian offset in the user
//! header, with an optional hold (requests are kept unanswered until released) and a
//! log of link events and requests.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rtrs_spdk::engine::Ctx;
use rtrs_spdk::server::{Dir, IoId, LinkEvent, Responses, ServerHandler, SessionId, SrvIo};
use rtrs_spdk::Errno;

pub const RAM_SIZE: usize = 1 << 20;

/// State shared by every core's handler and the test.
pub struct Shared {
    pub ram: Mutex<Vec<u8>>,
    pub events: Mutex<Vec<(SessionId, String, LinkEvent)>>,
    /// Requests seen (any core).
    pub requests: AtomicUsize,
    /// While set, requests are held unanswered.
    pub hold: Hold,
}

#[derive(Default)]
pub struct Hold {
    pub on: AtomicBool,
    /// Requests currently held.
    pub held: AtomicUsize,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            ram: Mutex::new(vec![0; RAM_SIZE]),
            events: Mutex::new(Vec::new()),
            requests: AtomicUsize::new(0),
            hold: Hold::default(),
        }
    }
}

pub struct RamHandler {
    core: usize,
    sh: Arc<Shared>,
    /// Held requests of this core, answered from `poll` once the hold is off.
    held: Vec<(IoId, Result<(), Errno>)>,
}

impl RamHandler {
    pub fn new(core: usize, sh: Arc<Shared>) -> RamHandler {
        RamHandler {
            core,
            sh,
            held: Vec::new(),
        }
    }
}

fn offset(usr: &[u8]) -> Option<usize> {
    let b: [u8; 8] = usr.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b) as usize)
}

impl ServerHandler for RamHandler {
    fn link_event(&mut self, _cx: &mut dyn Ctx, sess: SessionId, name: &str, ev: LinkEvent) {
        self.sh
            .events
            .lock()
            .unwrap()
            .push((sess, name.to_string(), ev));
    }

    fn request(&mut self, cx: &mut dyn Ctx, io: SrvIo<'_>, out: &mut Responses) {
        assert_eq!(cx.core(), self.core);
        self.sh.requests.fetch_add(1, Ordering::SeqCst);
        let result = match offset(io.usr) {
            Some(off) if off + io.data.len() <= RAM_SIZE => {
                let mut ram = self.sh.ram.lock().unwrap();
                match io.dir {
                    // SAFETY: the request owns its chunk until it is answered below.
                    Dir::Write => unsafe {
                        ram[off..off + io.data.len()].copy_from_slice(io.data.as_slice())
                    },
                    // SAFETY: as above.
                    Dir::Read => unsafe {
                        io.data
                            .as_mut_slice()
                            .copy_from_slice(&ram[off..off + io.data.len()])
                    },
                }
                Ok(())
            }
            _ => Err(Errno::EINVAL),
        };
        if !self.sh.hold.on.load(Ordering::SeqCst) {
            out.respond(io.id, result);
            return;
        }
        self.sh.hold.held.fetch_add(1, Ordering::SeqCst);
        self.held.push((io.id, result));
    }

    fn poll(&mut self, cx: &mut dyn Ctx, out: &mut Responses) -> bool {
        assert_eq!(cx.core(), self.core);
        if self.held.is_empty() || self.sh.hold.on.load(Ordering::SeqCst) {
            return false;
        }
        for (id, result) in self.held.drain(..) {
            self.sh.hold.held.fetch_sub(1, Ordering::SeqCst);
            out.respond(id, result);
        }
        true
    }
}
