"""SentencePiece BPE from a GGUF whose ``tokenizer.ggml.model`` is ``"llama"``.

Such a GGUF (Llama 2, Mistral, Phi-3, Gemma) stores pieces with scores and types but no
merges: SentencePiece BPE merges the adjacent pair whose joined piece has the highest
score, and llama.cpp's ``llm_tokenizer_spm`` does exactly that. The tokenizers library
needs merges, so they are rebuilt from the scores the way transformers' GGUF loader does
(``GGUFTokenizerSkeleton``: every split of a piece into two pieces, ordered by the joined
piece's score), which gives its ids for Llama 2/Mistral-style files. Spaces become "▁", a
"▁" is prepended when ``tokenizer.ggml.add_space_prefix`` is true (the default; Gemma says
false) and text no piece covers falls back to the ``<0xNN>`` byte pieces.

Gemma takes the same path, as in llama.cpp and the original Gemma ``tokenizer.json``
(a BPE model). transformers 4.57 builds a Unigram model from the same scores for a gemma2 or
gemma3 GGUF (transformers issue 41494), which picks other pieces for most words; Phi-3's
GGUF converter there has no "▁" normalizer at all. ortgen does not copy either.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers

from ..errors import ExportError

__all__ = ["SPACE", "merges_from_scores", "spm_tokenizer"]

SPACE = "▁"  # SentencePiece's space


def spm_tokenizer(
    tokens: Sequence[str],
    scores: Sequence[float] | None,
    merges: Sequence[str] | None,
    *,
    unk_token: str | None,
    add_space_prefix: bool,
) -> Tokenizer:
    """The SentencePiece-BPE pipeline (model, normalizer, decoder) of a ``llama`` vocabulary;
    special tokens and BOS/EOS are added by the caller. ``merges`` (rare in such files) are
    used as they are, as transformers does; otherwise they come from ``scores``."""
    if merges is not None:
        pairs = [_split_merge(m) for m in merges]
    elif scores is None:
        raise ExportError(
            "the GGUF's SentencePiece vocabulary (tokenizer.ggml.model 'llama') has neither "
            "tokenizer.ggml.scores nor tokenizer.ggml.merges, so the merge order is unknown"
        )
    else:
        if len(scores) != len(tokens):
            raise ExportError(
                f"the GGUF has {len(tokens)} tokens but {len(scores)} tokenizer.ggml.scores"
            )
        pairs = merges_from_scores(tokens, scores)
    tok = Tokenizer(
        models.BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=pairs,
            unk_token=unk_token,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # transformers' "legacy" Llama normalizer: llama.cpp also prepends the space to the text
    # after each special token, which Prepend on each piece between added tokens does.
    steps = [normalizers.Prepend(SPACE)] if add_space_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    undo = [decoders.ByteFallback(), decoders.Fuse(), decoders.Replace(SPACE, " ")]
    if add_space_prefix:
        undo.append(decoders.Strip(" ", 1, 0))  # the prepended space
    tok.decoder = decoders.Sequence(undo)
    return tok


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's highest-score-first merging.

    The same list, in the same order, as transformers' ``GGUFTokenizerSkeleton``: for each
    piece (in vocabulary order; a repeated piece counts once, with its last score) every
    split into two pieces of the vocabulary, those ordered by the two parts' scores, then
    all merges ordered by the joined piece's score, highest first (stable sorts, so ties keep
    that order).
    """
    score_of = {token: float(score) for token, score in zip(tokens, scores, strict=True)}
    found: list[tuple[str, str, float]] = []
    for piece, score in score_of.items():
        local = [
            (piece[:cut], piece[cut:], score)
            for cut in range(1, len(piece))
            if piece[:cut] in score_of and piece[cut:] in score_of
        ]
        local.sort(key=lambda m: (score_of[m[0]], score_of[m[1]]), reverse=True)
        found.extend(local)
    found.sort(key=lambda m: m[2], reverse=True)
    return [(left, right) for left, right, _ in found]


def _split_merge(merge: str) -> tuple[str, str]:
    parts = merge.split(" ")
    if len(parts) != 2:
        raise ExportError(f"tokenizer.ggml.merges holds {merge!r}, which is not two pieces")
    return parts[0], parts[1]
