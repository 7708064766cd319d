#!/usr/bin/env bash
# Debian's Chromium for the service's web page test (headless screenshot and DOM).
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600)
$sudo apt-get "${apt_opts[@]}" update -qq >/dev/null
$sudo apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
