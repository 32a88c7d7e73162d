// libFuzzer target: ragged_paged_attention (combined, NHD and HND) over
// fuzzer-chosen metadata and options on small tensors. Oracle: the call
// throws rpa::Error exactly when the independent model of docs/contract.md §3 says so,
// leaving out and lse bit-identical; otherwise it matches the reference
// (within docs/contract.md §1's tolerance, or NaN for NaN in nan_mode). Inputs are never
// written. Anything else aborts.
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "ragged_case.h"
#include "rpa/error.h"

using namespace rpa::fuzz;  // NOLINT: a fuzzer's one file.

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
  if (threw) {
    if (out.bytes != sentinel.bytes) Fail("out written on error: " + message + "\n  " + c.Describe());
    if (lse != lse_sentinel) Fail("lse written on error: " + message + "\n  " + c.Describe());
    return 0;
  }
  if (!c.sane) return 0;  // Raw options: no crash, the right errors.
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
  if (!diff.empty()) Fail("result differs from the reference: " + diff + "\n  " + c.Describe());
  return 0;
}
