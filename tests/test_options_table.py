"""The one table of options: the README and docs/options.md say what it says, and stored
options are validated again when a worker rebuilds them."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import vllm_config

from vllm_cllm.errors import ConfigError
from vllm_cllm.options import (
    OPTIONS,
    README_END,
    README_START,
    options_from_vllm_config,
    render_options_doc,
    render_readme_section,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_and_the_options_doc_equal_the_table():
    """``vllm-cllm options --write`` rewrites both after a change to the table."""
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(README_START), readme.index(README_END) + len(README_END)
    assert readme[start:end] == render_readme_section()
    assert (ROOT / "docs/options.md").read_text() == render_options_doc()


def test_every_option_has_one_line_per_method_it_applies_to():
    section = render_readme_section()
    for option in OPTIONS:
        assert section.count(f"| `{option.name}` |") == len(option.methods), option.name


@pytest.mark.parametrize("change, words", [
    ({"knee_tokens": 0}, ["knee_tokens", "[1,"]),
    ({"fill": "magic"}, ["fill", "hybrid"]),
    ({"adaptive": "yes"}, ["adaptive", "true or false"]),
    ({"extra": 1}, ["stored options", "unknown ['extra']"]),
    ({"method": "draft"}, ["unknown method"]),
])
def test_stored_options_are_validated_when_rebuilt(change, words):
    config = vllm_config({"method": "jacobi", "num_speculative_tokens": 4})
    config.additional_config["vllm_cllm"].update(change)
    with pytest.raises(ConfigError) as err:
        options_from_vllm_config(config, "jacobi")
    for word in words:
        assert word in str(err.value)


def test_stored_options_must_match_the_slots_vllm_runs():
    config = vllm_config({"method": "jacobi", "num_speculative_tokens": 4})
    assert options_from_vllm_config(config, "jacobi").num_speculative_tokens == 4
    config.speculative_config.num_speculative_tokens = 6
    with pytest.raises(ConfigError, match="draft slots"):
        options_from_vllm_config(config, "jacobi")
