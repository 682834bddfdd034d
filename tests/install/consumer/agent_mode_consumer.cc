// Agent mode from an out-of-tree program: links cairn::agent_client and
// includes <cairn/client/agent/agent_checkpointer.h>
// (tests/install/install_test.py builds it; linking is the check).
//   agent_mode_consumer SOCKET   connects to the cairn-agent at SOCKET
#include <cairn/client/agent/agent_checkpointer.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) return 0;
  cairn::client::AgentCheckpointerOptions options;
  options.agent_socket = argv[1];
  options.direct.coordinator = "127.0.0.1:1";
  options.direct.job = "install-consumer";
  auto ckpt = cairn::client::AgentCheckpointer::Connect(options);
  std::printf("%s\n",
              ckpt.ok() ? "connected" : ckpt.status().ToString().c_str());
  return ckpt.ok() ? 0 : 1;
}
