# shellcheck shell=bash
# Scenario exit, sourced by ci/spdk-test.sh (run it alone: ci/spdk-test.sh exit).
#
# Exit on two cores, each case EXIT_TRIES times (3; the fault this guards against was
# a race): an application with the plugin exits within 10 s with status 0 and no line
# of EXIT_BAD in its log. spdk_tgt with an idle rtrs bdev, by SIGINT and by the
# spdk_kill_instance RPC; bdevperf under IO, and spdk_tgt right after a failed
# bdev_rtrs_create (a port nothing listens on, or a device the target does not export),
# by SIGINT in odd tries and by spdk_kill_instance in even ones; at the end the target
# that served them all, by SIGINT.

# Lines saying that a stop went wrong: a message to a thread SPDK had already ended, a
# disk's core out of reach, a thread the application had to end itself.
EXIT_BAD='marked as exited|could not reach core|could not stop core|could not post the|was not called on thread|exited state forcefully'

# exit_within NAME HOW : stops application NAME by HOW (SIGINT, or kill_instance: the
# spdk_kill_instance RPC sending SIGINT) and checks that it exits within 10 s with
# status 0 and no line of EXIT_BAD in its log. Prints how long it took.
exit_within() {
	local name=$1 how=$2 pid t0 st
	pid=$(app_pid "$name") || { echo "$name is not running"; return 1; }
	t0=$(date +%s%N)
	case $how in
	SIGINT) kill -INT "$pid" ;;
	kill_instance) rpc "$name" spdk_kill_instance SIGINT >/dev/null 2>&1 ||
		{ echo "   $name: spdk_kill_instance failed"; return 1; } ;;
	esac
	if ! app_wait "$name" 10; then
		echo "   $name ($how): still running 10 s later; its log ends:"
		tail -n 5 "$APP_DIR/$name.log" | sed 's/^/     /'
		return 1
	fi
	st=$APP_STATUS
	echo "   $name ($how): exit status $st after $((($(date +%s%N) - t0) / 1000000)) ms"
	if grep -Eq "$EXIT_BAD" "$APP_DIR/$name.log"; then
		echo "   $name's log says its stop went wrong:"
		grep -E "$EXIT_BAD" "$APP_DIR/$name.log" | head -n 5 | sed 's/^/     /'
		return 1
	fi
	[[ $st -eq 0 ]]
}

# Waits (at most 30 s) until bdev $2 of application $1 has completed writes: the verify
# workload runs (its reads could be the examine's, done before the workload starts).
io_flowing() {
	local i
	for ((i = 0; i < 300; i++)); do
		rpc "$1" bdev_get_iostat -b "$2" 2>/dev/null | python3 "$REPO/ci/spdk/bdev_io_done.py" && return 0
		sleep 0.1
	done
	return 1
}

scenario_exit() {
	local port=$((PB + 16)) none=$((PB + 17)) i how perf alt
	start_target tgt $port || return 1
	for ((i = 1; i <= ${EXIT_TRIES:-3}; i++)); do
		echo "   try $i"
		if ((i % 2)); then alt=SIGINT; else alt=kill_instance; fi
		for how in SIGINT kill_instance; do
			app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
			rpc clt bdev_rtrs_create -b rtrs0 -n exit-sess -d malloc0 -p tcp:127.0.0.1:$port \
				-D 1 -t 10 >/dev/null || return 1
			sleep 1
			exit_within clt $how || return 1
		done
		start_bdevperf bpexit $port '' -q 32 -o 4096 -w verify -t 60 || return 1
		bdevperf_perform bpexit 60 >/dev/null 2>&1 &
		perf=$!
		io_flowing bpexit rtrs0 || { echo "   no write completed on rtrs0 within 30 s"; return 1; }
		exit_within bpexit $alt || return 1
		wait "$perf"
		app_start clt "$SPDK_TGT" -m "$CLT_MASK" "${MEM[@]}" || return 1
		if ((i % 2)); then
			rpc clt bdev_rtrs_create -b rtrs0 -n exit-sess -d malloc0 -p tcp:127.0.0.1:$none \
				-D 1 -t 1 >/dev/null 2>&1 && { echo "   bdev_rtrs_create to port $none succeeded"; return 1; }
		else
			rpc clt bdev_rtrs_create -b rtrs0 -n exit-sess -d no-such-export -p tcp:127.0.0.1:$port \
				-D 1 -t 1 >/dev/null 2>&1 && { echo "   bdev_rtrs_create of no-such-export succeeded"; return 1; }
		fi
		exit_within clt $alt || return 1
	done
	exit_within tgt SIGINT
}
