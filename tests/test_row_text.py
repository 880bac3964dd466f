"""RowText: one row's text with stop strings, as every driver of the step object sees it.

Checked against the plain definition: the text is ``decode(ids)`` cut before the first
stop string; what streaming shows never reaches into a stop string and joins to the
final text; a row rebuilt from its history (after a rewind) goes on the same way.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgen.text import RowText
from tests.text_fixtures import FIXTURE_SETTINGS, backend, chatml_dir, cleanup_pair, pair, root

__all__ = ["backend", "chatml_dir", "cleanup_pair", "pair", "root"]

STOP_CHOICES = ["e", "ab", " the", "\n\n", "##", "o w", "🙂", "xyz", "東京"]


def _expected(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest stop string (these stop strings never overlap so
    that a later-starting one completes first), and whether one occurs."""
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def _run(row: RowText, ids: list[int], kept: str = "") -> tuple[str, int]:
    """Push ``ids`` until a stop; return what streaming showed after ``kept`` (text the
    row already had) and how many tokens were pushed."""
    shown = kept
    pushed = 0
    for tid in ids:
        pushed += 1
        stopped = row.push(tid)
        shown += row.take()
        assert row.text.startswith(shown), "streaming showed text that was later cut"
        if stopped:
            break
    row.close()
    shown += row.take()
    return shown[len(kept) :], pushed


@settings(FIXTURE_SETTINGS, max_examples=150)
@given(
    text=st.text(alphabet="abe the\n#ow🙂xyz東京.,", max_size=60),
    stops=st.lists(st.sampled_from(STOP_CHOICES), min_size=0, max_size=3),
)
def test_row_text_equals_decode_cut_at_the_first_stop(pair, text: str, stops: list[str]):
    tok, _ = pair
    ids = tok.encode(text, add_special_tokens=False)
    row = RowText(tok, stops)
    shown, pushed = _run(row, ids)
    expected, stopped = _expected(tok.decode(ids), stops)
    assert row.text == expected
    assert shown == expected
    assert row.stopped == stopped
    if not stopped:
        assert pushed == len(ids)


@settings(FIXTURE_SETTINGS, max_examples=80)
@given(
    text=st.text(alphabet="abe the\n#ow🙂xyz.,", min_size=1, max_size=50),
    split=st.integers(0, 50),
    stops=st.lists(st.sampled_from(STOP_CHOICES), min_size=1, max_size=3),
)
def test_row_text_from_history_finds_stops_that_complete_later(
    pair, text: str, split: int, stops: list[str]
):
    """A row rebuilt from kept tokens (rewind, continuation) shows only new text and finds
    a stop string that starts in the kept text and ends in the new one."""
    tok, _ = pair
    ids = tok.encode(text, add_special_tokens=False)
    split = min(split, len(ids))
    history, rest = ids[:split], ids[split:]
    if any(s in tok.decode(history) for s in stops):
        return  # a row with a stop in its kept text would have finished there
    row = RowText(tok, stops, history=history)
    assert row.take() == ""
    kept = row.text  # the history's text, counted as shown
    assert tok.decode(history).startswith(kept)
    shown, _ = _run(row, rest, kept)
    expected, _ = _expected(tok.decode(ids), stops)
    assert row.text == expected
    assert shown == expected[len(kept) :] if len(expected) >= len(kept) else shown == ""


def test_row_text_without_stop_strings_streams_everything(pair):
    tok, _ = pair
    ids = tok.encode("Über 東京 🙂, the end.", add_special_tokens=False)
    row = RowText(tok)
    shown, _ = _run(row, ids)
    assert shown == row.text == tok.decode(ids)
    assert not row.stopped


def test_row_text_holds_back_only_a_possible_stop_start(pair):
    tok, _ = pair
    row = RowText(tok, ["<END>"])
    shown = ""
    for tid in tok.encode("one two <EN", add_special_tokens=False):
        row.push(tid)
        shown += row.take()
    assert shown == "one two "  # "<EN" may still become "<END>"
    for tid in tok.encode("D> after", add_special_tokens=False):
        if row.push(tid):
            break
    assert row.stopped and row.text == "one two "
    assert row.take() == ""


def test_row_text_searches_only_a_bounded_tail(pair, monkeypatch):
    """Work per token is bounded by the tail, not the text: over 4,000 tokens the stop
    search and the hold-back check never look at more than the longest stop string plus
    the newest piece (the timing side is ``benchmarks/stream_cost.py``)."""
    from ortgen.text.stop_strings import StopStringMatcher

    seen: list[int] = []
    for method in ("find", "safe_length"):
        original = getattr(StopStringMatcher, method)

        def spy(self, text, *args, _original=original):
            seen.append(len(text))
            return _original(self, text, *args)

        monkeypatch.setattr(StopStringMatcher, method, spy)
    tok, _ = pair
    ids = tok.encode("the quick brown fox jumps over the lazy dog. " * 500)[:4000]
    row = RowText(tok, ["STOP", "\n\nUser:"])
    for tid in ids:
        row.push(tid)
        row.take()
    assert len(row) > 15_000 and len(seen) > 4000
    assert max(seen) <= len("\n\nUser:") + 32


@pytest.mark.parametrize("stops", [[], ["xyz"]])
def test_row_text_close_is_idempotent(pair, stops):
    tok, _ = pair
    row = RowText(tok, stops)
    for tid in tok.encode("🙂 done", add_special_tokens=False):
        row.push(tid)
    first = row.close()
    assert row.close() == first == tok.decode(tok.encode("🙂 done", add_special_tokens=False))
    assert row.push(5) is False and row.text == first  # a closed row takes no more text


def test_stop_string_completed_by_the_final_flush_is_found(cleanup_pair):
    """Clean-up holds back " n" (it may become " n't"); the stop string "say n" completes
    only when close() releases it, and is still found and trimmed."""
    tok, _ = cleanup_pair
    row = RowText(tok, ["say n"])
    for tid in tok.encode("I say n", add_special_tokens=False):
        assert not row.push(tid)
    assert "say n" not in row.text
    assert row.close() == "I "
    assert row.stopped and row.take() == "I "


def test_without_stop_strings_text_is_decoded_when_read(pair, monkeypatch):
    """Nothing in the loop needs a row's text as it grows when no stop string can end it,
    so push() only notes the token and reading decodes what is pending (it saved cold
    code after every forward). The text is the one decoding as it came gives: the same as
    a row whose stop string never matches, which decodes at every push."""
    from ortgen.text.detokenizer import IncrementalDetokenizer

    tok, _ = pair
    ids = tok.encode("The fox jumps 🙂 over 東京, twice.\n\nThe end", add_special_tokens=False)
    decoded: list[int] = []
    push = IncrementalDetokenizer.push

    def counted(self, token):  # type: ignore[no-untyped-def]
        decoded.append(token)
        return push(self, token)

    monkeypatch.setattr(IncrementalDetokenizer, "push", counted)
    lazy, eager = RowText(tok), RowText(tok, ["never-in-this-text"])
    half = len(ids) // 2
    for tid in ids[:half]:
        assert not lazy.push(tid)
    assert decoded == []  # pushed, not decoded
    shown = lazy.take()  # read: decoded once, in order
    assert decoded == ids[:half]
    assert tok.decode(ids[:half]).startswith(shown)  # a partial character may be held back
    for tid in ids[half:]:
        lazy.push(tid)
    for tid in ids:
        eager.push(tid)
    lazy.close()
    shown += lazy.take()
    assert shown == lazy.text == eager.close() == tok.decode(ids)
    assert len(lazy) == len(eager)
