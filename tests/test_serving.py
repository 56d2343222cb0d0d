"""Serving a bundle over HTTP and replaying arrival traces: a real server on 127.0.0.1 around a
real Runtime with ONNX Runtime; malformed requests are refused with a 4xx that says what was
wrong, and the server keeps serving; it runs without torch; a replay writes one record per request.

The SubNets are built with onnx.helper (no torch needed, and fast): a convolution, ReLU, global
average pooling and a linear layer, at two resolutions."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from autotailor.errors import LoadHarnessError
from autotailor.runtime import ArrivalTrace, Bundle, CpuSchedule, SubNetEntry, replay
from autotailor.runtime.serving import PROTOCOL, start

# name: (channels, resolution, accuracy)
SPECS = {"small": (4, 16, 0.6), "large": (8, 32, 0.8)}


def _onnx(path: Path, ch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rng.standard_normal((ch, 3, 3, 3)) * 0.3), ("b", rng.standard_normal(ch) * 0.1),
        ("fw", rng.standard_normal((10, ch))), ("fb", rng.standard_normal(10) * 0.1))]
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, None, None])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _session(path: Path) -> ort.InferenceSession:
    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads = 1, 1
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Bundle:
    models = tmp_path_factory.mktemp("models")
    entries = []
    for i, (name, (ch, res, acc)) in enumerate(SPECS.items()):
        _onnx(models / f"{name}.onnx", ch, i)
        s, x = _session(models / f"{name}.onnx"), np.zeros((1, 3, res, res), np.float32)
        times = []
        for _ in range(12):
            t = time.perf_counter()
            s.run(None, {"input": x})
            times.append((time.perf_counter() - t) * 1000)
        entries.append(SubNetEntry(name=name, file=str(models / f"{name}.onnx"), format="onnx",
                                   input_shape=(1, 3, res, res), device="ort-cpu:threads=1",
                                   measured_latency_ms=float(np.median(times[2:])), predicted_accuracy=acc))
    return Bundle.write(tmp_path_factory.mktemp("bundle"), entries, meta={"model": "two tiny convnets"})


@pytest.fixture(scope="module")
def server(bundle):
    """Serves the large SubNet (a static policy) with a body limit of 0.05 MB (52428 bytes)."""
    srv = start(bundle.root, slo_ms=1000.0, policy="static", policy_options={"pick": "large"}, max_body_mb=0.05)
    yield srv
    srv.shutdown()
    srv.server_close()


def _call(url: str, method: str, path: str, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        assert r.getheader("Content-Type") == "application/json"
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _infer(url: str, x: np.ndarray) -> tuple[int, dict]:
    return _call(url, "POST", "/infer", x.astype("<f4").tobytes(),
                 {"X-Shape": ",".join(map(str, x.shape)), "Content-Type": "application/octet-stream"})


# ---------------------------------------------------------------- serving


def test_the_server_answers_what_onnx_runtime_outputs_on_the_subnet(server, bundle):
    rng = np.random.default_rng(0)
    ref = _session(bundle.path(bundle["large"]))
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    status, answer = _infer(server.url, x)
    assert status == 200, answer
    want = ref.run(None, {"input": x})[0]
    got = np.asarray(answer["output"], dtype=np.float32)  # float32 -> JSON -> float32 is exact
    assert got.shape == (2, 10) == tuple(answer["output_shape"]) and np.array_equal(got, want)
    assert answer["argmax"] == want.argmax(axis=1).tolist() and answer["subnet"] == "large"
    assert answer["latency_ms"] > 0 and answer["slowdown"] > 0 and answer["within_slo"] is True
    assert set(answer["forecast"]) == {"mean", "upper"} and answer["queue_ms"] >= 0
    # another resolution is resized to the SubNet's, as Runtime.infer does
    status, answer = _infer(server.url, rng.standard_normal((1, 3, 20, 24)).astype(np.float32))
    assert status == 200 and answer["output_shape"] == [1, 10]


def test_metrics_report_the_current_subnet_the_reading_and_the_goal_attainment(bundle):
    srv = start(bundle.root, slo_ms=1000.0, policy="forecast")
    try:
        status, m = _call(srv.url, "GET", "/metrics")
        assert status == 200 and m["inferences"] == 0 and m["current"] is None and m["slo_met"] is None
        x = np.zeros((1, 3, 32, 32), np.float32)
        for _ in range(4):
            assert _infer(srv.url, x)[0] == 200
        status, m = _call(srv.url, "GET", "/metrics")
        assert status == 200 and m["protocol"] == PROTOCOL and m["policy"] == "forecast"
        assert m["current"] == "large" and m["loaded"] == ["large"]  # a goal of 1 s: the most accurate
        assert m["inferences"] == 4 and m["per_subnet"] == {"large": 4} and m["slo_met"] == 1.0
        assert m["switches"] == 0 and m["switch_ms"]["total"] > 0  # the first choice loads the SubNet
        assert m["reading"]["cpu_count"] >= 1 and "mem_available_mb" in m["reading"]
        assert m["forecast"]["mean"] > 0 and m["forecast"]["upper"] >= m["forecast"]["mean"]
        assert m["latency_ms"]["p50"] > 0 and m["requests"] == {"served": 5, "refused": {}, "failed": 0}
        status, h = _call(srv.url, "GET", "/health")
        assert status == 200 and h["status"] == "ok" and [s["name"] for s in h["subnets"]] == ["small", "large"]
        assert h["input"]["example_shape"] == [1, 3, 32, 32]
    finally:
        srv.shutdown()
        srv.server_close()


def _raw(url: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> tuple[int, dict]:
    """A request with exactly these headers (no Content-Length added)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers:
            conn.putheader(k, v)
        conn.endheaders(body or None)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


X = np.zeros((1, 3, 32, 32), np.float32)
OK = {"Content-Type": "application/octet-stream"}


@pytest.mark.parametrize("method, path, body, headers, status, message", [
    ("POST", "/infer", X.tobytes(), OK, 400, "POST /infer needs the header X-Shape with the input's shape, e.g. 'X-Shape: 1,3,32,32'"),
    ("POST", "/infer", X.tobytes(), {"X-Shape": "1,3,x,32"}, 400, "X-Shape '1,3,x,32' is not a shape: it must be up to 8 positive integers"),
    ("POST", "/infer", X.tobytes(), {"X-Shape": "1;3;32;32"}, 400, "is not a shape"),
    ("POST", "/infer", X.tobytes(), {"X-Shape": "1,3,0,32"}, 400, "is not a shape"),
    ("POST", "/infer", X.tobytes(), {"X-Shape": "1,3,32,32,"}, 400, "is not a shape"),
    ("POST", "/infer", np.zeros((1, 4, 32, 32), np.float32).tobytes(), {"X-Shape": "1,4,32,32"}, 400,
     "X-Shape 1,4,32,32 does not fit this bundle: it takes float32 N x 3 x H x W"),
    ("POST", "/infer", X.tobytes(), {"X-Shape": "3,32,32"}, 400, "X-Shape 3,32,32 does not fit this bundle"),
    ("POST", "/infer", X.astype(np.float64).tobytes(), {"X-Shape": "1,3,32,32"}, 400,
     "the body is 24576 bytes, but X-Shape 1,3,32,32 of float32 takes 12288 bytes (4 per element); the body holds "
     "8 bytes per element: float64 data?"),
    ("POST", "/infer", X.tobytes()[:-4], {"X-Shape": "1,3,32,32"}, 400, "the body is 12284 bytes, but X-Shape"),
    ("POST", "/infer", X.astype(np.float16).tobytes(), {"X-Shape": "1,3,32,32", "X-Dtype": "float16"}, 415,
     "X-Dtype 'float16' is not taken"),
    ("POST", "/infer", b'{"x": []}', {"X-Shape": "1,3,32,32", "Content-Type": "application/json"}, 415,
     "takes the input as raw little-endian float32 bytes (Content-Type: application/octet-stream), not 'application/json'"),
    ("POST", "/infer", np.full((1, 3, 32, 32), np.nan, np.float32).tobytes(), {"X-Shape": "1,3,32,32"}, 400,
     "the input holds 3072 NaN or infinite values"),
    ("POST", "/infer", np.zeros((1, 3, 80, 80), np.float32).tobytes(), {"X-Shape": "1,3,80,80"}, 413,
     "the body is 76800 bytes, above this server's limit of 52428 bytes"),
    ("GET", "/nope", None, {}, 404, "no route GET /nope; routes: POST /infer, GET /metrics, GET /health"),
    ("POST", "/predict", X.tobytes(), {"X-Shape": "1,3,32,32"}, 404, "no route POST /predict"),
    ("GET", "/infer", None, {}, 405, "/infer takes POST, not GET"),
    ("PUT", "/metrics", b"{}", {}, 405, "/metrics takes GET, not PUT"),
])
def test_a_malformed_request_gets_a_4xx_that_says_what_to_change_and_the_server_serves_on(
        server, method, path, body, headers, status, message):
    before = _call(server.url, "GET", "/metrics")[1]["requests"]["refused"].get(str(status), 0)
    got, answer = _call(server.url, method, path, body, {**OK, **headers} if method == "POST" else headers)
    assert got == status and answer["error"]["status"] == status
    assert message in answer["error"]["message"], answer
    assert _infer(server.url, X)[0] == 200
    assert _call(server.url, "GET", "/metrics")[1]["requests"]["refused"][str(status)] == before + 1


def test_requests_without_a_readable_length_are_refused_too(server):
    status, answer = _raw(server.url, "POST", "/infer", [("X-Shape", "1,3,32,32")])
    assert status == 411 and "needs a Content-Length header" in answer["error"]["message"]
    status, answer = _raw(server.url, "POST", "/infer", [("X-Shape", "1,3,32,32"), ("Content-Length", "many")])
    assert status == 400 and "Content-Length 'many' is not a non-negative integer" in answer["error"]["message"]
    assert _infer(server.url, X)[0] == 200


def test_concurrent_clients_are_served_one_inference_at_a_time(server, bundle):
    ref = _session(bundle.path(bundle["large"]))
    xs = [np.random.default_rng(i).standard_normal((1, 3, 32, 32)).astype(np.float32) for i in range(8)]
    answers: dict[int, dict] = {}

    def client(i: int) -> None:
        answers[i] = _infer(server.url, xs[i])[1]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(answers) == list(range(8))
    for i, a in answers.items():
        assert np.array_equal(np.asarray(a["output"], np.float32), ref.run(None, {"input": xs[i]})[0])


def test_the_server_runs_without_torch(bundle, tmp_path):
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    code = f"""
import sys, json, http.client
sys.modules["torch"] = None  # from here on, "import torch" raises ImportError
import numpy as np
from urllib.parse import urlsplit
from autotailor.runtime.serving import start
srv = start({str(bundle.root)!r}, slo_ms=1000.0, policy="static", policy_options={{"pick": "large"}})
u = urlsplit(srv.url)
c = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
c.request("POST", "/infer", np.load({str(tmp_path / "x.npy")!r}).astype("<f4").tobytes(), {{"X-Shape": "1,3,32,32"}})
answer = json.loads(c.getresponse().read())
srv.shutdown(); srv.server_close()
answer["torch"] = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] == "torch")
print(json.dumps(answer))
"""
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["torch"] == [] and answer["subnet"] == "large"
    want = _session(bundle.path(bundle["large"])).run(None, {"input": x})[0]
    assert np.array_equal(np.asarray(answer["output"], np.float32), want)


# ---------------------------------------------------------------- replay


FIELDS = {"request", "arrival", "start", "end", "subnet", "latency_ms", "slowdown", "forecast_mean",
          "forecast_upper", "switch_ms", "reading", "response_ms", "wait_ms"}


def test_a_replay_writes_one_record_per_request_and_sums_them_up(bundle, tmp_path):
    trace = ArrivalTrace.steady(40, 0.5).write(tmp_path / "steady.json")
    out = tmp_path / "replay.jsonl"
    summary = replay(bundle.root, trace, slo_ms=1000.0, out_path=out, policy="static")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20 and [r["request"] for r in rows] == list(range(20))
    assert all(FIELDS <= set(r) and "load_duty" not in r for r in rows)
    assert all(r["arrival"] - 0.002 <= r["start"] < r["end"] and r["subnet"] == "large" for r in rows)
    assert rows[-1]["arrival"] - rows[0]["arrival"] == pytest.approx(19 / 40, abs=0.01)
    assert all(r["reading"]["cpu_count"] >= 1 for r in rows)
    assert all(r["response_ms"] >= r["latency_ms"] for r in rows)
    assert summary["inferences"] == 20 and summary["per_subnet"] == {"large": 20} and summary["slo_met"] == 1.0
    assert summary["trace"]["requests"] == 20 and summary["trace"]["kind"] == "steady" and summary["load"] is None
    assert summary["response_ms"]["p50"] > 0 and summary["response_slo_met"] == 1.0 and summary["out"] == str(out)
    json.dumps(summary)  # the CLI prints it as JSON


def test_a_replay_under_a_load_schedule_records_the_duty_and_leaves_no_process(bundle, tmp_path):
    trace = ArrivalTrace.steady(20, 0.5).write(tmp_path / "steady.json")
    load = CpuSchedule.constant(0.5, workers=1, period_ms=50).write(tmp_path / "duty.json")
    before = {p for p in os.listdir("/proc") if p.isdigit()}
    summary = replay(bundle.root, trace, slo_ms=1000.0, out_path=tmp_path / "r.jsonl", load=load, policy="forecast")
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all(r["load_duty"] == 0.5 for r in rows)
    assert summary["load"] == {"path": str(load), "workers": 1, "period_ms": 50.0, "schedule": [[0.0, 0.5]]}
    children = [p for p in os.listdir("/proc") if p.isdigit() and p not in before
                and _ppid(p) == os.getpid()]
    assert children == []
    (tmp_path / "empty.json").write_text(json.dumps({"schema": "autotailor-arrivals/1", "times": []}))
    with pytest.raises(LoadHarnessError, match="empty.json holds no arrivals"):
        replay(bundle.root, tmp_path / "empty.json", slo_ms=10.0)


def _ppid(pid: str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_one_connection_carries_many_requests_and_survives_a_refusal(server):
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    try:
        statuses = []
        for method, path, body, headers in [
                ("POST", "/infer", X.tobytes(), {"X-Shape": "1,3,32,32"}),
                ("GET", "/infer", None, {}),  # refused without a body: the connection stays open
                ("POST", "/infer", X.tobytes(), {"X-Shape": "1,3,32,32"}),
                ("GET", "/health", None, {})]:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            json.loads(r.read())
            statuses.append(r.status)
        assert statuses == [200, 405, 200, 200]
    finally:
        conn.close()


def test_the_serve_command_answers_refuses_and_stops_on_sigterm(bundle):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "autotailor.cli", "serve", str(bundle.root), "--slo-ms", "1000",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
        status, answer = _infer(url, x)
        assert status == 200 and answer["subnet"] in SPECS
        status, refused = _call(url, "POST", "/infer", b"\0" * 12, {"X-Shape": "1,3,32,32"})
        assert status == 400 and "bytes" in refused["error"]["message"]
        assert _infer(url, x)[0] == 200  # still serving
        status, metrics = _call(url, "GET", "/metrics")
        assert status == 200 and metrics["requests"]["served"] == 2 and metrics["current"] in SPECS
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
