"""Small random heads for a real target, written and read back through the artifact format.

A head's quality never changes losslessness, so the decoding tests use untrained
heads of the target's shapes; import as ``from heads import save_random_head``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from speccore.heads.artifact import HeadConfig, read_config, save_head
from speccore.heads.eagle import EagleHead
from speccore.heads.medusa import MedusaHeads
from speccore.models import LoadedModel
from specprompts.sources import humaneval_pool, sharegpt_conversations

DRAFT_VOCAB = 2048


def frequent_ids(target: LoadedModel, size: int = DRAFT_VOCAB) -> torch.Tensor:
    """[size] sorted ids of the tokens most frequent in ShareGPT replies and HumanEval prompts."""
    texts = [text for _, turns in sharegpt_conversations(100) for role, text in turns if role == "assistant"]
    texts += [p.text for p in humaneval_pool()]
    counts: Counter[int] = Counter()
    for text in texts:
        counts.update(target.tokenizer.encode(text, add_special_tokens=False))
    ids = [t for t, _ in counts.most_common(size)]
    seen = set(ids)
    ids += [t for t in range(2 * size) if t not in seen][: size - len(ids)]
    return torch.tensor(sorted(ids), dtype=torch.long)


def head_config(target: LoadedModel, family: str, **overrides: Any) -> HeadConfig:
    cfg = target.model.config
    vocab, hidden = target.model.get_output_embeddings().weight.shape
    fields: dict[str, Any] = {
        "family": family,
        "hidden_size": int(hidden),
        "vocab_size": int(vocab),
        "draft_vocab_size": DRAFT_VOCAB,
        "num_heads": 4,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": int(hidden) // cfg.num_attention_heads,
        "intermediate_size": cfg.intermediate_size,
        "feature_layers": [2, 15, 28] if family == "eagle3" else [],
    }
    return HeadConfig(**{**fields, **overrides})


def save_random_head(
    target: LoadedModel,
    family: str,
    out: Path,
    draft_ids: torch.Tensor,
    *,
    noise: float = 0.02,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Write a head with random weights (``noise`` std around the module's own init,
    0 keeps it: a Medusa head then repeats the target's prediction) and check that
    its config reads back."""
    config = head_config(target, family, draft_vocab_size=len(draft_ids), **overrides)
    torch.manual_seed(seed)
    module: nn.Module = MedusaHeads(config) if family == "medusa" else EagleHead(config)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn_like(param) * noise)
        module.get_buffer("draft_ids").copy_(draft_ids)
    save_head(out, config, module, dtype=torch.float32)
    if read_config(out) != config:
        raise AssertionError(f"{out}: the config did not read back")
    return out


def _target_side(target: LoadedModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings of x_1.. [T-1, hidden] and the target's features at 0.. [T, hidden] (one chain pass)."""
    with torch.no_grad():
        features = target.model.base_model(input_ids=ids[None]).last_hidden_state[0]
        return target.model.get_input_embeddings()(ids[1:]), features


def chain_outputs(target: LoadedModel, head: EagleHead, token_ids: list[int]) -> torch.Tensor:
    """[T-1, hidden] the EAGLE layer's output at every entry of a sequence (entry j reads
    x_{j+1} and the target's feature at j), run as one chain in the head's dtype."""
    embeds, features = _target_side(target, torch.tensor(token_ids))
    dtype = next(head.parameters()).dtype
    with torch.no_grad():
        entries = head.inputs(embeds.to(dtype), head.target_feature(features[:-1].to(dtype)))
        return head.layer(inputs_embeds=entries[None]).last_hidden_state[0]


def fit_eagle_head(target: LoadedModel, token_ids: list[int], draft_ids: torch.Tensor, out: Path) -> Path:
    """Write an EAGLE-1 head fitted (100 Adam steps, a few seconds) to one sequence of the
    target's own: entry j learns the feature at j+1 and the token x_{j+2}."""
    config = head_config(target, "eagle", draft_vocab_size=len(draft_ids))
    torch.manual_seed(0)
    head = EagleHead(config)
    head.get_buffer("draft_ids").copy_(draft_ids)
    ids = torch.tensor(token_ids)
    embeds, features = _target_side(target, ids)
    weight = target.model.get_output_embeddings().weight.detach()  # [vocab, hidden]
    index = torch.full((weight.shape[0],), -100)
    index[draft_ids] = torch.arange(len(draft_ids))
    labels = index[ids[2:]]  # x_{j+2} in the draft vocabulary, -100 where it is not in it
    opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    for _ in range(100):
        entries = head.inputs(embeds, features[:-1])
        pred = head.layer(inputs_embeds=entries[None]).last_hidden_state[0]  # [T-1, hidden]
        loss = F.cross_entropy(F.linear(pred[:-1], weight[draft_ids]), labels)
        loss = loss + F.smooth_l1_loss(pred, features[1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_head(out, config, head, dtype=torch.float32)
    return out
