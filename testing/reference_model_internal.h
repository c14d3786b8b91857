// What the reference model's source files (testing/reference_*.cc,
// testing/cached_prefill.cc) share.
#ifndef TIERKV_TESTING_REFERENCE_MODEL_INTERNAL_H_
#define TIERKV_TESTING_REFERENCE_MODEL_INTERNAL_H_

#include <string>

#include "tierkv/status.h"

namespace tierkv::reference_internal {

// InvalidArgument("reference model: " + what).
Status Invalid(const std::string& what);

}  // namespace tierkv::reference_internal

#endif  // TIERKV_TESTING_REFERENCE_MODEL_INTERNAL_H_
