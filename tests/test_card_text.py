"""Model cards show every field as written: raw HTML or Markdown in a field (a method name, a title, a paper, a
quantization row) cannot hide the rest of the rendered card or turn into a link. The cards are rendered as the
Hub renders Markdown (CommonMark with raw HTML, :mod:`markdown_it`)."""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from hf_unlearn.hub import build_model_card


def _html(card) -> str:
    return MarkdownIt("commonmark").render(str(card).split("\n---\n", 1)[1])


def _visible(html: str) -> str:
    """The text a reader sees: tags and comments removed, entities kept as written."""
    return re.sub(r"<!--.*?(-->|$)|<[^>]*>", "", html, flags=re.S)


@pytest.mark.parametrize("kind", ["unlearned_model", "grom_adapter"])
def test_raw_html_in_a_method_name_does_not_hide_the_rest_of_the_card(kind):
    method = "npo <!--" if kind == "unlearned_model" else None
    card = build_model_card(kind, "org/base", method, forget_split="forget10", title="Title <!-- hidden",
                            paper={"title": "[click](https://evil.example) <b>bold</b>", "id": "2401.00001"},
                            quantization={"note <script>x</script>": "a | b <!--"})
    html = _html(card)
    assert "<!--" not in html and "<script>" not in html and "<b>" not in html
    assert 'href="https://evil.example"' not in html
    visible = _visible(html)
    assert "Title &lt;!-- hidden" in visible and "[click](https://evil.example) &lt;b&gt;bold&lt;/b&gt;" in visible
    assert "Evaluation (TOFU, forget split forget10)" in visible  # the sections after the title are shown
    assert "note &lt;script&gt;x&lt;/script&gt;" in visible and "a | b &lt;!--" in visible
    if method:
        assert "npo &lt;!--" in visible
