"""TensorFlow glue for lab 08: logical CPU replicas, an in-process parameter-server cluster, and a
subprocess runner with a hard timeout.

Nothing here imports TensorFlow at module import time: ``import mpkit.tf.distribute`` works without it,
and ``available()`` / ``install_hint()`` say how to get it.

Facts this module is built on (TensorFlow 2.21, tensorflow-cpu, 2-core machine):

- ``tf.config.set_logical_device_configuration`` only works before TensorFlow initialises its
  devices (before the first op). :func:`logical_cpus` must be the first TensorFlow call.
- Every ``tf.distribute.Server`` of an in-process cluster shares the process. A worker's step
  blocks threads of its inter-op pool while it waits for the parameter server; that pool is
  sized by the core count, so 2 workers on 2 cores deadlocked (``coordinator.join()`` never
  returned). The official tutorial's recipe, used by :func:`in_process_cluster`, gives each
  worker ``inter_op_parallelism_threads = workers + 1``. With it, 30 steps take about a second.
- gRPC servers cannot be shut down from Python, and their ports stay open until the process ends.
  So the parameter-server demo runs in a child process (:func:`ps_demo`): the kernel keeps no
  ports, the child is killed if it runs past its timeout, and a hang becomes :class:`TFDistTimeout`.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings

from mpkit.plot.staleness import staleness
from mpkit.whole import is_number

TF_REQUIREMENTS = "requirements-tf.txt"  # at the repository root: tensorflow-cpu, or tensorflow where it has no wheel
RESULT_MARK = "MPKIT_TFDIST_RESULT "
QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",      # C++ INFO/WARNING/ERROR lines (incl. gRPC 'Failed to remove function remotely')
    "TF_ENABLE_ONEDNN_OPTS": "0",     # the oneDNN banner, and bit-identical sums across replicas
    "GRPC_VERBOSITY": "NONE",
    "ABSL_MIN_LOG_LEVEL": "3",
}


class TFDistError(RuntimeError):
    """A TensorFlow demo child failed; the message carries the end of its stderr (``.stderr``: all of it)."""

    def __init__(self, message, stderr=""):
        super().__init__(message)
        self.stderr = stderr


class TFDistTimeout(TFDistError):
    """A TensorFlow demo child ran past its timeout and was killed (with everything it started)."""


# ---------------------------------------------------------------------------------------------
# Installation and logging


def available() -> bool:
    """True when ``import tensorflow`` would find the package (checked without importing it)."""
    return importlib.util.find_spec("tensorflow") is not None


def install_hint() -> str:
    """What to run when TensorFlow is missing, in Korean and English (a notebook runs in ``labs/``,
    one folder below the requirement file)."""
    notebook, terminal = f"%pip install -r ../{TF_REQUIREMENTS}", f"pip install -r {TF_REQUIREMENTS}"
    return (f"TensorFlow가 설치되어 있지 않습니다. 노트북 셀에서 {notebook} 를 실행한 뒤 커널을 재시작하세요 "
            f"(터미널에서는 저장소 폴더에서 {terminal}).\n"
            f"TensorFlow is not installed. Run {notebook} in a notebook cell, then restart the kernel "
            f"(from a terminal, in the repository folder: {terminal}).")


def require() -> None:
    """Raise ``ModuleNotFoundError`` with :func:`install_hint` if TensorFlow is missing."""
    if not available():
        raise ModuleNotFoundError(install_hint(), name="tensorflow")


def quiet() -> None:
    """Silence TensorFlow's log lines: the C++/gRPC ones (environment, read at ``import tensorflow``,
    so call this before it) and, once TensorFlow is imported, its Python logger's INFO lines."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].get_logger().setLevel("ERROR")


# ---------------------------------------------------------------------------------------------
# MirroredStrategy helpers


def logical_cpus(n: int = 4) -> list[str]:
    """Split the physical CPU into ``n`` logical devices (replicas for MirroredStrategy).

    Must run before any other TensorFlow op. Calling it again with the same ``n`` (re-running
    the cell) is fine; a different ``n`` after TensorFlow started needs a kernel restart.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: pass a whole number of logical CPU devices >= 1, e.g. n=4")
    quiet()
    require()
    import tensorflow as tf

    quiet()   # now that TensorFlow is imported: its Python logger too (INFO lines of MirroredStrategy)
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu) or []
    if len(current) != n:
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        except RuntimeError as err:
            have = len(tf.config.list_logical_devices("CPU"))
            raise RuntimeError(
                f"TensorFlow already started with {have} CPU device(s), so it cannot be split into {n} now. "
                f"Restart the kernel and call logical_cpus({n}) before any other TensorFlow code. / "
                f"TensorFlow가 이미 CPU 장치 {have}개로 시작되어 {n}개로 나눌 수 없습니다. 커널을 재시작하고 "
                f"다른 TensorFlow 코드보다 먼저 logical_cpus({n})을 호출하세요.") from err
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def replica_values(strategy, variable) -> list:
    """The per-replica copies of a (Keras or tf) variable as numpy arrays, one per replica."""
    inner = getattr(variable, "value", variable)   # Keras 3 wraps the tf.Variable: .value is it
    if callable(inner) and not hasattr(inner, "device"):
        inner = variable
    return [v.numpy() for v in strategy.experimental_local_results(inner)]


def replica_devices(strategy, variable) -> list[str]:
    """The device of each per-replica copy of a (Keras or tf) variable."""
    inner = getattr(variable, "value", variable)
    if callable(inner) and not hasattr(inner, "device"):
        inner = variable
    return [v.device for v in strategy.experimental_local_results(inner)]


def tpu_strategy_or_default():
    """``(strategy, message)``: a TPUStrategy if a TPU can be found, else the default strategy.

    ``TPUClusterResolver()`` raises ``ValueError`` at once when no TPU is configured (no
    ``TPU_NAME``, not on a TPU VM), so this never waits on the network.
    """
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, tf.errors.NotFoundError, RuntimeError) as err:
        reason = str(err).splitlines()[0][:160]
        return tf.distribute.get_strategy(), (
            f"TPU를 찾을 수 없어 기본 전략(tf.distribute.get_strategy(), replica 1개)으로 같은 함수를 실행합니다.\n"
            f"No TPU found, so the same function runs under the default strategy "
            f"(tf.distribute.get_strategy(), 1 replica).\n  ({type(err).__name__}: {reason})")
    return strategy, (f"TPU 발견: replica {strategy.num_replicas_in_sync}개로 TPUStrategy를 사용합니다.\n"
                      f"TPU found: using TPUStrategy with {strategy.num_replicas_in_sync} replicas.")


# ---------------------------------------------------------------------------------------------
# Parameter-server cluster


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports the OS reports free on localhost (all held open until all are picked)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("localhost", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


class LocalCluster:
    """An in-process localhost cluster: ``.resolver`` for the strategy, ``.servers`` kept alive."""

    def __init__(self, spec, servers, resolver, inter_op_threads):
        self.spec, self.servers, self.resolver = spec, servers, resolver
        self.inter_op_threads = inter_op_threads

    def __repr__(self):
        return f"<LocalCluster {self.spec.as_dict()}>"


def in_process_cluster(workers: int = 2, ps: int = 1) -> LocalCluster:
    """Start ``workers`` worker and ``ps`` parameter-server ``tf.distribute.Server``s in this process.

    Follows the TensorFlow tutorial "Parameter server training with ParameterServerStrategy":
    ports from the OS, and ``inter_op_parallelism_threads = workers + 1`` for the workers so that
    blocked steps cannot starve each other of threads (without it, 2 workers on 2 cores hang).
    The servers live until the process exits: run this in a child process (see :func:`ps_demo`).
    """
    for name, value in (("workers", workers), ("ps", ps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: pass a whole number >= 1")
    quiet()
    import tensorflow as tf

    ports = free_ports(workers + ps)
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{p}" for p in ports[:workers]],
                                 "ps": [f"localhost:{p}" for p in ports[workers:]]})
    threads = max(workers + 1, os.cpu_count() or 1)
    worker_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)
    servers = [tf.distribute.Server(spec, job_name="worker", task_index=i, config=worker_config, protocol="grpc")
               for i in range(workers)]
    servers += [tf.distribute.Server(spec, job_name="ps", task_index=i, protocol="grpc") for i in range(ps)]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    return LocalCluster(spec, servers, resolver, threads)


# The training loop of the PS demo. Lab 08 prints this function's source: keep it readable.
def ps_train(workers=2, ps=2, steps=30, batch_size=16, lr=0.1, partition=True):
    """Asynchronous parameter-server training of a linear model with a custom loop.

    Runs in the process that calls it (use :func:`ps_demo` for the guarded child-process run).
    Returns a dict: where each variable lives, and per scheduled step its worker, loss, the
    version of the weights it read and how many other updates landed before its own (staleness).
    """
    import tensorflow as tf

    started = time.perf_counter()
    cluster = in_process_cluster(workers, ps)
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(ps) if partition else None
    strategy = tf.distribute.ParameterServerStrategy(cluster.resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    true_w = tf.constant([[1.0], [2.0], [-1.0], [0.5], [1.5], [-2.0]])
    features = true_w.shape[0]
    with strategy.scope():   # variables are created on /job:ps (w split over the ps tasks)
        w = tf.Variable(tf.zeros([features, 1]), name="w")
        b = tf.Variable(tf.zeros([1]), name="b")
        version = tf.Variable(0, dtype=tf.int64, name="version")   # +1 per applied update

    def dataset_fn(ctx):
        # The coordinator traces this once and every worker runs it, so ctx.input_pipeline_id is 0
        # on all of them. Unseeded random ops differ per worker instead: each worker draws its
        # own samples (data parallel, different data per worker) and a random tag that names its
        # iterator (the caller maps tags to worker numbers 0, 1, ... by first appearance).
        tag = tf.random.uniform([], maxval=2**62, dtype=tf.int64)
        x = tf.random.normal([512, features])
        y = x @ true_w + 0.3
        return tf.data.Dataset.from_tensor_slices((x, y, tf.fill([512], tag))).repeat().batch(batch_size)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
    shards = list(getattr(w, "variables", [w]))
    trainable = shards + [b]

    @tf.function
    def train_step(iterator):           # runs on whichever worker is free
        def replica_fn(x, y, ids):
            seen = version.read_value()                 # the weights' version this step starts from
            with tf.control_dependencies([seen]):
                with tf.GradientTape() as tape:
                    full_w = tf.concat([v.read_value() for v in shards], axis=0)
                    loss = tf.reduce_mean((x @ full_w + b - y) ** 2)
            grads = tape.gradient(loss, trainable)
            updates = [v.assign_sub(lr * g) for v, g in zip(trainable, grads)]
            with tf.control_dependencies(updates):
                after = version.assign_add(1)          # our update is number `after`
            return loss, ids[0], seen, after
        return strategy.run(replica_fn, args=next(iterator))

    scheduled = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(steps)]
    coordinator.join()                                  # wait until every scheduled step ran
    rows = [tuple(int(v) if i else float(v) for i, v in enumerate(r.fetch())) for r in scheduled]
    order = sorted(range(steps), key=lambda i: rows[i][3])   # by the order updates were applied
    tags = {}
    for i in order:
        tags.setdefault(rows[i][1], len(tags))
    return {
        "devices": {"w": [v.device for v in shards], "b": b.device, "version": version.device},
        "w_shards": [list(map(int, v.shape)) for v in shards],
        "losses": [rows[i][0] for i in order],
        "workers": [tags[rows[i][1]] for i in order],
        "seen": [rows[i][2] for i in order],
        "applied": [rows[i][3] for i in order],
        "staleness": [rows[i][3] - 1 - rows[i][2] for i in order],
        "w": [float(v) for v in tf.concat([v.read_value() for v in shards], 0).numpy().ravel()],
        "b": float(b.numpy()[0]),
        "true_w": [float(v) for v in true_w.numpy().ravel()],
        "true_b": 0.3,
        "cluster": cluster.spec.as_dict(),
        "inter_op_threads": cluster.inter_op_threads,
        "seconds": time.perf_counter() - started,
    }


class PSResult(dict):
    """The dict :func:`ps_train` returns, with attribute access (``res.losses``, ``res.devices``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


DEMOS = {"ps_train": ps_train}


def run_isolated(demo: str, timeout: float = 60.0, **kwargs) -> dict:
    """Run ``DEMOS[demo](**kwargs)`` in a fresh Python process and return its (JSON) result.

    The child loads this file on its own (not the ``mpkit`` package, so no torch import), runs in
    its own session, and is killed with its whole process group after ``timeout`` seconds:
    a hang becomes :class:`TFDistTimeout`, a crash :class:`TFDistError` with its stderr tail.
    """
    if demo not in DEMOS:
        raise ValueError(f"demo={demo!r} is unknown; use one of {', '.join(DEMOS)}")
    if not is_number(timeout) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout={timeout!r}: pass a positive number of seconds")
    require()
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('mpkit_tfdist_child', sys.argv[1])\n"
            "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
            "mod._child_main(sys.argv[2], sys.argv[3])\n")
    env = {**os.environ, **QUIET_ENV}
    proc = subprocess.Popen([sys.executable, "-c", code, os.path.abspath(__file__), demo, json.dumps(kwargs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise TFDistTimeout(
            f"{demo} did not finish in {timeout:g} s and was killed (a hang, e.g. coordinator.join() waiting "
            f"forever). / {demo}가 {timeout:g}초 안에 끝나지 않아 종료했습니다.{_tail(err)}", err) from None
    finally:
        _kill_group(proc)   # the child's own children, if any survived it
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_MARK):
            return PSResult(json.loads(line[len(RESULT_MARK):]))
    raise TFDistError(f"{demo} exited with code {proc.returncode} and no result. / "
                      f"{demo}가 결과 없이 종료했습니다 (종료 코드 {proc.returncode}).{_tail(err)}", err)


# What a peer's gRPC status looks like in TensorFlow's error text: the cluster's RPC transport failed
# (seen once in CI on 2026-12-05: a worker answered "Unable to parse request", grpc_status 13, to
# the chief's RunComponentFunction; 0 of 45 runs failed here, 25 quiet and 20 under load).
GRPC_PEER_ERROR = re.compile(r"Error received from peer|grpc_status:\d+")


def ps_demo(workers: int = 2, ps: int = 2, steps: int = 30, timeout: float = 60.0, attempts: int = 2,
            **kwargs) -> PSResult:
    """:func:`ps_train` in a guarded child process (see :func:`run_isolated`).

    A run whose child failed inside TensorFlow's gRPC transport (a peer's gRPC status in its
    stderr) is run again in a fresh process on fresh ports, up to ``attempts`` runs in all, with a
    warning that names the error; the result lists such errors under ``"transport_errors"``.
    A Python error in the demo, or a timeout, is raised at once.
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts={attempts!r}: pass a whole number >= 1")
    transport_errors = []
    for attempt in range(1, attempts + 1):
        try:
            result = run_isolated("ps_train", timeout=timeout, workers=workers, ps=ps, steps=steps, **kwargs)
        except TFDistTimeout:
            raise
        except TFDistError as err:
            # the final exception only: a gRPC status TensorFlow logged and recovered from earlier
            # must not turn a later Python error into a transport failure
            final = err.stderr[max(err.stderr.rfind("Traceback (most recent call last)"), 0):]
            peer = [line.strip() for line in final.splitlines() if GRPC_PEER_ERROR.search(line)]
            if not peer or attempt == attempts:
                raise
            transport_errors.append(peer[-1])
            warnings.warn(f"ps_train failed in TensorFlow's gRPC transport ({peer[-1]}); running it again "
                          f"in a fresh process (attempt {attempt + 1} of {attempts}). / TensorFlow gRPC 전송 "
                          f"오류로 ps_train을 새 프로세스에서 다시 실행합니다.", RuntimeWarning, stacklevel=2)
            continue
        result["transport_errors"] = transport_errors
        return result


def plot_ps(result, lang="ko"):
    """Loss per applied update (coloured by worker) and the staleness of each update, from
    :func:`ps_train`'s result (``mpkit.plot.staleness`` with a TensorFlow title). Returns a Figure."""
    title = {"ko": "ParameterServerStrategy (비동기): 적용된 업데이트마다의 손실",
             "en": "ParameterServerStrategy (async): loss of each applied update"}.get(lang)
    return staleness(result, lang=lang, title=title, log=True)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(text, lines=15):
    text = "\n".join((text or "").strip().splitlines()[-lines:])
    return f"\n--- child stderr (last lines) ---\n{text}" if text else ""


def _child_main(demo, kwargs_json):
    """Entry point of the child process: run the demo, print one result line, exit hard.

    ``os._exit`` skips interpreter shutdown, where TensorFlow would try to tear down the gRPC
    servers (slow, noisy) — the OS closes their ports when the process ends.
    """
    quiet()
    try:
        result = DEMOS[demo](**json.loads(kwargs_json))
        sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - report anything, then exit non-zero
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


__all__ = ["available", "install_hint", "require", "quiet", "logical_cpus", "replica_values", "replica_devices",
           "tpu_strategy_or_default", "free_ports", "in_process_cluster", "LocalCluster", "ps_train", "ps_demo",
           "run_isolated", "plot_ps", "PSResult", "TFDistError", "TFDistTimeout", "TF_REQUIREMENTS",
           "GRPC_PEER_ERROR"]
