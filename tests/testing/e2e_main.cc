// The main of every end-to-end test (tests/*_test.cc): gtest's, with the
// paths of the binaries the tests run (e2e_harness.h's Binaries()).
#include <utility>

#include "gtest/gtest.h"
#include "tests/testing/e2e_harness.h"

#ifndef CAIRN_CAIRND_PATH
#define CAIRN_CAIRND_PATH ""
#endif
#ifndef CAIRN_AGENT_PATH
#define CAIRN_AGENT_PATH ""
#endif
#ifndef CAIRN_AGENT_RANK_PATH
#define CAIRN_AGENT_RANK_PATH ""
#endif
#ifndef CAIRN_RANK_PATH
#define CAIRN_RANK_PATH ""
#endif
#ifndef CAIRN_CLI_PATH
#define CAIRN_CLI_PATH ""
#endif
#ifndef CAIRN_MAKE_CERTS_PATH
#define CAIRN_MAKE_CERTS_PATH ""
#endif

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  cairn::testing::BinaryPaths paths;
  paths.cairnd = CAIRN_CAIRND_PATH;
  paths.agent = CAIRN_AGENT_PATH;
  paths.agent_rank = CAIRN_AGENT_RANK_PATH;
  paths.rank = CAIRN_RANK_PATH;
  paths.cli = CAIRN_CLI_PATH;
  paths.make_certs = CAIRN_MAKE_CERTS_PATH;
  cairn::testing::SetBinaries(std::move(paths), argc, argv);
  return RUN_ALL_TESTS();
}
