"""timm's own functions that the compiler keeps whole, so that its models keep their variables.

timm's ViT with ``dynamic_img_size=True`` resamples its position embedding to the input's grid
(``resample_abs_pos_embed``): code torch.fx cannot follow, which the frontend keeps as one call.
The call reads the embedding channel by channel, so the embedding's channels pass through it
and the parameter is sliced with the residual stream it is added to.
"""

from __future__ import annotations

import torch.fx as fx

from autotailor.ir.graph import node_shape
from autotailor.ir.handlers import Elementwise, Track, register

try:
    from timm.layers.pos_embed import resample_abs_pos_embed
except ImportError:  # timm is optional
    resample_abs_pos_embed = None

if resample_abs_pos_embed is not None:

    @register(resample_abs_pos_embed)
    class ResamplePosEmbed(Elementwise):
        def channels(self, a, node: fx.Node) -> Track | None:
            param = node.args[0]
            shape = node_shape(node)
            if not (isinstance(param, fx.Node) and param.op == "get_attr" and shape is not None):
                a.fix_inputs(node, f"{node.name} resamples a tensor that is not a parameter")
                return None
            axis = len(shape) - 1
            gid = a.add_param_member(a.new_group(shape[axis]), param, axis, node)
            return Track(axis, gid)
