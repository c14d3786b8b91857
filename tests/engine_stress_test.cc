// EngineStress: a short run of tierkv_engine_stress
// (tests/engine_stress_main.cc): a real tierkvd and four engine-shaped worker
// processes under aborts, preemption and faults, then the audit of what tierkvd
// holds and counts. `tools/run soak --seconds N --seed S` runs the same program
// longer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/child_process.h"
#include "tests/status_matchers.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

TEST(EngineStress, NoWrongKvUnderAbortsAndFaults) {
  auto run = ChildProcess::Spawn(
      {ENGINE_STRESS_PATH, "--seconds", "15", "--seed", "1"});
  ASSERT_THAT(run, IsOk());
  const int code = (*run)->Wait();
  const std::string out = (*run)->output();
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("wrong blocks: 0,"));
  EXPECT_THAT(out, HasSubstr("dead workers: nothing held"));
  EXPECT_THAT(out, HasSubstr("engine stress: PASS"));
  // Spills, promotions and disk evictions all happened in the audit.
  EXPECT_THAT(out, ::testing::ContainsRegex(
                       "spills [1-9][0-9]*, promotions [1-9][0-9]*, disk "
                       "evictions [1-9][0-9]*"))
      << out;
  // Every kind of fault struck.
  EXPECT_THAT(out, ::testing::Not(::testing::ContainsRegex(" [a-z-]+ 0( |$)")))
      << out;
}

}  // namespace
}  // namespace tierkv
