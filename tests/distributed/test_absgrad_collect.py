"""The sharded step's absgrad hook hands each view its rows and then lets the step's tensors go."""

import gc
import weakref

import torch

from bytesplat_ns.distributed.step import _collect_absgrad


def _publisher(m):
    """Stands in for the rasterizer's hook: publishes ``m.absgrad`` in the backward, before the
    collector (through a weak reference, as the rasterizers do)."""
    ref = weakref.ref(m)
    m.register_hook(lambda grad: setattr(ref(), "absgrad", grad.abs()) or None)


def test_collects_each_views_rows_in_the_callers_order_and_frees_the_step():
    leaf = torch.randn(2, 5, 2, requires_grad=True)
    m = leaf * 1.0
    _publisher(m)
    order = torch.tensor([2, 0, 1])
    sinks = ([], [])
    _collect_absgrad(m, (None, order), sinks, (4, 3))
    weight = torch.arange(20, dtype=torch.float32).reshape(2, 5, 2) - 7
    (m * weight).sum().backward()
    assert torch.equal(sinks[0][0], weight[0, :4].abs())
    assert torch.equal(sinks[1][0], torch.empty(3, 2).index_copy_(0, order, weight[1, :3].abs()))
    dead = weakref.ref(m)
    del m
    gc.collect()
    assert dead() is None, "the collector's hook keeps the step's means2d alive"
