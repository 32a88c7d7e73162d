// Engines' page tables (rpa/engine_page_tables.h): FlashInfer's CSR form,
// checked with FlashInfer's rules and copied into a plan's compact page table
// without building JAX's padded matrix; vLLM's metadata as JAX's form.
#include "rpa/engine_page_tables.h"

#include <algorithm>
#include <string>

#include "format.h"
#include "validate/validate_internal.h"

namespace rpa {
namespace internal {
namespace {

constexpr std::string_view kCsrNames[] = {"qo_indptr", "kv_indptr", "kv_indices",
                                          "kv_last_page_len"};

// The four views in kCsrNames' order.
const TensorView* CsrViews(const CsrPageTable& csr, int i) {
  const TensorView* views[] = {&csr.qo_indptr, &csr.kv_indptr, &csr.kv_indices,
                               &csr.kv_last_page_len};
  return views[i];
}

void CheckCsrViews(const CsrPageTable& csr) {
  CheckRank(csr.qo_indptr, "qo_indptr", 1, "[batch_size + 1]");
  CheckRank(csr.kv_indptr, "kv_indptr", 1, "[batch_size + 1]");
  CheckRank(csr.kv_indices, "kv_indices", 1, "[num_used_pages]");
  CheckRank(csr.kv_last_page_len, "kv_last_page_len", 1, "[batch_size]");
  CheckCsrExtents(csr.qo_indptr, csr.kv_indptr, csr.kv_last_page_len, "kv_last_page_len");
  bool int32 = true;
  std::string got;
  for (int i = 0; i < 4; ++i) {
    int32 = int32 && CsrViews(csr, i)->dtype == DType::kI32;
    got += StrCat(i ? ", " : "", kCsrNames[i], ".dtype=", PyRepr(CsrViews(csr, i)->dtype));
  }
  RPA_CHECK(int32, ErrorKind::kDtype,
            StrCat("The dtype of `qo_indptr`, `kv_indptr`, `kv_indices` and `kv_last_page_len` "
                   "must be int32. Got ", got, "."),
            "Cast them to int32 (FlashInfer keeps them as torch.int32).");
  for (int i = 0; i < 4; ++i) CheckInnermostContiguous(*CsrViews(csr, i), kCsrNames[i]);
}

// Copies an indptr array and checks FlashInfer's rule for it: from 0, never
// decreasing.
void CopyIndptr(const TensorView& view, std::string_view name, std::string_view fix,
                std::vector<int32_t>& into) {
  const auto* values = static_cast<const int32_t*>(view.data);
  into.assign(values, values + view.shape[0]);
  RPA_CHECK(into[0] == 0, ErrorKind::kMetadata, StrCat(name, "[0]=", into[0], " must be 0."),
            StrCat(name, "[i] is where sequence i's ", fix, " start; FlashInfer's indptr "
                   "arrays start at 0."));
  for (size_t i = 0; i + 1 < into.size(); ++i) {
    CheckNonDecreasing(name, static_cast<int64_t>(i), into[i], into[i + 1],
                       StrCat(name, " is the running sum of the sequences' ", fix,
                              ": it never decreases."));
  }
}

}  // namespace

void CheckCsrExtents(const TensorView& qo_indptr, const TensorView& kv_indptr,
                     const TensorView& per_seq, std::string_view per_seq_name) {
  const int64_t entries = qo_indptr.shape[0];
  RPA_CHECK(entries >= 1, ErrorKind::kShape,
            StrCat("qo_indptr.shape=", qo_indptr.ShapeString(), " must have at least one entry."),
            "qo_indptr has batch_size + 1 entries, from qo_indptr[0] = 0; an empty batch is "
            "qo_indptr = [0].");
  RPA_CHECK(kv_indptr.shape[0] == entries, ErrorKind::kShape,
            StrCat("kv_indptr.shape=", kv_indptr.ShapeString(),
                   " must be the same as qo_indptr.shape=", qo_indptr.ShapeString(), "."),
            "Give kv_indptr one entry per sequence plus one, like qo_indptr.");
  RPA_CHECK(per_seq.shape[0] == entries - 1, ErrorKind::kShape,
            StrCat(per_seq_name, ".shape=", per_seq.ShapeString(), " must be (",
                   NameEq("batch_size", entries - 1), ",)."),
            StrCat("Give ", per_seq_name, " one entry per sequence: qo_indptr.shape[0] - 1."));
}

RaggedInputs CsrShapeInputs(const AttentionShape& shape, const CsrPageTable& csr) {
  CheckCsrViews(csr);
  const int64_t batch = csr.qo_indptr.shape[0] - 1;
  // The page table StaticValidate sees: batch sequences of up to every
  // page of kv_indices each; its views have no data and are never read.
  const PageTable table{TensorView(nullptr, DType::kI32, {batch}),
                        TensorView(nullptr, DType::kI32, {batch, csr.kv_indices.shape[0]}),
                        TensorView(nullptr, DType::kI32, {batch + 1}),
                        TensorView(nullptr, DType::kI32, {1})};
  RaggedInputs inputs = ShapeInputs(shape, table);
  inputs.pages_per_seq_name = "kv_indices.shape[0]";
  return inputs;
}

void CopyCsrMetadata(const CsrPageTable& csr, AttentionProblem& p, MetadataCopy& copy) {
  const int64_t batch = csr.qo_indptr.shape[0] - 1;
  RPA_CHECK(batch <= INT32_MAX, ErrorKind::kShape,
            StrCat(NameEq("batch_size", batch), " must fit in int32."), "Split the batch.");
  // Copied first, then checked (as CopyMetadata does).
  CopyIndptr(csr.qo_indptr, "qo_indptr", "query rows", copy.cu_q_lens);
  std::vector<int32_t>& kv_indptr = copy.kv_lens;  // Reused below for the lengths.
  CopyIndptr(csr.kv_indptr, "kv_indptr", "pages", kv_indptr);
  const int64_t used_pages = kv_indptr[batch];
  RPA_CHECK(used_pages <= csr.kv_indices.shape[0], ErrorKind::kMetadata,
            StrCat("kv_indptr[", batch, "]=", used_pages, " must be less or equal to ",
                   NameEq("kv_indices.shape[0]", csr.kv_indices.shape[0]), "."),
            "kv_indptr[batch_size] counts the pages in use; kv_indices must hold them all.");

  copy.page_begin.assign(kv_indptr.begin(), kv_indptr.end());
  const auto* last_page_len = static_cast<const int32_t*>(csr.kv_last_page_len.data);
  int64_t max_pages = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t pages = copy.page_begin[i + 1] - copy.page_begin[i];
    const int32_t last = last_page_len[i];
    if (pages == 0) {
      RPA_CHECK(last == 0, ErrorKind::kMetadata,
                StrCat("kv_last_page_len[", i, "]=", last, " must be 0 because sequence ", i,
                       " has no pages (kv_indptr[", i, "] = kv_indptr[", i + 1,
                       "] = ", copy.page_begin[i], ")."),
                "A sequence without pages has no keys; give it kv_last_page_len 0, or its "
                "pages.");
    } else {
      RPA_CHECK(last >= 1 && last <= p.page_size, ErrorKind::kMetadata,
                StrCat("kv_last_page_len[", i, "]=", last, " must be in range [1, ",
                       NameEq("page_size", p.page_size), "] because sequence ", i, " has ",
                       pages, " pages (kv_indptr[", i, "]=", copy.page_begin[i], ", kv_indptr[",
                       i + 1, "]=", copy.page_begin[i + 1], ")."),
                "kv_last_page_len counts the tokens in a sequence's last page: at least 1, at "
                "most page_size.");
    }
    const int64_t kv_len = pages == 0 ? 0 : (pages - 1) * p.page_size + last;
    RPA_CHECK(kv_len <= INT32_MAX, ErrorKind::kMetadata,
              StrCat(NameEq("kv_len", kv_len), " of sequence ", i, " (", pages,
                     " pages of page_size=", p.page_size, ") must fit in int32."),
              "Shorten the sequence.");
    kv_indptr[i] = static_cast<int32_t>(kv_len);  // kv_lens from here on.
    max_pages = std::max(max_pages, pages);
  }
  copy.kv_lens.resize(static_cast<size_t>(batch));

  const int32_t* cu = copy.cu_q_lens.data();
  CheckTotalQTokens(cu[batch], p,
                    "qo_indptr[batch_size] counts the q rows in use; make q taller or the batch "
                    "smaller.");
  for (int64_t i = 0; p.causal && i < batch; ++i) {
    CheckQLenAtMostKvLen(static_cast<int64_t>(cu[i + 1]) - cu[i], copy.kv_lens[i], i,
                         "A sequence's new tokens are part of its history: its pages hold "
                         "them too.");
  }

  // Every index a sequence reads: in CSR, all of kv_indices[0, used_pages).
  const auto* indices = static_cast<const int32_t*>(csr.kv_indices.data);
  copy.page_indices.assign(indices, indices + used_pages);
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t j = copy.page_begin[i]; j < copy.page_begin[i + 1]; ++j) {
      const int32_t page = copy.page_indices[j];
      RPA_CHECK(page >= 0 && page < p.num_pages, ErrorKind::kPageIndex,
                StrCat("kv_indices[", j, "]=", page, " must be in range [0, ",
                       NameEq("num_pages", p.num_pages), ") because sequence ", i,
                       " reads it (its pages are kv_indices[", copy.page_begin[i], ":",
                       copy.page_begin[i + 1], "])."),
                "Point every page of a sequence at a page of the cache.");
    }
  }
  p.max_num_seqs = batch;
  // The longest sequence's pages: the tuned table's max_model_len, and the
  // most a KV tile can usefully hold (a larger one covers the same keys).
  p.pages_per_seq = max_pages;
  if (p.num_kv_pages_per_block > 0) {
    p.num_kv_pages_per_block = std::min(p.num_kv_pages_per_block, std::max<int64_t>(max_pages, 1));
  }
  copy.Bind(p);
  p.num_seqs = static_cast<int32_t>(batch);
  copy.CopyOptionArrays(p);
}

}  // namespace internal

PageTable VllmPageTable(const TensorView& query_start_loc, const TensorView& seq_lens,
                        const TensorView& block_table, const TensorView& num_seqs) {
  // vLLM's persistent buffers have rows for max_num_reqs; the step's are the
  // first num_reqs = seq_lens.shape[0]. A view of another rank is left as it
  // is, for the validation to name.
  const int64_t reqs = seq_lens.rank == 1 ? seq_lens.shape[0] : -1;
  TensorView starts = query_start_loc;
  if (reqs >= 0 && starts.rank == 1 && starts.shape[0] > reqs + 1) starts.shape[0] = reqs + 1;
  TensorView blocks = block_table;
  if (reqs >= 0 && blocks.rank == 2 && blocks.shape[0] > reqs) blocks.shape[0] = reqs;
  return PageTable{seq_lens, blocks, starts, num_seqs};
}

}  // namespace rpa
