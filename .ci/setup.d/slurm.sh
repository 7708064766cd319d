#!/usr/bin/env bash
# Slurm, MUNGE and Open MPI for tests/deploy: the tests start munged, slurmctld and slurmd
# on loopback themselves (and stop them), and run `spillway mpi` under mpirun.
set -euo pipefail
need=()
for bin in munged slurmctld slurmd sbatch srun; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need=(slurm-wlm munge)
done
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
