// The API's description (docs/api.md, "The API as a contract"):
// GET /v1/openapi.json answers docs/openapi.yaml as JSON, with the version
// this server runs. Open, like the console: it holds no data.

#include "openapi.hpp"
#include "router.hpp"

#include <nlohmann/json.hpp>

#include "spindle/version.hpp"

namespace spindle::http {

std::string openapi_document(std::string_view version) {
  auto doc = nlohmann::json::parse(openapi_source());
  doc["info"]["version"] = std::string{version};
  return doc.dump();
}

void add_openapi_routes(router& r) {
  r.get_async(
    "/v1/openapi.json", "GET /v1/openapi.json",
    [](std::shared_ptr<async_call> call) {
      // Built once: the document never changes while the binary runs.
      static const std::string body = openapi_document(version_string);
      response res;
      res.status = 200;
      res.set_header("Cache-Control", "no-cache");
      res.set_content(body, "application/json");
      call->send(std::move(res));
    },
    /*open=*/true);
}

} // namespace spindle::http
