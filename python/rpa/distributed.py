"""Attention past one machine: context parallelism and tensor parallelism
under torch.distributed (docs/distributed.md).

Context parallelism (vLLM's decode context parallel, the merge step of ring
attention): every rank of a process group holds the same queries and a slice
of every sequence's KV pages. Each rank attends over its own keys with the
log-sum-exp (`rpa.BatchAttention`, planned by a step's first layer and run
with `return_lse=True` by every layer), the ranks exchange their (out, lse)
partials over the group, and every rank merges them by log-sum-exp into the
attention over all keys:

    shards = split_pages(kv_lens, page_indices, cu_q_lens, num_seqs,
                         page_size=page_size, world_size=world_size)
    out = context_parallel_attention(q, kv_pages, shards[rank],
                                     sm_scale=head_dim ** -0.5)

Tensor parallelism needs no exchange inside attention: each rank attends
over its slice of the heads (`tensor_parallel_heads`,
`tensor_parallel_slice`) with the plain call.

The transport is torch.distributed (gloo on CPUs); every collective carries
the process group's timeout (`init_process_group(timeout=...)`), so a rank
that never arrives ends in an error, not a hang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import zlib

import numpy as np

from . import _api, _batch

__all__ = [
    "ContextShard",
    "split_pages",
    "context_parallel_attention",
    "exchange_bytes",
    "tensor_parallel_heads",
    "tensor_parallel_slice",
]

# The largest mask_value with which a key masked for a row has weight exactly 0
# in float32 (docs/contract.md §1.1, the rule that lets the kernel skip masked
# tiles): context parallelism drops such keys from a rank's call instead of
# masking them, which is the same only then.
_MAX_MASK_VALUE = -1e4


def _error(kind, message):
  return _api._error(kind, message)


# ---------------------------------------------------------------------------
# Splitting a batch's pages across ranks.


@dataclasses.dataclass(eq=False)
class ContextShard:
  """What one rank of a context-parallel group holds of a batch.

  The queries are the whole batch's on every rank (q rows and cu_q_lens are
  not split); the keys are split by whole pages. Local token t of sequence i
  on this rank lives in page `page_indices[i, t // page_size]`, slot
  `t % page_size`, and is the sequence's token
  `page_slots[i, t // page_size] * page_size + t % page_size`.

  Fields:
    rank, world_size: the rank this shard is for, of how many.
    page_size: tokens per page.
    kv_lens: int32[max_num_seqs], this rank's number of keys of each sequence
      (0 for a sequence none of whose pages it holds).
    page_indices: int32[max_num_seqs, local_pages_per_seq], this rank's pages
      of each sequence, in the sequence's order (ids in the rank's cache;
      split_pages keeps the ids of the page table it splits). Columns beyond
      cdiv(kv_lens[i], page_size) are 0 and never read.
    page_slots: int32[max_num_seqs, local_pages_per_seq], which page of the
      sequence each local page is (its first token // page_size), strictly
      increasing along a row; -1 beyond the rank's pages.
    seq_kv_lens: int32[max_num_seqs], the whole sequences' kv_lens (the
      queries' positions are seq_kv_lens[i] - q_len + j).
    cu_q_lens: int32[max_num_seqs + 1], num_seqs: int32[1]: the batch's, as
      given to the single-process call.
    layout: "interleaved" or "contiguous", as split (informational).
  """
  rank: int
  world_size: int
  page_size: int
  kv_lens: np.ndarray
  page_indices: np.ndarray
  page_slots: np.ndarray
  seq_kv_lens: np.ndarray
  cu_q_lens: np.ndarray
  num_seqs: np.ndarray
  layout: str = "interleaved"

  def __post_init__(self):
    # Per-step derived state, built by the first call and reused by every
    # layer of the step: the shard's checks, the rank's calls for a sliding
    # window (see _local_calls) and their plans (_rank_plans). A shard is
    # therefore read-only once used; the next step gets a new one from
    # split_pages.
    self._calls = {}


def _np_i32(x, name):
  if type(x).__module__.split(".")[0] == "torch":
    x = x.detach().cpu().numpy()
  a = np.asarray(x)
  if a.dtype != np.int32:
    raise _error("dtype", f"{name}.dtype={a.dtype!r} must be int32. Pass the int32 metadata "
                 "of the single-process call.")
  return a


def _cdiv(a, b):
  return -(-a // b)


def split_pages(kv_lens, page_indices, cu_q_lens, num_seqs, *, page_size: int, world_size: int,
                layout: str = "interleaved", pages_per_chunk: int = 1) -> list:
  """Splits a batch's KV pages across the ranks of a context-parallel group.

  Args:
    kv_lens, page_indices, cu_q_lens, num_seqs: the batch's metadata, as for
      `rpa.ragged_paged_attention` (int32, NumPy or torch).
    page_size: tokens per page of the cache.
    world_size: the number of ranks.
    layout: "interleaved": page k of a sequence goes to rank
      (k // pages_per_chunk) % world_size, vLLM's decode context parallel
      (whose interleave size is counted in tokens; here in pages); or
      "contiguous": a sequence's n pages in world_size consecutive blocks,
      rank r holding pages [r * n // world_size, (r + 1) * n // world_size)
      (ring attention's split).
    pages_per_chunk: for "interleaved", pages dealt to a rank at a time.

  Returns:
    A list of world_size ContextShard, one per rank, each with the metadata
    its rank needs. A rank that holds none of a sequence's pages gets
    kv_lens[i] = 0 for it: its partial is (0, -inf) and merges as nothing.

  Raises:
    ValueError (rpa.Error): metadata that does not describe a batch (wrong
      dtype or shape, num_seqs out of range, negative kv_lens, too few page
      columns), a bad layout, world_size or page_size.
  """
  kv_lens = _np_i32(kv_lens, "kv_lens")
  page_indices = _np_i32(page_indices, "page_indices")
  cu_q_lens = _np_i32(cu_q_lens, "cu_q_lens")
  num_seqs = _np_i32(num_seqs, "num_seqs")
  if layout not in ("interleaved", "contiguous"):
    raise _error("option", f"layout={layout!r} must be 'interleaved' or 'contiguous'.")
  for name, value in (("world_size", world_size), ("page_size", page_size),
                      ("pages_per_chunk", pages_per_chunk)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
      raise _error("option", f"{name}={value!r} must be a positive int.")
  if page_indices.ndim != 2:
    raise _error("shape", f"page_indices.shape={page_indices.shape} must have 2 dimensions "
                 "[max_num_seqs, pages_per_seq].")
  max_num_seqs, pages_per_seq = page_indices.shape
  if kv_lens.shape != (max_num_seqs,) or cu_q_lens.shape != (max_num_seqs + 1,) or \
      num_seqs.shape != (1,):
    raise _error("shape", f"kv_lens.shape={kv_lens.shape}, cu_q_lens.shape={cu_q_lens.shape} and "
                 f"num_seqs.shape={num_seqs.shape} must be ({max_num_seqs},), "
                 f"({max_num_seqs + 1},) and (1,) where max_num_seqs is page_indices.shape[0].")
  n = int(num_seqs[0])
  if not 0 <= n <= max_num_seqs:
    raise _error("metadata", f"num_seqs[0]={n} must be in range [0, {max_num_seqs}] "
                 "(max_num_seqs = page_indices.shape[0]).")
  num_pages = np.zeros(max_num_seqs, np.int64)
  for i in range(n):
    if kv_lens[i] < 0:
      raise _error("metadata", f"kv_lens[{i}]={int(kv_lens[i])} must be greater or equal to 0.")
    num_pages[i] = _cdiv(int(kv_lens[i]), page_size)
    if num_pages[i] > pages_per_seq:
      raise _error("metadata", f"pages_per_seq={pages_per_seq} must be greater or equal to "
                   f"min_pages_per_seq={int(num_pages[i])} given kv_lens[{i}]="
                   f"{int(kv_lens[i])} and page_size={page_size}.")

  owned = []  # owned[r][i]: the page slots of sequence i on rank r.
  for r in range(world_size):
    rows = []
    for i in range(max_num_seqs):
      k = np.arange(num_pages[i], dtype=np.int64)
      if layout == "interleaved":
        mine = k[(k // pages_per_chunk) % world_size == r]
      else:
        mine = k[(k >= r * num_pages[i] // world_size) &
                 (k < (r + 1) * num_pages[i] // world_size)]
      rows.append(mine)
    owned.append(rows)

  shards = []
  for r in range(world_size):
    width = max([len(s) for s in owned[r]] + [1])
    local_indices = np.zeros((max_num_seqs, width), np.int32)
    local_slots = np.full((max_num_seqs, width), -1, np.int32)
    local_lens = np.zeros(max_num_seqs, np.int32)
    for i, slots in enumerate(owned[r]):
      if len(slots) == 0:
        continue
      local_indices[i, :len(slots)] = page_indices[i, slots]
      local_slots[i, :len(slots)] = slots
      lengths = np.minimum(page_size, int(kv_lens[i]) - slots * page_size)
      local_lens[i] = int(lengths.sum())
    shards.append(ContextShard(
        rank=r, world_size=world_size, page_size=page_size, kv_lens=local_lens,
        page_indices=local_indices, page_slots=local_slots, seq_kv_lens=kv_lens.copy(),
        cu_q_lens=cu_q_lens.copy(), num_seqs=num_seqs.copy(), layout=layout))
  return shards


# ---------------------------------------------------------------------------
# One rank's keys as calls of the existing API.
#
# The single-process call lets query row j of sequence i (global position
# P = kv_len - q_len + j) see the keys t with P - w < t <= P. A rank holds a
# subset of the pages; laid end to end in the sequence's order they form the
# rank's local sequence, and because the order is kept, the keys a row sees
# are a contiguous local range [lo, hi): hi = the rank's keys with t <= P,
# lo = those with t <= P - w. The library computes, for a sequence with
# kv_len L' and q_len Q', row j' at local position p' = L' - Q' + j' over
# local keys (p' - w', p'] (w' the call's window). So each row becomes a row
# of a sub-sequence that starts at a local page boundary s <= lo and ends at
# hi (p' = hi - s - 1), with a window w' for which max(s, hi - w') = lo:
#   - no window: lo = 0, s = 0;
#   - lo on a page boundary: s = lo and the call's window w (hi - w <= lo
#     always, since the rank holds at most w of the window's keys);
#   - the rank holds all w keys of the row's window (hi - lo = w): any s,
#     window w;
#   - else (the window starts inside a page, and some of the window's keys
#     are on other ranks): window w' = hi - lo, in a separate call per
#     distinct w' (only rows whose window edge falls in a page of this rank
#     whose window is not wholly on it; a decode batch has at most one such
#     rank per sequence).
# Rows whose hi rises by one, with the same s and w', share one sub-sequence
# (a chunk's rows over the rank's own pages keep their causal staircase);
# rows with equal hi (the rows after the rank's last key: all of its keys are
# behind them) each become a decode sub-sequence. Exact, not approximate: each
# row sees exactly the keys it sees in the single-process call.


def _local_calls(shard: ContextShard, sliding_window):
  """[(window, rows, kv_lens, page_indices, cu_q_lens, num_seqs)]: the calls
  (page tables and windows, planned by _rank_plans) that compute this rank's
  partial; `rows` are the q rows each call's q holds, in order. Cached on
  the shard."""
  key = sliding_window
  cached = shard._calls.get(key)
  if cached is not None:
    return cached
  ps = shard.page_size
  w = sliding_window
  runs = {}  # window -> list of [s, last_hi, rows, seq]
  open_run = {}  # (window, seq) -> the run rows may still join
  n = int(shard.num_seqs[0])
  for i in range(n):
    q_start, q_end = int(shard.cu_q_lens[i]), int(shard.cu_q_lens[i + 1])
    q_len = q_end - q_start
    count = _cdiv(int(shard.kv_lens[i]), ps)
    if q_len <= 0 or count == 0:
      continue
    kv_len = int(shard.seq_kv_lens[i])
    slots = shard.page_slots[i, :count].astype(np.int64)
    starts = slots * ps  # Each local page's first global token.
    lengths = np.minimum(ps, kv_len - starts)
    before = np.concatenate([[0], np.cumsum(lengths)])  # Local index of each page's first key.
    positions = kv_len - q_len + np.arange(q_len, dtype=np.int64)

    def held_up_to(p):  # The rank's keys with global position <= p.
      u = np.searchsorted(starts, p, side="right")  # Pages starting at or before p.
      last = np.maximum(u - 1, 0)
      return np.where(u > 0, before[last] + np.minimum(p + 1 - starts[last], lengths[last]), 0)

    hi = held_up_to(positions)
    lo = held_up_to(positions - w) if w is not None else np.zeros_like(hi)
    for j in range(q_len):
      h, l = int(hi[j]), int(lo[j])
      if h <= l:
        continue  # The row sees none of this rank's keys.
      if w is None or l % ps == 0 or h - l == w:
        window = w
      else:
        window = h - l
      flexible = window is not None and h - window == l  # Any page-aligned s <= lo works.
      run = open_run.get((window, i))
      if run is not None and h == run[1] + 1 and (run[0] == l or (flexible and run[0] <= l)):
        run[1] = h
        run[2].append(q_start + j)
        continue
      run = [l if not flexible else (l // ps) * ps, h, [q_start + j], i]
      runs.setdefault(window, []).append(run)
      open_run[(window, i)] = run

  calls = []
  for window, seq_runs in runs.items():
    num = len(seq_runs)
    width = max(_cdiv(h, ps) - s // ps for s, h, _, _ in seq_runs)
    kv_lens = np.zeros(num, np.int32)
    page_indices = np.zeros((num, width), np.int32)
    cu_q_lens = np.zeros(num + 1, np.int32)
    rows = []
    for k, (s, h, run_rows, i) in enumerate(seq_runs):
      first, last = s // ps, _cdiv(h, ps)
      kv_lens[k] = h - s
      page_indices[k, :last - first] = shard.page_indices[i, first:last]
      cu_q_lens[k + 1] = cu_q_lens[k] + len(run_rows)
      rows.extend(run_rows)
    calls.append((window, np.asarray(rows, np.int64), kv_lens, page_indices, cu_q_lens,
                  np.array([num], np.int32)))
  shard._calls[key] = calls
  return calls


def _check_shard(shard, q_rows, page_size, total_num_pages=None):
  """Local consistency of a shard (split_pages' invariants), as rpa.Error."""
  if not isinstance(shard, ContextShard):
    raise _error("metadata", f"shard={type(shard).__name__} must be a ContextShard. Build one "
                 "per rank with rpa.distributed.split_pages.")
  m = shard.page_indices.shape[0] if shard.page_indices.ndim == 2 else -1
  for name in ("kv_lens", "page_indices", "page_slots", "seq_kv_lens", "cu_q_lens", "num_seqs"):
    if getattr(shard, name).dtype != np.int32:
      raise _error("dtype", f"shard.{name}.dtype={getattr(shard, name).dtype!r} must be int32.")
  if (shard.page_indices.ndim != 2 or shard.page_slots.shape != shard.page_indices.shape or
      shard.kv_lens.shape != (m,) or shard.seq_kv_lens.shape != (m,) or
      shard.cu_q_lens.shape != (m + 1,) or shard.num_seqs.shape != (1,)):
    raise _error("shape", "the shard's arrays do not agree in shape: "
                 f"kv_lens {shard.kv_lens.shape}, page_indices {shard.page_indices.shape}, "
                 f"page_slots {shard.page_slots.shape}, seq_kv_lens {shard.seq_kv_lens.shape}, "
                 f"cu_q_lens {shard.cu_q_lens.shape}, num_seqs {shard.num_seqs.shape}.")
  if shard.page_size != page_size:
    raise _error("shape", f"shard.page_size={shard.page_size} must be the cache's page_size="
                 f"{page_size}.")
  n = int(shard.num_seqs[0])
  if not 0 <= n <= m:
    raise _error("metadata", f"num_seqs[0]={n} must be in range [0, {m}].")
  if n and int(shard.cu_q_lens[n]) > q_rows:
    raise _error("metadata", f"Total q tokens {int(shard.cu_q_lens[n])} must be less or equal "
                 f"to max_num_batched_tokens={q_rows}.")
  ps = page_size
  for i in range(n):
    kv_len, local = int(shard.seq_kv_lens[i]), int(shard.kv_lens[i])
    q_len = int(shard.cu_q_lens[i + 1]) - int(shard.cu_q_lens[i])
    if q_len < 0 or int(shard.cu_q_lens[i]) < 0:
      raise _error("metadata", f"cu_q_lens[{i + 1}]={int(shard.cu_q_lens[i + 1])} must be "
                   f"greater or equal to cu_q_lens[{i}]={int(shard.cu_q_lens[i])} >= 0.")
    if q_len > kv_len:
      raise _error("metadata", f"q_len={q_len} must be less or equal to kv_len={kv_len} at "
                   f"sequence {i}.")
    count = _cdiv(max(local, 0), ps)
    if local < 0 or count > shard.page_slots.shape[1]:
      raise _error("metadata", f"shard.kv_lens[{i}]={local} must be in range "
                   f"[0, {shard.page_slots.shape[1] * ps}] (its page columns * page_size).")
    slots = shard.page_slots[i, :count].astype(np.int64)
    lengths = np.minimum(ps, kv_len - slots * ps)
    if (count and (slots[0] < 0 or np.any(np.diff(slots) <= 0) or
                   slots[-1] >= _cdiv(kv_len, ps))) or int(lengths.sum()) != local or \
        (count > 1 and np.any(lengths[:-1] != ps)):
      raise _error("metadata", f"sequence {i}'s shard is inconsistent: kv_lens[{i}]={local} "
                   f"keys in page slots {slots.tolist()} of a sequence of {kv_len} keys "
                   f"(page_size={ps}); slots must increase, lie in [0, "
                   f"{_cdiv(kv_len, ps)}) and hold exactly kv_lens[{i}] keys.")
    if total_num_pages is not None:
      pages = shard.page_indices[i, :count]
      bad = np.flatnonzero((pages < 0) | (pages >= total_num_pages))
      if bad.size:
        c, page = int(bad[0]), int(pages[bad[0]])
        raise _error("page_index", f"shard.page_indices[{i}, {c}]={page} must be in range "
                       f"[0, total_num_pages={total_num_pages}) because sequence {i} reads it "
                       f"(shard.kv_lens[{i}]={local}, page_size={ps}). A rank's shard names "
                       "pages of its own cache.")


def _slot_hash(seq, slots):
  """A 61-bit hash of (sequence, page slot) pairs (splitmix64), summed: the
  ranks' sums add up to the whole batch's iff they hold every page once
  (with overwhelming probability)."""
  x = (np.uint64(seq) << np.uint64(32)) + slots.astype(np.uint64)
  with np.errstate(over="ignore"):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
  return int(np.sum(x >> np.uint64(3), dtype=np.uint64) % np.uint64(2**61 - 1))


# ---------------------------------------------------------------------------
# The exchange.


def exchange_bytes(num_tokens: int, num_q_heads: int, head_dim: int, world_size: int,
                   exchange: str = "all_gather") -> dict:
  """Bytes one rank sends per call (per layer) in the exchange, by gloo's
  ring algorithms, plus the payload: a partial is num_tokens x num_q_heads x
  (head_dim + 1) float32 values (out and lse; +1 status word).

  Returns {"payload": bytes of one rank's partial, "sent": bytes one rank
  sends (ring all-gather: (N - 1) payloads; ring all-reduce: 2 (N - 1) / N
  payloads, plus the max all-reduce of the lse)}."""
  n = world_size
  payload = 4 * (num_tokens * num_q_heads * (head_dim + 1) + 1)
  lse = 4 * (num_tokens * num_q_heads + 1)
  if exchange == "all_gather":
    sent = (n - 1) * payload
  else:
    sent = 2 * (n - 1) * (payload + lse) // n
  return {"payload": payload, "sent": sent}


_EXCHANGES = ("all_gather", "all_reduce")


def _merge_gathered(gathered, tokens, heads, head_dim):
  """Merges the ranks' partials of an all-gather by merge_states, pairwise in
  rank order (identical on every rank)."""
  size = tokens * heads * head_dim
  out = lse = None
  for part in gathered:
    o = part[:size].view(tokens, heads, head_dim)
    l = part[size:size + tokens * heads].view(tokens, heads)
    if out is None:
      out, lse = o, l
    else:
      out, lse = _api.merge_states(out, lse, o, l)
  return out, lse


def _merge_reduced(dist, group, out, lse, status):
  """All-reduce of max lse, then of exp(lse - max) * out and exp(lse - max):
  2 (N - 1) / N payloads per rank instead of (N - 1)."""
  import torch

  tokens, heads, head_dim = out.shape
  m = torch.cat([lse.reshape(-1), torch.tensor([float(status)])])
  dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
  status = m[-1].item()
  top = m[:-1].view(tokens, heads)
  finite = torch.isfinite(top)
  scale = torch.where(finite, torch.exp(lse - torch.where(finite, top, torch.zeros_like(top))),
                      torch.zeros_like(top))
  buf = torch.cat([(out * scale[..., None]).reshape(-1), scale.reshape(-1)])
  dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
  num = buf[:out.numel()].view(tokens, heads, head_dim)
  den = buf[out.numel():].view(tokens, heads)
  total_lse = torch.where(den > 0, top + torch.log(den), torch.full_like(den, -math.inf))
  merged = torch.where(den[..., None] > 0, num / torch.where(den > 0, den, torch.ones_like(den))[
      ..., None], torch.zeros_like(num))
  return merged, total_lse, status


def _join_sinks(out, lse, sinks):
  """The sink as one more partial: no value, log-sum-exp = the sink's logit.
  merge_states then rescales out by exp(lse - log(exp(lse) + exp(sink))),
  which is the sink's term in the denominator, joined exactly once. The
  returned lse stays the keys' (sinks excluded, docs/contract.md §1.4)."""
  import torch

  sink_lse = sinks.to(torch.float32).reshape(1, -1).expand(lse.shape[0], -1).contiguous()
  out, _ = _api.merge_states(out, lse, torch.zeros_like(out), sink_lse)
  return out


# ---------------------------------------------------------------------------
# The context-parallel call.

_DTYPE_CODES = {"float32": 1, "bfloat16": 2, "float16": 3}
_KV_CODES = {"float32": 1, "bfloat16": 2, "float16": 3, "float8_e4m3fn": 4, "float8_e5m2": 5,
             "int8": 6, "uint8": 7}

# The descriptor every rank all-gathers before the exchange: what must agree.
_FIELDS = ("status", "rank", "world_size", "tokens", "num_q_heads", "head_dim", "q_dtype",
           "page_size", "num_kv_heads", "kv_head_dim", "num_seqs", "batch_crc", "options_crc",
           "exchange", "slot_hash", "all_slots_hash")
_MUST_AGREE = {
    "world_size": ("shape", "shard.world_size"),
    "tokens": ("shape", "q.shape[0] (max_num_batched_tokens)"),
    "num_q_heads": ("shape", "q.shape[1] (num_q_heads)"),
    "head_dim": ("shape", "q.shape[2] (head_dim)"),
    "q_dtype": ("dtype", "q.dtype"),
    "page_size": ("shape", "the cache's page_size"),
    "num_kv_heads": ("shape", "the cache's num_kv_heads"),
    "kv_head_dim": ("shape", "the cache's head_dim"),
    "num_seqs": ("metadata", "num_seqs[0]"),
    "batch_crc": ("metadata", "the batch's metadata (seq_kv_lens and cu_q_lens of the live "
                  "sequences)"),
    "options_crc": ("option", "the options (sm_scale, sliding_window, soft_cap, mask_value, "
                    "sinks)"),
    "exchange": ("option", "exchange"),
}


def _crc(*parts):
  c = 0
  for p in parts:
    b = np.ascontiguousarray(p).tobytes() if isinstance(p, np.ndarray) else repr(p).encode()
    c = zlib.crc32(b, c)
  return c


def _cache_dims(kv_pages, kv_layout):
  """(page_size, num_kv_heads, head_dim, total_num_pages) of the cache."""
  k, v = _api._split_kv(kv_pages, kv_layout)
  shape = tuple(k.shape)
  if len(shape) != 4:
    raise _error("shape", f"kv_pages.shape={shape} must have 4 dimensions.")
  if v is None:
    return shape[1], shape[2] // 2, shape[3], shape[0]
  if kv_layout == "HND":
    return shape[2], shape[1], shape[3], shape[0]
  return shape[1], shape[2], shape[3], shape[0]


@contextlib.contextmanager
def _in_rank_call():
  """The library's errors in this rank's own plans and runs, saying where."""
  try:
    yield
  except _api.Error as e:
    raise _error(getattr(e, "kind", None), f"{e} (In this rank's call over its own keys, "
                 "whose sequences are pieces of the shard's: rpa.distributed builds its "
                 "metadata from the shard.)") from e


def _rank_plans(shard, calls, q, kv_pages, *, sm_scale, sliding_window, soft_cap, mask_value,
                kv_layout, kv_dtype, num_threads):
  """[(rows, plan)]: each of this rank's calls (_local_calls) planned as an
  rpa.BatchAttention over the q rows it names (a LongTensor): the rank's
  plan for the step, built by the first layer and run by every layer, cached
  on the shard per cache shape, dtype and options (a layer whose cache
  differs gets plans of its own). The runs take q in float32."""
  import torch

  k, v = _api._split_kv(kv_pages, kv_layout)
  page_size, kv_heads, _, num_pages = _cache_dims(kv_pages, kv_layout)
  kv_name = _api._name_or_none(kv_dtype) or _api._dtype_name(k.dtype)
  layout = kv_layout if kv_layout is not None else ("combined" if v is None else "NHD")
  _, heads, head_dim = (int(d) for d in q.shape)
  key = ("plans", sliding_window, float(sm_scale), soft_cap, mask_value, num_threads, heads,
         head_dim, page_size, kv_heads, num_pages, kv_name, layout)
  plans = shard._calls.get(key)
  if plans is not None:
    return plans
  plans = []
  with _in_rank_call():
    for window, rows, kv_lens, page_indices, cu_q_lens, num_seqs in calls:
      plan = _batch.BatchAttention(kv_layout=layout, num_threads=num_threads)
      plan.plan(kv_lens, page_indices, cu_q_lens, num_seqs, num_q_heads=heads,
                num_kv_heads=kv_heads, head_dim=head_dim, page_size=page_size,
                num_pages=num_pages, q_dtype="float32", kv_dtype=kv_name,
                num_tokens=len(rows), sm_scale=sm_scale, sliding_window=window,
                soft_cap=soft_cap, mask_value=mask_value)
      plans.append((torch.from_numpy(rows), plan))
  shard._calls[key] = plans
  return plans


def _partial(q, kv_pages, plans, *, k_scale=None, v_scale=None):
  """(out, lse) in float32 of this rank's keys: each plan of _rank_plans run
  over the q rows it names, scattered back; rows no plan holds are
  (0, -inf), which merges as nothing."""
  import torch

  tokens, heads, head_dim = (int(d) for d in q.shape)
  out = torch.zeros(tokens, heads, head_dim, dtype=torch.float32)
  lse = torch.full((tokens, heads), -math.inf, dtype=torch.float32)
  q32 = q.detach().to(torch.float32)  # Exact for bfloat16 / float16 q.
  with _in_rank_call():
    for index, plan in plans:
      o, l = plan.run(q32.index_select(0, index), kv_pages, return_lse=True, k_scale=k_scale,
                      v_scale=v_scale)
      out.index_copy_(0, index, o)
      lse.index_copy_(0, index, l)
  return out, lse


def _raise_group_failure(dist, group, rank, local_error, failed_ranks, what):
  """Every rank raises: the failing rank its own error, the others an
  rpa.Error naming the failing rank and its message (all_gather_object, only
  on this path)."""
  message = None if local_error is None else (
      getattr(local_error, "kind", None), f"{type(local_error).__name__}: {local_error}")
  messages = [None] * dist.get_world_size(group)
  dist.all_gather_object(messages, message, group=group)
  if local_error is not None:
    raise local_error
  r = failed_ranks[0]
  kind, text = messages[r] or (None, "unknown error")
  raise _error(kind or "metadata", f"context_parallel_attention failed on rank {r} of "
               f"{len(messages)} while {what}: {text} (ranks that failed: {failed_ranks}; "
               "every rank raises, none is left waiting).")


def context_parallel_attention(
    q,
    kv_pages,
    shard: ContextShard,
    *,
    group=None,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_layout: str | None = None,
    kv_dtype=None,
    sinks=None,
    return_lse: bool = False,
    num_threads: int | None = None,
    exchange: str = "all_gather",
    check: bool = True,
):
  """Attention over keys split across the ranks of a torch.distributed group.

  Every rank calls it with the same q (the whole batch's queries), its own
  cache and its own shard (`split_pages`); every rank gets the whole
  attention, as the single-process `rpa.ragged_paged_attention` over all
  keys computes it (within the dtype's tolerance; docs/contract.md §1.5).

  Each rank attends over its own keys with the log-sum-exp, each query row
  seeing exactly the keys of its own that it sees in the single-process call
  (causal and sliding-window masks follow the keys' positions in the whole
  sequence; docs/distributed.md says how), in float32; the ranks exchange
  these partials (`exchange`); every rank merges them by log-sum-exp (as
  `rpa.merge_states` does) and joins the sinks once.

  Args:
    q: [max_num_batched_tokens, num_q_heads, head_dim], the same on every
      rank; float32, bfloat16 (torch) or float16.
    kv_pages: this rank's cache, as for `rpa.ragged_paged_attention` (one
      combined array or a `(k_pages, v_pages)` pair with kv_layout).
    shard: this rank's ContextShard (split_pages(...)[rank]).
    group: the torch.distributed process group; None for the default group.
      Its timeout (init_process_group(timeout=...)) bounds every wait. Not
      needed (nor torch.distributed) when shard.world_size is 1.
    sm_scale, sliding_window, soft_cap, mask_value, k_scale, v_scale,
    kv_layout, kv_dtype, num_threads: as for `rpa.ragged_paged_attention`;
      mask_value must be None or <= -1e4 (a masked key's weight then is
      exactly 0, so a rank may leave it out). k_scale / v_scale describe this
      rank's cache and may differ between ranks.
    sinks: float32[num_q_heads] attention sinks, the same on every rank,
      joined once at the merge.
    return_lse: also return float32[max_num_batched_tokens, num_q_heads],
      the log-sum-exp over all keys (sinks excluded).
    exchange: "all_gather" (one collective of each rank's partial; the
      faster for decode, measured in docs/distributed.md) or "all_reduce"
      (an all-reduce of the max lse, then one of the rescaled outputs and
      exp sums: 2 (N - 1) / N of a partial per rank instead of N - 1).
    check: all-gather a descriptor of shapes, dtypes, metadata and options
      first, so that ranks that disagree raise a clear error instead of
      exchanging mismatched tensors. One small collective per call; skip it
      only for inputs known to agree.

  Returns:
    The output of q's shape, dtype and kind (NumPy for NumPy q), the same on
    every rank; with return_lse, (out, lse).

  Raises:
    ValueError (rpa.Error) on every rank when any rank's inputs are invalid
    or the ranks' inputs disagree (the failing rank raises its own error, the
    others one that names it and quotes it). RuntimeError (torch.distributed)
    when a rank does not arrive within the group's timeout.
  """
  import torch

  if exchange not in _EXCHANGES:
    raise _error("option", f"exchange={exchange!r} must be one of {list(_EXCHANGES)}.")
  if not isinstance(shard, ContextShard) and not _dist_initialized():
    _check_shard(shard, 0, 0)  # Its message: build one with split_pages.
  world = getattr(shard, "world_size", None)
  distributed = not (world == 1 and (group is None and not _dist_initialized()))
  dist = None
  if distributed:
    import torch.distributed as dist

    if not _dist_initialized():
      raise _error("metadata", f"shard.world_size={world} needs a torch.distributed process "
                   "group: call torch.distributed.init_process_group (with a timeout) on every "
                   "rank first.")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
  else:
    rank, size = 0, 1

  # 1. Local preparation: everything that can fail before the exchange.
  desc = dict.fromkeys(_FIELDS, -1)
  desc.update(status=0, rank=rank, world_size=world if isinstance(world, int) else -1,
              exchange=_EXCHANGES.index(exchange), slot_hash=0, all_slots_hash=0)
  error = None
  try:
    if not isinstance(shard, ContextShard):
      _check_shard(shard, 0, 0)
    q_t = q if _api._is_torch(q) else torch.from_numpy(np.asarray(q))
    if q_t.dim() != 3:
      raise _error("shape", f"q.shape={tuple(q_t.shape)} must have 3 dimensions "
                   "[max_num_batched_tokens, num_q_heads, head_dim].")
    tokens, heads, head_dim = (int(d) for d in q_t.shape)
    q_name = _api._dtype_name(q_t.dtype)
    desc.update(tokens=tokens, num_q_heads=heads, head_dim=head_dim,
                q_dtype=_DTYPE_CODES.get(q_name, 0))
    page_size, kv_heads, kv_dim, total_num_pages = _cache_dims(kv_pages, kv_layout)
    desc.update(page_size=page_size, num_kv_heads=kv_heads, kv_head_dim=kv_dim)
    if world != size or shard.rank != rank:
      raise _error("metadata", f"shard.rank={getattr(shard, 'rank', None)} of "
                   f"shard.world_size={world} must be this process's rank {rank} of the group's "
                   f"{size}. Pass split_pages(..., world_size={size})[{rank}].")
    # The shard's own checks and page hashes: once per shard (per step), then
    # reused by every layer's call, like its calls below.
    checked = shard._calls.get(("checked", tokens, page_size, total_num_pages))
    if checked is None:
      _check_shard(shard, tokens, page_size, total_num_pages)
      n = int(shard.num_seqs[0])
      slot_hash = all_hash = 0
      for i in range(n):
        count = _cdiv(int(shard.kv_lens[i]), page_size)
        slot_hash += _slot_hash(i, shard.page_slots[i, :count])
        all_hash += _slot_hash(i, np.arange(_cdiv(int(shard.seq_kv_lens[i]), page_size)))
      checked = (slot_hash % (2**61 - 1), all_hash % (2**61 - 1),
                 _crc(shard.seq_kv_lens[:n], shard.cu_q_lens[:n + 1]))
      shard._calls[("checked", tokens, page_size, total_num_pages)] = checked
    if mask_value is not None and not mask_value <= _MAX_MASK_VALUE:
      raise _error("option", f"mask_value={mask_value!r} must be None or <= -1e4 for context "
                   "parallelism: each rank leaves out keys a row may not see, which equals "
                   "the single-process call only when a masked key's weight is exactly 0.")
    if sliding_window is not None and (not isinstance(sliding_window, (int, np.integer)) or
                                       isinstance(sliding_window, bool) or sliding_window <= 0):
      raise _error("option", f"sliding_window={sliding_window!r} must be a positive int.")
    sinks_np = None
    if sinks is not None:
      sinks_t = sinks if _api._is_torch(sinks) else torch.from_numpy(np.asarray(sinks))
      if tuple(sinks_t.shape) != (heads,) or sinks_t.dtype != torch.float32:
        raise _error("shape", f"sinks.shape={tuple(sinks_t.shape)} and "
                     f"sinks.dtype={sinks_t.dtype} must be (num_q_heads={heads},) and "
                     "float32.")
      sinks_np = sinks_t.detach().cpu().numpy()
      if not np.all(np.isfinite(sinks_np) | (sinks_np == -np.inf)):
        raise _error("option", "sinks must not be NaN or +inf.")
    n = int(shard.num_seqs[0])
    desc.update(num_seqs=n, batch_crc=checked[2], slot_hash=checked[0],
                all_slots_hash=checked[1],
                options_crc=_crc(float(sm_scale), sliding_window, soft_cap, mask_value,
                                 sinks_np))
    # The rank's calls for this step: built from its shard by the first
    # layer and reused by every other (cached on the shard), as their plans.
    calls = _local_calls(shard, sliding_window)
  except Exception as e:  # noqa: BLE001 - reported to every rank, then re-raised.
    error = e
    desc["status"] = 1
  if not distributed:
    if error is not None:
      raise error
  elif check:
    vector = torch.tensor([desc[f] for f in _FIELDS], dtype=torch.int64)
    gathered = [torch.empty_like(vector) for _ in range(size)]
    dist.all_gather(gathered, vector, group=group)
    rows = [dict(zip(_FIELDS, (int(v) for v in g.tolist()))) for g in gathered]
    failed = [r for r, d in enumerate(rows) if d["status"]]
    if failed:
      _raise_group_failure(dist, group, rank, error, failed, "checking its inputs")
    for field, (kind, what) in _MUST_AGREE.items():
      values = [d[field] for d in rows]
      if len(set(values)) > 1:
        shown = ", ".join(f"rank {r}: {_show(field, v)}" for r, v in enumerate(values))
        raise _error(kind, f"{what} must be the same on every rank of the context-parallel "
                     f"group; got {shown}. Every rank passes the whole batch's q and metadata "
                     "(split_pages splits only the pages) and the same options.")
    total = sum(d["slot_hash"] for d in rows) % (2**61 - 1)
    if total != rows[0]["all_slots_hash"]:
      raise _error("metadata", "the ranks' shards do not hold every page of the batch exactly "
                   "once (a page on two ranks, or on none). Build every rank's shard with "
                   "split_pages from the same metadata and world_size.")

  # 2. This rank's partial, in float32.
  try:
    if error is not None:
      raise error
    plans = _rank_plans(shard, calls, q_t, kv_pages, sm_scale=sm_scale,
                        sliding_window=sliding_window, soft_cap=soft_cap,
                        mask_value=mask_value, kv_layout=kv_layout, kv_dtype=kv_dtype,
                        num_threads=num_threads)
    out, lse = _partial(q_t, kv_pages, plans, k_scale=k_scale, v_scale=v_scale)
    status = 0
  except Exception as e:  # noqa: BLE001
    if not distributed:
      raise
    error, status = e, 1
    out = torch.zeros(max(desc["tokens"], 0), max(desc["num_q_heads"], 0),
                      max(desc["head_dim"], 0), dtype=torch.float32)
    lse = torch.full(out.shape[:2], -math.inf, dtype=torch.float32)

  # 3. The exchange and the merge (the status travels with the partials).
  if not distributed:
    merged, merged_lse = out, lse
  elif exchange == "all_gather":
    payload = torch.cat([out.reshape(-1), lse.reshape(-1), torch.tensor([float(status)])])
    gathered = [torch.empty_like(payload) for _ in range(size)]
    dist.all_gather(gathered, payload, group=group)
    failed = [r for r, g in enumerate(gathered) if g[-1].item() != 0]
    if failed:
      _raise_group_failure(dist, group, rank, error, failed, "attending over its keys")
    merged, merged_lse = _merge_gathered(gathered, *out.shape)
  else:
    merged, merged_lse, any_status = _merge_reduced(dist, group, out, lse, status)
    if any_status:
      flags = [torch.zeros(1) for _ in range(size)]
      dist.all_gather(flags, torch.tensor([float(status)]), group=group)
      failed = [r for r, f in enumerate(flags) if f.item() != 0]
      _raise_group_failure(dist, group, rank, error, failed, "attending over its keys")
  if sinks is not None:
    merged = _join_sinks(merged, merged_lse, torch.from_numpy(sinks_np))
  result = merged.to(q_t.dtype)
  if not _api._is_torch(q):
    result, merged_lse = result.numpy(), merged_lse.numpy()
  return (result, merged_lse) if return_lse else result


def _show(field, value):
  if field == "q_dtype":
    return {v: k for k, v in _DTYPE_CODES.items()}.get(value, "unsupported")
  if field == "exchange":
    return repr(_EXCHANGES[value]) if 0 <= value < len(_EXCHANGES) else "?"
  if field.endswith("crc"):
    return f"crc {value:#010x}"
  return str(value)


def _dist_initialized():
  try:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
  except ImportError:
    return False


# ---------------------------------------------------------------------------
# Tensor parallelism: a slice of the heads per rank.


def tensor_parallel_heads(num_q_heads: int, num_kv_heads: int, rank: int,
                          world_size: int) -> tuple:
  """(q_heads, kv_heads): the slices of q heads and of KV heads rank `rank`
  of a tensor-parallel group of world_size attends over, as vLLM splits
  them: num_kv_heads / world_size KV heads per rank and their q heads
  (num_q_heads / world_size); with more ranks than KV heads, each KV head is
  replicated on world_size / num_kv_heads ranks, each with its share of that
  head's q heads. Grouped-query attention keeps q head h on KV head
  h // (num_q_heads // num_kv_heads), so a rank's q heads read only its KV
  heads and nothing crosses ranks inside attention.

  Raises:
    ValueError (rpa.Error): world_size that divides neither, or that does
      not divide num_q_heads.
  """
  if world_size < 1 or not 0 <= rank < world_size:
    raise _error("option", f"rank={rank} must be in range [0, world_size={world_size}).")
  if num_kv_heads < 1 or num_q_heads % num_kv_heads:
    raise _error("shape", f"num_q_heads={num_q_heads} must be divisible by "
                 f"num_kv_heads={num_kv_heads}")
  if num_q_heads % world_size or (num_kv_heads % world_size and world_size % num_kv_heads):
    raise _error("shape", f"world_size={world_size} must divide num_q_heads={num_q_heads} and "
                 f"divide, or be a multiple of, num_kv_heads={num_kv_heads}.")
  q_per = num_q_heads // world_size
  q_heads = slice(rank * q_per, (rank + 1) * q_per)
  if num_kv_heads % world_size == 0:
    kv_per = num_kv_heads // world_size
    kv_heads = slice(rank * kv_per, (rank + 1) * kv_per)
  else:
    head = rank // (world_size // num_kv_heads)
    kv_heads = slice(head, head + 1)
  return q_heads, kv_heads


def tensor_parallel_slice(q, kv_pages, *, rank: int, world_size: int, sinks=None,
                          kv_layout: str | None = None):
  """(q, kv_pages, sinks) of rank `rank`'s heads (tensor_parallel_heads),
  as views: q[:, q_heads], the cache's KV heads (combined heads 2h, 2h + 1
  of JAX's layout; axis 2 of NHD, 1 of HND), sinks[q_heads]. Attention over
  them with the plain call equals the matching heads of attention over all
  heads (a test checks it)."""
  k, v = _api._split_kv(kv_pages, kv_layout)
  num_q_heads = int(q.shape[1])
  if v is None:
    num_kv_heads = int(k.shape[2]) // 2
  else:
    num_kv_heads = int(k.shape[1] if kv_layout == "HND" else k.shape[2])
  q_heads, kv_heads = tensor_parallel_heads(num_q_heads, num_kv_heads, rank, world_size)
  q_r = q[:, q_heads]
  if v is None:
    kv_r = k[:, :, 2 * kv_heads.start:2 * kv_heads.stop]
  elif kv_layout == "HND":
    kv_r = (k[:, kv_heads], v[:, kv_heads])
  else:
    kv_r = (k[:, :, kv_heads], v[:, :, kv_heads])
  return q_r, kv_r, None if sinks is None else sinks[q_heads]
