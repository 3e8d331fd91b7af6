"""A model's packed weights sit side by side in one mapping advised for 2 MiB pages, with their
values unchanged; the mapping goes when the model does."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from speccore import hugepages
from speccore.cpu_kernels import PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(not hugepages.supported(), reason="no madvise(MADV_HUGEPAGE) here")


def _mapping(tensor: torch.Tensor) -> dict[str, str]:
    """The /proc/self/smaps entry (header fields and VmFlags) of the mapping holding ``tensor``."""
    address = tensor.data_ptr()
    entry: dict[str, str] | None = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                if entry is not None:
                    break
                start, end = (int(part, 16) for part in head.split("-"))
                if start <= address < end:
                    entry = {"range": head}
            elif entry is not None:
                key, _, value = line.partition(":")
                entry[key] = value.strip()
    assert entry is not None, "the tensor's address is in no mapping"
    return entry


def test_move_keeps_values_and_puts_tensors_in_one_advised_mapping() -> None:
    owners = [nn.Module() for _ in range(3)]
    originals = [torch.randn(300, 7), torch.randn(2, 5).to(torch.bfloat16), torch.arange(1000.0)]
    for owner, tensor in zip(owners, originals, strict=True):
        owner.packed = tensor.clone()
    hugepages.move(owners, "packed")
    moved = [owner.packed for owner in owners]
    for before, after in zip(originals, moved, strict=True):
        assert torch.equal(before, after) and after.dtype == before.dtype and after.is_contiguous()
        assert after.data_ptr() % hugepages.ALIGN == 0
    assert moved[0].data_ptr() % hugepages.PAGE == 0
    ranges = {_mapping(t)["range"] for t in moved}
    assert len(ranges) == 1, "side by side in one mapping"
    assert "hg" in _mapping(moved[0])["VmFlags"].split(), "advised for huge pages"


def test_the_mapping_is_released_with_its_last_tensor() -> None:
    owner = nn.Module()
    owner.packed = torch.ones(1 << 20)
    hugepages.move([owner], "packed")
    first = owner.packed.data_ptr()

    def mapped() -> bool:
        with open("/proc/self/maps") as maps:
            for line in maps:
                start, end = (int(part, 16) for part in line.split()[0].split("-"))
                if start <= first < end:
                    return True
        return False

    assert mapped()
    del owner
    gc.collect()
    assert not mapped()


def test_pack_linears_moves_every_packed_weight_and_keeps_the_outputs() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32, bias=False))
    x = torch.randn(5, 64)
    expected = model(x)
    pack_linears(model, torch.float32)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 2
    assert len({_mapping(m.packed)["range"] for m in packed}) == 1
    assert "hg" in _mapping(packed[0].packed)["VmFlags"].split()
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_empty_gives_a_buffer_on_an_advised_mapping() -> None:
    buffer = hugepages.empty(1 << 20, torch.float32).fill_(2.0)
    assert buffer.shape == (1 << 20,) and float(buffer.sum()) == 2.0 * (1 << 20)
    assert "hg" in _mapping(buffer)["VmFlags"].split()
