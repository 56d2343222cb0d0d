"""The agent: a small torch-free HTTP service on a device that measures model files for a
remote host (docs/agent.md).

- ``server``: :func:`serve` (blocking), :func:`start` (a background thread), :class:`Agent`
  (the state apart from HTTP: measuring, results kept by request id, counters)
- ``runners``: one registered :class:`Runner` per runtime (:func:`runner`; built in:
  ``ort-cpu``, ``ncnn``, ``openvino``), imported only when a request names it
- ``client``: :class:`AgentClient`, the host's side

Errors (in ``autotailor.errors``): :class:`AgentError`, :class:`AgentRequestError`,
:class:`AgentUnreachableError`, all :class:`AutoTailorError`.
"""

from autotailor.errors import AgentError, AgentRequestError, AgentUnreachableError
from autotailor.agent.client import AgentClient
from autotailor.agent.runners import Runner, runner, runners
from autotailor.agent.server import PROTOCOL, Agent, AgentServer, make_server, serve, start

__all__ = [
    "PROTOCOL",
    "Agent",
    "AgentClient",
    "AgentError",
    "AgentRequestError",
    "AgentServer",
    "AgentUnreachableError",
    "Runner",
    "make_server",
    "runner",
    "runners",
    "serve",
    "start",
]
