"""Small text stacks for the tiny models: a word-level tokenizer and a small UMT5 encoder.

``WanPipeline.encode_prompt`` calls ``tokenizer(..., padding="max_length")`` and
``text_encoder(ids, mask).last_hidden_state``; a ``PreTrainedTokenizerFast`` over a
``tokenizers`` WordLevel model and a ``UMT5EncoderModel`` satisfy exactly that
interface, so the tiny models go through the pipeline's own prompt encoding.
"""

from __future__ import annotations

import re
from typing import Iterable

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")


def words_of(texts: Iterable[str]) -> list[str]:
    """Sorted unique lower-case words of `texts` (the tokenizer's vocabulary)."""
    words = set()
    for text in texts:
        words.update(re.findall(r"\w+|[^\w\s]", text.lower()))
    return sorted(words)


def build_word_tokenizer(vocabulary: Iterable[str]) -> PreTrainedTokenizerFast:
    words = [w for w in dict.fromkeys(w.lower() for w in vocabulary) if w not in SPECIAL_TOKENS]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({w: i + len(SPECIAL_TOKENS) for i, w in enumerate(words)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build_text_encoder(vocab_size: int, d_model: int = 16, layers: int = 1, heads: int = 2, seed: int = 0) -> UMT5EncoderModel:
    torch.manual_seed(seed)
    config = UMT5Config(
        vocab_size=vocab_size, d_model=d_model, d_kv=d_model // heads, d_ff=2 * d_model, num_layers=layers,
        num_heads=heads, relative_attention_num_buckets=8, relative_attention_max_distance=32, dropout_rate=0.0,
        feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        is_encoder_decoder=False, use_cache=False,
    )
    return UMT5EncoderModel(config).eval()
