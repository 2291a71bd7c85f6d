"""mpkit.tf.distribute (imported as tfdist): TensorFlow glue for lab 08.

TensorFlow is never imported into the pytest process: every TF check runs in a child process
(one for MirroredStrategy + TPU fallback, one for the parameter-server cluster), so the
logical-device split cannot leak between tests and a hang is killed by a timeout.
"""
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mpkit.tf import distribute as tfdist

needs_tf = pytest.mark.skipif(not tfdist.available(), reason="TensorFlow not installed: " + tfdist.install_hint())


def test_import_does_not_load_tensorflow():
    code = "import sys, mpkit.tf.distribute; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_install_hint_is_bilingual_and_names_the_requirement_file():
    hint = tfdist.install_hint()
    assert "%pip install -r ../requirements-tf.txt" in hint and "설치" in hint and "Run" in hint
    assert (Path(__file__).resolve().parents[1] / tfdist.TF_REQUIREMENTS).is_file()


def test_require_names_the_package(monkeypatch):
    monkeypatch.setattr(tfdist, "available", lambda: False)
    with pytest.raises(ModuleNotFoundError, match="pip install -r ../requirements-tf.txt"):
        tfdist.require()


def test_free_ports_are_distinct():
    ports = tfdist.free_ports(5)
    assert len(set(ports)) == 5 and all(1024 <= p <= 65535 for p in ports)


@pytest.mark.parametrize("kwargs, match", [
    ({"demo": "nope"}, "unknown"),
    ({"demo": "ps_train", "timeout": 0}, "positive"),
])
def test_run_isolated_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tfdist.run_isolated(**kwargs)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_logical_cpus_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="whole number"):
        tfdist.logical_cpus(bad)


@needs_tf
@pytest.mark.timeout(60)
def test_timeout_kills_the_child_and_leaves_nothing(no_leftovers):
    start = time.monotonic()
    with pytest.raises(tfdist.TFDistTimeout, match="did not finish in 0.5 s"):
        tfdist.ps_demo(timeout=0.5)     # still importing TensorFlow when the guard fires
    assert time.monotonic() - start < 15


PEER_TAIL = ("tensorflow.python.framework.errors_impl.InternalError: 2 root error(s) found.\n"
             ":UNKNOWN:Error received from peer  {grpc_message:\"Unable to parse request\", grpc_status:13}\n")


def _children(*outcomes):
    """A stand-in for run_isolated that fails or succeeds in the given order, counting its calls."""
    calls = []

    def fake(demo, timeout, **kwargs):
        outcome = outcomes[len(calls)]
        calls.append(kwargs)
        if isinstance(outcome, Exception):
            raise outcome
        return tfdist.PSResult(outcome)
    return fake, calls


def test_ps_demo_runs_again_after_a_grpc_transport_failure(monkeypatch):
    fake, calls = _children(tfdist.TFDistError("ps_train exited with code 1", PEER_TAIL), {"losses": [1.0]})
    monkeypatch.setattr(tfdist, "run_isolated", fake)
    with pytest.warns(RuntimeWarning, match="gRPC transport .*Unable to parse request.*attempt 2 of 2"):
        res = tfdist.ps_demo(workers=2, ps=2, steps=3)
    assert len(calls) == 2 and res.losses == [1.0]
    assert len(res.transport_errors) == 1 and "grpc_status:13" in res.transport_errors[0]


@pytest.mark.parametrize("first", [
    tfdist.TFDistError("ps_train exited with code 1", "Traceback ...\nValueError: bad shape\n"),   # our bug
    tfdist.TFDistTimeout("ps_train did not finish in 1 s", PEER_TAIL),                           # a hang
    tfdist.TFDistError("ps_train exited with code 1", "W coordinator: worker 1 UnavailableError grpc_status:14 "
                       "(recovered)\nTraceback (most recent call last):\nValueError: bad shape\n"),  # logged, then ours
])
def test_ps_demo_raises_a_python_error_or_a_timeout_at_once(monkeypatch, first):
    fake, calls = _children(first, {"losses": [1.0]})
    monkeypatch.setattr(tfdist, "run_isolated", fake)
    with pytest.raises(type(first)):
        tfdist.ps_demo()
    assert len(calls) == 1


def test_ps_demo_gives_up_after_its_attempts(monkeypatch):
    fake, calls = _children(*[tfdist.TFDistError("ps_train exited with code 1", PEER_TAIL)] * 3)
    monkeypatch.setattr(tfdist, "run_isolated", fake)
    with pytest.warns(RuntimeWarning), pytest.raises(tfdist.TFDistError, match="code 1"):
        tfdist.ps_demo(attempts=3)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="attempts=0"):
        tfdist.ps_demo(attempts=0)


MIRRORED_CHILD = textwrap.dedent("""
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("tfdist", sys.argv[1])
    tfdist = importlib.util.module_from_spec(spec); spec.loader.exec_module(tfdist)
    names = tfdist.logical_cpus(4)
    again = tfdist.logical_cpus(4)            # re-running the cell is fine
    import numpy as np, tensorflow as tf, keras
    try:
        tfdist.logical_cpus(2)
        resplit = "no error"
    except RuntimeError as err:
        resplit = str(err)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    x = tf.random.stateless_normal([64, 8], seed=[1, 2]); y = tf.reduce_sum(x, 1, keepdims=True)
    def fit(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=False)
        losses = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history["loss"]
        return model, losses
    model, losses = fit(strategy)
    copies = tfdist.replica_values(strategy, model.weights[0])
    fallback, message = tfdist.tpu_strategy_or_default()
    _, ref_losses = fit(fallback)
    print(json.dumps({
        "names": names, "again": again, "resplit": resplit, "replicas": strategy.num_replicas_in_sync,
        "devices": tfdist.replica_devices(strategy, model.weights[0]),
        "copies": len(copies), "identical": all(np.array_equal(copies[0], c) for c in copies),
        "losses": losses, "ref_losses": ref_losses, "message": message,
        "fallback_replicas": fallback.num_replicas_in_sync}))
""")


@needs_tf
@pytest.mark.timeout(150)
def test_mirrored_on_logical_cpus_and_tpu_fallback(tmp_path):
    env = {**__import__("os").environ, **tfdist.QUIET_ENV}
    out = subprocess.run([sys.executable, "-c", MIRRORED_CHILD, tfdist.__file__], capture_output=True, text=True,
                         timeout=140, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(res["names"]) == 4 and res["again"] == res["names"]
    assert "Restart the kernel" in res["resplit"] and "커널을 재시작" in res["resplit"]
    assert res["replicas"] == 4
    assert [d.rsplit(":", 1)[1] for d in res["devices"]] == ["0", "1", "2", "3"]
    assert res["copies"] == 4 and res["identical"]
    assert res["fallback_replicas"] == 1 and "No TPU found" in res["message"] and "TPU를 찾을 수 없어" in res["message"]
    # data parallel over 4 replicas = one device on the whole batch (same losses)
    assert res["losses"] == pytest.approx(res["ref_losses"], rel=1e-5)
    assert list(tmp_path.iterdir()) == []


@needs_tf
@pytest.mark.timeout(120)
def test_parameter_server_cluster_trains_asynchronously(no_leftovers):
    res = tfdist.ps_demo(workers=2, ps=2, steps=24, timeout=110)
    assert all(d.startswith("/job:ps/") for d in [*res.devices["w"], res.devices["b"], res.devices["version"]])
    # variable_partitioner: w (6 x 1) split in two shards, one per parameter server
    assert res.w_shards == [[3, 1], [3, 1]]
    assert {d.split("/task:")[1][0] for d in res.devices["w"]} == {"0", "1"}
    assert res.applied == list(range(1, 25))                  # every scheduled step applied once
    assert set(res.workers) == {0, 1}                         # both workers took steps
    assert all(s >= 0 for s in res.staleness) and len(res.staleness) == 24
    losses = res.losses
    assert sum(losses[-5:]) / 5 < 0.1 * sum(losses[:5]) / 5   # loss decreases
    assert max(abs(a - b) for a, b in zip(res.w, res.true_w)) < 0.1
    assert res.inter_op_threads >= 3
    # a smoke check of the real run's record: attempts=2 by default, so a result comes after at
    # most one retried transport failure (what is retried, and what each record says, is tested
    # with the stand-in child above)
    assert isinstance(res.transport_errors, list) and len(res.transport_errors) <= 1


@pytest.mark.parametrize("lang", ["ko", "en"])
def test_plot_ps_draws_loss_and_staleness(lang):
    fake = {"losses": [4.0, 2.0, 1.5, 0.5, 0.2, 0.05], "workers": [0, 1, 1, 0, 1, 0],
            "staleness": [0, 1, 0, 1, 0, 0]}
    fig = tfdist.plot_ps(fake, lang=lang)
    top, bottom = fig.axes
    assert top.get_yscale() == "log" and len(bottom.patches) == 6
    assert [t.get_text() for t in top.get_legend().get_texts()][:2] == (
        ["워커 0", "워커 1"] if lang == "ko" else ["worker 0", "worker 1"])
