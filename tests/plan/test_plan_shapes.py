"""Parameter counts of the presets, computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import pytest

from switchyard.train.plan import ModelShape, PlanError, model_preset, preset_names
from switchyard.train.strategy import WrapGranularity


def test_llama3_8b_counts_gqa_and_swiglu() -> None:
    # embedding   128256·4096                                  =   525,336,576
    # attention   4096·4096 (q) + 2·4096·1024 (k, v: 8 heads x 128) + 4096·4096 (o)
    #                                                          =    41,943,040
    # SwiGLU      3·4096·14336                                 =   176,160,768
    # two norms   2·4096                                       =         8,192
    # block                                                    =   218,112,000
    # 32 blocks                                                = 6,979,584,000
    # final norm 4096 + untied head 525,336,576
    # total 525,336,576 + 6,979,584,000 + 4,096 + 525,336,576  = 8,030,261,248
    shape = model_preset("llama3-8b")
    assert shape.attention_params() == 41_943_040
    assert shape.block_params() == 218_112_000
    assert shape.total_params() == 8_030_261_248


def test_llama3_70b() -> None:
    # embedding 128256·8192 = 1,050,673,152; attention 2·8192² + 2·8192·1024 = 150,994,944;
    # SwiGLU 3·8192·28672 = 704,643,072; norms 16,384; block 855,654,400; x80 = 68,452,352,000;
    # + 2·1,050,673,152 (embedding, head) + 8,192 (final norm) = 70,553,706,496
    assert model_preset("llama3-70b").total_params() == 70_553_706_496


def test_llama3_405b() -> None:
    # embedding 128256·16384 = 2,101,346,304; attention 2·16384² + 2·16384·1024 = 570,425,344;
    # SwiGLU 3·16384·53248 = 2,617,245,696; norms 32,768; block 3,187,703,808;
    # x126 = 401,650,679,808; + 2·2,101,346,304 + 16,384 = 405,853,388,800
    assert model_preset("llama3-405b").total_params() == 405_853_388_800


@pytest.mark.parametrize("name", ["tiny", "small", "1b"])
def test_gpt_presets_follow_the_switchyard_model(name: str) -> None:
    from switchyard.models import GPTConfig

    assert model_preset(f"gpt-{name}").total_params() == GPTConfig.preset(name).num_parameters()


def test_gpt_tiny_matches_the_built_module() -> None:
    torch = pytest.importorskip("torch")
    from switchyard.models import GPT, GPTConfig

    model = GPT(GPTConfig.preset("tiny"))
    unique = {id(p): p.numel() for p in model.parameters()}  # the tied weight once
    assert sum(unique.values()) == model_preset("gpt-tiny").total_params()
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert largest == model_preset("gpt-tiny").largest_module_params()
    del torch


def test_fsdp_units_follow_the_trainer_wrapping() -> None:
    shape = model_preset("llama3-70b")
    block, total = shape.block_params(), shape.total_params()
    root = total - 80 * block  # embedding + final norm + head = 2·1,050,673,152 + 8,192
    assert root == 2_101_354_496
    assert shape.fsdp_units(WrapGranularity.BLOCK).largest == root
    assert shape.fsdp_units(WrapGranularity.BLOCK).prefetched == block
    assert shape.fsdp_units(WrapGranularity.ROOT).largest == total
    assert shape.fsdp_units(WrapGranularity.LAYER).prefetched == 8192 * 28672


def test_preset_names_include_both_families() -> None:
    names = preset_names()
    assert {"gpt-tiny", "llama3-8b", "llama3-70b", "llama3-405b"} <= set(names)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"hidden": 100, "heads": 3}, "model.hidden"), ({"kv_heads": 3}, "model.heads"),
     ({"layers": 0}, "model.layers")],
)
def test_bad_shapes_name_the_field(kwargs: dict[str, int], field: str) -> None:
    dims = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 100}
    dims.update(kwargs)
    with pytest.raises(PlanError, match=field):
        ModelShape(dims["layers"], dims["hidden"], dims["heads"], dims["kv_heads"], dims["ffn"],
                   dims["vocab"])


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(PlanError, match="llama3-70b"):
        model_preset("llama9-1t")
    with pytest.raises(PlanError, match="gpt-huge"):
        model_preset("gpt-huge")
