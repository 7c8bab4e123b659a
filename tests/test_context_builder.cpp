// The context builder (D7) and the query rewriter. Ports the seed's three
// context builder integration tests (seed 004, section 9), including the
// critical "Who is Donald Trump?" -> "who are his children" regression, and
// pins every FORBIDDEN pattern of sections 4, 5, 7 and 8 that spindle's
// design could regress.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "llm_doubles.hpp"
#include "spindle/actors/context_builder.hpp"
#include "spindle/runtime/rewriter.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

std::string joined(const prompt& messages) {
  std::string out;
  for (auto m : messages)
    out += std::string{m.role} + ": " + std::string{m.content} + "\n";
  return out;
}

// A rewriter that records what it was given and answers a fixed query.
class recording_rewriter : public query_rewriter {
public:
  explicit recording_rewriter(std::string answer) : answer_(std::move(answer)) {
  }
  std::string name() const override {
    return "recording";
  }
  bool blocking() const noexcept override {
    return false;
  }
  rewrite_result rewrite(const rewrite_request& request) override {
    std::lock_guard<std::mutex> guard{mtx_};
    seen_.push_back(request);
    return rewrite_result{answer_.empty() ? request.message : answer_, {}};
  }
  std::vector<rewrite_request> seen() {
    std::lock_guard<std::mutex> guard{mtx_};
    return seen_;
  }

private:
  std::string answer_;
  std::mutex mtx_;
  std::vector<rewrite_request> seen_;
};

runtime_options with_rewriter(std::shared_ptr<query_rewriter> rw) {
  runtime_options opts;
  opts.conversation.rewriter = std::move(rw);
  return opts;
}

void seed_trump(runtime& rt, const std::string& thread) {
  REQUIRE(rt.add_turn(thread, make_user_turn("Who is Donald Trump?")));
  REQUIRE(rt.add_turn(thread, make_assistant_turn(
                                "Donald Trump is an American businessman "
                                "and politician.")));
}

} // namespace

// -- the seed's three integration tests ---------------------------------------

TEST_CASE("context builder: build_contextual_messages_sees_previous_turns") {
  runtime rt;
  seed_trump(rt, "trump");
  auto result = rt.build_context("trump", "", "who are his children");
  REQUIRE(result);
  REQUIRE(result->thread_found);
  // MUST see previous turns: exactly the two of the first request.
  REQUIRE(result->short_term_history.size() == 2);
  auto all = joined(result->messages);
  REQUIRE_THAT(all, Catch::Contains("Who is Donald Trump"));
  REQUIRE_THAT(all, Catch::Contains("Donald Trump is"));
  // In order, and before the new message, which is last.
  auto& m = result->messages;
  REQUIRE(m.size() == 4); // system, user, assistant, user
  REQUIRE(m[0].role == "system");
  REQUIRE(m[1].role == "user");
  REQUIRE(m[1].content == "Who is Donald Trump?");
  REQUIRE(m[2].role == "assistant");
  REQUIRE_THAT(std::string{m[2].content},
               Catch::StartsWith("Donald Trump is"));
  REQUIRE(m[3].role == "user");
  REQUIRE(m[3].content == "who are his children");
}

TEST_CASE("context builder: an unknown thread gives an empty history, "
          "thread_found false, and is not created") {
  runtime rt;
  auto result = rt.build_context("never-seen", "", "hello there");
  REQUIRE(result);
  REQUIRE_FALSE(result->thread_found);
  REQUIRE(result->short_term_history.empty());
  REQUIRE(result->messages.size() == 2);
  REQUIRE(result->messages.back().content == "hello there");
  REQUIRE(rt.count_threads() == 0u);
  REQUIRE_FALSE(rt.snapshot("never-seen"));
}

TEST_CASE("context builder: the query rewriter receives the full context: "
          "original message, history and memory snippet") {
  auto rw = std::make_shared<recording_rewriter>(
    "who are Donald Trump's children");
  runtime rt{with_rewriter(rw)};
  seed_trump(rt, "rw");
  REQUIRE(rt.store_memory("The user is researching Donald Trump's family.",
                          memory_tags("", "rw")));
  auto result = rt.build_context("rw", "", "who are his children Trump");
  REQUIRE(result);
  auto seen = rw->seen();
  REQUIRE(seen.size() == 1);
  REQUIRE(seen[0].message == "who are his children Trump");
  REQUIRE(seen[0].history.size() == 2);
  REQUIRE(seen[0].history[0].content == "Who is Donald Trump?");
  REQUIRE(seen[0].history[1].role == "assistant");
  REQUIRE_THAT(seen[0].memory_snippet, Catch::Contains("family"));
  // The rewrite is an addition: the original stays in the last message.
  REQUIRE(result->rewritten_query == "who are Donald Trump's children");
  REQUIRE(result->messages.back().content
          == "Original user message:\nwho are his children Trump\n\n---\n\n"
             "Contextualized query:\nwho are Donald Trump's children");
}

// -- FORBIDDEN patterns -------------------------------------------------------

TEST_CASE("context builder: never creates a thread, even under many "
          "concurrent builds for unknown IDs") {
  runtime rt;
  std::vector<std::thread> pool;
  std::atomic<int> errors{0};
  for (int c = 0; c < 8; ++c)
    pool.emplace_back([&, c] {
      for (int i = 0; i < 50; ++i) {
        auto r = rt.build_context("ghost-" + std::to_string((c * 50 + i) % 17),
                                  "", "hi");
        if (!r || r->thread_found)
          ++errors;
      }
    });
  for (auto& t : pool)
    t.join();
  REQUIRE(errors == 0);
  REQUIRE(rt.count_threads() == 0u);
}

TEST_CASE("context builder: building never mutates the thread") {
  runtime rt;
  for (int i = 0; i < 30; ++i)
    rt.add_turn("ro", i % 2 ? make_assistant_turn("a" + std::to_string(i))
                            : make_user_turn("u" + std::to_string(i)));
  auto before = rt.snapshot("ro");
  for (uint64_t max : {2, 4, 12, 100})
    for (int i = 0; i < 5; ++i) {
      build_options o;
      o.max_turns = max;
      REQUIRE(rt.build_context("ro", "", "next", o));
    }
  auto after = rt.snapshot("ro");
  REQUIRE(after->turns == before->turns);
  REQUIRE(after->epoch == before->epoch);
}

TEST_CASE("context builder: the window keeps the newest turns, chronological, "
          "default 12") {
  runtime rt;
  for (int i = 0; i < 40; ++i)
    rt.add_turn("win", i % 2 ? make_assistant_turn("a" + std::to_string(i))
                             : make_user_turn("u" + std::to_string(i)));
  auto r = rt.build_context("win", "", "latest");
  REQUIRE(r);
  REQUIRE(r->short_term_history.size() == builder_default_max_turns);
  REQUIRE(r->short_term_history.front().content == "u28");
  REQUIRE(r->short_term_history.back().content == "a39");
  REQUIRE(r->total_turns == 40);
  build_options o;
  o.max_turns = 4;
  auto small = rt.build_context("win", "", "latest", o);
  REQUIRE(small->short_term_history.size() == 4);
  REQUIRE(small->short_term_history.front().content == "u36");
  // History in the messages is in thread order.
  auto& m = small->messages;
  REQUIRE(m[1].content == "u36");
  REQUIRE(m[4].content == "a39");
  REQUIRE(m.back().content == "latest");
}

TEST_CASE("context builder: memory comes after the system prompt and before "
          "the history, as a system message, and never replaces history") {
  runtime rt;
  seed_trump(rt, "mem");
  REQUIRE(
    rt.store_memory("Trump has five children.", memory_tags("u1", "mem")));
  auto r = rt.build_context("mem", "u1", "list the children");
  REQUIRE(r);
  REQUIRE_FALSE(r->memory_snippet.empty());
  auto& m = r->messages;
  REQUIRE(m.size() == 5);
  REQUIRE(m[0].role == "system");
  REQUIRE(m[0].content == default_system_prompt);
  REQUIRE(m[1].role == "system");
  REQUIRE(m[1].content == "Long-term memory:\n" + r->memory_snippet);
  REQUIRE(m[2].content == "Who is Donald Trump?");
  REQUIRE(m[3].role == "assistant");
  REQUIRE(m[4].content == "list the children");
  // No memory message at all when the snippet is empty.
  auto none = rt.build_context("mem", "u1", "weather tomorrow");
  REQUIRE(none->memory_snippet.empty());
  REQUIRE(none->messages.size() == 4);
  // Memory switched off for a request.
  build_options off;
  off.memory = false;
  auto r2 = rt.build_context("mem", "u1", "list the children", off);
  REQUIRE(r2->memory_snippet.empty());
  REQUIRE(r2->messages.size() == 4);
}

TEST_CASE("context builder: the original message is always in the prompt") {
  SECTION("no rewrite: the last message is the original") {
    runtime rt;
    auto r = rt.build_context("o", "", "who are his children");
    REQUIRE(r->messages.back().content == "who are his children");
    REQUIRE(r->rewritten_query == "who are his children");
  }
  SECTION("a rewrite equal to the original is not repeated") {
    runtime rt{with_rewriter(std::make_shared<recording_rewriter>(""))};
    auto r = rt.build_context("o", "", "standalone question");
    REQUIRE(r->messages.back().content == "standalone question");
  }
  SECTION("a differing rewrite is added under the original") {
    runtime rt{with_rewriter(std::make_shared<recording_rewriter>("X"))};
    seed_trump(rt, "o");
    auto r = rt.build_context("o", "", "orig");
    REQUIRE(r->messages.back().role == "user");
    REQUIRE(r->messages.back().content
            == "Original user message:\norig\n\n---\n\nContextualized "
               "query:\nX");
  }
  SECTION("rewriting switched off") {
    runtime rt{with_rewriter(std::make_shared<recording_rewriter>("X"))};
    build_options o;
    o.rewrite = false;
    auto r = rt.build_context("o", "", "orig", o);
    REQUIRE(r->messages.back().content == "orig");
  }
  SECTION("a failing rewriter falls back to the original") {
    auto provider = std::make_shared<test::failing_provider>();
    runtime rt{with_rewriter(std::make_shared<llm_rewriter>(provider))};
    seed_trump(rt, "o");
    auto r = rt.build_context("o", "", "orig");
    REQUIRE(r);
    REQUIRE(r->messages.back().content == "orig");
    REQUIRE_THAT(r->rewrite_fallback, Catch::StartsWith("error"));
  }
}

TEST_CASE("context builder: a system prompt of the request replaces the "
          "default") {
  runtime rt;
  build_options o;
  o.system_prompt = "Answer in French.";
  auto r = rt.build_context("sp", "", "hello", o);
  REQUIRE(r->messages.front().content == "Answer in French.");
}

TEST_CASE("context builder: bad requests are refused naming the field") {
  runtime rt;
  auto expect = [&](const std::string& thread, const std::string& user,
                    const std::string& msg, uint64_t max, errc code,
                    const std::string& field) {
    build_options o;
    o.max_turns = max;
    auto r = rt.build_context(thread, user, msg, o);
    REQUIRE_FALSE(r);
    REQUIRE(classify(r.error()) == code);
    REQUIRE_THAT(describe(r.error()), Catch::Contains(field));
  };
  expect("../x", "", "hi", 12, errc::invalid_id, "thread_id");
  expect("t", "bad user", "hi", 12, errc::invalid_id, "user_id");
  expect("t", "", "", 12, errc::invalid_argument, "message");
  expect("t", "", "hi", 1, errc::invalid_argument, "max_turns");
  REQUIRE(rt.count_threads() == 0u);
}

// -- the query rewriter -------------------------------------------------------

TEST_CASE("query rewriter: the provider-backed rewriter falls back to the "
          "original on error, timeout and empty output") {
  rewrite_request req{"who are his children",
                      {chat_message{"user", "Who is Donald Trump?", {}},
                       chat_message{"assistant", "A politician.", {}}},
                      "likes short answers"};
  SECTION("a provider that fails") {
    llm_rewriter rw{std::make_shared<test::failing_provider>()};
    auto r = rw.rewrite(req);
    REQUIRE(r.query == req.message);
    REQUIRE_THAT(r.fallback, Catch::StartsWith("error"));
  }
  SECTION("a provider that reports a timeout") {
    llm_rewriter rw{std::make_shared<test::failing_provider>(errc::timeout)};
    auto r = rw.rewrite(req);
    REQUIRE(r.query == req.message);
    REQUIRE(r.fallback == "timeout");
  }
  SECTION("a provider that answers after the timeout") {
    llm_rewriter rw{std::make_shared<test::slow_provider>(150ms, "late"), 30ms};
    auto r = rw.rewrite(req);
    REQUIRE(r.query == req.message);
    REQUIRE(r.fallback == "timeout");
  }
  SECTION("a provider that returns nothing but whitespace") {
    llm_rewriter rw{std::make_shared<test::scripted_provider>("  \n ")};
    auto r = rw.rewrite(req);
    REQUIRE(r.query == req.message);
    REQUIRE(r.fallback == "empty output");
  }
  SECTION("a provider that returns a rewrite") {
    auto p = std::make_shared<test::scripted_provider>(
      " who are Donald Trump's children\n");
    llm_rewriter rw{p};
    auto r = rw.rewrite(req);
    REQUIRE(r.query == "who are Donald Trump's children");
    REQUIRE(r.fallback.empty());
    // It was given the whole context, and the 2 s default timeout.
    auto prompts = p->prompts();
    REQUIRE(prompts.size() == 1);
    auto& body = prompts[0].back().content;
    REQUIRE_THAT(body, Catch::Contains("Who is Donald Trump?"));
    REQUIRE_THAT(body, Catch::Contains("likes short answers"));
    REQUIRE_THAT(body, Catch::Contains("who are his children"));
    REQUIRE(p->timeouts()[0] == 2000ms);
  }
}

TEST_CASE("query rewriter: nothing to resolve (no history, no memory) asks "
          "no rewriter - history or a memory snippet does") {
  auto rw = std::make_shared<recording_rewriter>("X");
  runtime rt{with_rewriter(rw)};
  auto first = rt.build_context("fresh", "", "who are his children");
  REQUIRE(first);
  CHECK(rw->seen().empty());
  CHECK(first->rewritten_query == "who are his children");
  CHECK(first->messages.back().content == "who are his children");
  CHECK_THAT(first->rewrite_fallback, Catch::StartsWith("skipped"));
  // A memory snippet alone is something to resolve against.
  REQUIRE(rt.store_memory("Ada Lovelace had three children.",
                          memory_tags("ada-fan", "")));
  auto with_memory = rt.build_context("fresh", "ada-fan",
                                      "how many children did she have");
  REQUIRE(with_memory);
  REQUIRE_FALSE(with_memory->memory_snippet.empty());
  CHECK(rw->seen().size() == 1);
  CHECK(with_memory->rewritten_query == "X");
  // So is history.
  seed_trump(rt, "fresh");
  auto with_history = rt.build_context("fresh", "", "who are his children");
  REQUIRE(with_history);
  CHECK(rw->seen().size() == 2);
  CHECK(with_history->rewritten_query == "X");
}

TEST_CASE("query rewriter: a rewriter that says it is the identity is "
          "never asked") {
  // It would answer "X" if it were asked: the builder must not ask it.
  class identity_rewriter : public recording_rewriter {
  public:
    identity_rewriter() : recording_rewriter("X") {
    }
    bool identity() const noexcept override {
      return true;
    }
  };
  auto rw = std::make_shared<identity_rewriter>();
  runtime rt{with_rewriter(rw)};
  seed_trump(rt, "same");
  REQUIRE(rt.store_memory("Ada Lovelace had three children.",
                          memory_tags("ada-fan", "")));
  auto r = rt.build_context("same", "ada-fan", "who are his children");
  REQUIRE(r);
  CHECK(rw->seen().empty());
  CHECK(r->rewritten_query == "who are his children");
  CHECK(r->rewrite_fallback.empty());
  CHECK(r->messages.back().content == "who are his children");
  CHECK(r->short_term_history.size() == 2);
  CHECK_FALSE(r->memory_snippet.empty());
  // The offline rewriter is one.
  CHECK(offline_rewriter{}.identity());
  CHECK_FALSE(rw->recording_rewriter::identity());
}

TEST_CASE("query rewriter: a rewriter that hangs cannot hold up a build "
          "past its timeout") {
  runtime_options opts;
  opts.conversation.rewriter = std::make_shared<llm_rewriter>(
    std::make_shared<test::slow_provider>(1500ms, "too late"), 50ms);
  opts.conversation.builder.rewrite_timeout = 50ms;
  runtime rt{opts};
  seed_trump(rt, "slow");
  auto start = std::chrono::steady_clock::now();
  auto r = rt.build_context("slow", "", "who are his children");
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(r);
  REQUIRE(r->rewritten_query == "who are his children");
  REQUIRE(r->rewrite_fallback == "timeout");
  REQUIRE(r->messages.back().content == "who are his children");
  REQUIRE(took < 1200ms);
}

TEST_CASE("query rewriter: rewriting never changes thread state") {
  auto p = std::make_shared<test::scripted_provider>("rewritten query");
  runtime rt{with_rewriter(std::make_shared<llm_rewriter>(p))};
  seed_trump(rt, "keep");
  auto before = rt.snapshot("keep");
  for (int i = 0; i < 10; ++i)
    REQUIRE(rt.build_context("keep", "", "who are his children"));
  REQUIRE(rt.snapshot("keep")->turns == before->turns);
  REQUIRE(p->prompts().size() == 10);
}

TEST_CASE("query rewriter: the offline rewriter returns the original for "
          "every input, whatever the context") {
  offline_rewriter rw;
  REQUIRE_FALSE(rw.blocking());
  for (std::string msg : {"who are his children", "  spaced   out ", "it?",
                          "Tell me more about that one"}) {
    rewrite_request req{msg,
                        {chat_message{"user", "Who is Donald Trump?", {}}},
                        "memory"};
    auto r = rw.rewrite(req);
    REQUIRE(r.query == msg);
    REQUIRE(r.fallback.empty());
  }
  runtime rt;
  seed_trump(rt, "off");
  auto r = rt.build_context("off", "", "who are his children");
  REQUIRE(r->rewritten_query == "who are his children");
  REQUIRE(r->messages.back().content == "who are his children");
}

TEST_CASE("prompt assembly: D7 order with every part present") {
  auto asking = make_assistant_turn("a1");
  asking.tool_calls = {tool_call{"call-7", "answer", "{}"}};
  std::vector<turn> history{make_user_turn("q1"), asking,
                            make_tool_turn("42", "call-7")};
  auto m = assemble_messages("sys", "- fact", history, "orig", "rewritten");
  REQUIRE(m.size() == 6);
  REQUIRE(m[0] == chat_message{"system", "sys", {}});
  REQUIRE(m[1] == chat_message{"system", "Long-term memory:\n- fact", {}});
  REQUIRE(m[2] == chat_message{"user", "q1", {}});
  REQUIRE(m[3] == chat_message{"assistant", "a1", {}, asking.tool_calls});
  REQUIRE(m[4] == chat_message{"tool", "42", "call-7"});
  REQUIRE(m[5].content
          == "Original user message:\norig\n\n---\n\nContextualized "
             "query:\nrewritten");
  auto plain = assemble_messages("sys", "", std::vector<turn>{}, "orig", "orig");
  REQUIRE(plain.size() == 2);
  REQUIRE(plain[1].content == "orig");
}

namespace {

// Counts the builds that counted the tokens of `message`.
class counting_counter : public token_counter {
public:
  counting_counter(std::string message, std::atomic<int>& builds)
    : message_(std::move(message)), builds_(builds) {
  }
  token_encoding_id id() const noexcept override {
    return token_encoding_id::o200k_base;
  }
  std::string_view name() const noexcept override {
    return "o200k_base";
  }
  size_t count_text(std::string_view text) const override {
    if (text == message_)
      ++builds_;
    return text.size() / 4 + 1;
  }

private:
  std::string message_;
  std::atomic<int>& builds_;
};

} // namespace

TEST_CASE("context builder: a builder handles at most context_builder_turn "
          "messages each time its worker runs it, then lets the next job "
          "run") {
  spindle::config cfg{1}; // one worker: the order is its queue's order
  caf::actor_system sys{cfg};
  const std::string message = "a message only the builds count";
  std::atomic<int> builds{0};
  context_builder_options opts;
  opts.tokens = std::make_shared<counting_counter>(message, builds);
  // A resident thread: a build reads its view and answers in one message.
  auto views = std::make_shared<thread_views>();
  auto view = std::make_shared<thread_view>();
  view->turns = std::make_shared<turn_log>();
  views->publish("t", view);
  opts.views = views;
  auto builder = spawn_context_builder(sys, thread_registry_actor{},
                                       memory_actor{}, query_rewriter_actor{},
                                       opts);
  // The worker is held while the builds and the probe queue behind it.
  std::promise<void> release;
  auto held = release.get_future().share();
  std::promise<void> holding;
  auto blocker = sys.spawn([&, held](caf::event_based_actor* self) {
    return caf::behavior{[&, held, self](caf::ok_atom) {
      holding.set_value();
      held.wait();
      self->quit();
    }};
  });
  caf::anon_send(blocker, caf::ok_atom::value);
  REQUIRE(holding.get_future().wait_for(5s) == std::future_status::ready);
  const int n = std::max(40, 5 * static_cast<int>(context_builder_turn));
  caf::scoped_actor client{sys};
  for (int i = 0; i < n; ++i)
    client->send(builder, build_context_atom::value,
                 build_request{"t", "u", message, build_options{}});
  std::promise<int> seen;
  auto probe = sys.spawn([&](caf::event_based_actor* self) {
    return caf::behavior{[&, self](caf::ok_atom) {
      seen.set_value(builds.load());
      self->quit();
    }};
  });
  caf::anon_send(probe, caf::ok_atom::value);
  release.set_value();
  auto at_probe = seen.get_future();
  REQUIRE(at_probe.wait_for(5s) == std::future_status::ready);
  // The builder ran first and served one turn's builds (one message each),
  // then the probe.
  CHECK(at_probe.get() == static_cast<int>(context_builder_turn));
  // Every build is answered, in the end.
  int answered = 0;
  client->receive_for(answered, n)(
    [&](built_context& ctx) { CHECK(ctx.messages.size() == 2); },
    caf::after(5s) >> [] { FAIL("a build was not answered"); });
  CHECK(answered == n);
  CHECK(builds.load() == n);
  caf::anon_send_exit(builder, caf::exit_reason::user_shutdown);
}
