"""The agent: a small HTTP service on a device that measures model files for a remote host.

Protocol (see docs/agent.md): every request carries ``Authorization: Bearer TOKEN``;
``GET /health`` describes the device and its runtimes; ``POST /measure`` takes a
``multipart/form-data`` body with a JSON part ``request`` and the model's file parts (``model``
for ONNX, ``param`` + ``bin`` for NCNN, ``xml`` + ``bin`` for OpenVINO), runs the file and answers
its timings and the noise seen. Every answer is JSON; errors are ``{"error": {"status", "reason",
"message"}}``.

Safety, on purpose: loopback by default; the token compared in constant time before anything
else is read; the body's declared length checked against the limit before it is read; files
written under names the agent makes, in a directory of its own, deleted after each measurement;
one measurement at a time (others wait, see ``Agent.wait_s``), so that two never disturb each
other's timings.

Idempotency: a request's ``id`` (client-chosen) keys its result; the last ``keep`` results are
kept, so a client retrying after a dropped connection gets the stored result and nothing is
measured twice. The same id with a different request (settings or file bytes) is refused (409).

No torch here: only the standard library, numpy and the runtime a request names.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import platform
import re
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Callable

import numpy as np

from autotailor.errors import AgentError, AgentRequestError
from autotailor.jsonhttp import JsonHandler, JsonServer
from autotailor.timing import time_calls
from autotailor.agent.energy import find_meters, measure_energy
from autotailor.agent.runners import Runner, Shape, runner_class, runners

log = logging.getLogger(__name__)

PROTOCOL = "autotailor-agent/1"
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Timing settings every backend takes (the rest go to the runner): name -> (default, min, max).
TIMING: dict[str, tuple[float, float, float]] = {
    "warmup": (10, 0, 10_000),
    "repeats": (50, 1, 100_000),
    "budget_s": (1.0, 0.0, 120.0),  # bounded: one request must not hold the device for long
    "windows": (5, 1, 100),
    "flush_mb": (0, 0, 1024),
    "energy_s": (0.0, 0.0, 60.0),  # > 0: the model run again for that long with the energy meters read
}
_INT_TIMING = {"warmup", "repeats", "windows", "flush_mb"}


@dataclass
class Agent:
    """The agent's state, apart from HTTP: measures, keeps results by id, counts.

    ``wait_s``: how long a request waits for the measurement under way before it is answered 503
    (busy, with ``Retry-After``); ``max_waiting``: how many may wait at once (each holds its body
    in memory) before further ones get 503 at once."""

    token: str
    max_body_bytes: int = 64 * 2**20
    workdir: Path | None = None
    keep: int = 64
    wait_s: float = 300.0
    max_waiting: int = 4
    energy_root: Path = Path("/")  # where the energy meters' system files are (a test's fixture tree)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _state: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _results: "OrderedDict[str, tuple[str, dict]]" = field(default_factory=OrderedDict, repr=False)
    _waiting: int = 0
    _own_workdir: bool = False
    started_at: float = field(default_factory=time.time)
    measurements: int = 0  # files actually run; a replayed result does not count
    replayed: int = 0  # results answered from the store
    _meters: list = field(default_factory=list, repr=False)
    _energy_reasons: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._meters, self._energy_reasons = find_meters(self.energy_root)
        if not self.token:
            raise AgentError("the agent needs a non-empty token; make one with "
                             "python -c 'import secrets; print(secrets.token_urlsafe(32))' > token")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="autotailor-agent-"))
            self._own_workdir = True
        else:
            self.workdir = Path(self.workdir).resolve()
            self.workdir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def authorized(self, header: str | None) -> bool:
        """Whether ``header`` is ``Bearer TOKEN``; constant time, so timing does not leak the token."""
        given = (header or "").encode()
        return hmac.compare_digest(given, b"Bearer " + self.token.encode())

    # -- health ------------------------------------------------------------------------------
    def health(self) -> dict:
        return {
            "protocol": PROTOCOL,
            "runtimes": {name: {"available": cls.version() is not None, "version": cls.version(),
                                "files": dict(cls.files), "settings": dict(cls.options)}
                         for name, cls in runners().items()},
            "timing": {k: v[0] for k, v in TIMING.items()},
            "machine": machine_facts(),
            "energy": ({"available": True, "sources": [m.name for m in self._meters]} if self._meters else
                       {"available": False, "reason": "; ".join(self._energy_reasons)}),
            "max_body_bytes": self.max_body_bytes,
            "busy": self._lock.locked(),
            "measurements": self.measurements,
            "replayed": self.replayed,
            "stored_results": len(self._results),
            "uptime_s": round(time.time() - self.started_at, 3),
        }

    # -- measure -----------------------------------------------------------------------------
    def measure(self, request: dict, parts: dict[str, bytes]) -> dict:
        """Run the request's files (``parts``: part name -> bytes) and answer their timings, or
        the stored result of an earlier request with the same ``id``."""
        if not isinstance(request, dict):
            raise AgentRequestError("the 'request' part must be a JSON object such as "
                                    '{"id": "r1", "backend": "ort-cpu", "settings": {"threads": 1}}', 400)
        unknown = sorted(set(request) - {"id", "backend", "settings", "inputs"})
        if unknown:
            raise AgentRequestError(f"the request has unknown fields {unknown}; "
                                    "allowed: id, backend, settings, inputs", 400)
        rid = request.get("id")
        if rid is not None and (not isinstance(rid, str) or not _ID.match(rid)):
            raise AgentRequestError("'id' must be 1-128 characters of letters, digits and . _ : -", 400)
        backend = request.get("backend")
        if not isinstance(backend, str):
            raise AgentRequestError("the request needs 'backend', a string (GET /health lists them)", 400)
        cls = runner_class(backend)
        settings = request.get("settings", {})
        if not isinstance(settings, dict):
            raise AgentRequestError("'settings' must be a JSON object, e.g. {\"threads\": 1, \"repeats\": 50}", 400)
        timing = {k: v for k, v in settings.items() if k in TIMING}
        timing = _check_timing(timing)
        run_settings = {k: v for k, v in settings.items() if k not in TIMING}
        inputs = _check_inputs(request.get("inputs"))
        missing = [p for p in cls.files if p not in parts]
        extra = sorted(set(parts) - set(cls.files))
        if missing or extra:
            raise AgentRequestError(f"backend {backend!r} takes the file parts {list(cls.files)}; "
                                    f"missing {missing}, not allowed {extra}", 400)
        digest = _digest(backend, run_settings, timing, inputs, parts)

        if rid is not None:
            stored = self._stored(rid, digest)
            if stored is not None:
                return stored
        with self._state:
            if self._waiting >= self.max_waiting:
                raise AgentRequestError(f"the agent is busy with {self._waiting} queued requests; retry later", 503)
            self._waiting += 1
        try:
            if not self._lock.acquire(timeout=self.wait_s):
                raise AgentRequestError(f"the agent stayed busy for {self.wait_s:.0f} s with another measurement; "
                                        "retry later (same id)", 503)
        finally:
            with self._state:
                self._waiting -= 1
        try:
            # A retry may have waited here while the first attempt of its id was measured.
            if rid is not None:
                stored = self._stored(rid, digest)
                if stored is not None:
                    return stored
            runner = cls(**run_settings)
            result = self._run(runner, parts, inputs, timing)
            result.update(id=rid, backend=backend, cached=False)
            with self._state:
                self.measurements += 1
                result["measurement"] = self.measurements
                if rid is not None:
                    self._results[rid] = (digest, result)
                    while len(self._results) > self.keep:
                        self._results.popitem(last=False)
            return result
        finally:
            self._lock.release()

    def _stored(self, rid: str, digest: str) -> dict | None:
        with self._state:
            if rid not in self._results:
                return None
            was, result = self._results[rid]
            if was != digest:
                raise AgentRequestError(f"request id {rid!r} was already used for a different request "
                                        "(other settings or files); use a new id for a new measurement", 409)
            self._results.move_to_end(rid)
            self.replayed += 1
            return {**result, "cached": True}

    def _run(self, runner: Runner, parts: dict[str, bytes], inputs: list[Shape] | None,
             timing: dict[str, float]) -> dict:
        assert self.workdir is not None
        # One fresh directory per measurement, with names the agent makes: a client's file name
        # never becomes a path, so it cannot point anywhere else.
        tmp = Path(tempfile.mkdtemp(prefix="m-", dir=self.workdir))
        try:
            files = {}
            for part, suffix in runner.files.items():
                path = tmp / f"model{suffix}"
                path.write_bytes(parts[part])
                files[part] = path
            t0 = time.perf_counter()
            loaded = runner.load(files, inputs)
            run, shapes = loaded.run, loaded.shapes
            load_ms = (time.perf_counter() - t0) * 1e3
            load_before = _load()
            t0 = time.perf_counter()
            try:
                samples = time_calls(run, int(timing["warmup"]), int(timing["repeats"]), float(timing["budget_s"]),
                                      _flusher(int(timing["flush_mb"])))
                if loaded.counted is not None:  # the runtime's own count of the timed calls
                    samples = loaded.counted()[-len(samples):]
            except AgentRequestError:
                raise
            except Exception as exc:  # noqa: BLE001 - any runtime's failure to run the file
                raise AgentRequestError(f"backend {runner.name!r} loaded the file but failed to run it: "
                                        f"{' '.join(str(exc).split())[:400]}; do 'inputs' match the model?", 400) from exc
            elapsed = time.perf_counter() - t0
            energy = (measure_energy(run, float(timing["energy_s"]), self._meters, self._energy_reasons)
                      if timing["energy_s"] else None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return {**summarize(samples, int(timing["windows"])),
                **({"energy": energy} if energy is not None else {}),
                "runtime": f"{runner.module} {runner.version()}",
                "settings": {**runner.settings, **timing},
                "inputs": [list(s) for s in shapes],
                "load_ms": round(load_ms, 3),
                "elapsed_s": round(elapsed, 4),
                "load_before": load_before, "load_after": _load(),
                "measured_at": time.time()}


def summarize(samples: list[float], windows: int) -> dict:
    """Median, MAD and percentiles of ``samples`` (ms), and the noise: the medians of
    ``windows`` consecutive windows of them and their spread relative to the median (latency
    on a shared machine drifts within a measurement; one median hides that)."""
    med = statistics.median(samples)
    mad = statistics.median(abs(t - med) for t in samples)
    arr = np.asarray(samples)
    per = max(1, len(samples) // windows)
    window_medians = [statistics.median(samples[i:i + per]) for i in range(0, per * min(windows, len(samples)), per)]
    spread = (max(window_medians) - min(window_medians)) / med if med > 0 else 0.0
    return {"median_ms": med, "mad_ms": mad, "min_ms": float(arr.min()), "mean_ms": float(arr.mean()),
            "p10_ms": float(np.percentile(arr, 10)), "p90_ms": float(np.percentile(arr, 90)),
            "repeats": len(samples), "samples_ms": [round(s, 6) for s in samples],
            "noise": {"window_medians_ms": window_medians, "spread": spread}}


def _flusher(flush_mb: int) -> Callable[[], object] | None:
    """Overwrite ``flush_mb`` MB before each timed call, so the model's weights leave the caches."""
    if not flush_mb:
        return None
    scratch = np.zeros(flush_mb * 2**20 // 8)
    return lambda: np.add(scratch, 1.0, out=scratch)


def _check_timing(timing: dict[str, object]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, (default, lo, hi) in TIMING.items():
        value = timing.get(name, default)
        ok_type = (isinstance(value, int) if name in _INT_TIMING else isinstance(value, (int, float)))
        if isinstance(value, bool) or not ok_type or not lo <= value <= hi:  # type: ignore[operator]
            kind = "an integer" if name in _INT_TIMING else "a number"
            raise AgentRequestError(f"setting {name!r} must be {kind} in [{lo:g}, {hi:g}], got {value!r}", 400)
        out[name] = value  # type: ignore[assignment]
    return out


def _check_inputs(inputs: object) -> list[Shape] | None:
    if inputs is None:
        return None
    if (not isinstance(inputs, list) or not inputs
            or not all(isinstance(s, list) and s and all(isinstance(d, int) and not isinstance(d, bool)
                                                         and 0 < d <= 1 << 20 for d in s) for s in inputs)):
        raise AgentRequestError("'inputs' must be a list of shapes of positive integers, e.g. [[1, 3, 224, 224]]", 400)
    if sum(int(np.prod(s)) for s in inputs) > 1 << 28:
        raise AgentRequestError("'inputs' asks for more than 2^28 elements; is a dimension wrong?", 400)
    return [tuple(s) for s in inputs]


def _digest(backend: str, settings: dict, timing: dict, inputs: list[Shape] | None, parts: dict[str, bytes]) -> str:
    h = hashlib.sha256(json.dumps([backend, settings, timing, inputs], sort_keys=True, default=str).encode())
    for name in sorted(parts):
        h.update(name.encode() + b"\0" + hashlib.sha256(parts[name]).digest())
    return h.hexdigest()


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on every platform
        return []


def machine_facts() -> dict:
    """What the host needs to tell devices apart and judge a measurement: CPU model, cores
    (and how many this process may use), load, memory."""
    facts: dict[str, object] = {"hostname": socket.gethostname(), "platform": platform.platform(),
                                "machine": platform.machine(), "python": platform.python_version(),
                                "cpu_model": platform.processor() or None, "cores": os.cpu_count(),
                                "load": _load()}
    try:
        facts["usable_cores"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                facts["cpu_model"] = value.strip()
                break
    except OSError:
        pass
    try:
        mem = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        facts["memory_mb"] = int(mem["MemTotal"].split()[0]) // 1024
        facts["memory_available_mb"] = int(mem["MemAvailable"].split()[0]) // 1024
    except (OSError, KeyError, ValueError):
        pass
    return facts


# -- multipart ----------------------------------------------------------------------------------
def parse_multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """The parts of a ``multipart/form-data`` body by their ``name``. Part file names are
    ignored (the agent names its files itself); a name given twice is an error."""
    msg = Message()
    msg["content-type"] = content_type
    if msg.get_content_type() != "multipart/form-data" or not msg.get_param("boundary"):
        raise AgentRequestError("POST /measure takes Content-Type: multipart/form-data with a boundary "
                                f"(a 'request' JSON part and the file parts), not {content_type!r}", 415)
    delim = b"--" + str(msg.get_param("boundary")).encode()
    start = body.find(delim)
    if start < 0:
        raise AgentRequestError("the multipart body does not contain its boundary", 400)
    pos = start + len(delim)
    parts: dict[str, bytes] = {}
    while True:
        if body[pos:pos + 2] == b"--":
            return parts
        if body[pos:pos + 2] != b"\r\n":
            raise AgentRequestError("malformed multipart body: a boundary is not followed by CRLF or --", 400)
        pos += 2
        end = body.find(b"\r\n" + delim, pos)
        if end < 0:
            raise AgentRequestError("malformed multipart body: its closing boundary is missing "
                                    "(was the upload cut short?)", 400)
        head, sep, content = body[pos:end].partition(b"\r\n\r\n")
        if not sep:
            raise AgentRequestError("malformed multipart body: a part has no blank line after its headers", 400)
        disposition = Message()
        for line in head.decode("latin-1").split("\r\n"):
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-disposition":
                disposition["content-disposition"] = value.strip()
        name = disposition.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise AgentRequestError("a multipart part has no Content-Disposition name", 400)
        if name in parts:
            raise AgentRequestError(f"the multipart part {name!r} is given twice", 400)
        parts[name] = content
        pos = end + 2 + len(delim)


# -- HTTP ---------------------------------------------------------------------------------------
class _Handler(JsonHandler):
    server: "AgentServer"
    server_version = "autotailor-agent/1"

    def _authorized(self) -> bool:
        if self.server.agent.authorized(self.headers.get("Authorization")):
            return True
        self.close_connection = True
        self._error(401, "missing or wrong token: send the header 'Authorization: Bearer TOKEN' with the "
                    "agent's token (its --token-file)", {"WWW-Authenticate": 'Bearer realm="autotailor-agent"'})
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if not self._authorized():
            return
        if self.path.split("?")[0] == "/health":
            self._json(200, self.server.agent.health())
        else:
            self._error(404, f"no route GET {self.path}; routes: GET /health, POST /measure")

    def do_POST(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        if self.path.split("?")[0] != "/measure":
            self.close_connection = True
            self._error(404, f"no route POST {self.path}; routes: GET /health, POST /measure")
            return
        agent = self.server.agent
        length = self._length(agent.max_body_bytes, "restart the agent with a larger --max-body-mb, or send a "
                              "smaller model")
        body = self._body(length) if length is not None else None
        if body is None:
            return
        try:
            parts = parse_multipart(self.headers.get("Content-Type", ""), body)
            del body
            if "request" not in parts:
                raise AgentRequestError("the body has no 'request' part (a JSON object naming backend and settings)", 400)
            try:
                request = json.loads(parts.pop("request"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise AgentRequestError(f"the 'request' part is not valid JSON: {exc}", 400) from exc
            result = agent.measure(request, parts)
        except AgentRequestError as exc:
            headers = {"Retry-After": "5"} if exc.status == 503 else None
            self._error(exc.status or 400, str(exc), headers)
            return
        except Exception as exc:  # noqa: BLE001 - answer and keep serving; the traceback goes to the log
            log.exception("measurement failed")
            self._error(500, f"the agent failed unexpectedly: {type(exc).__name__}: {exc}; see the agent's log")
            return
        try:
            self._json(200, result)
        except OSError as exc:
            # The client went away; its result is stored under its id for the retry.
            log.warning("could not answer %s (%s); the result stays stored under its id", self.address_string(), exc)

    def do_PUT(self) -> None:  # noqa: N802
        if self._authorized():
            self._error(405, "method not allowed; routes: GET /health, POST /measure")

    do_DELETE = do_PATCH = do_PUT  # noqa: N815


class AgentServer(JsonServer):
    """The HTTP server holding an ``Agent``; ``url`` is where it listens."""

    def __init__(self, address: tuple[str, int], agent: Agent):
        self.agent = agent
        super().__init__(address, _Handler)

    def server_close(self) -> None:
        super().server_close()
        self.agent.close()


def make_server(host: str = "127.0.0.1", port: int = 0, token: str = "", max_body_mb: float = 64,
                workdir: str | Path | None = None, **agent_options: object) -> AgentServer:
    """An agent's server, bound but not yet serving (``serve_forever`` it, or use ``serve``).
    ``host`` is loopback unless told otherwise: the agent runs files it is sent, so reaching it
    from the network is a decision (with a token) and not a default."""
    if max_body_mb <= 0:
        raise AgentError(f"max_body_mb must be > 0, got {max_body_mb}")
    agent = Agent(token=token, max_body_bytes=int(max_body_mb * 2**20),
                  workdir=Path(workdir) if workdir is not None else None, **agent_options)  # type: ignore[arg-type]
    try:
        return AgentServer((host, port), agent)
    except OSError as exc:
        agent.close()
        raise AgentError(f"the agent cannot listen on {host}:{port}: {exc}; choose another --host/--port") from exc


def start(host: str = "127.0.0.1", port: int = 0, token: str = "", max_body_mb: float = 64,
          workdir: str | Path | None = None, **agent_options: object) -> AgentServer:
    """An agent serving in a background thread (for tests and embedding); ``shutdown()`` and
    ``server_close()`` it when done."""
    server = make_server(host, port, token, max_body_mb, workdir, **agent_options)
    threading.Thread(target=server.serve_forever, name="autotailor-agent", daemon=True).start()
    log.info("agent listening on %s", server.url)
    return server


def serve(host: str = "127.0.0.1", port: int = 0, token: str = "", max_body_mb: float = 64,
          workdir: str | Path | None = None, on_ready: Callable[[str], object] | None = None,
          **agent_options: object) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM as KeyboardInterrupt); ``on_ready(url)`` is
    called once it listens (``python -m autotailor.agent`` prints the URL)."""
    server = make_server(host, port, token, max_body_mb, workdir, **agent_options)
    log.info("agent listening on %s (workdir %s)", server.url, server.agent.workdir)
    if on_ready is not None:
        on_ready(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("agent stopped")
    finally:
        server.server_close()
