"""Chat templates at conversion: read as transformers reads them, stored in the model directory
(manifest: file, sha256, source), rendered by the service's renderer to the same ids as
transformers' `apply_chat_template(tokenize=True)`, and `--chat-template FILE` for a base model.

The checkpoints (tests/export/convert/chat_checkpoints.py) carry real-world templates: Qwen2.5's
ChatML with tools, Llama 3.1's (it writes the BOS its tokenizer also adds: no double BOS),
Mistral-Nemo's `[INST]` (a named list in tokenizer_config.json) and Qwen3's `<think>`.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from export.convert import ConversionError, Options, convert
from export.convert import chat_template as conversion
from export.convert.cli import main as convert_main
from service.generation import chat_template
from service.manifest import ModelDirError, load_model_dir, sha256_file
from tests.export.convert.chat_checkpoints import template

pytestmark = pytest.mark.timeout(900)  # the first run converts the chat checkpoints (cached after)
CHATS = ["qwen2.5", "llama3.1", "mistral", "qwen3"]
MORE = [  # beyond the conversion's own set: (messages, tools, render options)
    ([{"role": "user", "content": "Ünïcödé? 東京 🙂"}, {"role": "assistant", "content": "Oui."}], None, {}),
    ([{"role": "user", "content": "Think first."}], None, {"kwargs": {"enable_thinking": False}}),
    (
        [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi th"}],
        None,
        {"add_generation_prompt": False, "continue_final_message": True},
    ),
    (
        [
            {"role": "system", "content": "Use tools."},
            *copy.deepcopy(conversion.CONVERSATIONS[3][1]),
            {"role": "assistant", "content": "It is 21 degrees."},
            {"role": "user", "content": "Thanks!"},
        ],
        [conversion.WEATHER],
        {},
    ),
]


def test_the_checkpoints_template_is_stored_with_its_hash_and_source(chat_models_root):
    for name in CHATS:
        model_dir = load_model_dir(chat_models_root / name)
        entry = model_dir.manifest.chat_template
        assert entry["checked"] == {"conversations": 4, "same_ids": 4, "refused_by_template": 0}
        for spec in entry["templates"].values():
            assert spec["sha256"] == sha256_file(model_dir.file(spec["file"]))
        loaded = chat_template.from_model_dir(model_dir)
        expected = template("mistral-nemo" if name == "mistral" else name.replace("3.1", "-3.1"))
        assert loaded.templates["default"] == expected
    mistral = load_model_dir(chat_models_root / "mistral").manifest.chat_template
    assert mistral["source"] == "tokenizer_config.json" and set(mistral["templates"]) == {"default", "tool_use"}
    assert load_model_dir(chat_models_root / "qwen2.5").manifest.chat_template["source"] == "chat_template.jinja"
    assert load_model_dir(chat_models_root / "base").manifest.chat_template is None


def test_a_modified_template_file_is_refused_at_load(chat_models_root, tmp_path):
    copy = tmp_path / "qwen2.5"
    shutil.copytree(chat_models_root / "qwen2.5", copy)
    (copy / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    with pytest.raises(ModelDirError, match=r"chat_template\.jinja: sha256 mismatch"):
        load_model_dir(copy)


@pytest.mark.parametrize("name", CHATS)
def test_rendered_prompts_tokenize_as_apply_chat_template(name, chat_models_root):
    model_dir = load_model_dir(chat_models_root / name)
    ours = chat_template.from_model_dir(model_dir)
    tokenizer = Tokenizer.from_file(str(model_dir.file("tokenizer.json")))
    reference = AutoTokenizer.from_pretrained(chat_models_root / "hf" / name)
    for messages, tools, options in MORE:
        kwargs = options.get("kwargs", {})
        generation_prompt = options.get("add_generation_prompt", True)
        expected = reference.apply_chat_template(
            copy.deepcopy(messages),
            tools=tools,
            add_generation_prompt=generation_prompt,
            continue_final_message=options.get("continue_final_message", False),
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        text = ours.render(copy.deepcopy(messages), tools=tools, **options)
        assert tokenizer.encode(text, add_special_tokens=False).ids == list(expected), (name, messages)
    if name == "llama3.1":  # the template writes <s>; the tokenizer would add one more with its specials
        ids = tokenizer.encode(ours.render([{"role": "user", "content": "Hi"}]), add_special_tokens=False).ids
        assert ids[0] == 1 and ids[1] != 1 and ids.count(1) == 1


def test_a_template_that_raises_is_invalid_argument_with_its_message(chat_models_root):
    mistral = chat_template.from_model_dir(load_model_dir(chat_models_root / "mistral"))
    with pytest.raises(chat_template.InvalidArgument, match="roles must alternate"):
        mistral.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_chat_template_flag_gives_a_base_model_one(chat_models_root, tmp_path):
    file = tmp_path / "chatml.jinja"
    file.write_text(template("qwen2.5"), encoding="utf-8")
    base = chat_models_root / "hf" / "base"
    code = convert_main(
        ["convert", str(base), "--out", str(tmp_path), "--name", "chatml", "--chat-template", str(file)]
    )
    assert code == 0
    entry = load_model_dir(tmp_path / "chatml").manifest.chat_template
    assert entry["source"] == str(file) and entry["checked"]["same_ids"] == 4
    assert (tmp_path / "chatml" / "chat_template.jinja").read_text(encoding="utf-8") == template("qwen2.5")
    with pytest.raises(ConversionError, match="unreadable"):
        convert(base, tmp_path / "none", options=Options(chat_template=tmp_path / "missing.jinja"))
    assert not (tmp_path / "none").exists()


def test_the_manifest_entry_is_checked(chat_models_root, tmp_path):
    copy = tmp_path / "qwen3"
    shutil.copytree(chat_models_root / "qwen3", copy)
    manifest = json.loads((copy / "model.json").read_text())
    manifest["chat_template"]["templates"]["default"]["file"] = "../elsewhere.jinja"
    (copy / "model.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelDirError, match="plain file name"):
        load_model_dir(copy)
