#include "common/logging.h"

#include <grpc/support/log.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/grpc_logging.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/base_sink.h"

namespace cairn {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}
};

// Keeps whole formatted lines (what would reach stderr).
class FormattedSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    lines.emplace_back(buf.data(), buf.size());
  }
  void flush_() override {}
};

TEST(LoggingTest, RejectsUnknownLevelByName) {
  absl::Status s = SetLogLevel("loud");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
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

TEST(LoggingTest, JsonFormatIsOneParsableObjectPerLine) {
  auto sink = std::make_shared<FormattedSink>();
  Logger().sinks().push_back(sink);
  ASSERT_TRUE(SetLogFormat("json").ok());
  const std::string tricky =
      "quote \" backslash \\ newline\n tab\t bell\a ünïcödé";
  CAIRN_LOG(warn, "job {} rank {}: {}", "llama", 3, tricky);
  ASSERT_TRUE(SetLogFormat("text").ok());
  CAIRN_LOG(warn, "back to text");
  Logger().sinks().pop_back();
  ASSERT_EQ(sink->lines.size(), 2u);
  std::string line = sink->lines[0];
  ASSERT_EQ(line.back(), '\n');
  line.pop_back();
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;  // one line
  nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["logger"], "cairn");
  EXPECT_EQ(j["msg"], "job llama rank 3: " + tricky);
  EXPECT_EQ(j["job"], "llama");  // the message's job and rank as fields
  EXPECT_EQ(j["rank"], 3);
  EXPECT_FALSE(j.contains("step"));
  EXPECT_TRUE(j["thread"].is_number());
  const std::string time = j["time"];
  EXPECT_EQ(time.size(), 24u) << time;  // 2026-11-24T10:00:00.123Z
  EXPECT_EQ(time.back(), 'Z');
  EXPECT_EQ(sink->lines[1].front(), '2');  // text: starts with the date
  EXPECT_THAT(sink->lines[1], ::testing::HasSubstr("] back to text"));
  EXPECT_THAT(SetLogFormat("xml"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LoggingTest, JsonEscapeControlCharacters) {
  EXPECT_EQ(JsonEscape(std::string("a\x01"
                                   "b\x1f",
                                   4)),
            "a\\u0001b\\u001f");
  EXPECT_EQ(JsonEscape("\"\\"), "\\\"\\\\");
}

TEST(LoggingTest, GrpcLogLinesGoThroughCairnsLogger) {
  auto sink = std::make_shared<CaptureSink>();
  Logger().sinks().push_back(sink);
  RouteGrpcLogsToCairnLogger();
  gpr_log(GPR_ERROR, "connection to %s failed", "peer-7");
  gpr_log(GPR_INFO, "chatty info");  // debug: below the default level
  Logger().sinks().pop_back();
  ASSERT_EQ(sink->lines.size(), 1u);
  EXPECT_THAT(sink->lines[0], ::testing::HasSubstr("grpc "));
  EXPECT_THAT(sink->lines[0],
              ::testing::HasSubstr("connection to peer-7 failed"));
}

}  // namespace
TEST(LoggingTest, ExtractLogFieldsReadsJobStepRankNode) {
  LogFields f =
      ExtractLogFields("job 'llama 7b' step 1200 rank 3/8: load refused");
  EXPECT_EQ(f.job, "llama 7b");
  EXPECT_EQ(f.step, 1200);
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.node, std::nullopt);
  f = ExtractLogFields("node 2: peer node 5 unavailable for job demo: EOF");
  EXPECT_EQ(f.node, 2);  // the first one
  EXPECT_EQ(f.job, "demo");
  // Words inside other words and words without a value are not fields.
  f = ExtractLogFields("subjob x, restep 4, ranks 2, job : step x");
  EXPECT_EQ(f.job, std::nullopt);
  EXPECT_EQ(f.step, std::nullopt);
  EXPECT_EQ(f.rank, std::nullopt);
  f = ExtractLogFields("job 'unterminated step 9");
  EXPECT_EQ(f.job, std::nullopt);
  EXPECT_EQ(f.step, 9);
  // A number too long for int64 is not a field.
  f = ExtractLogFields("step 99999999999999999999999");
  EXPECT_EQ(f.step, std::nullopt);
}

}  // namespace cairn
