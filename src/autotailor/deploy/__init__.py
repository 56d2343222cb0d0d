"""Deploy: export extracted SubNets to ONNX / TorchScript / NCNN and run them in their runtimes."""

from autotailor.deploy.export import export_ncnn, export_onnx, export_torchscript, ncnn_net, run_ncnn, run_onnx
from autotailor.deploy.quantize import quantize_onnx

__all__ = ["export_ncnn", "export_onnx", "export_torchscript", "ncnn_net", "quantize_onnx", "run_ncnn", "run_onnx"]
