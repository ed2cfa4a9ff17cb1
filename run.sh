#!/usr/bin/env bash
# replgate's two set-up commands, each idempotent and self-installing:
#   ./run.sh serve [--host H] [--port P]   start the gateway (127.0.0.1:8000 by default)
#   ./run.sh test [pytest args]            run the whole test suite
# Each brings up what it needs first: a virtualenv with the project's packages, a running
# Docker engine (Debian's docker.io, installed and started when none answers and we are root)
# and the sandbox image (built from sandbox_image/, with or without a container registry).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
VENV=${REPLGATE_VENV:-$ROOT/.venv}

say() { printf '[replgate] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else say "need root for: $*  (re-run as root, or do it yourself)"; exit 1
  fi
}

find_python() {
  for py in python3.13 python3.12 python3.11 python3; do
    if command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$py"; return
    fi
  done
  say "Python 3.11 or newer is required (apt-get install python3 python3-venv)"; exit 1
}

ensure_venv() {
  local extras=$1 stamp="$VENV/.replgate-installed-$1"
  local want; want=$(cat pyproject.toml | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$(find_python)" -m venv "$VENV" || { as_root apt-get install -y python3-venv && "$(find_python)" -m venv "$VENV"; }
  fi
  say "installing replgate[$extras] into $VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet -e ".[$extras]"
  echo "$want" > "$stamp"
}

engine_up() { docker info >/dev/null 2>&1 || { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import docker; docker.from_env().ping()' >/dev/null 2>&1; }; }

ensure_engine() {
  engine_up && return
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    say "No Docker engine answers. Install and start one (https://docs.docker.com/engine/install/),"
    say "add yourself to the 'docker' group, then run this again."; exit 1
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    say "installing Debian's Docker engine (docker.io)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      docker.io iptables e2fsprogs debootstrap >/dev/null
  fi
  if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
    as_root systemctl start docker || true
  fi
  if ! engine_up; then
    say "starting dockerd (log: /var/log/replgate-dockerd.log)"
    as_root sh -c 'nohup setsid dockerd >/var/log/replgate-dockerd.log 2>&1 </dev/null &'
  fi
  for _ in $(seq 1 60); do engine_up && return; sleep 1; done
  say "dockerd did not come up; see /var/log/replgate-dockerd.log"; exit 1
}

ensure_image() { "$VENV/bin/replgate" image build; }

# The web UI's tests drive Debian's Chromium (no browser download happens anywhere).
ensure_browser() {
  command -v chromium >/dev/null 2>&1 && return
  say "installing Debian's chromium for the browser tests"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core >/dev/null
}

# tests/test_readme.py runs the README's shell examples as written: they use curl and jq.
ensure_readme_tools() {
  command -v curl >/dev/null 2>&1 && command -v jq >/dev/null 2>&1 && return
  say "installing Debian's curl and jq for the README's examples"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    curl jq >/dev/null
}

cmd=${1:-}; shift || true
case "$cmd" in
  serve)
    ensure_venv serve; ensure_engine; ensure_image
    exec "$VENV/bin/replgate" serve "$@" ;;
  test)
    ensure_venv dev; ensure_engine; ensure_image; ensure_browser; ensure_readme_tools
    exec "$VENV/bin/python" -m pytest "$@" ;;
  *)
    echo "usage: ./run.sh serve [--host H] [--port P] | ./run.sh test [pytest args]" >&2; exit 2 ;;
esac
