// What the fuzz harnesses (fuzz/*_fuzz.cc) share: FUZZ_CHECK, a check that
// holds in every build and aborts with a message, so libFuzzer records the
// input that broke it as a crash.
#ifndef TIERKV_FUZZ_FUZZ_CHECK_H_
#define TIERKV_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition, ...)                                          \
  do {                                                                      \
    if (!(condition)) {                                                     \
      std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, \
                   #condition);                                             \
      std::fprintf(stderr, __VA_ARGS__);                                    \
      std::fprintf(stderr, "\n");                                           \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

#endif  // TIERKV_FUZZ_FUZZ_CHECK_H_
