"""The bundled prompt suite and user prompt files."""

from __future__ import annotations

import json

import pytest

from bonsai_launch.bench import prompts as suite
from bonsai_launch.core.errors import BonsaiError


def test_bundled_suite_has_five_categories_of_varied_prompts():
    prompts = suite.load_prompts()
    cats = suite.categories_of(prompts)
    assert cats == list(suite.BUNDLED_CATEGORIES)
    for cat in cats:
        texts = [p.chat_messages()[-1]["content"] for p in prompts if p.category == cat]
        assert len(texts) >= 5, cat
        assert len(set(texts)) == len(texts), f"{cat}: a prompt is repeated"
    assert len({p.id for p in prompts}) == len(prompts)


def test_every_prompt_works_for_chat_and_completion_models():
    for p in suite.load_prompts():
        assert p.chat_messages()[0]["role"] == "user"
        assert p.completion_text().strip()


def test_conversations_have_four_turns():
    convs = suite.load_conversations()
    assert convs and all(len(c.turns) >= 4 for c in convs)


def test_select_keeps_file_order_and_caps_per_category():
    prompts = suite.load_prompts()
    chosen = suite.select(prompts, ["code-edit", "chat"], 2)
    assert [p.category for p in chosen] == ["code-edit", "code-edit", "chat", "chat"]
    assert chosen[0].id == next(p.id for p in prompts if p.category == "code-edit")
    with pytest.raises(BonsaiError, match="unknown category nope"):
        suite.select(prompts, ["nope"])


def test_user_file_with_prompt_and_messages_forms(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "category": "sql", "prompt": "SELECT 1?"}),
                "",
                json.dumps(
                    {
                        "id": "b",
                        "category": "sql",
                        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                    }
                ),
            ]
        )
    )
    prompts = suite.load_prompts(f)
    assert [p.id for p in prompts] == ["a", "b"]
    assert prompts[0].chat_messages() == [{"role": "user", "content": "SELECT 1?"}]
    assert prompts[1].completion_text().endswith("Assistant:")


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "line 1 is not valid JSON"),
        (json.dumps({"prompt": "x"}), 'missing "category"'),
        (json.dumps({"category": "c"}), 'needs "prompt"'),
        (json.dumps({"category": "c", "messages": []}), "non-empty list"),
    ],
)
def test_bad_user_files_name_the_line(tmp_path, line, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(BonsaiError, match=message):
        suite.load_prompts(f)


def test_duplicate_ids_and_missing_files_are_refused(tmp_path):
    f = tmp_path / "dup.jsonl"
    f.write_text(
        json.dumps({"id": "x", "category": "c", "prompt": "a"})
        + "\n"
        + json.dumps({"id": "x", "category": "c", "prompt": "b"})
        + "\n"
    )
    with pytest.raises(BonsaiError, match="used twice"):
        suite.load_prompts(f)
    with pytest.raises(BonsaiError, match="cannot read prompts file"):
        suite.load_prompts(tmp_path / "missing.jsonl")


def test_a_chat_prompt_goes_through_the_chat_template_and_only_a_raw_one_does_not():
    """A `messages` line is a chat (the server applies the model's template); only a `raw` line,
    as the sample records them, is sent as it is. The two were once confused: every chat prompt of
    the bench and tune suites went to /v1/completions as bare text (issue 47)."""
    from bonsai_launch.bench.prompts import _parse_prompt

    chat = _parse_prompt({"id": "c", "category": "x", "messages": [{"role": "user", "content": "hi"}]}, "f line 1")
    assert chat.raw is False and chat.messages == (("user", "hi"),)
    assert _parse_prompt({"id": "p", "category": "x", "prompt": "hi"}, "f line 2").raw is False
    assert _parse_prompt({"id": "r", "category": "x", "raw": "<bos>hi"}, "f line 3").raw is True
