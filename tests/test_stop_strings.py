"""StopStringMatcher: finding stop strings, and what streaming may show before one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgen.errors import InputError
from ortgen.text.stop_strings import StopStringMatcher


def test_stop_find():
    m = StopStringMatcher(["###", "\nUser:", "END"])
    assert m.find("hello") is None
    assert m.find("hello ### END") == 6
    assert m.find("END then ###") == 0
    assert m.find("a\nUser: b") == 1
    assert m.find("") is None
    assert m.max_length == 6 and bool(m)
    assert m.match("x ##### y") == (2, "###")
    assert m.match("nothing") is None


def test_stop_find_start_reaches_back():
    m = StopStringMatcher(["###"])
    text = "abc##"
    assert m.find(text) is None
    text += "#tail"
    assert m.find(text, start=5) == 3  # spans the boundary of the earlier search
    assert m.find("###abcdef", start=8) is None  # ends before start - max_length + 1


def test_stop_overlapping_and_same_start():
    m = StopStringMatcher(["ab", "abc", "bcd"])
    assert m.find("xabcd") == 1
    assert m.match("xabcd") == (1, "abc")
    assert m.find("xbcd") == 1


def test_stop_safe_length():
    m = StopStringMatcher(["###", "<|end|>"])
    assert m.safe_length("Hello") == 5
    assert m.safe_length("Hello #") == 6
    assert m.safe_length("Hello ##") == 6
    assert m.safe_length("Hello <|en") == 6
    assert m.safe_length("Hello <|end|> more") == 6
    assert m.safe_length("Hello ### more") == 6
    assert m.safe_length("") == 0
    assert m.safe_length("#") == 0
    assert StopStringMatcher([]).safe_length("abc") == 3
    assert StopStringMatcher([]).find("abc") is None


@given(
    stops=st.lists(st.text(alphabet="ab#", min_size=1, max_size=4), min_size=1, max_size=3),
    chunks=st.lists(st.text(alphabet="ab#c", max_size=3), max_size=20),
)
@settings(deadline=None, max_examples=500)
def test_stop_streaming_never_shows_stop_prefix(stops: list[str], chunks: list[str]):
    """Streaming with safe_length shows exactly the text before the first stop string."""
    m = StopStringMatcher(stops)
    text, shown = "", ""
    stopped = False
    for chunk in chunks:
        text += chunk
        safe = m.safe_length(text)
        assert safe >= len(shown)  # never retracts
        assert text.startswith(shown)
        shown = text[:safe]
        if m.find(text) is not None:
            stopped = True
            break
    full_stop = m.find(text)
    if stopped:
        assert shown == text[:full_stop]
    else:
        # What is held back is a prefix of some stop string, and nothing more.
        held = text[len(shown) :]
        assert all(not text.endswith(s) for s in stops)
        assert held == "" or any(s.startswith(held) and s != held for s in stops)


@pytest.mark.parametrize(
    ("stops", "pattern"),
    [
        (["ok", ""], "stop string 1 is empty"),
        ("###", "single string"),
        (["ok", 3], "item 1 is a int"),
        (5, "must be a list"),
    ],
)
def test_stop_errors(stops, pattern):
    with pytest.raises(InputError, match=pattern):
        StopStringMatcher(stops)
