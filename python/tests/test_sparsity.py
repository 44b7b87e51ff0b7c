"""Block layouts and butterfly patterns: what they accept and refuse."""
import gc

import pytest

import flashgen
from flashgen import sparsity


def test_block_layout_from_nested_lists():
    layout = flashgen.BlockLayout([[1, 0, 1], [0, 1, 1]], block_size=32)
    assert layout.shape == (1, 2, 3) and layout.block_size == (32, 32)
    assert layout._bytes == bytes([1, 0, 1, 0, 1, 1])
    per_head = flashgen.BlockLayout([[[1, 1]], [[0, 1]]], block_size=(16, 64))
    assert per_head.shape == (2, 1, 2) and per_head.block_size == (16, 64)
    assert sparsity.describe(per_head) == (1, 16, 64, 0, per_head.id)


@pytest.mark.parametrize("mask, match", [
    ([[1, 2]], "0 or 1"),
    ([[1, 0], [1]], r"\(2, 2\)"),
    ([], "empty"),
])
def test_block_layout_refuses_bad_masks(mask, match):
    with pytest.raises(ValueError, match=match):
        flashgen.BlockLayout(mask, block_size=16)


@pytest.mark.parametrize("block", [8, 24, (16, 0), (32,), "big"])
def test_block_sizes_are_multiples_of_16(block):
    with pytest.raises(ValueError, match="block_size"):
        flashgen.BlockLayout([[1]], block_size=block)
    with pytest.raises(ValueError, match="block_size"):
        flashgen.Butterfly(2, block_size=block)


def test_butterfly():
    b = flashgen.Butterfly(3, block_size=(32, 64))
    assert sparsity.describe(b) == (2, 32, 64, 3, 0)
    with pytest.raises(ValueError, match="0..30"):
        flashgen.Butterfly(31, block_size=32)


def test_describe_refuses_other_objects():
    assert sparsity.describe(None) == (0, 0, 0, 0, 0)
    with pytest.raises(TypeError, match="BlockLayout"):
        sparsity.describe([[1]])


def test_a_dropped_layout_is_reported():
    layout = flashgen.BlockLayout([[1]], block_size=16)
    lid = layout.id
    assert sparsity.layout_by_id(lid) is layout
    del layout
    gc.collect()
    with pytest.raises(ValueError, match="no longer exists"):
        sparsity.layout_by_id(lid)
