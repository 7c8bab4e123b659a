#pragma once

// Recording of every answer the server sends (docs/api.md, "The API as a
// contract"): with `server_options::record_dir` set (`spindle serve` takes
// it from SPINDLE_RECORD_RESPONSES), each response, plain or streamed,
// refusals before routing included, is appended as one JSON line to
// `<dir>/responses-<pid>.jsonl`. The test suite sets it for every server
// it starts and checks all of them against docs/openapi.yaml afterwards
// (tests/openapi/conformance.py). Off by default; costs nothing then.

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "http.hpp"

namespace spindle::http {

class response_recorder
  : public std::enable_shared_from_this<response_recorder> {
public:
  /// Opens (appends to) the process's file in `dir`, creating `dir`.
  /// Null when it cannot: recording is then off, and the reason logged.
  static std::shared_ptr<response_recorder> open(const std::string& dir);

  ~response_recorder();

  /// A responder that records what passes through it to `inner`.
  responder_ptr wrap(const request& req, responder_ptr inner);

  /// Records a plain answer to `req` (a refusal before routing).
  void record(const request& req, const response& res);

  /// A streamed body is kept up to this many bytes (marked truncated).
  static constexpr size_t max_body = 1024 * 1024;

  struct entry {
    std::string method;
    std::string target;
    int status = 0;
    std::string content_type;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    bool streamed = false;
    bool complete = true;
    bool truncated = false;
  };

  void write(const entry& e);

private:
  explicit response_recorder(std::FILE* file) : file_(file) {}

  std::mutex mx_;
  std::FILE* file_;
};

} // namespace spindle::http
