// The prompt (docs/builder.md, "The prompt"): owned messages and stored
// turns read in place from the log that holds them, which the prompt keeps
// alive; copies share the log; a prompt travels as its messages.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <catch2/catch.hpp>

#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/prompt.hpp"
#include "spindle/messages/tokens.hpp"
#include "spindle/runtime/runtime.hpp"
#include "byte_counter.hpp"

using namespace spindle;

namespace {

using test::byte_counter;

// A history with a call answered by one result and one left open: long
// contents, so that a copy is a new heap block.
std::shared_ptr<std::vector<turn>> stored_history() {
  auto h = std::make_shared<std::vector<turn>>();
  h->push_back(make_user_turn("what is the weather in Oslo and in Rome, "
                              "today and tomorrow?"));
  auto call = make_assistant_turn("");
  call.tool_calls = {{"c1", "weather", R"({"city":"Oslo"})"},
                     {"c2", "weather", R"({"city":"Rome"})"}};
  h->push_back(call);
  h->push_back(make_tool_turn("Oslo: rain all day, 9 degrees, wind from the "
                              "west",
                              "c1"));
  h->push_back(make_user_turn("and what should I pack for both cities then?"));
  return h;
}

prompt_parts parts() {
  prompt_parts p;
  p.system_prompt = "S";
  p.original = "q";
  p.rewritten = "q";
  return p;
}

std::vector<const turn*> pointers(const std::vector<turn>& h) {
  std::vector<const turn*> out;
  for (auto& t : h)
    out.push_back(&t);
  return out;
}

} // namespace

TEST_CASE("a prompt of owned messages reads back as given, copies and "
          "pops") {
  std::vector<chat_message> given{
    {"system", "be brief", {}, {}},
    {"assistant", "", {}, {{"c1", "f", "{}"}}},
    {"tool", "done", "c1", {}},
    {"user", "next?", {}, {}}};
  prompt p{given};
  REQUIRE(p.size() == 4);
  CHECK(p.to_messages() == given);
  CHECK(p[1].tool_calls.size() == 1);
  CHECK(p[2].tool_call_id == "c1");
  CHECK(p.back().content == "next?");
  auto copy = p;
  p.pop_back();
  CHECK(p.size() == 3);
  CHECK(copy.size() == 4);
  CHECK(copy.back().content == "next?");
  p.push_back({"user", "again", {}, {}});
  CHECK(p.back().content == "again");
  CHECK(p != copy);
  size_t n = 0;
  for (auto m : copy)
    CHECK(m.role == given[n++].role);
  CHECK(n == 4);
}

TEST_CASE("fit_prompt with the log's owner reads the turns it keeps in "
          "place, and without one it copies them") {
  auto history = stored_history();
  auto ptrs = pointers(*history);
  context_manifest m;
  auto in_place = fit_prompt(byte_counter{}, 100000, 0, parts(), ptrs, m,
                             history);
  REQUIRE(in_place);
  context_manifest m2;
  auto copied = fit_prompt(byte_counter{}, 100000, 0, parts(), ptrs, m2);
  REQUIRE(copied);
  // System, 4 turns, the open call's interrupted result, the message.
  REQUIRE(in_place->size() == 7);
  CHECK(*in_place == *copied);
  CHECK(in_place->to_messages() == copied->to_messages());
  // The same text, read where the log holds it, or a copy of it.
  CHECK((*in_place)[1].content.data() == (*history)[0].content.data());
  CHECK((*in_place)[3].content.data() == (*history)[2].content.data());
  CHECK((*copied)[1].content.data() != (*history)[0].content.data());
  CHECK((*in_place)[2].tool_calls.size() == 2);
  CHECK((*in_place)[3].tool_call_id == "c1");
  CHECK((*in_place)[3].tool_calls.empty());
  CHECK((*in_place)[4].tool_call_id == "c2");
  CHECK((*in_place)[4].content == interrupted_tool_result);
  // The prompt keeps the log: it outlives every other reference.
  std::weak_ptr<std::vector<turn>> weak = history;
  auto expected = copied->to_messages();
  history.reset();
  CHECK_FALSE(weak.expired());
  auto kept = *in_place; // a copy shares the log
  in_place = prompt{};
  CHECK_FALSE(weak.expired());
  CHECK(kept.to_messages() == expected);
  kept = prompt{};
  CHECK(weak.expired());
}

TEST_CASE("a prompt given another owner copies the turns it read in place "
          "so far") {
  auto first = stored_history();
  auto ptrs = pointers(*first);
  context_manifest m;
  auto p = fit_prompt(byte_counter{}, 100000, 0, parts(), ptrs, m, first);
  REQUIRE(p);
  auto before = p->to_messages();
  std::weak_ptr<std::vector<turn>> weak = first;
  auto second = std::make_shared<std::vector<turn>>(
    std::vector<turn>{make_user_turn("from another log, long enough to be "
                                     "on the heap")});
  p->keep(second);
  p->push_turn((*second)[0]);
  first.reset();
  CHECK(weak.expired()); // the first log is no longer needed
  auto after = p->to_messages();
  REQUIRE(after.size() == before.size() + 1);
  CHECK(std::vector<chat_message>(after.begin(), after.end() - 1) == before);
  CHECK(after.back().content
        == "from another log, long enough to be on the heap");
}

TEST_CASE("a prompt travels as its messages") {
  auto history = stored_history();
  auto ptrs = pointers(*history);
  context_manifest m;
  auto p = fit_prompt(byte_counter{}, 100000, 0, parts(), ptrs, m, history);
  REQUIRE(p);
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  REQUIRE_FALSE(sink(*p));
  prompt received;
  caf::binary_deserializer source{nullptr, buf};
  REQUIRE_FALSE(source(received));
  CHECK(received == *p);
  history.reset();
  auto copy = p->to_messages();
  p = prompt{};
  // The received prompt owns its text.
  CHECK(received.to_messages() == copy);
}

TEST_CASE("prompts built while their thread is appended to and cleared keep "
          "the turns they read, unchanged, after the thread moved on") {
  runtime rt;
  const std::string id = "prompt-under-writes";
  REQUIRE(rt.add_turn(id, make_user_turn("turn 0 of generation 0, long "
                                         "enough for the heap")));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> builds{0}, bad{0};
  std::mutex mx;
  std::vector<std::pair<prompt, std::vector<chat_message>>> held;
  std::vector<std::thread> builders;
  for (int b = 0; b < 6; ++b)
    builders.emplace_back([&] {
      build_options o;
      o.max_turns = 40;
      o.max_context_tokens = 200000;
      o.turns = false;
      o.memory = false;
      while (!stop.load()) {
        auto built = rt.build_context(id, "", "and then?", o);
        if (!built) {
          ++bad;
          continue;
        }
        ++builds;
        auto snapshot = built->messages.to_messages();
        // History turns read "turn N of generation G" (system messages
        // are the prompt's own and a summary).
        for (size_t i = 1; i + 1 < snapshot.size(); ++i)
          if (snapshot[i].role != "system"
              && snapshot[i].content.rfind("turn ", 0) != 0)
            ++bad;
        std::lock_guard<std::mutex> guard{mx};
        held.emplace_back(std::move(built->messages), std::move(snapshot));
        if (held.size() > 64)
          held.erase(held.begin());
      }
    });
  // The writer: appends, and clears (a new log) every 50 turns.
  for (int g = 0; g < 40; ++g) {
    for (int i = 1; i < 50; ++i) {
      auto text = "turn " + std::to_string(i) + " of generation "
                  + std::to_string(g) + ", long enough for the heap";
      if (!rt.add_turn(id, i % 2 == 0 ? make_user_turn(std::move(text))
                                      : make_assistant_turn(std::move(text))))
        ++bad;
    }
    if (!rt.clear_thread(id))
      ++bad;
    if (!rt.add_turn(id, make_user_turn("turn 0 of generation "
                                        + std::to_string(g + 1)
                                        + ", long enough for the heap")))
      ++bad;
  }
  stop = true;
  for (auto& t : builders)
    t.join();
  CHECK(bad == 0);
  CHECK(builds > 0);
  // Every prompt still reads what it read when it was built, though the
  // logs it read from have been replaced since.
  for (auto& [p, snapshot] : held)
    CHECK(p.to_messages() == snapshot);
}
