"""What a candidate costs beside the target: memory it holds and work per verify step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DraftCost:
    """Resources of one candidate beside the target, per sequence and per verify step."""

    extra_params: int  # draft / head weights held beside the target
    fixed_bytes: int  # datastores and pools, whatever the dtype
    kv_elems_per_token: int  # draft KV cache per context token and sequence
    forward_params: int  # weights one draft forward reads
    forward_layers: int  # layers of one draft forward (framework overhead)
    forwards: int  # sequential draft forwards per verify step
    sharded: bool  # runs across the target's devices (heads) rather than on one (draft models)
    lookup_s: float  # host-side lookup per step
    verify_nodes: int  # draft tokens the target verifies per step (the pending token excluded)

    def extra_bytes(self, dtype_bytes: int, context_tokens: int, batch: int) -> int:
        """Memory beside the target: weights, fixed structures and the draft's KV cache."""
        kv = self.kv_elems_per_token * dtype_bytes * context_tokens * batch
        return self.extra_params * dtype_bytes + self.fixed_bytes + kv
