// libFuzzer target: ragged_paged_attention (combined, NHD and HND) over
// fuzzer-chosen metadata and options on small tensors. Oracle: the call
// throws rpa::Error exactly when the independent model of docs/contract.md §3 says so,
// leaving out and lse bit-identical; otherwise it matches the reference
// (within docs/contract.md §1's tolerance, or NaN for NaN in nan_mode). Inputs are never
// written. The same call as an AttentionPlan (rpa/plan.h), planned on a copy
// of the metadata that is overwritten with garbage before the run, throws
// exactly when the call does, writes nothing then, and otherwise gives the
// call's bytes; a valid batch in FlashInfer's CSR form matches the
// reference too. Anything else aborts.
#include <cstdint>
#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "ragged_case.h"
#include "rpa/engine_page_tables.h"
#include "rpa/error.h"
#include "rpa/plan.h"

using namespace rpa;        // NOLINT: a fuzzer's one file.
using namespace rpa::fuzz;  // NOLINT

namespace {

// Runs one path; returns whether it threw rpa::Error. Any other exception
// is a finding.
bool Run(const RaggedCase& c, bool reference, Buffer& out, std::vector<float>& lse,
         std::string& message) {
  try {
    CallRagged(c, reference, c.BoundOptions(&lse), c.OutView(out));
    return false;
  } catch (const rpa::Error& e) {
    message = e.what();
    return true;
  } catch (const std::exception& e) {
    Fail(std::string(reference ? "reference" : "library") + " threw a non-rpa exception: " +
         e.what() + "\n  " + c.Describe());
  }
}

// The call as a plan and a run. The plan reads a copy of the case's
// metadata, which is overwritten with garbage (huge lengths, out-of-range
// pages) before the run: the run must read only the plan's own copy.
bool RunPlanned(const RaggedCase& c, Buffer& out, std::vector<float>& lse, std::string& message) {
  RaggedCase meta = c;
  try {
    AttentionOptions options = c.BoundOptions(&lse);
    const RunExtras extras{options.sinks, options.lse, {}, {}};
    options.sinks.reset();
    options.lse.reset();
    const PageTable table{meta.KvLens(), meta.PageIndices(), meta.CuQLens(), meta.NumSeqs()};
    AttentionPlan plan;
    const bool combined = c.layout == Layout::kCombined;
    const KVPages kv{c.K(), c.V(), c.layout == Layout::kNHD ? KVLayout::kNHD : KVLayout::kHND};
    plan.Plan(combined ? ShapeOf(c.Q(), c.K()) : ShapeOf(c.Q(), kv), table, options);
    for (auto* v : {&meta.kv_lens, &meta.page_indices, &meta.cu_q_lens, &meta.num_seqs}) {
      std::fill(v->begin(), v->end(), INT32_MAX);
    }
    std::fill(meta.kv_lens64.begin(), meta.kv_lens64.end(), INT64_MAX);
    if (combined) {
      plan.Run(c.Q(), c.K(), c.OutView(out), extras);
    } else {
      plan.Run(c.Q(), kv, c.OutView(out), extras);
    }
    return false;
  } catch (const rpa::Error& e) {
    message = e.what();
    return true;
  } catch (const std::exception& e) {
    Fail(std::string("the plan path threw a non-rpa exception: ") + e.what() + "\n  " +
         c.Describe());
  }
}

// A valid case's page table in FlashInfer's CSR form, planned and run; its
// kv_indices is padded to pages_per_seq entries so that a valid
// num_kv_pages_per_block stays valid (it is checked against its length).
void RunCsr(const RaggedCase& c, Buffer& out, std::vector<float>& lse) {
  const int32_t n = c.num_seqs[0];
  std::vector<int32_t> qo(c.cu_q_lens.begin(), c.cu_q_lens.begin() + n + 1), kv_indptr = {0},
      indices, last;
  for (int32_t i = 0; i < n; ++i) {
    const int64_t pages = (int64_t{c.kv_lens[i]} + c.page_size - 1) / c.page_size;
    for (int64_t p = 0; p < pages; ++p) indices.push_back(c.page_indices[i * c.pi_row_stride + p]);
    kv_indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(pages == 0 ? 0 : static_cast<int32_t>(c.kv_lens[i] - (pages - 1) * c.page_size));
  }
  indices.resize(std::max<size_t>(indices.size(), static_cast<size_t>(c.pages_per_seq)), -1);
  AttentionOptions options = c.BoundOptions(&lse);
  const RunExtras extras{options.sinks, options.lse, {}, {}};
  options.sinks.reset();
  options.lse.reset();
  const CsrPageTable table{
      TensorView(qo.data(), DType::kI32, {n + 1}),
      TensorView(kv_indptr.data(), DType::kI32, {n + 1}),
      TensorView(indices.data(), DType::kI32, {static_cast<int64_t>(indices.size())}),
      TensorView(last.data(), DType::kI32, {n})};
  const bool combined = c.layout == Layout::kCombined;
  const KVPages kv{c.K(), c.V(), c.layout == Layout::kNHD ? KVLayout::kNHD : KVLayout::kHND};
  try {
    AttentionPlan plan;
    plan.Plan(combined ? ShapeOf(c.Q(), c.K()) : ShapeOf(c.Q(), kv), table, options);
    if (combined) {
      plan.Run(c.Q(), c.K(), c.OutView(out), extras);
    } else {
      plan.Run(c.Q(), kv, c.OutView(out), extras);
    }
  } catch (const std::exception& e) {
    Fail(std::string("the CSR form of a valid batch was rejected: ") + e.what() + "\n  " +
         c.Describe());
  }
}

// out (and lse) against the reference's, within the contract's tolerance.
std::string CompareToReference(const RaggedCase& c, const Buffer& out, const Buffer& out_ref,
                               const std::vector<float>& lse, const std::vector<float>& lse_ref) {
  const int64_t n = static_cast<int64_t>(out.bytes.size() - out.byte_offset) /
                    static_cast<int64_t>(rpa::SizeOf(out.dtype));
  std::string diff = CompareOutputs(out, out_ref, n, AbsTolerance(c), RelTolerance(c), "out");
  if (diff.empty() && c.want_lse) {
    for (size_t i = 0; i < lse.size(); ++i) {
      const double tol = 4 * AbsTolerance(c);
      if (std::memcmp(&lse[i], &lse_ref[i], sizeof(float)) != 0 &&
          !Close(lse[i], lse_ref[i], tol, tol)) {
        diff = "lse[flat " + std::to_string(i) + "] = " + std::to_string(lse[i]) +
               ", reference " + std::to_string(lse_ref[i]);
        break;
      }
    }
  }
  return diff;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const RaggedCase c = MakeRaggedCase(in);
  if (std::getenv("RPA_FUZZ_PRINT") != nullptr) std::fprintf(stderr, "%s\n", c.Describe().c_str());
  const RaggedCase before = c;  // Inputs must come back unchanged.

  Buffer out_ref = c.NewOut(), out = c.NewOut();
  const Buffer sentinel = c.NewOut();
  std::vector<float> lse_ref = c.NewLse(), lse = c.NewLse();
  const std::vector<float> lse_sentinel = c.NewLse();
  std::string ref_message, message;
  const bool ref_threw = Run(c, /*reference=*/true, out_ref, lse_ref, ref_message);
  const bool threw = Run(c, /*reference=*/false, out, lse, message);

  if (threw != c.expect_error || ref_threw != c.expect_error) {
    Fail("validation disagrees with docs/contract.md §3: model " +
         (c.expect_error ? "error (" + c.expect_reason + ")" : std::string("valid")) +
         ", library " + (threw ? "threw: " + message : "accepted") + ", reference " +
         (ref_threw ? "threw: " + ref_message : "accepted") + "\n  " + c.Describe());
  }
  if (c.q.bytes != before.q.bytes || c.k.bytes != before.k.bytes || c.v.bytes != before.v.bytes) {
    Fail("an input tensor was written\n  " + c.Describe());
  }

  Buffer out_plan = c.NewOut();
  std::vector<float> lse_plan = c.NewLse();
  std::string plan_message;
  const bool plan_threw = RunPlanned(c, out_plan, lse_plan, plan_message);
  if (plan_threw != threw) {
    Fail("plan + run disagrees with the one call: call " +
         (threw ? "threw: " + message : std::string("accepted")) + ", plan + run " +
         (plan_threw ? "threw: " + plan_message : std::string("accepted")) + "\n  " +
         c.Describe());
  }
  if (threw) {
    if (out.bytes != sentinel.bytes) Fail("out written on error: " + message + "\n  " + c.Describe());
    if (lse != lse_sentinel) Fail("lse written on error: " + message + "\n  " + c.Describe());
    if (out_plan.bytes != sentinel.bytes || lse_plan != lse_sentinel) {
      Fail("plan + run wrote on error: " + plan_message + "\n  " + c.Describe());
    }
    return 0;
  }
  if (out_plan.bytes != out.bytes ||
      std::memcmp(lse_plan.data(), lse.data(), lse.size() * sizeof(float)) != 0) {
    Fail("plan + run differs from the one call (same thread count)\n  " + c.Describe());
  }
  if (!c.sane) return 0;  // Raw options: no crash, the right errors.
  std::string diff = CompareToReference(c, out, out_ref, lse, lse_ref);
  if (!diff.empty()) Fail("result differs from the reference: " + diff + "\n  " + c.Describe());
  if (c.perturb == Perturb::kNone && c.cu_q_lens[0] == 0) {
    Buffer out_csr = c.NewOut();
    std::vector<float> lse_csr = c.NewLse();
    RunCsr(c, out_csr, lse_csr);
    diff = CompareToReference(c, out_csr, out_ref, lse_csr, lse_ref);
    if (!diff.empty()) {
      Fail("the CSR form differs from the reference: " + diff + "\n  " + c.Describe());
    }
  }
  return 0;
}
