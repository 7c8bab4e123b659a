#include "tenant_client.hpp"

#include <chrono>

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
