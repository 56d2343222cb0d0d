"""The host's side of the agent protocol (see server.py and docs/agent.md).

>>> client = AgentClient("http://10.0.0.2:8765", token)
>>> client.health()["runtimes"]["ort-cpu"]["available"]
>>> client.measure("kernel.onnx", "ort-cpu", threads=1, repeats=50)["median_ms"]

A measurement carries a request id (a new random one unless given); on a dropped connection
or a timeout the client sends the same request again with the same id, and the agent answers
the stored result if it had measured it, so nothing is measured twice.
"""

from __future__ import annotations

import http.client
import json
import logging
import secrets
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Mapping, Sequence

from autotailor.errors import AgentError, AgentRequestError, AgentUnreachableError

log = logging.getLogger(__name__)

# What a single path stands for, per backend, when the agent has not been asked (GET /health):
# the first part is the path itself, the others the path with their suffix.
_FILES = {"ort-cpu": {"model": ".onnx"}, "ncnn": {"param": ".param", "bin": ".bin"},
          "openvino": {"xml": ".xml", "bin": ".bin"}}


class AgentClient:
    """Talks to one agent. ``retries``: further attempts after a connection error, a timeout or
    a busy agent (503), ``backoff_s`` apart, doubling; ``timeout_s``: per attempt (a measurement
    waits for the one under way, so keep it above the agent's ``wait_s`` plus a measurement)."""

    def __init__(self, url: str, token: str, timeout_s: float = 900.0, retries: int = 3, backoff_s: float = 0.5):
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http" or not parsed.hostname:
            raise AgentError(f"agent URL {url!r} is not http://HOST:PORT")
        self.url = f"http://{parsed.netloc}"
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.token = token.strip()
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._health: dict | None = None

    def health(self) -> dict:
        """The agent's ``GET /health``: runtimes, versions, machine, limits, counters."""
        self._health = self._call("GET", "/health", None, {})
        return self._health

    def measure(self, path: str | Path | Mapping[str, str | Path], backend: str,
                inputs: Sequence[Sequence[int]] | None = None, request_id: str | None = None,
                **settings: object) -> dict:
        """Time the model file at ``path`` on the agent with ``backend`` and ``settings``
        (runtime settings such as ``threads``, and ``warmup``, ``repeats``, ``budget_s``,
        ``windows``, ``flush_mb``). ``path`` is one file (its companion files are found by
        suffix: ``x.param`` -> ``x.bin``) or a mapping part name -> file. Answers the agent's
        result: ``median_ms``, ``mad_ms``, ``samples_ms``, ``noise``, ... (docs/agent.md)."""
        files = self._files(path, backend)
        request: dict[str, object] = {"id": request_id or secrets.token_hex(12), "backend": backend,
                                      "settings": settings}
        if inputs is not None:
            request["inputs"] = [list(map(int, s)) for s in inputs]
        boundary = "autotailor-" + secrets.token_hex(16)
        body = _multipart(boundary, request, files)
        limit = (self._health or {}).get("max_body_bytes")
        if isinstance(limit, int) and len(body) > limit:
            raise AgentRequestError(f"the upload is {len(body)} bytes, above the agent's limit of {limit}; "
                                    "start the agent with a larger --max-body-mb", 413)
        return self._call("POST", "/measure", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})

    def _files(self, path: str | Path | Mapping[str, str | Path], backend: str) -> dict[str, bytes]:
        if isinstance(path, Mapping):
            named = {k: Path(v) for k, v in path.items()}
        else:
            roles = (self._health or {}).get("runtimes", {}).get(backend, {}).get("files") or _FILES.get(backend)
            # A backend unknown here: one part, "model"; the agent answers what it takes instead.
            roles = roles or {"model": Path(path).suffix}
            first = Path(path)
            named = {role: first if i == 0 else first.with_suffix(suffix)
                     for i, (role, suffix) in enumerate(roles.items())}
        out = {}
        for role, p in named.items():
            try:
                out[role] = p.read_bytes()
            except OSError as exc:
                raise AgentError(f"cannot read the {role!r} file {p} for backend {backend!r}: {exc}") from exc
        return out

    # -- transport ---------------------------------------------------------------------------
    def _call(self, method: str, route: str, body: bytes | None, headers: dict[str, str]) -> dict:
        delay = self.backoff_s
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(delay)
                delay *= 2
            try:
                status, payload, retry_after = self._once(method, route, body, headers)
            except (OSError, http.client.HTTPException) as exc:
                # Refused, reset, dropped, timed out: the same request (same id) is safe to send again.
                last = f"{type(exc).__name__}: {exc}"
                log.warning("agent %s: %s %s failed (%s); attempt %d of %d", self.url, method, route, last,
                            attempt + 1, self.retries + 1)
                continue
            if status == 200:
                return payload
            message = (payload.get("error") or {}).get("message") if isinstance(payload, dict) else None
            message = message or f"HTTP {status}"
            if status == 503:
                last = message
                delay = max(delay, min(retry_after or 0.0, 60.0))
                log.warning("agent %s busy (%s); attempt %d of %d", self.url, message, attempt + 1, self.retries + 1)
                continue
            if 400 <= status < 500:
                raise AgentRequestError(f"agent {self.url} refused {method} {route} (HTTP {status}): {message}", status)
            raise AgentError(f"agent {self.url} failed {method} {route} (HTTP {status}): {message}", status)
        raise AgentUnreachableError(f"agent {self.url} did not answer {method} {route} after {self.retries + 1} "
                                    f"attempts (last: {last}); is it running, and is {self.host}:{self.port} "
                                    "reachable from here?")

    def _once(self, method: str, route: str, body: bytes | None,
              headers: dict[str, str]) -> tuple[int, object, float | None]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.putrequest(method, route)
            for k, v in {**headers, "Authorization": f"Bearer {self.token}", "Accept": "application/json",
                         "Content-Length": str(len(body or b""))}.items():
                conn.putheader(k, v)
            conn.endheaders()
            try:
                if body:
                    conn.send(body)
            except (BrokenPipeError, ConnectionResetError):
                # The agent may have answered and closed before reading the body (401, 413):
                # its answer is what to report, if it can still be read.
                pass
            resp = conn.getresponse()
            data = resp.read()
            try:
                payload = json.loads(data) if data else {}
            except json.JSONDecodeError:
                payload = {"error": {"message": data[:200].decode("utf-8", "replace")}}
            retry = resp.getheader("Retry-After")
            return resp.status, payload, float(retry) if retry and retry.isdigit() else None
        except socket.timeout as exc:
            raise TimeoutError(f"no answer within {self.timeout_s} s") from exc
        finally:
            conn.close()


def _multipart(boundary: str, request: dict, files: dict[str, bytes]) -> bytes:
    delim = f"--{boundary}".encode()
    out = [delim, b'\r\nContent-Disposition: form-data; name="request"\r\nContent-Type: application/json\r\n\r\n',
           json.dumps(request).encode()]
    for role, data in files.items():
        # The file name is informative only: the agent never uses it for a path.
        out += [b"\r\n", delim, f'\r\nContent-Disposition: form-data; name="{role}"; filename="{role}"\r\n'
                                f"Content-Type: application/octet-stream\r\n\r\n".encode(), data]
    out += [b"\r\n", delim, b"--\r\n"]
    return b"".join(out)
