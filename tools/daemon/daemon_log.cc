#include "tools/daemon/daemon_log.h"

#include <fcntl.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

namespace tierkv::daemon {
namespace {

StatusOr<spdlog::sink_ptr> OpenFileSink(const std::string& path) {
  // Tried first for its errno: a refused file is PermissionDenied.
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) {
    const int err = errno;
    const std::string why =
        "cannot open log file " + path + ": " + std::strerror(err);
    if (err == EACCES || err == EPERM || err == EROFS) {
      return Status::PermissionDenied(why);
    }
    return Status::FailedPrecondition(why);
  }
  close(fd);
  try {
    return spdlog::sink_ptr(
        std::make_shared<spdlog::sinks::basic_file_sink_mt>(path));
  } catch (const spdlog::spdlog_ex& e) {
    return Status::FailedPrecondition("cannot open log file " + path + ": " +
                                      e.what());
  }
}

}  // namespace

DaemonLog::DaemonLog(std::string path) : path_(std::move(path)) {}
DaemonLog::~DaemonLog() = default;

StatusOr<std::unique_ptr<DaemonLog>> DaemonLog::Open(const std::string& path) {
  std::unique_ptr<DaemonLog> log(new DaemonLog(path));
  spdlog::sink_ptr sink;
  if (path.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  } else {
    TIERKV_ASSIGN_OR_RETURN(spdlog::sink_ptr file, OpenFileSink(path));
    log->file_ = std::make_shared<spdlog::sinks::dist_sink_mt>(
        std::vector<spdlog::sink_ptr>{std::move(file)});
    sink = log->file_;
  }
  auto logger = std::make_shared<spdlog::logger>("", std::move(sink));
  // A daemon logs little; every line reaches the file (and a rotation)
  // at once.
  logger->flush_on(spdlog::level::trace);
  logger->set_level(spdlog::default_logger()->level());
  spdlog::set_default_logger(std::move(logger));
  return log;
}

Status DaemonLog::Reopen() {
  if (file_ == nullptr) {
    return Status::FailedPrecondition("logging to stderr; no file to reopen");
  }
  TIERKV_ASSIGN_OR_RETURN(spdlog::sink_ptr fresh, OpenFileSink(path_));
  // The old sink closes its file when the dist sink lets go of it.
  file_->set_sinks({std::move(fresh)});
  return Status::Ok();
}

}  // namespace tierkv::daemon
