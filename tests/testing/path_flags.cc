#include "tests/testing/path_flags.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace cairn::testing {

void ParsePathFlags(int argc, char** argv,
                    std::initializer_list<PathFlag> flags) {
  for (int i = 1; i < argc; ++i) {
    for (const PathFlag& flag : flags) {
      absl::string_view a = argv[i];
      if (absl::ConsumePrefix(&a, absl::StrCat("--", flag.name, "="))) {
        *flag.value = std::string(a);
      }
    }
  }
}

}  // namespace cairn::testing
