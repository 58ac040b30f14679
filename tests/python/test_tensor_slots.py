"""The core's tables as the adapters read them, without a GPU: each pass's FP8 scaling slots
(core.fp8_scale_slots, fusedattn/tensor_slots.h) against the tensor sets' properties, and the
outputs' shapes (Config.output_axes, fusedattn/output_shapes.h) as _config.output_shapes applies them."""
from types import SimpleNamespace

import pytest

from fusedattn import _config
from fusedattn import _core as core

SETS = {_config.FORWARD: core.ForwardTensors, _config.BACKWARD: core.BackwardTensors}


@pytest.mark.parametrize("pass_", [_config.FORWARD, _config.BACKWARD])
def test_every_slot_is_a_property_that_round_trips(pass_):
    slots = core.fp8_scale_slots(pass_)
    names = [name for name, _ in slots]
    assert len(set(names)) == len(names)
    # Scales come before amaxes: the JAX call's operands, then its results.
    roles = [role for _, role in slots]
    assert roles == sorted(roles, key=lambda role: role != "scale")
    addresses = {name: 16 * (i + 1) for i, name in enumerate(names)}
    tensors = SETS[pass_](**addresses)
    assert {name: getattr(tensors, name) for name in names} == addresses


def test_slot_lists_are_the_documented_ones():
    assert core.fp8_scale_slots(_config.FORWARD) == [
        ("descale_q", "scale"), ("descale_k", "scale"), ("descale_v", "scale"), ("descale_s", "scale"),
        ("scale_s", "scale"), ("scale_o", "scale"), ("amax_s", "amax"), ("amax_o", "amax")]
    assert [name for name, role in core.fp8_scale_slots(_config.BACKWARD) if role == "amax"] == [
        "amax_d_q", "amax_d_k", "amax_d_v", "amax_d_p"]


def shaped(*sizes):
    return SimpleNamespace(shape=sizes)


def test_output_shapes_dense_gqa_and_narrow_v():
    config = _config.config("sbhd", max_logit="row")
    q, k, v = shaped(100, 2, 8, 128), shaped(50, 2, 2, 128), shaped(50, 2, 2, 64)
    assert _config.output_shapes(config, _config.FORWARD, q, k, v) == {
        "o": (100, 2, 8, 64), "stats": (2, 8, 100), "max_logit": (2, 8, 100)}
    assert _config.output_shapes(config, _config.BACKWARD, q, k, v) == {
        "d_q": (100, 2, 8, 128), "d_k": (50, 2, 2, 128), "d_v": (50, 2, 2, 64)}


def test_output_shapes_ragged_and_head_max_logit():
    config = _config.config("thd", max_logit="head", softmax="sink")
    q, k, v = shaped(300, 8, 64), shaped(280, 2, 64), shaped(280, 2, 64)
    assert _config.output_shapes(config, _config.FORWARD, q, k, v) == {"o": (300, 8, 64), "stats": (300, 8),
                                                                      "max_logit": (8,)}
    assert _config.output_shapes(config, _config.BACKWARD, q, k, v)["d_sink"] == (8,)


def test_output_shapes_pick_sizes_as_they_are():
    # Any size object passes through untouched (torch.compile's symbolic sizes do the same).
    b, s = object(), object()
    config = _config.config("bshd", stats=True)
    shapes = _config.output_shapes(config, _config.FORWARD, shaped(b, s, 8, 64), shaped(b, s, 8, 64),
                                   shaped(b, s, 8, 32))
    assert shapes["o"] == (b, s, 8, 32)
    assert shapes["stats"] == (b, 8, s)


def test_axes_are_the_cores():
    assert _config.AXES == {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}
