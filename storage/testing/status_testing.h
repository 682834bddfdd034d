// Test helper: asserts a status's code and a substring of its message.
//
// Example:
//   EXPECT_STATUS(store.Delete("x"), kNotFound, "'x'");
#ifndef CAIRN_STORAGE_TESTING_STATUS_TESTING_H_
#define CAIRN_STORAGE_TESTING_STATUS_TESTING_H_

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#define EXPECT_STATUS(expr, status_code, substr)                             \
  do {                                                                       \
    const ::absl::Status _cairn_s = (expr);                                  \
    EXPECT_EQ(_cairn_s.code(), ::absl::StatusCode::status_code) << _cairn_s; \
    EXPECT_THAT(std::string(_cairn_s.message()),                             \
                ::testing::HasSubstr(substr));                               \
  } while (0)

#endif  // CAIRN_STORAGE_TESTING_STATUS_TESTING_H_
