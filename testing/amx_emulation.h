// The AMX tile programs on a scalar model of the tiles, so the AMX paths
// are tested on CPUs without AMX (any CPU with AVX-512 BF16, which the
// programs' glue needs): the model (EmuTiles), amx.h's products on either
// tile unit, and the AMX prefill kernel on the model, which dispatch runs
// under a ScopedAmxEmulation. Not part of librpa.
#ifndef RPA_TESTING_AMX_EMULATION_H_
#define RPA_TESTING_AMX_EMULATION_H_

#include <cstdint>

#if defined(__x86_64__)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernel/amx.h"
#include "kernel/amx_tile_programs.h"
#endif

namespace rpa::testing {

// For this object's lifetime on the constructing thread, dispatch runs the
// AMX prefill kernel and MLA's AMX kernel on the tile model where the CPU
// has AVX-512 BF16 (CpuFeatures::amx_bf16 and amx_emulated): "amx_prefill
// (emulated)" joins the kernel list (InstallTestKernelRecord) and "mla_amx
// (emulated)" MLA's dispatch (InstallTestMlaAmxKernel) on the first one.
// Nested scopes restore what they found.
class ScopedAmxEmulation {
 public:
  ScopedAmxEmulation();
  ~ScopedAmxEmulation();
  ScopedAmxEmulation(const ScopedAmxEmulation&) = delete;
  ScopedAmxEmulation& operator=(const ScopedAmxEmulation&) = delete;

 private:
  bool saved_;
};

#if defined(__x86_64__)

// Which tile unit runs the products: the hardware's tiles (only where
// internal::AmxSupport().usable), or the model.
enum class AmxBackend : uint8_t { kHardware, kEmulated };

// amx.h's products on either unit.
void AmxLogits(const internal::AmxLogitsArgs& args, AmxBackend backend);
void AmxPvBf16(const internal::AmxPvBf16Args& args, AmxBackend backend);

// A scalar model of the AMX tiles, per thread: a tile unit for
// amx_tile_programs.h. tdpbf16ps as the SDM writes it: for each C element,
// two exact bf16 products added in turn per pair, denormal inputs as zero,
// denormal results flushed; a configuration that does not fit the operands
// aborts (the hardware raises #UD).
struct EmuTiles {
  using TileConfig = internal::amx::TileConfig;

  struct State {
    TileConfig config;
    bool configured = false;
    alignas(64) uint8_t tile[8][1024];
  };
  static inline thread_local int config_id = 0;
  static State& S() {
    static thread_local State state;
    return state;
  }
  [[noreturn]] static void Fail(const char* what) {
    std::fprintf(stderr, "EmuTiles: %s\n", what);
    std::abort();
  }
  static void Configure(int id, const TileConfig& config) {
    if (config_id == id) return;
    S().config = config;
    S().configured = true;
    std::memset(S().tile, 0, sizeof(S().tile));
    config_id = id;
  }
  template <int kT>
  static void Load(const void* base, int64_t stride_bytes) {
    State& s = S();
    if (!s.configured || s.config.rows[kT] == 0) Fail("tileloadd on an unconfigured tile");
    std::memset(s.tile[kT], 0, 1024);
    for (int r = 0; r < s.config.rows[kT]; ++r) {
      std::memcpy(s.tile[kT] + 64 * r, static_cast<const uint8_t*>(base) + r * stride_bytes,
                  s.config.colsb[kT]);
    }
  }
  template <int kT>
  static void Store(void* base, int64_t stride_bytes) {
    State& s = S();
    if (!s.configured || s.config.rows[kT] == 0) Fail("tilestored of an unconfigured tile");
    for (int r = 0; r < s.config.rows[kT]; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + r * stride_bytes, s.tile[kT] + 64 * r,
                  s.config.colsb[kT]);
    }
  }
  template <int kT>
  static void Zero() {
    std::memset(S().tile[kT], 0, 1024);
  }
  static float Bf16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    if ((h & 0x7F80) == 0) h &= 0x8000;  // DAZ.
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  template <int kC, int kA, int kB>
  static void Dp() {
    State& s = S();
    const TileConfig& c = s.config;
    const int m_rows = c.rows[kC], pairs = c.colsb[kA] / 4, cols = c.colsb[kC] / 4;
    const bool fits = s.configured && m_rows > 0 && pairs > 0 && cols > 0 &&
                      c.rows[kA] == m_rows && c.rows[kB] == pairs && c.colsb[kB] == c.colsb[kC];
    if (!fits) {
      Fail("tdpbf16ps operands do not fit the configuration");
    }
    for (int m = 0; m < m_rows; ++m) {
      for (int n = 0; n < cols; ++n) {
        float acc;
        std::memcpy(&acc, s.tile[kC] + 64 * m + 4 * n, 4);
        for (int k = 0; k < pairs; ++k) {
          const uint8_t* a = s.tile[kA] + 64 * m + 4 * k;
          const uint8_t* b = s.tile[kB] + 64 * k + 4 * n;
          acc += Bf16(a) * Bf16(b);
          acc += Bf16(a + 2) * Bf16(b + 2);
        }
        if (std::fpclassify(acc) == FP_SUBNORMAL) acc = std::copysign(0.0f, acc);  // FTZ.
        std::memcpy(s.tile[kC] + 64 * m + 4 * n, &acc, 4);
      }
    }
  }
};

#endif  // __x86_64__

}  // namespace rpa::testing

#endif  // RPA_TESTING_AMX_EMULATION_H_
