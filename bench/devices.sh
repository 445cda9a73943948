#!/usr/bin/env bash
# Many remote devices in one SPDK application (docs/BENCHMARKS.md, "SPDK: many devices over
# one session"): what N rtrs bdevs over one session cost a client and a target, against N
# namespaces of one NVMe-oF/TCP controller, and what splitting one core's IO over 16 bdevs
# of one session costs in IOPS.
#
# Parts (both by default; --only picks one):
#   create  for each N of --devices: a target spdk_tgt on core 0 (-m 0x1, the plugin
#           preloaded) with N null bdevs, exported over RTRS (tcp, 127.0.0.1) and as the N
#           namespaces of one NVMe-oF/TCP subsystem; a client spdk_tgt on cores 0-1 (-m 0x3:
#           two cores, so that a module adding a thread per bdev and core would show it;
#           its main core is 1, off the target's core, for the times; --client-mask 0x2
#           keeps it off core 0 altogether)
#           creates N remote bdevs: rtrs = N bdev_rtrs_create, all with the same sessname
#           and the same single path; NVMe-oF/TCP = one bdev_nvme_attach_controller; and,
#           for what SPDK's bdev layer costs any bdev made one RPC at a time, N local
#           bdev_null_create (null). A fresh target and a fresh client for every N, kind
#           and memory mode (--mem). Measured: the wall time of the RPCs (one connection,
#           one call after the other) until bdev_get_bdevs lists every bdev; the client's
#           memory (VmRSS + HugetlbPages: resident pages, hugepages included) and SPDK
#           threads (thread_get_stats) added, 1 s after the last bdev is listed; the
#           target's memory added then, and again 2 s after the client deleted its bdevs
#           and exited. rtrs and null also: the 2nd create alone (the second device over an
#           existing session) and the client memory it added, read 0.5 s before and 0.5 s after it
#           (those two pauses are not counted in the time to create all N). A create that
#           fails or takes too long (--create-timeout, all the calls together) is reported
#           as such, with the bdevs made so far measured, and the run goes on.
#   iops    bdevperf on one core (-m 0x2) over rtrs, 4 KiB randread, against a fresh target
#           on core 0 with 16 null bdevs: (i) one rtrs bdev, one job at queue depth Q (--qd,
#           64 by default); (ii) 16 rtrs bdevs with one sessname, one job per bdev, all on
#           that core, queue depth Q/16 each (a bdevperf -j job file). --rounds rounds, the
#           order of (i) and (ii) alternating; the ratio (ii)/(i) in IOPS is the median of
#           the rounds'. The peer in every round, reported beside it: NVMe-oF/TCP, one
#           namespace at QD Q vs 16 namespaces of one controller at Q/16 each.
#
#   bench/devices.sh [--devices N,...] [--time S] [--rounds R] [--qd Q] [--create-timeout S]
#                    [--sessnames one|each] [--client-mask MASK] [--mem huge,nohuge]
#                    [--only create|iops] [--no-append]
#
# --sessnames each gives every rtrs bdev a sessname of its own, hence a session of its own
# (the only way to many devices where a target refuses a second session of one name), for
# comparison; the goals stay the same.
#
# --mem: the memory modes of the create part, in order (huge,nohuge by default). huge: SPDK on
# hugepages as in production, in its dynamic memory mode (no -s), so that DMA memory a bdev
# allocates maps new hugepages and counts; the bench reserves 1,536 hugepages if fewer are
# free (root) and gives them back at exit. nohuge: --no-huge -s 2048, where SPDK's iobuf pool
# is faulted in as buffers are first touched (docs/BENCHMARKS.md). The goals are judged in
# the first mode that can run; the rows of the others are reported with "(reported: ...)".
# The iops part runs in the judged mode.
#
# Goals, each with PASS or MISS: for every N, the N rtrs bdevs in ≤ 1 s in all, client memory
# ≤ +16 MiB (as measured, and above the N null bdevs'), target memory ≤ +80 MiB after the
# client left, SPDK threads added ≤ 1 (none per bdev: at 25ab6c4 one per bdev and core beyond
# the first); the 2nd create ≤ 50 ms and ≤ +1 MiB client memory; the IOPS ratio ≥ 0.90.
#
# Needs SPDK ($SPDK_DIR or /opt/spdk); builds the plugin. Prints the tables and goals and writes the run into docs/BENCHMARKS.md
# under "## SPDK: many devices over one session", in place of the previous run (not with
# --no-append).
# Ports: 14520 (RTRS) and 4422 (NVMe-oF/TCP), or RTRS_TEST_PORT_BASE + 92 and 93.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 1
# shellcheck source=ci/spdk/lib.sh
. ci/spdk/lib.sh
# shellcheck source=bench/lib.sh
. bench/lib.sh
REPORT=(python3 "$REPO/bench/perf_report.py")

DEVICES=16,64
TIME=10
ROUNDS=3
QD=64
CREATE_TIMEOUT=120
CLIENT_MASK=0x3
SESSNAMES=one
MEMS=huge,nohuge
PARTS=create,iops
ONLY=$PARTS
APPEND=1
usage() {
	echo "usage: $0 [--devices N,...] [--time S] [--rounds R] [--qd Q] [--create-timeout S] [--client-mask MASK] [--sessnames one|each] [--mem huge,nohuge] [--only $PARTS] [--no-append]" >&2
	exit 2
}
while [[ $# -gt 0 ]]; do
	case $1 in
	--devices) DEVICES=${2:?}; shift 2 ;;
	--time) TIME=${2:?}; shift 2 ;;
	--rounds) ROUNDS=${2:?}; shift 2 ;;
	--qd) QD=${2:?}; shift 2 ;;
	--create-timeout) CREATE_TIMEOUT=${2:?}; shift 2 ;;
	--client-mask) CLIENT_MASK=${2:?}; shift 2 ;;
	--sessnames) SESSNAMES=${2:?}; shift 2 ;;
	--mem) MEMS=${2:?}; shift 2 ;;
	--only) ONLY=${2:?}; shift 2 ;;
	--no-append) APPEND=0; shift ;;
	*) usage ;;
	esac
done
[[ $SESSNAMES == one || $SESSNAMES == each ]] || { echo "--sessnames: one or each, not '$SESSNAMES'" >&2; usage; }
read -r -a MEM_MODES <<<"${MEMS//,/ }"
[[ ${#MEM_MODES[@]} -gt 0 ]] || { echo "--mem: empty" >&2; usage; }
for m in "${MEM_MODES[@]}"; do
	[[ $m == huge || $m == nohuge ]] || { echo "--mem: huge or nohuge, not '$m'" >&2; usage; }
done
for p in ${ONLY//,/ }; do
	[[ ",$PARTS," == *",$p,"* ]] || { echo "--only: unknown part '$p'" >&2; usage; }
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }
num() { [[ "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || { echo "$1: '$2' is not a positive number" >&2; exit 2; }; }
num --time "$TIME"
num --rounds "$ROUNDS"
num --create-timeout "$CREATE_TIMEOUT"
num --qd "$QD"
[[ "$CLIENT_MASK" =~ ^0x[0-9a-fA-F]+$ && $((CLIENT_MASK)) -gt 0 ]] || { echo "--client-mask: '$CLIENT_MASK' is not a core mask like 0x3" >&2; exit 2; }
# The client's main core (its application thread, where the RPCs and examine run): the
# lowest core of its mask other than the target's core 0, where there is one. Sharing core
# 0 with the target's busy reactor makes every RPC wait for the scheduler to switch the two
# (16 null bdevs then take 0.2-0.3 s instead of 0.07 s); the other cores of the mask still
# get a reactor, so a module adding threads per core still shows.
CLIENT_MAIN=()
for ((c = 1; c < 64; c++)); do
	if (((CLIENT_MASK >> c) & 1)); then
		CLIENT_MAIN=(--main-core "$c")
		break
	fi
done
NMANY=16 # the bdevs of the iops part's (ii)
((QD % NMANY == 0)) || { echo "--qd: $QD is not a multiple of $NMANY" >&2; exit 2; }
read -r -a NS <<<"${DEVICES//,/ }"
[[ ${#NS[@]} -gt 0 ]] || usage
for n in "${NS[@]}"; do
	[[ "$n" =~ ^[0-9]+$ && "$n" -ge 2 && "$n" -le 1024 ]] || { echo "--devices: '$n' is not a count of 2 to 1024" >&2; exit 2; }
done
LOAD0=$(cut -d" " -f1-3 /proc/loadavg)

spdk_bench_init
[[ -n "$BDEVPERF_PY" ]] || { echo "bdevperf.py not found under $SPDK_DIR" >&2; exit 1; }
echo "== building the plugin (release)"
plugin_build || exit 1

# mem_mode MODE: the memory arguments of every SPDK application for MODE into MEM. huge:
# hugepages, SPDK's dynamic memory (no -s: DPDK maps hugepages as allocations need them, so
# what a bdev allocates shows in HugetlbPages), files unlinked so a killed app leaks none;
# reserves hugepages first (1,536 free: two idle spdk_tgt map about 410 each), or fails.
# nohuge: --no-huge -s 2048 (anonymous memory, faulted in as it is first touched).
mem_mode() {
	case $1 in
	huge)
		hugepages_ensure 1536 || return 1
		MEM=(--huge-unlink --disable-cpumask-locks)
		;;
	nohuge) MEM=(--no-huge -s 2048 --disable-cpumask-locks) ;;
	esac
}
# The goals are judged in the first memory mode that can run (hugepages where they can be
# reserved: how SPDK runs in production); the other modes' rows are reported beside.
JUDGED=
for m in "${MEM_MODES[@]}"; do
	if mem_mode "$m"; then
		JUDGED=$m
		break
	fi
	echo "!! --mem $m: no hugepages could be reserved (needs root and 3 GiB free); its rows are not measured" >&2
done
[[ -n $JUDGED ]] || { echo "no memory mode of --mem $MEMS can run here" >&2; exit 1; }
if [[ -n "${RTRS_TEST_PORT_BASE:-}" ]]; then
	RTRS_PORT=$((RTRS_TEST_PORT_BASE + 92)) NVMF_PORT=$((RTRS_TEST_PORT_BASE + 93))
else
	RTRS_PORT=14520 NVMF_PORT=4422
fi
NQN=nqn.2016-06.io.spdk:rtrsdevices
# The sessname of every rtrs bdev ("{i}": the bdev's number): one for all, or
# (--sessnames each) one per bdev, a session each, to compare with.
if [[ $SESSNAMES == one ]]; then SESS=devices; else SESS='devices-{i}'; fi
SPDK_VERSION=
OUT="$APP_DIR/out.md"
DEV_PY="$APP_DIR/devices.py"

# The measuring side: JSON-RPC over one connection per call sequence (no rpc.py start-up
# per call), VmRSS and thread counts from /proc, the tables and the goals of the create part.
cat >"$DEV_PY" <<'PY'
import codecs, json, os, re, socket, sys, time


class RpcError(Exception):
    pass


class Rpc:
    """One JSON-RPC connection to an SPDK application; every call has a deadline."""

    def __init__(self, path, timeout):
        self.timeout = float(timeout)
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(self.timeout)
        try:
            self.s.connect(path)
        except OSError as e:
            raise RpcError("connect to %s: %s" % (path, e))
        self.text, self.id = "", 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")()

    def call(self, method, params=None, timeout=None):
        self.id += 1
        req = {"jsonrpc": "2.0", "id": self.id, "method": method}
        if params is not None:
            req["params"] = params
        limit = self.timeout if timeout is None else max(float(timeout), 0.1)
        deadline = time.monotonic() + limit
        self.s.sendall(json.dumps(req).encode())
        dec = json.JSONDecoder()
        while True:
            self.text = self.text.lstrip()
            obj = None
            if self.text:
                try:
                    obj, end = dec.raw_decode(self.text)
                except ValueError:
                    pass
            if obj is not None:
                self.text = self.text[end:]
                if obj.get("id") != self.id:
                    continue
                if "error" in obj:
                    e = obj["error"]
                    e = str(e.get("message", e) if isinstance(e, dict) else e)
                    raise RpcError(e if e.startswith(method) else "%s: %s" % (method, e))
                return obj.get("result")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RpcError("%s: no answer within %.0f s" % (method, limit))
            self.s.settimeout(left)
            try:
                chunk = self.s.recv(1 << 16)
            except socket.timeout:
                raise RpcError("%s: no answer within %.0f s" % (method, limit))
            if not chunk:
                raise RpcError("%s: the application closed the connection (exited?)" % method)
            self.text += self.utf8.decode(chunk)


def status(pid, key):
    try:
        with open("/proc/%s/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss(pid):
    """Resident memory (KiB): VmRSS plus the hugetlbfs pages mapped (HugetlbPages), which
    VmRSS leaves out and where SPDK's DMA memory lives when it runs on hugepages."""
    v = status(pid, "VmRSS")
    return None if v is None else v + (status(pid, "HugetlbPages") or 0)


def mem(pid):
    """Prints rss(PID) (nothing for a process that is gone), for the shell."""
    v = rss(pid)
    if v is not None:
        print(v)


def names(kind, n):
    prefix = {"rtrs": "r%d", "nvmf": "nvme0n%d", "null": "z%d"}[kind]
    return [prefix % i for i in range(1, n + 1)]


def rtrs_params(i, device, sess, port):
    """SESS: the sessname, "{i}" in it replaced by the bdev's number."""
    return {"name": "r%d" % i, "sessname": sess.replace("{i}", str(i)), "device": device,
            "paths": [{"transport": "tcp", "dst_addr": "127.0.0.1", "port": int(port)}],
            "access_mode": "rw", "reconnect_delay_sec": 1, "hb_interval_ms": 5000,
            "hb_missed_max": 5, "io_timeout_sec": 10}


def batch(sock, timeout):
    """Calls every "[method, params]" line of stdin in order; stops at the first error."""
    r = Rpc(sock, timeout)
    for line in sys.stdin:
        if line.strip():
            method, params = json.loads(line)
            r.call(method, params)


def wait_bdevs(sock, want, timeout):
    """Waits until bdev_get_bdevs lists every name of WANT (comma-separated)."""
    deadline = time.monotonic() + float(timeout)
    want = set(want.split(","))
    r = Rpc(sock, timeout)
    r.call("framework_wait_init", timeout=timeout)
    while True:
        listed = {b["name"] for b in r.call("bdev_get_bdevs", timeout=max(deadline - time.monotonic(), 1))}
        if want <= listed:
            return
        if time.monotonic() > deadline:
            raise RpcError("%d of %d bdevs listed after %s s" % (len(want & listed), len(want), timeout))
        time.sleep(0.05)


def measure(sock, kind, n, port, nqn, sess, cpid, tpid, timeout, out):
    """The create part for one transport: see the header of bench/devices.sh."""
    n, timeout = int(n), float(timeout)
    res = {"kind": kind, "n": n, "created": 0, "error": None}
    r = Rpc(sock, 30)
    nthreads = lambda: len(r.call("thread_get_stats", timeout=30)["threads"])
    res["spdk_threads0"], res["os_threads0"] = nthreads(), status(cpid, "Threads")
    res["client_rss0"], res["target_rss0"] = rss(cpid), rss(tpid)
    want = names(kind, n)
    t0 = time.monotonic()
    deadline = t0 + timeout
    paused = 0.0
    left = lambda: deadline + paused - time.monotonic()

    def pause(secs):
        nonlocal paused
        p = time.monotonic()
        time.sleep(secs)
        v = rss(cpid)
        paused += time.monotonic() - p
        return v

    try:
        if kind in ("rtrs", "null"):
            for i in range(1, n + 1):
                if i == 2:
                    res["rss_2nd_before"] = pause(0.5)
                c = time.monotonic()
                try:
                    if kind == "rtrs":
                        r.call("bdev_rtrs_create", rtrs_params(i, "dev%d" % i, sess, port), timeout=left())
                    else:
                        r.call("bdev_null_create", {"name": "z%d" % i, "num_blocks": 262144,
                                                    "block_size": 4096}, timeout=left())
                except RpcError as e:
                    raise RpcError("bdev %d of %d, after %.2f s: %s" % (i, n, time.monotonic() - c, e))
                if i == 1:
                    res["t_1st_s"] = time.monotonic() - c
                if i == 2:
                    res["t_2nd_s"] = time.monotonic() - c
                    res["rss_2nd_after"] = pause(0.5)
                res["created"] = i
        else:
            r.call("bdev_nvme_attach_controller", {
                "name": "nvme0", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                "trsvcid": str(port), "subnqn": nqn}, timeout=left())
        res["t_calls_s"] = time.monotonic() - t0 - paused
        while True:
            listed = {b["name"] for b in r.call("bdev_get_bdevs", timeout=max(left(), 1))}
            have = sum(1 for w in want if w in listed)
            if have == n:
                break
            if left() <= 0:
                raise RpcError("%d of %d bdevs listed by bdev_get_bdevs after %.0f s" % (have, n, timeout))
            time.sleep(0.005)
        res["t_total_s"] = time.monotonic() - t0 - paused
    except (RpcError, OSError) as e:
        res["error"] = str(e)
        res["t_fail_s"] = time.monotonic() - t0 - paused
    time.sleep(1)
    try:
        if res["error"]:
            r = Rpc(sock, 30)  # the old connection may still wait for the failed call
        listed = {b["name"] for b in r.call("bdev_get_bdevs", timeout=30)}
        res["listed"] = sum(1 for w in want if w in listed)
        res["spdk_threads1"] = nthreads()
    except (RpcError, OSError) as e:
        res["error"] = (res["error"] + "; " if res["error"] else "") + "after: " + str(e)
    res["os_threads1"], res["client_rss1"], res["target_rss1"] = status(cpid, "Threads"), rss(cpid), rss(tpid)
    json.dump(res, open(out, "w"))


def delete(sock, kind, timeout):
    """Deletes the bdevs the create part made (those still listed)."""
    r = Rpc(sock, timeout)
    if kind == "nvmf":
        r.call("bdev_nvme_detach_controller", {"name": "nvme0"})
        return
    method, pattern = ("bdev_null_delete", r"z[0-9]+") if kind == "null" else ("bdev_rtrs_delete", r"r[0-9]+")
    for b in r.call("bdev_get_bdevs"):
        if re.fullmatch(pattern, b["name"]):
            r.call(method, {"name": b["name"]})


def note(path, key, value):
    try:
        res = json.load(open(path))
    except (OSError, ValueError):
        res = {}
    res[key] = None if value == "" else (int(value) if re.fullmatch(r"-?[0-9]+", value) else value)
    json.dump(res, open(path, "w"))


def fail(path, kind, n, why):
    json.dump({"kind": kind, "n": int(n), "created": 0, "error": why, "setup_failed": True}, open(path, "w"))


def mib(a, b):
    return None if a is None or b is None else (b - a) / 1024.0


def short(text, most=200):
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= most else text[:most - 1] + "…"


MEMS = {"huge": "hugepages", "nohuge": "--no-huge"}


def report(d, mode, mem, judged, *ns):
    """Per N: DIR/create-MEM-N.md (the table) and DIR/goals-MEM-N.tsv (the goals, whose
    verdicts bench/lib.sh's goal_rows gives). MODE:
    one (one sessname) or each (a sessname per bdev); MEM: huge or nohuge, the memory mode
    measured; JUDGED: the mode whose goals are judged (the others' are reported)."""
    judged = mem == judged
    on = MEMS[mem]
    how = "one sessname" if mode == "one" else "a sessname each"
    over = "over one session" if mode == "one" else "a session each"
    second = "over an existing session" if mode == "one" else "(a session of its own)"
    for n in ns:
        res = {}
        for kind in ("rtrs", "nvmf", "null"):
            try:
                res[kind] = json.load(open(os.path.join(d, "create-%s-%s-%s.json" % (mem, kind, n))))
            except (OSError, ValueError):
                res[kind] = {"kind": kind, "n": int(n), "error": "not measured", "setup_failed": True}

        def fig(x):
            failed = bool(x.get("error"))
            v = {
                "time": x.get("t_total_s"),
                "crss": mib(x.get("client_rss0"), x.get("client_rss1")),
                "trss1": mib(x.get("target_rss0"), x.get("target_rss1")),
                "trss2": mib(x.get("target_rss0"), x.get("target_rss_left")),
                "thr": None if x.get("spdk_threads1") is None else x["spdk_threads1"] - x["spdk_threads0"],
                "os": None if x.get("os_threads1") is None or x.get("os_threads0") is None else x["os_threads1"] - x["os_threads0"],
                "t2": x.get("t_2nd_s"),
                "r2": mib(x.get("rss_2nd_before"), x.get("rss_2nd_after")),
            }
            return failed, v

        def cell(x, key):
            failed, v = fig(x)
            if x.get("setup_failed"):
                return "not measured" if key != "time" else "FAILED: %s" % short(x.get("error", ""))
            part = " (%d of %s bdevs)" % (x.get("listed", x.get("created", 0)), n) if failed else ""
            val = v[key]
            if key == "time":
                if failed:
                    return "FAILED after %.2f s, %d of %s bdevs made: %s" % (
                        x.get("t_fail_s", 0), x.get("listed", x.get("created", 0)), n, short(x["error"]))
                return "%.3f s" % val
            if val is None:
                return "—"
            if key == "trss2":
                return "%+.1f MiB (%+.1f MiB right after create)%s" % (val, v["trss1"] if v["trss1"] is not None else float("nan"), part)
            if key in ("crss", "trss1", "r2"):
                return "%+.1f MiB%s" % (val, part if key != "r2" else "")
            if key in ("thr", "os"):
                return "%+d%s" % (val, part)
            if key == "t2":
                return "%.1f ms" % (val * 1000)
            return str(val)

        rows = [("time to create", "time"), ("client memory added (VmRSS + HugetlbPages)", "crss"),
                ("target memory added (after the client left)", "trss2"),
                ("SPDK threads added", "thr"), ("OS threads added (/proc Threads)", "os"),
                ("second device %s: time of the 2nd create" % second, "t2"),
                ("second device %s: client memory added by it" % second, "r2")]
        with open(os.path.join(d, "create-%s-%s.md" % (mem, n)), "w") as f:
            f.write("| %s remote bdevs in one SPDK app, %s | rtrs (%s × bdev_rtrs_create, %s) | NVMe-oF/TCP (one attach) | %s local null bdevs (%s × bdev_null_create) |\n" % (n, on, n, how, n, n))
            f.write("|---|---:|---:|---:|\n")
            for label, key in rows:
                nv = "n/a (one attach makes all)" if key in ("t2", "r2") else cell(res["nvmf"], key)
                nl = "—" if key in ("trss2",) else cell(res["null"], key)
                f.write("| %s | %s | %s | %s |\n" % (label, cell(res["rtrs"], key), nv, nl))
        x = res["rtrs"]
        failed, v = fig(x)
        why = " (failed: %d of %s made)" % (x.get("listed", x.get("created", 0)), n) if failed else ""
        fmt = lambda val, f: (f % val) if val is not None else "n/a"
        goals = [
            ("%s rtrs bdevs %s, %s: time to create all (s)%s" % (n, over, on, why), fmt(v["time"], "%.3f"), "<=", 1, failed),
            ("%s rtrs bdevs, %s: client memory added (MiB)%s" % (n, on, why), fmt(v["crss"], "%.1f"), "<=", 16, failed),
            ("%s rtrs bdevs, %s: target memory added, after the client left (MiB; %s right after create)%s" % (n, on, fmt(v["trss1"], "%.1f"), why), fmt(v["trss2"], "%.1f"), "<=", 80, failed),
            ("%s rtrs bdevs, %s: SPDK threads added in the client (none per bdev)%s" % (n, on, why), fmt(v["thr"], "%d"), "<=", 1, failed),
            ("%s rtrs bdevs, %s: 2nd create%s (ms)" % (n, on, " over an existing session" if mode == "one" else ", its own session"), fmt(None if v["t2"] is None else v["t2"] * 1000, "%.1f"), "<=", 50, v["t2"] is None),
            ("%s rtrs bdevs, %s: client memory added by the 2nd create (MiB)" % (n, on), fmt(v["r2"], "%.1f"), "<=", 1, v["r2"] is None),
        ]
        # What SPDK's bdev layer costs for any bdev made one RPC at a time (each examine
        # opens and closes the thread's bdev channels, whose iobuf caches then take fresh
        # buffers of the pool: docs/BENCHMARKS.md), measured in the same run with null bdevs.
        nfailed, nv = fig(res["null"])
        above = lambda a, b: None if a is None or b is None else a - b
        goals += [
            ("%s rtrs bdevs, %s: client memory added above %s local null bdevs made the same way (MiB; those added %s)%s" % (n, on, n, fmt(nv["crss"], "%+.1f"), why),
             fmt(above(v["crss"], nv["crss"]), "%.1f"), "<=", 16, failed or nfailed),
            ("%s rtrs bdevs, %s: client memory added by the 2nd create above a 2nd null bdev's (MiB; that added %s)" % (n, on, fmt(nv["r2"], "%+.1f")),
             fmt(above(v["r2"], nv["r2"]), "%.1f"), "<=", 1, v["r2"] is None or nv["r2"] is None),
        ]
        with open(os.path.join(d, "goals-%s-%s.tsv" % (mem, n)), "w") as f:
            for text, val, op, goal, bad in goals:
                f.write("%s\t%s\t%s\t%s\t%d\t%d\n" % (text.replace("\t", " "), val, op, goal, bad, judged))


cmds = {"batch": batch, "wait-bdevs": wait_bdevs, "measure": measure, "delete": delete,
        "note": note, "fail": fail, "report": report, "mem": mem}
try:
    cmds[sys.argv[1]](*sys.argv[2:])
except RpcError as e:
    sys.exit("%s: %s" % (sys.argv[1], e))
PY
dev() { python3 "$DEV_PY" "$@"; }

# target_start NAME N [nvmf]: spdk_tgt on core 0 with null bdevs dev1..devN exported over
# RTRS, and with nvmf as the N namespaces of subsystem $NQN over NVMe-oF/TCP.
target_start() {
	local name=$1 n=$2 i
	app_start "$name" "$SPDK_TGT" -m 0x1 "${MEM[@]}" || return 1
	{
		for ((i = 1; i <= n; i++)); do
			echo "[\"bdev_null_create\", {\"name\": \"dev$i\", \"num_blocks\": 262144, \"block_size\": 4096}]"
		done
		echo "[\"rtrs_target_listen\", {\"transport\": \"tcp\", \"addr\": \"127.0.0.1\", \"port\": $RTRS_PORT}]"
		for ((i = 1; i <= n; i++)); do
			echo "[\"rtrs_target_export\", {\"bdev_name\": \"dev$i\", \"access\": \"rw\"}]"
		done
		if [[ ${3:-} == nvmf ]]; then
			echo '["nvmf_create_transport", {"trtype": "TCP"}]'
			echo "[\"nvmf_create_subsystem\", {\"nqn\": \"$NQN\", \"serial_number\": \"RTRSDEVICES0001\", \"allow_any_host\": true, \"max_namespaces\": $n}]"
			for ((i = 1; i <= n; i++)); do
				echo "[\"nvmf_subsystem_add_ns\", {\"nqn\": \"$NQN\", \"namespace\": {\"bdev_name\": \"dev$i\"}}]"
			done
			echo "[\"nvmf_subsystem_add_listener\", {\"nqn\": \"$NQN\", \"listen_address\": {\"trtype\": \"tcp\", \"adrfam\": \"ipv4\", \"traddr\": \"127.0.0.1\", \"trsvcid\": \"$NVMF_PORT\"}}]"
		fi
	} | dev batch "$APP_DIR/$name.sock" 30 || { echo "$name: configuring $n exports failed" >&2; return 1; }
	[[ -n ${SPDK_VERSION:-} ]] ||
		SPDK_VERSION=$(rpc "$name" spdk_get_version | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
}

# create_run N KIND MEM: the create part for one N, one kind (rtrs, nvmf or null) and one
# memory mode (MEM set by mem_mode); leaves $APP_DIR/create-MEM-KIND-N.json, whatever happens.
create_run() {
	local n=$1 kind=$2 js="$APP_DIR/create-$3-$2-$1.json" port=$NVMF_PORT
	[[ $kind == nvmf ]] || port=$RTRS_PORT
	if ! target_start tgt "$n" nvmf; then
		dev fail "$js" "$kind" "$n" "the target did not start or configure (log: $(tail -n 3 "$APP_DIR/tgt.log" | tr '\n|' ' /'))"
		app_stop tgt
		return 1
	fi
	if ! app_start clt "$SPDK_TGT" -m "$CLIENT_MASK" "${CLIENT_MAIN[@]}" "${MEM[@]}"; then
		dev fail "$js" "$kind" "$n" "the client did not start"
		app_stop clt
		app_stop tgt
		return 1
	fi
	sleep 1
	dev measure "$APP_DIR/clt.sock" "$kind" "$n" "$port" "$NQN" "$SESS" "$(app_pid clt)" "$(app_pid tgt)" \
		"$CREATE_TIMEOUT" "$js" || dev fail "$js" "$kind" "$n" "measuring failed (client log: $(tail -n 3 "$APP_DIR/clt.log" | tr '\n|' ' /'))"
	app_alive clt && { dev delete "$APP_DIR/clt.sock" "$kind" 60 || echo "   $kind: deleting the bdevs failed" >&2; }
	app_stop clt
	sleep 2
	dev note "$js" target_rss_left "$(dev mem "$(app_pid tgt)")"
	app_alive tgt || dev note "$js" error "the target exited (log: $(tail -n 3 "$APP_DIR/tgt.log" | tr '\n|' ' /'))"
	app_stop tgt
}

# ---- create: N remote bdevs, rtrs against NVMe-oF/TCP ---------------------------------------
# create_print JSON: one line of what a create run measured.
create_print() {
	python3 - "$1" <<'PY'
import json, sys
x = json.load(open(sys.argv[1]))
mib = lambda a, b: "%+.1f MiB" % ((x[b] - x[a]) / 1024.0) if x.get(a) is not None and x.get(b) is not None else "n/a"
if x.get("error"):
    print("   FAILED: %s" % x["error"])
if not x.get("setup_failed"):
    t = x.get("t_total_s")
    print("   %s: %s; client memory %s, SPDK threads %s -> %s; target memory %s right after, %s after the client left%s" % (
        x["kind"], "%.3f s" % t if t is not None else "%d made in %.2f s" % (x.get("created", 0), x.get("t_fail_s", 0)),
        mib("client_rss0", "client_rss1"), x.get("spdk_threads0"), x.get("spdk_threads1"),
        mib("target_rss0", "target_rss1"), mib("target_rss0", "target_rss_left"),
        "; 2nd create %.1f ms, %s" % (x["t_2nd_s"] * 1000, mib("rss_2nd_before", "rss_2nd_after")) if x.get("t_2nd_s") is not None else ""))
if x.get("t_calls_s") is not None:
    print("   the calls took %.3f s%s, the rest waiting until bdev_get_bdevs listed all" % (
        x["t_calls_s"], "" if x.get("t_1st_s") is None else " (the 1st create %.1f ms)" % (x["t_1st_s"] * 1000)))
PY
}

if want create; then
	for m in "${MEM_MODES[@]}"; do
		if ! mem_mode "$m"; then
			for n in "${NS[@]}"; do
				for kind in rtrs nvmf null; do
					dev fail "$APP_DIR/create-$m-$kind-$n.json" "$kind" "$n" "no hugepages could be reserved"
				done
			done
		else
			for n in "${NS[@]}"; do
				for kind in rtrs nvmf null; do
					echo "== create ($m): $n $kind bdevs from a client spdk_tgt (mask $CLIENT_MASK; target on core 0)"
					create_run "$n" "$kind" "$m"
					create_print "$APP_DIR/create-$m-$kind-$n.json"
				done
			done
		fi
		dev report "$APP_DIR" "$SESSNAMES" "$m" "$JUDGED" "${NS[@]}"
	done
fi

# ---- iops: one core's IO over 1 bdev vs over 16 bdevs of one session ------------------------
# bp_config NAME COUNT QD_EACH: bdevperf's JSON config (COUNT rtrs bdevs r1.., one
# sessname) and job file (one job per bdev on core 1, 4 KiB randread, QD_EACH deep).
bp_config() {
	local name=$1 count=$2 qd=$3 i
	python3 - "$count" "$RTRS_PORT" "$SESS-iops" >"$APP_DIR/$name.json" <<'PY'
import json, sys
n, port, sess = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = [{"method": "bdev_rtrs_create", "params": {
    "name": "r%d" % i, "sessname": sess.replace("{i}", str(i)), "device": "dev%d" % i, "access_mode": "rw",
    "paths": [{"transport": "tcp", "dst_addr": "127.0.0.1", "port": port}],
    "reconnect_delay_sec": 1, "hb_interval_ms": 5000, "hb_missed_max": 5, "io_timeout_sec": 10}}
       for i in range(1, n + 1)]
cfg.append({"method": "bdev_wait_for_examine"})
print(json.dumps({"subsystems": [{"subsystem": "bdev", "config": cfg}]}, indent=1))
PY
	bp_jobs "$name" "$count" "$qd" r
}

# bp_config_nvmf NAME COUNT QD: the same over one NVMe-oF/TCP controller of the target's
# subsystem (its namespaces nvn1.. as bdevs), the peer measured in the same run.
bp_config_nvmf() {
	local name=$1 count=$2 qd=$3
	python3 - "$NVMF_PORT" "$NQN" >"$APP_DIR/$name.json" <<'PY'
import json, sys
port, nqn = sys.argv[1], sys.argv[2]
cfg = [{"method": "bdev_nvme_attach_controller", "params": {
    "name": "nv", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port,
    "subnqn": nqn}}, {"method": "bdev_wait_for_examine"}]
print(json.dumps({"subsystems": [{"subsystem": "bdev", "config": cfg}]}, indent=1))
PY
	bp_jobs "$name" "$count" "$qd" nvn
}

# bp_jobs NAME COUNT QD PREFIX: bdevperf's job file, one job per bdev PREFIX1.., on core 1.
bp_jobs() {
	local name=$1 count=$2 qd=$3 prefix=$4 i
	{
		printf '[global]\nrw=randread\nbs=4096\ncpumask=0x2\n'
		for ((i = 1; i <= count; i++)); do
			printf '\n[job%d]\nfilename=%s%d\niodepth=%d\n' "$i" "$prefix" "$i" "$qd"
		done
	} >"$APP_DIR/$name.job"
}

# iops_once NAME COUNT K: one bdevperf on core 1 with config NAME, one run; prints
# "IOPS MiB/s avg-µs failed p99-µs", or on failure writes why to $APP_DIR/iops.err.
iops_once() {
	local name=$1 count=$2 k=$3 prefix=${4:-r} bp="bp-$1-$3" i want r
	app_start "$bp" "$BDEVPERF" -m 0x2 "${MEM[@]}" --json "$APP_DIR/$name.json" -j "$APP_DIR/$name.job" \
		-z -q "$QD" -o 4096 -w randread -t "$TIME" || { iops_err "$bp" "bdevperf with $count rtrs bdev(s) did not start"; return 1; }
	want=$(for ((i = 1; i <= count; i++)); do printf '%s%d,' "$prefix" "$i"; done)
	dev wait-bdevs "$APP_DIR/$bp.sock" "${want%,}" 60 || {
		echo "$name: the rtrs bdevs did not come up; log:" >&2
		tail -n 20 "$APP_DIR/$bp.log" >&2
		iops_err "$bp" "the $count rtrs bdevs did not come up"
		app_stop "$bp"
		return 1
	}
	r=$(python3 "$BDEVPERF_PY" -s "$APP_DIR/$bp.sock" -t $((TIME + 60)) perform_tests >"$APP_DIR/$bp.out" &&
		"${REPORT[@]}" bdevperf "$APP_DIR/$bp.out") || {
		echo "$name: perform_tests failed; log:" >&2
		tail -n 20 "$APP_DIR/$bp.log" >&2
		iops_err "$bp" "perform_tests over $count rtrs bdev(s) failed"
		app_stop "$bp"
		return 1
	}
	app_stop "$bp"
	echo "$r"
}

# iops_err APP WHAT: WHAT and the first error line of APP's log, for the report.
iops_err() {
	local why
	why=$(grep -m1 -E '\*ERROR\*|"message"' "$APP_DIR/$1.log" 2>/dev/null | sed 's/^.*\*ERROR\*: //; s/^ *"message": //')
	echo "$2${why:+: $why}" | tr '|' '/' | cut -c1-300 >"$APP_DIR/iops.err"
}

IOPS_OK=0
if [[ $SESSNAMES == one ]]; then MANY="one sessname"; else MANY="a sessname each"; fi
if want iops; then
	mem_mode "$JUDGED"
	echo "== iops ($JUDGED): bdevperf on core 1, 4 KiB randread: 1 rtrs bdev at QD$QD vs $NMANY bdevs ($MANY) at QD$((QD / NMANY)) each; $ROUNDS rounds"
	if ! target_start tgt $NMANY nvmf; then
		echo "the target did not start or configure" >"$APP_DIR/iops.err"
	else
		bp_config one 1 "$QD"
		bp_config many $NMANY $((QD / NMANY))
		bp_config_nvmf none 1 "$QD"
		bp_config_nvmf nmany $NMANY $((QD / NMANY))
		ra=() rb=() rr=() nr=()
		IOPS_OK=1
		for ((k = 1; k <= ROUNDS; k++)); do
			if ((k % 2)); then
				a=$(iops_once one 1 "$k") || { IOPS_OK=0; break; }
				b=$(iops_once many $NMANY "$k") || { IOPS_OK=0; break; }
			else
				b=$(iops_once many $NMANY "$k") || { IOPS_OK=0; break; }
				a=$(iops_once one 1 "$k") || { IOPS_OK=0; break; }
			fi
			ra+=("$a") rb+=("$b") rr+=("$("${REPORT[@]}" ratio "${b%% *}" "${a%% *}")")
			echo "   round $k: (i) 1 bdev $a; (ii) $NMANY bdevs $b; ratio (ii)/(i) ${rr[-1]} (IOPS MiB/s avg-µs failed p99-µs)"
			# The peer, under the same split: NVMe-oF/TCP, one namespace vs NMANY of one
			# controller (each of bdevperf's job threads has a qpair of its own).
			na=$(iops_once none 1 "$k" nvn) && nb=$(iops_once nmany $NMANY "$k" nvn) &&
				nr+=("$("${REPORT[@]}" ratio "${nb%% *}" "${na%% *}")") &&
				echo "   round $k, NVMe-oF/TCP: 1 namespace $na; $NMANY namespaces $nb; ratio ${nr[-1]}"
		done
		app_stop tgt
	fi
	[[ $IOPS_OK == 1 ]] || echo "   iops: FAILED (see above)" >&2
fi

# ---- tables, goals ---------------------------------------------------------------------------
GOALS=() # goal TEXT VALUE OP TARGET (bench/lib.sh) adds to it
if want iops; then
	if [[ $IOPS_OK == 1 ]]; then
		med=$("${REPORT[@]}" median "${rr[@]}")
		picked=$("${REPORT[@]}" median-index "${rr[@]}")
		goal "IOPS over $NMANY rtrs bdevs, $MANY (QD$((QD / NMANY)) each) / over 1 rtrs bdev (QD$QD), bdevperf on one core, 4 KiB randread (median of $ROUNDS rounds: $(printf '%.0f' "${rb[$picked]%% *}") / $(printf '%.0f' "${ra[$picked]%% *}"))" \
			"$(printf '%.2f' "$med")" ">=" 0.90
		if [[ ${#nr[@]} -gt 0 ]]; then
			GOALS+=("| the peer under the same split: IOPS over $NMANY NVMe-oF/TCP namespaces of one controller / over 1 (median of ${#nr[@]} rounds: ${nr[*]}) | $(printf '%.2f' "$("${REPORT[@]}" median "${nr[@]}")") | — | (reported) |")
		fi
		{
			echo "| round | (i) 1 rtrs bdev, QD$QD: IOPS | (ii) $NMANY rtrs bdevs, $MANY, QD$((QD / NMANY)) each: IOPS | (ii) / (i) | avg µs (i); (ii) | failed IO (i); (ii) |"
			echo "|---:|---:|---:|---:|---:|---|"
			for ((k = 0; k < ${#rr[@]}; k++)); do
				read -r ai _ al af _ <<<"${ra[$k]}"
				read -r bi _ bl bf _ <<<"${rb[$k]}"
				echo "| $((k + 1)) | $ai | $bi | ${rr[$k]} | $al; $bl | $af; $bf |"
			done
		} >"$APP_DIR/iops.md"
	else
		GOALS+=("| IOPS over $NMANY rtrs bdevs, $MANY / over 1 rtrs bdev, bdevperf on one core | failed: $(cat "$APP_DIR/iops.err" 2>/dev/null) | >= 0.90 | MISS |")
	fi
fi

{
	echo "### $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $SPDK_VERSION"
	echo
	cmd="bench/devices.sh"
	want create && cmd+=" --devices $DEVICES --create-timeout $CREATE_TIMEOUT"
	cmd+=" --sessnames $SESSNAMES --client-mask $CLIENT_MASK --mem $MEMS"
	want iops && cmd+=" --time $TIME --rounds $ROUNDS --qd $QD"
	cmd+=" --only $ONLY"
	echo "Command: \`$cmd\`; load average before the run: $LOAD0, after: $(cut -d" " -f1-3 /proc/loadavg)."
	echo
	if want create && [[ ${#MEM_MODES[@]} -gt 1 ]]; then
		[[ $JUDGED == huge ]] && j="with hugepages" || j="with --no-huge"
		echo "The goals are judged $j (the iops part ran so too); the other mode's rows say \"(reported: ...)\"."
		echo
	fi
	echo "| goal | measured | target | result |"
	echo "|---|---:|---:|---|"
	if want create; then
		for m in "${MEM_MODES[@]}"; do
			for n in "${NS[@]}"; do goal_rows "$APP_DIR/goals-$m-$n.tsv"; done
		done
	fi
	[[ ${#GOALS[@]} -gt 0 ]] && printf '%s\n' "${GOALS[@]}"
	if want create; then
		for m in "${MEM_MODES[@]}"; do
			for n in "${NS[@]}"; do
				echo
				cat "$APP_DIR/create-$m-$n.md"
			done
		done
	fi
	[[ -s "$APP_DIR/iops.md" ]] && { echo; cat "$APP_DIR/iops.md"; }
} >"$OUT"
echo
cat "$OUT"

if [[ $APPEND -eq 1 ]]; then
	cat >"$APP_DIR/intro.md" <<'EOF'
`bench/devices.sh [--devices 16,64] [--time S] [--rounds R] [--qd Q] [--mem huge,nohuge]`
(method in its header): a client spdk_tgt makes N remote bdevs of a target spdk_tgt (core
0), as N `bdev_rtrs_create` with one sessname and path, as one `bdev_nvme_attach_controller`
to N namespaces, and as N local `bdev_null_create` (fresh processes each time, on hugepages
and with --no-huge): time until all are listed, memory (VmRSS + HugetlbPages) and SPDK
threads added. Then bdevperf on one core: 16 rtrs bdevs of one session at QD Q/16 each vs
one at QD Q.
EOF
	"${REPORT[@]}" append docs/BENCHMARKS.md "## SPDK: many devices over one session" "$APP_DIR/intro.md" "$OUT"
	echo "appended to docs/BENCHMARKS.md"
fi
