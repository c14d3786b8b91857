// Child process of block_key_test: prints the fixture keys, one per line.
#include <cstdio>

#include "tests/key_fixtures.h"

int main() {
  for (const std::string& line : tierkv::testing::FixtureKeyLines()) {
    std::printf("%s\n", line.c_str());
  }
  return 0;
}
