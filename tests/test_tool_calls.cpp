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
#include "spindle/messages/tools.hpp"
#include "spindle/runtime/openai_provider.hpp"
#include "spindle/runtime/runtime.hpp"
#include "served.hpp"
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

// A runtime whose provider is OpenAI's, on `fake`.
runtime_options on_fake(const test::fake_openai& fake) {
  runtime_options opts;
  auto provider = make_openai_provider(fake.options());
  REQUIRE(provider);
  opts.provider = *provider;
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
  // A call ID's limit is in bytes: 128 two-byte characters fit, 129 not,
  // and the answer says bytes.
  std::string two_byte_id;
  for (int i = 0; i < 128; ++i)
    two_byte_id += "\xc3\xa9";
  CHECK_FALSE(validate_turn(calling({call(two_byte_id)})));
  auto too_long = validate_turn(calling({call(two_byte_id + "\xc3\xa9")}));
  CHECK(code_of(too_long) == errc::invalid_argument);
  CHECK(describe(too_long).find("256 bytes") != std::string::npos);
  auto tool = make_tool_turn("result", std::string(257, 'i'));
  CHECK(describe(validate_turn(tool)).find("256 bytes") != std::string::npos);
  CHECK_FALSE(validate_turn(make_tool_turn("result", two_byte_id)));

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
  // Catch's assertions are not thread-safe: the workers count failures,
  // the main thread asserts.
  std::atomic<int> failed{0};
  for (int w = 0; w < workers; ++w)
    running.push_back(std::async(std::launch::async, [&, w] {
      for (int b = 0; b < batches; ++b) {
        auto tag = std::to_string(w) + "-" + std::to_string(b);
        if (b % 4 == 3) {
          if (!rt.add_turn(id, make_user_turn("note " + tag)))
            ++failed;
          continue;
        }
        auto n = rt.append_turns(id, {calling({call("a" + tag),
                                               call("b" + tag)}),
                                      make_tool_turn("ra", "a" + tag),
                                      make_tool_turn("rb", "b" + tag)});
        if (!n)
          ++failed;
      }
    }));
  for (auto& f : running)
    f.get();
  REQUIRE(failed == 0);
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
  runtime rt{on_fake(fake)};
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

// -- tools offered to the model ----------------------------------------------

TEST_CASE("tool calls: tools and tool_choice are checked in OpenAI's form") {
  auto weather = json{{"type", "function"},
                      {"function",
                       {{"name", "weather"},
                        {"description", "The weather in a city"},
                        {"parameters",
                         {{"type", "object"},
                          {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  auto tools = json::array({weather}).dump();
  CHECK_FALSE(validate_tools(tools, ""));
  CHECK_FALSE(validate_tools(tools, R"("required")"));
  CHECK_FALSE(validate_tools(
    tools, R"({"type":"function","function":{"name":"weather"}})"));
  CHECK_FALSE(validate_tools("", ""));
  std::vector<json> many(max_tools + 1, weather);
  for (size_t i = 0; i < many.size(); ++i)
    many[i]["function"]["name"] = "f" + std::to_string(i);
  CHECK(code_of(validate_tools(json(many).dump(), "")) == errc::too_large);
  many.pop_back();
  CHECK_FALSE(validate_tools(json(many).dump(), ""));
  using pair = std::pair<std::string, std::string>;
  for (auto& bad : std::vector<pair>{{R"({})", ""},
                   {R"([{"type":"code","function":{"name":"f"}}])", ""},
                   {R"([{"type":"function"}])", ""},
                   {R"([{"type":"function","function":{"name":"a b"}}])", ""},
                   {R"([{"type":"function","function":{"name":"f"},"x":1}])",
                    ""},
                   {R"([{"type":"function","function":{"name":"f","x":1}}])",
                    ""},
                   {R"([{"type":"function","function":{"name":"f",)"
                    R"("parameters":"{}"}}])",
                    ""},
                   {tools.substr(0, tools.size() - 1) + "," + weather.dump()
                      + "]",
                    ""},
                   {tools, R"("sometimes")"},
                   {tools, R"({"type":"function","function":{"name":"x"}})"},
                   {"", R"("auto")"}}) {
    INFO(bad.first << " / " << bad.second);
    CHECK(code_of(validate_tools(bad.first, bad.second))
          == errc::invalid_argument);
  }
}

namespace {

// The runtime and its HTTP server in this process, with an OpenAI
// provider on a fake upstream (the query rewriter stays offline, so the
// upstream sees only the replies' requests).
struct served {
  test::fake_openai fake;
  test::served_runtime on{on_fake(fake)};
  int port = on.port();
};

json weather_tools() {
  return json::array(
    {{{"type", "function"},
      {"function",
       {{"name", "weather"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
}

json weather_call(const std::string& id, const std::string& city) {
  return {{"id", id},
          {"type", "function"},
          {"function",
           {{"name", "weather"},
            {"arguments", R"({"city": ")" + city + R"(", "unit": "C"})"}}}};
}

// Checks that every assistant call in `messages` is answered by the tool
// messages right after it, in order, and that nothing else answers.
void check_sequence(const json& messages) {
  INFO(messages.dump(1));
  for (size_t i = 0; i < messages.size(); ++i) {
    auto& m = messages[i];
    if (m["role"] == "tool") {
      CHECK(i > 0);
      continue;
    }
    if (!m.contains("tool_calls"))
      continue;
    auto& calls = m["tool_calls"];
    REQUIRE(i + calls.size() < messages.size());
    for (size_t c = 0; c < calls.size(); ++c) {
      CHECK(messages[i + 1 + c]["role"] == "tool");
      CHECK(messages[i + 1 + c]["tool_call_id"] == calls[c]["id"]);
    }
  }
}

} // namespace

TEST_CASE("tool calls: messages and messages stream offer tools upstream "
          "and store the calls the model streams in pieces") {
  served s;
  httplib::Client cli{"127.0.0.1", s.port};
  auto call_1 = weather_call("call_1", "Oslo");
  auto call_2 = weather_call("call_2", "Rome");
  s.fake.set_messages({{{"tool_calls", {call_1}}},
                       {{"content", "Checking."}, {"tool_calls", {call_2}}},
                       {{"content", "Oslo 3C, Rome 14C."}}});
  const std::string id = "tooled";
  auto choice = json{{"type", "function"}, {"function", {{"name", "weather"}}}};
  auto [status, r1] = test::post_json(
    cli, "/v1/threads/" + id + "/messages",
    {{"content", "Weather in Oslo?"},
     {"tools", weather_tools()},
     {"tool_choice", choice}});
  INFO(r1.dump());
  REQUIRE(status == 200);
  CHECK(r1["reply"] == "");
  CHECK(r1["tool_calls"] == json::array({call_1}));
  // The upstream got the tools as sent.
  auto first = s.fake.requests().at(0);
  CHECK(first["tools"] == weather_tools());
  CHECK(first["tool_choice"] == choice);

  // The client runs the tool and appends its result.
  auto answer = [&](const std::string& call_id, const std::string& result) {
    return test::post_json(cli, "/v1/threads/" + id + "/turns",
                           {{"turns",
                             {{{"role", "tool"},
                               {"tool_call_id", call_id},
                               {"content", result}}}}})
      .first;
  };
  REQUIRE(answer("call_1", "3C") == 200);

  // Streamed: the call arrives in pieces, then whole in `done`.
  auto streamed = cli.Post("/v1/threads/" + id + "/messages/stream",
                           json{{"content", "And Rome?"},
                                {"tools", weather_tools()},
                                {"tool_choice", "auto"}}
                             .dump(),
                           "application/json");
  REQUIRE(streamed);
  REQUIRE(streamed->status == 200);
  auto events = test::sse_events(streamed->body);
  std::string text, args, name, call_id;
  size_t pieces = 0;
  json done;
  for (auto& e : events) {
    if (e.type == "delta")
      text += e.data["content"].get<std::string>();
    if (e.type == "tool_call") {
      ++pieces;
      CHECK(e.data["index"] == 0);
      args += e.data["arguments"].get<std::string>();
      name += e.data.value("name", "");
      call_id += e.data.value("id", "");
    }
    if (e.type == "done")
      done = e.data;
  }
  CHECK(text == "Checking.");
  CHECK(pieces > 3);
  CHECK(name == "weather");
  CHECK(call_id == "call_2");
  CHECK(args == call_2["function"]["arguments"]);
  CHECK(done["tool_calls"] == json::array({call_2}));
  CHECK(s.fake.requests().at(1)["tool_choice"] == "auto");

  REQUIRE(answer("call_2", "14C") == 200);
  auto [s3, r3] = test::post_json(cli, "/v1/threads/" + id + "/messages",
                                  {{"content", "Thanks!"}});
  REQUIRE(s3 == 200);
  CHECK(r3["reply"] == "Oslo 3C, Rome 14C.");
  CHECK_FALSE(r3.contains("tool_calls"));
  auto last = s.fake.requests().at(2);
  CHECK_FALSE(last.contains("tools"));
  check_sequence(last["messages"]);
  CHECK(last["messages"].back() == json{{"role", "user"},
                                        {"content", "Thanks!"}});

  auto [hs, history] = test::get_json(cli, "/v1/threads/" + id + "/history");
  REQUIRE(hs == 200);
  std::vector<std::string> roles;
  for (auto& t : history["turns"])
    roles.push_back(t["role"].get<std::string>());
  CHECK(roles == std::vector<std::string>{"user", "assistant", "tool", "user",
                                          "assistant", "tool", "user",
                                          "assistant"});
  CHECK(history["turns"][1]["tool_calls"] == json::array({call_1}));
  CHECK(history["turns"][4]["tool_calls"] == json::array({call_2}));
  CHECK(history["turns"][4]["content"] == "Checking.");
}

TEST_CASE("tool calls: bad tools are refused before anything is stored") {
  served s;
  httplib::Client cli{"127.0.0.1", s.port};
  std::vector<json> many(max_tools + 1, weather_tools()[0]);
  for (size_t i = 0; i < many.size(); ++i)
    many[i]["function"]["name"] = "f" + std::to_string(i);
  struct bad {
    json fields;
    int status;
    std::string param;
  };
  for (auto route : {"/messages", "/messages/stream"})
    for (auto& b : std::vector<bad>{
           {{{"tools", "weather"}}, 400, "tools"},
           {{{"tools", {{{"type", "function"}}}}}, 400, "tools"},
           {{{"tools", {{{"type", "function"},
                         {"function", {{"name", "no spaces"}}}}}}},
            400,
            "tools"},
           {{{"tools", many}}, 413, "tools"},
           {{{"tools", weather_tools()}, {"tool_choice", "sometimes"}},
            400,
            "tool_choice"},
           {{{"tools", weather_tools()},
             {"tool_choice",
              {{"type", "function"}, {"function", {{"name", "search"}}}}}},
            400,
            "tool_choice"},
           {{{"tool_choice", "auto"}}, 400, "tool_choice"}}) {
      auto body = b.fields;
      body["content"] = "hello";
      auto [status, reply] = test::post_json(
        cli, std::string{"/v1/threads/refused"} + route, body);
      INFO(route << " " << body.dump().substr(0, 300) << " -> " << reply);
      CHECK(status == b.status);
      CHECK(reply["error"]["param"] == b.param);
    }
  CHECK(test::get_json(cli, "/v1/threads/refused").first == 404);
  CHECK(s.fake.requests().empty());
}

TEST_CASE("tool calls: chat completions answer a call in OpenAI's form and "
          "continue a thread after its results") {
  served s;
  httplib::Client cli{"127.0.0.1", s.port};
  auto call_1 = weather_call("call_1", "Oslo");
  s.fake.set_messages({{{"tool_calls", {call_1}}},
                       {{"content", "It is 3C in Oslo."}},
                       {{"tool_calls", {call_1}}}});
  json ask{{"model", "m"},
           {"messages", {{{"role", "user"}, {"content", "Oslo?"}}}},
           {"tools", weather_tools()},
           {"tool_choice", "required"},
           {"parallel_tool_calls", false},
           {"thread_id", "chat-tools"}};
  auto [status, r1] = test::post_json(cli, "/v1/chat/completions", ask);
  INFO(r1.dump());
  REQUIRE(status == 200);
  auto& choice = r1["choices"][0];
  CHECK(choice["finish_reason"] == "tool_calls");
  CHECK(choice["message"]["content"].is_null());
  CHECK(choice["message"]["tool_calls"] == json::array({call_1}));
  auto up = s.fake.requests().at(0);
  CHECK(up["tools"] == weather_tools());
  CHECK(up["tool_choice"] == "required");
  CHECK(up["parallel_tool_calls"] == false);

  // The client sends the call back with its result: the result is the
  // thread's new turn and the reply follows it.
  auto answer = ask;
  answer.erase("tool_choice");
  answer["messages"].push_back(choice["message"]);
  answer["messages"].push_back(
    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "3C"}});
  auto [s2, r2] = test::post_json(cli, "/v1/chat/completions", answer);
  INFO(r2.dump());
  REQUIRE(s2 == 200);
  CHECK(r2["choices"][0]["message"]["content"] == "It is 3C in Oslo.");
  CHECK(r2["choices"][0]["finish_reason"] == "stop");
  auto second = s.fake.requests().at(1);
  check_sequence(second["messages"]);
  CHECK(second["messages"].back()
        == json{{"role", "tool"}, {"content", "3C"},
                {"tool_call_id", "call_1"}});
  auto [hs, history] = test::get_json(cli,
                                      "/v1/threads/chat-tools/history");
  REQUIRE(history["turns"].size() == 4);
  CHECK(history["turns"][2]["tool_call_id"] == "call_1");
  CHECK(history["turns"][3]["content"] == "It is 3C in Oslo.");
  // A result for a call the thread never made is refused like POST turns.
  auto again = answer;
  again["messages"].back()["tool_call_id"] = "call_9";
  CHECK(test::post_json(cli, "/v1/chat/completions", again).first == 400);

  // Streamed without a thread: OpenAI's delta.tool_calls chunks.
  ask.erase("thread_id");
  ask["stream"] = true;
  auto streamed = cli.Post("/v1/chat/completions", ask.dump(),
                           "application/json");
  INFO(httplib::to_string(streamed.error()));
  REQUIRE(streamed);
  REQUIRE(streamed->status == 200);
  std::string args, finish;
  size_t pieces = 0;
  for (auto& e : test::sse_events(streamed->body)) {
    if (!e.data.is_object())
      continue; // [DONE]
    auto& c = e.data["choices"][0];
    if (c["finish_reason"].is_string())
      finish = c["finish_reason"].get<std::string>();
    if (!c["delta"].contains("tool_calls"))
      continue;
    auto& piece = c["delta"]["tool_calls"][0];
    CHECK(piece["index"] == 0);
    if (pieces++ == 0) {
      CHECK(piece["id"] == "call_1");
      CHECK(piece["type"] == "function");
      CHECK(piece["function"]["name"] == "weather");
    }
    args += piece["function"]["arguments"].get<std::string>();
  }
  CHECK(pieces > 3);
  CHECK(args == call_1["function"]["arguments"]);
  CHECK(finish == "tool_calls");
}

TEST_CASE("tool calls: the OpenAI provider assembles calls streamed in "
          "pieces and reads them from a plain answer") {
  test::fake_openai fake;
  auto opts = on_fake(fake);
  auto call_1 = weather_call("call_1", "Oslo");
  auto call_2 = weather_call("call_2", "Rome");
  fake.set_messages({{{"content", "Both."}, {"tool_calls", {call_1, call_2}}}});
  completion_options copts;
  copts.tools = weather_tools().dump();
  copts.tool_choice = R"("required")";
  std::vector<tool_call_delta> pieces;
  copts.on_tool_call = [&pieces](const tool_call_delta& piece) {
    pieces.push_back(piece);
    return true;
  };
  std::vector<chat_message> prompt{{"user", "Oslo and Rome?", {}, {}}};
  std::string text;
  auto streamed = opts.provider->complete(prompt, copts,
                                          [&text](std::string_view d) {
                                            text += d;
                                            return true;
                                          });
  REQUIRE(streamed);
  CHECK(streamed->text == "Both.");
  CHECK(text == "Both.");
  CHECK_FALSE(streamed->interrupted);
  auto whole = json::parse(tool_calls_to_json(streamed->tool_calls));
  CHECK(whole == json::array({call_1, call_2}));
  CHECK(pieces.size() > 4);
  std::string args_2;
  for (auto& p : pieces)
    if (p.index == 1)
      args_2 += p.arguments;
  CHECK(args_2 == call_2["function"]["arguments"]);
  auto sent = fake.requests().back();
  CHECK(sent["tools"] == weather_tools());
  CHECK(sent["tool_choice"] == "required");

  // A plain answer: each call whole, as one piece.
  fake.set_mode(test::fake_openai::mode::plain);
  pieces.clear();
  auto plain = opts.provider->complete(prompt, copts, {});
  REQUIRE(plain);
  CHECK(plain->text == "Both.");
  CHECK(json::parse(tool_calls_to_json(plain->tool_calls))
        == json::array({call_1, call_2}));
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[1].id == "call_2");
  CHECK(pieces[1].arguments == call_2["function"]["arguments"]);

  // A consumer that stops at a call's piece interrupts the reply.
  fake.set_mode(test::fake_openai::mode::stream);
  copts.on_tool_call = [](const tool_call_delta& piece) {
    return piece.index == 0;
  };
  auto stopped = opts.provider->complete(prompt, copts, {});
  REQUIRE(stopped);
  CHECK(stopped->interrupted);
}
