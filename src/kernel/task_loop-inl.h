// The task loop: one task's rows through the kernels dispatch chose for its
// class (dispatch.h). It loads the queries in every format those kernels
// want, walks the KV tiles (row pointers of this and the next tile, the
// fused tiles where they apply, else logits -> softmax -> PV), and
// finishes: the accumulators back in natural order, then the output rows
// (or a partial for the merge). The arithmetic is the kernels'.
//
// Per KV tile of n keys (row pointers k_i, v_i into the pages):
//   S[r][i] = (q_r . k_i) * sm_scale * k_scale      // kernel logits
//   S += alibi ? slope_h * (t0 + i - pos_r) : 0      // ALiBi (no fused tiles)
//   custom mask: keys whose bit is clear are dropped (-inf, no NaN); a tile
//   no row keeps is skipped, one every row keeps whole runs unmasked
//   S = soft_cap ? c * tanh(S / c) : S; keys outside the row's visible
//   range (causal, window; AttentionProblem::VisibleKeys): -inf (skipped when
//   mask_value <= -1e4, docs/contract.md §1) or S + mask_value
//   m' = max(m, max_i S[r][i]);  alpha = exp(m - m')
//   P[r][i] = exp(S[r][i] - m');  l = alpha * l + sum_i P[r][i]
//   acc_r = alpha * acc_r + sum_i P[r][i] * v_i       // kernel pv
// and at the end out_r = acc_r * v_scale / l (FinishRow). k_scale and
// v_scale are folded into the logit and output scale: q.(s k) = s (q.k), so
// K/V are never rescaled element by element.
//
// Compiled once per Highway target: include it only through
// hwy/foreach_target.h (highway_kernel.cc).
#if defined(RPA_SRC_KERNEL_TASK_LOOP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RPA_SRC_KERNEL_TASK_LOOP_INL_H_
#undef RPA_SRC_KERNEL_TASK_LOOP_INL_H_
#else
#define RPA_SRC_KERNEL_TASK_LOOP_INL_H_
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

#include "hwy/highway.h"
#include "kernel/highway_load-inl.h"
#include "kernel/kernel.h"
#include "kernel/next_tile_rows.h"
#include "kernel/softmax-inl.h"
#include "kernel/softmax_finish.h"
#include "problem.h"

HWY_BEFORE_NAMESPACE();
namespace rpa::internal {
namespace HWY_NAMESPACE {

// Fills base[i] with kv head `kv_head`'s K (or V) row of key t0 + i,
// walking the page table page by page (one division per tile, not per key).
inline void TileRowPointers(const AttentionProblem& pr, const PagesView& pages, int32_t seq,
                            int32_t kv_head, int64_t t0, int64_t n, const uint8_t** base) {
  const int64_t elem = static_cast<int64_t>(SizeOf(pr.kv_dtype));
  int64_t column = t0 / pr.page_size;
  int64_t slot = t0 % pr.page_size;
  for (int64_t i = 0; i < n;) {
    const uint8_t* row = ElementPtr(pages.data, pr.kv_dtype,
                                    pages.Offset(pr.PageIndex(seq, column), slot, kv_head));
    const int64_t count = std::min(n - i, pr.page_size - slot);
    for (int64_t j = 0; j < count; ++j) base[i + j] = row + j * pages.slot_stride * elem;
    i += count;
    slot = 0;
    ++column;
  }
}

// Set bits of bits[begin, begin + count), little-endian within each byte.
inline int64_t CountSetBits(const uint8_t* bits, int64_t begin, int64_t count) {
  int64_t set = 0;
  for (int64_t b = begin; b < begin + count;) {
    const int64_t shift = b % 8;
    const int64_t take = std::min<int64_t>(8 - shift, begin + count - b);
    set += std::popcount(static_cast<unsigned>((bits[b / 8] >> shift) & ((1u << take) - 1)));
    b += take;
  }
  return set;
}

// What a custom mask keeps of a tile, over every row of a task.
enum class TileKeep : uint8_t { kNone, kSome, kAll };

// What every step of one task needs: its shape, its kernels, its scales.
struct TaskContext {
  const AttentionProblem* pr = nullptr;
  const KernelTask* task = nullptr;
  const TaskKernels* kernels = nullptr;
  bool prefetch_in_address_order = false;  // KernelChoice's.
  const WorkerScratch* ws = nullptr;
  int64_t group = 0;          // q heads per kv head.
  int64_t heads = 0;          // kv heads of the task.
  int64_t rows_per_head = 0;  // Query tokens of the tile x group.
  int64_t rows = 0;           // rows_per_head x heads.
  int64_t q_start = 0;        // The sequence's first row of q.
  int64_t first_pos = 0;      // Query positions of the tile's first and last token.
  int64_t last_pos = 0;
  int64_t kv_len = 0;
  float value_unit = 1.0f;    // What one unit of the kernels' K/V is worth (kE4M3Rescale).
  // The custom mask's block of the task's sequence, and the bit of key 0 of
  // the tile's first token row (rows kv_len bits apart); null: no mask.
  const uint8_t* mask_bits = nullptr;
  int64_t mask_bit0 = 0;
  SoftmaxParams softmax{};

  int64_t TokenOf(int64_t r) const {
    return q_start + task->q_begin + (r % rows_per_head) / group;
  }
  int64_t PosOf(int64_t r) const { return first_pos + (r % rows_per_head) / group; }
  int64_t HeadOf(int64_t r) const {
    return (task->kv_head + r / rows_per_head) * group + r % group;
  }
  // Whether every row sees every key of [begin, end): the first row's
  // range reaches past it and the last row's starts before it.
  bool AllVisible(int64_t begin, int64_t end) const {
    return end <= pr->VisibleKeys(first_pos, kv_len).end &&
           begin >= pr->VisibleKeys(last_pos, kv_len).begin;
  }
  // What the custom mask keeps of keys [begin, end) (kAll without one).
  TileKeep KeptIn(int64_t begin, int64_t end) const {
    if (mask_bits == nullptr) return TileKeep::kAll;
    const int64_t tokens = task->q_end - task->q_begin;
    int64_t set = 0;
    for (int64_t i = 0; i < tokens; ++i) {
      set += CountSetBits(mask_bits, mask_bit0 + i * kv_len + begin, end - begin);
    }
    return set == 0 ? TileKeep::kNone
                    : set == tokens * (end - begin) ? TileKeep::kAll : TileKeep::kSome;
  }
  // Lane row of row r in kBf16PairLanes (its kv head's rows start a block).
  int64_t LaneRowOf(int64_t r) const {
    return r / rows_per_head * LaneRowsPerHead(rows_per_head) + r % rows_per_head;
  }
  // Rows [r0, r0 + count) in the format; kBf16PairLanes only from a block's
  // first row: a kv head's first, or one after whole 16-row groups (its
  // kernels run the middle class, whose only fused tile, the lanes one,
  // takes a head's rows 16 at a time).
  QueryRows Queries(QueryFormat format, int64_t r0, int64_t count) const {
    const int64_t stride = QueryStride(format, ws->dim_pad);
    const int f = static_cast<int>(format);
    const int64_t first = format == QueryFormat::kBf16PairLanes ? LaneRowOf(r0) : r0;
    HWY_DASSERT(format != QueryFormat::kBf16PairLanes || first % kQueryLanes == 0);
    const auto* base = static_cast<const uint8_t*>(ws->q_format[f]);
    return {base + first * stride * QueryElemBytes(format), stride, count,
            ws->q_unscale[f] + r0};
  }
  SoftmaxState State(int64_t r0) const {
    return {ws->m + r0, ws->l + r0, ws->acc + r0 * ws->dim_pad, ws->dim_pad};
  }
};

TaskContext MakeContext(const AttentionProblem& pr, const KernelTask& task,
                        const KernelRun& run, const WorkerScratch& ws) {
  TaskContext c;
  c.pr = &pr;
  c.task = &task;
  c.ws = &ws;
  c.group = pr.QueriesPerKvHead();
  c.heads = task.kv_head_end - task.kv_head;
  c.rows_per_head = (task.q_end - task.q_begin) * c.group;
  c.rows = c.rows_per_head * c.heads;
  c.kernels = &run.kernels->For(ClassOfRows(c.rows_per_head));
  c.prefetch_in_address_order = run.kernels->prefetch_in_address_order;
  c.q_start = pr.cu_q_lens[task.seq];
  const int64_t q_len = pr.cu_q_lens[task.seq + 1] - c.q_start;
  c.kv_len = pr.kv_lens[task.seq];
  c.first_pos = c.kv_len - q_len + task.q_begin;
  c.last_pos = c.kv_len - q_len + task.q_end - 1;
  c.value_unit = pr.kv_dtype == DType::kF8E4M3FN && c.kernels->products->e4m3_scaled
                     ? kE4M3Rescale
                     : 1.0f;
  c.softmax.logit_scale = pr.sm_scale * pr.k_scale * c.value_unit;
  c.softmax.soft_cap = pr.soft_cap;
  c.softmax.mask_value = pr.mask_value;
  c.softmax.vanish = pr.MaskedKeysVanish();
  c.softmax.alibi = pr.alibi_slopes != nullptr;
  if (pr.mask_bits != nullptr) {
    c.mask_bits = pr.mask_bits + pr.mask_begin[task.seq];
    c.mask_bit0 = task.q_begin * c.kv_len;
  }
  return c;
}

// q rows are a token (all heads) apart, a stride the hardware prefetchers do
// not follow: LoadQueries prefetches this many rows ahead
// (docs/kernel_log.md, twelfth session).
constexpr int64_t kRowsAhead = 16;

// Called at row r of a loop over rows [0, rows): prefetches row r +
// kRowsAhead (at r = 0, every row up to it) of row_at(i)'s `bytes` bytes.
template <class RowAt>
void PrefetchRowsAhead(int64_t r, int64_t rows, const RowAt& row_at, int64_t bytes,
                       PrefetchTo to) {
  for (int64_t i = r == 0 ? 0 : r + kRowsAhead; i <= r + kRowsAhead && i < rows; ++i) {
    PrefetchRow(row_at(i), bytes, to);
  }
}

// Row r of the kBf16 rows (loaded) into its lane of kBf16PairLanes; a kv
// head's last block, where its rows end inside it, zeroed first.
void StoreLaneRow(const TaskContext& c, int64_t r) {
  const WorkerScratch& ws = *c.ws;
  const int64_t dim_pad = ws.dim_pad;
  const int64_t lane_row = c.LaneRowOf(r);
  constexpr int kLanes = static_cast<int>(QueryFormat::kBf16PairLanes);
  constexpr int kBf16 = static_cast<int>(QueryFormat::kBf16);
  uint32_t* lanes = static_cast<uint32_t*>(ws.q_format[kLanes]);
  const int64_t head_end = (r / c.rows_per_head + 1) * c.rows_per_head;
  if (lane_row % kQueryLanes == 0 && head_end - r < kQueryLanes) {
    std::memset(lanes + QueryLaneIndex(lane_row, 0, dim_pad), 0,
                sizeof(uint32_t) * kQueryLanes * (dim_pad / 2));
  }
  const uint16_t* row = static_cast<const uint16_t*>(ws.q_format[kBf16]) + r * dim_pad;
  for (int64_t j = 0; j < dim_pad / 2; ++j) {
    uint32_t pair;
    std::memcpy(&pair, row + 2 * j, sizeof(pair));
    lanes[QueryLaneIndex(lane_row, j, dim_pad)] = pair;
  }
  ws.q_unscale[kLanes][r] = 1.0f;
}

// Loads every row of q in each format the task's kernels want (f32 also as
// the source of the other formats, unless every one is a copy of q's bits);
// resets the online-softmax state.
void LoadQueries(const TaskContext& c) {
  const AttentionProblem& pr = *c.pr;
  const WorkerScratch& ws = *c.ws;
  const int64_t dim_pad = ws.dim_pad;
  QueryFormat formats[3];
  PrepareQueryRow prepare[3];
  int num_formats = 0;
  bool f32_wanted = false;
  bool lanes = false;  // kBf16PairLanes, built from the kBf16 rows (StoreLaneRow).
  auto want = [&](QueryFormat format, PrepareQueryRow fn) {
    if (format == QueryFormat::kF32) {
      f32_wanted = true;
      return;
    }
    if (format == QueryFormat::kBf16PairLanes) {
      lanes = true;
      format = QueryFormat::kBf16;
      fn = PrepareBf16Row;
    }
    for (int i = 0; i < num_formats; ++i) {
      if (formats[i] == format) return;
    }
    formats[num_formats] = format;
    prepare[num_formats++] = fn;
  };
  for (const FusedTileKernel* fused : c.kernels->fused) {
    if (fused != nullptr) want(fused->q_format, fused->prepare_q);
  }
  want(c.kernels->products->q_format, c.kernels->products->prepare_q);
  // bf16 q in a kBf16 kernel's format is q's own bits (what PrepareBf16Row's
  // rounding would give back): copied, with no f32 row where no kernel
  // takes one.
  auto copies_bits = [&](QueryFormat format) {
    return format == QueryFormat::kBf16 && pr.q_dtype == DType::kBF16;
  };
  bool f32_needed = f32_wanted;
  for (int i = 0; i < num_formats; ++i) f32_needed |= !copies_bits(formats[i]);
  const int64_t q_row_bytes = pr.head_dim * static_cast<int64_t>(SizeOf(pr.q_dtype));
  auto q_row = [&](int64_t r) {
    return ElementPtr(pr.q, pr.q_dtype,
                      c.TokenOf(r) * pr.q_token_stride + c.HeadOf(r) * pr.q_head_stride);
  };
  for (int64_t r = 0; r < c.rows; ++r) {
    PrefetchRowsAhead(r, c.rows, q_row, q_row_bytes, PrefetchTo::kL1);
    const void* src = q_row(r);
    float* q = ws.q + r * dim_pad;
    if (f32_needed) LoadRowF32(pr.q_dtype, src, pr.head_dim, dim_pad, q);
    for (int i = 0; i < num_formats; ++i) {
      const int f = static_cast<int>(formats[i]);
      const int64_t row_bytes = QueryStride(formats[i], dim_pad) * QueryElemBytes(formats[i]);
      uint8_t* out = static_cast<uint8_t*>(ws.q_format[f]) + r * row_bytes;
      if (copies_bits(formats[i])) {
        std::memcpy(out, src, q_row_bytes);
        std::memset(out + q_row_bytes, 0, row_bytes - q_row_bytes);
        ws.q_unscale[f][r] = 1.0f;
      } else {
        ws.q_unscale[f][r] = prepare[i](q, pr.head_dim, dim_pad, out);
      }
    }
    if (lanes) StoreLaneRow(c, r);
    ws.m[r] = -std::numeric_limits<float>::infinity();
    ws.l[r] = 0.0f;
    std::memset(ws.acc + r * dim_pad, 0, sizeof(float) * dim_pad);
  }
}

// Fused tiles over rows [*r0, *r0 + *left) of one kv head, in groups: each
// kernel in order whose min_rows the group (up to its max_rows) meets gets
// it until one takes it. Stops at the first group no kernel takes. The first
// group prefetches the next tile. The tiles go by reference: a copy of one
// just written field by field reads it back in 64-byte loads that the
// stores cannot forward to (docs/kernel_log.md, 2026-12-08).
void FusedGroups(const TaskContext& c, const KvTile& tile, int64_t* r0, int64_t* left) {
  const FusedTileKernel* const* fused = c.kernels->fused;
  std::optional<KvTile> later;  // The groups after the first: no next rows.
  while (*left > 0) {
    if (*left != c.rows_per_head && !later) later = WithoutNextRows(tile);
    const KvTile& group_tile = later ? *later : tile;
    int64_t taken = 0;
    for (int i = 0; i < 2 && taken == 0 && fused[i] != nullptr; ++i) {
      const int64_t group = std::min(*left, fused[i]->max_rows);
      if (group < fused[i]->min_rows) continue;
      if (fused[i]->tile(c.Queries(fused[i]->q_format, *r0, group), group_tile,
                         c.softmax.logit_scale, c.State(*r0))) {
        taken = group;
      }
    }
    if (taken == 0) return;
    *r0 += taken;
    *left -= taken;
  }
}

// One kv head's (h of the task's) rows over one tile: fused groups where
// allowed, then the products and the softmax for the rows left (reading the
// custom mask's bits when the tile is only partly kept).
void RunHeadTile(const TaskContext& c, const KvTile& head_tile, int64_t h, int64_t t0,
                 bool fused, TileKeep keep) {
  const WorkerScratch& ws = *c.ws;
  int64_t r0 = h * c.rows_per_head;
  int64_t left = c.rows_per_head;
  if (fused) FusedGroups(c, head_tile, &r0, &left);
  if (left == 0) return;
  // A fused group prefetched the next tile already; else the tile as it is
  // (not copied: see FusedGroups).
  std::optional<KvTile> without_next;
  if (left != c.rows_per_head) without_next = WithoutNextRows(head_tile);
  const KvTile& tile = without_next ? *without_next : head_tile;
  const ProductKernel& products = *c.kernels->products;
  // With a vanishing mask, the keys after a row's last visible one are
  // skipped (docs/contract.md §1): most of the causal diagonal's triangle.
  const bool all_visible = c.AllVisible(t0, t0 + tile.n);
  const bool skip_masked = c.softmax.vanish && !all_visible;
  // The products' fused softmax takes tiles whose rows mask no key before
  // their last one and need none of the softmax's other rules.
  bool fused_weights = products.weights != nullptr && keep == TileKeep::kAll &&
                       !c.softmax.alibi && c.softmax.soft_cap == 0.0f &&
                       (all_visible || skip_masked);
  for (int64_t r = r0; skip_masked && r < r0 + left; ++r) {
    const AttentionProblem::KeyRange range = c.pr->VisibleKeys(c.PosOf(r), c.kv_len);
    ws.needed[r] = static_cast<int32_t>(std::clamp<int64_t>(range.end - t0, 0, tile.n));
    if (range.begin > t0 && range.end > t0) fused_weights = false;
  }
  RowKeys keys;
  keys.kv_len = c.kv_len;
  keys.t0 = t0;
  keys.n = tile.n;
  keys.n_pad = RoundUp(tile.n, static_cast<int64_t>(hn::Lanes(DF())));
  // The logits and weights of rows [first, first + rows), at the start of s.
  auto softmax_rows = [&](int64_t first, int64_t rows) {
    for (int64_t r = first; r < first + rows; ++r) {
      keys.pos = c.PosOf(r);
      const AttentionProblem::KeyRange range = c.pr->VisibleKeys(keys.pos, c.kv_len);
      keys.begin = range.begin;
      keys.end = range.end;
      keys.needed = skip_masked ? ws.needed[r] : tile.n;
      if (c.softmax.alibi) keys.alibi_slope = c.pr->alibi_slopes[c.HeadOf(r)];
      if (keep == TileKeep::kSome) {
        keys.bits = c.mask_bits;
        keys.bit0 = c.mask_bit0 + (r % c.rows_per_head) / c.group * c.kv_len + t0;
      }
      SoftmaxRow(c.softmax, keys, ws.s + (r - first) * ws.token_pad, c.State(r));
    }
  };
  // A kernel with prepare_tile takes the rows in chunks through the same
  // rows of s; the others all at once.
  if (products.prepare_tile != nullptr) products.prepare_tile(tile, ws.tile);
  const int64_t chunk = products.prepare_tile != nullptr ? kRowChunk : left;
  for (int64_t first = r0; first < r0 + left; first += chunk) {
    const int64_t rows = std::min(chunk, r0 + left - first);
    const TileLogits s{ws.s, ws.token_pad, rows, skip_masked ? ws.needed + first : nullptr};
    if (fused_weights && products.weights(c.Queries(products.q_format, first, rows), tile, s,
                                          c.softmax.logit_scale, c.State(first), ws.tile)) {
      TileLogits weights = s;
      weights.bf16_weights = true;
      products.pv(weights, tile, c.State(first), ws.tile);
      continue;
    }
    products.logits(c.Queries(products.q_format, first, rows), tile, s, ws.tile);
    softmax_rows(first, rows);
    products.pv(s, tile, c.State(first), ws.tile);
  }
}

// Walks the task's KV range tile by tile. Row pointers of the current and
// the next tile (ping-pong). Only keys below kv_len are ever read, so NaN
// pages and garbage page indices past them are never followed. One kv
// head's rows sit a whole token apart (4 KiB for 8 kv heads x 128 bf16 x
// K,V), which the hardware prefetchers do not follow: the next tile's rows
// are prefetched while this one is computed (NextTileRows: which rows, into
// which cache), and the first tile's up front.
void WalkTiles(const TaskContext& c, int64_t kv_block) {
  const AttentionProblem& pr = *c.pr;
  const KernelTask& task = *c.task;
  const WorkerScratch& ws = *c.ws;
  const int64_t elem = static_cast<int64_t>(SizeOf(pr.kv_dtype));
  const int64_t k_head_bytes = pr.k.head_stride * elem;
  const int64_t v_head_bytes = pr.v.head_stride * elem;
  KvTile tile;
  tile.head_dim = pr.head_dim;
  tile.row_bytes = pr.head_dim * elem;
  const int64_t step = c.heads > 1 ? std::min(kv_block, kMultiHeadTile) : kv_block;
  // Tile [t0, t1): within one kv_block tile (chunks split there) and `step`.
  auto tile_end = [&](int64_t t0) {
    return std::min({static_cast<int64_t>(task.kv_end), (t0 / kv_block + 1) * kv_block,
                     t0 + step});
  };
  const bool fusable = c.kernels->fused[0] != nullptr;
  NextTileRows ahead;
  ahead.rows = ws.next_rows;
  ahead.address_order =
      c.prefetch_in_address_order && c.heads > 1 && TokenRowsTogether(pr.k, pr.v);
  auto slot_base = [&](const uint8_t** base, int64_t tile_index) {
    return base + (tile_index % kTileRowSlots) * ws.token_pad;
  };
  // Tile tile_index's rows of kv head task.kv_head, keys [t_begin, t_begin + n).
  auto row_pointers = [&](int64_t t_begin, int64_t n, int64_t tile_index) {
    TileRowPointers(pr, pr.k, task.seq, task.kv_head, t_begin, n, slot_base(ws.k_base, tile_index));
    TileRowPointers(pr, pr.v, task.seq, task.kv_head, t_begin, n, slot_base(ws.v_base, tile_index));
  };
  // The first tile [t0, t1): its rows now, all prefetched up front.
  int64_t t0 = task.kv_begin;
  int64_t t1 = t0 < task.kv_end ? tile_end(t0) : t0;
  if (t0 < t1) {
    row_pointers(t0, t1 - t0, 0);
    const uint8_t* const* k_rows = slot_base(ws.k_base, 0);
    const uint8_t* const* v_rows = slot_base(ws.v_base, 0);
    for (int64_t i = 0; i < t1 - t0; ++i) {
      for (int64_t h = 0; h < c.heads; ++h) {
        PrefetchRow(k_rows[i] + h * k_head_bytes, tile.row_bytes, ahead.PrefetchLevel());
        PrefetchRow(v_rows[i] + h * v_head_bytes, tile.row_bytes, ahead.PrefetchLevel());
      }
    }
  }
  for (int64_t index = 0; t0 < t1; ++index) {
    // The next tile [t1, t2): its row pointers, and what the passes prefetch of it.
    const int64_t t2 = t1 < task.kv_end ? tile_end(t1) : t1;
    tile.n = t1 - t0;
    ahead.n = t2 - t1;
    const uint8_t** ahead_k = slot_base(ws.k_base, index + 1);
    const uint8_t** ahead_v = slot_base(ws.v_base, index + 1);
    if (ahead.n > 0) {
      row_pointers(t1, ahead.n, index + 1);
      if (ahead.address_order) {
        ListRowsInAddressOrder(ahead_k, ahead_v, ahead.n, c.heads, k_head_bytes, v_head_bytes, ahead.rows);
      }
    }
    // A tile the custom mask drops for every row is skipped: its keys take
    // no part at all.
    const TileKeep keep = c.KeptIn(t0, t1);
    const bool fused = fusable && tile.n <= kFusedMaxKeys && c.AllVisible(t0, t1) &&
                       keep == TileKeep::kAll;
    for (int64_t h = 0; keep != TileKeep::kNone && h < c.heads; ++h) {
      tile.k = {slot_base(ws.k_base, index), h * k_head_bytes, tile.n};
      tile.v = {slot_base(ws.v_base, index), h * v_head_bytes, tile.n};
      tile.k_next = ahead.ForPass(ahead_k, h * k_head_bytes, h, 0);
      tile.v_next = ahead.ForPass(ahead_v, h * v_head_bytes, h, 1);
      RunHeadTile(c, tile, h, t0, fused, keep);
    }
    t0 = t1;
    t1 = t2;
  }
}

// The accumulators back to natural dimension order from the kernels' order
// (a permutation within each 32-dimension chunk; constant here, so the
// compiler turns each chunk's moves into a few permutes).
template <AccOrder kOrder>
void ToNaturalOrderRows(float* acc, int64_t rows, int64_t dim_pad) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d0 = 0; d0 < dim_pad; d0 += 32) {
      float* dst = acc + r * dim_pad + d0;
      float chunk[32];
      std::memcpy(chunk, dst, sizeof(chunk));
#pragma GCC unroll 32
      for (int64_t i = 0; i < 32; ++i) dst[i] = chunk[AccIndex(kOrder, i)];
    }
  }
}

void ToNaturalOrder(const TaskContext& c, AccOrder order) {
  switch (order) {
    case AccOrder::kNatural: return;
    case AccOrder::kEvenOdd:
      return ToNaturalOrderRows<AccOrder::kEvenOdd>(c.ws->acc, c.rows, c.ws->dim_pad);
    case AccOrder::kPairInterleaved:
      return ToNaturalOrderRows<AccOrder::kPairInterleaved>(c.ws->acc, c.rows, c.ws->dim_pad);
  }
}

// A split task's (m, l, acc), acc in V's units.
void WritePartial(const TaskContext& c, float* out) {
  const WorkerScratch& ws = *c.ws;
  std::memcpy(out, ws.m, sizeof(float) * c.rows);
  std::memcpy(out + c.rows, ws.l, sizeof(float) * c.rows);
  float* acc = out + 2 * c.rows;
  const int64_t count = c.rows * ws.dim_pad;
  if (c.value_unit == 1.0f) {
    std::memcpy(acc, ws.acc, sizeof(float) * count);
  } else {
    for (int64_t i = 0; i < count; ++i) acc[i] = ws.acc[i] * c.value_unit;
  }
}

// How WriteRows prefetches the output rows: for writing on the AVX-512
// targets, whose CPUs all have PRFCHW (Intel from Broadwell, every AMD);
// into L1 below them (Haswell lacks it).
constexpr PrefetchTo kOutputPrefetch =
    HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3 ? PrefetchTo::kL1 : PrefetchTo::kWrite;

// The finished rows: output (and LSE) of every row the task owns.
void WriteRows(const TaskContext& c) {
  const AttentionProblem& pr = *c.pr;
  const WorkerScratch& ws = *c.ws;
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t elem = static_cast<int64_t>(SizeOf(pr.q_dtype));
  auto out_row = [&](int64_t r) {
    return static_cast<uint8_t*>(pr.out) +
           (c.TokenOf(r) * pr.out_token_stride + c.HeadOf(r) * pr.out_head_stride) * elem;
  };
  for (int64_t r = 0; r < c.rows; ++r) {
    // The output rows are usually cold and a token apart (no hardware
    // prefetch follows them): RFO misses stalled the stores (docs/kernel_log.md).
    PrefetchRowsAhead(r, c.rows, out_row, pr.head_dim * elem, kOutputPrefetch);
    const int64_t token = c.TokenOf(r);
    const int64_t head = c.HeadOf(r);
    const FinishedRow f = FinishRow(ws.m[r], ws.l[r], pr.sinks ? pr.sinks + head : nullptr,
                                    pr.v_scale * c.value_unit);
    if (pr.lse != nullptr) pr.lse[token * pr.lse_token_stride + head] = f.lse;
    float* acc = ws.acc + r * ws.dim_pad;
    for (int64_t d = 0; d < ws.dim_pad; d += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), hn::Set(df, f.out_scale)), df, acc + d);
    }
    StoreRow(pr.q_dtype, out_row(r), acc, pr.head_dim);
  }
}

HWY_NOINLINE void RunTask(const AttentionProblem& pr, const KernelTask& task,
                          const KernelRun& run, const WorkerScratch& ws, float* partials) {
  const TaskContext c = MakeContext(pr, task, run, ws);
  LoadQueries(c);
  WalkTiles(c, run.kv_block);
  ToNaturalOrder(c, c.kernels->products->acc_order);
  if (task.partial_offset >= 0) {
    WritePartial(c, partials + task.partial_offset);
  } else {
    WriteRows(c);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace rpa::internal
HWY_AFTER_NAMESPACE();

#endif  // RPA_SRC_KERNEL_TASK_LOOP_INL_H_
