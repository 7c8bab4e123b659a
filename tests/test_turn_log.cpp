// Published thread views: the append-only turn log read by other threads
// while its actor appends, the views directory, and the context builder
// reading resident threads through it (docs/threads.md, "Published views").

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include <unistd.h>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "spindle/actors/context_builder.hpp"
#include "spindle/actors/thread_registry.hpp"
#include "spindle/actors/turn_log.hpp"
#include "spindle/runtime/config.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/runtime/tokenizer.hpp"

using namespace spindle;

namespace {

std::string content_of(size_t i) {
  // Longer than the small-string buffer: a torn read would show.
  return "turn number " + std::to_string(i) + " of the published log";
}

} // namespace

TEST_CASE("turn log: readers on other threads see an exact, growing prefix "
          "while one writer appends, with 1, 2, 4 and 8 readers") {
  for (size_t readers : {1, 2, 4, 8}) {
    CAPTURE(readers);
    constexpr size_t total = 20000;
    turn_log log;
    std::atomic<bool> done{false};
    std::atomic<uint64_t> bad{0};
    std::atomic<uint64_t> reads{0};
    std::atomic<size_t> running{0};
    std::vector<std::thread> pool;
    for (size_t r = 0; r < readers; ++r)
      pool.emplace_back([&] {
        size_t last = 0;
        bool first = true;
        while (!done.load()) {
          auto n = log.size();
          if (n < last)
            ++bad; // the size went down
          last = n;
          // The newest turns (what a window reads) and one at random.
          auto from = n > 12 ? n - 12 : 0;
          for (auto i = from; i < n; ++i)
            if (log[i].content != content_of(i)
                || log[i].timestamp_ms != static_cast<int64_t>(i))
              ++bad;
          if (n > 0 && log[n / 2].content != content_of(n / 2))
            ++bad;
          ++reads;
          if (first)
            ++running;
          first = false;
        }
      });
    // Every reader is reading before the writer starts: on a loaded
    // machine a reader scheduled late would otherwise see only the end.
    while (running.load() < readers)
      std::this_thread::yield();
    for (size_t i = 0; i < total; ++i) {
      auto t = make_user_turn(content_of(i));
      t.timestamp_ms = static_cast<int64_t>(i);
      REQUIRE(log.push_back(std::move(t)) == i + 1);
    }
    done = true;
    for (auto& t : pool)
      t.join();
    CHECK(bad == 0);
    CHECK(reads > 0);
    REQUIRE(log.size() == total);
    for (size_t i = 0; i < total; ++i)
      REQUIRE(log[i].content == content_of(i));
    std::vector<turn> tail;
    log.copy(total - 3, total, tail);
    REQUIRE(tail.size() == 3);
    CHECK(tail[2].content == content_of(total - 1));
  }
}

TEST_CASE("turn log: a window read from a view follows D6") {
  auto log = std::make_shared<turn_log>();
  log->push_back(make_user_turn("u1"));
  log->push_back(make_assistant_turn("a1"));
  log->push_back(make_user_turn("u2"));
  log->push_back(make_assistant_turn("a2"));
  log->push_back(make_tool_turn("t", "call-1"));
  thread_view view{log, 3, 42};
  auto w = read_window(view, 3);
  // The newest three start with a user turn.
  REQUIRE(w.turns.size() == 3);
  CHECK(w.turns[0].content == "u2");
  CHECK(w.turns[2].tool_call_id == "call-1");
  CHECK(w.total_turns == 5);
  CHECK(w.epoch == 3);
  CHECK(w.found);
  CHECK(w.thread_actor_id == 42);
  // Four would start with the orphan a1: the window skips it.
  auto four = read_window(view, 4);
  REQUIRE(four.turns.size() == 3);
  CHECK(four.turns[0].content == "u2");
  CHECK(read_window(view, 100).turns.size() == 5);
}

TEST_CASE("thread views: an actor withdraws only its own view") {
  thread_views views;
  auto log = std::make_shared<turn_log>();
  views.publish("t", std::make_shared<const thread_view>(thread_view{log, 0, 1}));
  // A newer actor of the same thread replaces the view...
  views.publish("t", std::make_shared<const thread_view>(thread_view{log, 0, 2}));
  // ...and the older one's withdrawal leaves it in place.
  views.withdraw("t", 1);
  REQUIRE(views.find("t"));
  CHECK(views.find("t")->actor_id == 2);
  views.withdraw("t", 2);
  CHECK_FALSE(views.find("t"));
  CHECK(views.size() == 0);
}

TEST_CASE("context builder: a build right after an acknowledged turn sees "
          "it, with 1, 4 and 16 concurrent writers and a clear in between") {
  for (size_t writers : {1, 4, 16}) {
    CAPTURE(writers);
    runtime_options opts;
    opts.conversation.memory = false;
    runtime rt{opts};
    std::atomic<uint64_t> bad{0};
    std::vector<std::thread> pool;
    for (size_t w = 0; w < writers; ++w)
      pool.emplace_back([&, w] {
        auto thread = "views-" + std::to_string(w);
        for (int i = 0; i < 60; ++i) {
          if (i == 30) {
            // A clear publishes a new, empty log: no build after it sees
            // the old turns.
            if (!rt.clear_thread(thread)) {
              ++bad;
              continue;
            }
            auto ctx = rt.build_context(thread, "user", "after the clear");
            if (!ctx || !ctx->thread_found || ctx->total_turns != 0
                || !ctx->short_term_history.empty())
              ++bad;
          }
          auto content = "w" + std::to_string(w) + " turn "
                         + std::to_string(i);
          auto count = rt.add_turn(thread, make_user_turn(content));
          auto ctx = rt.build_context(thread, "user", "next?");
          auto expected = static_cast<uint64_t>(i < 30 ? i + 1 : i - 29);
          if (!count || *count != expected || !ctx || !ctx->thread_found
              || ctx->total_turns != expected
              || ctx->short_term_history.empty()
              || ctx->short_term_history.back().content != content)
            ++bad;
        }
      });
    for (auto& t : pool)
      t.join();
    CHECK(bad == 0);
  }
}

TEST_CASE("context builder: a thread that is not resident is read through "
          "the registry, exactly and without being created") {
  auto dir = std::filesystem::temp_directory_path()
             / ("spindle-turn-log-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    runtime_options opts;
    opts.conversation.memory = false;
    opts.storage.data_dir = dir.string();
    runtime rt{opts};
    REQUIRE(rt.add_turn("stored", make_user_turn("Who is Donald Trump?")));
    REQUIRE(rt.add_turn("stored", make_assistant_turn("A politician.")));
  }
  runtime_options opts;
  opts.conversation.memory = false;
  opts.storage.data_dir = dir.string();
  runtime rt{opts};
  // After a restart nothing is resident: the build goes through the
  // registry, which activates the stored thread. The first asks for no
  // copy of the turns, as an exchange does: the prompt holds them.
  build_options no_copy;
  no_copy.turns = false;
  auto counted = rt.build_context("stored", "user", "who are his children",
                                  no_copy);
  REQUIRE(counted);
  CHECK(counted->thread_found);
  CHECK(counted->history_turns == 2);
  CHECK(counted->short_term_history.empty());
  REQUIRE(counted->messages.size() >= 3);
  CHECK(counted->messages[counted->messages.size() - 3].content
        == "Who is Donald Trump?");
  auto ctx = rt.build_context("stored", "user", "who are his children");
  REQUIRE(ctx);
  CHECK(ctx->thread_found);
  CHECK(ctx->history_turns == 2);
  REQUIRE(ctx->short_term_history.size() == 2);
  CHECK(ctx->short_term_history[0].content == "Who is Donald Trump?");
  CHECK(ctx->short_term_history[1].content == "A politician.");
  auto ghost = rt.build_context("ghost", "user", "hello");
  REQUIRE(ghost);
  CHECK_FALSE(ghost->thread_found);
  CHECK(rt.count_threads() == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("thread views: a thread publishes its turns when it starts and on "
          "a clear, and withdraws them when it passivates") {
  spindle::config cfg;
  caf::actor_system sys{cfg};
  auto views = std::make_shared<thread_views>();
  thread_registry_options opts;
  opts.views = views;
  auto registry = sys.spawn(thread_registry, opts, storage_actor{});
  caf::scoped_actor self{sys};
  auto add = [&](const char* content) {
    self
      ->request(registry, std::chrono::seconds{5}, caf::add_atom::value,
                std::string{"pub"}, make_user_turn(content))
      .receive([](uint64_t) {},
               [&](caf::error& err) { FAIL(caf::to_string(err)); });
  };
  CHECK_FALSE(views->find("pub"));
  add("one");
  add("two");
  auto view = views->find("pub");
  REQUIRE(view);
  REQUIRE(view->turns->size() == 2);
  CHECK((*view->turns)[1].content == "two");
  CHECK(view->epoch == 0);
  // A clear publishes a new, empty log; a reader of the old one keeps its
  // prefix.
  self
    ->request(registry, std::chrono::seconds{5}, caf::reset_atom::value,
              std::string{"pub"})
    .receive([](uint64_t) {},
             [&](caf::error& err) { FAIL(caf::to_string(err)); });
  auto cleared = views->find("pub");
  REQUIRE(cleared);
  CHECK(cleared->turns->size() == 0);
  CHECK(cleared->epoch == 1);
  CHECK(view->turns->size() == 2);
  // Passivated: withdrawn before it answers.
  thread_actor handle;
  self
    ->request(registry, std::chrono::seconds{5}, caf::get_atom::value,
              std::string{"pub"})
    .receive([&](thread_ref& ref) { handle = ref.handle; },
             [&](caf::error& err) { FAIL(caf::to_string(err)); });
  REQUIRE(handle);
  bool stopped = false;
  self->request(handle, std::chrono::seconds{5}, passivate_atom::value)
    .receive([&](bool x) { stopped = x; },
             [&](caf::error& err) { FAIL(caf::to_string(err)); });
  CHECK(stopped);
  CHECK_FALSE(views->find("pub"));
  self->send_exit(registry, caf::exit_reason::user_shutdown);
}

namespace {

// A registry that knows no thread at all, and turn logs published beside
// it: a build that found turns can only have read a view.
struct published_threads {
  spindle::config cfg;
  caf::actor_system sys{cfg};
  thread_registry_actor registry = sys.spawn(
    thread_registry, thread_registry_options{}, storage_actor{});
  std::shared_ptr<thread_views> views = std::make_shared<thread_views>();
  caf::scoped_actor self{sys};

  ~published_threads() {
    self->send_exit(registry, caf::exit_reason::user_shutdown);
  }

  void publish(const std::string& thread, std::shared_ptr<turn_log> log,
               uint64_t actor_id) {
    views->publish(thread, std::make_shared<const thread_view>(
                             thread_view{std::move(log), 0, actor_id}));
  }

  context_builder_actor builder(context_builder_options opts) {
    opts.views = views;
    return sys.spawn(context_builder, registry, memory_actor{},
                     query_rewriter_actor{}, std::move(opts));
  }

  built_context build(const context_builder_actor& builder,
                      build_request req) {
    built_context out;
    self
      ->request(builder, std::chrono::seconds{5}, build_context_atom::value,
                std::move(req))
      .receive([&](built_context& x) { out = std::move(x); },
               [&](caf::error& err) { FAIL(caf::to_string(err)); });
    return out;
  }
};

} // namespace

TEST_CASE("context builder: a published thread is read from its view, "
          "without asking the registry") {
  published_threads f;
  auto log = std::make_shared<turn_log>();
  log->push_back(make_user_turn("Who is Donald Trump?"));
  log->push_back(make_assistant_turn("A politician."));
  f.publish("seen", log, 77);
  auto builder = f.builder({});
  auto build = [&](const std::string& thread) {
    return f.build(builder, build_request{thread, "user",
                                          "who are his children",
                                          build_options{}});
  };
  auto seen = build("seen");
  CHECK(seen.thread_found);
  CHECK(seen.thread_actor_id == 77);
  REQUIRE(seen.short_term_history.size() == 2);
  CHECK(seen.short_term_history[0].content == "Who is Donald Trump?");
  REQUIRE(seen.messages.size() == 4);
  CHECK(seen.messages[3].content == "who are his children");
  // Not published: the registry answers, and it knows nothing.
  auto unseen = build("unseen");
  CHECK_FALSE(unseen.thread_found);
  CHECK(unseen.short_term_history.empty());
  f.self->send_exit(builder, caf::exit_reason::user_shutdown);
}

TEST_CASE("context builder: a build that asks for no copy of its turns gives "
          "the same prompt and counts the turns it holds, fitted to a budget "
          "or not") {
  published_threads f;
  auto log = std::make_shared<turn_log>();
  for (int i = 0; i < 30; ++i)
    log->push_back(i % 2 == 0
                     ? make_user_turn("question " + std::to_string(i))
                     : make_assistant_turn("answer " + std::to_string(i)));
  f.publish("seen", log, 5);
  for (bool fitted : {false, true}) {
    CAPTURE(fitted);
    context_builder_options opts;
    if (fitted)
      opts.tokens = make_token_counter("o200k_base");
    auto builder = f.builder(opts);
    auto build = [&](bool turns) {
      build_options o;
      o.max_turns = 20;
      // Fitted: a budget that holds some of the 20 turns, not all.
      o.max_context_tokens = fitted ? default_reply_tokens + 100 : 0;
      o.turns = turns;
      return f.build(builder, build_request{"seen", "user", "and then?", o});
    };
    auto copied = build(true);
    auto counted = build(false);
    REQUIRE(copied.thread_found);
    REQUIRE(counted.thread_found);
    CHECK(counted.messages == copied.messages);
    CHECK(counted.manifest.turns == copied.manifest.turns);
    CHECK(counted.total_turns == 30);
    CHECK(copied.history_turns == copied.short_term_history.size());
    CHECK(counted.history_turns == copied.history_turns);
    CHECK(counted.short_term_history.empty());
    // The prompt: the history turns it holds, then the message.
    REQUIRE(copied.messages.size() >= copied.history_turns + 1);
    CHECK(copied.messages.back().content == "and then?");
    CHECK(copied.short_term_history.back().content == "answer 29");
    if (fitted) {
      CHECK(copied.history_turns > 0);
      CHECK(copied.history_turns < 20);
      CHECK(copied.history_turns == copied.manifest.turns.size());
    } else {
      CHECK(copied.history_turns == 20);
    }
    f.self->send_exit(builder, caf::exit_reason::user_shutdown);
  }
}
