"""Extracted SubNets run without AutoTailor: as ONNX, as TorchScript, and as a pickled module."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
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


class _ChannelsLastMlp(torch.nn.Module):
    """ConvNeXt's pattern: linear layers on a channels-last 4-D tensor, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc1, self.fc2, self.head = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16), torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).permute(0, 2, 3, 1)
        y = self.fc2(torch.nn.functional.gelu(self.fc1(y))).permute(0, 3, 1, 2)
        return self.head(y.mean((2, 3)))


def test_ncnn_export_turns_linear_layers_on_channels_last_tensors_into_convolutions(tmp_path, monkeypatch) -> None:
    from autotailor.deploy import export_ncnn, ncnn_net, run_ncnn

    torch.manual_seed(0)
    net = _ChannelsLastMlp().eval()
    x = torch.randn(1, 3, 20, 20)
    with torch.no_grad():
        ref = net(x).numpy()
    monkeypatch.chdir(tmp_path)  # a relative path, while pnnx runs in a directory of its own
    param, _ = export_ncnn(net, Path("out") / "mlp", tuple(x.shape))
    assert param == tmp_path / "out" / "mlp.param"
    out = run_ncnn(ncnn_net(param), x.numpy())
    assert out.shape == (1, 10)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()
    layers = [line.split()[0] for line in param.read_text().splitlines()[2:]]
    # The channels-last linear layers are 1x1 convolutions: no Gemm between reshapes computed
    # from the input's shape at run time, which NCNN runs 40x slower.
    assert (layers.count("Convolution"), layers.count("InnerProduct"), layers.count("Gemm")) == (3, 1, 0)
    assert "Reshape" not in layers
    assert all(isinstance(m, torch.nn.Linear) for m in (net.fc1, net.fc2, net.head))  # the user's net is untouched


def test_ncnn_export_of_a_linear_layer_on_tokens(tmp_path) -> None:
    """The 3-D case (batch, tokens, channels), as in a transformer: a 1-D convolution on NCNN."""
    from autotailor.deploy import export_ncnn, ncnn_net, run_ncnn

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 24)).eval()
    x = torch.randn(1, 7, 16)
    param, _ = export_ncnn(net, tmp_path / "tokens", tuple(x.shape))
    out = run_ncnn(ncnn_net(param), x.numpy())
    assert out.shape == (1, 7, 24)
    assert np.abs(out - net(x).detach().numpy()).max() <= 1e-5 * np.abs(out).max()
    assert "Convolution1D" in param.read_text() and "Gemm" not in param.read_text()


class _Subsample(torch.nn.Module):
    """LeViT's subsampling of its token grid: a strided slice over two axes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, ::2, ::2] * 2


def test_an_operator_pnnx_leaves_unconverted_is_named_at_export(tmp_path) -> None:
    from autotailor.deploy import export_ncnn
    from autotailor.errors import ExportError

    with pytest.raises(ExportError, match=r"pnnx left operators that NCNN has no layer for: Tensor\.slice; this "
                                          r"model cannot run on NCNN: deploy it with ONNX Runtime"):
        export_ncnn(_Subsample().eval(), tmp_path / "levit", (1, 14, 14, 64))
    assert not (tmp_path / "levit.param").exists()


def test_ncnn_precision_is_part_of_the_target_and_each_runs_the_same_model(tmp_path) -> None:
    from autotailor.predict.latency.backends import make_backend

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1)).eval()
    x = torch.randn(1, 3, 16, 16)
    ref = net(x).detach().numpy()
    fp16, fp32 = make_backend("ncnn"), make_backend("ncnn", precision="fp32")
    assert "precision" not in fp16.settings and fp32.settings["precision"] == "fp32"  # NCNN's default: the old key
    path = fp32.deploy(net, tmp_path / "net", tuple(x.shape))
    assert np.abs(fp32.run_file(path, x.numpy()) - ref).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(fp16.run_file(path, x.numpy()) - ref).max() <= 2e-2 * np.abs(ref).max()  # fp16 where the CPU has it
    with pytest.raises(at.AutoTailorError, match=r"ncnn precision='int4' is not allowed; expected one of \['fp16', "):
        make_backend("ncnn", precision="int4")
    # Winograd convolutions off: another target, the same outputs
    plain = make_backend("ncnn", winograd=False)
    assert plain.settings["winograd"] is False and "winograd" not in fp16.settings
    assert np.abs(plain.run_file(path, x.numpy()) - ref).max() <= 2e-2 * np.abs(ref).max()
    with pytest.raises(at.AutoTailorError, match="ncnn winograd='no' is not allowed; expected true or false"):
        make_backend("ncnn", winograd="no")
