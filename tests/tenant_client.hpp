#pragma once

// Tests of tenants (test_tenants, test_end_users, test_cluster): a client
// of a served runtime holding one bearer token, tenants made through the
// admin routes, and end users' tokens signed as a tenant's backend would.

#include <cstdint>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace spindle::test {

/// The admin token the tests' servers are started with.
extern const std::string tenants_admin_token;

struct answer {
  int status = 0;
  std::string body;
  nlohmann::json parsed() const {
    return nlohmann::json::parse(body, nullptr, false);
  }
};

/// One client of a served runtime with a bearer token (a key, an end
/// user's token or the admin token) and, for the admin token, a tenant to
/// act in.
class tenant_client {
public:
  tenant_client(int port, std::string token, std::string tenant = {});

  /// GET, POST, PUT, PATCH or DELETE; fails the test when nothing answers.
  answer call(const std::string& method, const std::string& path,
              const std::string& body = {}, httplib::Headers extra = {});
  answer get(const std::string& path) {
    return call("GET", path);
  }
  answer post(const std::string& path, const nlohmann::json& body) {
    return call("POST", path, body.dump());
  }
  answer put(const std::string& path, const nlohmann::json& body) {
    return call("PUT", path, body.dump());
  }

private:
  httplib::Client cli_;
  std::string token_;
  std::string tenant_;
};

struct tenant_keys {
  std::string id;
  std::string key; // every scope but keys:admin
};

/// A new tenant named `name` and a key of it with the default scopes.
tenant_keys make_tenant(tenant_client& admin, const std::string& name);

/// A JWT signed with HS256 by `secret` (header {"alg":"HS256"}).
std::string hs256_token(const std::string& secret,
                        const nlohmann::json& claims);

/// Claims of an end user's token: `iss`, `aud` (when not empty), `sub`
/// and `exp` `ttl_s` from now.
nlohmann::json user_claims(const std::string& issuer,
                           const std::string& audience,
                           const std::string& sub, int64_t ttl_s = 300);

/// Seconds since the Unix epoch.
int64_t unix_now_s();

} // namespace spindle::test
