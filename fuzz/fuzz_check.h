// FUZZ_CHECK: an invariant of the code under fuzzing. A violation prints the
// condition and aborts, so libFuzzer reports it as a crash and saves the
// input (unlike assert, it is never compiled out).
#ifndef CAIRN_FUZZ_FUZZ_CHECK_H_
#define CAIRN_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                          \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, \
                   __LINE__, #cond);                                   \
      std::fprintf(stderr, __VA_ARGS__);                               \
      std::fprintf(stderr, "\n");                                      \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

#endif  // CAIRN_FUZZ_FUZZ_CHECK_H_
