"""Which rank holds which slice of a model: ``plot_rank_slices(config, tp, pp)``.

One column per tensor-parallel rank, one band per pipeline stage, drawn from the same rules the
engine loads weights by: ``get_pp_indices`` for the stages' layers; ``QKVParallelLinear``'s split of
the query heads (``heads / tp`` each) and KV heads (``kv / tp`` each, or, when tp > kv, KV head
``tp_rank // (tp / kv)``, shared by ``tp / kv`` ranks); the MLP's ``intermediate / tp`` features;
and the vocabulary's ``vocab / tp`` rows, for the embedding (first stage) and the LM head (last).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from tracevllm.distributed.utils import get_pp_indices
from viz.plots.style import REQUEST_COLOURS, new_figure, text_colour


def _ranges(total: int, tp: int, tp_rank: int) -> tuple[int, int]:
    size = total // tp
    return tp_rank * size, (tp_rank + 1) * size


def _kv_heads(num_kv_heads: int, tp: int, tp_rank: int) -> str:
    if tp >= num_kv_heads:
        head = tp_rank // (tp // num_kv_heads)
        return f"KV head {head} (shared by {tp // num_kv_heads})" if tp > num_kv_heads else f"KV head {head}"
    start, end = _ranges(num_kv_heads, tp, tp_rank)
    return f"KV heads {start}–{end - 1}"


def plot_rank_slices(config, tp: int, pp: int, model_name: str = "") -> Figure:
    """``config``: a Hugging Face config (num_hidden_layers, num_attention_heads, num_key_value_heads,
    intermediate_size, vocab_size)."""
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    kv, inter, vocab = config.num_key_value_heads, config.intermediate_size, config.vocab_size
    figure = new_figure(3.2 * tp + 1.5, 1.0 + 2.1 * pp)
    ax = figure.add_subplot()
    for pp_rank in range(pp):
        first, last = get_pp_indices(layers, pp_rank, pp)
        for tp_rank in range(tp):
            rank = pp_rank * tp + tp_rank
            colour = REQUEST_COLOURS[rank % len(REQUEST_COLOURS)]
            q0, q1 = _ranges(heads, tp, tp_rank)
            m0, m1 = _ranges(inter, tp, tp_rank)
            v0, v1 = _ranges(vocab, tp, tp_rank)
            lines = [f"rank {rank}"]
            if pp_rank == 0:
                lines.append(f"embedding rows {v0:,}–{v1 - 1:,}")
            lines += [f"layers {first}–{last - 1}: each with", f"query heads {q0}–{q1 - 1}",
                      _kv_heads(kv, tp, tp_rank), f"MLP features {m0:,}–{m1 - 1:,}"]
            if pp_rank == pp - 1:
                lines.append(f"LM head rows {v0:,}–{v1 - 1:,}")
            ax.add_patch(Rectangle((tp_rank + 0.03, pp_rank + 0.04), 0.94, 0.92, facecolor=colour, edgecolor="0.3"))
            ax.text(tp_rank + 0.5, pp_rank + 0.5, "\n".join(lines), ha="center", va="center", fontsize=8.5,
                    color=text_colour(colour))
    ax.set_xlim(0, tp)
    ax.set_ylim(pp, 0)
    ax.set_xticks([t + 0.5 for t in range(tp)], [f"tp rank {t}" for t in range(tp)])
    ax.set_yticks([p + 0.5 for p in range(pp)], [f"stage {p}" for p in range(pp)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    name = f"{model_name}: " if model_name else ""
    ax.set_title(f"{name}tensor_parallel_size={tp} × pipeline_parallel_size={pp} ({layers} layers, {heads} query "
                 f"heads, {kv} KV heads)", fontsize=10)
    return figure
