// Element types of checkpointed tensors. The numeric values equal
// cairn.v1.DType's so the coordinator converts with a static_cast.
#ifndef CAIRN_PLANNER_DTYPE_H_
#define CAIRN_PLANNER_DTYPE_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cairn::planner {

enum class DType : int {
  kUnspecified = 0,
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kBool = 10,
  kFloat8E4M3 = 11,
  kFloat8E5M2 = 12,
};

// Bytes per element; 0 for kUnspecified and for values outside the enum.
size_t DTypeSize(DType dtype);

// PyTorch-style lower-case name: "float32", "bfloat16", "float8_e4m3fn", ...
// "unspecified" for kUnspecified, "dtype(<n>)" for values outside the enum.
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName (also accepts the aliases "float", "double", "half",
// "long", "int", "float8_e4m3"). INVALID_ARGUMENT naming `name` otherwise;
// "unspecified" is rejected too.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_DTYPE_H_
