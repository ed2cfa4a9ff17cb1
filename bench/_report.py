"""The table printed at the end of a run, and the targets it is read against."""

from __future__ import annotations

from typing import Any

from bench._bursts import burst_lines, burst_targets
from bench.cycles import cycle_targets


def _get(results: dict[str, Any], path: str) -> Any:
    value: Any = results
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


# (label, figure, baseline or None)
LATENCY_ROWS = [
    ("session start: replgate, warm pool", "session_start.replgate_warm",
     "session_start.replgate_cold"),
    ("session start: kernel_pool acquire, in-process", "session_start.pool_acquire_in_process",
     "session_start.replgate_cold"),
    ("session start: replgate, cold (from a template)", "session_start.replgate_cold",
     "session_start.replgate_cold_boot"),
    ("session start: replgate, cold, booted (no template)",
     "session_start.replgate_cold_boot", None),
    ("session start: Kernel Gateway POST /api/kernels", "session_start.kernel_gateway",
     "session_start.replgate_cold"),
    ("pause, data stack imported (variables)", "lifecycle.pause", None),
    ("resume + 1+1 on a paused session", "lifecycle.resume_execute",
     "lifecycle.cold_start_execute"),
    ("cold session start + 1+1 (from a template)", "lifecycle.cold_start_execute",
     "lifecycle.cold_boot_execute"),
    ("cold session start + 1+1, booted (no template)", "lifecycle.cold_boot_execute", None),
    ("pause, data stack imported: variables", "pause_with.variables.pause", None),
    ("pause, data stack imported: memory (CRIU)", "pause_with.memory.pause",
     "pause_with.variables.pause"),
    ("resume + 1+1: variables", "pause_with.variables.resume_execute", None),
    ("resume + 1+1: memory (CRIU)", "pause_with.memory.resume_execute",
     "pause_with.variables.resume_execute"),
    ("fork of 4, answered (past the warm kernels: paused)", "lifecycle.fork4",
     "lifecycle.create4"),
    ("fork of 4, then 1+1 in every copy at once", "lifecycle.fork4_run", "lifecycle.create4"),
    ("4 sessions created at once (the same warm pool)", "lifecycle.create4", None),
    ("1+1: floor (jupyter_client -> host ipykernel)", "round_trip.floor", None),
    ("1+1: kernel_pool in-process (sandboxed)", "round_trip.pool_in_process",
     "round_trip.floor"),
    ("1+1: replgate WebSocket", "round_trip.replgate_ws", "round_trip.floor"),
    ("1+1: replgate HTTP", "round_trip.replgate_http", "round_trip.floor"),
    ("1+1: Kernel Gateway WebSocket", "round_trip.kernel_gateway_ws", "round_trip.floor"),
    ("1+1: Kernel Gateway WS + TCP_NODELAY", "round_trip.kernel_gateway_ws_nodelay",
     "round_trip.floor"),
    ("print -> client: floor", "streaming.floor", None),
    ("print -> client: replgate WebSocket", "streaming.replgate_ws", "streaming.floor"),
    ("print -> client: Kernel Gateway (NODELAY)", "streaming.kernel_gateway_ws_nodelay",
     "streaming.floor"),
    ("matplotlib PNG: floor", "chart.floor", None),
    ("matplotlib PNG: replgate WebSocket", "chart.replgate_ws", "chart.floor"),
    ("matplotlib PNG: Kernel Gateway (NODELAY)", "chart.kernel_gateway_ws_nodelay",
     "chart.floor"),
    ("create + first 1+1: replgate client", "e2b.create_and_first_run.replgate_client", None),
    ("create + first 1+1: E2B SDK", "e2b.create_and_first_run.e2b_sdk",
     "e2b.create_and_first_run.replgate_client"),
    ("run_code 1+1: replgate client (WebSocket)", "e2b.run_code.replgate_client", None),
    ("run_code 1+1: replgate client (HTTP execute)", "e2b.run_code.replgate_client_http",
     "e2b.run_code.replgate_client"),
    ("run_code 1+1: E2B SDK (/e2b/sandbox/execute)", "e2b.run_code.e2b_sdk",
     "e2b.run_code.replgate_client"),
]


LIFECYCLE_TARGETS = [  # (target, figure, most allowed), issue 16's
    ("resume + 1+1 on a paused session, p50 (ms)", "lifecycle.resume_execute.p50", 150),
    ("pause p50, data stack imported (ms)", "lifecycle.pause.p50", 500),
    ("paused session's image (MiB, compressed)", "lifecycle.snapshot_mib", 30),
    ("fork of 4, answered (sessions usable), p50 (ms)", "lifecycle.fork4.p50", 1500),
    ("fork of 4 + 1+1 in each (all running), p50 (ms)", "lifecycle.fork4_run.p50", 1500),
    ("cold session start + 1+1, no warm kernel, p50 (ms)", "lifecycle.cold_start_execute.p50",
     400),
]


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it is met (reported, never asserted)."""
    out = []

    def add(name: str, value: float | None, goal: str, met: bool | None) -> None:
        out.append({"target": name, "value": None if value is None else round(value, 3),
                    "goal": goal, "met": met})

    warm = _get(results, "session_start.replgate_warm.p50")
    add("warm session start p50 (ms)", warm, "< 10", None if warm is None else warm < 10)
    ws, floor = _get(results, "round_trip.replgate_ws.p50"), _get(results, "round_trip.floor.p50")
    over = None if ws is None or floor is None else ws - floor
    add("WebSocket 1+1 overhead over the floor, p50 (ms)", over, "< 1",
        None if over is None else over < 1)
    add("stretch: WebSocket 1+1 no slower than the floor, p50 (ms)", over, "<= 0",
        None if over is None else over <= 0)
    rg32 = _get(results, "throughput.32.replgate_ws.per_s")
    floor32 = _get(results, "throughput.32.floor.per_s")
    share = None if rg32 is None or not floor32 else rg32 / floor32
    add("throughput at 32 sessions, share of the floor's", share, ">= 0.90",
        None if share is None else share >= 0.9)
    for name, key, limit in LIFECYCLE_TARGETS:
        value = _get(results, key)
        add(name, value, f"<= {limit:g}", None if value is None else value <= limit)
    for name, value, goal, met in cycle_targets(results):
        add(name, value, goal, met)
    held = _get(results, "held.sessions")
    correct, _, tried = str(_get(results, "held.resumed_correct")).partition("/")
    add("paused sessions held, 8 running kernels, sample resumed", held, ">= 2000",
        None if held is None else held >= 2000 and correct == tried)
    mem = _get(results, "density.uss_mib")
    add("memory per warm kernel (MiB, USS)", mem, "< 100", None if mem is None else mem < 100)
    gvisor_warm = _get(results, "runtimes.warm_start.gvisor.p50")
    add("gVisor warm session start p50 (ms)", gvisor_warm, "<= 10",
        None if gvisor_warm is None else gvisor_warm <= 10)
    added = _get(results, "e2b.run_code_added_p50_ms")
    add("E2B SDK run_code over replgate's client, p50 (ms)", added, "<= 2",
        None if added is None else added <= 2)
    for name, value, goal, met in burst_targets(results):
        add(name, value, goal, met)
    peak = _get(results, "flood.peak_mib")
    add("gateway RSS during a 100 MB flood (MiB)", peak, "< 250 MB (238 MiB)",
        None if peak is None else peak * 2**20 < 250e6)
    return out


def table(results: dict[str, Any]) -> str:
    lines = [f"{'figure (ms)':<52} {'p50':>9} {'p95':>9} {'n':>5}  ratio to baseline (p50)",
             "-" * 100]
    for label, key, base in LATENCY_ROWS:
        figure = _get(results, key)
        if not figure or "p50" not in figure:
            continue
        ratio = ""
        baseline = _get(results, base) if base else None
        if baseline and "p50" in baseline:
            ratio = f"{figure['p50'] / baseline['p50']:.3g}x {base.split('.')[-1]}"
        lines.append(f"{label:<52} {figure['p50']:>9.2f} {figure['p95']:>9.2f} "
                     f"{figure['n']:>5}  {ratio}")
    cpu = results.get("cpu_per_execution")
    if cpu and "error" not in cpu:
        lines += ["", f"{'CPU per 1+1 (ms)':<52} {'kernel':>9} {'server':>9} {'client':>9}"]
        for name, value in cpu.items():
            lines.append(f"{name:<52} {value['kernel_ms']:>9.2f} {value['server_ms']:>9.2f} "
                         f"{value['client_ms']:>9.2f}")
    e2b = (results.get("e2b") or {}).get("run_code")
    if e2b:
        lines += ["", f"{'CPU per run_code 1+1 (ms)':<52} {'client':>9} {'gateway':>9}"]
        for name, value in e2b.items():
            lines.append(f"{name:<52} {value['client_cpu_ms']:>9.2f} "
                         f"{value['gateway_cpu_ms']:>9.2f}")
    lines += ["", f"{'throughput (executions/s)':<52} {'per_s':>9} {'x floor':>9}  "
                  "CPU cores used: client/server/kernels"]
    for n, value in (results.get("throughput") or {}).items():
        if "error" in value:
            continue
        floor = value["floor"]["per_s"]
        for name, figure in value.items():
            cores = "/".join(f"{figure.get(k + '_cores', 0):.2f}"
                             for k in ("client", "server", "kernels"))
            lines.append(f"{n + ' sessions, ' + name:<52} {figure['per_s']:>9.1f} "
                         f"{figure['per_s'] / floor:>9.2f}  {cores}")
    dens = results.get("density")
    if dens and "error" not in dens:
        lines += ["", f"memory per idle warm kernel: {dens['uss_mib']:.1f} MiB unique (USS), "
                      f"cgroup charge {dens['cgroup_charge_mib']:.1f} MiB, host drop "
                      f"{dens['host_available_drop_mib']:.1f} MiB; stock host ipykernel "
                      f"{dens['floor_kernel_uss_mib']:.1f} MiB; ~{dens['fit_in_available_memory']}"
                      f" fit in {dens['memory_available_gib']} GiB available"]
    lines += _runtime_lines(results.get("runtimes"))
    lines += _held_lines(results.get("held"))
    lines += burst_lines(results.get("bursts"))
    lines += burst_lines(results.get("bursts_cluster"))
    fl = results.get("flood")
    if fl and "error" not in fl:
        lines.append(f"flood (100 MB printed): gateway RSS {fl['before_mib']:.0f} -> peak "
                     f"{fl['peak_mib']:.0f} MiB ({fl['peak_mib'] / fl['before_mib']:.2f}x), "
                     f"{fl['seconds']:.1f} s, status {fl['status']}, truncated {fl['truncated']}")
    failed = [f"{key}: {value['error']}" for key, value in results.items()
              if isinstance(value, dict) and "error" in value]
    failed += [f"throughput {n}: {value['error']}"
               for n, value in (results.get("throughput") or {}).items() if "error" in value]
    if failed:
        lines += ["", "failed figures:", *(f"  {line}" for line in failed)]
    loads = results.get("load_average_1min")
    if loads:
        lines += ["", "1-minute load average before/after each figure: " + "; ".join(
            f"{name} {a:g}/{b:g}" for name, (a, b) in loads.items())]
    lines += ["", "targets (reported, not asserted):"]
    for target in results.get("targets", []):
        mark = {True: "met", False: "MISSED", None: "n/a"}[target["met"]]
        value = "n/a" if target["value"] is None else f"{target['value']:g}"
        lines.append(f"  {target['target']:<58} {value:>10}  {target['goal']:<20} {mark}")
    return "\n".join(lines)


def _held_lines(found: dict[str, Any] | None) -> list[str]:
    if not found or "error" in found:
        return []
    resume = found["resume_execute"]
    return ["", f"paused sessions held: {found['sessions']} (workspaces of "
                f"{found['workspace_size']}), made at {found['made_per_s']}/s by forking a paused "
                f"one; {found['disk_per_paused_mib']} MiB of disk (parked workspace "
                f"{(found.get('parked_workspace_mib') or {}).get('median')} MiB, snapshot "
                f"{found.get('snapshot_mib')} MiB) and "
                f"{found['gateway_rss_per_paused_kib']} KiB of gateway memory each; mounts "
                f"{found['mounts_before']} -> {found['mounts_after']}, loop devices "
                f"{found['loop_devices_before']} -> {found['loop_devices_after']}; "
                f"{found['resumed_correct']} of a sample resumed with their variables, resume + "
                f"first cell p50 {resume['p50']:.0f} ms (p95 {resume['p95']:.0f}); "
                f"{found['running_kernels_after_resumes']} kernels running after"]


RUNTIME_ROWS = [("warm session start", "warm_start"), ("1+1 (HTTP)", "one_plus_one"),
                ("matplotlib PNG (HTTP)", "png"), ("3,000 small files in the workspace", "files"),
                ("cold session start", "cold_start")]


def _runtime_lines(found: dict[str, Any] | None) -> list[str]:
    """runc against gVisor: p50/p95 of each, and gVisor's p50 as a multiple of runc's."""
    if not found or "error" in found:
        return []
    lines = ["", f"{'runc vs gVisor (ms)':<40} {'runc p50':>9} {'p95':>9} {'gVisor p50':>11} "
                 f"{'p95':>9}  gVisor/runc"]
    for label, key in RUNTIME_ROWS:
        runc, gvisor = found[key]["runc"], found[key]["gvisor"]
        lines.append(f"{label:<40} {runc['p50']:>9.2f} {runc['p95']:>9.2f} "
                     f"{gvisor['p50']:>11.2f} {gvisor['p95']:>9.2f}  "
                     f"{gvisor['p50'] / runc['p50']:.3g}x")
    memory = found["memory_per_warm_kernel_mib"]
    lines.append(f"{'memory per warm kernel (cgroup, MiB)':<40} {memory['runc']:>9} {'':>9} "
                 f"{memory['gvisor']:>11}")
    return lines
