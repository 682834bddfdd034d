// Fixed-width little-endian integers in byte buffers: the byte order of the
// binary formats Cairn defines (the MANIFEST's frame header, the TCP and NCCL
// transports' frames, plan-cache keys), the same bytes whatever the host's
// order. Over Abseil's absl::little_endian, whose header is internal to
// Abseil: included here only.
//
// Example:
//   char header[16];
//   little_endian::Store32(header, kMagic);
//   little_endian::Store64(header + 8, length);
//   ...
//   if (little_endian::Load32(header) != kMagic) return Corrupt();
#ifndef CAIRN_COMMON_LITTLE_ENDIAN_H_
#define CAIRN_COMMON_LITTLE_ENDIAN_H_

#include <cstdint>
#include <string>

#include "absl/base/internal/endian.h"

namespace cairn::little_endian {

// The 4 or 8 bytes at `p` (any alignment).
inline void Store32(void* p, uint32_t v) { absl::little_endian::Store32(p, v); }
inline void Store64(void* p, uint64_t v) { absl::little_endian::Store64(p, v); }
inline uint32_t Load32(const void* p) { return absl::little_endian::Load32(p); }
inline uint64_t Load64(const void* p) { return absl::little_endian::Load64(p); }

// Appends the 4 or 8 bytes of `v` to *out.
inline void Append32(std::string* out, uint32_t v) {
  char b[4];
  Store32(b, v);
  out->append(b, sizeof(b));
}
inline void Append64(std::string* out, uint64_t v) {
  char b[8];
  Store64(b, v);
  out->append(b, sizeof(b));
}

}  // namespace cairn::little_endian

#endif  // CAIRN_COMMON_LITTLE_ENDIAN_H_
