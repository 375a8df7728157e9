"""Which decoder layers each pipeline stage runs (vLLM's ``vllm/distributed/utils.py``)."""

from __future__ import annotations


def get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """The layers ``[start, end)`` that stage ``pp_rank`` of ``pp_size`` runs.

    Each stage gets ``num_hidden_layers // pp_size`` consecutive layers. The ``r`` layers left over
    go one each to the ``r`` stages just before the last, counting backwards from the second to
    last: the last stage also runs the final norm and the LM head, and the first (once every other
    stage has one more) the embedding, so they are the ones left with fewer layers::

        5 layers, 2 stages: [3, 2]        22 layers, 4 stages: [5, 6, 6, 5]
        5 layers, 3 stages: [2, 2, 1]     7 layers, 4 stages:  [2, 2, 2, 1]

    Needs ``1 <= pp_size <= num_hidden_layers`` (``ParallelConfig.verify_with_model`` checks it), so
    no stage is empty.
    """
    assert 0 <= pp_rank < pp_size <= num_hidden_layers, (num_hidden_layers, pp_rank, pp_size)
    base, remainder = divmod(num_hidden_layers, pp_size)
    # Stages pp_size - 1 - remainder .. pp_size - 2 get the extra layers.
    sizes = [base + (pp_size - 1 - remainder <= stage < pp_size - 1) for stage in range(pp_size)]
    start = sum(sizes[:pp_rank])
    return start, start + sizes[pp_rank]
