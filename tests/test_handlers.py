"""The operator registry: every handler holds every facet of its operator."""

import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir import DynConv2d, for_module, registered
from autotailor.ir.handlers import DEFAULT, FACETS, OpHandler


def test_every_registered_handler_has_every_facet():
    missing = {repr(h): [f for f in FACETS if not hasattr(h, f)] for h in registered()}
    assert {h: m for h, m in missing.items() if m} == {}
    assert len(registered()) >= 15


def test_a_handler_lacking_a_facet_is_found():
    class Half(OpHandler):  # channels and nothing else
        def channels(self, a, node):
            return None

    assert [f for f in FACETS if not hasattr(Half(), f)] == [f for f in FACETS if f != "channels"]


def test_handlers_are_found_through_subclasses_and_say_what_they_are():
    class MyConv(nn.Conv2d):
        pass

    conv, dw = MyConv(8, 8, 3), nn.Conv2d(8, 8, 3, groups=8)
    h = for_module(conv)
    assert h is for_module(dw) and h.dynamic is DynConv2d
    assert (h.kind(conv), h.structure(conv), h.structure(dw), h.role) == ("conv2d", "dense", "dwconv", "conv")
    assert h.costs(h.facts(conv), [(1, 8, 10, 10)], (1, 8, 8, 8), None) == (8 * 8 * 8 * 8 * 9, 8 * 8 * 9 + 8)
    assert h.costs(h.facts(dw), [(1, 8, 10, 10)], (1, 8, 8, 8), 1) == (8 * 8 * 8 * 1, 8 + 8)
    relu6 = for_module(nn.ReLU6())
    assert (relu6.kind(nn.ReLU6()), relu6.structure(None), relu6.same_shape) == ("relu6", "act", True)
    assert for_module(nn.PReLU()) is DEFAULT and DEFAULT.costs(DEFAULT.facts(nn.PReLU(4)), [], (1, 4), None) == (0, 4)
    assert F.relu in type(relu6).keys
