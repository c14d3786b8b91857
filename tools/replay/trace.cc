#include "tools/replay/trace.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string_view>

namespace tierkv::replay {
namespace {

// A strict reader of the little JSON a trace line holds: an object whose
// values are numbers, strings, arrays, objects, true, false or null.
class LineParser {
 public:
  explicit LineParser(std::string_view text) : text_(text) {}

  StatusOr<TraceRequest> Parse() {
    TraceRequest request;
    bool has_hash_ids = false;
    TIERKV_RETURN_IF_ERROR(Expect('{'));
    SkipSpace();
    if (Peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        TIERKV_ASSIGN_OR_RETURN(std::string key, String());
        TIERKV_RETURN_IF_ERROR(Expect(':'));
        if (key == "hash_ids") {
          if (has_hash_ids) return Error("\"hash_ids\" given twice");
          TIERKV_RETURN_IF_ERROR(IdArray(&request.hash_ids));
          has_hash_ids = true;
        } else if (key == "timestamp") {
          TIERKV_ASSIGN_OR_RETURN(request.timestamp_ms, Integer(key));
        } else if (key == "input_length") {
          TIERKV_ASSIGN_OR_RETURN(request.input_length, Count(key));
        } else if (key == "output_length") {
          TIERKV_ASSIGN_OR_RETURN(request.output_length, Count(key));
        } else {
          TIERKV_RETURN_IF_ERROR(SkipValue(0));
        }
        SkipSpace();
        if (Peek() == ',') {
          ++pos_;
          continue;
        }
        TIERKV_RETURN_IF_ERROR(Expect('}'));
        break;
      }
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("text after the object");
    if (!has_hash_ids) return Error("no \"hash_ids\" array");
    return request;
  }

 private:
  static constexpr int kMaxDepth = 32;

  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r' ||
            text_[pos_] == '\n')) {
      ++pos_;
    }
  }
  Status Error(const std::string& what) const {
    return Status::InvalidArgument(what + " at column " +
                                   std::to_string(pos_ + 1));
  }
  Status Expect(char c) {
    SkipSpace();
    if (Peek() != c) return Error(std::string("expected '") + c + "'");
    ++pos_;
    return Status::Ok();
  }

  StatusOr<std::string> String() {
    SkipSpace();
    if (Peek() != '"') return Error("expected a string");
    std::string out;
    for (++pos_; pos_ < text_.size(); ++pos_) {
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c == '\\') {
        if (++pos_ == text_.size()) break;
        // Escapes matter only for skipping: keep the escaped character.
      }
      out.push_back(text_[pos_]);
    }
    return Error("unterminated string");
  }

  // A number, rounded down to an integer (a float timestamp: whole
  // milliseconds are enough).
  StatusOr<int64_t> Integer(const std::string& key) {
    SkipSpace();
    double value = 0;
    const char* begin = text_.data() + pos_;
    const char* end = text_.data() + text_.size();
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    // Within the integers a double holds exactly, and an int64 too.
    if (ec != std::errc() || ptr == begin || !(std::abs(value) < 0x1p53)) {
      return Error("\"" + key + "\" must be a number below 2^53");
    }
    pos_ += static_cast<size_t>(ptr - begin);
    return static_cast<int64_t>(std::floor(value));
  }

  // A count of tokens: an Integer, not negative.
  StatusOr<int64_t> Count(const std::string& key) {
    TIERKV_ASSIGN_OR_RETURN(const int64_t value, Integer(key));
    if (value < 0) return Error("\"" + key + "\" must not be negative");
    return value;
  }

  Status IdArray(std::vector<int64_t>* out) {
    TIERKV_RETURN_IF_ERROR(Expect('['));
    SkipSpace();
    if (Peek() == ']') {
      ++pos_;
      return Status::Ok();
    }
    for (;;) {
      SkipSpace();
      int64_t id = 0;
      const char* begin = text_.data() + pos_;
      const auto [ptr, ec] =
          std::from_chars(begin, text_.data() + text_.size(), id);
      if (ec == std::errc::result_out_of_range) {
        return Error("a hash id beyond 2^63");
      }
      if (ec != std::errc() || ptr == begin || id < 0) {
        return Error("\"hash_ids\" must hold non-negative integers");
      }
      pos_ += static_cast<size_t>(ptr - begin);
      out->push_back(id);
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      return Expect(']');
    }
  }

  Status SkipValue(int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    SkipSpace();
    const char c = Peek();
    if (c == '"') return String().status();
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      SkipSpace();
      if (Peek() == close) {
        ++pos_;
        return Status::Ok();
      }
      for (;;) {
        if (c == '{') {
          TIERKV_RETURN_IF_ERROR(String().status());
          TIERKV_RETURN_IF_ERROR(Expect(':'));
        }
        TIERKV_RETURN_IF_ERROR(SkipValue(depth + 1));
        SkipSpace();
        if (Peek() == ',') {
          ++pos_;
          continue;
        }
        return Expect(close);
      }
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return Status::Ok();
      }
    }
    double number = 0;
    const char* begin = text_.data() + pos_;
    const auto [ptr, ec] =
        std::from_chars(begin, text_.data() + text_.size(), number);
    if (ptr == begin ||
        (ec != std::errc() && ec != std::errc::result_out_of_range)) {
      return Error("expected a value");
    }
    pos_ += static_cast<size_t>(ptr - begin);
    return Status::Ok();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<TraceRequest> ParseTraceLine(const std::string& line) {
  return LineParser(line).Parse();
}

StatusOr<std::vector<TraceRequest>> ReadTrace(std::istream& in,
                                              const std::string& name) {
  std::vector<TraceRequest> requests;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    StatusOr<TraceRequest> request = ParseTraceLine(line);
    if (!request.ok()) {
      return Status::InvalidArgument(name + " line " + std::to_string(number) +
                                     ": " +
                                     std::string(request.status().message()));
    }
    requests.push_back(std::move(*request));
  }
  if (in.bad()) return Status::Internal("reading " + name + " failed");
  return requests;
}

StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return Status::NotFound("cannot open trace " + path + ": " +
                            std::strerror(errno));
  }
  return ReadTrace(in, path);
}

}  // namespace tierkv::replay
