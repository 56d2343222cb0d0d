"""Runtime backends (see ``base``): importing this package registers the ones AutoTailor ships."""

from autotailor.predict.latency.backends import ort, torch_eager, ncnn, openvino, remote  # noqa: F401, I001  (registration order)
from autotailor.predict.latency.backends.base import (Backend, backend, backend_class, backends, device_help,
                                                      export_formats, format_backend, fusion_rules, make_backend,
                                                      parse_device)

__all__ = ["Backend", "backend", "backend_class", "backends", "device_help", "export_formats", "format_backend",
           "fusion_rules", "make_backend", "parse_device"]
