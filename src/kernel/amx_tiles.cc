// The AMX products on the hardware's tiles (amx.h): amx_tile_programs.h's
// programs over HwTiles.
#include "kernel/amx.h"

#include "kernel/cpu_features.h"
#include "threads/worker_idle_hooks.h"

#if defined(__x86_64__)
#include "kernel/amx_tile_programs.h"
#endif

namespace rpa::internal {

// Detection lives with every other CPU feature (cpu_features.cc).
const AmxStatus& AmxSupport() {
  static const AmxStatus status{DetectedCpuFeatures().amx_bf16, AmxDetection()};
  return status;
}

#if defined(__x86_64__)

void AmxLogits(const AmxLogitsArgs& args) { amx::LogitsProgram<amx::HwTiles>(args); }

void AmxPvBf16(const AmxPvBf16Args& args) { amx::PvProgram<amx::HwTiles>(args); }

void AmxReleaseTiles() {
  // Only a thread that loaded tiles.
  if (amx::HwTiles::config_id != 0) amx::HwTiles::Release();
}

namespace {

// A pool thread gives its tiles back when its share of a ParallelFor is done
// (threads/worker_idle_hooks.h), so idle threads carry no tile state and the
// next call reloads the configuration.
struct ReleaseTilesWhenIdle {
  ReleaseTilesWhenIdle() { AddWorkerIdleHook(&AmxReleaseTiles); }
} release_tiles_when_idle;

}  // namespace

#endif  // defined(__x86_64__)

}  // namespace rpa::internal
