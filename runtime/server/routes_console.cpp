// The browser console (docs/console.md): its page at `/` and its files at
// `/console/{file}`, from the bytes compiled into the binary. Open routes:
// the page holds no data, and asks for the token when the API answers 401.

#include "console_assets.hpp"
#include "router.hpp"

namespace spindle::http {

namespace {

// Scripts and styles from this server only, no inline script, no
// framing: what a turn's text might smuggle in cannot run.
constexpr const char* content_security_policy
  = "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

void serve_asset(async_call& call, std::string_view name) {
  auto* asset = find_console_asset(name);
  if (!asset) {
    call.fail(api_error{404, "not_found",
                        "the console has no file '"
                          + std::string{name.substr(0, 64)} + "'"});
    return;
  }
  response res;
  res.set_header("ETag", std::string{asset->etag});
  // Kept, but asked again each time: a new binary's files are seen at once.
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  if (asset->content_type.rfind("text/html", 0) == 0) {
    res.set_header("Content-Security-Policy", content_security_policy);
    res.set_header("X-Frame-Options", "DENY");
  }
  if (call.req().get_header_value("If-None-Match") == asset->etag) {
    res.status = 304;
    call.send(std::move(res));
    return;
  }
  res.status = 200;
  res.set_content(std::string{asset->body}, std::string{asset->content_type});
  call.send(std::move(res));
}

} // namespace

void add_console_routes(router& r) {
  r.get_async(
    "/", "GET /",
    [](std::shared_ptr<async_call> call) { serve_asset(*call, "index.html"); },
    /*open=*/true);
  r.get_async(
    R"(/console/([^/]+))", "GET /console/{file}",
    [](std::shared_ptr<async_call> call) {
      serve_asset(*call, call->req().matches[1]);
    },
    /*open=*/true);
}

} // namespace spindle::http
