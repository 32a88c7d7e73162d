"""rpa.BatchMLAAttention and torch.ops.rpa.concat_and_cache_mla / cache_mla.

Checked against a NumPy float64 reference of the unabsorbed MLA (per-head
keys and values from the latents through W_UK and W_UV), so the absorbed
form rpa computes is checked as the identity engines rely on; then the
vLLM forms (combined cache sliced, fp8 with a scale written by
concat_and_cache_mla), the LSE, and the messages.
"""

import math
import re

import numpy as np
import pytest

import rpa

torch = pytest.importorskip("torch")

CKV, KPE = 512, 64


def _batch(rng, seqs, page_size, heads):
  """FlashInfer's page table over shuffled pages, and per-token latents."""
  qo, kv_indptr, kv_indices, lens = [0], [0], [], []
  pages_needed = sum(-(-kv // page_size) for _, kv in seqs)
  order = rng.permutation(pages_needed + 3).astype(np.int32)
  used = 0
  for q_len, kv_len in seqs:
    qo.append(qo[-1] + q_len)
    n = -(-kv_len // page_size)
    kv_indices.extend(order[used:used + n])
    used += n
    kv_indptr.append(used)
    lens.append(kv_len)
  table = [np.array(a, np.int32) for a in (qo, kv_indptr, kv_indices, lens)]
  return table, pages_needed + 3


def _reference(q_nope, q_pe, ckv, kpe, table, page_size, causal, sm_scale, scale=1.0):
  """float64 absorbed MLA from latents read through the page table."""
  qo, kv_indptr, kv_indices, lens = table
  tokens, heads, _ = q_nope.shape
  out = np.zeros((tokens, heads, ckv.shape[-1]))
  lse = np.full((tokens, heads), -np.inf)
  for i in range(len(lens)):
    q_len, kv_len = qo[i + 1] - qo[i], lens[i]
    slots = [(kv_indices[kv_indptr[i] + t // page_size], t % page_size) for t in range(kv_len)]
    c = np.array([ckv[p, s] for p, s in slots], np.float64).reshape(kv_len, -1) * scale
    k = np.array([kpe[p, s] for p, s in slots], np.float64).reshape(kv_len, -1) * scale
    for j in range(q_len):
      visible = kv_len - q_len + j + 1 if causal else kv_len
      row = qo[i] + j
      logits = (q_nope[row] @ c[:visible].T + q_pe[row] @ k[:visible].T) * sm_scale
      if visible == 0:
        continue
      m = logits.max(axis=1, keepdims=True)
      w = np.exp(logits - m)
      lse[row] = (m + np.log(w.sum(axis=1, keepdims=True)))[:, 0]
      out[row] = (w / w.sum(axis=1, keepdims=True)) @ c[:visible]
  return out, lse


def _plan(w, table, heads, page_size, num_pages, causal, q_dtype, kv_dtype=None,
          sm_scale=(CKV + KPE) ** -0.5):
  w.plan(*table, heads, CKV, KPE, page_size, causal, sm_scale, q_dtype, kv_dtype,
         num_pages=num_pages)
  return sm_scale


def test_absorbed_form_equals_unabsorbed_attention():
  rng = np.random.default_rng(0)
  heads, page_size, nope_dim = 4, 16, 32
  table, num_pages = _batch(rng, [(1, 70), (3, 40)], page_size, heads)
  tokens = int(table[0][-1])
  ckv = rng.standard_normal((num_pages, page_size, CKV)).astype(np.float32)
  kpe = rng.standard_normal((num_pages, page_size, KPE)).astype(np.float32)
  w_uk = rng.standard_normal((heads, nope_dim, CKV)) / math.sqrt(CKV)
  w_uv = rng.standard_normal((heads, nope_dim, CKV)) / math.sqrt(CKV)
  q = rng.standard_normal((tokens, heads, nope_dim))
  q_pe = rng.standard_normal((tokens, heads, KPE)).astype(np.float32)
  sm_scale = (nope_dim + KPE) ** -0.5
  # Unabsorbed: per-head keys W_UK ckv and values W_UV ckv.
  qo, kv_indptr, kv_indices, lens = table
  want = np.zeros((tokens, heads, nope_dim))
  for i in range(len(lens)):
    rows = [(kv_indices[kv_indptr[i] + t // page_size], t % page_size) for t in range(lens[i])]
    c = np.array([ckv[p, s] for p, s in rows], np.float64)
    r = np.array([kpe[p, s] for p, s in rows], np.float64)
    q_len = qo[i + 1] - qo[i]
    for j in range(q_len):
      t = qo[i] + j
      visible = lens[i] - q_len + j + 1
      for h in range(heads):
        k_nope = c[:visible] @ w_uk[h].T
        v = c[:visible] @ w_uv[h].T
        logits = (k_nope @ q[t, h] + r[:visible] @ q_pe[t, h]) * sm_scale
        p = np.exp(logits - logits.max())
        want[t, h] = (p / p.sum()) @ v
  # Absorbed: q_nope = W_UK^T q, out through W_UV.
  q_nope = np.einsum("thd,hdc->thc", q, w_uk).astype(np.float32)
  w = rpa.BatchMLAAttention(num_threads=2)
  _plan(w, table, heads, page_size, num_pages, True, "float32", sm_scale=sm_scale)
  latent = w.run(q_nope, q_pe, ckv, kpe)
  got = np.einsum("thc,hdc->thd", latent.astype(np.float64), w_uv)
  np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("heads,causal", [(16, True), (128, False), (3, True)])
def test_vllm_combined_cache_bf16_with_lse(heads, causal):
  rng = np.random.default_rng(heads)
  page_size = 64
  table, num_pages = _batch(rng, [(1, 300), (2, 129), (1, 64)], page_size, heads)
  tokens = int(table[0][-1])
  kv_cache = torch.from_numpy(rng.standard_normal((num_pages, page_size, CKV + KPE),
                                                  np.float32)).bfloat16()
  q_nope = torch.from_numpy(rng.standard_normal((tokens, heads, CKV), np.float32)).bfloat16()
  q_pe = torch.from_numpy(rng.standard_normal((tokens, heads, KPE), np.float32)).bfloat16()
  w = rpa.BatchMLAAttention()
  sm_scale = _plan(w, table, heads, page_size, num_pages, causal, torch.bfloat16)
  ckv, kpe = kv_cache[..., :CKV], kv_cache[..., CKV:]  # Views: no copy.
  out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
  want, want_lse = _reference(q_nope.float().numpy(), q_pe.float().numpy(), ckv.float().numpy(),
                              kpe.float().numpy(), table, page_size, causal, sm_scale)
  assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
  np.testing.assert_allclose(out.float().numpy(), want, atol=1e-2 + 2 ** -7 * np.abs(want).max())
  np.testing.assert_allclose(lse.numpy(), want_lse, atol=1e-3)
  assert w.info["kernels"].startswith("mla_")
  # Into given out and lse arrays.
  out2, lse2 = torch.empty_like(out), torch.empty_like(lse)
  assert w.run(q_nope, q_pe, ckv, kpe, out=out2, lse=lse2) is out2
  assert torch.equal(out2, out) and torch.equal(lse2, lse)


def test_fp8_cache_written_by_concat_and_cache_mla():
  rng = np.random.default_rng(5)
  heads, page_size = 16, 16
  table, num_pages = _batch(rng, [(1, 50), (1, 33)], page_size, heads)
  qo, kv_indptr, kv_indices, lens = table
  kv_cache = torch.zeros((num_pages, page_size, CKV + KPE), dtype=torch.uint8)
  scale = torch.tensor([0.5])
  slots = []
  for i, n in enumerate(lens):
    slots += [int(kv_indices[kv_indptr[i] + t // page_size]) * page_size + t % page_size
              for t in range(n)]
  kv_c = torch.randn(len(slots), CKV)
  k_pe = torch.randn(len(slots), KPE)
  torch.ops.rpa.concat_and_cache_mla(kv_c, k_pe, kv_cache, torch.tensor(slots), "fp8", scale)
  codes = kv_cache.numpy()
  values = rpa.dequantize(codes, "float8_e4m3fn")  # The stored values, unscaled.
  tokens = int(qo[-1])
  q_nope = torch.randn(tokens, heads, CKV).bfloat16()
  q_pe = torch.randn(tokens, heads, KPE).bfloat16()
  w = rpa.BatchMLAAttention()
  sm_scale = _plan(w, table, heads, page_size, num_pages, True, "bfloat16", "float8_e4m3fn")
  fp8 = kv_cache.view(torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else kv_cache
  out = w.run(q_nope, q_pe, fp8[..., :CKV], fp8[..., CKV:], kv_scale=0.5)
  want, _ = _reference(q_nope.float().numpy(), q_pe.float().numpy(), values[..., :CKV],
                       values[..., CKV:], table, page_size, True, sm_scale, scale=0.5)
  np.testing.assert_allclose(out.float().numpy(), want, atol=5e-2 + 2 ** -7 * np.abs(want).max())


def test_cache_mla_two_caches_equal_the_combined_form():
  kv_c, k_pe = torch.randn(5, CKV).bfloat16(), torch.randn(5, KPE).bfloat16()
  slots = torch.tensor([3, -1, 0, 9, 4])
  combined = torch.zeros(3, 4, CKV + KPE, dtype=torch.bfloat16)
  torch.ops.rpa.concat_and_cache_mla(kv_c, k_pe, combined, slots)
  ckv = torch.zeros(3, 4, CKV, dtype=torch.bfloat16)
  kpe = torch.zeros(3, 4, KPE, dtype=torch.bfloat16)
  torch.ops.rpa.cache_mla(kv_c, k_pe, ckv, kpe, slots, "auto", None)
  assert torch.equal(combined[..., :CKV], ckv) and torch.equal(combined[..., CKV:], kpe)
  assert torch.equal(ckv[0, 3], kv_c[0]) and torch.equal(kpe[2, 1], k_pe[3])
  assert torch.count_nonzero(ckv.view(-1, CKV).abs().sum(1)) == 4  # Slot -1 skipped.


@pytest.mark.parametrize("edit,kind,message", [
    (lambda a: a.update(slots=torch.tensor([0, 12, 1])), "page_index",
     "slot_mapping[1]=12 must be -1 or in range [0, 12)"),
    (lambda a: a.update(slots=torch.tensor([5, 1, 5])), "metadata",
     "slot_mapping[2]=5 is also slot_mapping[0]"),
    (lambda a: a.update(k_pe=torch.randn(3, 32).bfloat16()), "shape",
     "kv_cache.shape=(3, 4, 576) must be (num_blocks, block_size, 544)"),
    (lambda a: a.update(dtype="fp8"), "dtype",
     "kv_cache.dtype=torch.bfloat16 cannot hold kv_cache_dtype='fp8' codes"),
    (lambda a: a.update(dtype="int4"), "option", "kv_cache_dtype='int4' must be one of"),
    (lambda a: a.update(slots=torch.tensor([0.0, 1.0, 2.0])), "dtype",
     "slot_mapping.dtype=torch.float32 is not supported"),
])
def test_concat_and_cache_mla_errors_write_nothing(edit, kind, message):
  args = dict(kv_c=torch.randn(3, CKV).bfloat16(), k_pe=torch.randn(3, KPE).bfloat16(),
              slots=torch.tensor([0, 1, 2]), dtype="auto")
  edit(args)
  cache = torch.zeros(3, 4, CKV + KPE, dtype=torch.bfloat16)
  with pytest.raises(rpa.Error, match=re.escape(message)) as e:
    torch.ops.rpa.concat_and_cache_mla(args["kv_c"], args["k_pe"], cache, args["slots"],
                                       args["dtype"], None)
  assert e.value.kind == kind
  assert torch.count_nonzero(cache) == 0


def test_messages_come_from_the_library():
  rng = np.random.default_rng(1)
  table, num_pages = _batch(rng, [(1, 10)], 4, 2)
  w = rpa.BatchMLAAttention()
  with pytest.raises(rpa.Error, match=r"num_heads=0 must be in \[1, 128\]") as e:
    w.plan(*table, 0, CKV, KPE, 4, True, 1.0, "bfloat16", num_pages=num_pages)
  assert e.value.kind == "shape"
  _plan(w, table, 2, 4, num_pages, True, "bfloat16")
  q_nope = torch.zeros(1, 2, CKV, dtype=torch.bfloat16)
  q_pe = torch.zeros(1, 2, KPE, dtype=torch.bfloat16)
  ckv = torch.zeros(num_pages, 4, CKV, dtype=torch.float16)
  kpe = torch.zeros(num_pages, 4, KPE, dtype=torch.float16)
  out = torch.full((1, 2, CKV), 3.0, dtype=torch.bfloat16)
  with pytest.raises(rpa.Error, match="ckv_cache.dtype=dtype\\('float16'\\) must be the planned"):
    w.run(q_nope, q_pe, ckv, kpe, out=out)
  assert torch.all(out == 3.0)
  with pytest.raises(rpa.Error, match=re.escape("q_nope.dtype=torch.int16 is not supported; "
                                                "q_nope must be one of float32, bfloat16")):
    w.run(q_nope.to(torch.int16), q_pe, ckv.bfloat16(), kpe.bfloat16())
