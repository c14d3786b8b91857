// What a fill, verify or churn worker (tests/worker_main.cc) reports on its
// last line: "blocks N hit H missed M wrong W".
#ifndef TIERKV_TESTS_WORKER_TALLY_H_
#define TIERKV_TESTS_WORKER_TALLY_H_

#include <cstdio>
#include <string>

namespace tierkv {

struct Tally {
  long long blocks = -1, hit = -1, missed = -1, wrong = -1;
};

// The tally in a worker's output; every field -1 when there is none.
inline Tally ParseTally(const std::string& output) {
  Tally t;
  const size_t at = output.find("blocks ");
  if (at != std::string::npos) {
    std::sscanf(output.c_str() + at,
                "blocks %lld hit %lld missed %lld wrong %lld", &t.blocks,
                &t.hit, &t.missed, &t.wrong);
  }
  return t;
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_WORKER_TALLY_H_
