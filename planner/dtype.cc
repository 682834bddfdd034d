#include "planner/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cairn::planner {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  absl::string_view name;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, 4, "float32"},
    {DType::kFloat64, 8, "float64"},
    {DType::kFloat16, 2, "float16"},
    {DType::kBFloat16, 2, "bfloat16"},
    {DType::kInt8, 1, "int8"},
    {DType::kUInt8, 1, "uint8"},
    {DType::kInt16, 2, "int16"},
    {DType::kInt32, 4, "int32"},
    {DType::kInt64, 8, "int64"},
    {DType::kBool, 1, "bool"},
    {DType::kFloat8E4M3, 1, "float8_e4m3fn"},
    {DType::kFloat8E5M2, 1, "float8_e5m2"},
};

const DTypeInfo* Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeInfo* info = Info(dtype);
  return info == nullptr ? 0 : info->size;
}

absl::string_view DTypeName(DType dtype) {
  if (dtype == DType::kUnspecified) return "unspecified";
  const DTypeInfo* info = Info(dtype);
  if (info != nullptr) return info->name;
  // Values outside the enum: a small fixed table keeps the view valid.
  static const auto* const kUnknown = [] {
    auto* names = new std::string[64];
    for (int i = 0; i < 64; ++i) names[i] = absl::StrCat("dtype(", i, ")");
    return names;
  }();
  int v = static_cast<int>(dtype);
  if (v >= 0 && v < 64) return kUnknown[v];
  return "dtype(?)";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  struct Alias {
    absl::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float", DType::kFloat32},
      {"double", DType::kFloat64},
      {"half", DType::kFloat16},
      {"long", DType::kInt64},
      {"int", DType::kInt32},
      {"short", DType::kInt16},
      {"float8_e4m3", DType::kFloat8E4M3},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

}  // namespace cairn::planner
