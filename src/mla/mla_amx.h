// The MLA kernel on AMX tiles (mla_amx.cc has the arithmetic), written once
// over a tile unit as amx_prefill is (amx_prefill.h): librpa's instance runs
// on the hardware's tiles (kMlaAmx, mla_kernel.h), testing/'s on the scalar
// tile model (testing/amx_emulation.h). x86-64 only.
#ifndef RPA_SRC_MLA_MLA_AMX_H_
#define RPA_SRC_MLA_MLA_AMX_H_

#include "mla/mla_kernel.h"

#if defined(__x86_64__)
#include "kernel/amx.h"

namespace rpa::internal::mla_amx {

// The steps that do not touch the tiles (mla_amx.cc).
void PrepareQ(const MlaKernelArgs& args);
MlaTile PrepareTile(const MlaKernelArgs& args, const MlaTile& rows);
// The logits' product: the prepared keys as A, q's pairs as B, into st.
AmxLogitsArgs LogitsArgs(const MlaKernelArgs& args, const MlaTile& tile);
// Packs the tile's values and transposes the weights into bf16 rows; the
// PV product's arguments over them.
AmxPvBf16Args PvArgs(const MlaKernelArgs& args, const MlaTile& tile);

// Unit: static Logits(const AmxLogitsArgs&), PvBf16(const AmxPvBf16Args&)
// and kName, the kernel's name.
template <class Unit>
void Logits(const MlaKernelArgs& args, const MlaTile& tile) {
  Unit::Logits(LogitsArgs(args, tile));
}
template <class Unit>
void Pv(const MlaKernelArgs& args, const MlaTile& tile) {
  Unit::PvBf16(PvArgs(args, tile));
}
template <class Unit>
inline constexpr MlaKernel kKernelOn = {Unit::kName, /*e4m3_scaled=*/false,
                                        NextTilePrefetch::kNone, PrepareQ,
                                        PrepareTile, Logits<Unit>, Pv<Unit>};

}  // namespace rpa::internal::mla_amx
#endif  // __x86_64__

#endif  // RPA_SRC_MLA_MLA_AMX_H_
