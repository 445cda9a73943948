# shellcheck shell=bash
# Helpers the bench scripts share; sourced, not run. The goal rows and their verdicts of
# bench/devices.sh and bench/spdk_vs_nvmf.sh, and field() of bench/rtrs.sh and
# bench/tcp_profile.sh: a field of rtrs-bench's one-line JSON output.

# verdict VALUE TARGET OP: PASS when VALUE OP TARGET holds (OP ">=", else "<="), MISS when
# not, n/a when either is not a number.
verdict() { python3 -c '
import sys
try:
    v, g = float(sys.argv[1]), float(sys.argv[2])
except ValueError:
    print("n/a")
else:
    print("PASS" if (v >= g if sys.argv[3] == ">=" else v <= g) else "MISS")' "$@"; }

# goal TEXT VALUE OP TARGET [AIM]: appends the row of a goal to the caller's GOALS array,
# PASS/MISS from the measure (AIM, when given, is shown beside the target).
goal() {
	GOALS+=("| $1 | $2 | $3 $4${5:+ (aim $5)} | $(verdict "$2" "$4" "$3") |")
}

# field LINE NAME: the value of "NAME" in LINE, a one-line JSON object (rtrs-bench --json).
field() { sed -E "s/.*\"$2\":\"?([^,\"}]*).*/\1/" <<<"$1"; }
