// The OpenAI-compatible provider against a fake server on 127.0.0.1.

#include <catch2/catch.hpp>

#include "fake_openai.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/openai_provider.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

std::vector<chat_message> prompt() {
  return {{"system", "be brief", ""}, {"user", "hello", ""}};
}

std::shared_ptr<llm_provider> provider_for(const test::fake_openai& fake,
                                           std::string key = {}) {
  openai_options opts;
  opts.base_url = fake.url() + "/v1";
  opts.model = "test-model";
  opts.api_key = std::move(key);
  opts.read_timeout = 2s;
  auto p = make_openai_provider(opts);
  REQUIRE(p);
  return *p;
}

} // namespace

TEST_CASE("openai provider: streams deltas in order and sends the exact "
          "messages array") {
  test::fake_openai fake;
  fake.set_replies({"Donald Trump has five children."});
  auto p = provider_for(fake, "sk-test");
  std::vector<std::string> deltas;
  auto r = p->complete(prompt(), {}, [&](std::string_view d) {
    deltas.emplace_back(d);
    return true;
  });
  REQUIRE(r);
  CHECK(r->text == "Donald Trump has five children.");
  CHECK_FALSE(r->interrupted);
  CHECK(deltas.size() > 1);
  std::string joined;
  for (auto& d : deltas)
    joined += d;
  CHECK(joined == r->text);
  auto reqs = fake.requests();
  REQUIRE(reqs.size() == 1);
  CHECK(reqs[0]["model"] == "test-model");
  CHECK(reqs[0]["stream"] == true);
  CHECK(reqs[0]["messages"]
        == nlohmann::json::array({{{"role", "system"}, {"content", "be brief"}},
                                  {{"role", "user"}, {"content", "hello"}}}));
  CHECK(fake.auth_headers()[0] == "Bearer sk-test");
}

TEST_CASE("openai provider: a plain JSON completion is read as one delta") {
  test::fake_openai fake;
  fake.set_mode(test::fake_openai::mode::plain);
  fake.set_replies({"plain answer"});
  auto p = provider_for(fake);
  int calls = 0;
  auto r = p->complete(prompt(), {}, [&](std::string_view d) {
    ++calls;
    CHECK(d == "plain answer");
    return true;
  });
  REQUIRE(r);
  CHECK(r->text == "plain answer");
  CHECK(calls == 1);
}

TEST_CASE("openai provider: an upstream error is upstream_failure carrying "
          "the upstream's message") {
  test::fake_openai fake;
  fake.set_mode(test::fake_openai::mode::error);
  auto r = provider_for(fake)->complete(prompt(), {}, {});
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::upstream_failure);
  CHECK(describe(r.error()).find("500") != std::string::npos);
  CHECK(describe(r.error()).find("model is overloaded") != std::string::npos);
}

TEST_CASE("openai provider: an unreachable endpoint is upstream_failure") {
  openai_options opts;
  opts.base_url = "http://127.0.0.1:1";
  opts.model = "m";
  opts.connect_timeout = 1s;
  auto r = (*make_openai_provider(opts))->complete(prompt(), {}, {});
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::upstream_failure);
  CHECK(describe(r.error()).find("cannot reach") != std::string::npos);
}

TEST_CASE("openai provider: the overall timeout stops a slow stream") {
  test::fake_openai fake;
  fake.set_mode(test::fake_openai::mode::slow);
  fake.set_replies({std::string(70, 'x')}); // 10 chunks, 200 ms apart
  completion_options opts;
  opts.timeout = 500ms;
  auto r = provider_for(fake)->complete(prompt(), opts, {});
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::timeout);
}

TEST_CASE("openai provider: a delta callback returning false interrupts and "
          "keeps what arrived") {
  test::fake_openai fake;
  fake.set_replies({std::string(70, 'y')});
  int seen = 0;
  auto r = provider_for(fake)->complete(prompt(), {}, [&](std::string_view) {
    return ++seen < 3;
  });
  REQUIRE(r);
  CHECK(r->interrupted);
  CHECK(r->text == std::string(21, 'y'));
}

TEST_CASE("openai provider: bad settings are refused up front") {
  openai_options opts;
  opts.base_url = "ftp://x";
  opts.model = "m";
  CHECK(classify(make_openai_provider(opts).error()) == errc::invalid_argument);
  opts.base_url = "http://x";
  opts.model = "";
  CHECK(classify(make_openai_provider(opts).error()) == errc::invalid_argument);
}
