// Tool calls kept whole: assistant turns carry their calls, tool turns
// answer open calls, batches of turns append all or nothing, and a prompt
// never leaves a call without a result (docs/threads.md, "Tool calls").

#include <atomic>
#include <future>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "fake_openai.hpp"
#include "spindle/messages/context_builder.hpp"
#include "spindle/runtime/openai_provider.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

turn calling(std::vector<tool_call> calls, std::string content = {}) {
  turn t = make_assistant_turn(std::move(content));
  t.tool_calls = std::move(calls);
  return t;
}

tool_call call(std::string id, std::string name = "lookup",
               std::string args = R"({"q":"x"})") {
  return tool_call{std::move(id), std::move(name), std::move(args)};
}

runtime_options durable(const test::temp_dir& dir) {
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  opts.storage.sync = sync_mode::normal;
  return opts;
}

errc code_of(const caf::error& err) {
  return classify(err);
}

} // namespace

TEST_CASE("tool calls: a turn's calls are checked and travel as OpenAI's "
          "JSON") {
  CHECK_FALSE(validate_turn(calling({call("a"), call("b", "get-weather_2")})));
  CHECK(code_of(validate_turn(calling({call("a"), call("a")})))
        == errc::invalid_argument);
  CHECK(code_of(validate_turn(calling({call("")}))) == errc::invalid_argument);
  CHECK(code_of(validate_turn(calling({call("a", "no spaces")})))
        == errc::invalid_argument);
  CHECK(code_of(validate_turn(calling({call("a", std::string(65, 'n'))})))
        == errc::invalid_argument);
  std::vector<tool_call> many;
  for (size_t i = 0; i <= max_tool_calls; ++i)
    many.push_back(call("c" + std::to_string(i)));
  CHECK(code_of(validate_turn(calling(many))) == errc::too_large);
  CHECK(code_of(validate_turn(calling(
          {call("a", "f", std::string(max_turn_content, 'x'))}, "hi")))
        == errc::too_large);
  auto user = make_user_turn("hi");
  user.tool_calls = {call("a")};
  CHECK(code_of(validate_turn(user)) == errc::invalid_argument);

  std::vector<tool_call> calls{call("a", "f", R"({"city":"Oslo"})"),
                               call("b", "g", "not json at all")};
  auto text = tool_calls_to_json(calls);
  auto doc = json::parse(text);
  CHECK(doc[0] == json{{"id", "a"},
                       {"type", "function"},
                       {"function",
                        {{"name", "f"}, {"arguments", R"({"city":"Oslo"})"}}}});
  auto back = tool_calls_from_json(text);
  REQUIRE(back);
  CHECK(*back == calls);
  CHECK(tool_calls_to_json({}).empty());
  CHECK(tool_calls_from_json("")->empty());
  for (auto bad : {R"({"id":"a"})", R"([1])", R"([{"id":1,"function":{}}])",
                   R"([{"id":"a","type":"code","function":{"name":"f"}}])",
                   R"([{"id":"a","function":{"name":"f","arguments":{}}}])",
                   R"([{"id":"a","function":{"name":"f"},"extra":1}])",
                   "[{"}) {
    INFO(bad);
    auto got = tool_calls_from_json(bad);
    REQUIRE_FALSE(got);
    CHECK(code_of(got.error()) == errc::invalid_argument);
  }
}

TEST_CASE("tool calls: a batch is checked against the thread's calls") {
  tool_call_ledger ledger;
  ledger.add(calling({call("old-1"), call("old-2")}));
  ledger.add(make_tool_turn("done", "old-1"));
  auto ok = [&](std::vector<turn> batch) {
    return !validate_turn_batch(ledger, batch);
  };
  CHECK(ok({make_tool_turn("late", "old-2")}));
  CHECK(ok({calling({call("new")}), make_tool_turn("r", "new"),
            make_assistant_turn("summary")}));
  CHECK_FALSE(ok({make_tool_turn("again", "old-1")}));  // answered
  CHECK_FALSE(ok({make_tool_turn("who", "unknown")}));  // no such call
  CHECK_FALSE(ok({calling({call("old-2")})}));          // ID reused
  CHECK_FALSE(ok({calling({call("x")}), calling({call("x")})}));
  CHECK_FALSE(ok({make_tool_turn("early", "y"), calling({call("y")})}));
  CHECK_FALSE(ok({calling({call("z")}), make_tool_turn("1", "z"),
                  make_tool_turn("2", "z")}));
  CHECK_FALSE(ok({}));
  CHECK(code_of(validate_turn_batch(
          ledger, std::vector<turn>(max_turn_batch + 1, make_user_turn("x"))))
        == errc::too_large);
  auto err = validate_turn_batch(ledger, {make_user_turn("fine"),
                                          make_tool_turn("r", "nope")});
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("turns[1]"));
}

TEST_CASE("tool calls: a prompt closes every call in order and leaves out "
          "tool results that answer no call") {
  auto msg = [](const turn& t) { return to_chat_message(t); };
  std::vector<chat_message> history{
    msg(make_tool_turn("orphan", "gone")), // its call fell out of the window
    msg(make_user_turn("weather in Oslo and Rome?")),
    msg(calling({call("c1"), call("c2")})),
    msg(make_tool_turn("Oslo: 3C", "c1")),
    msg(make_user_turn("and Paris?")),
    msg(calling({call("c3")})),
    msg(make_user_turn("hello?")),
    msg(make_tool_turn("Paris: 9C", "c3")), // stored late
  };
  auto out = close_tool_calls(history);
  std::vector<std::string> shape;
  for (auto& m : out)
    shape.push_back(m.role + (m.tool_call_id.empty() ? "" : ":" + m.tool_call_id)
                    + (m.tool_calls.empty() ? "" : "+calls"));
  CHECK(shape
        == std::vector<std::string>{"user", "assistant+calls", "tool:c1",
                                    "tool:c2", "user", "assistant+calls",
                                    "tool:c3", "user"});
  CHECK(out[2].content == "Oslo: 3C");
  CHECK(out[3].content == interrupted_tool_result);
  CHECK(out[6].content == "Paris: 9C");
  std::vector<chat_message> plain{msg(make_user_turn("a")),
                                  msg(make_assistant_turn("b"))};
  CHECK(close_tool_calls(plain) == plain);
}

TEST_CASE("tool calls: a batch is stored whole with its calls and a refused "
          "batch stores nothing across a restart") {
  test::temp_dir dir;
  const std::string id = "agent-thread";
  {
    runtime rt{durable(dir)};
    REQUIRE(rt.add_turn(id, make_user_turn("what is the weather?")));
    auto n = rt.append_turns(id, {calling({call("w1", "weather",
                                                R"({"city":"Oslo"})")},
                                          "Let me look."),
                                  make_tool_turn("3C and snow", "w1"),
                                  make_assistant_turn("It is 3C in Oslo.")});
    REQUIRE(n);
    CHECK(*n == 4);
    for (auto bad : std::vector<std::vector<turn>>{
           {make_tool_turn("again", "w1")},
           {make_user_turn("ok"), make_tool_turn("x", "unknown")},
           {calling({call("w1")})},
           {make_user_turn("")}}) {
      auto refused = rt.append_turns(id, bad);
      REQUIRE_FALSE(refused);
      CHECK(code_of(refused.error()) == errc::invalid_argument);
    }
    auto info = rt.thread_details(id);
    REQUIRE(info);
    CHECK(info->turns == 4);
  }
  runtime rt{durable(dir)};
  auto snap = rt.snapshot(id);
  REQUIRE(snap);
  REQUIRE(snap->turns.size() == 4);
  REQUIRE(snap->turns[1].tool_calls.size() == 1);
  CHECK(snap->turns[1].tool_calls[0]
        == call("w1", "weather", R"({"city":"Oslo"})"));
  CHECK(snap->turns[1].content == "Let me look.");
  CHECK(snap->turns[2].tool_call_id == "w1");
  // The ledger is rebuilt from the stored turns: w1 is answered, still.
  auto again = rt.append_turns(id, {make_tool_turn("dup", "w1")});
  REQUIRE_FALSE(again);
  CHECK(code_of(again.error()) == errc::invalid_argument);
}

TEST_CASE("tool calls: concurrent batches and single turns never interleave "
          "and every call is answered once") {
  runtime rt;
  const std::string id = "busy-agent";
  REQUIRE(rt.add_turn(id, make_user_turn("start")));
  constexpr int workers = 8, batches = 40;
  std::vector<std::future<void>> running;
  for (int w = 0; w < workers; ++w)
    running.push_back(std::async(std::launch::async, [&, w] {
      for (int b = 0; b < batches; ++b) {
        auto tag = std::to_string(w) + "-" + std::to_string(b);
        if (b % 4 == 3) {
          REQUIRE(rt.add_turn(id, make_user_turn("note " + tag)));
          continue;
        }
        auto n = rt.append_turns(id, {calling({call("a" + tag),
                                               call("b" + tag)}),
                                      make_tool_turn("ra", "a" + tag),
                                      make_tool_turn("rb", "b" + tag)});
        REQUIRE(n);
      }
    }));
  for (auto& f : running)
    f.get();
  auto snap = rt.snapshot(id);
  REQUIRE(snap);
  std::set<std::string> answered;
  size_t calls = 0;
  for (size_t i = 0; i < snap->turns.size(); ++i) {
    auto& t = snap->turns[i];
    if (t.tool_calls.empty())
      continue;
    ++calls;
    // A batch lands whole: its two results follow its call at once.
    REQUIRE(i + 2 < snap->turns.size());
    CHECK(snap->turns[i + 1].tool_call_id == t.tool_calls[0].id);
    CHECK(snap->turns[i + 2].tool_call_id == t.tool_calls[1].id);
    for (auto& c : t.tool_calls)
      CHECK(answered.insert(c.id).second);
  }
  CHECK(calls == workers * batches * 3 / 4);
  CHECK(snap->turns.size() == 1 + calls * 3 + workers * batches / 4);
}

TEST_CASE("tool calls: a call left open reaches the upstream closed and in "
          "order") {
  test::fake_openai fake;
  runtime_options opts;
  openai_options o;
  o.base_url = fake.url() + "/v1";
  o.model = "test-model";
  auto provider = make_openai_provider(o);
  REQUIRE(provider);
  opts.provider = *provider;
  runtime rt{opts};
  const std::string id = "dangling";
  REQUIRE(rt.add_turn(id, make_user_turn("Oslo and Rome?")));
  REQUIRE(rt.append_turns(id, {calling({call("c1", "weather"),
                                        call("c2", "weather")}),
                               make_tool_turn("Oslo: 3C", "c1")}));
  auto sent = rt.send_message(id, "never mind, thanks", "",
                              conflict_policy::queue, 12);
  REQUIRE(sent);
  auto requests = fake.requests();
  REQUIRE(!requests.empty());
  auto& messages = requests.back()["messages"];
  std::vector<std::string> roles;
  for (auto& m : messages)
    roles.push_back(m["role"].get<std::string>());
  // (a system prompt may come first)
  auto at = std::find(roles.begin(), roles.end(), "assistant") - roles.begin();
  REQUIRE(static_cast<size_t>(at) + 3 < roles.size());
  auto& asked = messages[at];
  REQUIRE(asked["tool_calls"].size() == 2);
  CHECK(asked["tool_calls"][0]["id"] == "c1");
  CHECK(asked["tool_calls"][0]["type"] == "function");
  CHECK(asked["tool_calls"][0]["function"]["name"] == "weather");
  CHECK(asked["content"].is_null());
  CHECK(messages[at + 1] == json{{"role", "tool"},
                                 {"content", "Oslo: 3C"},
                                 {"tool_call_id", "c1"}});
  CHECK(messages[at + 2]["tool_call_id"] == "c2");
  CHECK(messages[at + 2]["content"] == std::string{interrupted_tool_result});
  CHECK(messages[at + 3]["role"] == "user");
  // Stored turns are not rewritten: c2 has no result in the thread.
  auto snap = rt.snapshot(id);
  REQUIRE(snap);
  CHECK(snap->turns.size() == 5);
  CHECK(snap->turns[3].content == "never mind, thanks");
}

// -- HTTP ------------------------------------------------------------------------

TEST_CASE("tool calls: POST turns appends a batch shows the calls in the "
          "history and refuses bad batches whole") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto t = json::parse(cli.Post("/v1/threads", "", "application/json")->body);
  auto id = t["thread_id"].get<std::string>();
  auto path = "/v1/threads/" + id + "/turns";
  json batch{
    {"turns",
     {{{"role", "user"}, {"content", "weather in Oslo?"}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"},
          {"type", "function"},
          {"function",
           {{"name", "weather"}, {"arguments", R"({"city":"Oslo"})"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "3C"}}}}};
  auto r = cli.Post(path, batch.dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  auto body = json::parse(r->body);
  CHECK(body == json{{"thread_id", id}, {"appended", 3}, {"turns", 3}});
  auto history = json::parse(cli.Get("/v1/threads/" + id + "/history")->body);
  REQUIRE(history["turns"].size() == 3);
  CHECK(history["turns"][1]["tool_calls"]
        == batch["turns"][1]["tool_calls"]);
  CHECK(history["turns"][1]["content"] == "");
  CHECK(history["turns"][2]["tool_call_id"] == "call_1");

  struct bad {
    std::string body;
    int status;
    std::string code;
  };
  std::string huge = json{{"turns", std::vector<json>(
                                      max_turn_batch + 1,
                                      json{{"role", "user"},
                                           {"content", "x"}})}}
                       .dump();
  for (auto& b : std::vector<bad>{
         {R"({"turns":[{"role":"tool","tool_call_id":"call_9","content":"?"}]})",
          400, "invalid_argument"},
         {R"({"turns":[{"role":"tool","tool_call_id":"call_1","content":"?"}]})",
          400, "invalid_argument"},
         {R"({"turns":[{"role":"user","content":"ok"},{"role":"assistant","tool_calls":[{"id":"call_1","function":{"name":"f","arguments":"{}"}}]}]})",
          400, "invalid_argument"},
         {R"({"turns":[{"role":"user","content":"x","name":"bob"}]})", 400,
          "unknown_field"},
         {R"({"turns":[{"role":"robot","content":"x"}]})", 400,
          "invalid_argument"},
         {R"({"turns":[{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":{}}}]}]})",
          400, "malformed"},
         {R"({"turns":{}})", 400, "malformed"},
         {R"({"turns":[]})", 400, "invalid_argument"},
         {R"({"turns":[{"role":"user","content":"x"}],"more":1})", 400,
          "unknown_field"},
         {huge, 413, "too_large"}}) {
    auto got = cli.Post(path, b.body, "application/json");
    REQUIRE(got);
    INFO(b.body.substr(0, 200) << " -> " << got->body);
    CHECK(got->status == b.status);
    CHECK(json::parse(got->body)["error"]["code"] == b.code);
  }
  auto after = json::parse(cli.Get("/v1/threads/" + id)->body);
  CHECK(after["turns"] == 3);
  auto hostile = cli.Post("/v1/threads/a%20b/turns", batch.dump(),
                          "application/json");
  REQUIRE(hostile);
  CHECK(hostile->status == 400);
  // Appending creates no thread.
  auto unknown = cli.Post("/v1/threads/no-such-thread/turns", batch.dump(),
                          "application/json");
  REQUIRE(unknown);
  CHECK(unknown->status == 404);
  CHECK(cli.Get("/v1/threads/no-such-thread")->status == 404);
}
