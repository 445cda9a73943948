use super::*;
use crate::fabric::next_rkey;

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
const QP: u32 = 7;

fn reg(t: &Arc<MrTable>, len: usize, access: Access) -> Mr {
    t.register_buf(MemBuf::zeroed(len), access).unwrap()
}

fn remote(t: &MrTable, rkey: u32, addr: u64, len: u32) -> Result<MemRef, WcStatus> {
    t.remote(
        &mut Leases::default(),
        QP,
        rkey,
        addr,
        len,
        Access::REMOTE_WRITE,
    )
}

#[test]
fn remote_checks_key_access_and_bounds() {
    let t = MrTable::new();
    let mr = reg(&t, 4096, RW);
    let ro = reg(&t, 4096, Access::LOCAL_WRITE);
    assert!(remote(&t, mr.rkey(), mr.addr(), 4096).is_ok());
    assert!(remote(&t, mr.rkey(), mr.addr() + 4000, 96).is_ok());
    let err = Err(WcStatus::RemoteAccess);
    assert_eq!(remote(&t, mr.rkey(), mr.addr() + 4000, 97).map(|_| ()), err);
    assert_eq!(remote(&t, mr.rkey(), mr.addr() - 1, 1).map(|_| ()), err);
    assert_eq!(remote(&t, mr.rkey() ^ 1, mr.addr(), 1).map(|_| ()), err);
    assert_eq!(remote(&t, ro.rkey(), ro.addr(), 1).map(|_| ()), err);
    assert_eq!(remote(&t, 0, 0, 0).map(|_| ()), err);
    assert_eq!(remote(&t, u32::MAX, u64::MAX, u32::MAX).map(|_| ()), err);
}

#[test]
fn remote_write_makes_the_checks_of_remote_and_writes_only_when_they_pass() {
    let t = MrTable::new();
    let mut leases = Leases::default();
    let mr = reg(&t, 4096, RW);
    let ro = reg(&t, 4096, Access::LOCAL_WRITE);
    let mut w = |rkey, addr, data: &[u8]| t.remote_write(&mut leases, QP, rkey, addr, data);
    w(mr.rkey(), mr.addr() + 4000, &[7u8; 96]).unwrap();
    let err = Err(WcStatus::RemoteAccess);
    assert_eq!(w(mr.rkey(), mr.addr() + 4000, &[9u8; 97]), err);
    assert_eq!(w(mr.rkey(), mr.addr() - 1, &[9u8; 1]), err);
    assert_eq!(w(mr.rkey() ^ 1, mr.addr(), &[9u8; 1]), err);
    assert_eq!(w(ro.rkey(), ro.addr(), &[9u8; 1]), err);
    assert_eq!(w(0, 0, &[]), err);
    let mut back = [0u8; 97];
    mr.read_at(3999, &mut back);
    assert_eq!(back[0], 0);
    assert!(
        back[1..].iter().all(|&b| b == 7),
        "a refused write wrote nothing"
    );
}

#[test]
fn keys_are_random_and_indices_unordered() {
    let t = MrTable::new();
    let mrs: Vec<Mr> = (0..64).map(|_| reg(&t, 64, RW)).collect();
    let idx: Vec<u32> = mrs.iter().map(|m| m.rkey() >> 8).collect();
    let bytes: std::collections::HashSet<u8> = mrs.iter().map(|m| m.rkey() as u8).collect();
    assert!(
        idx.windows(2).any(|w| w[1] != w[0] + 1),
        "indices in order: {idx:?}"
    );
    assert!(bytes.len() > 16, "key bytes barely vary: {bytes:?}");
    let slot = t.alloc_fast_mr(KeyScope::Domain).unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut k = slot.rkey();
    for _ in 0..64 {
        let n = next_rkey(k);
        assert_eq!(n >> 8, k >> 8, "the index stays");
        assert_ne!(n, k, "the key byte changes");
        seen.insert(n as u8);
        k = n;
    }
    assert!(seen.len() > 16, "next_rkey barely varies: {seen:?}");
}

#[test]
fn dropped_registration_never_matches_again() {
    let t = MrTable::new();
    let mr = reg(&t, 64, RW);
    let (key, addr) = (mr.rkey(), mr.addr());
    drop(mr);
    let again: Vec<Mr> = (0..4).map(|_| reg(&t, 64, RW)).collect();
    assert!(again.iter().all(|m| m.rkey() != key));
    assert!(remote(&t, key, addr, 1).is_err());
}

#[test]
fn a_lease_keeps_memory_alive_after_its_registration_goes() {
    let t = MrTable::new();
    let mut leases = Leases::default();
    let mr = reg(&t, 4096, RW);
    let sge = mr.sge(0, 64);
    let held = t.local(&mut leases, &sge, Access::NONE).unwrap();
    let backing = Arc::downgrade(mr.backing());
    drop(mr);
    // The key is dead at once ...
    assert_eq!(
        t.local(&mut leases, &sge, Access::NONE).map(|_| ()),
        Err(WcStatus::LocalProtection)
    );
    // ... the memory lives while a MemRef (through the lease) holds it.
    assert!(backing.upgrade().is_some());
    held.write_at(0, &[1, 2, 3]);
    drop(held);
    leases.clear();
    assert!(backing.upgrade().is_none(), "released with the last lease");
}

/// A handle given back while its lease is held is handed out again, no new clone made;
/// one given back after its lease went is dropped, and the memory goes with the last.
#[test]
fn a_handle_given_back_is_reused_while_its_lease_lasts() {
    let t = MrTable::new();
    let mut leases = Leases::default();
    let mr = reg(&t, 4096, RW);
    let x = t.local(&mut leases, &mr.sge(0, 8), Access::NONE).unwrap();
    let y = t.local(&mut leases, &mr.sge(8, 8), Access::NONE).unwrap();
    assert_eq!(leases.cloned, 2);
    leases.recycle(x);
    leases.recycle(y);
    for k in 0..10 {
        let z = t.local(&mut leases, &mr.sge(16, 8), Access::NONE).unwrap();
        z.write_at(0, &[k]);
        leases.recycle(z);
    }
    assert_eq!(leases.cloned, 2, "spare handles reused");
    // A handle of another queue pair's is not taken in.
    let mut other = Leases::default();
    let foreign = t.local(&mut other, &mr.sge(0, 8), Access::NONE).unwrap();
    leases.recycle(foreign);
    let _ = t.local(&mut leases, &mr.sge(0, 8), Access::NONE).unwrap();
    let _ = t.local(&mut leases, &mr.sge(0, 8), Access::NONE).unwrap();
    let _ = t.local(&mut leases, &mr.sge(0, 8), Access::NONE).unwrap();
    assert_eq!(leases.cloned, 3, "two spares, then a clone");
    // After the lease goes, a handle given back is dropped: the memory follows.
    let held = t.local(&mut leases, &mr.sge(0, 8), Access::NONE).unwrap();
    let backing = Arc::downgrade(mr.backing());
    drop(mr);
    other.clear();
    leases.clear();
    assert!(backing.upgrade().is_some(), "held by the handle");
    leases.recycle(held);
    assert!(backing.upgrade().is_none(), "let go with the last handle");
}

#[test]
fn memrefs_of_one_region_share_one_handle_per_queue_pair() {
    let t = MrTable::new();
    let (mut a, mut b) = (Leases::default(), Leases::default());
    let mr = reg(&t, 4096, RW);
    let x = t.local(&mut a, &mr.sge(0, 8), Access::NONE).unwrap();
    let y = t.local(&mut a, &mr.sge(8, 8), Access::NONE).unwrap();
    let z = t.local(&mut b, &mr.sge(0, 8), Access::NONE).unwrap();
    assert!(x.shares_backing(&y), "one handle per queue pair");
    assert!(!x.shares_backing(&z), "each queue pair its own");
    // The shared registration's count moved once per queue pair, not per MemRef.
    assert_eq!(Arc::strong_count(mr.backing()), 4, "Mr, table, two leases");
}

#[test]
fn local_checks_lkey_and_rights() {
    let t = MrTable::new();
    let mut l = Leases::default();
    let mr = reg(&t, 64, Access::NONE);
    assert!(t.local(&mut l, &mr.sge(0, 64), Access::NONE).is_ok());
    let bad = Err(WcStatus::LocalProtection);
    assert_eq!(
        t.local(&mut l, &mr.sge(0, 64), Access::LOCAL_WRITE)
            .map(|_| ()),
        bad
    );
    let mut sge = mr.sge(0, 64);
    sge.len = 65;
    assert_eq!(t.local(&mut l, &sge, Access::NONE).map(|_| ()), bad);
    assert!(t.local_backing(&mr.sge(0, 64), Access::NONE).is_some());
    assert!(t.local_backing(&sge, Access::NONE).is_none());
    // A fast-registration slot is never a local key.
    let rw = reg(&t, 64, RW);
    let slot = t.alloc_fast_mr(KeyScope::Domain).unwrap();
    let k = next_rkey(slot.rkey());
    t.bind(&slot, &rw, rw.addr(), 64, RW, k, QP).unwrap();
    let via_slot = Sge {
        addr: rw.addr(),
        len: 1,
        lkey: k,
    };
    assert_eq!(t.local(&mut l, &via_slot, Access::NONE).map(|_| ()), bad);
}

#[test]
fn slot_binding_and_invalidation() {
    let t = MrTable::new();
    let mr = reg(&t, 8192, RW);
    let slot = t.alloc_fast_mr(KeyScope::Domain).unwrap();
    let first = slot.rkey();
    assert!(remote(&t, first, mr.addr(), 1).is_err(), "unbound");
    let k1 = next_rkey(first);
    t.bind(&slot, &mr, mr.addr() + 4096, 4096, RW, k1, QP)
        .unwrap();
    assert_eq!(slot.rkey(), k1);
    assert!(remote(&t, k1, mr.addr() + 4096, 4096).is_ok());
    assert!(remote(&t, k1, mr.addr(), 1).is_err(), "outside binding");
    let k2 = next_rkey(k1);
    assert!(
        t.bind(&slot, &mr, mr.addr(), 4096, RW, k2, QP).is_err(),
        "still bound"
    );
    t.invalidate_slot(&slot, QP).unwrap();
    assert!(remote(&t, k1, mr.addr() + 4096, 1).is_err(), "retired");
    t.bind(&slot, &mr, mr.addr(), 4096, RW, k2, QP).unwrap();
    assert!(remote(&t, k1, mr.addr(), 1).is_err(), "superseded key");
    t.invalidate_slot(&slot, QP).unwrap();
    assert!(t.invalidate_slot(&slot, QP).is_err(), "twice");
    assert!(
        t.invalidate_remote(mr.rkey(), QP).is_err(),
        "regions are not invalidated remotely"
    );
    // Bindings stay inside the region, use the slot's own index, change the key.
    let k3 = next_rkey(k2);
    assert!(t.bind(&slot, &mr, mr.addr() + 1, 8192, RW, k3, QP).is_err());
    assert!(t.bind(&slot, &mr, mr.addr(), 1, RW, mr.rkey(), QP).is_err());
    assert!(t.bind(&slot, &mr, mr.addr(), 1, RW, k2, QP).is_err());
    // A binding over a region that goes stops matching with it.
    t.bind(&slot, &mr, mr.addr(), 64, RW, k3, QP).unwrap();
    let addr = mr.addr();
    drop(mr);
    assert!(remote(&t, k3, addr, 1).is_err(), "its region is gone");
}

#[test]
fn scopes_decide_who_may_use_and_retire_a_key() {
    let t = MrTable::new();
    let mr = reg(&t, 4096, RW);
    let conn = t.alloc_fast_mr(KeyScope::Connection).unwrap();
    let dom = t.alloc_fast_mr(KeyScope::Domain).unwrap();
    let (kc, kd) = (next_rkey(conn.rkey()), next_rkey(dom.rkey()));
    t.bind(&conn, &mr, mr.addr(), 4096, RW, kc, 5).unwrap();
    t.bind(&dom, &mr, mr.addr(), 4096, RW, kd, 5).unwrap();
    let mut l = Leases::default();
    let on = |qp, k| t.remote(&mut Leases::default(), qp, k, mr.addr(), 8, RW);
    assert!(on(5, kc).is_ok(), "a connection key on its connection");
    assert!(on(6, kc).is_err(), "and not on another");
    assert!(
        on(5, kd).is_ok() && on(6, kd).is_ok(),
        "a domain key anywhere"
    );
    assert!(
        t.invalidate_remote(kd, 5).is_err(),
        "no peer retires a domain key"
    );
    assert!(
        t.invalidate_remote(kc, 6).is_err(),
        "nor another connection's"
    );
    t.invalidate_remote(kc, 5).unwrap();
    assert!(t.remote(&mut l, 5, kc, mr.addr(), 8, RW).is_err());
    assert!(on(6, kd).is_ok(), "the domain key lives on");
}

#[test]
fn foreign_registrations_are_refused() {
    let (a, b) = (MrTable::new(), MrTable::new());
    let mr = reg(&b, 64, RW);
    let slot = a.alloc_fast_mr(KeyScope::Domain).unwrap();
    let k = next_rkey(slot.rkey());
    assert_eq!(
        a.bind(&slot, &mr, mr.addr(), 64, RW, k, QP),
        Err(WcStatus::LocalQpOperation)
    );
    assert!(b.invalidate_slot(&slot, QP).is_err());
    // Registrations assembled outside the table, naming its keys, are not its own either.
    let own = reg(&a, 64, RW);
    let forged = Mr::from_parts(
        own.lkey(),
        own.rkey(),
        RW,
        Box::new(()),
        own.backing().clone(),
    );
    let forged_slot = FastMr::from_parts(slot.rkey(), Box::new(()));
    let k = next_rkey(slot.rkey());
    assert_eq!(
        a.bind(&slot, &forged, own.addr(), 64, RW, k, QP),
        Err(WcStatus::LocalQpOperation)
    );
    assert_eq!(
        a.bind(&forged_slot, &own, own.addr(), 64, RW, k, QP),
        Err(WcStatus::LocalQpOperation)
    );
    assert!(a.invalidate_slot(&forged_slot, QP).is_err());
    assert_eq!(a.bind(&slot, &own, own.addr(), 64, RW, k, QP), Ok(()));
    assert!(a.invalidate_slot(&slot, QP).is_ok());
}

#[test]
fn memref_gather_concatenates() {
    let t = MrTable::new();
    let mut l = Leases::default();
    let src = reg(&t, 64, RW);
    let dst = reg(&t, 64, RW);
    src.write_at(0, b"hello world");
    let a = t.local(&mut l, &src.sge(0, 5), Access::NONE).unwrap();
    let b = t.local(&mut l, &src.sge(5, 6), Access::NONE).unwrap();
    let d = t
        .remote(&mut l, QP, dst.rkey(), dst.addr() + 10, 11, RW)
        .unwrap();
    d.gather_prefix(d.len(), &[a, b]);
    let mut out = [0u8; 11];
    dst.read_at(10, &mut out);
    assert_eq!(&out, b"hello world");
}

/// A reader on another thread, while the owner rebinds a slot between two ranges
/// and invalidates it, sees either range whole or no access: never a torn entry.
#[test]
fn concurrent_rebinding_is_seen_whole_or_not_at_all() {
    let t = MrTable::new();
    let mr = reg(&t, 1 << 16, RW);
    let slot = t.alloc_fast_mr(KeyScope::Domain).unwrap();
    let (lo, hi) = (mr.addr(), mr.addr() + (1 << 15));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let key = Arc::new(AtomicU32::new(0));
    // The reader's rounds so far: the owner goes on until both ran together a while,
    // however the threads are scheduled.
    let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = {
        let (t, stop, key, rounds) = (t.clone(), stop.clone(), key.clone(), rounds.clone());
        std::thread::spawn(move || {
            let mut l = Leases::default();
            let (mut ok, mut refused) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                rounds.fetch_add(1, Ordering::Relaxed);
                let k = key.load(Ordering::Relaxed);
                for (base, other) in [(lo, hi), (hi, lo)] {
                    // A whole half is reachable only through the key bound to it.
                    match t.remote(&mut l, QP, k, base, 1 << 15, RW) {
                        Ok(_) => {
                            ok += 1;
                            assert!(
                                t.remote(&mut l, QP, k, other + 100, 1, RW).is_err()
                                    || t.remote(&mut l, QP, k, base, 1 << 15, RW).is_err(),
                                "one key reached both halves"
                            );
                        }
                        Err(_) => refused += 1,
                    }
                }
            }
            (ok, refused)
        })
    };
    let mut i = 0u32;
    while i < 20_000 || rounds.load(Ordering::Relaxed) < 1_000 {
        i = i.wrapping_add(1);
        let base = if i % 2 == 0 { lo } else { hi };
        let k = next_rkey(slot.rkey());
        t.bind(&slot, &mr, base, 1 << 15, RW, k, QP).unwrap();
        key.store(k, Ordering::Relaxed);
        t.invalidate_slot(&slot, QP).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, refused) = reader.join().unwrap();
    assert!(ok + refused > 0, "the reader ran");
}

/// A slot's first writer writes it without a locked instruction; another queue pair
/// writing it takes it away, whatever the owner is doing at that moment. In each round
/// a fresh slot's owner rewrites it until it finds it taken, while the other queue pair
/// writes it once: the entry ends as the other's write left it, whole and readable,
/// never with a field of the owner's write that was in flight, and owned by the other;
/// taken once more, it has no owner.
#[test]
fn a_slot_taken_from_its_owner_is_never_torn() {
    const ROUNDS: u32 = 2_000;
    const OWNER: u32 = 5;
    const OTHER: u32 = 6;
    let t = MrTable::new();
    let mut owner_writes = 0u64;
    for round in 0..ROUNDS {
        let slot = t.alloc_fast_mr(KeyScope::Domain).unwrap();
        let e = t.entry(slot.rkey() >> 8).unwrap();
        let cur = e.read().unwrap();
        let mine = View {
            valid: true,
            key: 1,
            region: 1,
            gen: 1,
            base: 0x1000,
            len: 0x1000,
            ..cur
        };
        let theirs = View {
            valid: true,
            key: 2,
            region: 2,
            gen: 2,
            base: 0x9000,
            len: 0x3000,
            ..cur
        };
        assert!(e.write(&mine, By::Qp(OWNER)));
        assert_eq!(
            e.writer.load(Ordering::Relaxed),
            OWNER,
            "claimed by its first writer"
        );
        owner_writes += std::thread::scope(|s| {
            let owner = s.spawn(|| {
                let mut n = 0u64;
                while e.write_biased(&mine, OWNER) {
                    n += 1;
                }
                n
            });
            s.spawn(|| {
                for _ in 0..(round % 32) * 16 {
                    std::hint::spin_loop();
                }
                assert!(e.write(&theirs, By::Qp(OTHER)), "the other's write");
            });
            owner.join().unwrap()
        });
        let v = e
            .read()
            .expect("the entry is readable (no writer left it odd)");
        assert_eq!(
            (v.key, v.region, v.gen, v.base, v.len),
            (2, 2, 2, 0x9000, 0x3000),
            "the other's write, whole"
        );
        assert_eq!(
            e.writer.load(Ordering::Relaxed),
            OTHER,
            "the other owns it now"
        );
        // Taken once more (MAX_MOVES): no owner any more, each writer in turn.
        assert!(e.write(&mine, By::Qp(OWNER)));
        assert_eq!(e.writer.load(Ordering::Relaxed), SHARED, "taken for good");
        assert!(e.write(&theirs, By::Qp(OTHER)) && e.write(&mine, By::Control));
        assert_eq!(e.writer.load(Ordering::Relaxed), SHARED);
        let v = e.read().unwrap();
        assert_eq!((v.key, v.base), (1, 0x1000), "the last write");
    }
    assert!(
        owner_writes > 0,
        "the owner never wrote while the other was about to"
    );
}

/// A queue-pair number equal to one of the writer states (none is ever given out) owns
/// no slot: its write locks the slot like a stranger's and leaves no owner behind.
#[test]
fn a_number_that_is_a_writer_state_owns_nothing() {
    let t = MrTable::new();
    for qp in [UNCLAIMED, SHARED, LOCKED] {
        let slot = t.alloc_fast_mr(KeyScope::Domain).unwrap();
        let e = t.entry(slot.rkey() >> 8).unwrap();
        let v = View {
            valid: true,
            base: 0x1000,
            len: 0x1000,
            ..e.read().unwrap()
        };
        assert_eq!(e.writer.load(Ordering::Relaxed), UNCLAIMED);
        assert!(e.write(&v, By::Qp(qp)), "{qp:#x} writes");
        assert_eq!(
            e.writer.load(Ordering::Relaxed),
            SHARED,
            "{qp:#x} owns nothing"
        );
        assert_eq!(e.read().unwrap().base, 0x1000);
    }
}
