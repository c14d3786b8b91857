// GoogleTest matchers for Status and StatusOr<T> that print the status when
// they fail, in the manner of abseil's:
//   EXPECT_THAT(store.Put(...), IsOk());
//   EXPECT_THAT(tier->Get(key), StatusIs(StatusCode::kNotFound));
//   EXPECT_THAT(pool.Allocate(2), IsOkAndHolds(ElementsAre(1, 2)));
// Also teaches GoogleTest to print both types. Test-only; never installed.
#ifndef TIERKV_TESTS_STATUS_MATCHERS_H_
#define TIERKV_TESTS_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include <ostream>

#include "tierkv/status.h"

namespace tierkv {

inline Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const StatusOr<T>& s) {
  return s.status();
}

inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
template <typename T>
void PrintTo(const StatusOr<T>& s, std::ostream* os) {
  *os << (s.ok() ? "OK (a value)" : s.status().ToString());
}

MATCHER(IsOk, "is OK") {
  const Status s = StatusOf(arg);
  if (!s.ok()) *result_listener << "which is " << s.ToString();
  return s.ok();
}

MATCHER_P(StatusIs, code,
          std::string(negation ? "is not " : "is ") +
              std::string(StatusCodeName(code))) {
  const Status s = StatusOf(arg);
  *result_listener << "which is " << s.ToString();
  return s.code() == code;
}

MATCHER_P(IsOkAndHolds, inner,
          std::string(negation ? "is not OK or holds a value that does not "
                               : "is OK and holds a value that ") +
              "match the inner matcher") {
  if (!arg.ok()) {
    *result_listener << "which is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(inner, *arg, result_listener);
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_STATUS_MATCHERS_H_
