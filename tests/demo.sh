#!/usr/bin/env bash
# make demo: a broker of its own with 4 fake devices in a temp dir, three
# contending npurun commands queued and served in order, tasks, then stop.
# It runs as whoever runs make demo; as root it is told --cgroup off, so
# that it touches none of the machine's control groups (nor a real
# broker's tasks), as the tests' brokers do.
set -euo pipefail
bin=$(cd "${1:-bin}" && pwd)
dir=$(mktemp -d -t npurun-demo.XXXXXX)
broker_pid=
cleanup() {
	[ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT

# The fake vendor serves lock files only: no device nodes. A broker on a
# tree of nodes made with mknod (as the tests have) names it in [devices]
# dev_dir, and npurun docker run (podman run) gives a container that tree's
# nodes only where NPURUN_DEV_DIR names it too (npurun(1), npurun.conf(5)).
cat >"$dir/npurun.conf" <<'CONF'
[devices]
vendor = "fake"   # ascend | nvidia | fake | auto
ids = "0-3"       # the devices this broker manages
CONF

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

cgroup=()
[ "$(id -u)" = 0 ] && cgroup=(--cgroup off)
say "start a broker of its own with 4 fake devices, as $(id -un)"
echo "\$ npubroker serve --config $dir/npurun.conf --run-dir $dir/run --state-dir $dir/spool ${cgroup[*]} &"
"$bin/npubroker" serve --config "$dir/npurun.conf" --run-dir "$dir/run" --state-dir "$dir/spool" "${cgroup[@]}" 2>"$dir/broker.log" &
broker_pid=$!
export NPURUN_SOCKET=$dir/run/broker.sock
# Wait for the broker's "serving" line: an event, not a guess.
for _ in $(seq 100); do
	grep -q serving "$dir/broker.log" 2>/dev/null && break
	kill -0 "$broker_pid" 2>/dev/null || { cat "$dir/broker.log"; exit 1; }
	sleep 0.05
done
cat "$dir/broker.log"

say "one job: a free device at once, its variables set"
echo '$ npurun sh -c '\''echo "NPURUN_DEVICES=$NPURUN_DEVICES ASCEND_RT_VISIBLE_DEVICES=$ASCEND_RT_VISIBLE_DEVICES"'\'''
"$bin/npurun" sh -c 'echo "NPURUN_DEVICES=$NPURUN_DEVICES ASCEND_RT_VISIBLE_DEVICES=$ASCEND_RT_VISIBLE_DEVICES"'

say "three jobs that each want all 4 devices: queued, served in order"
job() {
	"$bin/npurun" -v -n 4 sh -c "echo \"job $1 starts on npu \$NPURUN_DEVICES at \$(date +%T.%3N)\"; sleep 1; echo \"job $1 done\"" 2>&1 | sed "s/^/[job $1] /"
}
job A &
a=$!
sleep 0.2
job B &
b=$!
sleep 0.2
job C &
c=$!
wait $a $b $c

say "nothing free and --no-wait: exit status 75"
"$bin/npurun" -n 4 sleep 1 &
busy=$!
sleep 0.2
set +e
echo '$ npurun --no-wait true'
"$bin/npurun" --no-wait true
echo "exit status $?"
wait $busy
echo '$ npurun -n 5 true'
"$bin/npurun" -n 5 true
echo "exit status $? (more than the pool has: denied)"
set -e

say "kill -9 of a holder releases its device at once"
"$bin/npurun" -d 2 sleep 60 &
holder=$!
sleep 0.2
kill -9 $holder
wait $holder 2>/dev/null || true
"$bin/npurun" -v -d 2 --timeout 5s sh -c 'echo "npu $NPURUN_DEVICES is ours again"'

say "detached tasks: queued, run as their submitter when devices free, logs and exit status kept"
ts() { echo "\$ task-submit $*"; "$bin/task-submit" "$@"; }
ts -n 4 --name sweep-1 --log "$dir/t1.log" --run 'echo "sweep 1 on npu $NPURUN_DEVICES"; sleep 1'
ts -n 2 --name sweep-2 --log "$dir/t2.log" --run 'echo "sweep 2 on npu $NPURUN_DEVICES"; exit 3'
ts --after 2 --name eval --log "$dir/t3.log" --run 'echo never runs: its dependency failed'
ts list
set +e
ts wait 2
echo "exit status $? (the task's own)"
set -e
ts list
echo "\$ cat $dir/t1.log"
"$bin/task-submit" wait 1
cat "$dir/t1.log"

say "stop the broker"
kill "$broker_pid"
wait "$broker_pid" 2>/dev/null || true
broker_pid=
echo "done"
