// The daemons' Prometheus metrics, end to end with REAL processes: cairnd
// and two cairn-agents (replicating to each other) with --metrics-listen
// 127.0.0.1:0, ranks saving through the agents (cairn_agent_rank) and
// loading directly (cairn_train_example).
//
//   * /metrics of each daemon is scraped over HTTP after a save and a load,
//     and the counters moved by exactly what the test did: bytes saved equal
//     the committed checkpoints' bytes, one commit per save, RPC counts by
//     method, the agents' persisted bytes add up to the committed bytes and
//     each agent's replicated bytes equal what its peer persisted;
//   * `promtool check metrics` (Debian's prometheus package) accepts both
//     daemons' real scrapes;
//   * a real Prometheus server scrapes cairnd and the agents during a save,
//     and its query API returns the bytes saved.
//
// promtool and prometheus come from --promtool=, --prometheus=, else /usr/bin
// (tests/testing/e2e_harness.h). A missing promtool or prometheus fails the
// test (scripts/install_deps.sh installs them).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/e2e_harness.h"
#include "tests/testing/grpc_probe.h"

namespace cairn {
namespace {

using ::testing::HasSubstr;

using testing::Binaries;

constexpr char kJob[] = "metrics";
constexpr char kLayout[] = "2x2:S0,S1";
constexpr int kWorld = 4;  // ranks 0,1 on node 0; ranks 2,3 on node 1

// A scrape: series (name with its labels, as rendered) -> value.
using Scrape = std::map<std::string, double>;

Scrape ParseScrape(const std::string& text) {
  Scrape out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space == line.npos) continue;
    std::string value(line.substr(space + 1));
    if (value == "+Inf") {
      v = INFINITY;
    } else if (!absl::SimpleAtod(value, &v)) {
      continue;
    }
    out[std::string(line.substr(0, space))] = v;
  }
  return out;
}

// Reads an integer written by a daemon (port files).
int ReadPort(const std::string& path) {
  int port = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(testing::ReadFile(path)),
                          &port)
             ? port
             : 0;
}

class MetricsE2ETest : public testing::EndToEndTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(EndToEndTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(CreateStorage());
    const std::string port_file = dir_ + "/cairnd.metrics-port";
    ASSERT_NO_FATAL_FAILURE(StartCairnd(
        {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file", port_file}));
    // cairnd writes the metrics port before its --port-file.
    cairnd_metrics_port_ = ReadPort(port_file);
    ASSERT_GT(cairnd_metrics_port_, 0) << cairnd_->process().Log();
    for (int node = 0; node < 2; ++node) {
      ASSERT_NO_FATAL_FAILURE(StartAgent(node));
    }
  }
  void TearDown() override {
    prometheus_.reset();
    for (auto& a : agents_) a.reset();
    EndToEndTest::TearDown();
  }

  std::string Socket(int node) const {
    return testing::SocketPath(absl::StrCat("metrics-", node));
  }

  void StartAgent(int node) {
    const std::string port_file =
        absl::StrCat(dir_, "/agent-", node, ".metrics-port");
    const std::string token = dir_ + "/peer-token";
    if (!std::filesystem::exists(token)) {
      std::ofstream(token) << "metrics-e2e-token-" << getpid() << "\n";
    }
    ASSERT_NO_FATAL_FAILURE(StartCairnAgent({"--node-id",
                                             std::to_string(node),
                                             "--listen-unix",
                                             Socket(node),
                                             "--peer-listen",
                                             "127.0.0.1:0",
                                             "--peer-dir",
                                             dir_ + "/peers",
                                             "--num-nodes",
                                             "2",
                                             "--coordinator",
                                             cairnd_->address(),
                                             "--replicas",
                                             "1",
                                             "--staging-budget-mib",
                                             "64",
                                             "--peer-token-file",
                                             token,
                                             "--metrics-listen",
                                             "127.0.0.1:0",
                                             "--metrics-port-file",
                                             port_file},
                                            absl::StrCat("agent-", node),
                                            &agents_[node], nullptr,
                                            absl::Seconds(20)));
    // The metrics port file is written before the ready file.
    agent_metrics_port_[node] = ReadPort(port_file);
    ASSERT_GT(agent_metrics_port_[node], 0) << agents_[node]->Log();
  }

  // GET /metrics of the daemon on `port`: the body (checked to be served
  // with the exposition format's content type).
  std::string ScrapeText(int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    httplib::Result r = client.Get("/metrics");
    EXPECT_TRUE(r) << "GET 127.0.0.1:" << port
                   << "/metrics: " << httplib::to_string(r.error());
    if (!r) return "";
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4");
    return r->body;
  }

  // The value of `series` in `scrape`; a missing series fails the test.
  static double Value(const Scrape& scrape, const std::string& series) {
    auto it = scrape.find(series);
    EXPECT_NE(it, scrape.end()) << "no series " << series;
    return it == scrape.end() ? NAN : it->second;
  }

  // Runs one command per rank; returns exit codes; their stdout lines that
  // are JSON objects are appended to `json_`.
  std::vector<int> RunRanks(
      const std::vector<std::vector<std::string>>& argvs) {
    std::vector<int> codes = RunAll(argvs, absl::Minutes(2));
    logs_.clear();
    for (size_t r = 0; r < codes.size(); ++r) {
      for (absl::string_view line : absl::StrSplit(RankLog(r), '\n')) {
        if (line.empty()) continue;
        absl::StrAppend(&logs_, "rank ", r, ": ", line, "\n");
        if (line[0] == '{') {
          json_.push_back(
              nlohmann::json::parse(std::string(line), nullptr, false));
        }
      }
    }
    return codes;
  }

  // Every rank saves `step` through its node's agent and waits for the
  // commit.
  void SaveThroughAgents(int64_t step) {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < kWorld; ++r) {
      argvs.push_back(
          AgentRankArgv(Socket(r / 2), kJob, r, kWorld, kLayout,
                        {"--save-step", std::to_string(step), "--json"}));
    }
    json_.clear();
    std::vector<int> codes = RunRanks(argvs);
    EXPECT_THAT(codes, ::testing::Each(0)) << logs_;
    int committed = 0;
    for (const nlohmann::json& j : json_) {
      if (j.is_object() && j.value("op", "") == "committed") ++committed;
    }
    EXPECT_EQ(committed, kWorld) << logs_;
  }

  // Three ranks load `latest` directly from storage into another layout;
  // returns the bytes they report loading.
  uint64_t LoadDirect() {
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < 3; ++r) {
      argvs.push_back(
          RankArgv(kJob, r, 3, "3:S1", {"--load", "latest", "--json"}));
    }
    json_.clear();
    std::vector<int> codes = RunRanks(argvs);
    EXPECT_THAT(codes, ::testing::Each(0)) << logs_;
    uint64_t bytes = 0;
    int loaded = 0;
    for (const nlohmann::json& j : json_) {
      if (j.is_object() && j.value("op", "") == "load") {
        bytes += j["bytes"].get<uint64_t>();
        ++loaded;
      }
    }
    EXPECT_EQ(loaded, 3) << logs_;
    return bytes;
  }

  // The committed records of the job, by step.
  std::map<int64_t, v1::CheckpointRecord> Committed() {
    v1::ListCheckpointsRequest req;
    req.set_job(kJob);
    v1::ListCheckpointsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    grpc::Status s = Stub()->ListCheckpoints(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::map<int64_t, v1::CheckpointRecord> out;
    for (const auto& c : resp.checkpoints()) out[c.step()] = c;
    return out;
  }

  // `promtool check metrics` on `text`; fails the test with promtool's
  // complaints.
  void ExpectPromtoolAccepts(const std::string& text, const std::string& who) {
    ASSERT_TRUE(std::filesystem::exists(Binaries().promtool))
        << Binaries().promtool
        << " is missing: install Debian's prometheus package "
           "(scripts/install_deps.sh)";
    const std::string file = absl::StrCat(dir_, "/", who, ".prom");
    std::ofstream(file) << text;
    auto p = testing::Subprocess::Start(
        {"/bin/sh", "-c",
         absl::StrCat("exec '", Binaries().promtool, "' check metrics < '",
                      file, "'")},
        absl::StrCat(dir_, "/promtool-", who, ".log"));
    ASSERT_TRUE(p.ok()) << p.status();
    absl::StatusOr<int> code = p->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << "promtool check metrics rejected " << who
                        << "'s scrape:\n"
                        << p->Log();
  }

  std::unique_ptr<testing::Subprocess> agents_[2];
  std::unique_ptr<testing::Subprocess> prometheus_;
  int cairnd_metrics_port_ = 0;
  int agent_metrics_port_[2] = {0, 0};
  std::string logs_;
  std::vector<nlohmann::json> json_;
};

std::string Rpc(const std::string& service, const std::string& method,
                const std::string& code) {
  return absl::StrCat("cairn_rpcs_total{service=\"cairn.v1.", service,
                      "\",method=\"", method, "\",code=\"", code, "\"}");
}

TEST_F(MetricsE2ETest, CountersMoveByWhatTwoSavesAndALoadDid) {
  // Nothing happened yet: the counters are there, at zero.
  const Scrape before = ParseScrape(ScrapeText(cairnd_metrics_port_));
  EXPECT_EQ(Value(before, "cairn_bytes_saved_total"), 0);
  EXPECT_EQ(Value(before, "cairn_saves_committed_total"), 0);
  EXPECT_EQ(Value(before, "cairn_catalog_entries"), 0);

  SaveThroughAgents(1);
  SaveThroughAgents(2);
  const uint64_t loaded = LoadDirect();
  std::map<int64_t, v1::CheckpointRecord> committed = Committed();
  ASSERT_EQ(committed.size(), 2u);
  const uint64_t total1 = committed[1].total_bytes();
  const uint64_t total2 = committed[2].total_bytes();
  ASSERT_GT(total1, 0u);

  const std::string cairnd_text = ScrapeText(cairnd_metrics_port_);
  const Scrape c = ParseScrape(cairnd_text);
  EXPECT_EQ(Value(c, "cairn_bytes_saved_total"), total1 + total2);
  EXPECT_EQ(Value(c, "cairn_saves_committed_total"), 2);
  EXPECT_EQ(Value(c, "cairn_save_duration_seconds_count"), 2);
  EXPECT_EQ(Value(c, "cairn_commit_duration_seconds_count"), 2);
  EXPECT_EQ(Value(c, "cairn_commit_duration_seconds_bucket{le=\"+Inf\"}"), 2);
  EXPECT_GT(Value(c, "cairn_save_duration_seconds_sum"), 0);
  // The second save's plan came from the plan cache (same ranks, same
  // layout).
  EXPECT_EQ(Value(c, "cairn_plan_cache_misses_total{cache=\"save\"}"), 1);
  EXPECT_EQ(Value(c, "cairn_plan_cache_hits_total{cache=\"save\"}"), 1);
  EXPECT_EQ(Value(c, "cairn_bytes_loaded_total"), loaded);
  EXPECT_EQ(Value(c, "cairn_load_plan_duration_seconds_count"), 3);
  EXPECT_EQ(Value(c, Rpc("Coordinator", "BeginSave", "OK")), 2 * kWorld);
  EXPECT_EQ(Value(c, Rpc("Coordinator", "CommitSave", "OK")), 2 * kWorld);
  EXPECT_EQ(Value(c, Rpc("Coordinator", "PlanLoad", "OK")), 3);
  EXPECT_EQ(Value(c,
                  "cairn_rpc_duration_seconds_count{service=\"cairn.v1."
                  "Coordinator\",method=\"BeginSave\"}"),
            2 * kWorld);
  EXPECT_EQ(Value(c, "cairn_saves_in_progress"), 0);
  EXPECT_EQ(Value(c, "cairn_oldest_inflight_save_age_seconds"), 0);
  EXPECT_EQ(Value(c, "cairn_catalog_entries"), 2);
  EXPECT_EQ(Value(c, "cairn_committed_checkpoints{cairn_job=\"metrics\"}"), 2);
  EXPECT_EQ(Value(c, "cairn_committed_bytes{cairn_job=\"metrics\"}"),
            total1 + total2);
  EXPECT_EQ(
      Value(c, "cairn_last_commit_timestamp_seconds{cairn_job=\"metrics\"}"),
      committed[2].committed_unix_micros() / 1e6);
  for (const auto& [series, value] : c) {
    EXPECT_FALSE(absl::StartsWith(series, "cairn_save_failures_total"))
        << "no save failed, yet " << series << " = " << value;
  }

  Scrape agent[2];
  for (int node = 0; node < 2; ++node) {
    agent[node] = ParseScrape(ScrapeText(agent_metrics_port_[node]));
  }
  double persisted_total = 0;
  for (int node = 0; node < 2; ++node) {
    SCOPED_TRACE(absl::StrCat("agent ", node));
    const Scrape& a = agent[node];
    const int peer = 1 - node;
    const double persisted = Value(a, "cairn_agent_bytes_persisted_total");
    EXPECT_GT(persisted, 0);
    persisted_total += persisted;
    EXPECT_EQ(Value(a, "cairn_agent_persists_total{result=\"committed\"}"), 4);
    EXPECT_EQ(Value(a, "cairn_agent_persists_total{result=\"failed\"}"), 0);
    EXPECT_EQ(Value(a, "cairn_agent_persist_duration_seconds_count"), 4);
    EXPECT_EQ(Value(a, "cairn_agent_persist_queue_depth"), 0);
    // --replicas 1: each node pushes its ranks' whole staged sets (at least
    // what it persisted) to the other.
    const std::string sent =
        "cairn_agent_replication_bytes_total{direction=\"sent\"}";
    EXPECT_GE(Value(a, sent), persisted);
    EXPECT_EQ(
        Value(a, "cairn_agent_replication_bytes_total{direction=\"received\"}"),
        Value(agent[peer], sent));
    EXPECT_EQ(Value(a, "cairn_agent_replication_failures_total"), 0);
    EXPECT_EQ(Value(a, "cairn_agent_replication_lag_bytes"), 0);
    EXPECT_EQ(Value(a, "cairn_agent_replication_lag_seconds"), 0);
    EXPECT_EQ(Value(a, "cairn_agent_staging_budget_bytes"), 64 << 20);
    // Tier 0 (the newest save of its ranks) and the peer's replica stay.
    EXPECT_GT(Value(a, "cairn_agent_staging_bytes_used"), 0);
    EXPECT_LE(Value(a, "cairn_agent_staging_bytes_used"), 64 << 20);
    EXPECT_EQ(Value(a, Rpc("Agent", "BeginStage", "OK")), 4);
    EXPECT_EQ(Value(a, Rpc("Agent", "FinishStage", "OK")), 4);
    EXPECT_EQ(Value(a, Rpc("Agent", "WaitSave", "OK")), 4);
  }
  // The agents persisted every committed byte, and nothing more.
  EXPECT_EQ(persisted_total, total1 + total2);
}

TEST_F(MetricsE2ETest, FailedSaveIsCountedByCode) {
  // One rank of two begins, then aborts: the save fails with ABORTED.
  auto stub = Stub();
  auto deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(30);
  };
  v1::BeginSaveRequest begin;
  begin.set_job(kJob);
  begin.set_step(7);
  begin.set_rank(0);
  begin.set_world_size(2);
  begin.set_incarnation(42);
  begin.mutable_local_plan()->set_rank(0);
  grpc::ClientContext begin_ctx;
  begin_ctx.set_deadline(deadline());
  v1::BeginSaveResponse begin_resp;
  grpc::Status begin_status;
  std::thread parked(
      [&] { begin_status = stub->BeginSave(&begin_ctx, begin, &begin_resp); });
  // The BeginSave parks until rank 1 arrives, which it never does.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until &&
         ParseScrape(ScrapeText(
             cairnd_metrics_port_))["cairn_saves_in_progress"] != 1) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const Scrape during = ParseScrape(ScrapeText(cairnd_metrics_port_));
  EXPECT_EQ(Value(during, "cairn_saves_in_progress"), 1);
  EXPECT_GE(Value(during, "cairn_oldest_inflight_save_age_seconds"), 0);
  v1::AbortSaveRequest abort;
  abort.set_job(kJob);
  abort.set_step(7);
  abort.set_rank(0);
  abort.set_incarnation(42);
  abort.set_reason("test abort");
  grpc::ClientContext abort_ctx;
  abort_ctx.set_deadline(deadline());
  v1::AbortSaveResponse abort_resp;
  grpc::Status aborted = stub->AbortSave(&abort_ctx, abort, &abort_resp);
  parked.join();
  ASSERT_TRUE(aborted.ok()) << aborted.error_message();
  EXPECT_EQ(begin_status.error_code(), grpc::StatusCode::ABORTED)
      << begin_status.error_message();
  const std::string text = ScrapeText(cairnd_metrics_port_);
  const Scrape s = ParseScrape(text);
  EXPECT_EQ(Value(s, "cairn_save_failures_total{code=\"ABORTED\"}"), 1) << text;
  EXPECT_EQ(Value(s, "cairn_saves_committed_total"), 0);
  EXPECT_EQ(Value(s, "cairn_saves_in_progress"), 0);
  EXPECT_EQ(Value(s, Rpc("Coordinator", "BeginSave", "ABORTED")), 1);
  EXPECT_EQ(Value(s, Rpc("Coordinator", "AbortSave", "OK")), 1);
}

// A metrics address that cannot be bound stops either daemon at start with
// the reason (set through the environment, CAIRN_METRICS_LISTEN, here).
TEST_F(MetricsE2ETest, MetricsPortInUseStopsTheDaemonAtStart) {
  const std::string taken = absl::StrCat("127.0.0.1:", cairnd_metrics_port_);
  const std::string env = absl::StrCat("CAIRN_METRICS_LISTEN=", taken);
  std::vector<std::vector<std::string>> argvs = {
      {"/usr/bin/env", env, Binaries().cairnd, "--listen", "127.0.0.1:0",
       "--data-dir", dir_ + "/second-cairnd"},
      {"/usr/bin/env", env, Binaries().agent, "--node-id", "0", "--listen-unix",
       testing::SocketPath("metrics-second"), "--coordinator",
       cairnd_->address()}};
  for (const auto& argv : argvs) {
    SCOPED_TRACE(argv[2]);
    std::string out;
    EXPECT_EQ(Run(argv, &out, absl::Seconds(60)), 1) << out;
    EXPECT_THAT(out,
                HasSubstr(absl::StrCat("--metrics-listen: cannot serve "
                                       "metrics on ",
                                       taken, ": Address already in use")));
  }
}

TEST_F(MetricsE2ETest, PromtoolAcceptsBothDaemonsScrapes) {
  SaveThroughAgents(1);
  LoadDirect();
  ExpectPromtoolAccepts(ScrapeText(cairnd_metrics_port_), "cairnd");
  for (int node = 0; node < 2; ++node) {
    ExpectPromtoolAccepts(ScrapeText(agent_metrics_port_[node]),
                          absl::StrCat("agent-", node));
  }
}

// GET `path` of the Prometheus server on `port` as JSON (null on failure).
nlohmann::json PrometheusGet(int port, const std::string& path,
                             const httplib::Params& params = {}) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(10);
  httplib::Result r = client.Get(path, params, httplib::Headers());
  if (!r || r->status != 200) return nullptr;
  return nlohmann::json::parse(r->body, nullptr, false);
}

// The single value of an instant query, or NaN when it has no single
// result yet.
double QueryValue(int port, const std::string& query) {
  nlohmann::json j = PrometheusGet(port, "/api/v1/query", {{"query", query}});
  if (!j.is_object() || j.value("status", "") != "success") return NAN;
  const nlohmann::json& result = j["data"]["result"];
  if (!result.is_array() || result.size() != 1) return NAN;
  double v = NAN;
  if (!absl::SimpleAtod(result[0]["value"][1].get<std::string>(), &v)) {
    return NAN;
  }
  return v;
}

TEST_F(MetricsE2ETest, PrometheusScrapesTheDaemonsDuringASave) {
  ASSERT_TRUE(std::filesystem::exists(Binaries().prometheus))
      << Binaries().prometheus
      << " is missing: install Debian's prometheus package "
         "(scripts/install_deps.sh)";
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string config = dir_ + "/prometheus.yml";
  std::ofstream(config) << "global:\n"
                        << "  scrape_interval: 1s\n"
                        << "  scrape_timeout: 1s\n"
                        << "scrape_configs:\n"
                        << "  - job_name: cairnd\n"
                        << "    static_configs:\n"
                        << "      - targets: ['127.0.0.1:"
                        << cairnd_metrics_port_ << "']\n"
                        << "  - job_name: cairn-agent\n"
                        << "    static_configs:\n"
                        << "      - targets: ['127.0.0.1:"
                        << agent_metrics_port_[0]
                        << "', '127.0.0.1:" << agent_metrics_port_[1] << "']\n";
  auto p = testing::Subprocess::Start(
      {Binaries().prometheus, "--config.file", config, "--storage.tsdb.path",
       dir_ + "/tsdb", "--web.listen-address",
       absl::StrCat("127.0.0.1:", port)},
      dir_ + "/prometheus.log");
  ASSERT_TRUE(p.ok()) << p.status();
  prometheus_ = std::make_unique<testing::Subprocess>(std::move(*p));

  // Every target up (bounded; Prometheus's log on failure).
  const absl::Time up_deadline = absl::Now() + absl::Seconds(60);
  int up = 0;
  while (absl::Now() < up_deadline) {
    ASSERT_FALSE(prometheus_->Wait(absl::ZeroDuration()).ok())
        << "prometheus exited:\n"
        << prometheus_->Log();
    nlohmann::json t = PrometheusGet(port, "/api/v1/targets");
    up = 0;
    if (t.is_object() && t["data"]["activeTargets"].is_array()) {
      for (const nlohmann::json& target : t["data"]["activeTargets"]) {
        if (target.value("health", "") == "up") ++up;
      }
    }
    if (up == 3) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(up, 3) << "Prometheus did not see cairnd and both agents up "
                      "within 60 s:\n"
                   << prometheus_->Log();

  SaveThroughAgents(1);
  std::map<int64_t, v1::CheckpointRecord> committed = Committed();
  ASSERT_EQ(committed.size(), 1u);
  const double total = committed[1].total_bytes();
  ASSERT_GT(total, 0);

  // The next scrapes carry the save: wait (bounded) until the queries see it.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  double saved = NAN, persisted = NAN, commits = NAN;
  while (absl::Now() < deadline) {
    saved = QueryValue(port, "cairn_bytes_saved_total");
    persisted = QueryValue(port, "sum(cairn_agent_bytes_persisted_total)");
    commits = QueryValue(
        port, "sum(cairn_committed_checkpoints{cairn_job=\"metrics\"})");
    if (saved == total && persisted == total && commits == 1) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(saved, total) << prometheus_->Log();
  EXPECT_EQ(persisted, total);
  EXPECT_EQ(commits, 1);
  EXPECT_EQ(QueryValue(port, "count(up == 1)"), 3);
  EXPECT_EQ(QueryValue(port,
                       "sum(cairn_rpcs_total{service=\"cairn.v1."
                       "Coordinator\",method=\"BeginSave\",code=\"OK\"})"),
            kWorld);
}

}  // namespace
}  // namespace cairn
