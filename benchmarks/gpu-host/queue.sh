#!/usr/bin/env bash
# Keep a warm GPU host busy across device calls: a queue of steps that runs on in its own
# process session (setsid) after the call that started it returns, while later calls wait
# on it and bring its logs back. A machine is given back about 30 s after a call ends, so
# the calls must follow each other; the steps run back to back with no gap for the model.
#   bash benchmarks/gpu-host/queue.sh start 'STEP' ['STEP' ...]   each STEP a shell command
#   bash benchmarks/gpu-host/queue.sh wait SECONDS                 until the queue ends or
#                                                                  SECONDS pass; logs -> $OUT
# Each step runs with OUT=/tmp/q/NN (its own files) and its output in /tmp/q/NN.log; the
# host is sampled by watch-host.sh the whole time (/tmp/q/host.log). `wait` puts
# /tmp/q as q.tgz under $OUT and prints each step's state and the last lines of the running one.
set -u
q=/tmp/q
here=$(cd "$(dirname "$0")" && pwd)
case ${1:?start|wait} in
  start)
    shift
    mkdir -p "$q"
    n=$(ls "$q"/*.cmd 2>/dev/null | wc -l)
    for step in "$@"; do
      n=$((n + 1)); printf '%s\n' "$step" > "$q/$(printf %02d $n).cmd"
    done
    [ -e "$q/runner.pid" ] && kill -0 "$(cat "$q/runner.pid")" 2>/dev/null && { echo "queue: runner already running, steps appended"; exit 0; }
    setsid bash -c '
      q='"$q"'; here='"$here"'
      echo $$ > "$q/runner.pid"
      bash "$here/watch-host.sh" start "$q/host.log" 2
      while :; do
        next=""
        for c in "$q"/*.cmd; do [ -e "${c%.cmd}.rc" ] || { next=$c; break; }; done
        [ -n "$next" ] || break
        s=${next%.cmd}; mkdir -p "$s"
        echo "$(date +%T) start" > "$s.log"
        ( cd "'"$PWD"'" && OUT=$s bash -c "$(cat "$next")" ) >> "$s.log" 2>&1
        rc=$?; echo "$(date +%T) exit $rc" >> "$s.log"; echo $rc > "$s.rc"
      done
      bash "$here/watch-host.sh" stop "$q/host.log" > "$q/host-summary.txt" 2>&1
      rm -f "$q/runner.pid"
    ' > "$q/runner.log" 2>&1 < /dev/null &
    sleep 1; echo "queue: started with $n steps"
    ;;
  wait)
    limit=${2:-500}; t0=$(date +%s)
    while [ -e "$q/runner.pid" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 5; done
    for c in "$q"/*.cmd; do
      s=${c%.cmd}
      if [ -e "$s.rc" ]; then st="exit $(cat "$s.rc")"; elif [ -e "$s.log" ]; then st=running; else st=waiting; fi
      printf '%s %-10s %s\n' "$(basename "$s")" "$st" "$(head -c 110 "$c")"
    done
    [ -e "$q/host-summary.txt" ] && cat "$q/host-summary.txt"
    tar czf "${OUT:-/tmp}/q.tgz" -C /tmp q 2>/dev/null
    for s in "$q"/[0-9][0-9].log; do
      [ -e "${s%.log}.rc" ] && continue
      echo "--- running: $(basename "$s")"; tail -5 "$s" | cut -c1-200
    done
    ;;
esac
