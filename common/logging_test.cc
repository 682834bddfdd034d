#include "common/logging.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "spdlog/sinks/base_sink.h"

namespace cairn {
namespace {

class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}
};

TEST(LoggingTest, RejectsUnknownLevelByName) {
  absl::Status s = SetLogLevel("loud");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("loud"), absl::string_view::npos);
}

TEST(LoggingTest, LevelFiltersMessages) {
  auto sink = std::make_shared<CaptureSink>();
  Logger().sinks().push_back(sink);
  ASSERT_TRUE(SetLogLevel("warn").ok());
  CAIRN_LOG(info, "hidden {}", 1);
  CAIRN_LOG(warn, "job {} step {} aborted", "llama", 7);
  ASSERT_TRUE(SetLogLevel("debug").ok());
  CAIRN_LOG(debug, "visible {}", 2);
  Logger().sinks().pop_back();
  ASSERT_TRUE(SetLogLevel("info").ok());
  ASSERT_EQ(sink->lines.size(), 2u);
  EXPECT_EQ(sink->lines[0], "job llama step 7 aborted");
  EXPECT_EQ(sink->lines[1], "visible 2");
}

}  // namespace
}  // namespace cairn
