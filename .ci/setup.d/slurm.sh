#!/usr/bin/env bash
# Slurm and MUNGE for tests/deploy: the tests start munged, slurmctld and slurmd on loopback
# themselves (and stop them). MPI is not installed here: the test extra's Open MPI wheel
# brings mpirun and libmpi (.ci/run checks the MPI tests pass with it alone).
set -euo pipefail
need=()
for bin in munged slurmctld slurmd sbatch srun; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need=(slurm-wlm munge)
done
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
