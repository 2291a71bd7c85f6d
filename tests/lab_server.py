"""Start a JupyterLab server for a test, wait until it answers, and always stop it.

Shared by the browser test and the fresh-install check, which both need a real server on
127.0.0.1 with a random port and token, run as root in CI, and a log to print on failure.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

# The server must listen on the port its config names (the URL and token are known before it
# answers), so the port is chosen first and can be taken by another process before the server
# binds it. jupyter_server cannot be handed a bound socket, and its own port=0 mode has the same
# window (it binds, closes, then listens), so a server that exits because its port was taken is
# started again on a fresh port, at most this many times in all.
PORT_ATTEMPTS = 3
PORT_TAKEN = re.compile(rb"port \d+ is (already in use|not available)|no available port could be found")


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a server that must be told its port before it binds it
    (JupyterLab here, torchrun's c10d store in test_multinode): callers retry if it is taken."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(config_dir: Path, port: int, token: str) -> Path:
    """A jupyter_server config that pins port/token/host and allows root (CI runs as root)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_server_config.py").write_text(
        f"c.ServerApp.ip = '127.0.0.1'\nc.ServerApp.port = {port}\nc.ServerApp.port_retries = 0\n"
        f"c.IdentityProvider.token = {token!r}\nc.ServerApp.open_browser = False\n"
        "c.ServerApp.allow_root = True\nc.LabApp.news_url = None\nc.LabApp.check_for_updates_class = "
        "'jupyterlab.NeverCheckForUpdate'\n", encoding="utf-8")
    return config_dir


def wait_until_answering(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer {url} within {timeout:.0f} s (last error: {last})")


def shutdown_kernels(base_url: str, token: str) -> None:
    """Kernels run in their own sessions, so killing the server's group would orphan them."""
    try:
        with urllib.request.urlopen(f"{base_url}/api/kernels?token={token}", timeout=5) as response:
            kernels = json.load(response)
    except OSError:
        return
    for kernel in kernels:
        request = urllib.request.Request(f"{base_url}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
        try:
            urllib.request.urlopen(request, timeout=15).close()
        except OSError:
            pass


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and every kernel it started (they share its process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # kernels may outlive a server that exited on SIGTERM
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start(command: str, cwd: Path, workdir: Path, env, timeout: float):
    """Start ``command`` with a config for a fresh port and token; return (process, base URL,
    token, log path) once it answers. A server whose port was taken is started again (PORT_ATTEMPTS)."""
    token = secrets.token_hex(16)
    log_path = workdir / "jupyter.log"
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        config_dir = write_config(workdir / "jupyter-config", port, token)
        full_env = {**os.environ, **(env or {}), "JUPYTER_CONFIG_DIR": str(config_dir),
                    "JUPYTER_RUNTIME_DIR": str(workdir / "jupyter-runtime")}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=full_env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_until_answering(f"{base_url}/api/status?token={token}", proc, timeout)
        except BaseException as exc:
            stop(proc)
            # RuntimeError: it exited before answering; the log says whether its port was taken
            if not (isinstance(exc, RuntimeError) and attempt < PORT_ATTEMPTS
                    and PORT_TAKEN.search(log_path.read_bytes())):
                print_log(log_path)
                raise
        else:
            return proc, base_url, token, log_path
    raise AssertionError("unreachable: the last attempt returns or raises")


def print_log(log_path: Path) -> None:
    print(f"--- JupyterLab log ({log_path}) ---\n{log_path.read_text(errors='replace')[-6000:]}")


@contextmanager
def jupyter_lab(command: str, cwd: Path, workdir: Path, *, env=None, timeout: float = 120.0):
    """Run ``command`` (a shell command that starts JupyterLab) and yield (base_url, token, log path)."""
    proc, base_url, token, log_path = start(command, cwd, workdir, env, timeout)
    try:
        yield base_url, token, log_path
    except BaseException:
        print_log(log_path)
        raise
    finally:
        shutdown_kernels(base_url, token)
        stop(proc)
