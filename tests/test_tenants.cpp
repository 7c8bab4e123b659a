// Tenants (docs/tenants.md): tenants and keys over HTTP, scopes, isolation
// of every resource between tenants (randomized, with IDs taken from other
// tenants), revocation and expiry, keys never at rest, data written before
// tenancy kept in the default tenant, and bad input refused.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "served.hpp"
#include "server/server.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"
#include "tenant_client.hpp"
#include "tenancy/tenant_store.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

using test::answer;
using test::replace_all;
using test::make_tenant;
using test::tenant_keys;
using client = test::tenant_client;
const std::string& admin_token = test::tenants_admin_token;

runtime_options durable(const test::test_store& store) {
  runtime_options opts;
  store.apply(opts.storage);
  opts.storage.sync = sync_mode::normal;
  opts.conversation.memory = true;
  return opts;
}

server_options tenancy_on() {
  server_options so;
  so.admin_token = admin_token;
  return so;
}

// Every file under `dir`, read whole.
std::vector<std::pair<std::string, std::string>>
files_under(const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file())
      continue;
    std::ifstream in{e.path(), std::ios::binary};
    std::stringstream text;
    text << in.rdbuf();
    out.emplace_back(e.path().string(), text.str());
  }
  return out;
}

} // namespace

TEST_CASE("tenants: without --admin-token spindle serves as before and the "
          "tenant routes say tenancy is off",
          "[tenants]") {
  test::served_runtime s;
  client anyone{s.port(), ""};
  auto sent = anyone.post("/v1/threads/support-1/messages",
                          {{"content", "hello"}});
  REQUIRE(sent.status == 200);
  CHECK(sent.parsed()["thread_id"] == "support-1");
  auto refused = anyone.post("/v1/tenants", {{"name", "acme"}});
  CHECK(refused.status == 403);
  CHECK(refused.parsed()["error"]["code"] == "permission_denied");
  CHECK(refused.body.find("--admin-token") != std::string::npos);
  // A client's ID never holds the tenant separator.
  auto qualified = anyone.post("/v1/threads/t1~x/messages",
                               {{"content", "hello"}});
  CHECK(qualified.status == 400);
  CHECK(qualified.parsed()["error"]["code"] == "invalid_id");
  auto user = anyone.post("/v1/threads/support-1/messages",
                          {{"content", "hello"}, {"user_id", "t1~alice"}});
  CHECK(user.status == 400);
  CHECK(anyone.get("/v1/threads").parsed()["data"].size() == 1);
}

TEST_CASE("tenants: the admin token manages tenants and keys, a key's secret "
          "is shown once, and keys act in their tenant only",
          "[tenants]") {
  test::test_store store;
  test::served_runtime s{durable(store), tenancy_on()};
  client admin{s.port(), admin_token};
  client nobody{s.port(), ""};

  CHECK(nobody.get("/v1/threads").status == 401);
  CHECK(nobody.get("/healthz").status == 200);
  CHECK(nobody.get("/v1/openapi.json").status == 200);

  auto created = admin.post("/v1/tenants", {{"name", "Acme Corp"},
                                             {"weight", 3}});
  REQUIRE(created.status == 201);
  auto tenant = created.parsed();
  CHECK(tenant["object"] == "tenant");
  CHECK(tenant["name"] == "Acme Corp");
  CHECK(tenant["weight"] == 3);
  auto id = tenant["id"].get<std::string>();
  CHECK(valid_tenant_id(id));
  CHECK(admin.post("/v1/tenants", {{"name", "Acme Corp"}}).status == 409);

  auto list = admin.get("/v1/tenants").parsed()["data"];
  std::set<std::string> names;
  for (auto& t : list)
    names.insert(t["name"].get<std::string>());
  CHECK(names == std::set<std::string>{"default", "Acme Corp"});

  auto key = admin.post("/v1/tenants/" + id + "/keys",
                        {{"name", "backend"}, {"expires_in_s", 3600}});
  REQUIRE(key.status == 201);
  auto k = key.parsed();
  auto secret = k["key"].get<std::string>();
  CHECK(tenancy::tenant_store::looks_like_key(secret));
  CHECK(k["prefix"] == secret.substr(0, 12));
  CHECK(k["tenant"] == id);
  CHECK(k["expires_at"].is_number_integer());
  CHECK(k["scopes"]
        == json{"threads:read", "threads:write", "memories:read",
                "memories:write", "tasks:read", "tasks:write", "events:read",
                "usage:read"});

  // Listed without the secret.
  auto keys = admin.get("/v1/tenants/" + id + "/keys");
  REQUIRE(keys.status == 200);
  CHECK(keys.body.find(secret) == std::string::npos);
  CHECK(keys.parsed()["data"].size() == 1);
  CHECK(keys.parsed()["data"][0]["prefix"] == secret.substr(0, 12));

  client acme{s.port(), secret};
  auto sent = acme.post("/v1/threads/support-1/messages",
                        {{"content", "hello from acme"}});
  REQUIRE(sent.status == 200);
  CHECK(sent.parsed()["thread_id"] == "support-1");
  // The admin token manages tenants and keys, and acts in a tenant only
  // when it names one.
  auto bare = admin.get("/v1/threads/support-1");
  CHECK(bare.status == 403);
  CHECK(bare.parsed()["error"]["code"] == "permission_denied");
  client operator_in_acme{s.port(), admin_token, id};
  CHECK(operator_in_acme.get("/v1/threads/support-1").status == 200);
  client operator_in_default{s.port(), admin_token, "default"};
  CHECK(operator_in_default.get("/v1/threads/support-1").status == 404);
  client operator_nowhere{s.port(), admin_token, "tnosuchtenant"};
  auto nowhere = operator_nowhere.get("/v1/threads/support-1");
  CHECK(nowhere.status == 404);
  CHECK(nowhere.parsed()["error"]["param"] == "Spindle-Tenant");
  // A key cannot name another tenant, nor manage tenants.
  client acme_elsewhere{s.port(), secret, "default"};
  CHECK(acme_elsewhere.get("/v1/threads/support-1").status == 403);
  CHECK(acme.get("/v1/tenants").status == 403);
  // Its own keys need keys:admin.
  auto no_admin = acme.post("/v1/tenants/" + id + "/keys", json::object());
  CHECK(no_admin.status == 403);
  CHECK(no_admin.parsed()["error"]["param"] == "keys:admin");

  // Rename and weight; the default tenant keeps its name.
  auto renamed = admin.call("PATCH", "/v1/tenants/" + id,
                            json{{"name", "Acme"}}.dump());
  CHECK(renamed.status == 200);
  CHECK(renamed.parsed()["name"] == "Acme");
  CHECK(admin.call("PATCH", "/v1/tenants/default",
                   json{{"name", "other"}}.dump())
          .status
        == 400);

  // Revoked: refused on the next request.
  auto key_id = k["id"].get<std::string>();
  CHECK(admin.call("DELETE", "/v1/keys/" + key_id).status == 200);
  auto revoked = acme.get("/v1/threads/support-1");
  CHECK(revoked.status == 401);
  CHECK(admin.call("DELETE", "/v1/keys/" + key_id).status == 404);

  // A tenant with data is deleted only with force, and its data with it.
  auto refused = admin.call("DELETE", "/v1/tenants/" + id);
  CHECK(refused.status == 409);
  auto gone = admin.call("DELETE", "/v1/tenants/" + id + "?force=true");
  REQUIRE(gone.status == 200);
  CHECK(gone.parsed()["threads"] == 1);
  CHECK(admin.get("/v1/tenants/" + id).status == 404);
  // Its thread is gone from the store: nothing under its prefix is left.
  thread_list_request lr;
  lr.limit = 1000;
  auto all = s.rt().list_threads(lr);
  REQUIRE(all);
  for (auto& t : all->threads)
    CHECK(tenant_of_id(t.thread_id) != id);
  CHECK(admin.call("DELETE", "/v1/tenants/default").status == 400);
}

TEST_CASE("tenants: a key has only its scopes: a missing one is 403 naming "
          "it, and a keys:admin key manages its own tenant's keys only",
          "[tenants]") {
  test::served_runtime s{runtime_options{}, tenancy_on()};
  client admin{s.port(), admin_token};
  auto a = make_tenant(admin, "a");
  auto b = make_tenant(admin, "b");
  auto make_key = [&](const std::string& tenant, json scopes) {
    auto k = admin.post("/v1/tenants/" + tenant + "/keys",
                        {{"scopes", std::move(scopes)}});
    REQUIRE(k.status == 201);
    return k.parsed();
  };
  client reader{s.port(),
                make_key(a.id, {"threads:read"})["key"].get<std::string>()};
  client writer{s.port(), a.key};
  REQUIRE(writer.post("/v1/threads/x/messages", {{"content", "hi"}}).status
          == 200);
  CHECK(reader.get("/v1/threads/x").status == 200);
  auto no_write = reader.post("/v1/threads/x/messages", {{"content", "hi"}});
  CHECK(no_write.status == 403);
  CHECK(no_write.parsed()["error"]["param"] == "threads:write");
  CHECK(no_write.body.find("threads:write") != std::string::npos);
  auto no_memory = reader.get("/v1/memories/entries?user_id=u");
  CHECK(no_memory.status == 403);
  CHECK(no_memory.parsed()["error"]["param"] == "memories:read");
  CHECK(reader.get("/v1/events").status == 403);

  auto keys_admin = make_key(a.id, {"keys:admin", "threads:read"});
  client a_admin{s.port(), keys_admin["key"].get<std::string>()};
  // Its own tenant: yes, within its own scopes.
  auto made = a_admin.post("/v1/tenants/" + a.id + "/keys",
                           {{"scopes", {"threads:read"}}});
  CHECK(made.status == 201);
  auto wider = a_admin.post("/v1/tenants/" + a.id + "/keys",
                            {{"scopes", {"threads:write"}}});
  CHECK(wider.status == 403);
  CHECK(a_admin.get("/v1/tenants/" + a.id + "/keys").status == 200);
  // Another tenant's: no, and its key IDs answer as missing ones.
  CHECK(a_admin.get("/v1/tenants/" + b.id + "/keys").status == 403);
  auto b_keys = admin.get("/v1/tenants/" + b.id + "/keys").parsed()["data"];
  auto b_key_id = b_keys[0]["id"].get<std::string>();
  auto foreign = a_admin.call("DELETE", "/v1/keys/" + b_key_id);
  auto missing = a_admin.call("DELETE", "/v1/keys/key_0000000000000000");
  CHECK(foreign.status == 404);
  CHECK(replace_all(foreign.body, b_key_id, "{ID}")
        == replace_all(missing.body, "key_0000000000000000", "{ID}"));
  // B's key still works.
  client b_client{s.port(), b.key};
  CHECK(b_client.get("/v1/threads").status == 200);
  // Orchestration is the tenant's own.
  CHECK(writer.post("/v1/orchestrations", {{"payload", "x"}}).status == 201);
  CHECK(reader.post("/v1/orchestrations", {{"payload", "x"}}).status == 403);
}

TEST_CASE("tenants: an expired key is refused with 401 saying so",
          "[tenants]") {
  test::served_runtime s{runtime_options{}, tenancy_on()};
  client admin{s.port(), admin_token};
  auto t = admin.post("/v1/tenants", {{"name", "brief"}}).parsed();
  auto k = admin.post("/v1/tenants/" + t["id"].get<std::string>() + "/keys",
                      {{"expires_in_s", 1}});
  REQUIRE(k.status == 201);
  client brief{s.port(), k.parsed()["key"].get<std::string>()};
  CHECK(brief.get("/v1/threads").status == 200);
  std::this_thread::sleep_for(1100ms);
  auto expired = brief.get("/v1/threads");
  CHECK(expired.status == 401);
  CHECK(expired.body.find("expired") != std::string::npos);
}

TEST_CASE("tenants: a revocation in one process reaches another process's "
          "cache within the refresh bound",
          "[tenants]") {
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
  auto k = (*here)->create_key(t->id, "k", tenancy::default_scopes, 0);
  REQUIRE(k);
  tenancy::key_record found;
  auto first = (*there)->authenticate(k->secret, found);
  REQUIRE(first);
  CHECK(*first == tenancy::key_check::valid);
  CHECK(found.tenant == t->id);
  // Cached there now.
  auto cached = (*there)->cached(k->secret, found);
  REQUIRE(cached);
  CHECK(*cached == tenancy::key_check::valid);

  auto revoked_at = std::chrono::steady_clock::now();
  auto revoked = (*here)->revoke_key(k->record.id);
  REQUIRE(revoked);
  CHECK(*revoked);
  // At once where it was revoked.
  auto local = (*here)->authenticate(k->secret, found);
  REQUIRE(local);
  CHECK(*local == tenancy::key_check::unknown);
  // Within the bound elsewhere.
  for (;;) {
    auto verdict = (*there)->authenticate(k->secret, found);
    REQUIRE(verdict);
    if (*verdict == tenancy::key_check::unknown)
      break;
    REQUIRE(std::chrono::steady_clock::now() - revoked_at
            < 4 * tenancy::tenant_store::refresh + 1s);
    std::this_thread::sleep_for(10ms);
  }
  auto took = std::chrono::steady_clock::now() - revoked_at;
  INFO("the revocation took "
       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
       << " ms to reach the other process");
  CHECK(took < 2 * tenancy::tenant_store::refresh + 500ms);
}

TEST_CASE("tenants: randomized isolation: 50 tenants with two end users "
          "each, the same client IDs, 10,000 requests with IDs of other "
          "tenants and end users: no foreign byte in any answer, and a "
          "foreign ID answers as a missing one",
          "[tenants]") {
  test::test_store store;
  auto ro = durable(store);
  test::served_runtime s{ro, tenancy_on()};
  auto all = test::isolation_world({s.port()}, 50);
  constexpr int requests = 10000;
  auto compared = test::isolation_requests({s.port()}, all, requests, 20261128);
  CHECK(compared > requests / 3);
  std::vector<std::unique_ptr<client>> clients;
  for (auto& h : all)
    clients.push_back(std::make_unique<client>(s.port(), h.keys.key));

  // Idempotency keys are per tenant: the same key with different bodies
  // in two tenants runs twice instead of refusing the second.
  auto& c0 = *clients[0];
  auto& c1 = *clients[1];
  httplib::Headers keyed{{"Idempotency-Key", "same-key-everywhere"}};
  auto i0 = c0.call("POST", "/v1/threads/support-1/messages",
                    json{{"content", all[0].marker + " idem"}}.dump(), keyed);
  auto i1 = c1.call("POST", "/v1/threads/support-1/messages",
                    json{{"content", all[1].marker + " idem"}}.dump(), keyed);
  CHECK(i0.status == 200);
  CHECK(i1.status == 200);
  CHECK(i1.body.find(all[0].marker) == std::string::npos);

  // The event stream carries only the tenant's events.
  {
    std::atomic<bool> stop{false};
    std::string seen;
    std::mutex seen_mx;
    auto listener = std::thread{[&] {
      httplib::Client cli{"127.0.0.1", s.port()};
      cli.set_read_timeout(10, 0);
      httplib::Headers h{{"Authorization", "Bearer " + all[2].keys.key}};
      cli.Get("/v1/events?types=thread", h,
              [&](const char* data, size_t n) {
                std::lock_guard<std::mutex> g{seen_mx};
                seen.append(data, n);
                return !stop.load();
              });
    }};
    std::this_thread::sleep_for(300ms);
    for (int i = 3; i < 10; ++i)
      REQUIRE(clients[static_cast<size_t>(i)]
                ->post("/v1/threads/only-theirs/messages",
                       {{"content", all[static_cast<size_t>(i)].marker}})
                .status
              == 200);
    REQUIRE(clients[2]
              ->post("/v1/threads/only-mine/messages", {{"content", "x"}})
              .status
            == 200);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    for (;;) {
      {
        std::lock_guard<std::mutex> g{seen_mx};
        if (seen.find("only-mine") != std::string::npos)
          break;
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(20ms);
    }
    // One more event wakes the stream so that it sees `stop`.
    stop = true;
    clients[2]->post("/v1/threads/only-mine/messages", {{"content", "y"}});
    listener.join();
    std::lock_guard<std::mutex> g{seen_mx};
    CHECK(seen.find("only-theirs") == std::string::npos);
    for (size_t o = 0; o < all.size(); ++o)
      if (o != 2)
        CHECK(seen.find(all[o].keys.id) == std::string::npos);
  }
}

TEST_CASE("tenants: no key secret or admin token reaches the data "
          "directory, the database, the log or the metrics",
          "[tenants]") {
  test::test_store store;
  auto flags = store.serve_flags();
  flags.insert(flags.end(), {"--admin-token", admin_token});
  std::vector<std::string> secrets{admin_token};
  std::string metrics;
  {
    test::server_process srv{flags};
    client admin{srv.port(), admin_token};
    for (int i = 0; i < 5; ++i) {
      auto t = make_tenant(admin, "at rest " + std::to_string(i));
      secrets.push_back(t.key);
      client c{srv.port(), t.key};
      REQUIRE(c.post("/v1/threads/x/messages", {{"content", "hello"}}).status
              == 200);
      // A wrong key, logged as refused.
      auto wrong_key = t.key;
      wrong_key.back() = wrong_key.back() == 'Z' ? 'Y' : 'Z';
      client wrong{srv.port(), wrong_key};
      CHECK(wrong.get("/v1/threads").status == 401);
    }
    metrics = admin.get("/metrics").body;
    CHECK(metrics.find("spindle_key_authentications") != std::string::npos);
    REQUIRE(srv.stop(SIGTERM) == 0);
    auto log = srv.log();
    for (auto& secret : secrets) {
      CHECK(log.find(secret) == std::string::npos);
      CHECK(metrics.find(secret) == std::string::npos);
    }
  }
  for (auto& [path, text] : files_under(store.path()))
    for (auto& secret : secrets) {
      INFO(path);
      CHECK(text.find(secret) == std::string::npos);
    }
  if (store.on_postgres()) {
    // Every row of every table, as text.
    auto tables = store.query(
      "SELECT string_agg(table_name, ',') FROM information_schema.tables "
      "WHERE table_schema = 'public'");
    std::stringstream names{tables};
    std::string table;
    while (std::getline(names, table, ',')) {
      for (auto& secret : secrets) {
        INFO(table);
        CHECK(store.query("SELECT count(*) FROM \"" + table
                          + "\" x WHERE x::text LIKE '%" + secret + "%'")
              == "0");
      }
    }
  }
}

TEST_CASE("tenants: data written before tenancy opens as the default "
          "tenant's, and other tenants do not see it",
          "[tenants]") {
  test::test_store store;
  {
    test::server_process before{store.serve_flags()};
    client anyone{before.port(), ""};
    REQUIRE(anyone.post("/v1/threads/support-1/messages",
                        {{"content", "written before tenancy"},
                         {"user_id", "alice"}})
              .status
            == 200);
    REQUIRE(anyone.post("/v1/memories", {{"content", "alice likes tea"},
                                         {"user_id", "alice"}})
              .status
            == 201);
    REQUIRE(before.stop(SIGTERM) == 0);
  }
  auto flags = store.serve_flags();
  flags.insert(flags.end(), {"--admin-token", admin_token});
  test::server_process after{flags};
  client admin{after.port(), admin_token};
  auto list = admin.get("/v1/tenants").parsed()["data"];
  REQUIRE(list.size() == 1);
  CHECK(list[0]["id"] == "default");
  CHECK(list[0]["name"] == "default");
  auto key = admin.post("/v1/tenants/default/keys", json::object());
  REQUIRE(key.status == 201);
  client old{after.port(), key.parsed()["key"].get<std::string>()};
  auto history = old.get("/v1/threads/support-1/history");
  REQUIRE(history.status == 200);
  CHECK(history.body.find("written before tenancy") != std::string::npos);
  CHECK(old.get("/v1/memories/entries?user_id=alice")
          .body.find("alice likes tea")
        != std::string::npos);
  auto newcomer = make_tenant(admin, "newcomer");
  client fresh{after.port(), newcomer.key};
  CHECK(fresh.get("/v1/threads/support-1").status == 404);
  CHECK(fresh.get("/v1/memories/entries?user_id=alice")
          .body.find("tea")
        == std::string::npos);
  CHECK(fresh.get("/v1/threads").parsed()["data"].empty());
}

TEST_CASE("tenants: hostile names, huge scope lists and malformed tokens get "
          "a clear 4xx and change nothing",
          "[tenants]") {
  test::served_runtime s{runtime_options{}, tenancy_on()};
  client admin{s.port(), admin_token};
  auto t = make_tenant(admin, "steady");
  auto before = admin.get("/v1/tenants").body;
  auto keys_before = admin.get("/v1/tenants/" + t.id + "/keys").body;

  for (auto& name : std::vector<json>{
         "<script>alert(1)</script>", "", " padded", std::string(65, 'a'),
         "../../etc", "a\nb", "caf\xc3\xa9", 42, nullptr}) {
    auto r = admin.post("/v1/tenants", {{"name", name}});
    INFO(name.dump());
    CHECK(r.status == 400);
    CHECK(r.parsed()["error"]["code"].is_string());
  }
  CHECK(admin.post("/v1/tenants", {{"name", "x"}, {"weight", 0}}).status
        == 400);
  CHECK(admin.post("/v1/tenants", {{"name", "x"}, {"owner", "me"}}).status
        == 400);
  CHECK(admin.call("POST", "/v1/tenants", "{not json").status == 400);
  json huge = json::array();
  for (int i = 0; i < 100000; ++i)
    huge.push_back("threads:read");
  auto too_many = admin.post("/v1/tenants/" + t.id + "/keys",
                             {{"scopes", huge}});
  CHECK(too_many.status == 413);
  auto unknown = admin.post("/v1/tenants/" + t.id + "/keys",
                            {{"scopes", {"threads:read", "root"}}});
  CHECK(unknown.status == 400);
  CHECK(unknown.body.find("root") != std::string::npos);
  CHECK(admin.post("/v1/tenants/" + t.id + "/keys", {{"scopes", json::array()}})
          .status
        == 400);
  CHECK(admin.post("/v1/tenants/" + t.id + "/keys", {{"expires_in_s", -5}})
          .status
        == 400);
  CHECK(admin.post("/v1/tenants/..%2F/keys", json::object()).status == 404);
  CHECK(admin.post("/v1/tenants/tnosuchtenant/keys", json::object()).status
        == 404);

  for (auto& token : std::vector<std::string>{
         "spk_", "spk_" + std::string(40, '!'), "spk_" + std::string(400, 'a'),
         std::string(10000, 'x'), admin_token + "x", "Bearer"}) {
    client bad{s.port(), token};
    CHECK(bad.get("/v1/threads").status == 401);
  }
  for (auto& tenant : std::vector<std::string>{"../x", "T1", std::string(64, 'a'),
                                               "default~x"}) {
    client bad{s.port(), admin_token, tenant};
    CHECK(bad.get("/v1/threads").status == 404);
  }
  CHECK(admin.get("/v1/tenants").body == before);
  CHECK(admin.get("/v1/tenants/" + t.id + "/keys").body == keys_before);
  // The server goes on.
  client steady{s.port(), t.key};
  CHECK(steady.get("/v1/threads").status == 200);
}

TEST_CASE("tenants: spindle tenant and spindle key manage them through the "
          "server",
          "[tenants]") {
  test::served_runtime s{runtime_options{}, tenancy_on()};
  auto url = "http://127.0.0.1:" + std::to_string(s.port());
  std::map<std::string, std::string> env{{"SPINDLE_SERVER", url},
                                         {"SPINDLE_ADMIN_TOKEN", admin_token}};
  auto spindle = [&](std::vector<std::string> args) {
    args.insert(args.begin(), SPINDLE_BINARY);
    return test::run(args, {}, env);
  };
  auto made = spindle({"tenant", "create", "cli tenant", "--weight", "7"});
  REQUIRE(made.exit_code == 0);
  auto tenant = json::parse(made.out);
  CHECK(tenant["weight"] == 7);
  auto id = tenant["id"].get<std::string>();
  auto listed = spindle({"tenant", "list"});
  REQUIRE(listed.exit_code == 0);
  CHECK(listed.out.find(id) != std::string::npos);

  auto key = spindle({"key", "create", id, "--name", "ci", "--scope",
                      "threads:read", "--scope", "threads:write"});
  REQUIRE(key.exit_code == 0);
  auto k = json::parse(key.out);
  CHECK(k["scopes"] == json{"threads:read", "threads:write"});
  auto secret = k["key"].get<std::string>();
  client c{s.port(), secret};
  CHECK(c.post("/v1/threads/cli/messages", {{"content", "hi"}}).status
        == 200);
  auto keys = spindle({"key", "list", id});
  REQUIRE(keys.exit_code == 0);
  CHECK(keys.out.find(secret) == std::string::npos);
  CHECK(keys.out.find(k["id"].get<std::string>()) != std::string::npos);
  CHECK(spindle({"key", "revoke", k["id"].get<std::string>()}).exit_code
        == 0);
  CHECK(c.get("/v1/threads").status == 401);

  // Refusals say why, on stderr, and change nothing.
  auto taken = spindle({"tenant", "create", "cli tenant"});
  CHECK(taken.exit_code == 2);
  CHECK(taken.err.find("409 conflict") != std::string::npos);
  auto busy = spindle({"tenant", "delete", id});
  CHECK(busy.exit_code == 2);
  CHECK(spindle({"tenant", "delete", id, "--force"}).exit_code == 0);
  auto wrong = test::run({SPINDLE_BINARY, "tenant", "list"}, {},
                         {{"SPINDLE_SERVER", url},
                          {"SPINDLE_ADMIN_TOKEN", "wrong"}});
  CHECK(wrong.exit_code == 1);
  CHECK(wrong.err.find("401 unauthorized") != std::string::npos);
}

TEST_CASE("tenants: orchestration is per tenant: claims take only the "
          "tenant's tasks, lists show only its orchestrations, and another "
          "tenant's task IDs answer as missing ones",
          "[tenants]") {
  test::test_store store;
  test::served_runtime s{durable(store), tenancy_on()};
  client admin{s.port(), admin_token};
  constexpr int tenants = 6;
  std::vector<tenant_keys> keys;
  std::vector<std::unique_ptr<client>> clients;
  std::vector<std::set<std::string>> owned(tenants);
  for (int i = 0; i < tenants; ++i) {
    keys.push_back(make_tenant(admin, "orch " + std::to_string(i)));
    clients.push_back(std::make_unique<client>(s.port(), keys.back().key));
  }
  // Interleaved creation: orchestration IDs come from one counter.
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < tenants; ++i) {
      auto& c = *clients[static_cast<size_t>(i)];
      auto made = c.post("/v1/orchestrations",
                         {{"payload", {{"tenant", i}, {"round", round}}}});
      REQUIRE(made.status == 201);
      auto id = made.parsed()["id"].get<std::string>();
      owned[static_cast<size_t>(i)].insert(id);
      auto sub = c.post("/v1/tasks/" + id + "/subtasks",
                        {{"payload", {{"tenant", i}}}});
      REQUIRE(sub.status == 201);
      owned[static_cast<size_t>(i)].insert(sub.parsed()["id"].get<std::string>());
    }
  // Lists.
  for (int i = 0; i < tenants; ++i) {
    auto list = clients[static_cast<size_t>(i)]->get("/v1/orchestrations");
    REQUIRE(list.status == 200);
    auto page = list.parsed();
    for (auto& id : page["data"])
      CHECK(owned[static_cast<size_t>(i)].count(id.get<std::string>()) == 1);
    CHECK(page["data"].size() == 3);
  }
  // By ID, another tenant's: as missing.
  for (int i = 0; i < tenants; ++i) {
    auto& c = *clients[static_cast<size_t>(i)];
    auto& theirs = owned[static_cast<size_t>((i + 1) % tenants)];
    for (auto& id : theirs) {
      for (auto path : {"/v1/tasks/{ID}", "/v1/orchestrations/{ID}"}) {
        if (std::string{path}.find("orchestrations") != std::string::npos
            && id.find('_') != std::string::npos)
          continue;
        auto missing = id.find('_') == std::string::npos ? std::string{"ZZZZ"}
                                                         : "ZZZZ_t1";
        auto got = c.get(replace_all(path, "{ID}", id));
        auto control = c.get(replace_all(path, "{ID}", missing));
        CHECK(got.status == 404);
        // The message names the task or its orchestration.
        auto form = [](std::string body, const std::string& task) {
          body = replace_all(body, task, "{ID}");
          return replace_all(body, task.substr(0, task.find('_')), "{O}");
        };
        CHECK(form(got.body, id) == form(control.body, missing));
      }
      for (auto action : {"complete", "fail", "requeue"}) {
        auto got = c.post("/v1/tasks/" + id + "/" + action, json::object());
        CHECK(got.status == 404);
      }
      CHECK(c.post("/v1/tasks/" + id + "/subtasks", {{"payload", 1}}).status
            == 404);
      CHECK(c.post("/v1/ids", {{"kind", "task"}, {"parent", id}}).status
            == 404);
    }
  }
  // Claims from every tenant at once: each gets only its own tasks.
  std::vector<std::thread> workers;
  std::atomic<int> claimed{0};
  std::mutex failures_mx;
  std::vector<std::string> failures;
  for (int i = 0; i < tenants; ++i)
    workers.emplace_back([&, i] {
      client c{s.port(), keys[static_cast<size_t>(i)].key};
      for (;;) {
        auto got = c.post("/v1/tasks/claim", {{"worker", "w"}});
        if (got.status == 204)
          return;
        if (got.status != 200) {
          std::lock_guard<std::mutex> g{failures_mx};
          failures.push_back(got.body);
          return;
        }
        auto t = got.parsed();
        auto id = t["id"].get<std::string>();
        if (owned[static_cast<size_t>(i)].count(id) == 0
            || t["payload"]["tenant"] != i) {
          std::lock_guard<std::mutex> g{failures_mx};
          failures.push_back("tenant " + std::to_string(i) + " claimed "
                             + id);
        }
        ++claimed;
        auto done = c.post("/v1/tasks/" + id + "/complete",
                           {{"result", "ok"}, {"lease", t["lease"]["token"]}});
        if (done.status != 200) {
          std::lock_guard<std::mutex> g{failures_mx};
          failures.push_back(done.body);
          return;
        }
      }
    });
  for (auto& w : workers)
    w.join();
  CHECK(failures.empty());
  for (auto& f : failures)
    UNSCOPED_INFO(f);
  CHECK(claimed == tenants * 6);
  // The default tenant has none of them.
  client operator_default{s.port(), admin_token, "default"};
  CHECK(operator_default.post("/v1/tasks/claim", {{"worker", "w"}}).status
        == 204);
  CHECK(operator_default.get("/v1/orchestrations").parsed()["data"].empty());
  // A worker name holds no tenant.
  CHECK(clients[0]->post("/v1/tasks/claim", {{"worker", "a~b"}}).status
        == 400);
}

TEST_CASE("tenants: a tenant's orchestrations survive a restart in its "
          "tenant",
          "[tenants]") {
  test::test_store store;
  auto flags = store.serve_flags();
  flags.insert(flags.end(), {"--admin-token", admin_token});
  std::string key;
  std::string orchestration;
  {
    test::server_process srv{flags};
    client admin{srv.port(), admin_token};
    auto t = make_tenant(admin, "durable");
    key = t.key;
    client c{srv.port(), key};
    auto made = c.post("/v1/orchestrations", {{"payload", "kept"}});
    REQUIRE(made.status == 201);
    orchestration = made.parsed()["id"].get<std::string>();
    REQUIRE(srv.stop(SIGTERM) == 0);
  }
  test::server_process srv{flags};
  client c{srv.port(), key};
  auto tree = c.get("/v1/orchestrations/" + orchestration);
  REQUIRE(tree.status == 200);
  client operator_default{srv.port(), admin_token, "default"};
  CHECK(operator_default.get("/v1/orchestrations/" + orchestration).status
        == 404);
  CHECK(operator_default.post("/v1/tasks/claim", {{"worker", "w"}}).status
        == 204);
  auto claim = c.post("/v1/tasks/claim", {{"worker", "w"}});
  REQUIRE(claim.status == 200);
  CHECK(claim.parsed()["id"] == orchestration);
  CHECK(claim.parsed()["payload"] == "kept");
}
