"""What AutoTailor's HTTP services share (the agent, ``autotailor serve``): JSON answers and
errors, refused bodies drained, a threading server that says its URL. Standard library only,
so that the torch-free on-device services use it."""

from __future__ import annotations

import json
import logging
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping

log = logging.getLogger(__name__)


class JsonHandler(BaseHTTPRequestHandler):
    """Answers JSON: ``_json`` a payload, ``_error`` ``{"error": {status, reason, message}}``,
    also for what ``http.server`` itself refuses. ``on_answer(status)`` is called after each."""

    # Reads and writes time out: a client that stops sending must not hold a thread forever.
    timeout = 60

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    def on_answer(self, status: int) -> None:
        """Called with every answer's status, before its body is sent (a service counts them)."""

    def _json(self, status: int, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None,
              close: bool = False) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")  # also sets close_connection
        self.end_headers()
        # Counted before the body leaves: a client that has its answer may ask for the counts at once.
        self.on_answer(status)
        self.wfile.write(data)

    def _error(self, status: int, message: str, headers: Mapping[str, str] | None = None, close: bool = False) -> None:
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
        if status < 500:
            log.info("refused %s %s (%d): %s", self.command, self.path, status, message)
        self._json(status, {"error": {"status": status, "reason": reason, "message": message}}, headers, close)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """JSON, also for what ``http.server`` itself refuses (a malformed request line, headers
        too long, a method it has no handler for)."""
        self.close_connection = True
        try:
            self._error(code, message or explain or HTTPStatus(code).phrase, close=True)
        except OSError:
            pass

    def _length(self, limit: int, advice: str) -> int | None:
        """The body's declared length, or None once refused: no ``Content-Length`` (411), not a
        number (400), above ``limit`` (413, with ``advice``; refused before reading, so a large
        body never reaches memory)."""
        text = self.headers.get("Content-Length")
        if text is None:
            self._error(411, f"{self.command} {self.path} needs a Content-Length header (chunked uploads are not "
                        "accepted)", close=True)
            return None
        try:
            length = int(text)
            if length < 0:
                raise ValueError
        except ValueError:
            self._error(400, f"Content-Length {text!r} is not a non-negative integer", close=True)
            return None
        if length > limit:
            self._error(413, f"the body is {length} bytes, above this server's limit of {limit} bytes; {advice}",
                        close=True)
            self._drain(min(length, 1 << 20))
            return None
        return length

    def _body(self, length: int) -> bytes | None:
        """The body of ``length`` bytes, or None once the connection failed or it was short (400)."""
        try:
            body = self.rfile.read(length)
        except (OSError, socket.timeout) as exc:
            log.warning("upload from %s failed: %s", self.address_string(), exc)
            self.close_connection = True
            return None
        if len(body) != length:
            self._error(400, f"the body ended after {len(body)} of {length} bytes; send it again", close=True)
            return None
        return body

    def _drain(self, limit: int) -> None:
        """Read (and drop, never keep) up to ``limit`` bytes of a refused body, with a short
        timeout: a client still sending when the connection closes sees a reset instead of the
        answer; one a little over the limit gets it."""
        try:
            self.connection.settimeout(0.5)
            while limit > 0:
                chunk = self.rfile.read1(min(limit, 65536)) if hasattr(self.rfile, "read1") else b""
                if not chunk:
                    break
                limit -= len(chunk)
        except (OSError, socket.timeout):
            pass


class JsonServer(ThreadingHTTPServer):
    """A threading HTTP server on an IPv4 or IPv6 address; ``url`` is where it listens."""

    daemon_threads = True  # a stuck client must not keep the process from exiting

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"
