#pragma once

// Tests of tenants (test_tenants, test_end_users, test_cluster): a client
// of a served runtime holding one bearer token, tenants made through the
// admin routes, and end users' tokens signed as a tenant's backend would.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

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

/// `text` with every `from` replaced by `to`.
std::string replace_all(std::string text, const std::string& from,
                        const std::string& to);

/// One tenant of `isolation_world`: its key, its marker (in every text it
/// wrote), the thread IDs its key sees (its end users' as USER~ID) and its
/// memory entries; and its end users likewise, each with its own token.
struct isolated_tenant {
  struct end_user {
    std::string id;
    std::string token;
    std::string marker;
    std::set<std::string> threads; // as the end user names them
    std::vector<int64_t> memories;
  };
  tenant_keys keys;
  std::string marker;
  std::set<std::string> threads; // as the tenant's key names them
  std::vector<int64_t> memories; // its own and its end users'
  std::vector<end_user> users;
};

/// `tenants` tenants made through the admin token on `ports` (the nodes of
/// one cluster, or one server), each with the same client-chosen thread ID,
/// fresh ones, items and memories, and two end users (HS256 tokens of the
/// tenant's own issuer) with threads and memories of theirs; every write
/// through a node picked at random.
std::vector<isolated_tenant> isolation_world(const std::vector<int>& ports,
                                             int tenants);

/// `requests` requests, each through a node picked at random, as a
/// tenant's key or one of its end users, over every by-ID route with IDs of
/// other tenants and of other end users (all are known here: listed,
/// leaked or guessed), deletions of foreign memory entries, listings and
/// searches. Fails the test on any foreign byte (another tenant's or end
/// user's marker, a tenant prefix), a listing that shows what the
/// principal does not own (with `exact_lists`, one that differs from what
/// it owns), or a foreign ID answered otherwise than a missing one.
/// Returns how many foreign probes were compared with a missing ID's
/// answer.
size_t isolation_requests(const std::vector<int>& ports,
                          std::vector<isolated_tenant>& world, int requests,
                          uint32_t seed, bool exact_lists = true);

} // namespace spindle::test
