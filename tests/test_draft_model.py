"""The ``draft_model`` drafter: a smaller model of the same tokenizer drafts, the target
verifies. Output is the target's own, token for token (greedy and seeded), whatever the
draft model proposes; the drafts kept are exactly those the draft model run alone gets
right (all of them when it is the target); a draft model of another vocabulary is
refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ortgen
from tests.tiny_models import VOCAB_SIZE, build_tiny_hf

PROMPTS = [[5, 9, 33, 70, 12, 5, 9, 33, 70, 12, 5, 9], [44, 3, 8, 17, 90, 2], [100, 101]]


def _export(hf: Path, out: Path, graph: str = "fused") -> Path:
    from ortgen.export import Variant, export_model

    variant = Variant(graph=graph, precision="fp32")
    return export_model(hf, out, variant=variant, progress=lambda _msg: None, overwrite=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The target (a tiny llama), a sibling with its weights perturbed (agrees on most
    tokens, not all), and one with a wider vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("draft-model")
    target_hf = build_tiny_hf("llama", root / "target-hf")
    model = AutoModelForCausalLM.from_pretrained(target_hf)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(0.02 * torch.randn_like(weight))
    model.save_pretrained(root / "sibling-hf")
    (root / "sibling-hf" / "generation_config.json").write_text(
        (target_hf / "generation_config.json").read_text()
    )
    config = LlamaConfig.from_pretrained(target_hf)
    config.vocab_size = VOCAB_SIZE + 8
    wide = AutoModelForCausalLM.from_config(config)
    wide.save_pretrained(root / "wide-hf")
    return {
        "target": _export(target_hf, root / "target"),
        "sibling": _export(root / "sibling-hf", root / "sibling"),
        "sibling-optimum": _export(root / "sibling-hf", root / "sibling-optimum", "optimum"),
        "wide": _export(root / "wide-hf", root / "wide"),
    }


def draft_predictions(
    draft: ortgen.TextGenerator, prompt: list[int], plain: list[int]
) -> list[int]:
    """The draft model run alone: its greedy next token after ``prompt`` and the first
    ``j`` tokens of ``plain``, for each ``j`` (one batch of fresh prompts, so nothing of
    the drafter's rewinds and appends is in it)."""
    prefixes = [prompt + plain[:j] for j in range(len(plain))]
    out = draft.generate(prefixes, max_new_tokens=1, eos_token_id=None, do_sample=False)
    return [tokens[0] for tokens in out.tokens]


def expected_stats(
    predicted: list[int], plain: list[int], new: int, num_tokens: int
) -> dict[str, int]:
    """``drafted``, ``accepted`` and ``verify_forwards`` of the draft model drafting for
    a greedy target whose own tokens are ``plain`` (``new`` of them): no drafts before
    the prompt is fed; a step drafts as many as the schedule says (``num_tokens`` first,
    then two more after a draft kept whole, else one more than was kept; at most
    ``num_tokens``) and the buffer has room for; the draft model stands where the target
    is, so its k-th draft is its prediction after the target's tokens while the drafts
    before it were right; the target keeps drafts up to the first that is not its own
    token, and adds its own token after them."""
    drafted = accepted = forwards = 0
    done, next_count = 1, num_tokens
    while done < new:
        count = min(next_count, new - done - 1)
        if count < 1:  # no room for a draft: a plain step
            done += 1
            continue
        kept = 0
        while kept < count and predicted[done + kept] == plain[done + kept]:
            kept += 1
        drafted, accepted, forwards = drafted + count, accepted + kept, forwards + 1
        next_count = max(1, min(num_tokens, next_count + 2 if kept == count else kept + 1))
        done += kept + 1
    return {"drafted": drafted, "accepted": accepted, "verify_forwards": forwards}


@pytest.mark.parametrize("draft", ["target", "sibling", "sibling-optimum"])
def test_greedy_is_the_targets_own_output(models, draft) -> None:
    """Token for token the target's greedy output, and exactly the drafts the draft
    model alone predicts kept: all of them when it is the target itself; for the
    perturbed sibling, those its own greedy continuation of the target's tokens gets
    right. A drafter that lost track of where the target is (a rewind too short, a kept
    token not appended) drafts from the wrong tokens, and the counts differ."""
    gen = ortgen.load(models["target"], threads=1)
    alone = ortgen.load(models[draft], threads=1)
    spec = {"name": "draft_model", "model": str(models[draft]), "num_tokens": 4}
    drafted = kept = 0
    for prompt in PROMPTS:
        predicted: list[int] = []
        for new in (40, 7):  # 7: the buffer's end cuts the last drafts
            plain = gen.generate(prompt, max_new_tokens=new, eos_token_id=None, logprobs=True)
            fast = gen.generate(
                prompt, max_new_tokens=new, eos_token_id=None, logprobs=True, drafter=spec
            )
            assert fast.tokens == plain.tokens, (prompt, new)
            np.testing.assert_allclose(fast.logprobs[0], plain.logprobs[0], atol=1e-4)
            predicted = predicted or draft_predictions(alone, prompt, plain.tokens[0])
            stats = {k: int(fast.stats[k]) for k in ("drafted", "accepted", "verify_forwards")}
            assert stats == expected_stats(predicted, plain.tokens[0], new, 4), (prompt, new)
            drafted += stats["drafted"]
            kept += stats["accepted"]
    if draft == "target":
        assert drafted == kept > 0  # the target drafting for itself: every draft kept
    else:
        assert drafted > kept > 0  # the sibling agrees often, not always: both paths ran


def test_seeded_sampling_draws_the_same_tokens(models) -> None:
    gen = ortgen.load(models["target"], threads=1)
    spec = {"name": "draft_model", "model": str(models["sibling"])}
    settings = {"do_sample": True, "temperature": 0.8, "top_k": 30, "seed": 4}
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=30, eos_token_id=None, **settings)
        fast = gen.generate(prompt, max_new_tokens=30, eos_token_id=None, drafter=spec, **settings)
        assert fast.tokens == plain.tokens


def test_a_chat_that_goes_on_keeps_drafting_from_where_it_is(models) -> None:
    """The draft model follows the target across steps with rejections (rewind) and
    several tokens kept (append); a second request reuses the loaded draft model."""
    gen = ortgen.load(models["target"], threads=1)
    spec = {"name": "draft_model", "model": str(models["sibling"]), "num_tokens": 6}
    first = gen.generate(PROMPTS[0], max_new_tokens=60, eos_token_id=None, drafter=spec)
    assert len(gen.model_state) == 1  # loaded once, kept for the next request
    again = gen.generate(PROMPTS[0], max_new_tokens=60, eos_token_id=None, drafter=spec)
    assert (
        again.tokens
        == first.tokens
        == gen.generate(PROMPTS[0], max_new_tokens=60, eos_token_id=None).tokens
    )
    assert len(gen.model_state) == 1


def test_bad_draft_models_are_refused_by_name(models, tmp_path) -> None:
    gen = ortgen.load(models["target"], threads=1)
    with pytest.raises(ortgen.ConfigError, match="scores 264 tokens, the target 256"):
        gen.generate(PROMPTS[0], drafter={"name": "draft_model", "model": str(models["wide"])})
    with pytest.raises(ortgen.ConfigError, match="could not load"):
        gen.generate(PROMPTS[0], drafter={"name": "draft_model", "model": str(tmp_path)})
    with pytest.raises(ortgen.ConfigError, match="needs model"):
        gen.generate(PROMPTS[0], drafter="draft_model")
    with pytest.raises(ortgen.ConfigError, match="num_tokens must be an integer >= 1"):
        gen.generate(
            PROMPTS[0],
            drafter={"name": "draft_model", "model": str(models["sibling"]), "num_tokens": 0},
        )
