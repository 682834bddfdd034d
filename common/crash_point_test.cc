#include "common/crash_point.h"

#include <signal.h>
#include <stdlib.h>

#include <cstdio>

#include "gtest/gtest.h"

namespace cairn {
namespace {

TEST(CrashPointTest, UnarmedPointsDoNothing) {
  ASSERT_TRUE(SetCrashPointsForTest(""));
  for (int i = 0; i < 3; ++i) CAIRN_CRASH_POINT("coordinator.after_publish");
  ASSERT_TRUE(SetCrashPointsForTest("some.other.point"));
  CAIRN_CRASH_POINT("coordinator.after_publish");
  SetCrashPointsForTest("");
}

TEST(CrashPointDeathTest, NamedPointKillsOnItsFirstHit) {
  EXPECT_EXIT(
      {
        SetCrashPointsForTest("a.b");
        CAIRN_CRASH_POINT("a.c");
        CAIRN_CRASH_POINT("a");
        std::fprintf(stderr, "other points passed\n");
        CAIRN_CRASH_POINT("a.b");
        std::fprintf(stderr, "survived\n");
        std::exit(0);
      },
      testing::KilledBySignal(SIGKILL),
      "other points passed\ncairn: crash point 'a.b' hit 1: SIGKILL\n$");
}

TEST(CrashPointDeathTest, CountedPointKillsOnTheNthHit) {
  EXPECT_EXIT(
      {
        SetCrashPointsForTest("p@3");
        CAIRN_CRASH_POINT("p");
        CAIRN_CRASH_POINT("p");
        std::fprintf(stderr, "two hits passed\n");
        CAIRN_CRASH_POINT("p");
        std::exit(0);
      },
      testing::KilledBySignal(SIGKILL),
      "two hits passed\ncairn: crash point 'p' hit 3: SIGKILL");
}

TEST(CrashPointDeathTest, PrefixMatchesEveryPointUnderIt) {
  EXPECT_EXIT(
      {
        SetCrashPointsForTest("coordinator.delete.*@2");
        CAIRN_CRASH_POINT("coordinator.commit");
        CAIRN_CRASH_POINT("coordinator.delete.before_storage");
        CAIRN_CRASH_POINT("coordinator.delete.after_storage");
        std::exit(0);
      },
      testing::KilledBySignal(SIGKILL),
      "crash point 'coordinator.delete.after_storage' hit 2: SIGKILL");
}

TEST(CrashPointDeathTest, ProbabilityOneAlwaysKills) {
  EXPECT_EXIT(
      {
        SetCrashPointsForTest("q%1");
        CAIRN_CRASH_POINT("q");
        std::exit(0);
      },
      testing::KilledBySignal(SIGKILL), "crash point 'q' hit 1: SIGKILL");
}

TEST(CrashPointTest, TinyProbabilityAlmostNeverKills) {
  ASSERT_TRUE(SetCrashPointsForTest("q%1e-12"));
  for (int i = 0; i < 10000; ++i) CAIRN_CRASH_POINT("q");
  SetCrashPointsForTest("");
}

TEST(CrashPointDeathTest, MalformedEntriesAreReportedAndIgnored) {
  EXPECT_EXIT(
      {
        if (SetCrashPointsForTest("a@0, b%2 ,c@x,*@1x, ok")) std::exit(3);
        CAIRN_CRASH_POINT("a");
        CAIRN_CRASH_POINT("b");
        CAIRN_CRASH_POINT("c");
        CAIRN_CRASH_POINT("ok");
        std::exit(0);
      },
      testing::KilledBySignal(SIGKILL),
      "entry 'a@0'.*entry 'b%2'.*entry 'c@x'.*entry '\\*@1x'.*"
      "crash point 'ok' hit 1: SIGKILL");
}

// The variable is read once, before main: the "threadsafe" death test style
// re-executes this binary, whose start-up reads the variable set here.
TEST(CrashPointDeathTest, EnvironmentArmsPointsAtStartUp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ASSERT_EQ(setenv("CAIRN_CRASH_POINTS", "env.point@2", 1), 0);
  EXPECT_EXIT(
      {
        CAIRN_CRASH_POINT("env.point");
        std::fprintf(stderr, "first hit passed\n");
        CAIRN_CRASH_POINT("env.point");
        std::exit(0);
      },
      testing::KilledBySignal(SIGKILL),
      "first hit passed\ncairn: crash point 'env.point' hit 2: SIGKILL");
  unsetenv("CAIRN_CRASH_POINTS");
}

}  // namespace
}  // namespace cairn
