"""Outputs of chosen decoder layers of the target, captured during its forward pass.

Learned drafts read features of the target: by default its final hidden state
(what ``ModelRunner.forward`` returns); EAGLE-3 reads the concatenated outputs of
low, middle and high decoder layers instead. ``ModelRunner.forward_tapped`` hands
them over: the lean decoder keeps them as it goes, the Hugging Face path through
hooks attached only around that one forward, so other users of the model pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from speccore.errors import SpecError


def check_feature_layers(layers: tuple[int, ...], n_layers: int) -> None:
    """Taps must sit below the last layer, whose output is normed into the final state."""
    for layer in layers:
        if not 0 <= layer < n_layers - 1:
            raise SpecError(
                f"feature layer {layer} is out of range: "
                f"the target has layers 0..{n_layers - 2} below its last"
            )


class LayerTap:
    def __init__(self, model: PreTrainedModel, layers: tuple[int, ...]) -> None:
        decoder: Any = model.base_model
        blocks = list(decoder.layers)
        check_feature_layers(layers, len(blocks))
        self.modules = [blocks[i] for i in layers]
        self._outputs: dict[int, torch.Tensor] = {}

    @contextmanager
    def capture(self) -> Iterator[None]:
        """Record the tapped layers' outputs of the forward pass run inside the block."""
        self._outputs = {}
        handles = [m.register_forward_hook(partial(self._hook, i)) for i, m in enumerate(self.modules)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _hook(self, index: int, module: nn.Module, args: object, output: torch.Tensor) -> None:
        # A Hugging Face decoder layer returns its hidden states as a plain tensor.
        self._outputs[index] = output

    def features(self) -> torch.Tensor:
        """[batch, q, layers*hidden] the tapped outputs of the last capture, in the order asked."""
        if len(self._outputs) != len(self.modules):
            raise RuntimeError(f"expected {len(self.modules)} tapped outputs, got {len(self._outputs)}")
        return torch.cat([self._outputs[i] for i in range(len(self.modules))], dim=-1)
