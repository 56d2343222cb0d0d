"""Extracted SubNets run without AutoTailor: as ONNX, as TorchScript, and as a pickled module."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import torch
import torchvision

import autotailor as at
from autotailor.deploy import export_onnx, export_torchscript
from conftest import rel_err, well_conditioned

BLOCK_AUTOTAILOR = "import sys; sys.modules['autotailor'] = None\n"


def _run_without_autotailor(code: str) -> None:
    subprocess.run([sys.executable, "-c", BLOCK_AUTOTAILOR + textwrap.dedent(code)], check=True, timeout=300)


def test_exports_run_without_autotailor(tmp_path) -> None:
    torch.manual_seed(0)
    sn = at.compile(well_conditioned(torchvision.models.mobilenet_v3_small(weights=None)), torch.randn(1, 3, 96, 96))
    sn.eval()
    arch = sn.space.sample(7)
    sn.set_arch(arch)
    x = torch.randn(sn.input_shape(arch))
    with torch.no_grad():
        ref = sn(x)
    net = sn.extract(arch).eval()
    onnx_path = export_onnx(net, tmp_path / "net.onnx", tuple(x.shape))
    ts_path = export_torchscript(net, tmp_path / "net.ts", tuple(x.shape))
    torch.save(net, tmp_path / "net.pt")
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "ref.npy", ref.numpy())
    _run_without_autotailor(f"""
        import numpy as np, onnxruntime as ort, torch
        x, ref = np.load("{tmp_path}/x.npy"), np.load("{tmp_path}/ref.npy")
        sess = ort.InferenceSession("{onnx_path}", providers=["CPUExecutionProvider"])
        y = sess.run(None, {{"input": x}})[0]
        assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max(), "onnx"
        ts = torch.jit.load("{ts_path}")
        assert np.abs(ts(torch.from_numpy(x)).detach().numpy() - ref).max() <= 1e-5 * np.abs(ref).max(), "ts"
        net = torch.load("{tmp_path}/net.pt", weights_only=False)
        assert np.abs(net(torch.from_numpy(x)).detach().numpy() - ref).max() <= 1e-5 * np.abs(ref).max(), "pt"
    """)
    assert rel_err(ref, net(x)) <= 1e-6
