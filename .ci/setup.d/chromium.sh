#!/usr/bin/env bash
# Debian's Chromium for the service's web page test (headless screenshot and DOM), and
# openssl for the HTTPS test's throwaway certificate.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-dejavu-core)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# wait for another setup script's apt run rather than fail on its lock
apt_opts=(-o DPkg::Lock::Timeout=600)
$sudo apt-get "${apt_opts[@]}" update -qq >/dev/null
$sudo apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1
