#!/usr/bin/env bash
# PostgreSQL server binaries for tests/service/api: the tests start a throwaway server
# with initdb/pg_ctl on 127.0.0.1 themselves (as the postgres user when run as root) and
# stop it; nothing is started here.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exit 0
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# wait for another setup script's apt run rather than fail on its lock
apt_opts=(-o DPkg::Lock::Timeout=600)
$sudo apt-get "${apt_opts[@]}" update -qq >/dev/null
$sudo apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends postgresql >/dev/null
# the Debian package starts a cluster of its own; the tests do not use it
$sudo service postgresql stop >/dev/null 2>&1 || true
