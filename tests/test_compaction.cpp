// Compaction (docs/threads.md, "Compaction"): what leaves a thread's
// prompts is folded into its summary off the reply path, stored with the
// range of turns it covers, shown by the history route, put into prompts
// before the memory, cleared with the turns, carried by a copy, and kept
// through a restart and a kill -9.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/messages/context_builder.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/runtime/summarizer.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

// Waits up to 20 s for `pred`.
template <class Pred>
bool eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred())
      return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

thread_summary summary_of(runtime& rt, const std::string& id) {
  auto snap = rt.snapshot(id);
  INFO(id << ": " << (snap ? std::string{} : describe(snap.error())));
  REQUIRE(snap);
  return snap->summary;
}

// A summarizer that waits for the test to let it go, counting calls.
class gated_summarizer : public summarizer {
public:
  std::string name() const override {
    return "gated";
  }
  caf::expected<std::string> summarize(const summary_input& in) override {
    std::unique_lock<std::mutex> guard{mtx_};
    ++calls_;
    seen_.push_back(in);
    cv_.notify_all();
    cv_.wait(guard, [this] { return open_; });
    if (fail_)
      return make_error(errc::upstream_failure, "the model is down");
    return "summary of " + std::to_string(in.turns.size()) + " turns after ["
           + in.previous + "]";
  }
  void open(bool fail = false) {
    std::lock_guard<std::mutex> guard{mtx_};
    open_ = true;
    fail_ = fail;
    cv_.notify_all();
  }
  size_t calls() {
    std::lock_guard<std::mutex> guard{mtx_};
    return calls_;
  }
  bool wait_calls(size_t n) {
    std::unique_lock<std::mutex> guard{mtx_};
    return cv_.wait_for(guard, 20s, [&] { return calls_ >= n; });
  }
  std::vector<summary_input> seen() {
    std::lock_guard<std::mutex> guard{mtx_};
    return seen_;
  }

private:
  std::mutex mtx_;
  std::condition_variable cv_;
  bool open_ = false;
  bool fail_ = false;
  size_t calls_ = 0;
  std::vector<summary_input> seen_;
};

runtime_options with(std::shared_ptr<summarizer> s, uint64_t min_turns = 2) {
  runtime_options opts;
  opts.conversation.summary_maker = std::move(s);
  opts.conversation.compact_min_turns = min_turns;
  return opts;
}

} // namespace

TEST_CASE("compaction: the offline summary is extractive and deterministic") {
  extractive_summarizer s{200};
  summary_input in;
  in.turns = {make_user_turn("Where is Oslo?  It is cold.\nVery."),
              make_assistant_turn("Oslo is in Norway. It is the capital.")};
  auto call = make_assistant_turn("");
  call.tool_calls = {{"c1", "get_weather", "{}"}, {"c2", "get_time", "{}"}};
  in.turns.push_back(call);
  in.turns.push_back(make_tool_turn("12 C", "c1"));
  auto a = s.summarize(in);
  REQUIRE(a);
  CHECK(*a
        == "user: Where is Oslo?\nassistant: Oslo is in Norway.\n"
           "assistant: called get_weather, get_time");
  auto b = s.summarize(in);
  REQUIRE(b);
  CHECK(*a == *b);
  // Incremental: the previous summary's lines come first; the oldest go
  // when it would pass its size.
  summary_input next{*a, {make_user_turn(std::string(250, 'w'))}};
  auto c = s.summarize(next);
  REQUIRE(c);
  CHECK(*c == "user: " + std::string(160, 'w') + "...");
  summary_input small{*a, {make_user_turn("Short.")}};
  auto d = s.summarize(small);
  REQUIRE(d);
  CHECK(*d == *a + "\nuser: Short.");
}

TEST_CASE("compaction: what leaves the prompts is summarized off the reply "
          "path and goes into later prompts") {
  auto gate = std::make_shared<gated_summarizer>();
  runtime rt{with(gate)};
  std::string id = "folded";
  // A window of 2 turns: from the third message on, turns leave it.
  for (int i = 0; i < 3; ++i)
    REQUIRE(rt.send_message(id, "message " + std::to_string(i), {},
                            conflict_policy::queue, 2));
  // The third message's prompt left turns 0 and 1 out: a job started,
  // and the reply did not wait for it (the summarizer is still held).
  REQUIRE(gate->wait_calls(1));
  CHECK(summary_of(rt, id).upto == 0);
  auto more = rt.send_message(id, "message 3", {}, conflict_policy::queue, 2);
  REQUIRE(more);
  CHECK(more->turns == 8);
  CHECK(gate->calls() == 1); // one job per thread at a time
  gate->open();
  REQUIRE(eventually([&] { return summary_of(rt, id).upto > 0; }));
  auto s = summary_of(rt, id);
  CHECK(s.upto == 2);
  CHECK(s.content == "summary of 2 turns after []");
  CHECK(s.token_encoding == static_cast<uint8_t>(token_encoding_id::o200k_base));
  CHECK(s.tokens > 0);
  auto seen = gate->seen();
  REQUIRE(seen.size() == 1);
  REQUIRE(seen[0].turns.size() == 2);
  CHECK(seen[0].turns[0].content == "message 0");

  // The next prompt carries it after the system prompt and starts its
  // history after the turns it covers.
  build_options o;
  o.max_turns = 100;
  auto built = rt.build_context(id, "", "and now?", o);
  REQUIRE(built);
  REQUIRE(built->messages.size() >= 3);
  CHECK(built->messages[1].role == "system");
  CHECK(built->messages[1].content
        == std::string{summary_message_prefix} + s.content);
  CHECK(built->manifest.summary_upto == 2);
  CHECK(built->manifest.summary_tokens > 0);
  REQUIRE_FALSE(built->manifest.turns.empty());
  CHECK(built->manifest.turns.front() == 2);
  CHECK(built->manifest.turns.back() == 7);

  // Incremental: the next job folds the previous summary and the new
  // turns only.
  REQUIRE(rt.send_message(id, "message 4", {}, conflict_policy::queue, 2));
  REQUIRE(rt.send_message(id, "message 5", {}, conflict_policy::queue, 2));
  REQUIRE(eventually([&] { return summary_of(rt, id).upto >= 6; }));
  seen = gate->seen();
  REQUIRE(seen.size() >= 2);
  CHECK(seen[1].previous == s.content);
  CHECK(seen[1].turns.front().content == "message 1");
  auto stats = rt.compaction();
  CHECK(stats.stored >= 2);
  CHECK(stats.failed == 0);

  // Clearing the turns clears the summary.
  REQUIRE(rt.clear_thread(id));
  CHECK(summary_of(rt, id).upto == 0);
}

TEST_CASE("compaction: a failed summary is counted and tried again later "
          "and turns are never touched") {
  auto gate = std::make_shared<gated_summarizer>();
  gate->open(true);
  runtime rt{with(gate)};
  std::string id = "failing";
  for (int i = 0; i < 4; ++i)
    REQUIRE(rt.send_message(id, "m" + std::to_string(i), {},
                            conflict_policy::queue, 2));
  REQUIRE(eventually([&] { return rt.compaction().failed >= 1; }));
  REQUIRE(eventually([&] { return rt.compaction().running == 0; }));
  auto failed = rt.compaction().failed;
  REQUIRE(rt.send_message(id, "m4", {}, conflict_policy::queue, 2));
  REQUIRE(eventually([&] { return rt.compaction().failed > failed; }));
  CHECK(summary_of(rt, id).upto == 0);
  auto snap = rt.snapshot(id);
  REQUIRE(snap);
  CHECK(snap->turns.size() == 10);
}

TEST_CASE("compaction: a copy carries a summary valid for its turns and a "
          "restart keeps it") {
  test::temp_dir dir;
  auto opts = with(std::make_shared<extractive_summarizer>());
  opts.storage.data_dir = dir.str();
  std::string id = "kept";
  thread_summary before;
  {
    runtime rt{opts};
    // A job asked for while another runs for the thread is not started:
    // messages go on until a summary covers 6 turns.
    for (int i = 0; i < 12; ++i) {
      REQUIRE(rt.send_message(id, "Fact number " + std::to_string(i) + ".",
                              {}, conflict_policy::queue, 2));
      REQUIRE(eventually([&] { return rt.compaction().running == 0; }));
      if (summary_of(rt, id).upto >= 6)
        break;
    }
    REQUIRE(summary_of(rt, id).upto >= 6);
    before = summary_of(rt, id);
    CHECK(before.content.find("user: Fact number 0.") != std::string::npos);

    auto whole = rt.copy_thread(id);
    REQUIRE(whole);
    CHECK(summary_of(rt, whole->thread_id) == before);
    auto at = rt.copy_thread(id, before.upto);
    REQUIRE(at);
    CHECK(summary_of(rt, at->thread_id) == before);
    // A copy that ends before the summary's range has none: it would
    // speak of turns the copy does not hold.
    auto early = rt.copy_thread(id, before.upto - 1);
    REQUIRE(early);
    CHECK(summary_of(rt, early->thread_id).upto == 0);
  }
  runtime rt{opts};
  CHECK(summary_of(rt, id) == before);
  auto info = rt.thread_details(id);
  REQUIRE(info);
  CHECK(before.upto <= info->turns);
}

TEST_CASE("compaction: the history route shows the summary and kill -9 "
          "during compaction loses nothing") {
  test::temp_dir dir;
  // Every model call takes 2 s, the summary's too.
  test::fake_upstream up{{"--stream-seconds", "2", "--chunks", "4"}};
  std::vector<std::string> acknowledged;
  {
    test::server_process srv{{"--data", dir.str(), "--llm", "openai",
                              "--llm-url", up.url(), "--llm-model", "fake",
                              "--rewrite-timeout-ms", "100"}};
    httplib::Client cli{"127.0.0.1", srv.port()};
    cli.set_read_timeout(30, 0);
    // The fourth prompt leaves 4 turns out (the server compacts from 4):
    // once its reply is stored, a summary call starts. Killed then.
    for (int i = 0; i < 4; ++i) {
      auto [code, body] = test::post_json(
        cli, "/v1/threads/crash/messages",
        {{"content", "crash message " + std::to_string(i)},
         {"max_turns", 2}});
      REQUIRE(code == 200);
      acknowledged.push_back("crash message " + std::to_string(i));
    }
    bool running = eventually([&] {
      auto m = cli.Get("/metrics");
      return m
             && m->body.find("spindle_compactions{result=\"running\"} 1")
                  != std::string::npos;
    });
    srv.stop(SIGKILL);
    REQUIRE(running);
  }
  test::server_process srv{{"--data", dir.str()}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto [code, history] = test::get_json(
    cli, "/v1/threads/crash/history?max_turns=100");
  REQUIRE(code == 200);
  // Every acknowledged exchange.
  auto total = history["total_turns"].get<uint64_t>();
  REQUIRE(total == 8);
  for (size_t i = 0; i < acknowledged.size(); ++i)
    CHECK(history["turns"][2 * i]["content"] == acknowledged[i]);
  // Killed mid-call: no summary, or one whose range is within the turns.
  CHECK((history["summary"].is_null()
         || history["summary"]["upto"].get<uint64_t>() <= total));

  // The offline server goes on compacting; the route shows the result.
  for (int i = 0; i < 2; ++i) {
    auto [c, b] = test::post_json(cli, "/v1/threads/crash/messages",
                                  {{"content", "after " + std::to_string(i)},
                                   {"max_turns", 2}});
    REQUIRE(c == 200);
  }
  json shown;
  REQUIRE(eventually([&] {
    auto [c, h] = test::get_json(cli, "/v1/threads/crash/history");
    shown = h;
    return c == 200 && h["summary"].is_object()
           && h["summary"]["upto"].get<uint64_t>() >= 6;
  }));
  CHECK(shown["summary"]["content"].get<std::string>().find(
          "user: crash message 0")
        != std::string::npos);
  CHECK(shown["summary"]["tokens"].get<uint64_t>() > 0);
  auto [cc, ctx] = test::post_json(cli, "/v1/threads/crash/context",
                                   {{"content", "so?"}});
  REQUIRE(cc == 200);
  CHECK(ctx["manifest"]["summary_upto"].get<uint64_t>() >= 6);
  CHECK(ctx["messages"][1]["content"].get<std::string>().rfind(
          "Summary of the earlier conversation:", 0)
        == 0);
}

TEST_CASE("compaction: 16 clients at once on 16 threads keep every turn and "
          "a summary within each thread's turns") {
  runtime rt{with(std::make_shared<extractive_summarizer>())};
  constexpr int clients = 16;
  constexpr int messages = 8;
  std::vector<std::thread> running;
  std::atomic<int> failures{0};
  for (int c = 0; c < clients; ++c)
    running.emplace_back([&, c] {
      auto id = "busy-" + std::to_string(c);
      for (int m = 0; m < messages; ++m)
        if (!rt.send_message(id, "client " + std::to_string(c) + " says "
                                   + std::to_string(m) + ".",
                             {}, conflict_policy::queue, 2))
          ++failures;
    });
  for (auto& t : running)
    t.join();
  CHECK(failures == 0);
  REQUIRE(eventually([&] { return rt.compaction().running == 0; }));
  CHECK(rt.compaction().failed == 0);
  CHECK(rt.compaction().stored >= clients);
  for (int c = 0; c < clients; ++c) {
    auto id = "busy-" + std::to_string(c);
    auto snap = rt.snapshot(id);
    REQUIRE(snap);
    // Every turn once, in order; the summary speaks of this thread only
    // and of turns it holds.
    REQUIRE(snap->turns.size() == 2 * messages);
    for (int m = 0; m < messages; ++m)
      CHECK(snap->turns[2 * m].content
            == "client " + std::to_string(c) + " says " + std::to_string(m)
                 + ".");
    CHECK(snap->summary.upto > 0);
    CHECK(snap->summary.upto <= snap->turns.size());
    CHECK(snap->summary.content.find("user: client " + std::to_string(c)
                                     + " says ")
          != std::string::npos);
    for (int other = 0; other < clients; ++other)
      if (other != c)
        CHECK(snap->summary.content.find("client " + std::to_string(other)
                                         + " says")
              == std::string::npos);
  }
}
