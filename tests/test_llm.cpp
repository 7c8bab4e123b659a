// The LLM provider interface and the offline provider (spindle's default):
// no network, deterministic, honest about being offline, streams in deltas
// and stops when the client goes away.

#include <thread>

#include <catch2/catch.hpp>

#include "spindle/runtime/llm.hpp"

using namespace spindle;

namespace {

std::vector<chat_message> sample_prompt(bool memory, int history,
                                        bool rewrite) {
  std::vector<chat_message> m{{"system", "You are helpful.", {}}};
  if (memory)
    m.push_back({"system", "Long-term memory:\n- likes tea", {}});
  for (int i = 0; i < history; ++i)
    m.push_back({i % 2 == 0 ? "user" : "assistant", "h" + std::to_string(i),
                 {}});
  m.push_back({"user",
               rewrite ? "Original user message:\nwho are his children\n\n"
                         "---\n\nContextualized query:\nwho are Donald "
                         "Trump's children"
                       : "who are his children",
               {}});
  return m;
}

} // namespace

TEST_CASE("offline provider: says it is offline and reports what it "
          "received") {
  offline_provider p;
  auto r = p.complete(sample_prompt(true, 2, false), {}, {});
  REQUIRE(r);
  REQUIRE_FALSE(r->interrupted);
  REQUIRE_THAT(r->text, Catch::StartsWith("[offline provider]"));
  REQUIRE_THAT(r->text, Catch::Contains("not an answer"));
  REQUIRE_THAT(r->text, Catch::Contains("Received 5 messages"));
  REQUIRE_THAT(r->text, Catch::Contains("long-term memory yes"));
  REQUIRE_THAT(r->text, Catch::Contains("2 history turns"));
  REQUIRE_THAT(r->text, Catch::Contains("rewritten query no"));
  REQUIRE_THAT(r->text, Catch::Contains("\"who are his children\""));
  auto rw = p.complete(sample_prompt(false, 0, true), {}, {});
  REQUIRE_THAT(rw->text, Catch::Contains("long-term memory no"));
  REQUIRE_THAT(rw->text, Catch::Contains("0 history turns"));
  REQUIRE_THAT(rw->text, Catch::Contains("rewritten query yes"));
  REQUIRE_THAT(rw->text, Catch::Contains("Your message: \"who are his "
                                         "children\""));
  REQUIRE_THAT(rw->text, Catch::Contains("Donald Trump's children"));
}

TEST_CASE("offline provider: deterministic, streamed in at most 4 deltas "
          "that add up to the reply, safe from many threads") {
  offline_provider p;
  auto m = sample_prompt(true, 6, true);
  std::vector<std::string> deltas;
  auto r = p.complete(m, {}, [&](std::string_view d) {
    deltas.emplace_back(d);
    return true;
  });
  REQUIRE(r);
  REQUIRE(deltas.size() >= 2);
  REQUIRE(deltas.size() <= 4);
  std::string sum;
  for (auto& d : deltas)
    sum += d;
  REQUIRE(sum == r->text);
  REQUIRE(r->text == offline_provider::reply_for(m));
  std::vector<std::thread> pool;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto again = p.complete(m, {}, {});
        if (!again || again->text != r->text)
          ++mismatches;
      }
    });
  for (auto& t : pool)
    t.join();
  REQUIRE(mismatches == 0);
}

TEST_CASE("offline provider: stops when the callback returns false and "
          "returns what was generated") {
  offline_provider p;
  int calls = 0;
  auto r = p.complete(sample_prompt(false, 2, false), {},
                      [&](std::string_view) {
    return ++calls < 2;
  });
  REQUIRE(r);
  REQUIRE(r->interrupted);
  REQUIRE(calls == 2);
  auto full = offline_provider::reply_for(sample_prompt(false, 2, false));
  REQUIRE(r->text.size() < full.size());
  REQUIRE(full.compare(0, r->text.size(), r->text) == 0);
}

TEST_CASE("offline provider: an empty prompt is an upstream failure") {
  offline_provider p;
  auto r = p.complete({}, {}, {});
  REQUIRE_FALSE(r);
  REQUIRE(classify(r.error()) == errc::upstream_failure);
}

TEST_CASE("prompt summary: reads the D7 layout back") {
  auto s = summarize_prompt(sample_prompt(true, 3, true));
  REQUIRE(s.messages == 6);
  REQUIRE(s.system_prompt);
  REQUIRE(s.memory);
  REQUIRE(s.history_turns == 3);
  REQUIRE(s.rewrite);
  REQUIRE(s.original == "who are his children");
  REQUIRE(s.rewritten == "who are Donald Trump's children");
  auto bare = summarize_prompt({{"user", "hi", {}}});
  REQUIRE_FALSE(bare.system_prompt);
  REQUIRE(bare.history_turns == 0);
  REQUIRE(bare.original == "hi");
}

TEST_CASE("split deltas: pieces cut at spaces add up to the text") {
  std::string text = "one two three four five six seven eight nine ten";
  for (size_t parts : {1, 2, 3, 4, 7, 50}) {
    auto pieces = split_deltas(text, parts);
    REQUIRE(pieces.size() <= parts);
    std::string sum;
    for (auto& p : pieces) {
      REQUIRE_FALSE(p.empty());
      sum += p;
    }
    REQUIRE(sum == text);
  }
  REQUIRE(split_deltas("", 4).empty());
  REQUIRE(split_deltas("nospaces", 4) == std::vector<std::string>{"nospaces"});
}
