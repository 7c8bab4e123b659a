// `spindle tenant create|list|delete` and `spindle key create|list|revoke`:
// the tenant routes of a running server (docs/tenants.md), for operators
// and scripts. They print the server's JSON answer on stdout; a refusal
// goes to stderr with its code and message.

#include <iostream>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "net/http_client.hpp"

namespace spindle::cli {

namespace {

using json = nlohmann::json;

struct common_args {
  std::string server;
  std::string token;
};

void add_common(CLI::App* sub, common_args& args) {
  sub->add_option("--server", args.server,
                  "base URL of the server, e.g. http://127.0.0.1:8080")
    ->envname("SPINDLE_SERVER")
    ->required();
  sub->add_option("--token", args.token,
                  "the admin token (--admin-token of spindle serve), or for "
                  "`key` a key with keys:admin")
    ->envname("SPINDLE_ADMIN_TOKEN")
    ->required();
}

// Sends one request; prints the answer. Exit: 0 for 2xx, 1 for a refusal
// or no answer, 2 for a 4xx about the input (nothing was changed).
int send(const common_args& args, const std::string& what,
         const std::string& method, const std::string& target,
         const json& body = nullptr) {
  try {
    net::blocking_http_client http{args.server, std::chrono::seconds{30}};
    auto r = http.request(method, target,
                          body.is_null() ? std::string{} : body.dump(),
                          {{"Authorization", "Bearer " + args.token},
                           {"Content-Type", "application/json"}});
    if (r.status == 0) {
      std::cerr << "spindle " << what << ": no answer from " << args.server
                << ": " << r.error << "\n";
      return exit_code::failure;
    }
    if (r.status >= 200 && r.status < 300) {
      std::cout << r.body << "\n";
      return exit_code::ok;
    }
    auto parsed = json::parse(r.body, nullptr, false);
    std::string code = "error";
    std::string message = r.body.substr(0, 300);
    if (parsed.is_object() && parsed.contains("error")
        && parsed["error"].is_object()) {
      code = parsed["error"].value("code", code);
      message = parsed["error"].value("message", message);
    }
    std::cerr << "spindle " << what << ": " << r.status << " " << code
              << ": " << message << "\n";
    return r.status == 400 || r.status == 404 || r.status == 409
               || r.status == 413
             ? exit_code::usage
             : exit_code::failure;
  } catch (const std::exception& e) {
    std::cerr << "spindle " << what << ": --server: " << e.what() << "\n";
    return exit_code::usage;
  }
}

} // namespace

void add_tenant(CLI::App& app, registry& commands) {
  auto* tenant = app.add_subcommand(
    "tenant", "manage the tenants of a server started with --admin-token "
              "(docs/tenants.md)");
  tenant->require_subcommand(1);

  {
    auto args = std::make_shared<common_args>();
    auto name = std::make_shared<std::string>();
    auto weight = std::make_shared<int64_t>(1);
    auto* sub = tenant->add_subcommand("create",
                                       "create a tenant; prints it (its id)");
    add_common(sub, *args);
    sub->add_option("name", *name, "the tenant's name")->required();
    sub->add_option("--weight", *weight,
                    "its share of the model when contended (1 to 1000)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
    commands.on(sub, [args, name, weight] {
      return send(*args, "tenant create", "POST", "/v1/tenants",
                  json{{"name", *name}, {"weight", *weight}});
    });
  }
  {
    auto args = std::make_shared<common_args>();
    auto* sub = tenant->add_subcommand("list", "list the tenants");
    add_common(sub, *args);
    commands.on(sub, [args] {
      return send(*args, "tenant list", "GET", "/v1/tenants");
    });
  }
  {
    auto args = std::make_shared<common_args>();
    auto id = std::make_shared<std::string>();
    auto force = std::make_shared<bool>(false);
    auto* sub = tenant->add_subcommand(
      "delete", "delete a tenant: refused while it holds data, unless "
                "--force, which deletes its data with it");
    add_common(sub, *args);
    sub->add_option("id", *id, "the tenant's ID")->required();
    sub->add_flag("--force", *force,
                  "delete its threads, memories and keys with it");
    commands.on(sub, [args, id, force] {
      return send(*args, "tenant delete", "DELETE",
                  "/v1/tenants/" + *id + (*force ? "?force=true" : ""));
    });
  }

  auto* key = app.add_subcommand(
    "key", "manage the keys of a tenant (docs/tenants.md)");
  key->require_subcommand(1);
  {
    auto args = std::make_shared<common_args>();
    auto tenant_id = std::make_shared<std::string>();
    auto name = std::make_shared<std::string>();
    auto scopes = std::make_shared<std::vector<std::string>>();
    auto expires = std::make_shared<int64_t>(0);
    auto* sub = key->add_subcommand(
      "create", "create a key of a tenant; prints it with its secret, "
                "shown this once");
    add_common(sub, *args);
    sub->add_option("tenant", *tenant_id, "the tenant's ID")->required();
    sub->add_option("--name", *name, "a name to tell the key by");
    sub->add_option("--scope", *scopes,
                    "a scope it holds (repeat; default: all but keys:admin)");
    sub->add_option("--expires-in-s", *expires,
                    "seconds until it expires (default: never)")
      ->check(CLI::Range(int64_t{1}, int64_t{316224000}));
    commands.on(sub, [args, tenant_id, name, scopes, expires] {
      json body = json::object();
      if (!name->empty())
        body["name"] = *name;
      if (!scopes->empty())
        body["scopes"] = *scopes;
      if (*expires > 0)
        body["expires_in_s"] = *expires;
      return send(*args, "key create", "POST",
                  "/v1/tenants/" + *tenant_id + "/keys", body);
    });
  }
  {
    auto args = std::make_shared<common_args>();
    auto tenant_id = std::make_shared<std::string>();
    auto* sub = key->add_subcommand("list",
                                    "list a tenant's keys, without secrets");
    add_common(sub, *args);
    sub->add_option("tenant", *tenant_id, "the tenant's ID")->required();
    commands.on(sub, [args, tenant_id] {
      return send(*args, "key list", "GET",
                  "/v1/tenants/" + *tenant_id + "/keys");
    });
  }
  {
    auto args = std::make_shared<common_args>();
    auto id = std::make_shared<std::string>();
    auto* sub = key->add_subcommand(
      "revoke", "revoke a key: refused at once on this server, on every "
                "node within half a second");
    add_common(sub, *args);
    sub->add_option("id", *id, "the key's ID (key_...)")->required();
    commands.on(sub, [args, id] {
      return send(*args, "key revoke", "DELETE", "/v1/keys/" + *id);
    });
  }
}

} // namespace spindle::cli
