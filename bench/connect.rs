//! Connect benchmark: what PSK authentication costs when a tcp-fabric connection is
//! established, and that it costs nothing afterwards. One thread drives both ends over
//! 127.0.0.1 (so that scheduling on a shared machine does not dominate): connect,
//! listener poll, accept, until both sides are established, then a disconnect; the same
//! loop without a key (frame version 1) and with one (version 2: one more round trip,
//! two nonces, four HMAC-SHA256).
//!
//! `cargo bench --bench connect [-- --count N]`

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{CmEvent, Conn, Fabric, Psk, QpCaps};

const LIMIT: Duration = Duration::from_secs(10);

fn count() -> usize {
    let args: Vec<String> = std::env::args().collect();
    let mut n = 2000;
    let mut i = 1;
    while i < args.len() {
        match (args[i].as_str(), args.get(i + 1)) {
            ("--count", Some(v)) => {
                n = v.parse().expect("--count takes a number");
                i += 2;
            }
            ("--bench", _) => i += 1,
            (other, _) => panic!("unknown argument {other:?} (use --count N)"),
        }
    }
    n
}

fn established(ev: Option<CmEvent>) -> bool {
    match ev {
        None => false,
        Some(CmEvent::Established { .. }) => true,
        Some(e) => panic!("connect failed: {e:?}"),
    }
}

/// One connect + accept to established on both sides; returns its duration.
fn one(
    cf: &TcpFabric,
    l: &mut Box<dyn rtrs_spdk::fabric::Listener>,
    dst: SocketAddr,
    psk: Option<&Psk>,
) -> Duration {
    let caps = QpCaps::default();
    let start = Instant::now();
    let mut c = cf
        .connect(dst, &ConnectOptions::new(caps, &[0; 56]).psk(psk))
        .expect("connect");
    let mut s: Option<Box<dyn Conn>> = None;
    let (mut c_up, mut s_up) = (false, false);
    while !(c_up && s_up) {
        assert!(start.elapsed() < LIMIT, "no connection within {LIMIT:?}");
        if s.is_none() {
            if let Some(req) = l.poll() {
                s = Some(req.accept(caps, &[0; 56]).expect("accept"));
            }
        }
        if let Some(sc) = s.as_mut() {
            s_up |= established(sc.poll_cm());
        }
        c_up |= established(c.poll_cm());
    }
    let took = start.elapsed();
    c.disconnect();
    if let Some(mut sc) = s {
        sc.disconnect();
    }
    took
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn main() {
    let n = count();
    let psk = Psk::from_bytes("bench", &[0x42; 32]).expect("key");
    println!("tcp fabric connect to established, both ends on one thread, {n} connects each");
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>12}",
        "", "mean us", "p50 us", "p99 us", "connects/s"
    );
    // Interleaved rounds, so that drift of the machine affects both alike.
    let mut plain = Vec::with_capacity(n);
    let mut keyed = Vec::with_capacity(n);
    let (cf, sf) = (TcpFabric::new(), TcpFabric::new());
    let local: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut lp = sf.listen(local, &ListenOptions::default()).expect("listen");
    let mut lk = sf
        .listen(local, &ListenOptions::with_psk(Some(psk.clone())))
        .expect("listen");
    let (dp, dk) = (lp.local_addr(), lk.local_addr());
    for _ in 0..n / 10 {
        one(&cf, &mut lp, dp, None);
        one(&cf, &mut lk, dk, Some(&psk));
    }
    for _ in 0..n {
        plain.push(one(&cf, &mut lp, dp, None));
        keyed.push(one(&cf, &mut lk, dk, Some(&psk)));
    }
    for (name, mut v) in [
        ("without a key (version 1)", plain),
        ("with a key (version 2)", keyed),
    ] {
        v.sort();
        let total: Duration = v.iter().sum();
        let mean = total.as_secs_f64() * 1e6 / v.len() as f64;
        println!(
            "{:<28} {:>10.1} {:>10.1} {:>10.1} {:>12.0}",
            name,
            mean,
            percentile(&v, 0.5),
            percentile(&v, 0.99),
            1e6 / mean
        );
    }
}
