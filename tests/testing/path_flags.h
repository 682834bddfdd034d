// How the end-to-end tests find the binaries and scripts they run: CMake
// compiles the paths in (CAIRN_*_PATH defines); Bazel, whose binaries live in
// runfiles, passes them as --NAME=PATH arguments, which win.
#ifndef CAIRN_TESTS_TESTING_PATH_FLAGS_H_
#define CAIRN_TESTS_TESTING_PATH_FLAGS_H_

#include <initializer_list>
#include <string>

namespace cairn::testing {

struct PathFlag {
  const char* name;    // "cairnd" for --cairnd=PATH
  std::string* value;  // set when the argument is given
};

// Sets *flag.value for every argument "--<flag.name>=PATH" in argv[1, argc).
// Call after ::testing::InitGoogleTest, which removes gtest's own flags.
void ParsePathFlags(int argc, char** argv,
                    std::initializer_list<PathFlag> flags);

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_PATH_FLAGS_H_
