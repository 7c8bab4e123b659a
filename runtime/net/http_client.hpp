#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// A blocking HTTP/1.1 client over Beast for callers that want one answer at
// a time on their own thread (`spindle stress`'s clients): one keep-alive
// connection, http:// or https://, a deadline per request. The server and
// the OpenAI-compatible provider use the event loops instead
// (docs/architecture.md, "Serving").

namespace spindle::net {

class blocking_http_client {
public:
  struct response {
    /// 0 when no answer came; `error` then says why.
    int status = 0;
    std::string body;
    /// Transport failures: resolve, connect, TLS, timeout, a broken answer.
    std::string error;
  };

  /// `url` is "http://host[:port]" or "https://host[:port]" (a path after
  /// it is ignored). Throws std::invalid_argument for anything else.
  /// `timeout` bounds each request: connecting, sending and reading.
  blocking_http_client(const std::string& url, std::chrono::milliseconds timeout);
  ~blocking_http_client();

  blocking_http_client(const blocking_http_client&) = delete;
  blocking_http_client& operator=(const blocking_http_client&) = delete;

  /// Sends one request and reads its answer. Reuses the open connection
  /// unless the server closed it (then it opens a new one before sending;
  /// a request is never sent twice).
  response request(const std::string& method, const std::string& target,
                   const std::string& body = {},
                   const std::vector<std::pair<std::string, std::string>>&
                     headers = {});

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace spindle::net
