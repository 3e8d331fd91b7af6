"""What a candidate costs beside the target: memory it holds and work per verify step.

Sizes are in parameters (the runtime dtype turns them into bytes) except fixed
structures (datastores, pools), whose size is known in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftCost:
    """Resources of one candidate beside the target, per sequence and per verify step.

    Every field defaults to nothing, so a family names only what it spends.
    """

    verify_nodes: int  # draft tokens the target verifies per step (the pending token excluded)
    extra_params: int = 0  # draft / head weights held beside the target
    fixed_bytes: int = 0  # datastores and pools, whatever the dtype
    kv_elems_per_token: int = 0  # draft KV cache per context token and sequence
    forward_params: int = 0  # weights one draft forward reads
    forward_layers: int = 0  # layers of one draft forward (framework overhead)
    forwards: int = 0  # sequential draft forwards per verify step
    sharded: bool = False  # runs across the target's devices (heads) rather than on one (draft models)
    lookup_s: float = 0.0  # host-side lookup per step

    def extra_bytes(self, dtype_bytes: int, context_tokens: int, batch: int) -> int:
        """Memory beside the target: weights, fixed structures and the draft's KV cache."""
        kv = self.kv_elems_per_token * dtype_bytes * context_tokens * batch
        return self.extra_params * dtype_bytes + self.fixed_bytes + kv
