"""Start a JupyterLab server for a test, wait until it answers, and always stop it.

Shared by the browser test and the fresh-install check, which both need a real server on
127.0.0.1 with a random port and token, run as root in CI, and a log to print on failure.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
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


@contextmanager
def jupyter_lab(command: str, cwd: Path, workdir: Path, *, env=None, timeout: float = 120.0):
    """Run ``command`` (a shell command that starts JupyterLab) and yield (base_url, token, log path)."""
    port, token = free_port(), secrets.token_hex(16)
    config_dir = write_config(workdir / "jupyter-config", port, token)
    log_path = workdir / "jupyter.log"
    full_env = {**os.environ, **(env or {}), "JUPYTER_CONFIG_DIR": str(config_dir),
                "JUPYTER_RUNTIME_DIR": str(workdir / "jupyter-runtime")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=full_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(f"{base_url}/api/status?token={token}", proc, timeout)
        yield base_url, token, log_path
    except BaseException:
        print(f"--- JupyterLab log ({log_path}) ---\n{log_path.read_text(errors='replace')[-6000:]}")
        raise
    finally:
        shutdown_kernels(base_url, token)
        stop(proc)


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
