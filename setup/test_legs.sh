# The legs of `./run.sh test` without arguments (sourced by run.sh, which defines VENV, say and
# static_checks, and has set up everything the legs need).

# The gVisor leg (REPLGATE_TEST_RUNTIME=gvisor: every sandbox under runsc), a subset chosen for
# time (about 5 minutes on 2 cores). The attacks where gVisor changes what happens -- processes
# and their limit, kills at timeouts and restarts, the three memory bombs (the OOM reason comes
# back differently), privileged calls, PID 1, files and special files, the socket folder, the
# network -- and the posture read back from the engine; then the public surfaces once each,
# which under gVisor reach the kernel through its sockets across gVisor's boundary: HTTP
# executions, files, restart and timeouts (test_api), streaming (test_ws), notebook export,
# death and recovery (kernel_pool's test_recovery).
# Left to the runc leg: the output, display and flood attacks and the gateway's own fault tests
# (the gateway's side does not change with the runtime, and gVisor's slower I/O makes the flood
# tests' time bounds a test of the machine), pause/resume/fork (test_lifecycle: 3.5 minutes
# under gVisor, the same variables-only path as runc's fallback), the Jupyter API, MCP, E2B,
# client, commands and UI suites (the same gateway code over the same kernel channel as the
# surfaces above; code contexts of other languages, which the Jupyter API and MCP tests use,
# are refused under gVisor: docs/languages.md).
gvisor_leg() {  # [pytest args]
  say "gVisor leg: the sandbox attacks, the posture and the public APIs again, under runsc"
  REPLGATE_TEST_RUNTIME=gvisor "$VENV/bin/python" -m pytest tests/kernel_pool/test_gvisor.py \
    tests/security/test_posture.py tests/security/test_isolation.py \
    tests/security/test_hostile_code.py tests/kernel_pool/test_recovery.py \
    tests/gateway/test_api.py tests/gateway/test_ws.py tests/gateway/test_notebook.py "$@" \
    -k "not (test_hostile_code and (flood or output or huge or garbage or imitating \
      or slow_other \
      or (cpu_hog and (long_c_call or regex or without_gil or swallowed))))"
}

# The PostgreSQL leg: every gateway on a database of its own in PostgreSQL instead of its SQLite
# file. The store's and the database's own suites, then every path that writes shared state
# through the API: sessions, history and keys (test_api, test_auth), the audit chain of
# executions and commands (test_api's CLI verify, test_commands_api), approvals' pending status
# (test_governance) and budgets' claims (test_budgets), pause, resume, fork and a restart taking
# sessions back (test_lifecycle), and E2B's sandboxes (create, timeout, kill, list, pause, fork,
# a gateway restart). The rest of the suite does not touch the database.
postgres_leg() {  # [pytest args]
  say "PostgreSQL leg: the store, the audit chain and the gateway's state on PostgreSQL"
  REPLGATE_TEST_DATABASE=postgresql "$VENV/bin/python" -m pytest tests/common/test_session_store.py \
    tests/common/test_database.py tests/gateway/test_store.py tests/gateway/test_api.py \
    tests/gateway/test_auth.py tests/gateway/test_commands_api.py tests/gateway/test_governance.py \
    tests/gateway/test_budgets.py tests/gateway/test_lifecycle.py \
    tests/gateway/e2b/test_python_sdk.py "$@" \
    -k "not test_python_sdk or create or timeout or kill or history or survives or pause \
      or fork or list"
}

# The runc leg runs every test once, in two processes side by side: the paths below in the
# background lane (after the side legs), the rest in the foreground. Chosen to balance the
# lanes (a whole run on this machine after issue 42's merges: foreground 37 minutes, background
# 22, before the port contract, the settings matrix and the gateway's secrets suite moved here)
# among suites that hold no time bound a busy machine could break; the security suite's flood
# and timeout tests stay in the foreground, near its end, when the background lane has little
# left.
RUNC_SIDE_PATHS=(tests/node tests/gateway/e2b tests/ui tests/kernel_pool/bundles tests/contract
                 tests/gateway/test_settings_matrix.py tests/gateway/test_secrets_egress.py)

runc_side_leg() {  # [pytest args]
  say "runc leg, second lane: ${RUNC_SIDE_PATHS[*]}"
  "$VENV/bin/python" -m pytest --durations=10 "${RUNC_SIDE_PATHS[@]}" "$@"
}

# `./run.sh test` without arguments: two lanes at once. In the background, one after the other:
# ruff and mypy, the gVisor leg, the PostgreSQL leg and a part of the runc leg
# (RUNC_SIDE_PATHS); in the foreground, the rest of the runc leg. A leg spends most of its time
# waiting on containers, kernels and gateways rather than on the CPUs, so on 2 cores the lanes
# overlap instead of adding up (in a row: 26 + 5.5 + 3.4 minutes and ruff and mypy's one). Each
# pytest process is independent of the others: its own gateways, pools, owner labels, state
# folders, databases and kernel templates (per process). The background lane's output goes to
# files of its own, shown whole once the foreground is done; every leg runs whatever the others
# give, and the exit status is the first failure's in the order ruff and mypy, runc, gVisor,
# PostgreSQL.
whole_suite() {
  local side; side=$(mktemp -d)
  local legs=(static_checks gvisor_leg postgres_leg runc_side_leg)
  (
    for leg in "${legs[@]}"; do
      leg_status=0
      # (pytest's cache left to the foreground: two processes would write the same files)
      "$leg" -p no:cacheprovider >"$side/$leg.log" 2>&1 || leg_status=$?
      echo "$leg_status" >"$side/$leg.status"
    done
  ) &
  local side_pid=$! runc_status=0 status=0 leg
  say "runc leg: every test but ${RUNC_SIDE_PATHS[*]} (beside it: ruff and mypy, the gVisor and" \
      "PostgreSQL legs, then those)"
  "$VENV/bin/python" -m pytest --durations=25 "${RUNC_SIDE_PATHS[@]/#/--ignore=}" || runc_status=$?
  wait "$side_pid" || true
  for leg in "${legs[@]}"; do cat "$side/$leg.log" >&2; done
  for leg in static_checks runc runc_side_leg gvisor_leg postgres_leg; do
    [ "$status" -eq 0 ] || break
    if [ "$leg" = runc ]; then status=$runc_status
    else status=$(cat "$side/$leg.status" 2>/dev/null || echo 1)
    fi
  done
  rm -rf "$side"
  [ "$status" -eq 0 ] || say "failed: see above (ruff and mypy first, then the runc leg, then the gVisor leg, then the PostgreSQL leg)"
  return "$status"
}
