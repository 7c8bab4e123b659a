#include "tenant_client.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <catch2/catch.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "tenancy/jwt.hpp"

namespace spindle::test {

const std::string tenants_admin_token
  = "admin-token-of-the-tenant-tests-0123456789";

tenant_client::tenant_client(int port, std::string token, std::string tenant)
  : cli_("127.0.0.1", port), token_(std::move(token)),
    tenant_(std::move(tenant)) {
  cli_.set_read_timeout(30, 0);
}

answer tenant_client::call(const std::string& method, const std::string& path,
                           const std::string& body, httplib::Headers extra) {
  httplib::Headers h = std::move(extra);
  if (!token_.empty())
    h.emplace("Authorization", "Bearer " + token_);
  if (!tenant_.empty())
    h.emplace("Spindle-Tenant", tenant_);
  auto send = [&]() -> httplib::Result {
    if (method == "POST")
      return cli_.Post(path.c_str(), h, body, "application/json");
    if (method == "PUT")
      return cli_.Put(path.c_str(), h, body, "application/json");
    if (method == "PATCH")
      return cli_.Patch(path.c_str(), h, body, "application/json");
    if (method == "DELETE")
      return cli_.Delete(path.c_str(), h);
    return cli_.Get(path.c_str(), h);
  };
  auto r = send();
  REQUIRE(r);
  return answer{r->status, r->body};
}

tenant_keys make_tenant(tenant_client& admin, const std::string& name) {
  auto t = admin.post("/v1/tenants", {{"name", name}});
  REQUIRE(t.status == 201);
  auto id = t.parsed().at("id").get<std::string>();
  auto k = admin.post("/v1/tenants/" + id + "/keys", {{"name", "all"}});
  REQUIRE(k.status == 201);
  return {id, k.parsed().at("key").get<std::string>()};
}

std::string hs256_token(const std::string& secret,
                        const nlohmann::json& claims) {
  auto input = tenancy::base64url_encode(R"({"alg":"HS256","typ":"JWT"})")
               + "." + tenancy::base64url_encode(claims.dump());
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac,
       &len);
  return input + "."
         + tenancy::base64url_encode(
           std::string{reinterpret_cast<const char*>(mac), len});
}

std::string replace_all(std::string text, const std::string& from,
                        const std::string& to) {
  if (from.empty())
    return text;
  for (auto at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

int64_t unix_now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

nlohmann::json user_claims(const std::string& issuer,
                           const std::string& audience,
                           const std::string& sub, int64_t ttl_s) {
  nlohmann::json c{{"iss", issuer}, {"sub", sub}, {"exp", unix_now_s() + ttl_s}};
  if (!audience.empty())
    c["aud"] = audience;
  return c;
}

} // namespace spindle::test

namespace spindle::test {

namespace {

using json = nlohmann::json;

std::string tenant_marker(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "<<T%03zu>>", i);
  return buf;
}

std::string user_marker(size_t i, size_t u) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "<<T%03zuu%zu>>", i, u + 1);
  return buf;
}

std::string secret_of(size_t i) {
  return "the-end-user-secret-of-tenant-" + std::to_string(i)
         + "-0123456789abcdef";
}

std::string issuer_of(size_t i) {
  return "https://t" + std::to_string(i) + ".example";
}

int64_t id_of(const answer& a) {
  auto parsed = a.parsed();
  return parsed["id"].get<int64_t>();
}

std::string thread_of(const answer& a) {
  auto parsed = a.parsed();
  return parsed["thread_id"].get<std::string>();
}

} // namespace

std::vector<isolated_tenant> isolation_world(const std::vector<int>& ports,
                                             int tenants) {
  std::mt19937 rng{7};
  auto port = [&] { return ports[rng() % ports.size()]; };
  std::vector<isolated_tenant> all(static_cast<size_t>(tenants));
  for (size_t i = 0; i < all.size(); ++i) {
    auto& h = all[i];
    tenant_client admin{port(), tenants_admin_token};
    h.keys = make_tenant(admin, "tenant " + std::to_string(i));
    h.marker = tenant_marker(i);
    REQUIRE(admin
              .put("/v1/tenants/" + h.keys.id + "/auth",
                   {{"issuer", issuer_of(i)}, {"hs256_secret", secret_of(i)}})
              .status
            == 200);
    tenant_client c{port(), h.keys.key};
    // The same client-chosen ID in every tenant, and for every end user.
    REQUIRE(c.post("/v1/threads/support-1/messages",
                   {{"content", h.marker + " shared id"},
                    {"user_id", "alice"}})
              .status
            == 200);
    h.threads.insert("support-1");
    auto fresh = c.post("/v1/threads/new/messages",
                        {{"content", h.marker + " fresh"}});
    REQUIRE(fresh.status == 200);
    h.threads.insert(thread_of(fresh));
    auto made = c.post("/v1/threads", {{"metadata", {{"m", h.marker}}}});
    REQUIRE(made.status == 201);
    h.threads.insert(thread_of(made));
    auto mem = c.post("/v1/memories", {{"content", h.marker + " likes tea"},
                                       {"user_id", "alice"}});
    REQUIRE(mem.status == 201);
    h.memories.push_back(id_of(mem));
    REQUIRE(tenant_client{port(), h.keys.key}
              .post("/v1/threads/support-1/items",
                    {{"type", "text"}, {"content", h.marker + " item"}})
              .status
            == 201);
    for (size_t u = 0; u < 2; ++u) {
      isolated_tenant::end_user e;
      e.id = "u" + std::to_string(u + 1);
      e.marker = user_marker(i, u);
      e.token = hs256_token(secret_of(i),
                            user_claims(issuer_of(i), "", e.id, 3600));
      tenant_client uc{port(), e.token};
      REQUIRE(uc.post("/v1/threads/support-1/messages",
                      {{"content", e.marker + " shared id"}})
                .status
              == 200);
      e.threads.insert("support-1");
      auto mine = uc.post("/v1/threads/new/messages",
                          {{"content", e.marker + " fresh"}});
      REQUIRE(mine.status == 200);
      e.threads.insert(thread_of(mine));
      auto memory = tenant_client{port(), e.token}.post(
        "/v1/memories", {{"content", e.marker + " likes tea"}});
      REQUIRE(memory.status == 201);
      e.memories.push_back(id_of(memory));
      h.memories.push_back(e.memories.back());
      for (auto& t : e.threads)
        h.threads.insert(e.id + "~" + t);
      h.users.push_back(std::move(e));
    }
  }
  return all;
}

size_t isolation_requests(const std::vector<int>& ports,
                          std::vector<isolated_tenant>& all, int requests,
                          uint32_t seed, bool exact_lists) {
  std::mt19937 rng{seed};
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  // Routes that take a thread ID; {ID} is replaced.
  struct route {
    const char* method;
    const char* path;
    const char* body;
  };
  const route by_thread[] = {
    {"GET", "/v1/threads/{ID}", ""},
    {"GET", "/v1/threads/{ID}/history", ""},
    {"GET", "/v1/threads/{ID}/items", ""},
    {"GET", "/v1/threads/{ID}/items/render", ""},
    {"PATCH", "/v1/threads/{ID}", R"({"metadata":{"probe":"1"}})"},
    {"POST", "/v1/threads/{ID}/copy", "{}"},
    {"POST", "/v1/threads/{ID}/context", R"({"content":"what"})"},
    {"POST", "/v1/threads/{ID}/cancel", "{}"},
    {"GET", "/v1/memories?thread_id={ID}&q=tea", ""},
    {"GET", "/v1/memories/entries?thread_id={ID}", ""},
  };
  size_t compared = 0;
  for (int n = 0; n < requests; ++n) {
    auto me = pick(all.size());
    auto& mine = all[me];
    // A tenant's key half of the time, else one of its end users.
    auto as = pick(4);
    auto* user = as < 2 ? nullptr : &mine.users[as - 2];
    tenant_client c{ports[pick(ports.size())],
                    user ? user->token : mine.keys.key};
    auto& visible = user ? user->threads : mine.threads;
    // IDs this principal may not reach, as their owners name them.
    auto other = pick(all.size());
    auto& theirs = all[other];
    std::vector<std::string> foreign;
    std::vector<int64_t> foreign_memories;
    if (user) {
      // Another tenant's end users' and its own IDs, the tenant's own and
      // the other end user's: the same names as an end user's own.
      for (auto& t : theirs.threads)
        if (other != me)
          foreign.push_back(t.substr(t.find('~') + 1));
      for (auto& t : mine.threads)
        if (t.compare(0, user->id.size() + 1, user->id + "~") != 0)
          foreign.push_back(t.substr(t.find('~') + 1));
      for (auto& x : all[other == me ? (me + 1) % all.size() : other].memories)
        foreign_memories.push_back(x);
      for (auto& x : mine.memories)
        if (std::find(user->memories.begin(), user->memories.end(), x)
            == user->memories.end())
          foreign_memories.push_back(x);
    } else {
      auto& o = all[other == me ? (me + 1) % all.size() : other];
      foreign.assign(o.threads.begin(), o.threads.end());
      foreign_memories = o.memories;
    }
    answer got;
    auto kind = pick(8);
    std::string what;
    if (kind < 5) {
      auto& r = by_thread[pick(std::size(by_thread))];
      auto id = pick(4) == 0
                  ? *std::next(visible.begin(),
                               static_cast<long>(pick(visible.size())))
                  : foreign[pick(foreign.size())];
      auto path = replace_all(r.path, "{ID}", id);
      what = std::string{r.method} + " " + path;
      got = c.call(r.method, path, r.body);
      if (!visible.count(id)) {
        // Byte-identical in form to the answer for an ID that exists
        // nowhere.
        auto missing = "missing-" + std::to_string(n);
        auto control = c.call(r.method, replace_all(r.path, "{ID}", missing),
                              r.body);
        INFO(what << " as " << (user ? user->id : "the key") << " of tenant "
                  << me);
        CHECK(got.status == control.status);
        CHECK(replace_all(got.body, id, "{ID}")
              == replace_all(control.body, missing, "{ID}"));
        ++compared;
      } else if (std::string{r.path}.find("/copy") != std::string::npos
                 && got.status == 201) {
        // A copy lands beside its source: in the same end user's threads.
        auto copy = thread_of(got);
        visible.insert(copy);
        if (user) {
          mine.threads.insert(user->id + "~" + copy);
        } else if (auto sep = copy.find('~'); sep != std::string::npos) {
          for (auto& e : mine.users)
            if (e.id == copy.substr(0, sep))
              e.threads.insert(copy.substr(sep + 1));
        }
      }
    } else if (kind == 5) {
      auto id = std::to_string(
        foreign_memories[pick(foreign_memories.size())]);
      what = "DELETE /v1/memories/" + id;
      got = c.call("DELETE", "/v1/memories/" + id);
      auto control = c.call("DELETE", "/v1/memories/99999999");
      INFO(what << " as " << (user ? user->id : "the key"));
      CHECK(got.status == 404);
      CHECK(replace_all(got.body, id, "{ID}")
            == replace_all(control.body, "99999999", "{ID}"));
      ++compared;
    } else if (kind == 6) {
      what = "GET /v1/threads";
      got = c.get("/v1/threads?limit=100");
      REQUIRE(got.status == 200);
      std::set<std::string> listed;
      auto page = got.parsed();
      for (auto& t : page["data"])
        listed.insert(t["thread_id"].get<std::string>());
      INFO("request " << n << ": " << got.body.substr(0, 400));
      if (exact_lists) {
        CHECK(listed == visible);
      } else {
        // Across nodes a listing may miss a thread another node made a
        // moment ago (docs/cluster.md, "The thread listing's versions");
        // it never shows one that is not the principal's.
        CHECK(std::includes(visible.begin(), visible.end(), listed.begin(),
                            listed.end()));
      }
    } else {
      what = "memories";
      got = user ? (pick(2) == 0
                      ? c.get("/v1/memories/entries")
                      : c.get("/v1/memories?thread_id=support-1&q=tea"))
                 : (pick(2) == 0 ? c.get("/v1/memories/entries?user_id=alice")
                                 : c.get("/v1/memories?user_id=alice&"
                                         "thread_id=support-1&q=tea"));
      REQUIRE(got.status == 200);
      CHECK(got.body.find(user ? user->marker : mine.marker)
            != std::string::npos);
    }
    // No byte of another tenant or end user: its markers, its prefix, its
    // key.
    auto allowed = [&](const std::string& marker) {
      if (user)
        return marker == user->marker;
      if (marker == mine.marker)
        return true;
      for (auto& e : mine.users)
        if (marker == e.marker)
          return true;
      return false;
    };
    for (size_t o = 0; o < all.size(); ++o) {
      auto& x = all[o];
      std::vector<const std::string*> markers{&x.marker};
      for (auto& e : x.users)
        markers.push_back(&e.marker);
      for (auto* m : markers)
        if (!allowed(*m) && got.body.find(*m) != std::string::npos)
          FAIL(what << " as " << (user ? user->id : "the key") << " of tenant "
                    << me << " saw " << *m << ": "
                    << got.body.substr(0, 300));
      if (got.body.find(x.keys.id + "~") != std::string::npos
          || (o != me && got.body.find(x.keys.key) != std::string::npos))
        FAIL(what << " as tenant " << me << " saw tenant " << o << ": "
                  << got.body.substr(0, 300));
    }
    // An end user's answers name its own threads without any prefix.
    if (user)
      CHECK(got.body.find('~') == std::string::npos);
  }
  return compared;
}

} // namespace spindle::test
