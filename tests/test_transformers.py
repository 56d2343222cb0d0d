"""Vision transformers: attention becomes one operator whose heads can be dropped; the residual
stream's width, the MLP ratio and whole layers are variables; SubNets extract exactly, export to
ONNX and load without AutoTailor."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
import timm
import torch
import torch.nn as nn
import torchvision

import autotailor as at
from autotailor.deploy import export_onnx
from autotailor.errors import ConfigError
from autotailor.ir.ops.attention import HeadAttention
from autotailor.testing import well_conditioned


def timm_vit(heads: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=heads,
                                         num_classes=10).eval()


def torchvision_vit() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=4,
                                                hidden_dim=48, mlp_dim=96, num_classes=10).eval()


CONFIG = "[var.global_vars]\nresolution = [32]\n"


@pytest.mark.parametrize("make", [timm_vit, torchvision_vit], ids=["timm", "torchvision"])
def test_vit_gets_heads_embedding_mlp_and_layer_depth_variables(make) -> None:
    model = make()
    x = torch.randn(2, 3, 32, 32)
    sn = at.compile(model, x[:1], config=CONFIG).eval()
    kinds = {v.kind: v for v in sn.space.variables}
    assert set(kinds) == {"heads", "qk", "v", "embedding", "width", "depth"}
    heads = [v for v in sn.space.variables if v.kind == "heads"]
    assert len(heads) == 3 and all(v.choices == (2, 3, 4) for v in heads)  # ratios 0.5, 0.75, 1 of 4 heads
    qk = [v for v in sn.space.variables if v.kind == "qk"]
    assert len(qk) == 3 and all(v.choices == (6, 9, 12) for v in qk)  # of 12 q/k features per head
    values = [v for v in sn.space.variables if v.kind == "v"]
    assert len(values) == 3 and all(v.choices == (6, 9, 12) for v in values)  # of 12 value features per head
    assert kinds["embedding"].name == "embed_ratio" and kinds["embedding"].values == (24, 36, 48)
    # Three layers, each an attention and an MLP block: depth counts layers, a choice drops both.
    depth = kinds["depth"]
    assert depth.choices == (-2, -1, 0) and depth.values == (-4, -2, 0)
    assert len(sn.space.dropped_blocks({depth.name: -1})) == 2
    assert sum(isinstance(m, HeadAttention) for m in sn.modules()) == 3
    with torch.no_grad():
        assert torch.allclose(sn(x), model(x), atol=1e-5)


def _head_of(sn_proj: torch.Tensor, orig_proj: torch.Tensor, dim: int) -> list[int]:
    """Which of the original model's heads each of the SuperNet's kept heads is, by the values of
    the output projection's columns (reordering permutes its columns in whole heads, and its rows
    with the embedding's channels)."""
    found = []
    values = lambda w, i: w[:, i * dim:(i + 1) * dim].flatten().sort().values  # noqa: E731
    for j in range(sn_proj.shape[1] // dim):
        matches = [i for i in range(orig_proj.shape[1] // dim) if torch.equal(values(sn_proj, j), values(orig_proj, i))]
        assert len(matches) == 1
        found.append(matches[0])
    return found


def test_dropping_heads_equals_the_model_without_those_heads() -> None:
    model = timm_vit()
    x = torch.randn(2, 3, 32, 32)
    sn = at.compile(model, x[:1], config=CONFIG).eval()
    heads = [v for v in sn.space.variables if v.kind == "heads"]
    arch = {heads[0].name: 2, heads[2].name: 3}
    net = sn.extract(arch)
    # The reference: the original model with the dropped heads' outputs removed, which is what
    # a model built with fewer heads computes (a head reaches the output only through the
    # projection's columns).
    reference = timm_vit()
    for layer, kept in ((0, 2), (1, 4), (2, 3)):
        proj = reference.blocks[layer].attn.proj
        sn_proj = dict(sn.named_parameters())[f"net.block{2 * layer + 1}.body.blocks.{layer}.attn.proj.weight"]
        keep = _head_of(sn_proj.detach()[:, : kept * 12], proj.weight.detach(), 12)
        with torch.no_grad():
            for i in set(range(4)) - set(keep):
                proj.weight[:, i * 12:(i + 1) * 12] = 0
    with torch.no_grad():
        assert torch.allclose(net(x), reference(x), atol=1e-5)
        sn.set_arch(arch)
        assert torch.equal(sn(x), net(x))
    linear_rows = [m.out_features for m in net.modules() if isinstance(m, nn.Linear) and m.out_features % 36 == 0]
    assert linear_rows[:3] == [72, 144, 108]  # the qkv projections of 2, 4 and 3 heads of 12 dims


@pytest.mark.parametrize("make", ["timm_vit", "torchvision_vit", "tiny_swin", "tiny_torchvision_swin",
                                  "tiny_torchvision_swin_v2", "tiny_levit", "tiny_maxvit", "tiny_efficientvit"])
def test_random_transformer_subnets_extract_exactly_and_run_in_onnx_runtime(make, tmp_path) -> None:
    model = globals()[make]()
    size = 64 if make in ("tiny_levit", "tiny_efficientvit") else 32
    sn = at.compile(model, torch.randn(1, 3, size, size), config=f"[var.global_vars]\nresolution = [{size}]\n").eval()
    x = torch.randn(1, 3, size, size)
    for seed in range(3):
        arch = sn.space.sample(seed)
        sn.set_arch(arch)
        net = sn.extract(arch).eval()
        with torch.no_grad():
            ref = sn(x)
            assert torch.equal(net(x), ref)
        path = export_onnx(net, tmp_path / f"{seed}.onnx", (1, 3, size, size))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (y,) = session.run(None, {"input": x.numpy()})
        assert np.abs(y - ref.numpy()).max() <= 1e-4 * float(ref.abs().max())


def test_transformer_subnet_loads_and_runs_without_autotailor(tmp_path) -> None:
    sn = at.compile(timm_vit(), torch.randn(1, 3, 32, 32), config=CONFIG).eval()
    arch = sn.space.min()
    net = sn.extract(arch).eval()
    x = torch.randn(1, 3, 32, 32)
    torch.save(net, tmp_path / "net.pt")
    torch.save({"x": x, "y": net(x).detach()}, tmp_path / "io.pt")
    assert [n.op for n in net.graph.nodes].count("placeholder") == 1  # timm's optional arguments are gone
    code = (f"import sys; sys.modules['autotailor'] = None\nimport torch\n"
            f"net = torch.load({str(tmp_path / 'net.pt')!r}, weights_only=False)\n"
            f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
            "assert torch.allclose(net(io['x']), io['y'], atol=1e-6)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_heads_ratios_come_from_the_config_and_bad_ones_are_refused() -> None:
    config = CONFIG + "[var.block_vars]\nAttentionBlock.heads_ratio = [0.25, 1.0]\n"
    sn = at.compile(timm_vit(heads=8), torch.randn(1, 3, 32, 32), config=config)
    assert {v.choices for v in sn.space.variables if v.kind == "heads"} == {(2, 8)}
    with pytest.raises(ConfigError, match=r"AttentionBlock.heads_ratio = \[0.0\] is not allowed; expected a list "
                                          r"of ratios in \(0, 1\]"):
        at.compile(timm_vit(), torch.randn(1, 3, 32, 32),
                   config=CONFIG + "[var.block_vars]\nAttentionBlock.heads_ratio = [0.0]\n")


class _AttentionWeightsUsed(nn.Module):
    """Attention whose weights feed the output: not plain multi-head attention, left as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 16, 8, 8)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.head = nn.Linear(16 + 16, 10)

    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2)
        y, w = self.attn(t, t, t)
        return self.head(torch.cat([y.mean(1), w.mean(1)], dim=1))


def test_attention_whose_weights_are_used_is_not_rewritten() -> None:
    torch.manual_seed(0)
    model = _AttentionWeightsUsed().eval()
    x = torch.randn(2, 3, 32, 32)
    sn = at.compile(model, x[:1], config=CONFIG).eval()
    assert not any(isinstance(m, HeadAttention) for m in sn.modules())
    assert not any(v.kind == "heads" for v in sn.space.variables)
    with torch.no_grad():
        assert torch.allclose(sn(x), model(x), atol=1e-6)


def tiny_swin() -> nn.Module:
    torch.manual_seed(0)
    model = timm.models.SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2, 2),
                                        num_heads=(3, 6), num_classes=10).eval()
    with torch.no_grad():  # the first block's last head the most important
        model.layers[0].blocks[0].attn.proj.weight[:, 16:] *= 4
    return model


def tiny_torchvision_swin(v2: bool = False) -> nn.Module:
    from torchvision.models import swin_transformer as swin

    torch.manual_seed(0)
    blocks = {"block": swin.SwinTransformerBlockV2, "downsample_layer": swin.PatchMergingV2} if v2 else {}
    return well_conditioned(swin.SwinTransformer(patch_size=[2, 2], embed_dim=24, depths=[2, 2], num_heads=[3, 6],
                                                 window_size=[4, 4], num_classes=10, **blocks)).eval()


def tiny_torchvision_swin_v2() -> nn.Module:
    return tiny_torchvision_swin(v2=True)


@pytest.mark.parametrize("v2", [False, True], ids=["swin", "swin_v2"])
def test_torchvision_swin_whose_attention_is_one_wrapped_function_gets_heads(v2: bool) -> None:
    # torchvision keeps its window attention out of torch.fx (torch.fx.wrap): traced again on
    # the example, its layers are seen and the attention recognised, shift masks included.
    # V2's cosine attention: q and k normalised per head, a learned scale per head, and a bias
    # from a small MLP whose outputs are one per head, reordered with them.
    model = tiny_torchvision_swin(v2)
    x = torch.randn(2, 3, 32, 32)
    sn = at.compile(model, x[:1], config=CONFIG).eval()
    kinds = Counter(v.kind for v in sn.space.variables)
    assert (kinds["heads"], kinds["qk"], kinds["v"]) == (4, 4, 4)
    assert [v.choices for v in sn.space.variables if v.kind == "heads"] == [(2, 3), (2, 3), (3, 4, 6), (3, 4, 6)]
    assert sum(isinstance(m, HeadAttention) for m in sn.modules()) == 4
    with torch.no_grad():
        assert torch.allclose(sn(x), model(x), atol=1e-5)


def test_swin_heads_take_their_relative_position_biases_along() -> None:
    # Swin's attention adds a bias computed from a table with one column per head: reordering
    # the heads reorders the table, and dropping heads drops their biases.
    model = tiny_swin()
    x = torch.randn(2, 3, 32, 32)
    sn = at.compile(model, x[:1], config=CONFIG).eval()
    heads = {v.name: v.choices for v in sn.space.variables if v.kind == "heads"}
    # Every block, the shifted-window ones (a second, per-window mask) included.
    assert heads == {"block1.num_heads": (2, 3), "block5.num_heads": (2, 3), "block9.num_heads": (3, 4, 6),
                     "block13.num_heads": (3, 4, 6)}
    assert [m.windowed for m in sn.modules() if isinstance(m, HeadAttention)] == ["", "shared", "", "shared"]
    net = sn.extract({"block1.num_heads": 2})
    for arch in (sn.space.sample(0), {"block5.num_heads": 2, "block13.num_heads": 3}):
        with torch.no_grad():
            sn.set_arch(arch)
            assert torch.equal(sn.extract(arch)(x), sn(x))
    sn.set_arch(sn.space.max())
    reference = tiny_swin()
    attn = reference.layers[0].blocks[0].attn
    sn_proj = dict(sn.named_parameters())["net.block1.body.layers.0.blocks.0.attn.proj.weight"].detach()
    keep = _head_of(sn_proj[:, :16], attn.proj.weight.detach(), 8)
    assert keep[0] == 2  # importance moved a head: the table must move with it
    sn_table = dict(sn.named_parameters())["net.block1.body.layers.0.blocks.0.attn.relative_position_bias_table"]
    assert torch.equal(sn_table[:, :2], attn.relative_position_bias_table[:, keep])
    with torch.no_grad():
        for i in set(range(3)) - set(keep):
            attn.proj.weight[:, i * 8:(i + 1) * 8] = 0
        assert torch.allclose(sn(x), model(x), atol=1e-6)
        assert torch.allclose(net(x), reference(x), atol=1e-5)


def tiny_maxvit() -> nn.Module:
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    return well_conditioned(MaxVit(input_size=(32, 32), stem_channels=8, partition_size=2, block_channels=[16, 32],
                                   block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0, num_classes=10)).eval()


def test_maxvit_attention_over_windows_written_with_einsum_gets_heads() -> None:
    # torchvision's MaxViT keeps the windows on an axis of their own (batch, windows, tokens,
    # features), chunks a fused projection in three, scales the keys and writes both products
    # with einsum; its stages' streams go through swapaxes.
    model = tiny_maxvit()
    x = torch.randn(2, 3, 32, 32)
    sn = at.compile(model, x[:1], config=CONFIG).eval()
    heads = {v.name: v.choices for v in sn.space.variables if v.kind == "heads"}
    assert heads == {"block3.num_heads": (1, 2), "block6.num_heads": (1, 2), "block11.num_heads": (2, 3, 4),
                     "block14.num_heads": (2, 3, 4)}
    assert [v.values for v in sn.space.variables if v.kind == "embedding"] == [(8, 12, 16), (16, 24, 32)]
    with torch.no_grad():
        assert torch.allclose(sn(x), model(x), atol=1e-5)
    net = sn.extract({"block11.num_heads": 2})
    # The reference: the model with the dropped heads' columns of the output projection zeroed.
    reference = tiny_maxvit()
    attn = reference.blocks[1].layers[0].layers.window_attention.attn_layer[1]
    merge = "net.block11.body.blocks.1.layers.0.layers.window_attention.attn_layer.1.merge.weight"
    keep = _head_of(dict(sn.named_parameters())[merge].detach()[:, :16], attn.merge.weight.detach(), 8)
    with torch.no_grad():
        for i in set(range(4)) - set(keep):
            attn.merge.weight[:, i * 8:(i + 1) * 8] = 0
        assert torch.allclose(net(x), reference(x), atol=1e-5)


def tiny_efficientvit() -> nn.Module:
    from timm.models.efficientvit_mit import EfficientVit

    torch.manual_seed(0)
    return well_conditioned(EfficientVit(widths=(8, 16, 24, 32, 48), depths=(1, 1, 1, 2, 1), head_dim=8,
                                         head_widths=(64, 80), num_classes=10)).eval()


def test_efficientvit_linear_attention_gets_heads() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from autotailor.predict.latency import CostModel, KernelPlan

    # EfficientViT's attention is linear (ReLU kernels, values padded with ones) over the heads of
    # a 1x1 convolution, aggregated at a second scale by a depthwise and a grouped convolution;
    # its output convolution reads both scales' heads.
    model = tiny_efficientvit()
    x = torch.randn(2, 3, 64, 64)
    sn = at.compile(model, x[:1], config="[var.global_vars]\nresolution = [64]\n").eval()
    heads = {v.name: v.choices for v in sn.space.variables if v.kind == "heads"}
    assert heads == {"block3.num_heads": (2, 3, 4), "block5.num_heads": (2, 3, 4), "block8.num_heads": (3, 4, 6)}
    with torch.no_grad():
        assert torch.allclose(sn(x), model(x), atol=1e-5)
    net = sn.extract({"block8.num_heads": 3})
    # The reference: the model with the dropped heads' columns of the output convolution zeroed,
    # at both scales (its input channels are [scale][head][dim]).
    reference = tiny_efficientvit()
    attn = reference.stages[3].blocks[1].context_module.main
    qkv = dict(sn.named_parameters())["net.block8.body.stages.3.blocks.1.context_module.main.qkv.conv.weight"]
    keep = _head_of(qkv.detach().flatten(1).t()[:, :3 * 24], attn.qkv.conv.weight.detach().flatten(1).t(), 24)
    with torch.no_grad():
        for i, scale in itertools.product(set(range(6)) - set(keep), range(2)):
            attn.proj.conv.weight[:, (scale * 6 + i) * 8:(scale * 6 + i + 1) * 8] = 0
        assert torch.allclose(net(x), reference(x), atol=1e-5)
    # Counted costs are those of the SubNet as it runs (torch's own count of its products).
    costs = CostModel(KernelPlan(sn, "none"))
    for seed in range(3):
        arch = sn.space.complete(sn.space.sample(seed))
        net = sn.extract(arch)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            net(x[:1])
        assert costs.costs(arch).macs == counter.get_total_flops() // 2
        assert costs.costs(arch).params == sum(p.numel() for p in net.parameters())


def test_an_einsum_that_is_a_matrix_product_becomes_one() -> None:
    from autotailor.compiler.normalize import einsum_as_matmul

    def f(a, b, c):
        scores = torch.einsum("b h i d, b h j d -> b h i j", a, b)
        return torch.einsum("bhij,bhjd->bhid", scores, c), torch.einsum("bhid,bhid->bh", a, c)

    gm = torch.fx.symbolic_trace(f)
    a, b, c = torch.randn(3, 2, 3, 5, 4).unbind(0)
    expected = gm(a, b, c)
    assert einsum_as_matmul(gm) == 2  # the third sums over the features: not a matrix product
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(torch.einsum) == 1
    for got, want in zip(gm(a, b, c), expected):
        assert torch.allclose(got, want, atol=1e-6)


def tiny_levit() -> nn.Module:
    torch.manual_seed(0)
    return well_conditioned(timm.models.Levit(img_size=64, embed_dim=(32, 48), key_dim=8, depth=(2, 2),
                                              num_heads=(2, 3), num_classes=10)).eval()


def test_levit_attention_with_batchnorm_projections_and_per_head_biases() -> None:
    # LeViT: q, k and v come from one Linear + BatchNorm over tokens, head-major, with key and
    # value widths that differ, k already transposed, and a learned bias per head and offset.
    model = tiny_levit()
    x = torch.randn(2, 3, 64, 64)
    sn = at.compile(model, x[:1], config="[var.global_vars]\nresolution = [64]\n").eval()
    heads = {v.name: v.choices for v in sn.space.variables if v.kind == "heads"}
    # The four attention blocks and the subsampling attention between the stages (its queries
    # from every second token, by a projection of their own; keys and values from one).
    assert heads == {"block1.num_heads": (1, 2), "block3.num_heads": (1, 2), "block5.num_heads": (2, 3, 4),
                     "block9.num_heads": (2, 3), "block11.num_heads": (2, 3)}
    assert {v.kind for v in sn.space.variables} == {"depth", "embedding", "width", "heads", "qk", "v"}
    with torch.no_grad():
        ref = model(x)
        assert (sn(x) - ref).abs().max() <= 1e-5 * ref.abs().max()
        arch = {name: choices[0] for name, choices in heads.items()}
        sn.set_arch(arch)
        assert torch.equal(sn.extract(arch)(x), sn(x))


def test_levit_queries_and_keys_narrow_through_their_batchnorm() -> None:
    """LeViT's q/k width: the Linear's rows and the BatchNorm's channels after it keep the same
    features per head, those whose q and k rows have the largest product of norms times their
    BatchNorm's scale: the model with the other q/k features' BatchNorm outputs zeroed."""
    def levit() -> nn.Module:  # weights at 1/sqrt(fan-in): timm's 0.02 makes near-equal tokens, whose
        model, g = tiny_levit(), torch.Generator().manual_seed(1)  # attention barely depends on q/k
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    m.weight.normal_(0, m.weight[0].numel() ** -0.5, generator=g)
        return model

    model = levit()
    x = torch.randn(2, 3, 64, 64)
    sn = at.compile(model, x[:1], config="[var.global_vars]\nresolution = [64]\n").eval()
    qk = [v for v in sn.space.variables if v.kind == "qk"]
    assert [v.choices for v in qk] == [(4, 6, 8)] * 5  # of 8 key features per head, in each attention
    arch = {qk[0].name: 4, qk[2].name: 6, qk[4].name: 6}
    net = sn.extract(arch)
    reference = levit()

    def norms(proj: nn.Module, heads: int) -> torch.Tensor:
        scale = (proj.bn.weight / (proj.bn.running_var + proj.bn.eps).sqrt()).abs()
        return (proj.linear.weight.norm(dim=-1) * scale).reshape(heads, -1)

    def zero(proj: nn.Module, rows: list[int]) -> None:
        proj.bn.weight[rows] = 0
        proj.bn.bias[rows] = 0

    with torch.no_grad():
        for (stage, block, heads), d in (((0, 0, 2), 4), ((1, 1, 3), 6)):
            qkv = reference.stages[stage].blocks[block].attn.qkv  # rows [head][q 8, k 8, v 16]
            n = norms(qkv, heads)
            kept = (n[:, :8] * n[:, 8:16]).argsort(dim=1, descending=True)[:, :d]
            zero(qkv, [h * 32 + off + j for h in range(heads) for off in (0, 8) for j in range(8) if j not in kept[h]])
        sub = reference.stages[1].downsample.attn_downsample  # q rows [head][8]; kv rows [head][k 8, v 32]
        kept = (norms(sub.q.ln, 4) * norms(sub.kv, 4)[:, :8]).argsort(dim=1, descending=True)[:, :6]
        dropped = [(h, j) for h in range(4) for j in range(8) if j not in kept[h]]
        zero(sub.q.ln, [h * 8 + j for h, j in dropped])
        zero(sub.kv, [h * 40 + j for h, j in dropped])
        assert torch.allclose(net(x), reference(x), atol=1e-5)
        assert (net(x) - model(x)).abs().max() > 1e-3  # the truncation changes the output
        sn.set_arch(arch)
        assert torch.equal(sn(x), net(x))
    sizes = {n: m.num_features for n, m in net.named_modules() if n.endswith(("qkv_bn", "q_ln_bn", "kv_bn"))}
    assert list(sizes.values()) == [2 * (4 + 4 + 16), 2 * 32, 4 * (6 + 32), 4 * 6, 3 * 32, 3 * (6 + 6 + 16)], sizes


def test_levit_linear_and_batchnorm_are_exported_and_profiled_as_one_layer(tmp_path) -> None:
    # ONNX Runtime runs the flatten, the BatchNorm over tokens and the reshape one by one: the
    # exporters fold them into the Linear, and the kernels are enumerated so
    import onnx

    from autotailor.deploy.fold import fold_linear_norms
    from autotailor.predict.latency import KernelPlan

    sn = at.compile(tiny_levit(), torch.randn(1, 3, 64, 64), config="[var.global_vars]\nresolution = [64]\n").eval()
    net = sn.extract(sn.space.max()).eval()
    folded = fold_linear_norms(net)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (folded(x) - net(x)).abs().max() <= 1e-5 * float(net(x).abs().max())
    # per stage of two blocks: attention's qkv and output, the MLP's two layers; between them the
    # subsampling attention's q, kv and output and its MLP's two
    units = sum(1 for n in net.graph.nodes if n.target == "reshape_as")
    assert units == 21 and not any(n.target == "reshape_as" for n in folded.graph.nodes)
    ops = Counter(n.op_type for n in onnx.load(export_onnx(net, tmp_path / "n.onnx", (1, 3, 64, 64))).graph.node)
    assert ops["BatchNormalization"] == 1  # the head's, before its Linear: nothing to fold it into
    plan = KernelPlan(sn, "ort-cpu")
    starts = Counter(plan.by_name[g.nodes[0]].kind for g in plan.groups)
    # alone: the stem's flatten into tokens and the head's BatchNorm; no reshape_as
    assert (starts["flatten"], starts["batchnorm1d"], starts["reshape_as"]) == (1, 1, 0)


def test_attention_kernels_are_enumerated_per_head_count_and_costs_are_counted_exactly() -> None:
    from autotailor.predict.latency import CostModel, KernelPlan

    sn = at.compile(timm_vit(), torch.randn(1, 3, 32, 32), config=CONFIG).eval()
    plan = KernelPlan(sn, "ort-cpu")
    attention = [k.signature for k in plan.kernels if k.signature.startswith("attention")]
    # One kernel per head count (2, 3, 4), q/k and value width per head (6, 9, 12 each): fused
    # q/k/v in, merged heads out, the same in every layer: 17 tokens (16 patches, the class token).
    assert sorted(s.split(" | ")[1:3] for s in attention) == sorted(
        [list(t) for t in {(f"in (1, 17, {h * (2 * d + dv)})", f"out (1, 17, {h * dv})") for h in (2, 3, 4)
                           for d in (6, 9, 12) for dv in (6, 9, 12)}])
    costs = CostModel(KernelPlan(sn, "none"))
    for seed in range(3):
        arch = sn.space.sample(seed)
        net = sn.extract(arch)
        assert costs.costs(arch).params == sum(p.numel() for p in net.parameters())
    # The scores and the weighted sum: tokens^2 * (q/k width + v width) per head.
    qk = next(v.name for v in sn.space.variables if v.kind == "qk")
    smaller = {**sn.space.max(), qk: 6}
    assert costs.costs(sn.space.max()).macs - costs.costs(smaller).macs == 4 * 17 * 17 * 6 + 4 * 17 * 48 * 12


def _zero_dropped(attn: nn.Module, kind: str, d: int) -> None:
    """Zero the qkv rows (rows [q, k, v][head][12] of 4 heads) whose features the kind drops,
    keeping in each head the ``d`` most important: q/k features by the product of their q and k
    rows' norms; values by their v row's norm times the output projection's column's."""
    norms = attn.qkv.weight.reshape(3, 4, 12, 48).norm(dim=-1)
    if kind == "qk":
        score, parts = norms[0] * norms[1], (0, 1)
    else:
        score, parts = norms[2] * attn.proj.weight.norm(dim=0).reshape(4, 12), (2,)
    kept = score.argsort(dim=1, descending=True)[:, :d]
    rows = [p * 48 + h * 12 + j for p in parts for h in range(4) for j in range(12) if j not in kept[h]]
    attn.qkv.weight[rows] = 0
    attn.qkv.bias[rows] = 0


@pytest.mark.parametrize("kind", ["qk", "v"])
def test_a_narrower_query_key_or_value_is_the_model_with_those_features_left_out(kind) -> None:
    """Keeping d of each head's q/k features computes the truncated dot product at the model's
    scale: the model with the other q and k features zeroed. Keeping d of its value features
    keeps those v rows and the output projection's columns that read them: the model with the
    other v rows zeroed. The d kept are the most important (``_zero_dropped``)."""
    model = timm_vit()
    x = torch.randn(2, 3, 32, 32)
    sn = at.compile(model, x[:1], config=CONFIG).eval()
    names = [v.name for v in sn.space.variables if v.kind == kind]
    arch = {names[0]: 6, names[2]: 9}
    net = sn.extract(arch)
    reference = timm_vit()
    with torch.no_grad():
        for layer, d in ((0, 6), (2, 9)):
            _zero_dropped(reference.blocks[layer].attn, kind, d)
        assert torch.allclose(net(x), reference(x), atol=1e-5)
        assert (net(x) - model(x)).abs().max() > 2e-4  # the narrowing changes the output
        sn.set_arch(arch)
        assert torch.equal(sn(x), net(x))
    qkv = [m.out_features for n, m in net.named_modules() if n.endswith("qkv")]
    proj = [m.in_features for n, m in net.named_modules() if n.endswith("attn_proj")]
    if kind == "qk":
        assert qkv == [4 * (6 + 6 + 12), 4 * 36, 4 * (9 + 9 + 12)] and proj == [48] * 3
    else:
        assert qkv == [4 * (12 + 12 + 6), 4 * 36, 4 * (12 + 12 + 9)] and proj == [4 * 6, 4 * 12, 4 * 9]


def test_a_vit_that_resamples_its_position_embedding_gets_resolution_and_embedding() -> None:
    # timm's dynamic_img_size: the resampling function is kept whole, the embedding sliced through it.
    torch.manual_seed(0)
    model = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4,
                                          num_classes=10, dynamic_img_size=True).eval()
    sn = at.compile(model, torch.randn(1, 3, 32, 32), config="[var.global_vars]\nresolution = [16, 24, 32]").eval()
    assert sn.space["resolution"].choices == (16, 24, 32) and sn.space["embed_ratio"].values == (24, 36, 48)
    with torch.no_grad():
        for arch in ({"resolution": 16}, {"resolution": 24, "embed_ratio": 0.5}):
            sn.set_arch(arch)
            x = torch.randn(2, 3, arch["resolution"], arch["resolution"])
            assert torch.equal(sn.extract(arch)(x), sn(x))
            if "embed_ratio" not in arch:
                assert torch.allclose(sn(x), model(x), atol=1e-5)


def test_tuning_decays_weight_matrices_only_and_calibration_skips_a_model_without_batchnorm() -> None:
    from autotailor.data import BatchLoader
    from autotailor.data.datasets import ArrayDataset
    from autotailor.tune import TuneConfig, Tuner, evaluate

    sn = at.compile(timm_vit(), torch.randn(1, 3, 32, 32), config=CONFIG)
    names = {id(p): n for n, p in sn.named_parameters()}
    data = ArrayDataset(np.zeros((8, 32, 32, 3), dtype=np.uint8), np.zeros(8, dtype=np.int64), [str(i) for i in range(10)])
    tuner = Tuner(sn, BatchLoader(data, 4, train=True, resolution=32), TuneConfig(optimizer="adamw", weight_decay=0.05))
    decayed, kept = ({names[id(p)] for p in g["params"]} for g in tuner.optimizer.param_groups)
    assert tuner.optimizer.param_groups[1]["weight_decay"] == 0.0
    assert any("cls_token" in n for n in kept) and any("pos_embed" in n for n in kept)
    assert all(dict(sn.named_parameters())[n].ndim >= 2 for n in decayed) and any("qkv" in n for n in decayed)
    assert not any(n.endswith("bias") or "norm" in n for n in decayed)

    def never():
        raise AssertionError("a model without BatchNorm ran a calibration batch")
        yield

    x, y = torch.randn(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    assert evaluate(sn, sn.space.min(), [(x, y)], never()) == evaluate(sn, sn.space.min(), [(x, y)])


def test_a_kernel_computed_from_constants_alone_is_folded_and_ncnn_profiles_a_vit(tmp_path) -> None:
    """The class token expanded to the batch reads no input: a static-shape conversion folds it,
    and NCNN cannot take a model without inputs, so it costs nothing in the table."""
    from autotailor.predict.latency import KernelPlan, LatencyPredictor, LutStore, profile
    from autotailor.predict.latency.backends import make_backend
    from autotailor.predict.latency.lut import Target

    torch.manual_seed(0)
    model = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=1, num_heads=4,
                                          num_classes=10).eval()
    config = (CONFIG + "embed_ratio = [1.0]\nwidth_ratio = [1.0]\n[var.stage_vars]\nreduce_depth = [0]\n"
              "[var.block_vars]\nAttentionBlock.heads_ratio = [1.0]\nAttentionBlock.qk_ratio = [1.0]\n"
              "AttentionBlock.v_ratio = [1.0]\nFFNBlock.expand_ratio = [1.0]\n")
    sn = at.compile(model, torch.randn(1, 3, 32, 32), config=config).eval()
    plan = KernelPlan(sn, "ncnn")
    constant = [k.signature for k in plan.kernels if not plan.example(k)[1]]
    assert len(constant) == 1 and constant[0].startswith("expand")
    backend = make_backend("ncnn", threads=1, warmup=1, repeats=3, budget_s=0.02)
    target = Target.of("test", "ncnn", **backend.settings)
    with LutStore(tmp_path / "lut.sqlite") as store:
        assert profile(plan, backend, store, target).measured == len(plan.kernels) + 1
        entries = store.get(target, [k.signature for k in plan.kernels])
        predictor = LatencyPredictor.from_store(plan, store, target)
    assert entries[constant[0]].median_ms == 0 and entries[constant[0]].repeats == 0  # never run
    # Every other kernel was run (a tiny one may time at 0 once the call overhead is taken off).
    assert all(m.repeats > 0 for sig, m in entries.items() if sig not in constant)
    assert predictor.predict(sn.space.max()) > 0
