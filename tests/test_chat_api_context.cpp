// The seed's two API tests (seed 004, section 9), driving the facade's
// send_message (the write path the HTTP routes call): the thread ID is kept
// across requests, turns are saved at once, a follow-up's prompt carries the
// earlier exchange, and every exchange logs what section 6.4 asks for.

#include <catch2/catch.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "llm_doubles.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;

namespace {

runtime_options with_provider(std::shared_ptr<llm_provider> p) {
  runtime_options opts;
  opts.provider = std::move(p);
  return opts;
}

// Captures spdlog's default logger while alive.
class log_capture {
public:
  log_capture()
    : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1024)),
      previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  }
  ~log_capture() {
    spdlog::set_default_logger(previous_);
  }
  std::vector<std::string> lines() {
    return sink_->last_formatted();
  }

private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

// xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx, lowercase hex.
bool is_uuid_v4(const std::string& id) {
  if (id.size() != 36)
    return false;
  for (size_t i = 0; i < id.size(); ++i) {
    auto c = id[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-')
        return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return id[14] == '4' && std::string{"89ab"}.find(id[19]) != std::string::npos;
}

} // namespace

TEST_CASE("chat api: a follow-up message in the same thread_id is answered "
          "with the earlier exchange in its prompt") {
  auto provider = std::make_shared<test::scripted_provider>(
    "Donald Trump is an American businessman and politician.");
  runtime rt{with_provider(provider)};
  auto first = rt.send_message("trump-api", "Who is Donald Trump?");
  REQUIRE(first);
  REQUIRE(first->thread_id == "trump-api");
  REQUIRE(first->created);
  REQUIRE(first->history_turns == 0);
  REQUIRE(first->turns == 2);
  auto second = rt.send_message("trump-api", "who are his children");
  REQUIRE(second);
  REQUIRE(second->thread_id == "trump-api"); // never a new ID for a follow-up
  REQUIRE_FALSE(second->created);
  REQUIRE(second->history_turns == 2);
  REQUIRE(second->turns == 4);
  auto prompts = provider->prompts();
  REQUIRE(prompts.size() == 2);
  auto& p = prompts[1];
  REQUIRE(p.size() == 4);
  REQUIRE(p[1].content == "Who is Donald Trump?");
  REQUIRE(p[2].role == "assistant");
  REQUIRE(p[2].content
          == "Donald Trump is an American businessman and politician.");
  REQUIRE(p[3].content == "who are his children");
  // The thread holds both exchanges, in order, in the same thread actor.
  auto snap = rt.snapshot("trump-api");
  REQUIRE(snap->turns.size() == 4);
  REQUIRE(snap->turns[2].content == "who are his children");
  REQUIRE(first->thread_actor_id == second->thread_actor_id);
  REQUIRE(rt.count_threads() == 1u);
}

TEST_CASE("chat api: 'new' creates exactly one thread, the user turn is "
          "saved before the reply streams, and the returned ID is reused") {
  runtime rt;
  std::vector<size_t> turns_while_streaming;
  std::string streamed;
  auto result = rt.send_message(
    "new", "Who is Donald Trump?", "", conflict_policy::queue, 12,
    [&](std::string_view delta) {
      streamed += delta;
      // Another reader, mid-stream: the user turn is already stored.
      auto snaps = rt.list_threads();
      if (snaps && snaps->size() == 1) {
        auto snap = rt.snapshot(snaps->front());
        if (snap)
          turns_while_streaming.push_back(snap->turns.size());
      }
      return true;
    });
  REQUIRE(result);
  REQUIRE(result->thread_id != "new");
  REQUIRE(is_uuid_v4(result->thread_id));
  REQUIRE(result->created);
  REQUIRE_FALSE(turns_while_streaming.empty());
  for (auto n : turns_while_streaming)
    REQUIRE(n == 1);
  REQUIRE(streamed == result->reply);
  REQUIRE_THAT(result->reply, Catch::Contains("offline provider"));
  REQUIRE(rt.count_threads() == 1u);
  auto follow = rt.send_message(result->thread_id, "who are his children");
  REQUIRE(follow);
  REQUIRE(follow->thread_id == result->thread_id);
  REQUIRE(follow->history_turns == 2);
  REQUIRE_THAT(follow->reply, Catch::Contains("2 history turns"));
  REQUIRE(rt.count_threads() == 1u);
  REQUIRE(rt.snapshot(result->thread_id)->turns.size() == 4);
}

TEST_CASE("chat api: every exchange logs thread_id, turns loaded, found or "
          "created, and the thread actor's id") {
  runtime rt;
  log_capture capture;
  auto first = rt.send_message("logged", "hello");
  REQUIRE(first);
  auto second = rt.send_message("logged", "again");
  REQUIRE(second);
  auto lines = capture.lines();
  auto id = std::to_string(second->thread_actor_id);
  int created = 0, found = 0;
  for (auto& line : lines) {
    if (line.find("thread_id='logged'") == std::string::npos
        || line.find("actor_id=" + id) == std::string::npos)
      continue;
    if (line.find("created") != std::string::npos
        && line.find("turns_loaded=0") != std::string::npos)
      ++created;
    if (line.find("found") != std::string::npos
        && line.find("turns_loaded=2") != std::string::npos)
      ++found;
  }
  INFO("log:\n" << [&] {
    std::string all;
    for (auto& l : lines)
      all += l;
    return all;
  }());
  REQUIRE(created == 1);
  REQUIRE(found == 1);
}
