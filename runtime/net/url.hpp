#pragma once

#include <string>

// The origin of an http:// or https:// URL, as spindle's HTTP clients (the
// OpenAI-compatible provider, `spindle stress`) take it.

namespace spindle::net {

struct http_origin {
  bool tls = false;
  /// To resolve, for SNI and to verify a certificate against (no brackets
  /// around an IPv6 address).
  std::string host;
  /// Given, or 80 / 443.
  std::string port;
  /// "host:port" as the URL wrote it, for the Host header and messages.
  std::string authority;
  /// What follows the authority ("" or "/..."), unchanged.
  std::string path;
};

/// Parses "http[s]://host[:port][/path]". On failure returns false and
/// sets `error` to a phrase that follows the URL's name, e.g. "must start
/// with http:// or https://, not 'ftp://x'" or "has a bad port: '0'".
bool parse_http_url(const std::string& url, http_origin& out,
                    std::string& error);

} // namespace spindle::net
