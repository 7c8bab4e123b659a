// POST /v1/chat/completions, OpenAI's format on spindle serve (the real
// binary, offline provider): replies and streams as OpenAI shapes them,
// threads kept by spindle, and bad input refused in OpenAI's error shape
// with nothing stored. The official OpenAI Node client drives it in
// tests/openai_sdk.

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support.hpp"

using json = nlohmann::json;
using spindle::test::server_process;

namespace {

httplib::Result complete(httplib::Client& cli, const json& body,
                         const httplib::Headers& headers = {}) {
  return cli.Post("/v1/chat/completions", headers, body.dump(),
                  "application/json");
}

json user_says(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> data_lines(const std::string& body) {
  std::vector<std::string> out;
  for (auto& line : spindle::test::lines(body))
    if (line.rfind("data: ", 0) == 0)
      out.push_back(line.substr(6));
  return out;
}

void check_openai_error(const httplib::Result& r, int status,
                        const std::string& code, const std::string& param) {
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == status);
  auto body = json::parse(r->body, nullptr, false);
  REQUIRE(body.is_object());
  auto& e = body["error"];
  CHECK(e["code"] == code);
  CHECK(e["type"] == (status == 404 ? "not_found_error"
                                     : "invalid_request_error"));
  CHECK_FALSE(e["message"].get<std::string>().empty());
  if (param.empty())
    CHECK(e["param"].is_null());
  else
    CHECK(e["param"] == param);
}

} // namespace

TEST_CASE("chat completions: without a thread the messages go to the "
          "provider as they are and the reply is OpenAI's chat.completion") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto r = complete(cli, {{"model", "any-model"},
                          {"messages",
                           {{{"role", "system"}, {"content", "Be brief."}},
                            {{"role", "user"},
                             {"content",
                              {{{"type", "text"}, {"text", "Hello "}},
                               {{"type", "text"}, {"text", "there"}}}}}}},
                          {"temperature", 0.5},
                          {"store", false}});
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  auto body = json::parse(r->body);
  CHECK(body["object"] == "chat.completion");
  CHECK(body["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(body["model"] == "any-model");
  CHECK(body["created"].is_number_integer());
  REQUIRE(body["choices"].size() == 1);
  auto& choice = body["choices"][0];
  CHECK(choice["index"] == 0);
  CHECK(choice["finish_reason"] == "stop");
  CHECK(choice["message"]["role"] == "assistant");
  // The offline provider reports what it received: no history, no memory.
  auto text = choice["message"]["content"].get<std::string>();
  CHECK(text.find("offline") != std::string::npos);
  CHECK(text.find("Hello there") != std::string::npos);
  CHECK_FALSE(body.contains("thread_id"));
  CHECK_FALSE(r->has_header("Spindle-Thread-Id"));
}

TEST_CASE("chat completions: a thread named by the body or the header keeps "
          "the conversation - its turns are stored and the prompt carries "
          "them") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto first = complete(cli, {{"model", "m"},
                              {"messages", user_says("I keep bees.")},
                              {"thread_id", "bees"}});
  REQUIRE(first);
  REQUIRE(first->status == 200);
  CHECK(json::parse(first->body)["thread_id"] == "bees");
  CHECK(first->get_header_value("Spindle-Thread-Id") == "bees");
  // The same thread through the header; the request's earlier messages
  // are not stored again (spindle keeps the history).
  auto second = complete(cli,
                         {{"model", "m"},
                          {"messages",
                           {{{"role", "user"}, {"content", "ignored"}},
                            {{"role", "assistant"}, {"content", "ignored"}},
                            {{"role", "user"}, {"content", "How many?"}}}}},
                         {{"Spindle-Thread-Id", "bees"}});
  REQUIRE(second);
  REQUIRE(second->status == 200);
  auto reply = json::parse(second->body)["choices"][0]["message"]["content"]
                 .get<std::string>();
  // The offline provider saw the two earlier turns.
  CHECK(reply.find("2 history turns") != std::string::npos);
  auto history = cli.Get("/v1/threads/bees/history");
  REQUIRE(history);
  auto turns = json::parse(history->body)["turns"];
  REQUIRE(turns.size() == 4);
  CHECK(turns[0]["content"] == "I keep bees.");
  CHECK(turns[2]["content"] == "How many?");
  // "new" makes a fresh thread and names it.
  auto fresh = complete(cli, {{"model", "m"},
                              {"messages", user_says("hi")},
                              {"thread_id", "new"}});
  REQUIRE(fresh);
  auto id = json::parse(fresh->body)["thread_id"].get<std::string>();
  CHECK(id.size() == 36);
  CHECK(fresh->get_header_value("Spindle-Thread-Id") == id);
}

TEST_CASE("chat completions: a stream is OpenAI's chunks - the role first "
          "then the text then finish_reason stop and [DONE]") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  for (bool threaded : {false, true}) {
    json req{{"model", "m"},
             {"messages", user_says("stream me")},
             {"stream", true}};
    if (threaded)
      req["thread_id"] = "streamed";
    auto r = complete(cli, req);
    REQUIRE(r);
    INFO(r->body);
    CHECK(r->status == 200);
    CHECK(r->get_header_value("Content-Type").rfind("text/event-stream", 0)
          == 0);
    auto data = data_lines(r->body);
    REQUIRE(data.size() >= 4);
    CHECK(data.back() == "[DONE]");
    auto head = json::parse(data.front());
    CHECK(head["object"] == "chat.completion.chunk");
    CHECK(head["choices"][0]["delta"]["role"] == "assistant");
    std::string text;
    std::string id = head["id"];
    for (size_t i = 0; i + 1 < data.size(); ++i) {
      auto chunk = json::parse(data[i]);
      CHECK(chunk["id"] == id); // one ID for the whole stream
      CHECK(chunk.contains("thread_id") == threaded);
      auto& choice = chunk["choices"][0];
      if (choice["delta"].contains("content"))
        text += choice["delta"]["content"].get<std::string>();
      CHECK(choice["finish_reason"]
            == (i + 2 == data.size() ? json("stop") : json(nullptr)));
    }
    CHECK(text.find("stream me") != std::string::npos);
    CHECK(r->has_header("Spindle-Thread-Id") == threaded);
  }
  auto history = cli.Get("/v1/threads/streamed/history");
  REQUIRE(history);
  CHECK(json::parse(history->body)["turns"].size() == 2);
}

TEST_CASE("chat completions: bad input gets OpenAI's error shape naming the "
          "parameter and stores nothing") {
  server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto msgs = user_says("hi");
  struct bad {
    json body;
    std::string code, param;
  };
  std::vector<bad> cases{
    {{{"messages", msgs}, {"thread_id", "t1"}}, "malformed", "model"},
    {{{"model", 5}, {"messages", msgs}, {"thread_id", "t1"}},
     "malformed",
     "model"},
    {{{"model", "m"}, {"thread_id", "t1"}}, "invalid_argument", "messages"},
    {{{"model", "m"}, {"messages", json::array()}, {"thread_id", "t1"}},
     "invalid_argument",
     "messages"},
    {{{"model", "m"}, {"messages", msgs}, {"frobnicate", 1},
      {"thread_id", "t1"}},
     "unknown_field",
     "frobnicate"},
    {{{"model", "m"}, {"messages", msgs}, {"n", 2}, {"thread_id", "t1"}},
     "invalid_argument",
     "n"},
    {{{"model", "m"},
      {"messages", msgs},
      {"tools", {{{"type", "function"}}}},
      {"thread_id", "t1"}},
     "invalid_argument",
     "tools"},
    {{{"model", "m"}, {"messages", msgs}, {"stream", "yes"},
      {"thread_id", "t1"}},
     "invalid_argument",
     "stream"},
    {{{"model", "m"},
      {"messages", {{{"role", "wizard"}, {"content", "x"}}}},
      {"thread_id", "t1"}},
     "invalid_argument",
     "messages[0].role"},
    {{{"model", "m"},
      {"messages",
       {{{"role", "user"},
         {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}},
      {"thread_id", "t1"}},
     "invalid_argument",
     "messages[0].content"},
    {{{"model", "m"},
      {"messages", {{{"role", "tool"}, {"content", "42"}}}},
      {"thread_id", "t1"}},
     "invalid_argument",
     "messages[0].tool_call_id"},
    // With a thread the last message is the user's new one.
    {{{"model", "m"},
      {"messages", {{{"role", "assistant"}, {"content", "x"}}}},
      {"thread_id", "t1"}},
     "invalid_argument",
     "messages"},
    {{{"model", "m"}, {"messages", msgs}, {"thread_id", "../t1"}},
     "invalid_id",
     "thread_id"},
    {{{"model", "m"}, {"messages", msgs}, {"thread_id", "t1"},
      {"max_turns", 1}},
     "invalid_argument",
     "max_turns"},
    // spindle's thread fields need a thread.
    {{{"model", "m"}, {"messages", msgs}, {"user_id", "alice"}},
     "invalid_argument",
     "thread_id"},
  };
  for (auto& c : cases) {
    INFO(c.body.dump());
    check_openai_error(complete(cli, c.body), 400, c.code, c.param);
  }
  check_openai_error(cli.Post("/v1/chat/completions", "{not json",
                              "application/json"),
                     400, "malformed", "");
  // The body and the header must not name different threads.
  check_openai_error(complete(cli,
                              {{"model", "m"},
                               {"messages", msgs},
                               {"thread_id", "t1"}},
                              {{"Spindle-Thread-Id", "t2"}}),
                     400, "invalid_argument", "thread_id");
  // Nothing was stored: neither thread exists.
  for (auto* t : {"t1", "t2"}) {
    auto h = cli.Get(std::string{"/v1/threads/"} + t + "/history");
    REQUIRE(h);
    CHECK(h->status == 404);
  }
  // The server still serves.
  auto ok = complete(cli, {{"model", "m"}, {"messages", msgs}});
  REQUIRE(ok);
  CHECK(ok->status == 200);
}
