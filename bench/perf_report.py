#!/usr/bin/env python3
"""Parsing, goal checks and plots for bench/spdk_vs_nvmf.sh (no third-party modules).

Subcommands (each prints one line the shell script reads, or writes a file):

  bdevperf RESULT.json [LOG OFFSET]
                                -> "IOPS MiB/s AVG_US FAILED P99_US" of a perform_tests
                                   result; P99_US from the latency summary bdevperf -l
                                   printed to LOG after byte OFFSET ("-" without one)
  fio RESULT.json               -> "IOPS AVG_US P50_US P99_US P999_US" of a read job
  rtrs-bench LINE               -> "IOPS" of an rtrs-bench --json line
  floor LINE                    -> "IOPS AVG_US P99_US CLIENT_SC SERVER_SC" of a tcp_floor
                                   line (SC: that side's syscalls per IO)
  window SOCK BDEV SECS SIZE PERF:PID[:APPSOCK]...
                                -> IOs of SIZE bytes bdev BDEV of the SPDK application at
                                   SOCK completed (its bytes moved / SIZE: a split IO counts
                                   once) while the perf stat instances PERF (fifo prefixes:
                                   PERF.ctl, PERF.ack; started with -D -1) counted, for SECS;
                                   the user and system CPU time of process PID over the same
                                   window goes to PERF.cpu ("USER_S SYS_S"), and with APPSOCK
                                   (that process's RPC socket) the busy share of its busiest
                                   SPDK thread over the window to PERF.busy ("SHARE NAME":
                                   thread_get_stats, busy ticks over busy and idle)
  cpu PERF.cpu IOS              -> "USER_US SYS_US": CPU time per IO of that window
  busy PERF.busy                -> "SHARE NAME" of that window ("n/a -" without one)
  syscalls PERF.csv IOS         -> "ALL BREAKDOWN": syscalls per IO of a perf stat -x, file
                                   and the main calls per IO ("recvfrom 1.20 (0.50 data), ...")
  layers PERF.data PERF.cpu IOS -> "KERNEL_NS USER_NS GROUP=NS;..." of a perf record of one
                                   process over a window: nanoseconds of CPU per IO in the
                                   kernel, in user space, and in each user-space layer (this
                                   project's modules by path, SPDK and other libraries by
                                   name), largest first: each group's share of the samples
                                   times the process's CPU time of the window (PERF.cpu),
                                   over IOS
  timeline SCRIPT.txt TARGET_PID
                                -> "REQ_US TGT_US RESP_US INI_US CYCLE_US N": at QD1, from
                                   `perf script -F comm,pid,tid,time,event,trace --ns` of
                                   raw_syscalls:sys_enter/sys_exit of the target (TARGET_PID)
                                   and the initiator, the median of each phase of an IO over
                                   N whole cycles: the request's way (the initiator's send
                                   entered to the target's last receive of it returned), the
                                   target's work (that return to its answer's send entered),
                                   the answer's way (to the initiator's last receive of it
                                   returned) and the initiator's work (that return to its next
                                   send entered); sends are sendmsg, sendto, writev and write,
                                   receives recvfrom, recvmsg, readv and read returning data
  ratio A B                     -> A / B with two decimals (0.00 when B is 0, n/a when
                                   either is not a number)
  svg-qd SWEEP.tsv OUT.svg      -> IOPS vs queue depth, one line per side
  svg-lat RTRS.json NVMF.json OUT.svg
                                -> QD1 completion-latency distribution (fio percentiles)
  svg-cores SCALING.tsv OUT.svg -> IOPS vs cores per side, one line per side (bench/scaling.sh)
  median V...                   -> the median of the numbers (the lower middle one of an
                                   even count)
  median-index V...             -> the position (from 0) of that median among the numbers
                                   (a run of rounds reports the round of its median ratio)
  append DOC SECTION INTRO RUN  -> puts RUN (a file) at the end of section SECTION of DOC
  self-test                     -> checks the layer names and the per-IO costs of `layers`
                                   and the phases of `timeline` on fixed input (ci/test.sh runs it)

SWEEP.tsv has lines "side<TAB>qd<TAB>iops", SCALING.tsv "side<TAB>cores<TAB>iops".
"""

import json
import math
import os
import re
import socket
import subprocess
import sys
import time

COLORS = {"rtrs": "#1f77b4", "nvmf": "#d62728", "inline": "#2ca02c"}
LABELS = {"rtrs": "rtrs bdev (tcp fabric)", "nvmf": "SPDK NVMe-oF/TCP",
          "inline": "rtrs-bench --inline-target (reactors)"}


def bdevperf_p99(log, offset):
    """p99 of the latency summary bdevperf (-l) printed after byte OFFSET of LOG: the
    summary is written just before the RPC answer leaves, so it is there or about to be."""
    for _ in range(20):
        with open(log, "rb") as f:
            f.seek(int(offset))
            text = f.read().decode(errors="replace")
        vals = [float(l.split(":")[1].split("us")[0]) for l in text.splitlines()
                if l.strip().startswith("99.00000%")]
        if vals:
            return "%.2f" % max(vals)
        time.sleep(0.1)
    return "-"


def bdevperf(path, log=None, offset=0):
    jobs = json.load(open(path))["results"]
    iops = sum(j["iops"] for j in jobs)
    mibps = sum(j["mibps"] for j in jobs)
    lat = sum(j["avg_latency_us"] for j in jobs) / len(jobs)
    failed = sum(j.get("io_failed", 0) for j in jobs)
    p99 = bdevperf_p99(log, offset) if log else "-"
    print("%.0f %.1f %.2f %d %s" % (iops, mibps, lat, failed, p99))


def floor(line):
    d = json.loads(line)
    print("%.0f %.2f %.2f %.2f %.2f" % (d["iops"], d["lat_avg_us"], d["lat_p99_us"],
                                        d["client_syscalls_per_io"], d["server_syscalls_per_io"]))


def rpc_call(sock_path, method, params):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sock_path)
    req = {"jsonrpc": "2.0", "id": 1, "method": method}
    if params is not None:
        req["params"] = params
    s.sendall(json.dumps(req).encode())
    buf, dec = b"", json.JSONDecoder()
    while True:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit("%s: connection closed without an answer to %s" % (sock_path, method))
        buf += chunk
        try:
            obj, _ = dec.raw_decode(buf.decode())
        except ValueError:
            continue
        s.close()
        if "error" in obj:
            raise SystemExit("%s %s: %s" % (sock_path, method, obj["error"]))
        return obj["result"]


def bdev_bytes(sock_path, bdev):
    st = rpc_call(sock_path, "bdev_get_iostat", {"name": bdev})["bdevs"][0]
    return st["bytes_read"] + st["bytes_written"]


def cpu_seconds(pid):
    """User and system CPU time of process PID, all its threads (/proc/PID/stat fields
    14 and 15, in clock ticks)."""
    with open("/proc/%s/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / hz, int(fields[12]) / hz


def perf_ctl(prefix, cmd):
    # perf holds both fifos open read-write: the open for writing returns once perf has
    # the control fifo, and the ack arrives when the command took effect.
    with open(prefix + ".ctl", "w") as c:
        c.write(cmd + "\n")
    with open(prefix + ".ack") as a:
        a.readline()


def thread_ticks(app_sock):
    """{thread id: (name, busy ticks, idle ticks)} of the SPDK application at APP_SOCK
    (thread_get_stats); empty without a socket."""
    if not app_sock:
        return {}
    threads = rpc_call(app_sock, "thread_get_stats", None)["threads"]
    return {t["id"]: (t["name"], t["busy"], t["idle"]) for t in threads}


def busiest(t0, t1):
    """(busy share, name) of the thread with the most busy ticks between two
    thread_ticks snapshots: the thread that carries the IO."""
    best = None
    for tid, (name, busy, idle) in t1.items():
        if tid not in t0:
            continue
        b, i = busy - t0[tid][1], idle - t0[tid][2]
        if b + i > 0 and (best is None or b > best[0]):
            best = (b, b / (b + i), name)
    return (best[1], best[2]) if best else None


def window(sock_path, bdev, secs, size, *specs):
    perfs = [(spec.split(":") + [""])[:3] for spec in specs]
    before = bdev_bytes(sock_path, bdev)
    for p, _, _ in perfs:
        perf_ctl(p, "enable")
    cpu0 = [cpu_seconds(pid) for _, pid, _ in perfs]
    ticks0 = [thread_ticks(app) for _, _, app in perfs]
    time.sleep(float(secs))
    cpu1 = [cpu_seconds(pid) for _, pid, _ in perfs]
    ticks1 = [thread_ticks(app) for _, _, app in perfs]
    for p, _, _ in perfs:
        perf_ctl(p, "disable")
    for (p, _, _), a, b, t0, t1 in zip(perfs, cpu0, cpu1, ticks0, ticks1):
        with open(p + ".cpu", "w") as f:
            f.write("%.2f %.2f\n" % (b[0] - a[0], b[1] - a[1]))
        top = busiest(t0, t1)
        with open(p + ".busy", "w") as f:
            f.write("%.3f %s\n" % top if top else "n/a -\n")
    print((bdev_bytes(sock_path, bdev) - before) // int(size))


def busy(path):
    try:
        print(open(path).read().strip() or "n/a -")
    except FileNotFoundError:
        print("n/a -")


def cpu(path, ios):
    user, system = (float(v) for v in open(path).read().split())
    ios = float(ios)
    if not ios:
        print("n/a n/a")
        return
    print("%.2f %.2f" % (user / ios * 1e6, system / ios * 1e6))


def syscalls(path, ios):
    ios = float(ios)
    counts = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) < 3 or not f[0].isdigit():
            continue
        ev = f[2]
        # The exit events are filtered (ret > 0): calls that moved data.
        key = ev.replace("raw_syscalls:sys_enter", "all").replace("syscalls:sys_enter_", "")
        key = key.replace("syscalls:sys_exit_", "data:")
        counts[key] = counts.get(key, 0) + int(f[0])
    if not ios or "all" not in counts:
        print("n/a n/a")
        return
    total = counts.pop("all")
    parts, named = [], 0
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
        if k.startswith("data:") or v / ios < 0.005:
            continue
        named += v
        data = counts.get("data:" + k)
        parts.append("%s %.2f%s" % (k, v / ios, " (%.2f data)" % (data / ios) if data is not None else ""))
    if total - named > 0.005 * ios:
        parts.append("other %.2f" % ((total - named) / ios))
    print("%.2f %s" % (total / ios, ", ".join(parts) or "-"))


# Syscall numbers (x86_64) of the sends and the receives `timeline` follows.
TL_SEND = {46, 44, 20, 1}
TL_RECV = {45, 47, 19, 0}
TL_LINE = re.compile(r"\s*\S+\s+(\d+)/\d+\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit):\s+NR (\d+) (.*)")


def timeline_phases(lines, target):
    """The phases of each whole QD1 cycle in `lines` (see `timeline`), as lists of µs."""
    target = int(target)
    phases = ([], [], [], [])
    state, t_send, t_rx, t_tsend, c_rx = 0, 0.0, 0.0, 0.0, 0.0
    for line in lines:
        m = TL_LINE.match(line)
        if not m:
            continue
        pid, t, kind, nr = int(m.group(1)), float(m.group(2)) * 1e6, m.group(3), int(m.group(4))
        tgt = pid == target
        if kind == "enter":
            if nr not in TL_SEND:
                continue
            if not tgt and state in (0, 4):
                if state == 4:
                    phases[3].append(t - c_rx)
                state, t_send = 1, t
            elif tgt and state == 2:
                phases[0].append(t_rx - t_send)
                phases[1].append(t - t_rx)
                state, t_tsend = 3, t
            continue
        words = m.group(5).split("=", 1)[-1].split()
        ret = int(words[0]) if words and words[0].lstrip("-").isdigit() else 0
        if nr not in TL_RECV or ret <= 0:
            continue
        if tgt and state in (1, 2):
            state, t_rx = 2, t
        elif not tgt and state in (3, 4):
            if state == 3:
                phases[2].append(t - t_tsend)
            state, c_rx = 4, t
    # The last cycle's answer has no initiator work after it.
    n = len(phases[3])
    return [p[:n] for p in phases]


def timeline(path, target):
    phases = timeline_phases(open(path, errors="replace"), target)
    n = len(phases[3])
    if n < 100:
        print("n/a n/a n/a n/a n/a %d" % n)
        return
    meds = [sorted(p)[n // 2] for p in phases]
    cycles = sorted(sum(p[i] for p in phases) for i in range(n))
    print("%.2f %.2f %.2f %.2f %.2f %d" % (*meds, cycles[n // 2], n))


def layer_of(dso, sym, kernel):
    """The layer a sample's function belongs to (see `layers`)."""
    if kernel:
        return "kernel"
    if dso.startswith("librtrs_spdk") or dso in ("rtrs-bench", "rtrs-target"):
        m = re.search(r"rtrs_spdk::(\w+)(?:::(\w+))?", sym)
        if not m:
            return "rtrs other"
        # The fabric by backend (soft queue pair, tcp framing, ...), the rest by module.
        if m.group(1) == "fabric" and m.group(2):
            return "rtrs fabric " + m.group(2)
        return "rtrs " + m.group(1)
    if dso.startswith("libc.so"):
        return "libc"
    if dso.startswith("ld-linux"):
        return "ld.so"
    m = re.match(r"lib(spdk_\w+?)\.so", dso)
    return m.group(1) if m else dso


def layer_costs(report, cpu_s, ios):
    """(kernel ns, user ns, [(layer, ns)] largest first) per IO from the text of
    `perf report --no-children --sort dso,sym -g none` of one process, whose CPU time
    over the samples' window was CPU_S seconds, for IOS IOs."""
    shares = {}
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        g = layer_of(m.group(2), m.group(4), m.group(3) == "k")
        shares[g] = shares.get(g, 0.0) + float(m.group(1)) / 100
    total = sum(shares.values())
    if not ios or not total:
        return None
    # Shares of the samples of the window, scaled to the CPU time the process used in it.
    ns = {g: v / total * cpu_s / ios * 1e9 for g, v in shares.items()}
    kernel = ns.pop("kernel", 0.0)
    return kernel, sum(ns.values()), sorted(ns.items(), key=lambda kv: -kv[1])


def layers(data, cpu_path, ios):
    user_s, sys_s = (float(v) for v in open(cpu_path).read().split())
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,sym",
                          "-g", "none", "--percent-limit", "0"],
                         capture_output=True, text=True, check=False).stdout
    costs = layer_costs(out, user_s + sys_s, float(ios))
    if costs is None:
        print("n/a n/a -")
        return
    kernel, user, groups = costs
    text = ";".join("%s=%.0f" % (g.replace(" ", "_"), v) for g, v in groups if v >= 0.5)
    print("%.0f %.0f %s" % (kernel, user, text or "-"))


def self_test():
    """Checks the parts of this script that no bench run checks (ci/test.sh runs it)."""
    cases = [
        ("librtrs_spdk.so", "rtrs_spdk::fabric::soft::qp::SoftQp::push_send", False, "rtrs fabric soft"),
        ("librtrs_spdk.so", "<rtrs_spdk::server::poller::ServerCore as rtrs_spdk::engine::poller::Poller>::poll",
         False, "rtrs server"),
        ("rtrs-bench", "rtrs_spdk::client::io::take_recvs", False, "rtrs client"),
        ("librtrs_spdk.so", "0x00005555", False, "rtrs other"),
        ("libspdk_nvmf.so.21.0", "nvmf_tcp_req_process", False, "spdk_nvmf"),
        ("libc.so.6", "__memmove_avx_unaligned_erms", False, "libc"),
        ("ld-linux-x86-64.so.2", "__tls_get_addr", False, "ld.so"),
        ("[kernel.kallsyms]", "_copy_from_iter", True, "kernel"),
        ("bdevperf", "main", False, "bdevperf"),
    ]
    bad = [(d, s, want, layer_of(d, s, k)) for d, s, k, want in cases if layer_of(d, s, k) != want]
    report = """# comment
    60.00%  [kernel.kallsyms]  [k] _copy_from_iter
    25.00%  librtrs_spdk.so    [.] rtrs_spdk::fabric::soft::qp::SoftQp::push_send
    10.00%  librtrs_spdk.so    [.] rtrs_spdk::fabric::tcp::tx::Tx::flush
     5.00%  libc.so.6          [.] memcpy
"""
    # 2 s of CPU over 1,000,000 IOs: 2,000 ns per IO, of which 60 % in the kernel.
    kernel, user, groups = layer_costs(report, 2.0, 1e6)
    want = (1200, 800, [("rtrs fabric soft", 500), ("rtrs fabric tcp", 200), ("libc", 100)])
    got = (round(kernel), round(user), [(g, round(v)) for g, v in groups])
    if got != want:
        bad.append(("layer_costs", report.count("%"), want, got))
    if layer_costs("nothing here", 2.0, 1e6) is not None or layer_costs(report, 2.0, 0) is not None:
        bad.append(("layer_costs", "empty", None, "a result"))
    # 101 QD1 cycles, target 10, initiator 20: the initiator's send, the target's
    # receives (an empty one, then the request in two reads) and its send, the
    # initiator's receive, an empty one and its next send; times in seconds.
    def ev(pid, t, kind, nr, tail):
        return "   reactor_0 %d/%d %.9f: raw_syscalls:sys_%s: NR %d %s" % (pid, pid, t, kind, nr, tail)
    trace = []
    for c in range(101):
        b = 1.0 + c * 10e-6
        trace += [ev(20, b, "enter", 46, "(5, 0, 0)"), ev(20, b + 2e-6, "exit", 46, "= 136"),
                  ev(10, b + 2.5e-6, "exit", 45, "= -11"), ev(10, b + 3e-6, "exit", 45, "= 40"),
                  ev(10, b + 3.5e-6, "exit", 19, "= 96"),
                  ev(10, b + 4.5e-6, "enter", 46, "(7, 0, 0)"), ev(10, b + 7e-6, "exit", 46, "= 4224"),
                  ev(20, b + 7.5e-6, "exit", 45, "= 4224"), ev(20, b + 8e-6, "enter", 45, "(5, 0, 0)"),
                  ev(20, b + 8.2e-6, "exit", 45, "= -11"), "unrelated line"]
    got = [[round(v, 3) for v in p] for p in timeline_phases(trace, 10)]
    want = [[3.5] * 100, [1.0] * 100, [3.0] * 100, [2.5] * 100]
    if got != want:
        bad.append(("timeline", len(trace), [(len(p), p[:1]) for p in want], [(len(p), p[:1]) for p in got]))
    for b in bad:
        sys.stderr.write("perf_report self-test: %r: expected %r, got %r\n" % (b[0:2], b[2], b[3]))
    if bad:
        raise SystemExit(1)
    print("perf_report self-test: %d layer names, the per-IO costs and a QD1 timeline as expected" % len(cases))


def fio_read(path):
    job = json.load(open(path))["jobs"][0]["read"]
    return job


def pct(clat, p):
    want = float(p)
    best = min(clat["percentile"].items(), key=lambda kv: abs(float(kv[0]) - want))
    return best[1] / 1000.0


def fio(path):
    r = fio_read(path)
    clat = r["clat_ns"]
    print("%.0f %.2f %.2f %.2f %.2f" % (r["iops"], r["lat_ns"]["mean"] / 1000.0,
                                        pct(clat, 50), pct(clat, 99), pct(clat, 99.9)))


def rtrs_bench(line):
    print("%.0f" % json.loads(line)["iops"])


def ratio(a, b):
    try:
        a, b = float(a), float(b)
    except ValueError:
        print("n/a")
        return
    print("%.2f" % (a / b if b else 0.0))


class Svg:
    """A minimal line chart: axes, ticks, grid, polylines and a legend."""

    def __init__(self, title, xlabel, ylabel, w=720, h=420):
        self.w, self.h = w, h
        self.left, self.right, self.top, self.bottom = 80, 20, 40, 60
        self.parts = []
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel

    def frame(self, xticks, yticks, xmap, ymap):
        pw = self.w - self.left - self.right
        ph = self.h - self.top - self.bottom
        self.px = lambda x: self.left + xmap(x) * pw
        self.py = lambda y: self.top + (1 - ymap(y)) * ph
        p = self.parts
        p.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>'
                 % (self.left, self.top, pw, ph))
        for x, label in xticks:
            X = self.px(x)
            p.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                     % (X, self.top, X, self.top + ph))
            p.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                     % (X, self.top + ph + 18, label))
        for y, label in yticks:
            Y = self.py(y)
            p.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                     % (self.left, Y, self.left + pw, Y))
            p.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                     % (self.left - 6, Y + 4, label))
        p.append('<text x="%d" y="24" text-anchor="middle" font-weight="bold">%s</text>'
                 % (self.w // 2, self.title))
        p.append('<text x="%d" y="%d" text-anchor="middle">%s</text>'
                 % (self.left + pw // 2, self.h - 14, self.xlabel))
        p.append('<text x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">%s</text>'
                 % (self.top + ph // 2, self.top + ph // 2, self.ylabel))

    def line(self, side, pts):
        path = " ".join("%.1f,%.1f" % (self.px(x), self.py(y)) for x, y in pts)
        c = COLORS.get(side, "#000")
        self.parts.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                          % (c, path))
        for x, y in pts:
            self.parts.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>'
                              % (self.px(x), self.py(y), c))

    def legend(self, sides):
        for i, s in enumerate(sides):
            y = self.top + 16 + 18 * i
            x = self.left + 14
            self.parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>'
                              % (x, y, x + 24, y, COLORS.get(s, "#000")))
            self.parts.append('<text x="%d" y="%d">%s</text>' % (x + 30, y + 4, LABELS.get(s, s)))

    def save(self, out, note):
        body = "\n".join(self.parts)
        svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
               'font-family="sans-serif" font-size="12">\n'
               '<rect width="100%%" height="100%%" fill="white"/>\n%s\n'
               '<text x="%d" y="%d" text-anchor="end" fill="#666" font-size="10">%s</text>\n'
               '</svg>\n' % (self.w, self.h, body, self.w - 6, self.h - 2, note))
        with open(out, "w") as f:
            f.write(svg)


def nice_ceil(v):
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * e:
            return m * e
    return 10 * e


def svg_qd(tsv, out):
    data = {}
    for line in open(tsv):
        side, qd, iops = line.split()
        data.setdefault(side, []).append((int(qd), float(iops)))
    qds = sorted({q for pts in data.values() for q, _ in pts})
    ymax = nice_ceil(max(v for pts in data.values() for _, v in pts) * 1.05)
    lo, hi = math.log2(qds[0]), math.log2(qds[-1])
    s = Svg("4 KiB randread IOPS vs queue depth (bdevperf, one initiator core)",
            "queue depth", "IOPS (thousands)")
    s.frame([(q, str(q)) for q in qds],
            [(ymax * i / 5, "%.0f" % (ymax * i / 5 / 1000)) for i in range(6)],
            lambda x: (math.log2(x) - lo) / (hi - lo or 1), lambda y: y / ymax)
    for side in sorted(data):
        s.line(side, sorted(data[side]))
    s.legend(sorted(data))
    s.save(out, "bench/spdk_vs_nvmf.sh")


def svg_lat(rtrs, nvmf, out):
    curves = {}
    for side, path in (("rtrs", rtrs), ("nvmf", nvmf)):
        clat = fio_read(path)["clat_ns"]["percentile"]
        curves[side] = sorted((v / 1000.0, float(p)) for p, v in clat.items() if v > 0)
    xs = [x for pts in curves.values() for x, _ in pts]
    # Latency on a log axis: the body (a few µs apart) and the tail (orders more) both show.
    ticks = [m * 10 ** e for e in range(-1, 7) for m in (1, 2, 5)]
    lo = max(t for t in ticks if t <= min(xs))
    hi = min(t for t in ticks if t >= max(xs))
    # Percentile axis stretched toward the tail: y = -log10(1 - p/100).
    tail = lambda p: -math.log10(max(1e-6, 1 - p / 100.0))
    top = tail(99.99)
    s = Svg("4 KiB randread at QD1: completion latency distribution (fio spdk_bdev)",
            "completion latency (µs, log scale)", "percentile")
    s.frame([(t, "%g" % t) for t in ticks if lo <= t <= hi],
            [(p, "p%g" % p) for p in (0, 50, 90, 99, 99.9, 99.99)],
            lambda x: (math.log10(x) - math.log10(lo)) / (math.log10(hi) - math.log10(lo) or 1),
            lambda p: tail(p) / top)
    for side in ("rtrs", "nvmf"):
        s.line(side, curves[side])
    s.legend(["rtrs", "nvmf"])
    s.save(out, "bench/spdk_vs_nvmf.sh")


def svg_cores(tsv, out):
    data = {}
    for line in open(tsv):
        side, cores, iops = line.split()
        data.setdefault(side, []).append((int(cores), float(iops)))
    if not data:
        raise SystemExit("svg-cores: %s holds no results" % tsv)
    cores = sorted({c for pts in data.values() for c, _ in pts})
    ymax = nice_ceil(max(v for pts in data.values() for _, v in pts) * 1.05)
    lo, hi = math.log2(cores[0]), math.log2(cores[-1])
    s = Svg("4 KiB randread QD32 per core: IOPS vs cores per side",
            "cores per side (reactors for --inline-target)", "IOPS (thousands)")
    s.frame([(c, str(c)) for c in cores],
            [(ymax * i / 5, "%.0f" % (ymax * i / 5 / 1000)) for i in range(6)],
            lambda x: (math.log2(x) - lo) / (hi - lo or 1), lambda y: y / ymax)
    for side in sorted(data):
        s.line(side, sorted(data[side]))
    s.legend(sorted(data))
    s.save(out, "bench/scaling.sh")


def median(*vals):
    v = sorted(float(x) for x in vals)
    if not v:
        raise SystemExit("median: no values")
    print(v[(len(v) - 1) // 2])


def median_index(*vals):
    """The position (from 0) of the median of the numbers, the lower middle one of an
    even count; ties keep their order, and what is not a number ("n/a") sorts first."""
    if not vals:
        raise SystemExit("median-index: no values")

    def key(i):
        try:
            return (1, float(vals[i]))
        except ValueError:
            return (0, 0.0)

    order = sorted(range(len(vals)), key=key)
    print(order[(len(vals) - 1) // 2])


def append(doc, section, intro, run):
    run = open(run).read().rstrip("\n") + "\n"
    intro = open(intro).read().rstrip("\n") + "\n"
    text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
    lines = text.split("\n")
    try:
        at = lines.index(section)
    except ValueError:
        text = text.rstrip("\n") + "\n\n" + section + "\n\n" + intro + "\n" + run
    else:
        end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        # The section keeps its method and findings and the latest run only: a run that
        # starts with a dated heading ("### 2026-...") replaces the dated runs there (the
        # earlier ones stay in git history).
        if run.startswith("### "):
            dated = next((i for i in range(at + 1, end) if re.match(r"### \d{4}-", lines[i])), end)
            end_keep = dated
        else:
            end_keep = end
        head = "\n".join(lines[:end_keep]).rstrip("\n")
        tail = "\n".join(lines[end:])
        text = head + "\n\n" + run + ("\n" + tail if tail.strip() else "")
    open(doc, "w").write(text)


def main(argv):
    cmds = {"bdevperf": bdevperf, "fio": fio, "rtrs-bench": rtrs_bench, "ratio": ratio,
            "floor": floor, "window": window, "timeline": timeline, "syscalls": syscalls, "layers": layers, "cpu": cpu, "busy": busy,
            "svg-qd": svg_qd, "svg-lat": svg_lat, "svg-cores": svg_cores, "median": median, "median-index": median_index,
            "append": append, "self-test": self_test}
    if len(argv) < 2 or argv[1] not in cmds:
        sys.stderr.write(__doc__)
        return 2
    cmds[argv[1]](*argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
