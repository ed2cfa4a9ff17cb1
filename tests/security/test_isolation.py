"""What the sandbox cannot reach: the network, the host's secrets and files, the gateway's
messages, another tenant's session; and what it cannot leave behind across a restart.

Every connection attempt here is made from inside the network-less sandbox; the test process
itself only talks to the gateway on loopback.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from pathlib import Path

from tests.security.conftest import Hostile, brief

# -- network -----------------------------------------------------------------------------------

NETWORK = """
import json, os, socket, urllib.request
found = {'interfaces': sorted(name for _, name in socket.if_nameindex())}
def attempt(name, action):
    try:
        found[name] = 'CONNECTED ' + repr(action())[:100]
    except Exception as exc:
        found[name] = f'{type(exc).__name__}: {exc}'
def tcp(host, port):
    with socket.create_connection((host, port), timeout=3) as s:
        return s.getpeername()
attempt('dns', lambda: socket.getaddrinfo('example.com', 443))
attempt('dns_udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
    b'\\0' * 12, ('8.8.8.8', 53)))
attempt('http', lambda: urllib.request.urlopen('http://example.com/', timeout=3).status)
attempt('https', lambda: urllib.request.urlopen('https://93.184.215.14/', timeout=3).status)
attempt('metadata_tcp', lambda: tcp('169.254.169.254', 80))
attempt('metadata_http', lambda: urllib.request.urlopen(
    'http://169.254.169.254/latest/meta-data/', timeout=3).read())
attempt('public_ip', lambda: tcp('1.1.1.1', 443))
attempt('docker_bridge_gateway', lambda: tcp('172.17.0.1', __PORT__))
attempt('host_loopback_port', lambda: tcp('127.0.0.1', __PORT__))
attempt('ipv6', lambda: tcp('2606:4700:4700::1111', 443))
attempt('raw_icmp', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt('proxy_env', lambda: [k for k in os.environ if 'proxy' in k.lower()] or 1 / 0)
with socket.create_server(('127.0.0.1', 0)) as server:
    found['own_loopback'] = tcp('localhost', server.getsockname()[1])[0]
found['name_servers'] = [line for line in open('/etc/resolv.conf') if 'nameserver' in line]
report(found)
"""


def test_sandbox_has_no_network(hostile: Hostile, sid: str) -> None:
    port = int(hostile.gateway.url.rsplit(":", 1)[1])
    found = hostile.json_of(sid, NETWORK.replace("__PORT__", str(port)), timeout_s=60)
    assert found.pop("interfaces") == ["lo"]
    assert found.pop("own_loopback") == "127.0.0.1"  # its own loopback, nothing else
    # ``localhost`` resolves (the gateway's /etc/hosts); no name server, not even the host's.
    assert found.pop("name_servers") == []
    connected = {k: v for k, v in found.items() if v.startswith("CONNECTED")}
    assert not connected, connected
    assert "Operation not permitted" in found["raw_icmp"]
    assert "Operation not permitted" in found["packet"]
    # The gateway's own port, on the sandbox's loopback, is nobody: refused, not the gateway.
    assert "ConnectionRefusedError" in found["host_loopback_port"]
    # From the host: no network at all, no published port.
    config = hostile.container(sid).attrs
    assert config["HostConfig"]["NetworkMode"] == "none"
    # Not even the engine's ``none`` endpoint: its networking is disabled for the container.
    assert not config["NetworkSettings"]["Networks"] and config["Config"]["NetworkDisabled"]
    assert not config["NetworkSettings"]["Ports"]


# -- secrets -----------------------------------------------------------------------------------

SNOOP = """
import glob, json, os
seen = {'environ': dict(os.environ), 'proc_environ': {}, 'cmdlines': {}}
for path in glob.glob('/proc/[0-9]*/environ'):
    try:
        seen['proc_environ'][path] = open(path, 'rb').read().decode(errors='replace')
    except OSError as exc:
        seen['proc_environ'][path] = repr(exc)
for path in glob.glob('/proc/[0-9]*/cmdline'):
    seen['cmdlines'][path] = open(path, 'rb').read().decode(errors='replace')
seen['files'] = {}
for top in ('/home/user', '/tmp', '/dev/shm', '/kernel'):
    for folder, _, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, 'rb') as f:
                    seen['files'][path] = f.read(100_000).decode(errors='replace')
            except OSError as exc:
                seen['files'][path] = repr(exc)
seen['hostname'] = open('/etc/hostname').read()
seen['mounts'] = open('/proc/self/mountinfo').read()
report(seen)
"""


def test_environment_holds_no_host_secret(hostile: Hostile) -> None:
    session = hostile.new_session(env={"SESSION_VAR": "asked-for"})
    try:
        seen = hostile.json_of(session, SNOOP)
        blob = json.dumps(seen)
        for secret in (hostile.host_canary, *hostile.gateway.keys.values(), "REPLGATE_"):
            assert secret not in blob, secret
        assert seen["environ"]["SESSION_VAR"] == "asked-for"
        # Only the image's fixed variables and the session's own: nothing from the host.
        fixed = {"PATH", "HOSTNAME", "HOME", "LANG", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
                 "MPLCONFIGDIR", "MPLBACKEND", "IPYTHONDIR", "OPENBLAS_NUM_THREADS",
                 "OMP_NUM_THREADS", "SESSION_VAR", "PYDEVD_USE_FRAME_EVAL", "TERM", "CLICOLOR",
                 "FORCE_COLOR", "CLICOLOR_FORCE", "PAGER", "GIT_PAGER", "JPY_PARENT_PID",
                 "DENO_DIR", "DENO_NO_UPDATE_CHECK", "DENO_NO_PROMPT"}
        assert set(seen["environ"]) <= fixed, set(seen["environ"]) - fixed
        # /proc shows this container's processes only: its init and its kernel.
        assert len(seen["cmdlines"]) == 2, seen["cmdlines"]
        assert seen["hostname"] == "sandbox\n"
    finally:
        hostile.delete(session)


def test_container_environment_from_the_host_is_clean(hostile: Hostile, sid: str) -> None:
    env = hostile.container(sid).attrs["Config"]["Env"]
    names = {item.split("=", 1)[0] for item in env}
    assert "HOST_CANARY_SECRET" not in names and not any(n.startswith("REPLGATE") for n in names)
    assert not any(hostile.host_canary in item for item in env)


# -- forged kernel messages ----------------------------------------------------------------

FORGE = """
import glob, json, threading, time
from jupyter_client.session import Session
config = json.load(open(sorted(glob.glob('/kernel/k*.json'))[-1]))
forger = Session(key=config['key'].encode(), signature_scheme=config['signature_scheme'],
                 username='forger')
kernel = get_ipython().kernel
current = kernel.get_parent()['header']['msg_id']
shell_identity = kernel.get_parent().get('header', {}).get('session', '').encode()
def forge(msg_id, text):
    parent = {'header': {'msg_id': msg_id, 'msg_type': 'execute_request', 'session': 'x',
                         'username': 'x', 'date': '', 'version': '5.3'}}
    forger.send(kernel.iopub_socket, 'stream', {'name': 'stdout', 'text': text}, parent=parent)
    forger.send(kernel.iopub_socket, 'execute_result', {
        'data': {'text/plain': text}, 'metadata': {}, 'execution_count': 999}, parent=parent)
    forger.send(kernel.iopub_socket, 'status', {'execution_state': 'idle'}, parent=parent)
    forger.send(kernel.iopub_socket, 'error', {
        'ename': 'Forged', 'evalue': text, 'traceback': [text]}, parent=parent)
    # A bad signature, and garbage frames, on the same socket.
    kernel.iopub_socket.send_multipart([b'<IDS|MSG>', b'0' * 64, b'{}', b'{}', b'{}', b'{}'])
    kernel.iopub_socket.send_multipart([b'garbage'] * 3)
guesses = [current, current[:-1] + ('0' if current[-1] != '0' else '1'), 'nobody',
           current.rsplit('_', 1)[0] + '_999']
def keep_forging():
    deadline = time.time() + 6
    while time.time() < deadline:
        for guess in guesses[1:]:
            forge(guess, 'FORGED-__MARKER__\\n')
        time.sleep(0.01)
threading.Thread(target=keep_forging, daemon=True).start()
report({'current': current})
"""

HIJACK = """
import glob, json, os, subprocess, sys, time
# A separate process rebinds the kernel's iopub socket path and publishes there.
script = '''
import glob, json, time, zmq
from jupyter_client.session import Session
config = json.load(open(sorted(glob.glob("/kernel/k*.json"))[-1]))
forger = Session(key=config["key"].encode(), signature_scheme=config["signature_scheme"])
pub = zmq.Context().socket(zmq.PUB)
pub.bind("ipc://" + config["ip"] + "-" + str(config["iopub_port"]))
deadline = time.time() + 4
while time.time() < deadline:
    forger.send(pub, "stream", {"name": "stdout", "text": "HIJACK-__MARKER__\\\\n"},
                parent={"header": {"msg_id": "anything"}})
    time.sleep(0.01)
'''
subprocess.Popen([sys.executable, '-c', script])
time.sleep(1)
print('hijacking')
"""


def test_forged_kernel_messages_reach_no_other_execution(hostile: Hostile, sid: str) -> None:
    beta = hostile.new_session("beta")
    marker = secrets.token_hex(6)
    try:
        first = hostile.json_of(sid, FORGE.replace("__MARKER__", marker))
        # Message ids are random: none can be derived from the one a cell sees.
        assert len(first["current"]) == 32 and "_" not in first["current"]
        deadline = time.monotonic() + 6
        results = []
        while time.monotonic() < deadline:
            results.append(hostile.run(sid, f"print('{marker}-real-{len(results)}')"))
            results.append(hostile.run(beta, f"print('{marker}-beta')", tenant="beta"))
        hijack = hostile.run(sid, HIJACK.replace("__MARKER__", marker), timeout_s=20)
        assert hijack["status"] == "ok", brief(hijack)
        for _ in range(10):
            results.append(hostile.run(sid, f"print('{marker}-after')"))
            time.sleep(0.2)
        for result in results:
            assert result["status"] == "ok", brief(result)
            assert "FORGED" not in json.dumps(result) and "HIJACK" not in json.dumps(result)
            assert result["execution_count"] != 999 and result["error"] is None
        assert sum(r["stdout"] == f"{marker}-beta\n" for r in results) >= 2
        # The history is consistent too: every execution recorded once, in order, as it ran.
        history = hostile.client().get(f"/v1/sessions/{sid}/executions").json()
        assert [h["status"] for h in history] == ["ok"] * len(history)
        outputs = json.dumps([h["result"] for h in history])
        assert "FORGED" not in outputs and "HIJACK" not in outputs
        hostile.usable(sid)
        hostile.usable(beta, tenant="beta")
        assert hostile.healthz_ms() < 200
    finally:
        hostile.delete(beta, tenant="beta")


# -- the host: sockets, descriptors, writes, symlinks ----------------------------------------

HOST_VIEW = """
import json, os, stat
found = {'sockets': [], 'writes': {}, 'fds': {}}
for top in ('/', ):
    for folder, dirs, names in os.walk(top):
        if folder.startswith(('/proc', '/sys')):
            dirs[:] = []
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    found['sockets'].append(path)
            except OSError:
                pass
for path in ('/etc/passwd', '/etc/x', '/usr/x', '/opt/venv/x', '/x', '/var/tmp/x', '/root/x',
             '/home/x', '/proc/sys/kernel/hostname', '/sys/kernel/x', '/dev/x', '/run/x',
             '/opt/venv/lib/python3.11/site-packages/evil.pth', '/kernel/../etc/x'):
    try:
        with open(path, 'a') as f:
            f.write('x')
        found['writes'][path] = 'WRITTEN'
    except OSError as exc:
        found['writes'][path] = exc.errno
for pid in ('1', 'self'):
    try:
        fds = os.listdir(f'/proc/{pid}/fd')
    except OSError as exc:
        found['fds'][pid] = 'unreadable ' + repr(exc)
        continue
    for fd in fds:
        try:
            found['fds'][f'{pid}/{fd}'] = os.readlink(f'/proc/{pid}/fd/{fd}')
        except OSError as exc:
            found['fds'][f'{pid}/{fd}'] = repr(exc)
report(found)
"""


def test_no_docker_socket_no_leaked_descriptors_no_writes_outside(
        hostile: Hostile, sid: str) -> None:
    found = hostile.json_of(sid, HOST_VIEW, timeout_s=60)
    # Only the kernel's own ZMQ sockets, in its own socket folder.
    assert found["sockets"] and all(p.startswith("/kernel/k") for p in found["sockets"]), \
        found["sockets"]
    assert all(v != "WRITTEN" for v in found["writes"].values()), found["writes"]
    # Descriptors: pipes, sockets, event fds, /dev/null; no host file, no engine socket.
    for fd, target in found["fds"].items():
        # (gVisor names the pipes its exec was handed by the host "host:[n]")
        assert target.startswith(("pipe:", "socket:", "anon_inode:", "/dev/null", "/dev/pts",
                                  "/home/user", "/tmp", "/kernel", "/opt/", "/usr/",
                                  "unreadable", "FileNotFoundError", "host:[")), (fd, target)
    # From the host: the container mounts only its workspace and socket folder (and,
    # read-only, the gateway's /etc/hosts and, under runc, its own boot id and CRIU's cache of
    # the kernel's features, root's alone).
    mounts = hostile.container(sid).attrs["Mounts"]
    own_boot_id = ([] if hostile.runtime(sid) == "runsc"
                   else ["/run/criu.kdat", "/run/replgate/boot_id"])
    assert sorted(m["Destination"] for m in mounts) == [
        "/etc/hosts", "/home/user", "/kernel", *own_boot_id]
    assert not any(m["RW"] for m in mounts if m["Destination"] in ("/etc/hosts", *own_boot_id))
    assert not any("docker.sock" in (m.get("Source") or "") for m in mounts)


def test_planted_symlinks_never_reach_host_files(hostile: Hostile, sid: str) -> None:
    victim = Path(tempfile.mkdtemp(prefix="rg-victim-")) / "host.txt"
    victim.write_text("host content")
    victim.chmod(0o644)
    plant = f"""
import os
for n in range(1, 6):  # the folder holds 64 inodes at most
    for suffix in ('.json', '-1', '-2', '-3', '-4', '-5'):
        path = f'/kernel/k{{n}}{{suffix}}'
        if not os.path.exists(path):
            os.symlink({str(victim)!r}, path)
os.makedirs('.replgate', exist_ok=True)
os.rename('.replgate', 'old-replgate')
os.symlink({str(victim.parent)!r}, '.replgate')
os.symlink({str(victim)!r}, 'victim-link')
print('planted')
"""
    assert hostile.ok(sid, plant) == "planted\n"
    # Restarts (each writes a new connection file), a death, spilled output, file calls.
    assert hostile.client().post(f"/v1/sessions/{sid}/restart").status_code == 200
    assert hostile.run(sid, "import os\nos.kill(os.getpid(), 9)")["status"] == "died"
    assert hostile.run(sid, "print('v' * 100_000)")["truncated"] is True
    files = hostile.client()
    assert files.put(f"/v1/sessions/{sid}/files/victim-link", content=b"owned").status_code \
        == 400
    assert files.get(f"/v1/sessions/{sid}/files/victim-link").status_code == 400
    hostile.usable(sid)
    assert victim.read_text() == "host content"
    assert victim.stat().st_uid == 0 and victim.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in victim.parent.iterdir()) == ["host.txt"]


# -- persistence across a restart ---------------------------------------------------------

PLANT = """
import os, site, json
mark = "import builtins; builtins.PWNED = getattr(builtins, 'PWNED', []) + [{!r}]\\n"
ipython_dirs = {os.environ['IPYTHONDIR'], '/tmp/.ipython'}
for folder in ipython_dirs:
    os.makedirs(f'{folder}/profile_default/startup', exist_ok=True)
    open(f'{folder}/profile_default/startup/00-evil.py', 'w').write(mark.format('startup'))
    open(f'{folder}/profile_default/ipython_kernel_config.py', 'w').write(
        mark.format('kernel-config'))
    open(f'{folder}/profile_default/ipython_config.py', 'w').write(mark.format('config'))
user_site = site.getusersitepackages()
os.makedirs(user_site, exist_ok=True)
open(f'{user_site}/evil.pth', 'w').write(mark.format('pth').strip() + '\\n')
open(f'{user_site}/usercustomize.py', 'w').write(mark.format('usercustomize'))
# Files in the workspace named like what the kernel imports at start.
for name in ('sitecustomize', 'usercustomize', 'tornado', 'zmq', 'ipykernel', 'IPython',
             'matplotlib_inline', 'traitlets', 'jupyter_client', 'comm', 'numpy', 'pandas'):
    open(f'{name}.py', 'w').write(mark.format('workspace-' + name))
os.makedirs('replgate_kernel', exist_ok=True)
open('replgate_kernel/__init__.py', 'w').write(mark.format('launcher'))
open('replgate_kernel/__main__.py', 'w').write(mark.format('launcher-main'))
open('ipython_kernel_config.py', 'w').write(mark.format('cwd-config'))
open('mymodule.py', 'w').write('VALUE = 42\\n')
print('planted')
"""

CHECK = ("import builtins, mymodule\nprint(getattr(builtins, 'PWNED', None), mymodule.VALUE)")


def test_nothing_planted_survives_a_restart(hostile: Hostile, sid: str) -> None:
    assert hostile.ok(sid, PLANT) == "planted\n"
    assert hostile.client().post(f"/v1/sessions/{sid}/restart").status_code == 200
    # Nothing ran at start; the user's own module still imports from the workspace.
    assert hostile.ok(sid, CHECK) == "None 42\n"
    # The same after the kernel died and was restarted by the gateway.
    assert hostile.ok(sid, PLANT) == "planted\n"
    assert hostile.run(sid, "import os\nos.kill(os.getpid(), 9)")["status"] == "died"
    assert hostile.ok(sid, CHECK) == "None 42\n"
    hostile.usable(sid)


# -- another tenant ------------------------------------------------------------------------

PLANT_CANARY = """
import os, subprocess
canary = {canary!r}
os.environ['CANARY'] = canary
open('canary.txt', 'w').write(canary)
open('/tmp/canary.txt', 'w').write(canary)
open('/dev/shm/canary.txt', 'w').write(canary)
os.symlink('/home/user/canary.txt', '/tmp/canary-link')
kid = subprocess.Popen(['sh', '-c', 'sleep 900', canary])
print('planted')
"""


def test_another_tenant_sees_nothing_of_a_session(hostile: Hostile, sid: str) -> None:
    canary = f"canary-{secrets.token_hex(10)}"
    assert hostile.ok(sid, PLANT_CANARY.format(canary=canary)) == "planted\n"
    beta = hostile.new_session("beta")
    try:
        seen = hostile.json_of(beta, SNOOP, tenant="beta")
        assert canary not in json.dumps(seen)
        assert len(seen["cmdlines"]) == 2  # its own init and kernel only
        # Its mounts name only its own sandbox's folders on the host.
        alpha_box = hostile.sandbox(sid)["sandbox_id"]
        assert alpha_box not in seen["mounts"]
        # And the API answers another tenant's session as if it did not exist.
        as_beta = hostile.client("beta")
        for method, path in (("GET", ""), ("GET", "/files"), ("GET", "/files/canary.txt"),
                             ("GET", "/notebook"), ("GET", "/executions"),
                             ("POST", "/interrupt"), ("POST", "/restart"), ("DELETE", "")):
            answer = as_beta.request(method, f"/v1/sessions/{sid}{path}")
            assert answer.status_code == 404, (method, path, answer.status_code)
        answer = as_beta.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
        assert answer.status_code == 404
        assert sid not in json.dumps(as_beta.get("/v1/sessions").json())
        # The canary is still where alpha put it; beta's container shares none of it.
        assert hostile.ok(sid, "print(open('canary.txt').read())") == f"{canary}\n"
        beta_processes = hostile.host_processes(beta)
        assert not [p for p in beta_processes if canary in p]
        assert [p for p in hostile.host_processes(sid) if canary in p]
    finally:
        hostile.delete(beta, tenant="beta")
