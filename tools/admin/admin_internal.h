// What tools/admin/admin.cc (the commands) and admin_render.cc (the
// renderings) share beyond admin.h; not for use outside tools/admin.
#ifndef TIERKV_TOOLS_ADMIN_ADMIN_INTERNAL_H_
#define TIERKV_TOOLS_ADMIN_ADMIN_INTERNAL_H_

#include <string>

#include "tierkv/stats.h"

namespace tierkv::admin {

// A Prometheus sample value: the shortest text that reads back as exactly
// `value` ("0.1", not "0.10000000000000001"; "1048576", not "1.048576e+06").
std::string MetricValue(double value);

}  // namespace tierkv::admin

#endif  // TIERKV_TOOLS_ADMIN_ADMIN_INTERNAL_H_
