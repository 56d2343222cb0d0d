"""``python -m autotailor.agent --host 127.0.0.1 --port 8765 --token-file token``: run the agent
on this device until interrupted; prints the URL it listens on (one line, for scripts)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import stat
import sys
from pathlib import Path

from autotailor.errors import AgentError

log = logging.getLogger("autotailor.agent")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The agent's options (shared with ``autotailor agent``)."""
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: loopback only; a device reachable "
                             "from the host needs its LAN address, or 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free port)")
    parser.add_argument("--token-file", required=True, type=Path,
                        help="file holding the token clients must send (make one: python -c "
                             "'import secrets; print(secrets.token_urlsafe(32))' > token; chmod 600 token)")
    parser.add_argument("--max-body-mb", type=float, default=64.0,
                        help="largest upload accepted, in MB (default 64); larger ones get HTTP 413")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where uploaded files live during a measurement (default: a new temporary directory)")
    return parser


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
        mode = path.stat().st_mode
    except OSError as exc:
        raise AgentError(f"cannot read the token file {path}: {exc}") from exc
    if not token:
        raise AgentError(f"the token file {path} is empty; write a token into it "
                         "(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s is readable by other users; chmod 600 it", path)
    return token


def run(args: argparse.Namespace) -> int:
    """Run the agent with parsed ``args`` (``add_arguments``); the URL is printed once it listens."""
    from autotailor.agent.server import serve

    # SIGTERM (systemd, kill) ends the agent as Ctrl-C does, removing its temporary directory.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        serve(host=args.host, port=args.port, token=read_token(args.token_file), max_body_mb=args.max_body_mb,
              workdir=args.workdir, on_ready=lambda url: print(url, flush=True))
    except AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="python -m autotailor.agent", description=__doc__))
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("AUTOTAILOR_AGENT_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
