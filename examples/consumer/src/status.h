// The consumer's own src/status.h, unrelated to tierkv's Status: an engine
// whose include path has a header of this name must still build against
// tierkv's public headers, which are included as <tierkv/...> only.
#ifndef CONSUMER_SRC_STATUS_H_
#define CONSUMER_SRC_STATUS_H_

namespace consumer {

enum class StatusOr { kFine, kBroken };

}  // namespace consumer

#endif  // CONSUMER_SRC_STATUS_H_
