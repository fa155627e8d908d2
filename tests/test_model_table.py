"""``[model]`` in a config file: a catalog name, or a Hugging Face config
taken from the config file's folder."""

from __future__ import annotations

import json

import pytest

from simspec import config, costs
from simspec.costs.hfconfig import read_model_config
from simspec.types import InputError

# meta-llama/Llama-3.2-1B's config.json (the fields the cost model reads).
LLAMA_32_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "max_position_embeddings": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def _scenario(tmp_path, model_table: str):
    (tmp_path / "models" / "llama-1b").mkdir(parents=True)
    (tmp_path / "models" / "llama-1b" / "config.json").write_text(json.dumps(LLAMA_32_1B))
    path = tmp_path / "scenario.toml"
    path.write_text(f"[model]\n{model_table}\n")
    return path


def test_a_relative_config_is_taken_from_the_files_folder(tmp_path, monkeypatch):
    path = _scenario(tmp_path, 'config = "models/llama-1b"')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not where the file is
    built = config.build(config.load(path))
    assert built.model == str(tmp_path / "models" / "llama-1b")
    assert costs.model_spec(built.model) == read_model_config(tmp_path / "models" / "llama-1b" / "config.json")
    assert costs.model_spec(built.model).tied_embeddings


def test_a_name_is_the_catalogs_model(tmp_path):
    built = config.build(config.load(_scenario(tmp_path, 'name = "Qwen3-8B"')))
    assert built.model == "Qwen3-8B"


@pytest.mark.parametrize("table", ['config = "a"\nname = "b"', 'path = "x"', "config = 3", 'name = ""'])
def test_a_bad_model_table_is_one_line(tmp_path, table):
    with pytest.raises(InputError, match=r"\[model\] takes one of name"):
        config.load(_scenario(tmp_path, table))
