#!/usr/bin/env bash
# Sample the host's memory while something runs, as the kernel sees it (not spillway's books):
#   bash benchmarks/gpu-host/watch-host.sh start LOG [SECONDS]   background sampler -> LOG
#   bash benchmarks/gpu-host/watch-host.sh stop LOG              stop it; print peak used, lowest
#                                                                available, and new OOM kills
# Each sample: time, MemAvailable and used (MiB, /proc/meminfo), and per python process its
# RssAnon, RssShmem, RssFile (MiB, /proc/PID/status) with the start of its command line.
set -u
what=${1:?start|stop}; log=${2:?log file}
case $what in
  start)
    every=${3:-2}
    dmesg 2>/dev/null | grep -ciE "killed process|out of memory" > "$log.oom0" || echo 0 > "$log.oom0"
    (
      while :; do
        t=$(date +%T)
        read -r total avail < <(awk '/^MemTotal/{t=$2}/^MemAvailable/{a=$2}END{print t, a}' /proc/meminfo)
        line="$t avail=$((avail / 1024)) used=$(((total - avail) / 1024))"
        for st in /proc/[0-9]*/status; do
          pid=${st#/proc/}; pid=${pid%/status}
          grep -q '^Name:.*python' "$st" 2>/dev/null || continue
          m=$(awk '/^RssAnon/{a=$2}/^RssShmem/{s=$2}/^RssFile/{f=$2}END{printf "%d/%d/%d", a/1024, s/1024, f/1024}' "$st" 2>/dev/null)
          cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-60)
          case $m in 0/0/*) continue;; esac
          line="$line | $pid a/s/f=$m ${cmd// /_}"
        done
        echo "$line"
        sleep "$every"
      done
    ) >> "$log" 2>/dev/null &
    echo $! > "$log.pid"
    ;;
  stop)
    kill "$(cat "$log.pid")" 2>/dev/null
    awk '{for(i=1;i<=NF;i++){if($i~/^avail=/){split($i,a,"=");if(min==""||a[2]<min)min=a[2]} if($i~/^used=/){split($i,u,"=");if(u[2]>max)max=u[2]}}}
         END{printf "host: peak used %d MiB, lowest MemAvailable %d MiB (%d samples)\n", max, min, NR}' "$log"
    before=$(cat "$log.oom0" 2>/dev/null || echo 0)
    now=$(dmesg 2>/dev/null | grep -ciE "killed process|out of memory")
    if [ -z "$now" ]; then echo "OOM kills: unknown (dmesg not readable)"; else
      echo "OOM kills since start: $((now - before))"; dmesg | grep -iE "killed process" | tail -3; fi
    ;;
esac
