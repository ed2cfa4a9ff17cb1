#!/usr/bin/env bash
# replgate's two set-up commands, each idempotent and self-installing:
#   ./run.sh serve [--host H] [--port P]   start the gateway (127.0.0.1:8000 by default)
#   ./run.sh test [pytest args]            run the whole test suite (ruff, mypy, runc, a gVisor
#                                          leg and a PostgreSQL leg, in two lanes at once:
#                                          setup/test_legs.sh); with arguments, just pytest
#                                          with them
#   ./run.sh lock [--upgrade]              update the locks (uv.lock, sandbox_image/requirements.txt)
# Each brings up what it needs first: a virtualenv with the project's packages (from uv.lock), a running
# Docker engine (Debian's docker.io, installed and started when none answers and we are root)
# with gVisor's runsc registered in it (the `gvisor` runtime of a profile), CRIU 4.2 for pauses
# that keep a kernel's memory (when run as root or with sudo), and the sandbox image (built from
# sandbox_image/, with or without a container registry).
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

# uv, pinned and hash-checked (setup/uv-requirements.txt), in a virtualenv of its own: it installs
# everything else from uv.lock, so `serve` and `test` get the same versions whatever PyPI has since.
TOOLS=${REPLGATE_TOOLS:-$ROOT/.tools}
UV=$TOOLS/bin/uv
export UV_PYTHON_DOWNLOADS=never  # the host's Python, never one fetched at run time

ensure_uv() {
  local want; want=$(sha256sum setup/uv-requirements.txt | cut -c1-16)
  if [ -x "$UV" ] && [ "$(cat "$TOOLS/.replgate-installed" 2>/dev/null)" = "$want" ]; then return; fi
  if [ ! -x "$TOOLS/bin/python" ]; then
    "$(find_python)" -m venv "$TOOLS" 2>/dev/null ||
      { as_root apt-get install -y python3-venv >/dev/null && "$(find_python)" -m venv "$TOOLS"; }
  fi
  say "installing uv into $TOOLS"
  "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --require-hashes -r setup/uv-requirements.txt
  echo "$want" > "$TOOLS/.replgate-installed"
}

# The project's packages for EXTRA (serve or dev), exactly as uv.lock has them. `--inexact` keeps
# what the other command installed (same lock, same versions) instead of uninstalling it.
ensure_venv() {
  local extra=$1 stamp="$VENV/.replgate-installed-$1"
  local want; want=$(cat uv.lock pyproject.toml | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  ensure_uv
  say "installing replgate[$extra] into $VENV from uv.lock"
  # The interpreter is chosen once, when the virtualenv is made: named again (a pyenv shim, say,
  # where the virtualenv records the version's own path), uv would remove and remake it on each
  # sync, dropping what the other command installed (serve's sync removed test's pytest).
  local python=(); [ -x "$VENV/bin/python" ] || python=(--python "$(find_python)")
  UV_PROJECT_ENVIRONMENT=$VENV "$UV" sync --quiet --frozen --inexact --extra "$extra" \
    "${python[@]}"
  echo "$want" > "$stamp"
}

# `./run.sh lock [--upgrade]`: re-resolves uv.lock (the project's packages, every extra) and the
# sandbox image's sandbox_image/requirements.txt, both with hashes; without --upgrade a locked
# version changes only where pyproject.toml or requirements.in no longer allow it.
update_locks() {
  ensure_uv
  local upgrade=(); [ "${1:-}" != --upgrade ] || upgrade=(--upgrade)
  "$UV" lock "${upgrade[@]}"
  # The image's Python is Debian bookworm's 3.11; --universal keeps every platform's hashes.
  "$UV" pip compile --quiet --universal --python-version 3.11 --generate-hashes "${upgrade[@]}" \
    --custom-compile-command "./run.sh lock" sandbox_image/requirements.in -o sandbox_image/requirements.txt
  "$UV" pip compile --quiet --universal --generate-hashes "${upgrade[@]}" \
    --custom-compile-command "./run.sh lock" setup/uv-requirements.in -o setup/uv-requirements.txt
}

# ruff and mypy (strict, configured in pyproject.toml): any finding fails the test command.
static_checks() {
  say "ruff and mypy"
  "$VENV/bin/ruff" check . && "$VENV/bin/mypy"
}

# gVisor: Debian's runsc, the static binary of trixie's package (built with Go 1.24). Bookworm's
# build is from 2022 (the slower ptrace platform); sid's current rebuild (Go 1.26) panics in its
# sentry in about one start in three here. The binary has no library dependencies: it is taken
# out of the .deb into /usr/local/bin, so the host's own packages (its libc) are not touched,
# and apt reads trixie's package list from a folder of its own, not from the host's sources.
RUNSC=/usr/local/bin/runsc
RUNSC_SUITE=trixie
RUNSC_ARGS='["--network=none", "--host-uds=create"]'
DAEMON_JSON=/etc/docker/daemon.json
OWNED_ENGINE=/run/replgate-dockerd.pid  # dockerd that this script started (its pid)
ENGINE_LOG=/var/log/replgate-dockerd.log

ensure_runsc() {
  [ -x "$RUNSC" ] && return 0
  [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1 || return 1
  local apt=/var/lib/replgate/apt tmp
  say "installing gVisor's runsc (Debian $RUNSC_SUITE) into $RUNSC"
  as_root mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $RUNSC_SUITE main" |
    as_root tee "$apt/sources.list" >/dev/null
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Acquire::Languages=none)
  tmp=$(mktemp -d)
  if as_root apt-get "${opts[@]}" update -qq >/dev/null &&
     (cd "$tmp" && as_root apt-get "${opts[@]}" download runsc >/dev/null 2>&1) &&
     as_root dpkg-deb -x "$tmp"/runsc_*.deb "$tmp/root" &&
     as_root install -m 0755 "$tmp/root/usr/bin/runsc" "$RUNSC"; then
    as_root rm -rf "$tmp"; return 0
  fi
  as_root rm -rf "$tmp"
  say "could not install runsc: profiles with runtime = \"gvisor\" will not start"; return 1
}

# Adds the runsc runtime and experimental mode (for `docker checkpoint`) to daemon.json, keeping
# whatever else is there. Prints "changed" when it wrote the file.
configure_engine() {
  as_root python3 - "$DAEMON_JSON" "$RUNSC" "$RUNSC_ARGS" <<'PY'
import json, os, sys
path, runsc, arguments = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with open(path) as f:
        config = json.load(f)
except FileNotFoundError:
    config = {}
wanted = dict(config, experimental=True)
wanted["runtimes"] = dict(config.get("runtimes") or {},
                          runsc={"path": runsc, "runtimeArgs": arguments})
if wanted != config:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(wanted, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print("changed")
PY
}

# CRIU, for pauses that keep a kernel's whole memory: `docker checkpoint` has runc run the `criu`
# on root's PATH. Linux >= 6.16 needs CRIU >= 4.2 (bookworm's 3.17 fails on the vDSO, trixie's
# 4.1 on every socket's SO_PASSCRED); Debian sid has 4.2.1, built for a newer glibc than the
# host's. Installing it with apt would upgrade the host's libc, so it goes into a root of its own
# made by debootstrap (no apt source is added to the host), and a wrapper runs it through that
# root's loader and libraries. Where root lacks CAP_SYS_RESOURCE (some VMs), CRIU cannot read a
# sandbox's rlimits: setup/criu_rlimit_shim.c, preloaded, reads them from /proc instead.
CRIU_HOME=/opt/replgate/criu
CRIU_WRAPPER=/usr/local/sbin/criu
CRIU_SUITE=sid
CRIU_MIN=4.2

criu_version() { "$1" --version 2>/dev/null | sed -n 's/^Version: *//p'; }
version_at_least() { [ -n "$1" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]; }

root_lacks_cap_sys_resource() {
  local effective; effective=$(as_root sed -n 's/^CapEff:\t*//p' /proc/self/status)
  (( (16#$effective >> 24 & 1) == 0 ))
}

install_criu() {
  local new=$CRIU_HOME/root.new log loader preload=""
  if ! command -v debootstrap >/dev/null 2>&1 || [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      debootstrap debian-archive-keyring >/dev/null || return 1
  fi
  say "installing CRIU from Debian $CRIU_SUITE into $CRIU_HOME/root (debootstrap, about 25 s)"
  as_root mkdir -p "$CRIU_HOME"
  as_root rm -rf "$new"
  log=$(mktemp)
  if ! as_root debootstrap --variant=minbase --include=criu \
       --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
       "$CRIU_SUITE" "$new" http://deb.debian.org/debian >"$log" 2>&1; then
    tail -n 3 "$log" >&2; rm -f "$log"; as_root rm -rf "$new"; return 1
  fi
  rm -f "$log"
  # The root only runs criu: its package caches and documentation are 140 of its 240 MB.
  as_root sh -c "rm -rf '$new'/var/cache/apt/archives/*.deb '$new'/var/lib/apt/lists/* \
                 '$new'/usr/share/doc '$new'/usr/share/man '$new'/usr/share/locale"
  as_root rm -rf "$CRIU_HOME/root" && as_root mv "$new" "$CRIU_HOME/root" || return 1
  loader=$(ls "$CRIU_HOME"/root/usr/lib/*-linux-gnu*/ld-linux*.so.* 2>/dev/null | head -n1)
  [ -n "$loader" ] || return 1
  if root_lacks_cap_sys_resource; then
    if ! command -v gcc >/dev/null 2>&1; then
      say "installing Debian's gcc to build CRIU's rlimit shim (root lacks CAP_SYS_RESOURCE here)"
      as_root apt-get update -qq
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        gcc libc6-dev >/dev/null || return 1
    fi
    as_root gcc -shared -fPIC -O2 -o "$CRIU_HOME/rlimit_shim.so" setup/criu_rlimit_shim.c -ldl ||
      return 1
    preload="--preload '$CRIU_HOME/rlimit_shim.so' "
  fi
  printf '%s\n' '#!/bin/sh' \
    "# CRIU from Debian $CRIU_SUITE in a root of its own, run by that root's loader beside the" \
    "# host's libc (installed by replgate's run.sh)." \
    "exec '$loader' ${preload}--library-path '$(dirname "$loader")' '$CRIU_HOME/root/usr/sbin/criu' \"\$@\"" |
    as_root tee "$CRIU_WRAPPER.new" >/dev/null &&
    as_root chmod 0755 "$CRIU_WRAPPER.new" && as_root mv "$CRIU_WRAPPER.new" "$CRIU_WRAPPER"
}

# Installs CRIU unless root's PATH has one new enough, then says whether this kernel can
# checkpoint. Nothing here fails the set-up: without CRIU, pauses keep the variables.
RUNC_CRIU_CONFIG=/etc/criu/runc.conf
ensure_criu() {
  local criu installed="" report can_root=yes
  [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1 || can_root=""
  criu=$(PATH="/usr/local/sbin:/usr/sbin:/sbin:$PATH" command -v criu || true)
  if [ -z "$criu" ] || ! version_at_least "$(criu_version "$criu")" "$CRIU_MIN"; then
    if [ -z "$can_root" ]; then
      say "no CRIU $CRIU_MIN or newer, and installing it needs root: pauses will keep variables only"
      return 0
    fi
    if ! install_criu; then
      say "could not install CRIU from Debian $CRIU_SUITE: pauses will keep variables only"
      return 0
    fi
    criu=$CRIU_WRAPPER installed=yes
  fi
  [ -n "$can_root" ] || return 0  # criu check needs root
  # runc hands CRIU this file on every dump and restore: Deno's kernel holds file locks (its
  # caches), which CRIU keeps only when told to (docs/languages.md).
  if ! as_root grep -qsx 'file-locks' "$RUNC_CRIU_CONFIG"; then
    as_root mkdir -p "$(dirname "$RUNC_CRIU_CONFIG")"
    echo file-locks | as_root tee -a "$RUNC_CRIU_CONFIG" >/dev/null
  fi
  if report=$(as_root "$criu" check 2>&1); then
    [ -z "$installed" ] || say "CRIU $(criu_version "$criu") is installed and this kernel can checkpoint"
  else
    say "CRIU $(criu_version "$criu") is installed, but this host's kernel cannot checkpoint" \
        "processes ($criu check: $(grep -m1 '^Error' <<<"$report" || tail -n1 <<<"$report")):" \
        "pauses will keep variables only"
  fi
}

engine_up() { docker info >/dev/null 2>&1 || { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import docker; docker.from_env().ping()' >/dev/null 2>&1; }; }

ensure_engine() {
  if engine_up; then
    # An engine this script started is ours to configure: runtimes reload on SIGHUP.
    if running "$(as_root cat "$OWNED_ENGINE" 2>/dev/null || true)" dockerd &&
       ensure_runsc && [ "$(configure_engine)" = changed ]; then
      # (experimental mode, if it was off, takes effect at the engine's next start)
      say "registered runsc in $DAEMON_JSON; reloading the engine (SIGHUP)"
      as_root kill -HUP "$(cat "$OWNED_ENGINE")"
    fi
    return
  fi
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
  # The engine starts with gVisor registered (and experimental mode on) from the outset.
  if ensure_runsc; then configure_engine >/dev/null; fi
  if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
    as_root systemctl start docker || true
  fi
  engine_up && return
  settle_engine_pid_files
  engine_up && return
  say "starting dockerd (log: $ENGINE_LOG)"
  # The pid recorded is dockerd's own (the shell execs it), so a later run can tell it apart.
  as_root sh -c "nohup setsid sh -c 'echo \$\$ > $OWNED_ENGINE; exec dockerd' >>$ENGINE_LOG 2>&1 </dev/null &"
  local pid=""
  for _ in $(seq 1 90); do
    engine_up && return
    [ -n "$pid" ] || pid=$(as_root cat "$OWNED_ENGINE" 2>/dev/null || true)
    # A dockerd that exited will not come up: say why now rather than after the wait.
    if [ -n "$pid" ] && ! as_root kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 1
  done
  say "dockerd did not come up; the end of $ENGINE_LOG:"
  as_root tail -n 25 "$ENGINE_LOG" >&2 || true
  exit 1
}

# `running PID NAME`: PID is a live process whose command is NAME (pids are reused: after a
# reboot or a wrap of pid_max a pid file can name some other process), and not a zombie (a
# killed dockerd stays one until its parent, often PID 1, reaps it).
running() {
  [ -n "$1" ] && [ "$(as_root cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] &&
    [ "$(as_root sed -n 's/^State:\t*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null)" != Z ]
}

# dockerd refuses to start while /run/docker.pid names any live process, and takes a live pid in
# its containerd's pid file for its containerd (which it later kills as unresponsive). A session
# or machine stopped without stopping the engine leaves both behind, and once pid_max wraps, their
# pids belong to other processes. A dockerd that really runs but does not answer yet (starting,
# or shutting down) is waited for: a minute, then it is stopped if this script started it.
settle_engine_pid_files() {
  local pid owned
  pid=$(as_root cat /run/docker.pid 2>/dev/null || true)
  if running "$pid" dockerd; then
    say "dockerd (pid $pid) runs but does not answer yet; waiting for it"
    for _ in $(seq 1 60); do
      engine_up && return
      running "$pid" dockerd || break
      sleep 1
    done
    if running "$pid" dockerd; then
      owned=$(as_root cat "$OWNED_ENGINE" 2>/dev/null || true)
      if [ "$owned" != "$pid" ]; then
        say "dockerd (pid $pid) does not answer after a minute and was not started by this script:"
        say "stop it (or fix it: its log says why), then run this again"; exit 1
      fi
      say "stopping dockerd (pid $pid), started here earlier, which does not answer"
      as_root kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do running "$pid" dockerd || break; sleep 1; done
      as_root kill -KILL "$pid" 2>/dev/null || true
      sleep 1
    fi
  fi
  running "$pid" dockerd || as_root rm -f /run/docker.pid
  pid=$(as_root cat /run/docker/containerd/containerd.pid 2>/dev/null || true)
  running "$pid" containerd || as_root rm -f /run/docker/containerd/containerd.pid
}

ensure_image() { "$VENV/bin/replgate" image build "$@"; }

# zstd compresses pause snapshots as they stream out of the sandbox (without it they are stored
# uncompressed: a pause still works, its files are larger).
ensure_zstd() {
  command -v zstd >/dev/null 2>&1 && return
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    say "no zstd, and installing it needs root: paused sessions will be stored uncompressed"; return
  fi
  say "installing Debian's zstd (pause snapshots are compressed with it)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends zstd \
    >/dev/null || say "could not install zstd: paused sessions will be stored uncompressed"
}

# The web UI's tests drive Debian's Chromium (no browser download happens anywhere).
ensure_browser() {
  command -v chromium >/dev/null 2>&1 && return
  say "installing Debian's chromium for the browser tests"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core >/dev/null
}

# E2B's JS SDK is tested under node with the versions locked in tests/gateway/e2b/js.
ensure_node() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    say "installing Debian's nodejs for the E2B JS SDK tests"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      nodejs npm >/dev/null
  fi
  local js=tests/gateway/e2b/js
  # npm ci leaves node_modules/.package-lock.json: older than the lock, the lock changed since.
  if [ ! -d "$js/node_modules/@e2b/code-interpreter" ] \
      || [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]; then
    say "installing the E2B JS SDKs (npm ci in $js)"
    npm ci --prefix "$js" --no-audit --no-fund --loglevel=error
  fi
}

# tests/test_readme.py runs the README's shell examples as written: they use curl and jq.
ensure_readme_tools() {
  command -v curl >/dev/null 2>&1 && command -v jq >/dev/null 2>&1 && return
  say "installing Debian's curl and jq for the README's examples"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    curl jq >/dev/null
}

# PostgreSQL for the tests (tests/gateway's second database leg and the shared-database tests)
# and for `cluster`: Debian's package, its cluster started, a role `replgate` that may create
# databases (each test gateway gets one of its own). `serve` keeps its state in SQLite unless
# REPLGATE_DATABASE_URL names a server of the user's own.
PG_ROLE=replgate
ensure_postgres() {
  if ! command -v pg_lsclusters >/dev/null 2>&1; then
    say "installing Debian's PostgreSQL (for the tests)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      postgresql >/dev/null
  fi
  local cluster; cluster=$(pg_lsclusters -h | sort -V | tail -n 1)
  if [ -z "$cluster" ]; then
    as_root pg_createcluster "$(ls /usr/lib/postgresql | sort -V | tail -n 1)" main >/dev/null
    cluster=$(pg_lsclusters -h | sort -V | tail -n 1)
  fi
  local version name port status
  read -r version name port status _ <<<"$cluster"
  case "$status" in online*) ;; *)
    say "starting PostgreSQL $version/$name on port $port"
    as_root pg_ctlcluster "$version" "$name" start ;;
  esac
  local sql="DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
    CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_ROLE'; END IF; END \$\$;"
  as_root runuser -u postgres -- psql -p "$port" -qAtX -c "$sql" >/dev/null
  as_root runuser -u postgres -- psql -p "$port" -qAtX \
    -c "SELECT 1 FROM pg_database WHERE datname = '$PG_ROLE'" | grep -q 1 ||
    as_root runuser -u postgres -- createdb -p "$port" -O "$PG_ROLE" "$PG_ROLE"
  # The server the tests make their databases in (tests/conftest.py reads it).
  export REPLGATE_TEST_POSTGRES="postgresql://$PG_ROLE:$PG_ROLE@127.0.0.1:$port/$PG_ROLE"
}

cmd=${1:-}; shift || true
case "$cmd" in
  serve)
    ensure_venv serve; ensure_engine; ensure_criu; ensure_zstd; ensure_image
    exec "$VENV/bin/replgate" serve "$@" ;;
  cluster)
    # Many machines on this one (docs/cluster.md): three nodes and two gateways on a database
    # of their own in the local PostgreSQL, made anew each time.
    ensure_venv serve; ensure_engine; ensure_criu; ensure_zstd; ensure_image; ensure_postgres
    pg_port=${REPLGATE_TEST_POSTGRES##*:}; pg_port=${pg_port%%/*}
    as_root runuser -u postgres -- env PGOPTIONS="-c client_min_messages=warning" \
      psql -p "$pg_port" -qAtX -c "DROP DATABASE IF EXISTS replgate_cluster WITH (FORCE)"
    as_root runuser -u postgres -- createdb -p "$pg_port" -O "$PG_ROLE" replgate_cluster
    exec "$VENV/bin/replgate" cluster \
      --database-url "${REPLGATE_TEST_POSTGRES%/*}/replgate_cluster" "$@" ;;
  lock)
    update_locks "$@" ;;
  test)
    # The tests run the default image (every language) and the slim one (profiles of Python
    # and bash only): both built here, the second from the first's cached layers.
    ensure_venv dev; ensure_engine; ensure_criu; ensure_zstd; ensure_image --slim; ensure_browser; ensure_readme_tools; ensure_node
    ensure_postgres
    if [ $# -gt 0 ]; then exec "$VENV/bin/python" -m pytest "$@"; fi
    # The legs and how they share the machine: setup/test_legs.sh.
    . setup/test_legs.sh
    whole_suite || exit $?
    ;;
  *)
    echo "usage: ./run.sh serve [--host H] [--port P] | ./run.sh test [pytest args] | ./run.sh cluster [--nodes N] [--gateways N] | ./run.sh lock [--upgrade]" >&2
    exit 2 ;;
esac
