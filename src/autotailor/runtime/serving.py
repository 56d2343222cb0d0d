"""An HTTP inference endpoint around one :class:`~autotailor.runtime.runtime.Runtime`.

Protocol ``autotailor-serving/1`` (docs/runtime.md, "Serving over HTTP"); every answer is JSON,
errors are ``{"error": {"status", "reason", "message"}}``:

- ``POST /infer``: the body is the input tensor as raw little-endian float32 bytes, C order
  (``x.astype("<f4").tobytes()``), its shape in the header ``X-Shape: 1,3,32,32`` (N x C x H x W;
  H and W are resized to the current SubNet's resolution). ``Content-Type: application/octet-stream``
  is advised (other types pass, so that ``curl --data-binary`` works; JSON, text and multipart bodies
  are refused); ``X-Dtype``, when given, must be ``float32``. The answer:
  ``{"output", "output_shape", "argmax", "subnet", "latency_ms", "slowdown", "forecast": {"mean",
  "upper"}, "switch_ms", "queue_ms", "slo_ms", "within_slo"}``.
- ``GET /metrics``: the current SubNet, the loaded ones, the monitor's reading, the forecast, the
  goal attainment so far (``slo_met``: the share of inferences within ``slo_ms``), switches and
  their cost, inferences per SubNet (``Runtime.stats()``), and the requests answered and refused.
- ``GET /health``: the bundle, its SubNets and the input the server takes.

A bad request gets a 4xx answer saying what was wrong and the server keeps serving: 400 for a
missing or malformed ``X-Shape``, a shape the bundle does not take (the message says which it
takes), a body whose byte count is not the shape's (float64 data is named as such), non-finite
values; 411 without ``Content-Length``; 413 for a body above ``max_body_mb``, refused on the
declared length before it is read; 415 for a JSON, text or multipart body or another dtype; 404 for an unknown
route, 405 for a known route with another method.

Loopback by default: anyone who can reach the port can run inferences. One inference at a time
(the runtime measures each inference's latency, and two at once would slow each other); requests
that arrive meanwhile wait, and their answer's ``queue_ms`` says how long.

No torch here: the standard library, numpy and the SubNets' runtime (ONNX Runtime).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple
from urllib.parse import urlsplit

import numpy as np

from autotailor.errors import ServingError
from autotailor.jsonhttp import JsonHandler, JsonServer
from autotailor.runtime.bundle import Bundle
from autotailor.runtime.policies import Policy
from autotailor.runtime.runtime import Runtime

log = logging.getLogger(__name__)

PROTOCOL = "autotailor-serving/1"
DEFAULT_MAX_BODY_MB = 32.0
MAX_DIMS = 8
_ROUTES = {"/infer": "POST", "/metrics": "GET", "/health": "GET"}
_ROUTE_LIST = "POST /infer, GET /metrics, GET /health"
_FLOAT64_HINT = ("; the body holds 8 bytes per element: float64 data? send x.astype('<f4').tobytes()")


class Refusal(NamedTuple):
    """A request the server refuses: its HTTP 4xx status and what to change."""

    status: int
    message: str


class Service:
    """What the server serves, apart from HTTP: one runtime, one inference at a time, counters."""

    def __init__(self, runtime: Runtime, max_body_bytes: int):
        self.runtime = runtime
        self.max_body_bytes = max_body_bytes
        self.started_at = time.time()
        self.served = 0
        self.refused: dict[int, int] = {}  # HTTP status -> requests answered with it
        self.failed = 0  # requests that failed on the server's side (HTTP 500)
        self._lock = threading.Lock()  # one inference at a time; stats read between inferences
        self._count = threading.Lock()
        shapes = [s.input_shape for s in runtime.subnets]
        self.example = (1, *max(shapes, key=lambda s: math.prod(s[1:]))[1:])
        if all(len(s) == 4 for s in shapes) and len({s[1] for s in shapes}) == 1:
            self.takes = f"N x {shapes[0][1]} x H x W (any batch size N; H and W are resized to the SubNet's)"
        else:
            self.takes = " or ".join(sorted({"N x " + " x ".join(map(str, s[1:])) for s in shapes}))

    # -- requests ------------------------------------------------------------------------------
    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether every SubNet the runtime may choose takes ``shape`` (the rule of ``Runtime._fit``)."""
        for s in self.runtime.subnets:
            want = s.input_shape
            if len(shape) != len(want):
                return False
            if (len(want) == 4 and shape[1] != want[1]) or (len(want) != 4 and shape[1:] != want[1:]):
                return False
        return True

    def check(self, content_type: str | None, dtype: str | None, shape_header: str | None,
              length: int) -> tuple[int, ...] | Refusal:
        """The shape of a ``POST /infer`` whose body is ``length`` bytes, or why it is refused."""
        kind = (content_type or "").split(";")[0].strip().lower()
        if kind == "application/json" or kind.startswith(("text/", "multipart/")):
            return Refusal(415, f"POST /infer takes the input as raw little-endian float32 bytes "
                                f"(Content-Type: application/octet-stream), not {content_type!r}")
        if dtype is not None and dtype.strip().lower() not in ("float32", "<f4", "f4"):
            return Refusal(415, f"X-Dtype {dtype!r} is not taken: send little-endian float32 values "
                                "(x.astype('<f4').tobytes()) with X-Dtype: float32 or no X-Dtype")
        example = ",".join(map(str, self.example))
        if shape_header is None or not shape_header.strip():
            return Refusal(400, f"POST /infer needs the header X-Shape with the input's shape, e.g. "
                                f"'X-Shape: {example}' (the body: that many little-endian float32 values)")
        parts = [p.strip() for p in shape_header.split(",")]
        if len(parts) > MAX_DIMS or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
            return Refusal(400, f"X-Shape {shape_header!r} is not a shape: it must be up to {MAX_DIMS} positive "
                                f"integers separated by commas, e.g. {example}")
        shape = tuple(int(p) for p in parts)
        text = ",".join(map(str, shape))
        if not self.fits(shape):
            return Refusal(400, f"X-Shape {text} does not fit this bundle: it takes float32 {self.takes}, "
                                f"e.g. X-Shape: {example}")
        want = 4 * math.prod(shape)
        if length != want:
            hint = _FLOAT64_HINT if length == 2 * want else ""
            return Refusal(400, f"the body is {length} bytes, but X-Shape {text} of float32 takes {want} bytes "
                                f"(4 per element){hint}")
        return shape

    @staticmethod
    def decode(body: bytes, shape: tuple[int, ...]) -> np.ndarray | Refusal:
        x = np.frombuffer(body, dtype="<f4").reshape(shape).astype(np.float32, copy=False)
        bad = int((~np.isfinite(x)).sum())
        if bad:
            return Refusal(400, f"the input holds {bad} NaN or infinite values; send finite float32 values")
        return x

    def infer(self, x: np.ndarray) -> dict[str, Any]:
        received = time.perf_counter()
        with self._lock:
            queue_ms = (time.perf_counter() - received) * 1000
            y = np.asarray(self.runtime.infer(x))
            rec = self.runtime.last_record
        if rec is None:  # pragma: no cover - infer always records
            raise ServingError("the runtime served an inference without recording it")
        if not np.isfinite(y).all():
            raise ServingError(f"SubNet {rec.subnet!r} produced NaN or infinite outputs for a finite input; "
                               "its file or its manifest entry may be broken")
        flat = y.reshape(y.shape[0], -1) if y.ndim >= 2 else None
        return {"output": y.tolist(), "output_shape": list(y.shape),
                "argmax": flat.argmax(axis=1).tolist() if flat is not None else None,
                "subnet": rec.subnet, "latency_ms": rec.latency_ms, "slowdown": rec.slowdown,
                "forecast": {"mean": rec.forecast_mean, "upper": rec.forecast_upper},
                "switch_ms": rec.switch_ms, "queue_ms": queue_ms,
                "slo_ms": self.runtime.slo_ms, "within_slo": rec.latency_ms <= self.runtime.slo_ms}

    # -- reports -------------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        rt = self.runtime
        with self._lock:
            reading = rt.monitor.sample()  # at most every interval_ms: a cached one otherwise
            stats = rt.stats()
            fc = rt.monitor.forecast
            current = rt.current.name if rt.current is not None else None
            loaded = list(rt.loaded)
            switch_total = sum(rt.switch_ms)
            budget = rt.budget_mb(reading)
        with self._count:
            requests = {"served": self.served, "refused": {str(k): v for k, v in sorted(self.refused.items())},
                        "failed": self.failed}
        return {**stats, "protocol": PROTOCOL, "current": current, "loaded": loaded, "policy": rt.policy.name,
                "memory_mb": rt.memory_mb, "budget_mb": budget, "reading": asdict(reading),
                "forecast": {**stats["forecast"], "mean": fc.mean, "upper": fc.upper},
                "switch_ms": {**stats["switch_ms"], "total": switch_total},
                "requests": requests, "uptime_s": round(time.time() - self.started_at, 3)}

    def health(self) -> dict[str, Any]:
        rt = self.runtime
        return {"status": "ok", "protocol": PROTOCOL, "bundle": str(rt.bundle.root),
                "subnets": [{"name": s.name, "input_shape": list(s.input_shape), "latency_ms": s.latency_ms,
                             "idle_ms": rt.idle_ms[s.name],
                             "accuracy": s.accuracy, "memory_mb": s.memory_mb} for s in rt.subnets],
                "input": {"dtype": "float32", "byte_order": "little", "takes": self.takes,
                          "example_shape": list(self.example)},
                "slo_ms": rt.slo_ms, "policy": rt.policy.name, "max_body_bytes": self.max_body_bytes,
                "uptime_s": round(time.time() - self.started_at, 3)}

    def count(self, status: int) -> None:
        with self._count:
            if status < 400:
                self.served += 1
            elif status >= 500:
                self.failed += 1
            else:
                self.refused[status] = self.refused.get(status, 0) + 1


# -- HTTP ---------------------------------------------------------------------------------------
class _Handler(JsonHandler):
    server: "InferenceServer"
    server_version = "autotailor-serving/1"
    protocol_version = "HTTP/1.1"  # keep-alive: a client sends many inferences over one connection

    def on_answer(self, status: int) -> None:
        self.server.service.count(status)

    def _route(self) -> str | None:
        """The route of this request, or None once it has been answered 404/405."""
        path = urlsplit(self.path).path
        method = _ROUTES.get(path)
        if method == self.command:
            return path
        # a body we do not read must not be taken for the next request on this connection
        close = self._declared_length() > 0 or "Transfer-Encoding" in self.headers
        if method is None:
            self._error(404, f"no route {self.command} {path}; routes: {_ROUTE_LIST}", close=close)
        else:
            self._error(405, f"{path} takes {method}, not {self.command}; routes: {_ROUTE_LIST}", close=close)
        if close:
            self._drain(self._declared_length())
        return None

    def _declared_length(self) -> int:
        try:
            return max(0, int(self.headers.get("Content-Length", "0")))
        except ValueError:
            return 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        route = self._route()
        if route == "/health":
            self._json(200, self.server.service.health())
        elif route == "/metrics":
            self._json(200, self.server.service.metrics())

    def do_POST(self) -> None:  # noqa: N802
        if self._route() is None:
            return
        service = self.server.service
        length = self._length(service.max_body_bytes, "send a smaller batch, or restart the server with a larger "
                              "max_body_mb (--max-body-mb)")
        if length is None:
            return
        shape = service.check(self.headers.get("Content-Type"), self.headers.get("X-Dtype"),
                              self.headers.get("X-Shape"), length)
        if isinstance(shape, Refusal):
            self._error(shape.status, shape.message, close=True)
            self._drain(length)
            return
        body = self._body(length)
        if body is None:
            return
        x = service.decode(body, shape)
        del body
        if isinstance(x, Refusal):
            self._error(x.status, x.message)
            return
        try:
            answer = service.infer(x)
        except Exception as exc:  # noqa: BLE001 - answer and keep serving; the traceback goes to the log
            log.exception("inference failed")
            self._error(500, f"the inference failed: {type(exc).__name__}: {exc}; see the server's log")
            return
        self._json(200, answer)

    def do_PUT(self) -> None:  # noqa: N802
        self._route()

    do_DELETE = do_PATCH = do_PUT  # noqa: N815


class InferenceServer(JsonServer):
    """The HTTP server holding a :class:`Service`; ``url`` is where it listens."""

    def __init__(self, address: tuple[str, int], service: Service):
        self.service = service
        super().__init__(address, _Handler)

    def server_close(self) -> None:
        super().server_close()
        self.service.runtime.close()


def make_server(bundle_dir: str | Path | Bundle, slo_ms: float, host: str = "127.0.0.1", port: int = 0,
                memory_mb: float | None = None, policy: str | Policy = "forecast",
                max_body_mb: float = DEFAULT_MAX_BODY_MB, *, policy_options: Mapping[str, Any] | None = None,
                threads: int = 1) -> InferenceServer:
    """A server bound to ``host:port`` (0: any free port) but not yet serving (``serve_forever``
    it, or use :func:`start` / :func:`serve`). Loopback unless told otherwise."""
    if not (isinstance(max_body_mb, (int, float)) and max_body_mb > 0):
        raise ServingError(f"max_body_mb must be a positive number of MB (got {max_body_mb!r})")
    runtime = Runtime(bundle_dir, slo_ms, memory_mb, policy, threads=threads, policy_options=policy_options)
    try:
        return InferenceServer((host, port), Service(runtime, int(max_body_mb * 2**20)))
    except OSError as exc:
        runtime.close()
        raise ServingError(f"cannot listen on {host}:{port}: {exc}; choose another --host/--port") from exc


def start(bundle_dir: str | Path | Bundle, slo_ms: float, host: str = "127.0.0.1", port: int = 0,
          **options: Any) -> InferenceServer:
    """A server serving in a background thread (tests, embedding); ``shutdown()`` and
    ``server_close()`` it when done. ``options`` as for :func:`make_server`."""
    server = make_server(bundle_dir, slo_ms, host, port, **options)
    threading.Thread(target=server.serve_forever, name="autotailor-serving", daemon=True).start()
    log.info("serving %s on %s", server.service.runtime.bundle.root, server.url)
    return server


def serve(bundle_dir: str | Path | Bundle, slo_ms: float, host: str = "127.0.0.1", port: int = 0,
          memory_mb: float | None = None, policy: str | Policy = "forecast",
          max_body_mb: float = DEFAULT_MAX_BODY_MB, on_ready: Callable[[str], object] | None = None, *,
          policy_options: Mapping[str, Any] | None = None, threads: int = 1) -> None:
    """Serve ``bundle_dir`` under ``slo_ms`` per inference until interrupted (Ctrl-C, or SIGTERM
    turned into KeyboardInterrupt by the caller); ``on_ready(url)`` is called once it listens."""
    server = make_server(bundle_dir, slo_ms, host, port, memory_mb, policy, max_body_mb,
                         policy_options=policy_options, threads=threads)
    log.info("serving %s on %s (slo %.3g ms, policy %s)", server.service.runtime.bundle.root, server.url,
             slo_ms, server.service.runtime.policy.name)
    if on_ready is not None:
        on_ready(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("serving stopped")
    finally:
        server.server_close()
