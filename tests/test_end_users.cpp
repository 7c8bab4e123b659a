// End users as principals (docs/tenants.md, "End users"): a tenant
// registers how its end users' tokens are signed; a token acts as its
// subject in that tenant, with its own threads and memories only; bad
// tokens and bad settings are refused with nothing changed; a change of
// the settings reaches another process within the refresh bound.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <openssl/core_names.h>
#include <openssl/evp.h>

#include "served.hpp"
#include "server/server.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"
#include "tenancy/jwt.hpp"
#include "tenancy/tenant_store.hpp"
#include "tenant_client.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;
using client = test::tenant_client;
using test::answer;
using test::replace_all;

namespace {

const std::string issuer = "https://id.acme.example";
const std::string audience = "spindle";
const std::string secret = "a-shared-secret-of-the-end-user-tests-0123";

runtime_options durable(const test::test_store& store) {
  runtime_options opts;
  store.apply(opts.storage);
  opts.storage.sync = sync_mode::normal;
  opts.conversation.memory = true;
  return opts;
}

server_options tenancy_on() {
  server_options so;
  so.admin_token = test::tenants_admin_token;
  return so;
}

std::string token_of(const std::string& sub, int64_t ttl_s = 300) {
  return test::hs256_token(secret, test::user_claims(issuer, audience, sub,
                                                     ttl_s));
}

// A tenant whose end users' tokens are signed with `secret` by `issuer`.
test::tenant_keys acme(client& admin) {
  auto t = test::make_tenant(admin, "acme");
  auto set = admin.put("/v1/tenants/" + t.id + "/auth",
                       {{"issuer", issuer},
                        {"audience", audience},
                        {"hs256_secret", secret}});
  REQUIRE(set.status == 200);
  return t;
}

std::set<std::string> listed(client& c) {
  auto got = c.get("/v1/threads?limit=100");
  INFO(got.body);
  REQUIRE(got.status == 200);
  std::set<std::string> out;
  auto page = got.parsed();
  for (auto& t : page["data"])
    out.insert(t["thread_id"].get<std::string>());
  return out;
}

// An RS256 token signed by `key`.
std::string rs256_token(EVP_PKEY* key, const std::string& kid,
                        const json& claims) {
  auto input = tenancy::base64url_encode(
                 json{{"alg", "RS256"}, {"kid", kid}}.dump())
               + "." + tenancy::base64url_encode(claims.dump());
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  REQUIRE(EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key) == 1);
  size_t len = 0;
  REQUIRE(EVP_DigestSign(ctx, nullptr, &len,
                         reinterpret_cast<const unsigned char*>(input.data()),
                         input.size())
          == 1);
  std::string sig(len, '\0');
  REQUIRE(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()),
                         &len,
                         reinterpret_cast<const unsigned char*>(input.data()),
                         input.size())
          == 1);
  sig.resize(len);
  EVP_MD_CTX_free(ctx);
  return input + "." + tenancy::base64url_encode(sig);
}

std::string bn_of(EVP_PKEY* key, const char* name) {
  BIGNUM* bn = nullptr;
  REQUIRE(EVP_PKEY_get_bn_param(key, name, &bn) == 1);
  std::string out(static_cast<size_t>(BN_num_bytes(bn)), '\0');
  BN_bn2bin(bn, reinterpret_cast<unsigned char*>(out.data()));
  BN_free(bn);
  return tenancy::base64url_encode(out);
}

} // namespace

TEST_CASE("end users: a token acts as its subject: its own threads and "
          "memories only, another user_id is 403, and the tenant's key "
          "names them as USER~ID",
          "[end_users]") {
  test::test_store store;
  test::served_runtime s{durable(store), tenancy_on()};
  client admin{s.port(), test::tenants_admin_token};
  auto t = acme(admin);
  client key{s.port(), t.key};
  client alice{s.port(), token_of("alice")};
  client bob{s.port(), token_of("bob")};

  // Who each token acts as.
  auto me = alice.get("/v1/me");
  REQUIRE(me.status == 200);
  CHECK(me.parsed()["kind"] == "end_user");
  CHECK(me.parsed()["user"] == "alice");
  CHECK(me.parsed()["tenant"] == t.id);
  CHECK(me.parsed()["tenant_name"] == "acme");
  CHECK(me.parsed()["scopes"].size() == 4);
  auto key_me = key.get("/v1/me");
  CHECK(key_me.parsed()["kind"] == "key");
  CHECK(key_me.parsed()["tenant_name"] == "acme");
  CHECK(key_me.parsed()["user"].is_null());
  auto admin_me = admin.get("/v1/me");
  CHECK(admin_me.parsed()["kind"] == "admin");
  CHECK(admin_me.parsed()["tenant"].is_null());
  CHECK(client{s.port(), "spk_nope"}.get("/v1/me").status == 401);

  // The same thread ID for the tenant and for two of its end users: three
  // threads.
  REQUIRE(key.post("/v1/threads/s1/messages", {{"content", "<<tenant>>"}})
            .status
          == 200);
  auto a = alice.post("/v1/threads/s1/messages", {{"content", "<<alice>>"}});
  REQUIRE(a.status == 200);
  CHECK(a.parsed()["thread_id"] == "s1");
  REQUIRE(bob.post("/v1/threads/s1/messages", {{"content", "<<bob>>"}}).status
          == 200);
  auto fresh = bob.post("/v1/threads/new/messages", {{"content", "<<bob>>"}});
  REQUIRE(fresh.status == 200);
  auto bobs_new = fresh.parsed()["thread_id"].get<std::string>();
  CHECK(bobs_new.find('~') == std::string::npos);
  auto made = alice.post("/v1/threads", json::object());
  REQUIRE(made.status == 201);
  auto alices_made = made.parsed()["thread_id"].get<std::string>();

  CHECK(listed(alice) == std::set<std::string>{"s1", alices_made});
  CHECK(listed(bob) == std::set<std::string>{"s1", bobs_new});
  CHECK(listed(key)
        == std::set<std::string>{"s1", "alice~s1", "alice~" + alices_made,
                                 "bob~s1", "bob~" + bobs_new});
  auto history = alice.get("/v1/threads/s1/history");
  REQUIRE(history.status == 200);
  CHECK(history.body.find("<<alice>>") != std::string::npos);
  CHECK(history.body.find("<<bob>>") == std::string::npos);
  CHECK(history.body.find("<<tenant>>") == std::string::npos);
  // The tenant reads its end users' threads.
  auto seen = key.get("/v1/threads/bob~s1/history");
  REQUIRE(seen.status == 200);
  CHECK(seen.body.find("<<bob>>") != std::string::npos);
  CHECK(seen.parsed()["thread_id"] == "bob~s1");

  // Another user's thread, by its ID as that user knows it, answers as a
  // missing one; by the tenant's name for it, as an invalid ID.
  auto foreign = alice.get("/v1/threads/" + bobs_new);
  auto missing = alice.get("/v1/threads/no-such-thread");
  CHECK(foreign.status == 404);
  CHECK(replace_all(foreign.body, bobs_new, "{ID}")
        == replace_all(missing.body, "no-such-thread", "{ID}"));
  CHECK(alice.get("/v1/threads/bob~s1").status == 400);
  // Nothing changed by trying.
  CHECK(alice.post("/v1/threads/" + bobs_new + "/copy", json::object()).status
        == 404);
  CHECK(listed(bob) == std::set<std::string>{"s1", bobs_new});

  // Its user_id is its subject: absent or the same is fine, another is 403.
  auto other = alice.post("/v1/threads/s1/messages",
                          {{"content", "x"}, {"user_id", "bob"}});
  CHECK(other.status == 403);
  CHECK(other.parsed()["error"]["param"] == "user_id");
  CHECK(alice.post("/v1/threads/s1/messages",
                   {{"content", "<<alice>> again"}, {"user_id", "alice"}})
          .status
        == 200);
  auto mine = alice.post("/v1/memories", {{"content", "<<alice>> likes tea"}});
  REQUIRE(mine.status == 201);
  auto mine_id = mine.parsed()["id"].get<int64_t>();
  auto bobs = bob.post("/v1/memories", {{"content", "<<bob>> likes coffee"}});
  REQUIRE(bobs.status == 201);
  auto bobs_id = bobs.parsed()["id"].get<int64_t>();
  CHECK(alice.post("/v1/memories", {{"content", "x"}, {"user_id", "bob"}})
          .status
        == 403);
  auto entries = alice.get("/v1/memories/entries");
  REQUIRE(entries.status == 200);
  CHECK(entries.body.find("<<alice>> likes tea") != std::string::npos);
  CHECK(entries.body.find("<<bob>>") == std::string::npos);
  CHECK(alice.get("/v1/memories/entries?user_id=bob").status == 403);
  // Another user's entry answers as a missing one and stays.
  auto gone = alice.call("DELETE", "/v1/memories/" + std::to_string(bobs_id));
  auto none = alice.call("DELETE", "/v1/memories/99999999");
  CHECK(gone.status == 404);
  CHECK(replace_all(gone.body, std::to_string(bobs_id), "{ID}")
        == replace_all(none.body, "99999999", "{ID}"));
  CHECK(bob.get("/v1/memories/entries").body.find("<<bob>> likes coffee")
        != std::string::npos);
  // Its own goes.
  CHECK(alice.call("DELETE", "/v1/memories/" + std::to_string(mine_id)).status
        == 200);
  // The tenant sees its end users' memories under their IDs.
  auto tenants_view = key.get("/v1/memories/entries?user_id=bob");
  REQUIRE(tenants_view.status == 200);
  CHECK(tenants_view.body.find("<<bob>> likes coffee") != std::string::npos);

  // Everything else of the tenant is out of reach.
  for (auto* path : {"/v1/orchestrations", "/v1/events", "/v1/stats",
                     "/metrics"}) {
    INFO(path);
    CHECK(alice.get(path).status == 403);
  }
  CHECK(alice.get("/v1/tenants/" + t.id + "/keys").status == 403);
  CHECK(alice.get("/v1/tenants/" + t.id + "/auth").status == 403);
  CHECK(alice.post("/v1/tasks/claim", {{"worker", "w"}}).status == 403);
  // Idempotency keys are per end user: the same key runs for each.
  httplib::Headers keyed{{"Idempotency-Key", "same-key"}};
  auto ia = alice.call("POST", "/v1/threads/s1/messages",
                       json{{"content", "<<alice>> idem"}}.dump(), keyed);
  auto ib = bob.call("POST", "/v1/threads/s1/messages",
                     json{{"content", "<<bob>> idem"}}.dump(), keyed);
  CHECK(ia.status == 200);
  CHECK(ib.status == 200);
  CHECK(ib.body.find("<<alice>>") == std::string::npos);
  // The OpenAI route: the thread is the end user's, the user is the token's.
  auto chat = alice.post(
    "/v1/chat/completions",
    {{"model", "m"},
     {"thread_id", "s1"},
     {"messages", {{{"role", "user"}, {"content", "<<alice>> chat"}}}}});
  CHECK(chat.status == 200);
  CHECK(alice.post("/v1/chat/completions",
                   {{"model", "m"},
                    {"thread_id", "s1"},
                    {"user_id", "bob"},
                    {"messages", {{{"role", "user"}, {"content", "x"}}}}})
          .status
        == 403);
  CHECK(key.get("/v1/threads/alice~s1/history").body.find("<<alice>> chat")
        != std::string::npos);
}

TEST_CASE("end users: a wrong signature, issuer or audience, an expired "
          "token, alg none and another tenant's key are refused with 401 and "
          "change nothing",
          "[end_users]") {
  test::test_store store;
  test::served_runtime s{durable(store), tenancy_on()};
  client admin{s.port(), test::tenants_admin_token};
  auto t = acme(admin);
  auto other = test::make_tenant(admin, "other");
  const std::string other_secret = "the-other-tenants-secret-0123456789abcdef";
  REQUIRE(admin
            .put("/v1/tenants/" + other.id + "/auth",
                 {{"issuer", "https://id.other.example"},
                  {"hs256_secret", other_secret}})
            .status
          == 200);
  client alice{s.port(), token_of("alice")};
  REQUIRE(alice.post("/v1/threads/s1/messages", {{"content", "<<alice>>"}})
            .status
          == 200);
  auto before = alice.get("/v1/threads/s1/history").body;

  auto claims = test::user_claims(issuer, audience, "alice");
  auto none_header = tenancy::base64url_encode(R"({"alg":"none"})") + "."
                     + tenancy::base64url_encode(claims.dump()) + ".";
  // A character inside the signature (the last one holds padding bits:
  // changing it may make the text no base64url at all).
  auto forged = token_of("alice");
  auto& inside = forged[forged.size() - 5];
  inside = inside == 'A' ? 'B' : 'A';
  struct bad {
    const char* what;
    std::string token;
    const char* says;
  };
  const bad tokens[] = {
    {"a wrong signature", forged, "signature"},
    {"another secret",
     test::hs256_token("not-the-secret-0123456789abcdef0123456789", claims),
     "signature"},
    {"an unknown issuer",
     test::hs256_token(secret, test::user_claims("https://evil.example",
                                                 audience, "alice")),
     "issuer"},
    {"another audience",
     test::hs256_token(secret,
                       test::user_claims(issuer, "someone-else", "alice")),
     "aud"},
    {"expired", token_of("alice", -120), "expired"},
    {"alg none", none_header, "alg"},
    // Signed with the other tenant's secret but naming this tenant's
    // issuer: this tenant's secret checks it.
    {"another tenant's key", test::hs256_token(other_secret, claims),
     "signature"},
    {"no sub",
     test::hs256_token(secret, json{{"iss", issuer},
                                    {"aud", audience},
                                    {"exp", test::unix_now_s() + 60}}),
     "sub"},
  };
  // A header member of the wrong type: refused, and the server goes on.
  auto typed = tenancy::base64url_encode(R"({"alg":5})") + "."
               + tenancy::base64url_encode(claims.dump());
  typed += "." + tenancy::base64url_encode("signature");
  for (int i = 0; i < 3; ++i)
    CHECK(client{s.port(), typed}.get("/v1/threads").status == 401);
  for (auto& b : tokens) {
    INFO(b.what);
    client c{s.port(), b.token};
    for (auto* path : {"/v1/threads", "/v1/threads/s1/history"}) {
      auto got = c.get(path);
      CHECK(got.status == 401);
      CHECK(got.parsed()["error"]["code"] == "unauthorized");
      CHECK(got.body.find(b.says) != std::string::npos);
    }
    auto wrote = c.post("/v1/threads/s1/messages", {{"content", "<<evil>>"}});
    CHECK(wrote.status == 401);
  }
  CHECK(alice.get("/v1/threads/s1/history").body == before);
  // A token of the other tenant acts there: this tenant's thread is not
  // its.
  client theirs{s.port(),
                test::hs256_token(other_secret,
                                  test::user_claims("https://id.other.example",
                                                    "", "alice"))};
  CHECK(theirs.get("/v1/threads/s1").status == 404);
  CHECK(listed(theirs).empty());
  CHECK(alice.get("/v1/threads/s1/history").body == before);
}

TEST_CASE("end users: settings are checked, the secret is never shown, a "
          "JWK Set from a file verifies RS256, and removing the settings "
          "stops the tokens at once",
          "[end_users]") {
  test::test_store store;
  test::served_runtime s{durable(store), tenancy_on()};
  client admin{s.port(), test::tenants_admin_token};
  auto t = acme(admin);
  auto path = "/v1/tenants/" + t.id + "/auth";
  auto shown = admin.get(path);
  REQUIRE(shown.status == 200);
  CHECK(shown.body.find(secret) == std::string::npos);
  CHECK(shown.parsed()["hs256"] == true);
  CHECK(shown.parsed()["issuer"] == issuer);

  // Bad settings: 4xx naming the field, the settings in use unchanged.
  auto b = test::make_tenant(admin, "b");
  struct bad {
    json body;
    int status;
    const char* param;
  };
  const bad settings[] = {
    {{{"issuer", "https://b.example"}, {"hs256_secret", "short"}}, 400,
     "hs256_secret"},
    {{{"issuer", "https://b.example"}}, 400, "hs256_secret"},
    {{{"hs256_secret", secret}}, 400, "issuer"},
    {{{"issuer", "https://b.example"}, {"jwks", {{"keys", "nope"}}}}, 400,
     "jwks"},
    {{{"issuer", "https://b.example"},
      {"jwks", {{"keys", {{{"kty", "RSA"}, {"n", "!!"}, {"e", "AQAB"}}}}}}},
     400, "jwks"},
    {{{"issuer", "https://b.example"}, {"jwks", 12}}, 400, "jwks"},
    {{{"issuer", std::string(1000, 'i')}, {"hs256_secret", secret}}, 400,
     "issuer"},
    {{{"issuer", "https://b.example"},
      {"hs256_secret", secret},
      {"extra", 1}},
     400, nullptr},
    // Another tenant's issuer.
    {{{"issuer", issuer}, {"hs256_secret", secret}}, 409, nullptr},
  };
  for (auto& x : settings) {
    INFO(x.body.dump().substr(0, 200));
    auto got = admin.put("/v1/tenants/" + b.id + "/auth", x.body);
    CHECK(got.status == x.status);
    if (x.param != nullptr)
      CHECK(got.parsed()["error"]["param"] == x.param);
  }
  CHECK(admin.get("/v1/tenants/" + b.id + "/auth").status == 404);
  CHECK(admin.put("/v1/tenants/default/auth",
                  {{"issuer", "https://d.example"}, {"hs256_secret", secret}})
          .status
        == 400);
  CHECK(admin.put("/v1/tenants/tnosuchtenant/auth",
                  {{"issuer", "https://d.example"}, {"hs256_secret", secret}})
          .status
        == 404);
  // A key with keys:admin sets its own tenant's, not another's, and may
  // not make the server read a file.
  auto k = admin.post("/v1/tenants/" + b.id + "/keys",
                      {{"scopes", {"keys:admin", "threads:read"}}});
  REQUIRE(k.status == 201);
  client b_admin{s.port(), k.parsed()["key"].get<std::string>()};
  CHECK(b_admin.put(path, {{"issuer", "https://x.example"},
                           {"hs256_secret", secret}})
          .status
        == 403);
  CHECK(b_admin.put("/v1/tenants/" + b.id + "/auth",
                    {{"issuer", "https://b.example"}, {"jwks", "/etc/passwd"}})
          .status
        == 403);
  CHECK(b_admin.put("/v1/tenants/" + b.id + "/auth",
                    {{"issuer", "https://b.example"}, {"hs256_secret", secret}})
          .status
        == 200);
  // A plain key may not.
  client plain{s.port(), b.key};
  CHECK(plain.get("/v1/tenants/" + b.id + "/auth").status == 403);

  // RS256 with a JWK Set the admin gives as a file.
  EVP_PKEY* rsa = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{2048});
  REQUIRE(rsa != nullptr);
  test::temp_dir dir;
  auto jwks_file = (dir.path() / "jwks.json").string();
  {
    std::ofstream out{jwks_file};
    out << json{{"keys",
                 {{{"kty", "RSA"},
                   {"kid", "k1"},
                   {"alg", "RS256"},
                   {"n", bn_of(rsa, OSSL_PKEY_PARAM_RSA_N)},
                   {"e", bn_of(rsa, OSSL_PKEY_PARAM_RSA_E)}}}}}
             .dump();
  }
  CHECK(admin.put(path, {{"issuer", issuer}, {"jwks", "/no/such/file.json"}})
          .status
        == 400);
  // What is not a regular file is refused at once, not read: a FIFO no
  // one writes would otherwise hold the worker forever.
  auto fifo = (dir.path() / "jwks.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const auto& odd : {fifo, dir.path().string()}) {
    auto refused = admin.put(path, {{"issuer", issuer}, {"jwks", odd}});
    CHECK(refused.status == 400);
    CHECK(refused.parsed()["error"]["param"] == "jwks");
    CHECK(refused.parsed()["error"]["message"].get<std::string>().find(
            "not a regular file")
          != std::string::npos);
  }
  auto set = admin.put(path, {{"issuer", issuer}, {"jwks", jwks_file}});
  REQUIRE(set.status == 200);
  CHECK(set.parsed()["hs256"] == false);
  CHECK(set.parsed()["jwks"]["keys"][0]["kid"] == "k1");
  client rs_user{s.port(), rs256_token(rsa, "k1",
                                       test::user_claims(issuer, "", "carol"))};
  auto wrote = rs_user.post("/v1/threads/c1/messages", {{"content", "hi"}});
  CHECK(wrote.status == 200);
  // The HS256 secret is no longer accepted.
  client old{s.port(), token_of("carol")};
  CHECK(old.get("/v1/threads").status == 401);
  EVP_PKEY_free(rsa);

  // Removed: refused on the next request.
  REQUIRE(admin.call("DELETE", path).status == 200);
  CHECK(rs_user.get("/v1/threads").status == 401);
  CHECK(admin.call("DELETE", path).status == 404);
  // The end user's thread stays the tenant's.
  client key{s.port(), t.key};
  CHECK(key.get("/v1/threads/carol~c1").status == 200);
}

TEST_CASE("end users: removing a tenant's settings in one process stops its "
          "tokens in another within the refresh bound",
          "[end_users]") {
  test::test_store store;
  storage_options so;
  store.apply(so);
  so.sync = sync_mode::normal;
  auto here = tenancy::tenant_store::open(so);
  REQUIRE(here);
  auto there = tenancy::tenant_store::open(so);
  REQUIRE(there);
  auto t = (*here)->create_tenant("shared", 1);
  REQUIRE(t);
  REQUIRE((*here)->set_auth(t->id, {issuer, audience, secret, ""}));
  auto token = token_of("alice");
  bool needs_store = false;
  // Not cached there yet: the caller must allow it to read the store.
  auto first = (*there)->end_user(token, false, needs_store);
  REQUIRE(first);
  CHECK(needs_store);
  first = (*there)->end_user(token, true, needs_store);
  REQUIRE(first);
  REQUIRE(*first);
  CHECK((*first)->user == "alice");
  CHECK((*first)->tenant == t->id);
  CHECK((*first)->thread_prefix == t->id + "~alice~");
  // Cached there now, verified once.
  auto verified = (*there)->jwt_verifications();
  auto again = (*there)->end_user(token, false, needs_store);
  REQUIRE(again);
  CHECK(!needs_store);
  CHECK(*again == *first);
  CHECK((*there)->jwt_verifications() == verified);

  auto cleared_at = std::chrono::steady_clock::now();
  REQUIRE((*here)->clear_auth(t->id));
  // At once here.
  CHECK(!(*here)->end_user(token, true, needs_store));
  // Within the bound there.
  for (;;) {
    auto got = (*there)->end_user(token, true, needs_store);
    if (!got)
      break;
    REQUIRE(std::chrono::steady_clock::now() - cleared_at
            < 4 * tenancy::tenant_store::refresh + 1s);
    std::this_thread::sleep_for(10ms);
  }
  auto took = std::chrono::steady_clock::now() - cleared_at;
  CHECK(took < 2 * tenancy::tenant_store::refresh + 500ms);
  // Registered again: accepted there within the bound (an issuer found
  // unknown is remembered as such until the change arrives).
  REQUIRE((*here)->set_auth(t->id, {issuer, audience, secret, ""}));
  auto set_at = std::chrono::steady_clock::now();
  while (!(*there)->end_user(token, true, needs_store)) {
    REQUIRE(std::chrono::steady_clock::now() - set_at
            < 4 * tenancy::tenant_store::refresh + 1s);
    std::this_thread::sleep_for(10ms);
  }
  // A tenant deleted with its settings: its tokens stop too.
  REQUIRE((*here)->delete_tenant(t->id));
  auto deleted_at = std::chrono::steady_clock::now();
  while ((*there)->end_user(token, true, needs_store)) {
    REQUIRE(std::chrono::steady_clock::now() - deleted_at
            < 4 * tenancy::tenant_store::refresh + 1s);
    std::this_thread::sleep_for(10ms);
  }
}

TEST_CASE("end users: the caches answer only the exact token or key they "
          "verified: a near miss of a cached one is checked in full and "
          "refused",
          "[end_users]") {
  storage_options so;
  so.data_dir = ":memory:";
  auto store = tenancy::tenant_store::open(so);
  REQUIRE(store);
  auto& s = **store;
  auto t = s.create_tenant("near", 1);
  REQUIRE(t);
  REQUIRE(s.set_auth(t->id, {issuer, audience, secret, ""}));
  auto key = s.create_key(t->id, "k", tenancy::default_scopes, 0);
  REQUIRE(key);
  bool needs_store = false;

  // A token verified once, then answered from the cache.
  auto token = token_of("alice");
  REQUIRE(s.end_user(token, true, needs_store));
  auto verified = s.jwt_verifications();
  auto hits = s.jwt_cache_hits();
  auto again = s.end_user(token, false, needs_store);
  REQUIRE(again);
  CHECK((*again)->user == "alice");
  CHECK(s.jwt_verifications() == verified);
  CHECK(s.jwt_cache_hits() == hits + 1);

  // Its claims swapped for bob's under alice's signature; a character of
  // its signature changed; a byte more or less: each misses the cache, is
  // verified and refused.
  auto dot = token.find('.');
  auto last = token.rfind('.');
  auto bob = token_of("bob");
  auto swapped = token.substr(0, dot) + bob.substr(dot, bob.rfind('.') - dot)
                 + token.substr(last);
  auto flipped = token;
  flipped[last + 3] = flipped[last + 3] == 'A' ? 'B' : 'A';
  for (const auto& near : {swapped, flipped, token + "A",
                           token.substr(0, token.size() - 1)}) {
    INFO(near);
    auto before = s.jwt_verifications();
    auto got = s.end_user(near, true, needs_store);
    CHECK_FALSE(got);
    CHECK(s.jwt_verifications() == before + 1);
  }
  CHECK(s.jwt_cache_hits() == hits + 1);

  // A key in use, then keys one character off: none is the cached key's.
  tenancy::key_record found;
  REQUIRE(s.authenticate(key->secret, found));
  auto cached = s.cached_principal(key->secret);
  REQUIRE(cached);
  CHECK(cached->tenant == t->id);
  for (size_t at : {size_t{4}, key->secret.size() / 2, key->secret.size() - 1}) {
    auto near = key->secret;
    near[at] = near[at] == 'a' ? 'b' : 'a';
    CHECK(s.cached_principal(near) == nullptr);
    tenancy::key_record other;
    auto verdict = s.authenticate(near, other);
    REQUIRE(verdict);
    CHECK(*verdict == tenancy::key_check::unknown);
  }
}
