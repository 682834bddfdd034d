// Status propagation macros. Abseil 20220623 ships none, so Cairn defines the
// two that TensorStore and Abseil's later releases use, and Annotate, which
// says what the caller was doing when an error passes up through it.
//
// Example:
//   absl::StatusOr<Manifest> LoadManifest(ShardStore& store, std::string_view
//   key) {
//     CAIRN_ASSIGN_OR_RETURN(std::string bytes, ReadAll(store, key));
//     CAIRN_RETURN_IF_ERROR(CheckSize(bytes));
//     return DecodeManifest(bytes);
//   }
#ifndef CAIRN_COMMON_STATUS_MACROS_H_
#define CAIRN_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// Evaluates `expr` (an absl::Status) once; returns it from the enclosing
// function when it is not OK.
#define CAIRN_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status _cairn_status = (expr);         \
    if (ABSL_PREDICT_FALSE(!_cairn_status.ok())) { \
      return _cairn_status;                        \
    }                                              \
  } while (0)

#define CAIRN_STATUS_MACROS_CONCAT_INNER_(x, y) x##y
#define CAIRN_STATUS_MACROS_CONCAT_(x, y) \
  CAIRN_STATUS_MACROS_CONCAT_INNER_(x, y)

// Evaluates `rexpr` (an absl::StatusOr<T>) once; on error returns its status,
// otherwise moves the value into `lhs`, which may be a declaration:
//   CAIRN_ASSIGN_OR_RETURN(auto store, OpenShardStore(uri));
//   CAIRN_ASSIGN_OR_RETURN(existing_var, Compute());
#define CAIRN_ASSIGN_OR_RETURN(lhs, rexpr) \
  CAIRN_ASSIGN_OR_RETURN_IMPL_(            \
      CAIRN_STATUS_MACROS_CONCAT_(_cairn_statusor_, __LINE__), lhs, rexpr)

#define CAIRN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                \
    return std::move(statusor).status();                   \
  }                                                        \
  lhs = std::move(statusor).value()

namespace cairn {

// `status` with "<prefix>: " before its message, its code (and payloads)
// kept; OK stays OK.
//
// Example:
//   if (absl::Status s = store.Delete(key); !s.ok()) {
//     return Annotate(s, absl::StrCat("deleting the manifest of job '", job,
//                                     "' step ", step));
//   }
//   // NOT_FOUND: deleting the manifest of job 'llama' step 7: no such key
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(),
                         absl::StrCat(prefix, ": ", status.message()));
  status.ForEachPayload(
      [&annotated](absl::string_view type_url, const absl::Cord& payload) {
        annotated.SetPayload(type_url, payload);
      });
  return annotated;
}

}  // namespace cairn

#endif  // CAIRN_COMMON_STATUS_MACROS_H_
