#include "net/url.hpp"

namespace spindle::net {

bool parse_http_url(const std::string& url, http_origin& out,
                    std::string& error) {
  out = http_origin{};
  out.tls = url.rfind("https://", 0) == 0;
  if (!out.tls && url.rfind("http://", 0) != 0) {
    error = "must start with http:// or https://, not '" + url.substr(0, 64)
            + "'";
    return false;
  }
  auto rest = url.substr(out.tls ? 8 : 7);
  auto slash = rest.find('/');
  out.authority = rest.substr(0, slash);
  out.path = slash == std::string::npos ? "" : rest.substr(slash);
  // "host", "host:port", "[v6]", "[v6]:port".
  const auto& a = out.authority;
  std::string port;
  if (!a.empty() && a[0] == '[') {
    auto close = a.find(']');
    if (close == std::string::npos
        || (close + 1 < a.size() && a[close + 1] != ':')) {
      error = "has a malformed host: '" + a + "'";
      return false;
    }
    out.host = a.substr(1, close - 1);
    if (close + 1 < a.size())
      port = a.substr(close + 2);
  } else {
    auto colon = a.rfind(':');
    out.host = a.substr(0, colon);
    if (colon != std::string::npos)
      port = a.substr(colon + 1);
  }
  if (out.host.empty()) {
    error = "names no host: '" + url.substr(0, 64) + "'";
    return false;
  }
  if (port.empty())
    port = out.tls ? "443" : "80";
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos
      || std::stoi(port) == 0 || std::stoi(port) > 65535) {
    error = "has a bad port: '" + port + "'";
    return false;
  }
  out.port = port;
  return true;
}

} // namespace spindle::net
