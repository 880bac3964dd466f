"""clean_up_tokenization equals transformers', whole and streamed."""

from __future__ import annotations

import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgen.text.clean_up import StreamingCleanUp, clean_up_tokenization


@given(st.text(max_size=60))
@settings(deadline=None, max_examples=200)
def test_clean_up_equals_transformers(text: str):
    base = transformers.PreTrainedTokenizerBase
    assert clean_up_tokenization(text) == base.clean_up_tokenization(text)


@given(
    st.lists(st.text(alphabet=st.sampled_from(list(" .?!,'ntmsvrex ")), max_size=6), max_size=30)
)
@settings(deadline=None, max_examples=500)
def test_streaming_clean_up_equals_clean_up(chunks: list[str]):
    cleaner = StreamingCleanUp()
    out = "".join(cleaner.feed(c) for c in chunks) + cleaner.flush()
    assert out == clean_up_tokenization("".join(chunks))
