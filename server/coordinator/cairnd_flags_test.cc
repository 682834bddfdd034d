#include "server/coordinator/cairnd_flags.h"

#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::coordinator {
namespace {

using ::testing::HasSubstr;

// Parses `args` (after the program name) into `f`; the exit code Parse
// returns, nullopt to go on.
std::optional<int> ParseArgs(std::vector<std::string> args, CairndFlags* f,
                             std::string* err = nullptr) {
  CLI::App app{"cairnd", "cairnd"};
  AddCairndFlags(app, f);
  args.insert(args.begin(), "cairnd");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, errs;
  std::optional<int> rc =
      flags::Parse(app, static_cast<int>(argv.size()), argv.data(), out, errs);
  if (err != nullptr) *err = errs.str();
  return rc;
}

TEST(CairndFlagsTest, DefaultsAreTheLibrarysAndTheDataDirsPaths) {
  CairndFlags f;
  ASSERT_EQ(ParseArgs({}, &f), std::nullopt);
  const CairndConfig config = f.Config();
  const CoordinatorOptions defaults;
  const CoordinatorServer::Spec spec_defaults;
  EXPECT_EQ(config.spec.coordinator.begin_deadline, defaults.begin_deadline);
  EXPECT_EQ(config.spec.coordinator.commit_deadline, defaults.commit_deadline);
  EXPECT_EQ(config.spec.coordinator.load_join_grace, defaults.load_join_grace);
  EXPECT_EQ(config.spec.coordinator.storage_lease_ttl,
            defaults.storage_lease_ttl);
  EXPECT_EQ(config.spec.coordinator.keep_last, defaults.keep_last);
  EXPECT_EQ(config.spec.max_request_memory_bytes,
            spec_defaults.max_request_memory_bytes);
  EXPECT_EQ(config.spec.reflection, std::nullopt);
  const std::string data_dir = std::filesystem::absolute("cairn-data").string();
  EXPECT_EQ(config.spec.coordinator.storage_uri,
            "file://" + data_dir + "/checkpoints");
  EXPECT_EQ(config.spec.coordinator.catalog_path, data_dir + "/catalog");
  EXPECT_EQ(config.shutdown_grace, absl::Seconds(10));
  EXPECT_EQ(config.reload_every, absl::ZeroDuration());
  EXPECT_EQ(config.keep_free_bytes, size_t{256} << 20);
  EXPECT_EQ(config.log.level, "info");
}

TEST(CairndFlagsTest, FlagsFillTheConfigInItsUnits) {
  CairndFlags f;
  ASSERT_EQ(
      ParseArgs(
          {"--data-dir",          "/srv/cairn", "--plan-cache-mib", "3",
           "--manifest-held-mib", "5",          "--begin-deadline", "2.5",
           "--reload-every",      "0.5",        "--shutdown-grace", "4",
           "--reflection",        "off",        "--port-file",      "/run/p",
           "--keep-last",         "7",          "--log-level",      "debug"},
          &f),
      std::nullopt);
  const CairndConfig config = f.Config();
  EXPECT_EQ(config.spec.coordinator.storage_uri,
            "file:///srv/cairn/checkpoints");
  EXPECT_EQ(config.spec.coordinator.catalog_path, "/srv/cairn/catalog");
  EXPECT_EQ(config.spec.coordinator.plan_cache_bytes, size_t{3} << 20);
  EXPECT_EQ(config.spec.coordinator.manifest_held_bytes, size_t{5} << 20);
  EXPECT_EQ(config.spec.coordinator.begin_deadline, absl::Milliseconds(2500));
  EXPECT_EQ(config.spec.coordinator.keep_last, 7);
  EXPECT_EQ(config.spec.reflection, std::optional<bool>(false));
  EXPECT_EQ(config.reload_every, absl::Milliseconds(500));
  EXPECT_EQ(config.shutdown_grace, absl::Seconds(4));
  EXPECT_EQ(config.port_file, "/run/p");
  EXPECT_EQ(config.log.level, "debug");
}

TEST(CairndFlagsTest, StorageAndCatalogGivenWinOverTheDataDir) {
  CairndFlags f;
  ASSERT_EQ(ParseArgs({"--data-dir", "/srv/cairn", "--storage",
                       "s3://bucket/ckpt", "--catalog", "/var/catalog"},
                      &f),
            std::nullopt);
  const CairndConfig config = f.Config();
  EXPECT_EQ(config.spec.coordinator.storage_uri, "s3://bucket/ckpt");
  EXPECT_EQ(config.spec.coordinator.catalog_path, "/var/catalog");
}

TEST(CairndFlagsTest, AnOutOfRangeValueIsAUsageErrorNamingTheFlag) {
  CairndFlags f;
  std::string err;
  EXPECT_EQ(ParseArgs({"--keep-last", "-1"}, &f, &err), flags::kExitUsage);
  EXPECT_THAT(err, HasSubstr("--keep-last"));
  EXPECT_THAT(err, HasSubstr("must be >= 0, got -1"));
}

}  // namespace
}  // namespace cairn::coordinator
