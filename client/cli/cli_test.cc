// Unit tests for the `cairn` CLI (RunCli in-process): argument handling of
// every subcommand and flag, usage errors (exit 2) against failures (exit 1)
// with their messages, the --help text docs/cli.md relies on, and both modes:
// offline on a real file:// storage and online through a real cairnd on
// loopback (port 0) over the same storage.
#include "client/cli/cli.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_layout.h"
#include "storage/lease.h"

namespace cairn::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class CliTest : public CliTestBase {};

// --- Help, version, usage errors ---

TEST_F(CliTest, HelpNamesEverySubcommandFlagAndEnvironmentVariable) {
  Result r = Cairn({"--help"});
  ASSERT_EQ(r.code, 0) << r;
  for (const char* s :
       {"ls", "show", "verify", "export", "diff", "rm", "gc", "agents",
        "forget-agent", "policy", "persist", "--coordinator", "-c", "--storage",
        "-s", "CAIRN_COORDINATOR", "CAIRN_STORAGE", "--version"}) {
    EXPECT_THAT(r.out, HasSubstr(s)) << s;
  }
  struct Sub {
    const char* name;
    std::vector<std::string> flags;
  };
  for (const Sub& sub : std::vector<Sub>{
           {"ls", {"--all", "-a", "--json"}},
           {"show", {"--json", "--chunks"}},
           {"verify", {"crc32c"}},
           {"export",
            {"--format", "safetensors", "--out", "--max-shard-size", "--filter",
             "--dtype-as-saved", "5GB", "index.json", "DIR.tmp-XXXXXX"}},
           {"diff",
            {"--json", "crc32c", "without reading",
             "0 identical, 1 different, 2 error"}},
           {"rm", {"--yes", "-y", "--force"}},
           {"gc", {"--keep", "--dry-run", "--force"}},
           {"policy",
            {"--memory-every", "--persist-every", "--replicas", "--keep-memory",
             "--keep-persistent", "--clear"}},
           {"persist", {"--no-wait", "--timeout"}}}) {
    Result h = Cairn({sub.name, "--help"});
    EXPECT_EQ(h.code, 0) << h;
    for (const std::string& f : sub.flags) {
      EXPECT_THAT(h.out, HasSubstr(f)) << sub.name << " " << f;
    }
  }
}

TEST_F(CliTest, VersionPrintsTheProgramAndExitsZero) {
  Result r = Cairn({"--version"});
  EXPECT_EQ(r.code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("cairn"));
}

TEST_F(CliTest, MissingOrUnknownSubcommandsAndFlagsAreUsageErrors) {
  EXPECT_EQ(Cairn({}).code, 2);
  EXPECT_EQ(Cairn({"-s", uri_}).code, 2);
  EXPECT_EQ(Cairn({"-s", uri_, "frobnicate"}).code, 2);
  EXPECT_EQ(Cairn({"-s", uri_, "ls", "--bogus"}).code, 2);
  EXPECT_EQ(Cairn({"-s", uri_, "show", "job"}).code, 2);  // no step
  EXPECT_EQ(Cairn({"-s", uri_, "verify"}).code, 2);
  EXPECT_EQ(Cairn({"-s", uri_, "rm", "job"}).code, 2);
  Result r = Cairn({"-s", uri_, "ls", "a", "b"});  // one job at most
  EXPECT_EQ(r.code, 2) << r;
}

TEST_F(CliTest, ExactlyOneOfCoordinatorAndStorageIsRequired) {
  Result none = Cairn({"ls"});
  EXPECT_EQ(none.code, 2) << none;
  EXPECT_THAT(none.err, HasSubstr("give exactly one of --coordinator"));
  Result both = Cairn({"-c", "127.0.0.1:1", "-s", uri_, "ls"});
  EXPECT_EQ(both.code, 2) << both;
  EXPECT_THAT(both.err, HasSubstr("give exactly one of --coordinator"));
}

TEST_F(CliTest, AnUnreadableTokenFileIsAUsageErrorNamingIt) {
  // A directory used to abort the CLI (the stream threw on EISDIR).
  for (const std::string& path : {dir_, dir_ + "/absent", [&] {
                                    std::string empty = dir_ + "/empty-token";
                                    std::ofstream(empty) << "\n";
                                    return empty;
                                  }()}) {
    Result r = Cairn({"-c", "127.0.0.1:1", "--token-file", path, "ls"});
    EXPECT_EQ(r.code, 2) << r;
    EXPECT_THAT(r.err, HasSubstr("--token-file " + path + ": cannot read it"));
  }
}

TEST_F(CliTest, TheCommandLineWinsOverTheOthersVariable) {
  Write("job", 5);
  // As in cairnd's container: CAIRN_STORAGE is cairnd's setting, and a
  // coordinator given with -c is what the user means. The address is
  // unreachable, so the error proves the CLI went to it.
  setenv("CAIRN_STORAGE", uri_.c_str(), 1);
  for (const std::vector<std::string>& c :
       {std::vector<std::string>{"-c", "127.0.0.1:1"},
        std::vector<std::string>{"--coordinator=127.0.0.1:1"},
        std::vector<std::string>{"-c127.0.0.1:1"}}) {
    std::vector<std::string> args = c;
    args.push_back("ls");
    Result r = Cairn(args);
    EXPECT_EQ(r.code, 1) << r;
    EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1")) << r;
    EXPECT_THAT(r.err, Not(HasSubstr("give exactly one"))) << r;
  }
  unsetenv("CAIRN_STORAGE");
  // And --storage wins over CAIRN_COORDINATOR.
  setenv("CAIRN_COORDINATOR", "127.0.0.1:1", 1);
  Result offline = Cairn({"-s", uri_, "show", "job", "latest"});
  EXPECT_EQ(offline.code, 0) << offline;
  EXPECT_THAT(offline.out, HasSubstr("step 5"));
  // Both from the environment: ambiguous, and the error says why.
  setenv("CAIRN_STORAGE", uri_.c_str(), 1);
  Result both = Cairn({"ls"});
  EXPECT_EQ(both.code, 2) << both;
  EXPECT_THAT(both.err,
              HasSubstr("both CAIRN_COORDINATOR and CAIRN_STORAGE are set"));
}

TEST_F(CliTest, DaemonSettingsInTheEnvironmentAreNotWarnedAbout) {
  Write("job", 1);
  // The CLI in a daemon's container sees the daemon's settings.
  setenv("CAIRN_STAGING_BUDGET_MB", "512", 1);
  setenv("CAIRN_LISTEN", "0.0.0.0:7070", 1);
  Result r = Cairn({"-s", uri_, "ls"});
  unsetenv("CAIRN_STAGING_BUDGET_MB");
  unsetenv("CAIRN_LISTEN");
  EXPECT_EQ(r.code, 0) << r;
  EXPECT_THAT(r.err, Not(HasSubstr("warning"))) << r;
}

TEST_F(CliTest, BadStepsAreUsageErrorsNamingTheStep) {
  Write("job", 1);
  for (const std::string step : {"abc", "1.5", "12x", "latest1", "0x10", "+5",
                                 " 7", "99999999999999999999"}) {
    Result r = Cairn({"-s", uri_, "show", "job", step});
    EXPECT_EQ(r.code, 2) << step << ": " << r;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                           "step must be a non-negative integer or 'latest', "
                           "got '",
                           step, "'")));
  }
  // Beyond the largest step a checkpoint can have (10^15).
  Result big = Cairn({"-s", uri_, "verify", "job", "1000000000000001"});
  EXPECT_EQ(big.code, 2) << big;
  EXPECT_THAT(big.err, HasSubstr("invalid step 1000000000000001"));
  // A negative number is not a step either (whatever the parser makes of it).
  EXPECT_EQ(Cairn({"-s", uri_, "show", "job", "-3"}).code, 2);
}

TEST_F(CliTest, BadJobNamesAreUsageErrorsNamingTheJob) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"ls", "../etc"},
                                             {"show", "a/b", "latest"},
                                             {"verify", "..", "1"},
                                             {"rm", "x y", "1", "-y"},
                                             {"gc", "", "--keep", "1"}}) {
    for (bool online : {false, true}) {
      std::vector<std::string> full = {online ? "-c" : "-s",
                                       online ? "127.0.0.1:1" : uri_};
      full.insert(full.end(), args.begin(), args.end());
      Result r = Cairn(full);
      EXPECT_EQ(r.code, 2) << args[0] << ": " << r;
      EXPECT_THAT(r.err, HasSubstr("invalid job name")) << r;
    }
  }
}

TEST_F(CliTest, RmNeedsAnExplicitStep) {
  Write("job", 1);
  Result r = Cairn({"-s", uri_, "rm", "job", "latest", "-y"});
  EXPECT_EQ(r.code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("give an explicit step, not 'latest'"));
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 1)));
}

TEST_F(CliTest, GcNeedsKeepOfAtLeastOne) {
  Write("job", 1);
  EXPECT_EQ(Cairn({"-s", uri_, "gc", "job"}).code, 2);
  Result zero = Cairn({"-s", uri_, "gc", "job", "--keep", "0"});
  EXPECT_EQ(zero.code, 2) << zero;
  EXPECT_THAT(zero.err, HasSubstr("--keep"));
  EXPECT_EQ(Cairn({"-s", uri_, "gc", "job", "--keep", "many"}).code, 2);
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 1)));
}

// --- Offline (--storage) ---

TEST_F(CliTest, OfflineStorageRootMustExistAndBeADirectory) {
  Result missing = Cairn({"-s", "file://" + dir_ + "/nope", "ls"});
  EXPECT_EQ(missing.code, 1) << missing;
  EXPECT_THAT(missing.err, HasSubstr("does not exist"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/nope"));  // not created
  std::ofstream(dir_ + "/file") << "x";
  Result file = Cairn({"-s", "file://" + dir_ + "/file", "ls"});
  EXPECT_EQ(file.code, 1) << file;
  EXPECT_THAT(file.err, HasSubstr("is not a directory"));
  Result scheme = Cairn({"-s", "nosuch://bucket", "ls"});
  EXPECT_EQ(scheme.code, 1) << scheme;
  EXPECT_THAT(scheme.err, HasSubstr("nosuch"));
}

TEST_F(CliTest, OfflineListsShowsAndVerifiesCheckpoints) {
  Result empty = Cairn({"-s", uri_, "ls"});
  EXPECT_EQ(empty.code, 0) << empty;
  EXPECT_THAT(empty.out, HasSubstr("no checkpoints"));
  Write("job", 1);
  Write("job", 2);
  Write("other", 5);
  Result ls = Cairn({"-s", uri_, "ls"});
  ASSERT_EQ(ls.code, 0) << ls;
  for (const char* s : {"JOB", "STEP", "STATE", "SIZE", "CREATED", "job",
                        "other", "COMMITTED"}) {
    EXPECT_THAT(ls.out, HasSubstr(s)) << s;
  }
  Result one = Cairn({"-s", uri_, "ls", "other"});
  EXPECT_EQ(one.code, 0) << one;
  EXPECT_THAT(one.out, HasSubstr("other"));
  EXPECT_THAT(one.out, Not(HasSubstr("job ")));

  Result show = Cairn({"-s", uri_, "show", "job", "latest"});
  ASSERT_EQ(show.code, 0) << show;
  EXPECT_THAT(show.out, HasSubstr("job job  step 2  COMMITTED"));
  for (const char* s : {"ENTRY", "DTYPE", "SHAPE", "CHUNKS", "float32"}) {
    EXPECT_THAT(show.out, HasSubstr(s)) << s;
  }
  EXPECT_THAT(show.out, Not(HasSubstr("CRC32C")));
  Result chunks = Cairn({"-s", uri_, "show", "job", "1", "--chunks"});
  ASSERT_EQ(chunks.code, 0) << chunks;
  EXPECT_THAT(chunks.out, HasSubstr("job job  step 1"));
  for (const char* s : {"CHUNK", "RANK", "OBJECT", "OFFSET", "CRC32C"}) {
    EXPECT_THAT(chunks.out, HasSubstr(s)) << s;
  }
  Result json = Cairn({"-s", uri_, "show", "job", "2", "--json"});
  ASSERT_EQ(json.code, 0) << json;
  EXPECT_EQ(json.out.front(), '{') << json;
  EXPECT_THAT(json.out, HasSubstr("\"job\""));

  Result verify = Cairn({"-s", uri_, "verify", "job", "latest"});
  ASSERT_EQ(verify.code, 0) << verify;
  EXPECT_THAT(verify.out, HasSubstr("OK: job job step 2"));
  EXPECT_THAT(verify.err, HasSubstr("100%"));  // progress (not a tty)

  Result none = Cairn({"-s", uri_, "show", "job", "7"});
  EXPECT_EQ(none.code, 1) << none;
  EXPECT_THAT(none.err, HasSubstr("step 7"));
  Result nojob = Cairn({"-s", uri_, "show", "nojob", "latest"});
  EXPECT_EQ(nojob.code, 1) << nojob;
  EXPECT_THAT(nojob.err, HasSubstr("job 'nojob' has no committed checkpoint"));
}

TEST_F(CliTest, LsJsonHasWhatLsShowsInTypedFields) {
  Result empty = Cairn({"-s", uri_, "ls", "--json"});
  ASSERT_EQ(empty.code, 0) << empty;
  EXPECT_EQ(nlohmann::json::parse(empty.out),
            nlohmann::json::parse(R"({"jobs": []})"));
  Write("job", 2);
  Write("job", 1);
  Write("other", 5);
  Write("job", 3);
  std::ofstream(ManifestPath("job", 3), std::ios::trunc) << "not a manifest";
  const v1::Manifest m1 = storage::ReadManifest(*store_, "job", 1).value();

  Result r = Cairn({"-s", uri_, "ls", "--json"});
  ASSERT_EQ(r.code, 0) << r;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["jobs"].size(), 2u) << j.dump(2);
  EXPECT_EQ(j["jobs"][0]["job"], "job");
  EXPECT_EQ(j["jobs"][1]["job"], "other");
  const nlohmann::json& steps = j["jobs"][0]["checkpoints"];
  ASSERT_EQ(steps.size(), 3u) << j.dump(2);
  const nlohmann::json& c = steps[0];
  EXPECT_EQ(c["step"], 1);
  EXPECT_EQ(c["state"], "COMMITTED");
  EXPECT_EQ(c["world_size"], 2);
  EXPECT_EQ(c["total_bytes"], m1.total_bytes());
  EXPECT_EQ(c["num_tensors"], 3);
  EXPECT_EQ(c["num_bytes_entries"], 1);
  // WriteTestCheckpoint's created time: 1700000000 s + `step` us.
  EXPECT_EQ(c["created"], "2023-11-14T22:13:20.000001+00:00");
  EXPECT_EQ(c["created_unix_seconds"], 1700000000);
  EXPECT_TRUE(c["committed"].is_null());  // offline: no catalog to say
  EXPECT_EQ(c["storage_uri"], uri_);
  EXPECT_FALSE(c.contains("reason"));
  EXPECT_EQ(steps[1]["step"], 2);
  EXPECT_EQ(steps[2]["step"], 3);
  EXPECT_EQ(steps[2]["state"], "DAMAGED");
  EXPECT_THAT(steps[2]["reason"].get<std::string>(), HasSubstr("DATA_LOSS"));

  Result one = Cairn({"-s", uri_, "ls", "other", "--json"});
  ASSERT_EQ(one.code, 0) << one;
  const nlohmann::json o = nlohmann::json::parse(one.out);
  ASSERT_EQ(o["jobs"].size(), 1u);
  EXPECT_EQ(o["jobs"][0]["checkpoints"][0]["step"], 5);

  // Through cairnd: the same fields, and the commit time it recorded (a
  // catalog rebuilt from storage takes the created time).
  std::filesystem::remove(ManifestPath("job", 3));
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  Result online = Cairn({"-c", addr, "ls", "job", "--json"});
  ASSERT_EQ(online.code, 0) << online;
  const nlohmann::json on = nlohmann::json::parse(online.out);
  ASSERT_EQ(on["jobs"].size(), 1u) << on.dump(2);
  const nlohmann::json& first = on["jobs"][0]["checkpoints"][0];
  EXPECT_EQ(first["step"], 1);
  EXPECT_EQ(first["state"], "COMMITTED");
  EXPECT_EQ(first["num_tensors"], 3);
  EXPECT_EQ(first["created_unix_seconds"], 1700000000);
  ASSERT_TRUE(first["committed"].is_string()) << first.dump(2);
  EXPECT_GE(first["committed_unix_seconds"].get<int64_t>(), 1700000000);
}

TEST_F(CliTest, OfflineDamagedStepIsListedAndLatestIsTheNewestReadable) {
  Write("job", 1);
  Write("job", 2);
  std::ofstream(ManifestPath("job", 2), std::ios::trunc) << "not a manifest";
  Result ls = Cairn({"-s", uri_, "ls", "job"});
  ASSERT_EQ(ls.code, 0) << ls;
  EXPECT_THAT(ls.out, HasSubstr("DAMAGED: job job step 2"));
  Result show = Cairn({"-s", uri_, "show", "job", "latest"});
  ASSERT_EQ(show.code, 0) << show;
  EXPECT_THAT(show.out, HasSubstr("job job  step 1"));
  EXPECT_THAT(show.err, HasSubstr("skipping damaged job 'job' step 2"));
}

TEST_F(CliTest, OfflineVerifyReportsDamagedDataAsFailure) {
  Write("job", 1);
  const std::string object = DataObject("job", 1);
  ASSERT_FALSE(object.empty());
  {
    std::fstream f(object, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x7f');
  }
  Result r = Cairn({"-s", uri_, "verify", "job", "1"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));
  std::filesystem::remove(object);
  Result gone = Cairn({"-s", uri_, "verify", "job", "1"});
  EXPECT_EQ(gone.code, 1) << gone;
  EXPECT_THAT(gone.err, HasSubstr("DATA_LOSS"));
}

TEST_F(CliTest, OfflineRmAsksUnlessYes) {
  Write("job", 1);
  Write("job", 2);
  Result no = Cairn({"-s", uri_, "rm", "job", "1"}, "n\n");
  EXPECT_EQ(no.code, 1) << no;
  EXPECT_THAT(no.out, HasSubstr("delete job job step 1? [y/N]"));
  EXPECT_THAT(no.out, HasSubstr("not deleted"));
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 1)));
  Result eof = Cairn({"-s", uri_, "rm", "job", "1"}, "");
  EXPECT_EQ(eof.code, 1) << eof;
  Result yes = Cairn({"-s", uri_, "rm", "job", "1"}, "y\n");
  EXPECT_EQ(yes.code, 0) << yes;
  EXPECT_THAT(yes.out, HasSubstr("deleted job job step 1"));
  EXPECT_FALSE(std::filesystem::exists(ManifestPath("job", 1)));
  Result flag = Cairn({"-s", uri_, "rm", "job", "2", "--yes"});
  EXPECT_EQ(flag.code, 0) << flag;
  EXPECT_FALSE(std::filesystem::exists(ManifestPath("job", 2)));
}

TEST_F(CliTest, OfflineGcKeepsTheNewestAndDryRunDeletesNothing) {
  for (int64_t step : {1, 2, 3}) Write("job", step);
  Result dry = Cairn({"-s", uri_, "gc", "job", "--keep", "1", "--dry-run"});
  ASSERT_EQ(dry.code, 0) << dry;
  EXPECT_THAT(dry.out,
              HasSubstr("would delete 2 checkpoints of job job (steps 2, 1)"));
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 1)));
  Result gc = Cairn({"-s", uri_, "gc", "job", "--keep", "1", "-n"});
  EXPECT_THAT(gc.out, HasSubstr("would delete"));
  gc = Cairn({"-s", uri_, "gc", "job", "--keep", "1"});
  ASSERT_EQ(gc.code, 0) << gc;
  EXPECT_THAT(gc.out, HasSubstr("deleted 2 checkpoints of job job"));
  EXPECT_FALSE(std::filesystem::exists(ManifestPath("job", 1)));
  EXPECT_FALSE(std::filesystem::exists(ManifestPath("job", 2)));
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 3)));
}

TEST_F(CliTest, StorageFromTheEnvironment) {
  Write("job", 4);
  setenv("CAIRN_STORAGE", uri_.c_str(), 1);
  Result r = Cairn({"show", "job", "latest"});
  EXPECT_EQ(r.code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("step 4"));
}

// --- Online (--coordinator) ---

TEST_F(CliTest, OnlineCommandsAskCairnd) {
  Write("job", 1);
  Write("job", 2);
  Write("job", 3);
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  Result ls = Cairn({"-c", addr, "ls", "job"});
  ASSERT_EQ(ls.code, 0) << ls;
  EXPECT_THAT(ls.out, HasSubstr("COMMITTED"));
  Result show = Cairn({"-c", addr, "show", "job", "latest"});
  ASSERT_EQ(show.code, 0) << show;
  EXPECT_THAT(show.out, HasSubstr("job job  step 3  COMMITTED"));
  EXPECT_THAT(show.out, HasSubstr(uri_));  // the storage cairnd names
  Result json = Cairn({"-c", addr, "show", "job", "2", "--json", "--chunks"});
  ASSERT_EQ(json.code, 0) << json;
  EXPECT_EQ(json.out.front(), '{') << json;
  Result verify = Cairn({"-c", addr, "verify", "job", "latest"});
  ASSERT_EQ(verify.code, 0) << verify;
  EXPECT_THAT(verify.out, HasSubstr("OK: job job step 3"));

  Result missing = Cairn({"-c", addr, "show", "job", "9"});
  EXPECT_EQ(missing.code, 1) << missing;
  EXPECT_THAT(missing.err, HasSubstr("no checkpoint job 'job' step 9"));
  Result nojob = Cairn({"-c", addr, "verify", "nojob", "latest"});
  EXPECT_EQ(nojob.code, 1) << nojob;
  EXPECT_THAT(nojob.err, HasSubstr("job 'nojob' has no committed checkpoint"));

  // `latest` is resolved by cairnd: after deleting the newest, the next.
  Result rm = Cairn({"-c", addr, "rm", "job", "3", "-y"});
  ASSERT_EQ(rm.code, 0) << rm;
  EXPECT_THAT(rm.out, HasSubstr("deleted job job step 3"));
  show = Cairn({"-c", addr, "show", "job", "latest"});
  EXPECT_THAT(show.out, HasSubstr("job job  step 2"));
  Result gc = Cairn({"-c", addr, "gc", "job", "--keep", "1"});
  ASSERT_EQ(gc.code, 0) << gc;
  EXPECT_THAT(gc.out, HasSubstr("deleted 1 checkpoints of job job (steps 1)"));
  ls = Cairn({"-c", addr, "ls", "job", "--all"});
  EXPECT_EQ(ls.code, 0) << ls;
  EXPECT_THAT(ls.out, Not(HasSubstr("ABORTED")));

  setenv("CAIRN_COORDINATOR", addr.c_str(), 1);
  Result env = Cairn({"show", "job", "latest"});
  EXPECT_EQ(env.code, 0) << env;
  EXPECT_THAT(env.out, HasSubstr("step 2"));
}

// An offline delete under a running cairnd would leave it listing a
// checkpoint whose MANIFEST is gone: refused while cairnd holds the
// storage's lease, naming it and the command that deletes through it.
TEST_F(CliTest, OfflineRmAndGcAreRefusedWhileCairndHoldsTheStorage) {
  Write("job", 1);
  Write("job", 2);
  Write("job", 3);
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  Result rm = Cairn({"-s", uri_, "rm", "job", "1", "-y"});
  EXPECT_EQ(rm.code, 1) << rm;
  EXPECT_THAT(rm.err, HasSubstr("refusing to delete job 'job' step 1 offline: "
                                "storage " +
                                uri_ + " is in use by cairnd (pid "));
  EXPECT_THAT(rm.err, HasSubstr("serving " + addr));
  EXPECT_THAT(rm.err, HasSubstr("expires "));
  EXPECT_THAT(rm.err, HasSubstr("cairn -c " + addr + " rm job 1"));
  EXPECT_THAT(rm.err, HasSubstr("--force"));
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 1)));
  Result gc = Cairn({"-s", uri_, "gc", "job", "--keep", "1"});
  EXPECT_EQ(gc.code, 1) << gc;
  EXPECT_THAT(gc.err, HasSubstr("refusing to gc job 'job' offline"));
  EXPECT_THAT(gc.err, HasSubstr("cairn -c " + addr + " gc job --keep 1"));
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 2)));
  // Reading, and a dry run, change nothing: allowed.
  EXPECT_EQ(Cairn({"-s", uri_, "ls"}).code, 0);
  EXPECT_EQ(Cairn({"-s", uri_, "gc", "job", "--keep", "1", "-n"}).code, 0);
  // --force deletes anyway (and says so); online it is a usage error.
  Result forced = Cairn({"-s", uri_, "rm", "job", "1", "-y", "--force"});
  EXPECT_EQ(forced.code, 0) << forced;
  EXPECT_THAT(forced.err, HasSubstr("deleting without the storage's lease"));
  EXPECT_FALSE(std::filesystem::exists(ManifestPath("job", 1)));
  EXPECT_EQ(Cairn({"-c", addr, "rm", "job", "2", "-y", "--force"}).code, 2);
  // Once cairnd stopped (and released the storage), offline deletes work.
  cairnd_.reset();
  gc = Cairn({"-s", uri_, "gc", "job", "--keep", "1"});
  EXPECT_EQ(gc.code, 0) << gc;
  EXPECT_FALSE(std::filesystem::exists(ManifestPath("job", 2)));
  EXPECT_TRUE(std::filesystem::exists(ManifestPath("job", 3)));
  // It held the storage meanwhile, and let it go.
  auto lease = storage::ReadLease(*store_);
  ASSERT_TRUE(lease.ok() && lease->has_value()) << lease.status();
  EXPECT_EQ((*lease)->role, "cairn gc");
  EXPECT_TRUE((*lease)->released);
}

TEST_F(CliTest, AgentsListsTheRegistryAndForgetAgentFreesAnId) {
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  for (const char* name : {"gpu-a", "gpu-b"}) {
    v1::RegisterAgentRequest r;
    r.set_node_name(name);
    r.set_peer_address(
        absl::StrCat("10.2.0.", name[4] == 'a' ? 1 : 2, ":7071"));
    r.set_num_nodes(2);
    ASSERT_TRUE(cairnd_->coordinator().agents().Register(r).ok());
  }
  Result list = Cairn({"-c", addr, "agents"});
  ASSERT_EQ(list.code, 0) << list;
  EXPECT_THAT(list.out, HasSubstr("PEER ADDRESS"));
  EXPECT_THAT(list.out, ::testing::ContainsRegex("0 +gpu-a +10.2.0.1:7071"));
  EXPECT_THAT(list.out, ::testing::ContainsRegex("1 +gpu-b +10.2.0.2:7071"));

  Result kept = Cairn({"-c", addr, "forget-agent", "gpu-a"}, "n\n");
  EXPECT_EQ(kept.code, 1) << kept;
  EXPECT_THAT(kept.out, HasSubstr("not forgotten"));
  Result forgot = Cairn({"-c", addr, "forget-agent", "gpu-a", "--yes"});
  ASSERT_EQ(forgot.code, 0) << forgot;
  EXPECT_THAT(forgot.out, HasSubstr("forgot node gpu-a: node id 0 is free"));
  list = Cairn({"-c", addr, "agents"});
  EXPECT_THAT(list.out, Not(HasSubstr("gpu-a")));
  Result again = Cairn({"-c", addr, "forget-agent", "gpu-a", "-y"});
  EXPECT_EQ(again.code, 1) << again;
  EXPECT_THAT(again.err, HasSubstr("no agent of node 'gpu-a'"));
  Result bad = Cairn({"-c", addr, "forget-agent", "a/b", "-y"});
  EXPECT_EQ(bad.code, 1) << bad;
  EXPECT_THAT(bad.err, HasSubstr("node_name 'a/b'"));
  Result offline = Cairn({"-s", uri_, "agents"});
  EXPECT_EQ(offline.code, 2) << offline;
  EXPECT_THAT(offline.err, HasSubstr("--coordinator"));
}

TEST_F(CliTest, PolicySetsShowsAndClearsAJobsPolicyAndLsShowsTiers) {
  Write("job", 1);
  const std::string addr = StartCairnd();
  ASSERT_FALSE(addr.empty());
  Result none = Cairn({"-c", addr, "policy", "job"});
  ASSERT_EQ(none.code, 0) << none;
  EXPECT_THAT(none.out, HasSubstr("job job has no policy"));
  // No agent reports: memory checkpoints with a replica cannot be held.
  Result refused = Cairn({"-c", addr, "policy", "job", "--memory-every", "10",
                          "--persist-every", "100", "--replicas", "1"});
  EXPECT_EQ(refused.code, 1) << refused;
  EXPECT_THAT(refused.err, HasSubstr("1 replicas need 2"));
  for (int node : {0, 1}) {
    v1::ReportHoldingsRequest report;
    report.set_node_id(node);
    report.set_num_nodes(2);
    report.set_incarnation(node + 1);
    report.set_budget_bytes(uint64_t{1} << 30);
    ASSERT_TRUE(cairnd_->coordinator().ReportHoldings(report).ok());
  }
  Result set = Cairn({"-c", addr, "policy", "job", "--memory-every", "10",
                      "--persist-every", "100", "--replicas", "1",
                      "--keep-memory", "3"});
  ASSERT_EQ(set.code, 0) << set;
  EXPECT_THAT(set.out, HasSubstr("memory every 10 steps with 1 replica, "
                                 "persisted every 100; keep 3 memory"));
  Result bad = Cairn({"-c", addr, "policy", "job", "--memory-every", "10",
                      "--persist-every", "15"});
  EXPECT_EQ(bad.code, 1) << bad;
  EXPECT_THAT(bad.err, HasSubstr("multiple of memory_every"));
  Result get = Cairn({"-c", addr, "policy", "job"});
  EXPECT_THAT(get.out, HasSubstr("persisted every 100"));
  Result ls = Cairn({"-c", addr, "ls", "job"});
  ASSERT_EQ(ls.code, 0) << ls;
  EXPECT_THAT(ls.out, HasSubstr("TIER"));
  EXPECT_THAT(ls.out,
              ::testing::ContainsRegex("COMMITTED +persistent +storage"));
  Result json = Cairn({"-c", addr, "ls", "job", "--json"});
  EXPECT_THAT(json.out, HasSubstr("\"tier\": \"persistent\""));
  EXPECT_THAT(json.out, HasSubstr("\"restorable\": true"));
  // A persistent checkpoint is on storage already; a missing one is named.
  Result persisted = Cairn({"-c", addr, "persist", "job", "1"});
  ASSERT_EQ(persisted.code, 0) << persisted;
  EXPECT_THAT(persisted.out, HasSubstr("job job step 1 is persistent"));
  Result missing = Cairn({"-c", addr, "persist", "job", "7"});
  EXPECT_EQ(missing.code, 1) << missing;
  EXPECT_THAT(missing.err, HasSubstr("no checkpoint job 'job' step 7"));
  Result cleared = Cairn({"-c", addr, "policy", "job", "--clear"});
  ASSERT_EQ(cleared.code, 0) << cleared;
  EXPECT_THAT(Cairn({"-c", addr, "policy", "job"}).out,
              HasSubstr("has no policy"));
  Result offline = Cairn({"-s", uri_, "policy", "job"});
  EXPECT_EQ(offline.code, 2) << offline;
}

TEST_F(CliTest, OnlineUnreachableCairndIsAFailureSayingSo) {
  Result r = Cairn({"-c", "127.0.0.1:1", "ls"});
  EXPECT_EQ(r.code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("cannot reach cairnd"));
}

}  // namespace
}  // namespace cairn::cli
