// The tenant routes (docs/api.md, "Tenants and keys") with the admin token
// and with a tenant's key: the input is split into requests (a line each:
// METHOD PATH, then a body up to an empty line), sent to a server in
// process with tenancy on (state in memory).
//
// Invariants: no request gets a 5xx; every tenant listed has a valid ID
// and name; the tenant the fixture made and its key keep working (bad
// input changes nothing of them).

#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "fuzz.hpp"
#include "core/logging.hpp"
#include "server/server.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/runtime/runtime.hpp"
#include "tenancy/tenant_store.hpp"

using namespace spindle;
using spindle::fuzz::check;
using json = nlohmann::json;

namespace {

const std::string admin = "fuzz-admin-token";

struct served {
  std::unique_ptr<runtime> rt;
  std::unique_ptr<server> srv;
  std::unique_ptr<httplib::Client> cli;
  std::string tenant;
  std::string key;
};

served& the_server() {
  static served* s = [] {
    (void) setup_logging("off", "text");
    auto out = new served;
    runtime_options opts;
    opts.scheduler_threads = 2;
    out->rt = std::make_unique<runtime>(opts);
    server_options http;
    http.port = 0;
    http.http_threads = 1;
    http.http_workers = 2;
    http.admin_token = admin;
    out->srv = std::make_unique<server>(*out->rt, http);
    auto port = out->srv->bind();
    check(static_cast<bool>(port), "the server binds");
    out->cli = std::make_unique<httplib::Client>("127.0.0.1", *port);
    out->cli->set_read_timeout(10, 0);
    httplib::Headers h{{"Authorization", "Bearer " + admin}};
    auto t = out->cli->Post("/v1/tenants", h, R"({"name":"fixture"})",
                            "application/json");
    check(t && t->status == 201, "the fixture's tenant is created");
    out->tenant = json::parse(t->body)["id"].get<std::string>();
    auto k = out->cli->Post(("/v1/tenants/" + out->tenant + "/keys").c_str(),
                            h, R"({"scopes":["keys:admin","threads:read"]})",
                            "application/json");
    check(k && k->status == 201, "the fixture's key is created");
    out->key = json::parse(k->body)["key"].get<std::string>();
    std::atexit([] { std::_Exit(0); });
    return out;
  }();
  return *s;
}

void check_answer(const httplib::Result& r) {
  check(static_cast<bool>(r), "the server answers");
  check(r->status < 500, "no request gets a 5xx");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& s = the_server();
  std::string input{fuzz::text(data, size)};
  size_t at = 0;
  int requests = 0;
  while (at < input.size() && requests++ < 8) {
    auto eol = input.find('\n', at);
    auto line = input.substr(at, eol == std::string::npos ? std::string::npos
                                                          : eol - at);
    at = eol == std::string::npos ? input.size() : eol + 1;
    auto body_end = input.find("\n\n", at);
    auto body = input.substr(at, body_end == std::string::npos
                                   ? std::string::npos
                                   : body_end - at);
    at = body_end == std::string::npos ? input.size() : body_end + 2;
    auto space = line.find(' ');
    auto method = line.substr(0, space);
    auto path = space == std::string::npos ? "/" : line.substr(space + 1);
    // The path is the tenant routes' tail, percent-encoded as a client
    // would send it, after /v1/tenants, /v1/tenants/{fixture} or /v1/keys.
    std::string prefix = !method.empty() && method[0] == 'K'
                           ? "/v1/keys/"
                         : !method.empty() && method[0] == 'F'
                           ? "/v1/tenants/" + s.tenant
                           : "/v1/tenants";
    std::string encoded;
    for (unsigned char c : path) {
      static const char* hex = "0123456789ABCDEF";
      if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.'
          || c == '?' || c == '=' || c == '&')
        encoded += static_cast<char>(c);
      else
        encoded += std::string{"%"} + hex[c >> 4] + hex[c & 15];
    }
    auto target = prefix + encoded.substr(0, 2000);
    // Odd-length methods go with the tenant's key, even ones with the
    // admin token.
    auto token = method.size() % 2 == 1 ? s.key : admin;
    httplib::Headers h{{"Authorization", "Bearer " + token}};
    auto send = [&]() -> httplib::Result {
      switch (method.empty() ? 'G' : method.back()) {
        case 'P':
          return s.cli->Post(target.c_str(), h, body, "application/json");
        case 'A':
          return s.cli->Patch(target.c_str(), h, body, "application/json");
        case 'D':
          return s.cli->Delete(target.c_str(), h);
        default:
          return s.cli->Get(target.c_str(), h);
      }
    };
    check_answer(send());
  }
  httplib::Headers h{{"Authorization", "Bearer " + admin}};
  auto list = s.cli->Get("/v1/tenants", h);
  check_answer(list);
  auto tenants = json::parse(list->body, nullptr, false);
  check(tenants.is_object() && tenants["data"].is_array(),
        "the tenants are listed");
  for (auto& t : tenants["data"]) {
    check(valid_tenant_id(t["id"].get<std::string>()), "a tenant ID is valid");
    check(tenancy::tenant_store::check_name(t["name"].get<std::string>())
            .empty(),
          "a tenant name is valid");
  }
  // The fixture's key still reads (unless the input revoked it or deleted
  // its tenant, which the admin token may: then it is refused with 401).
  httplib::Headers mine{{"Authorization", "Bearer " + s.key}};
  auto read = s.cli->Get("/v1/threads", mine);
  check_answer(read);
  check(read->status == 200 || read->status == 401,
        "the fixture's key reads or is refused as revoked");
  return 0;
}
