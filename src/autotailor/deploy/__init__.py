"""Deploy: export extracted SubNets to ONNX / TorchScript and run them in their runtimes."""

from autotailor.deploy.export import export_onnx, export_torchscript, run_onnx

__all__ = ["export_onnx", "export_torchscript", "run_onnx"]
