// What the reference model's source files (testing/*.cc) share.
#ifndef TIERKV_TESTING_REFERENCE_MODEL_INTERNAL_H_
#define TIERKV_TESTING_REFERENCE_MODEL_INTERNAL_H_

#include <string>

#include "tierkv/status.h"

namespace tierkv::reference_internal {

// InvalidArgument("reference model: " + what).
Status Invalid(const std::string& what);

// The bytes of the file at `path`; NotFound naming it when it cannot be
// opened, Internal when reading fails.
StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace tierkv::reference_internal

#endif  // TIERKV_TESTING_REFERENCE_MODEL_INTERNAL_H_
