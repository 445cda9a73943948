# shellcheck shell=bash
# Helpers the bench scripts share; sourced, not run. The goal rows and their verdicts of
# bench/devices.sh and bench/spdk_vs_nvmf.sh, and field() of bench/rtrs.sh and
# bench/tcp_profile.sh: a field of rtrs-bench's one-line JSON output.

# verdict VALUE TARGET OP [FAILED]: PASS when VALUE OP TARGET holds (OP ">=", else "<="),
# MISS when not or when FAILED is 1 (the measure's run failed), n/a when either is not a
# number.
verdict() { python3 -c '
import sys
try:
    v, g = float(sys.argv[1]), float(sys.argv[2])
except ValueError:
    v = None
if sys.argv[4:5] == ["1"]:
    print("MISS")
elif v is None:
    print("n/a")
else:
    print("PASS" if (v >= g if sys.argv[3] == ">=" else v <= g) else "MISS")' "$@"; }

# goal TEXT VALUE OP TARGET [AIM]: appends the row of a goal to the caller's GOALS array,
# PASS/MISS from the measure (AIM, when given, is shown beside the target).
goal() {
	GOALS+=("| $1 | $2 | $3 $4${5:+ (aim $5)} | $(verdict "$2" "$4" "$3") |")
}

# goal_rows FILE: the goal rows of FILE's lines (TEXT, VALUE, OP, TARGET, FAILED 0/1,
# JUDGED 0/1, tab-separated); a goal not judged shows its verdict as "(reported: ...)".
goal_rows() {
	local text val op target failed judged res
	while IFS=$'\t' read -r text val op target failed judged; do
		res=$(verdict "$val" "$target" "$op" "$failed")
		[[ $judged == 1 ]] || res="(reported: $res)"
		echo "| $text | $val | $op $target | $res |"
	done <"$1"
}

# field LINE NAME: the value of "NAME" in LINE, a one-line JSON object (rtrs-bench --json).
field() { sed -E "s/.*\"$2\":\"?([^,\"}]*).*/\1/" <<<"$1"; }
