"""spaces_between_special_tokens, on a tokenizer whose decoder puts a space between every two tokens
(as SentencePiece-style decoders do before special tokens): False writes consecutive special tokens
without the space, as vLLM's fast detokenizer does. (The bundled byte-level tokenizer never puts one
there, so the switch cannot show on it.)"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.detokenizer import IncrementalDetokenizer
from tracevllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "end": 3}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tok.add_special_tokens({"additional_special_tokens": ["<a>", "<b>"]})
    return tok


def detokenize(tokenizer, ids, **params) -> str:
    request = EngineCoreRequest("r", [1], SamplingParams(**params), None, 0.0)
    detok = IncrementalDetokenizer(tokenizer, request)
    for i in ids:
        detok.update([i], stop_terminated=False)
    return detok.output_text


def test_spaces_between_special_tokens(tokenizer):
    a, b = tokenizer.convert_tokens_to_ids(["<a>", "<b>"])
    ids = [2, a, b, a, 3]
    assert detokenize(tokenizer, ids, skip_special_tokens=False) == " world <a> <b> <a> end"
    assert detokenize(tokenizer, ids, skip_special_tokens=False, spaces_between_special_tokens=False) == \
        " world <a><b><a> end"
    # Skipped special tokens leave no text, so the switch changes nothing then (as in vLLM).
    assert detokenize(tokenizer, ids, spaces_between_special_tokens=False) == detokenize(tokenizer, ids)
