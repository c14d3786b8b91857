#include "tools/daemon/daemon_flags.h"

#include <grp.h>

#include <boost/program_options.hpp>
#include <cctype>
#include <sstream>

namespace tierkv::daemon {
namespace po = boost::program_options;

StatusOr<size_t> ParseBytes(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() &&
         std::isdigit(static_cast<unsigned char>(text[pos]))) {
    ++pos;
  }
  if (pos == 0 || pos > 18) {
    return Status::InvalidArgument("'" + text +
                                   "' is not a size (e.g. 512M, 2G)");
  }
  const size_t value = std::stoull(text.substr(0, pos));
  std::string unit = text.substr(pos);
  for (char& c : unit)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    shift = 10;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    shift = 20;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    shift = 30;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    shift = 40;
  } else {
    return Status::InvalidArgument("unknown size unit in '" + text +
                                   "' (use K, M, G or T; powers of 1024)");
  }
  if (shift > 0 && value > (SIZE_MAX >> shift)) {
    return Status::InvalidArgument("size '" + text + "' is too large");
  }
  return value << shift;
}

namespace {

StatusOr<DType> ParseDType(const std::string& text) {
  if (text == "f32" || text == "fp32" || text == "float32") return DType::kF32;
  if (text == "f16" || text == "fp16" || text == "float16") return DType::kF16;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  return Status::InvalidArgument("--dtype '" + text +
                                 "': use f32, f16 or bf16");
}

StatusOr<mode_t> ParseMode(const std::string& text) {
  size_t used = 0;
  unsigned long mode = 0;
  try {
    mode = std::stoul(text, &used, 8);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || mode > 0777 || (mode & 0600) != 0600 ||
      (mode & 0007) != 0) {
    return Status::InvalidArgument(
        "--mode '" + text +
        "': octal, owner read-write, nothing for others (e.g. 0600, 0660)");
  }
  return static_cast<mode_t>(mode);
}

StatusOr<DiskCodec> ParseCodec(const std::string& text) {
  for (DiskCodec c :
       {DiskCodec::kNone, DiskCodec::kLz4, DiskCodec::kLz4BytePlanes}) {
    if (text == DiskCodecName(c)) return c;
  }
  return Status::InvalidArgument("--disk-codec '" + text +
                                 "': use none, lz4 or lz4-byte-planes");
}

}  // namespace

StatusOr<DaemonCommand> ParseDaemonFlags(int argc, const char* const* argv) {
  DaemonCommand command;
  ipc::ServerOptions& s = command.server;
  std::string capacity = "1G", dtype = "bf16", mode = "0600", group;
  std::string disk_capacity = "16G", codec = "none";
  po::options_description desc(
      "tierkvd: the tierkv coordinator. Owns the index, LRU and pins of the\n"
      "host tier (shared memory) for one store and serves engine workers.\n"
      "Stops cleanly on SIGINT or SIGTERM.\n\nOptions");
  desc.add_options()("help,h", "show this help and exit")(
      "store", po::value(&s.store)->default_value(s.store),
      "store name; names the shared-memory segments /tierkv.<store>.*")(
      "socket", po::value(&s.socket_path),
      "control socket path (default: $XDG_RUNTIME_DIR/tierkv-<store>.sock,"
      " or /tmp/tierkv-<uid>-<store>.sock)")(
      "host-capacity", po::value(&capacity)->default_value(capacity),
      "host DRAM for KV blocks (K, M, G, T suffixes, powers of 1024)")(
      "layers", po::value(&s.layout.num_layers)->required(),
      "KV layout: number of layers (required)")(
      "kv-heads", po::value(&s.layout.num_kv_heads)->required(),
      "KV layout: KV heads per layer (required)")(
      "head-dim", po::value(&s.layout.head_dim)->required(),
      "KV layout: head dimension (required)")(
      "block-size",
      po::value(&s.layout.block_size)->default_value(s.layout.block_size),
      "KV layout: tokens per block")("dtype",
                                     po::value(&dtype)->default_value(dtype),
                                     "KV layout: f32, f16 or bf16")(
      "mode", po::value(&mode)->default_value(mode),
      "permission bits of the socket and segments (octal)")(
      "group", po::value(&group),
      "let this group's workers attach too (use with --mode 0660)")(
      "disk-dir", po::value(&s.disk_path),
      "disk tier: a RocksDB directory (created if missing) that blocks "
      "spill to when host memory runs short, and that survives restarts "
      "(default: no disk tier)")(
      "disk-capacity", po::value(&disk_capacity)->default_value(disk_capacity),
      "disk tier: bound on stored bytes; least recently used blocks are "
      "evicted")("disk-codec", po::value(&codec)->default_value(codec),
                 "disk tier: none, lz4 or lz4-byte-planes (see BENCHMARKS.md)")(
      "spill-high",
      po::value(&s.spill_high)->default_value(s.spill_high, "0.9"),
      "spill to disk once this fraction of host slots is in use")(
      "spill-low", po::value(&s.spill_low)->default_value(s.spill_low, "0.7"),
      "spilling stops once at most this fraction is in use")(
      "max-workers", po::value(&s.max_workers)->default_value(s.max_workers),
      "most workers attached at once")(
      "log-level", po::value(&command.log_level)->default_value("info"),
      "trace, debug, info, warn, error or off");
  std::ostringstream help;
  help << desc
       << "\nExample:\n  tierkvd --layers 32 --kv-heads 8 --head-dim "
          "128 --host-capacity 8G \\\n      --disk-dir /var/lib/tierkv/default "
          "--disk-capacity 200G\n";
  command.help_text = help.str();
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help") != 0) {
      command.show_help = true;
      return command;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    return Status::InvalidArgument(e.what());
  }
  TIERKV_ASSIGN_OR_RETURN(s.host_capacity_bytes, ParseBytes(capacity));
  TIERKV_ASSIGN_OR_RETURN(s.layout.dtype, ParseDType(dtype));
  TIERKV_ASSIGN_OR_RETURN(s.mode, ParseMode(mode));
  TIERKV_ASSIGN_OR_RETURN(s.disk_capacity_bytes, ParseBytes(disk_capacity));
  TIERKV_ASSIGN_OR_RETURN(s.disk_codec, ParseCodec(codec));
  if (!(s.spill_low > 0 && s.spill_low <= s.spill_high && s.spill_high <= 1)) {
    return Status::InvalidArgument(
        "--spill-low and --spill-high must satisfy 0 < low <= high <= 1");
  }
  if (!group.empty()) {
    const struct group* g = getgrnam(group.c_str());
    if (g == nullptr) {
      return Status::InvalidArgument("--group '" + group + "': no such group");
    }
    s.group = g->gr_gid;
  }
  if (Status v = s.layout.Validate(); !v.ok()) {
    return Status::InvalidArgument("layout: " + v.message());
  }
  static const char* kLevels[] = {"trace", "debug",    "info", "warn",
                                  "error", "critical", "off"};
  bool known = false;
  for (const char* l : kLevels) known = known || command.log_level == l;
  if (!known) {
    return Status::InvalidArgument("--log-level '" + command.log_level +
                                   "': use trace, debug, info, warn, error "
                                   "or off");
  }
  return command;
}

}  // namespace tierkv::daemon
