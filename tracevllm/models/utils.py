"""Pipeline-parallel building blocks for the models: a stage's slice of the layers, placeholders
for the rest, and what one stage hands the next.

With ``pp`` stages, stage ``s`` builds only the decoder layers ``get_pp_indices`` gives it; the other
layers are ``PPMissingLayer`` placeholders, so that ``model.layers.17.mlp...`` is still layer 17's
name on every stage (checkpoint names map to parameters unchanged). The embedding lives only on the
first stage, the final norm and the LM head only on the last. Five layers on two stages::

                  embed_tokens  layers: 0  1  2  3  4  norm  lm_head
    stage 0 of 2       x                x  x  x  .  .   .      .      -> IntermediateTensors, to stage 1
    stage 1 of 2       .                .  .  .  x  x   x      x      -> logits
                                                    (x = built and loaded, . = a PPMissingLayer)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tracevllm.distributed.parallel_state import get_pp_group
from tracevllm.distributed.utils import get_pp_indices


@dataclass(slots=True)
class IntermediateTensors:
    """What a stage that is not the last returns and sends to the next: the residual stream as it
    stands after the stage's last layer, both ``[num_tokens, hidden_size]`` in the model's dtype
    (vLLM's name; there a dict of named tensors)."""

    hidden_states: torch.Tensor
    residual: torch.Tensor


class PPMissingLayer(nn.Module):
    """Stands in for a module another pipeline stage holds: no parameters, never called."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("PPMissingLayer: this module lives on another pipeline stage")


def make_layers(num_hidden_layers: int, layer_fn: Callable[[int], nn.Module]) -> tuple[int, int, nn.ModuleList]:
    """``(start, end, layers)``: ``layer_fn(i)`` for this stage's layers ``[start, end)``, a
    ``PPMissingLayer`` at every other index."""
    pp = get_pp_group()
    start, end = get_pp_indices(num_hidden_layers, pp.rank_in_group, pp.world_size)
    layers = nn.ModuleList(layer_fn(i) if start <= i < end else PPMissingLayer() for i in range(num_hidden_layers))
    return start, end, layers


def missing_module_prefixes(model: nn.Module) -> tuple[str, ...]:
    """``"name."`` of every placeholder in ``model``: a parameter name starting with one of these
    belongs to another stage."""
    return tuple(f"{name}." for name, module in model.named_modules() if isinstance(module, PPMissingLayer))
