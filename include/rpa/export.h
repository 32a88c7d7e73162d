// RPA_EXPORT marks the public API. The library is compiled with hidden
// visibility (CMake's CXX_VISIBILITY_PRESET hidden), so a shared librpa.so
// exports what carries this mark and nothing of rpa::internal.
#ifndef RPA_EXPORT_H_
#define RPA_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define RPA_EXPORT __attribute__((visibility("default")))
#else
#define RPA_EXPORT
#endif

#endif  // RPA_EXPORT_H_
