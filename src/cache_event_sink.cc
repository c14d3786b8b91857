// The names of CacheEventSink's media (src/cache_event_sink.h).
#include "src/cache_event_sink.h"

namespace tierkv {

const char* CacheMediumName(CacheMedium medium) {
  switch (medium) {
    case CacheMedium::kCpu:
      return "CPU";
    case CacheMedium::kStorage:
      return "DISK";
    case CacheMedium::kRemote:
      return "REMOTE";
  }
  return "?";
}

}  // namespace tierkv
