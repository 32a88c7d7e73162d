"""The block-size chooser through JAX's get_tuned_block_sizes."""

import json

import numpy as np
import pytest

import rpa


@pytest.mark.parametrize("page_size", [1, 3, 16, 128, 256])
@pytest.mark.parametrize("pages_per_seq", [1, 2, 7, 64, 4096])
def test_choice_is_within_one_and_pages_per_seq(page_size, pages_per_seq):
  pages, queries = rpa.get_tuned_block_sizes(np.float32, np.float32, 32, 8, 128, page_size, 512,
                                             pages_per_seq)
  assert 1 <= pages <= pages_per_seq
  assert queries >= 1


def test_dtype_spellings_agree():
  by_name = rpa.get_tuned_block_sizes("bfloat16", "bfloat16", 32, 8, 128, 16, 64, 256)
  torch = pytest.importorskip("torch")
  assert rpa.get_tuned_block_sizes(torch.bfloat16, torch.bfloat16, 32, 8, 128, 16, 64, 256) == by_name
  assert rpa.get_tuned_block_sizes(np.dtype("float16"), "f16", 32, 8, 128, 16, 64, 256) == \
      rpa.get_tuned_block_sizes("float16", "float16", 32, 8, 128, 16, 64, 256)


def test_unknown_dtype_is_a_value_error():
  with pytest.raises(ValueError, match="dtype 'complex64' is not one rpa knows"):
    rpa.get_tuned_block_sizes("complex64", "bfloat16", 32, 8, 128, 16, 64, 256)


def test_user_table_is_used_and_explained(tmp_path):
  table = {
      "format": "rpa-tuned-block-sizes", "version": 1, "cpu": "test",
      "entries": [{"q_dtype": "float32", "kv_dtype": "float32", "num_q_heads": 4,
                   "num_kv_heads": 2, "head_dim": 64, "page_size": 16,
                   "max_num_batched_tokens": 64, "max_model_len": 1024,
                   "num_kv_pages_per_block": 3, "num_queries_per_block": 24}]}
  path = tmp_path / "table.json"
  path.write_text(json.dumps(table))
  try:
    assert rpa.load_tuned_block_sizes(str(path))
    assert rpa.get_tuned_block_sizes(np.float32, np.float32, 4, 2, 64, 16, 64, 64) == (3, 24)
    why = rpa.explain_block_sizes(np.float32, np.float32, 4, 2, 64, 16, 64, 64)
    assert why["source"] == "table" and "table.json" in why["explanation"]
    assert why["section"].startswith('section "test"') and why["section"] in why["explanation"]
    assert "table.json" in why["section"]
  finally:
    rpa.load_tuned_block_sizes("")


def test_unparsable_table_is_ignored(tmp_path, capfd):
  path = tmp_path / "broken.json"
  path.write_text("{not json")
  assert not rpa.load_tuned_block_sizes(str(path))
  assert "broken.json" in capfd.readouterr().err


def test_heuristic_names_no_section():
  # A head configuration no shipped section holds: the cache heuristic answers.
  why = rpa.explain_block_sizes(np.float32, np.float32, 12, 3, 80, 16, 512, 256)
  assert why["source"] == "heuristic", why
  assert why["section"] is None
