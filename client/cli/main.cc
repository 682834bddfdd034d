// cairn: the Cairn operator CLI. See client/cli/cli.h.
#include <iostream>

#include "client/cli/cli.h"

int main(int argc, char** argv) {
  return cairn::cli::RunCli(argc, argv, std::cout, std::cerr);
}
