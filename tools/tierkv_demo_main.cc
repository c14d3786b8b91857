// tierkv-demo: the RAG demo (`tools/run demo`: tierkvd and worker
// processes, tools/demo/rag_demo.h), a worker of it (`tierkv-demo worker`,
// started by the demo itself), or the one-process prefix-caching demo
// (`tierkv-demo prefix`, tools/demo/prefix_demo.h), or the trained-model
// fidelity demo (`tierkv-demo real-model`, tools/demo/real_model_demo.h).
#include <unistd.h>

#include <iostream>
#include <string>

#include "tierkv/version.h"
#include "tools/demo/prefix_demo.h"
#include "tools/demo/rag_demo.h"
#include "tools/demo/real_model_demo.h"

namespace {

using tierkv::demo::ProgressMode;

ProgressMode Resolve(ProgressMode mode) {
  if (mode != ProgressMode::kAuto) return mode;
  return isatty(STDERR_FILENO) ? ProgressMode::kBar : ProgressMode::kLines;
}

int Usage(const tierkv::Status& status) {
  std::cerr << "tierkv-demo: " << status.message()
            << "\n(tierkv-demo --help lists the flags)\n";
  return 2;
}

int ExitCode(const tierkv::Status& status) {
  std::cerr << "tierkv-demo: " << status.ToString() << '\n';
  return status.code() == tierkv::StatusCode::kInvalidArgument ? 2 : 1;
}

int RunPrefix(int argc, char** argv) {
  auto command = tierkv::demo::ParseDemoFlags(argc, argv);
  if (!command.ok()) return Usage(command.status());
  if (command->show_help) {
    std::cout << command->help_text;
    return 0;
  }
  tierkv::demo::DemoOptions options = command->options;
  options.progress = Resolve(options.progress);
  auto report = tierkv::demo::RunPrefixDemo(options, std::cout, std::cerr);
  return report.ok() ? 0 : ExitCode(report.status());
}

int RunRealModel(int argc, char** argv) {
  auto command = tierkv::demo::ParseRealModelDemoFlags(argc, argv);
  if (!command.ok()) return Usage(command.status());
  if (command->show_help) {
    std::cout << command->help_text;
    return 0;
  }
  tierkv::demo::RealModelDemoOptions options = command->options;
  options.progress = Resolve(options.progress);
  auto report = tierkv::demo::RunRealModelDemo(options, std::cout, std::cerr);
  return report.ok() ? 0 : ExitCode(report.status());
}

}  // namespace

int main(int argc, char** argv) {
  if (tierkv::WantsVersion(argc, argv)) {
    std::cout << "tierkv-demo " << tierkv::Version() << "\n";
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "prefix") {
    return RunPrefix(argc - 1, argv + 1);
  }
  if (argc > 1 && std::string(argv[1]) == "real-model") {
    return RunRealModel(argc - 1, argv + 1);
  }
  auto command = tierkv::demo::ParseRagDemoFlags(argc, argv);
  if (!command.ok()) return Usage(command.status());
  if (command->show_help) {
    std::cout << command->help_text;
    return 0;
  }
  tierkv::demo::RagDemoOptions options = command->options;
  if (!options.socket_path.empty()) {
    tierkv::Status s = tierkv::demo::RunRagWorker(options, std::cout);
    return s.ok() ? 0 : ExitCode(s);
  }
  options.progress = Resolve(options.progress);
  auto report = tierkv::demo::RunRagDemo(options, std::cout, std::cerr);
  return report.ok() ? 0 : ExitCode(report.status());
}
