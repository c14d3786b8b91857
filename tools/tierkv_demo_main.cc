// tierkv-demo: the prefix-caching demo (`tools/run demo`). Parses flags and
// calls RunPrefixDemo; everything else lives in tools/demo/prefix_demo.h.
#include <unistd.h>

#include <iostream>

#include "tools/demo/prefix_demo.h"

int main(int argc, char** argv) {
  using tierkv::demo::ProgressMode;
  auto command = tierkv::demo::ParseDemoFlags(argc, argv);
  if (!command.ok()) {
    std::cerr << "tierkv-demo: " << command.status().message()
              << "\n(tierkv-demo --help lists the flags)\n";
    return 2;
  }
  if (command->show_help) {
    std::cout << command->help_text;
    return 0;
  }
  tierkv::demo::DemoOptions options = command->options;
  if (options.progress == ProgressMode::kAuto) {
    options.progress =
        isatty(STDERR_FILENO) ? ProgressMode::kBar : ProgressMode::kLines;
  }
  auto report = tierkv::demo::RunPrefixDemo(options, std::cout, std::cerr);
  if (!report.ok()) {
    std::cerr << "tierkv-demo: " << report.status().ToString() << '\n';
    return report.status().code() == tierkv::StatusCode::kInvalidArgument ? 2
                                                                          : 1;
  }
  return 0;
}
