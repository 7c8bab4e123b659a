// The thread store: the registry and one actor per conversation. Ports the
// seed's seven thread store tests (seed 004, section 9) and pins D6 windows,
// snapshots, ID validation and the critical invariant under concurrency.

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;

namespace {

std::chrono::milliseconds timeout{5000};

turn tool_call_turn(std::string content) {
  // An assistant turn that asks for a tool; its result follows as a tool turn.
  return make_assistant_turn(std::move(content));
}

std::vector<std::string> contents(const std::vector<turn>& turns) {
  std::vector<std::string> out;
  for (auto& t : turns)
    out.push_back(t.content);
  return out;
}

std::vector<turn> turns_of(std::initializer_list<turn_role> roles) {
  std::vector<turn> out;
  int i = 0;
  for (auto r : roles) {
    turn t;
    t.role = r;
    t.content = "t" + std::to_string(i++);
    if (r == turn_role::tool)
      t.tool_call_id = "call-" + std::to_string(i);
    out.push_back(t);
  }
  return out;
}

} // namespace

// -- the seed's seven thread store tests --------------------------------------

TEST_CASE("threads store: a thread persists across multiple requests") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  REQUIRE(rt.add_turn("t1", make_user_turn("Q1")) == 1u);
  REQUIRE(rt.add_turn("t1", make_assistant_turn("A1")) == 2u);
  // A later "request": a fresh read sees both turns.
  auto history = rt.history("t1");
  REQUIRE(history);
  REQUIRE(contents(*history) == std::vector<std::string>{"Q1", "A1"});
  REQUIRE(rt.add_turn("t1", make_user_turn("Q2")) == 3u);
  REQUIRE(contents(*rt.history("t1"))
          == std::vector<std::string>{"Q1", "A1", "Q2"});
}

TEST_CASE("threads store: get_or_create reuses the existing thread actor") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  auto reg = rt.thread_registry();
  auto first = rt.call<thread_ref>(reg, timeout, caf::put_atom::value,
                                   std::string{"same"});
  REQUIRE(first);
  REQUIRE(first->created);
  REQUIRE_FALSE(first->found);
  REQUIRE(rt.add_turn("same", make_user_turn("hello")) == 1u);
  auto second = rt.call<thread_ref>(reg, timeout, caf::put_atom::value,
                                    std::string{"same"});
  REQUIRE(second);
  REQUIRE(second->found);
  REQUIRE_FALSE(second->created);
  REQUIRE(second->handle == first->handle);
  REQUIRE(second->handle.id() == first->handle.id());
  auto read = rt.call<thread_ref>(reg, timeout, caf::get_atom::value,
                                  std::string{"same"});
  REQUIRE(read);
  REQUIRE(read->handle == first->handle);
  // The turn added in between is still there: nothing was replaced.
  REQUIRE(rt.snapshot("same")->turns.size() == 1);
  REQUIRE(rt.count_threads() == 1u);
}

TEST_CASE("threads store: add_turn appends exactly one turn and never "
          "replaces the list") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  for (uint64_t i = 1; i <= 50; ++i) {
    auto count = rt.add_turn(
      "append", i % 2 ? make_user_turn("u" + std::to_string(i))
                      : make_assistant_turn("a" + std::to_string(i)));
    REQUIRE(count);
    REQUIRE(*count == i);
    auto snap = rt.snapshot("append");
    REQUIRE(snap->turns.size() == i);
    REQUIRE(snap->turns.front().content == "u1"); // the first is never lost
  }
}

TEST_CASE("threads store: turns keep chronological order - the last turn is "
          "the newest") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  rt.add_turn("order", make_user_turn("Who is Donald Trump?"));
  rt.add_turn("order", make_assistant_turn("Donald Trump is..."));
  rt.add_turn("order", make_user_turn("who are his children"));
  auto snap = rt.snapshot("order");
  REQUIRE(snap);
  REQUIRE(contents(snap->turns)
          == std::vector<std::string>{"Who is Donald Trump?",
                                      "Donald Trump is...",
                                      "who are his children"});
  REQUIRE(snap->turns[0].role == turn_role::user);
  REQUIRE(snap->turns[1].role == turn_role::assistant);
  REQUIRE(snap->turns[2].role == turn_role::user);
  // Timestamps were stamped on append and never go backwards.
  for (size_t i = 1; i < snap->turns.size(); ++i)
    REQUIRE(snap->turns[i - 1].timestamp_ms <= snap->turns[i].timestamp_ms);
  // Order is append order even when a caller supplies older timestamps.
  turn old = make_user_turn("stamped in the past");
  old.timestamp_ms = 1;
  rt.add_turn("order", old);
  REQUIRE(rt.snapshot("order")->turns.back().content == "stamped in the past");
}

TEST_CASE("threads store: get_thread and get_history never create a thread") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  auto reg = rt.thread_registry();
  auto ref = rt.call<thread_ref>(reg, timeout, caf::get_atom::value,
                                 std::string{"ghost"});
  REQUIRE(ref);
  REQUIRE_FALSE(ref->found);
  REQUIRE_FALSE(ref->handle);
  auto history = rt.history("ghost", 12);
  REQUIRE(history);
  REQUIRE(history->empty());
  auto window = rt.read_history("ghost", 12);
  REQUIRE(window);
  REQUIRE_FALSE(window->found);
  REQUIRE(window->thread_actor_id == 0);
  auto snap = rt.snapshot("ghost");
  REQUIRE_FALSE(snap);
  REQUIRE(classify(snap.error()) == errc::not_found);
  auto cleared = rt.clear_thread("ghost");
  REQUIRE_FALSE(cleared);
  REQUIRE(classify(cleared.error()) == errc::not_found);
  REQUIRE(rt.count_threads() == 0u);
  REQUIRE(rt.list_threads()->empty());
}

TEST_CASE("threads store: windowing returns the newest turns and never "
          "mutates the thread") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  for (int i = 0; i < 30; ++i)
    rt.add_turn("window", i % 2 == 0
                            ? make_user_turn("u" + std::to_string(i))
                            : make_assistant_turn("a" + std::to_string(i)));
  auto w = rt.history("window", 12);
  REQUIRE(w);
  REQUIRE(w->size() == 12);
  REQUIRE(w->front().content == "u18");
  REQUIRE(w->back().content == "a29");
  auto dflt = rt.history("window");
  REQUIRE(dflt->size() == store_default_max_turns);
  REQUIRE(dflt->front().content == "u10");
  // Reading (many times, any window) leaves every turn in place.
  for (uint64_t max : {2, 3, 5, 12, 20, 100})
    REQUIRE(rt.history("window", max));
  auto snap = rt.snapshot("window");
  REQUIRE(snap->turns.size() == 30);
  REQUIRE(snap->turns.front().content == "u0");
  REQUIRE(rt.history("window", 100)->size() == 30);
}

TEST_CASE("threads store: only clear removes turns, and it says how many") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  rt.add_turn("c", make_user_turn("q"));
  rt.add_turn("c", make_assistant_turn("a"));
  rt.history("c", 2);
  rt.snapshot("c");
  REQUIRE(rt.snapshot("c")->turns.size() == 2);
  auto removed = rt.clear_thread("c");
  REQUIRE(removed == 2u);
  auto snap = rt.snapshot("c");
  REQUIRE(snap->turns.empty());
  REQUIRE(snap->epoch == 1);
  // The thread itself stays (same actor), ready for a new conversation.
  REQUIRE(rt.count_threads() == 1u);
  REQUIRE(rt.add_turn("c", make_user_turn("again")) == 1u);
}

// -- D6 windows ---------------------------------------------------------------

TEST_CASE("history window: never starts with an orphan assistant turn") {
  // u a u a u a, window 3 would start with the assistant at index 3.
  auto turns = turns_of({turn_role::user, turn_role::assistant,
                         turn_role::user, turn_role::assistant,
                         turn_role::user, turn_role::assistant});
  REQUIRE(history_window_start(turns, 3) == 4);
  REQUIRE(history_window_start(turns, 4) == 2);
  REQUIRE(history_window_start(turns, 2) == 4);
  REQUIRE(history_window_start(turns, 6) == 0);
  REQUIRE(history_window_start(turns, 100) == 0);
  // Through the thread actor.
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  for (auto& t : turns)
    rt.add_turn("orphans", t);
  auto w = rt.history("orphans", 3);
  REQUIRE(w);
  REQUIRE(w->size() == 2);
  REQUIRE(w->front().role == turn_role::user);
  REQUIRE(w->front().content == "t4");
}

TEST_CASE("history window: a tool result is never separated from its call") {
  // u, a(call), tool, tool, a, u, a(call), tool, a
  auto turns = turns_of({turn_role::user, turn_role::assistant,
                         turn_role::tool, turn_role::tool,
                         turn_role::assistant, turn_role::user,
                         turn_role::assistant, turn_role::tool,
                         turn_role::assistant});
  for (size_t max = 2; max <= turns.size(); ++max) {
    auto start = history_window_start(turns, max);
    INFO("max_turns = " << max << ", start = " << start);
    REQUIRE(turns.size() - start <= max);
    bool standalone_start_exists = false;
    for (auto i = turns.size() - max; i < turns.size(); ++i)
      if (turns[i].role == turn_role::user)
        standalone_start_exists = true;
    if (start > 0 && standalone_start_exists) {
      REQUIRE(turns[start].role != turn_role::tool);
      REQUIRE(turns[start].role != turn_role::assistant);
      // The longest such suffix: no earlier user turn within reach.
      for (auto i = turns.size() - max; i < start; ++i)
        REQUIRE(turns[i].role != turn_role::user);
    } else if (start > 0) {
      REQUIRE(start == turns.size() - max); // D6: the plain suffix
    }
  }
  // Window 4 starts at the user turn (index 5), keeping the call and its
  // result together.
  REQUIRE(history_window_start(turns, 4) == 5);
  (void) tool_call_turn;
}

TEST_CASE("history window: when every start is an orphan the plain suffix "
          "is returned") {
  auto turns = turns_of({turn_role::user, turn_role::assistant,
                         turn_role::tool, turn_role::assistant,
                         turn_role::tool, turn_role::assistant});
  REQUIRE(history_window_start(turns, 3) == 3);
  REQUIRE(history_window_start(turns, 2) == 4);
}

TEST_CASE("history window: a system turn is a valid start") {
  auto turns = turns_of({turn_role::user, turn_role::assistant,
                         turn_role::system, turn_role::assistant});
  REQUIRE(history_window_start(turns, 2) == 2);
}

TEST_CASE("history window: max_turns below 2 is invalid_argument and "
          "changes nothing") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  rt.add_turn("small", make_user_turn("q"));
  for (uint64_t bad : {0, 1}) {
    auto w = rt.history("small", bad);
    REQUIRE_FALSE(w);
    REQUIRE(classify(w.error()) == errc::invalid_argument);
    REQUIRE_THAT(describe(w.error()), Catch::Contains("max_turns"));
    // Also for a thread that does not exist (and it is not created).
    auto none = rt.history("nothing-here", bad);
    REQUIRE_FALSE(none);
    REQUIRE(classify(none.error()) == errc::invalid_argument);
  }
  REQUIRE(rt.count_threads() == 1u);
  REQUIRE(rt.snapshot("small")->turns.size() == 1);
}

TEST_CASE("history window: the thread's total and epoch come with it") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  for (int i = 0; i < 7; ++i)
    rt.add_turn("w", make_user_turn("m" + std::to_string(i)));
  auto w = rt.read_history("w", 2);
  REQUIRE(w);
  REQUIRE(w->turns.size() == 2);
  REQUIRE(w->total_turns == 7);
  REQUIRE(w->epoch == 0);
  REQUIRE(w->found);
  auto ref = rt.call<thread_ref>(rt.thread_registry(), timeout,
                                 caf::get_atom::value, std::string{"w"});
  REQUIRE(w->thread_actor_id == ref->handle.id());
}

// -- snapshots and validation -------------------------------------------------

TEST_CASE("threads store: a snapshot is the reader's own copy - changing it "
          "changes nothing stored") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  rt.add_turn("snap", make_user_turn("original"));
  auto snap = rt.snapshot("snap");
  REQUIRE(snap);
  snap->turns[0].content = "tampered";
  snap->turns.clear();
  auto again = rt.snapshot("snap");
  REQUIRE(again->turns.size() == 1);
  REQUIRE(again->turns[0].content == "original");
  REQUIRE(again->thread_id == "snap");
  REQUIRE(again->committed == 1);
  REQUIRE_FALSE(again->in_exchange);
}

TEST_CASE("threads store: hostile or malformed thread IDs are refused and "
          "nothing is created") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  using namespace std::string_literals;
  for (std::string bad : {""s, "../x"s, "."s, ".."s, "a/b"s, "with space"s,
                          std::string(129, 'a'), "nul\0x"s}) {
    INFO("thread_id = '" << bad << "'");
    auto added = rt.add_turn(bad, make_user_turn("x"));
    REQUIRE_FALSE(added);
    REQUIRE(classify(added.error()) == errc::invalid_id);
    REQUIRE_FALSE(rt.history(bad));
    REQUIRE_FALSE(rt.snapshot(bad));
  }
  auto fresh = rt.add_turn("new", make_user_turn("x"));
  REQUIRE_FALSE(fresh);
  REQUIRE(classify(fresh.error()) == errc::invalid_id);
  REQUIRE(rt.count_threads() == 0u);
}

TEST_CASE("threads store: invalid turns are refused naming the field, and "
          "create no thread") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  auto expect = [&](turn t, errc code, const std::string& field) {
    auto r = rt.add_turn("v", std::move(t));
    REQUIRE_FALSE(r);
    REQUIRE(classify(r.error()) == code);
    REQUIRE_THAT(describe(r.error()), Catch::Contains(field));
  };
  expect(make_user_turn(""), errc::invalid_argument, "content");
  expect(make_tool_turn("result", ""), errc::invalid_argument, "tool_call_id");
  turn u = make_user_turn("x");
  u.tool_call_id = "c1";
  expect(u, errc::invalid_argument, "tool_call_id");
  turn i = make_user_turn("x");
  i.interrupted = true;
  expect(i, errc::invalid_argument, "interrupted");
  expect(make_user_turn(std::string(max_turn_content + 1, 'x')),
         errc::too_large, "content");
  REQUIRE(rt.count_threads() == 0u);
  REQUIRE(rt.add_turn("v", make_tool_turn("42", "call-1")) == 1u);
  REQUIRE(rt.add_turn("v", make_assistant_turn("")) == 2u);
}

TEST_CASE("threads store: list and count see every thread") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  for (auto id : {"b", "a", "c:1", "d-2", "e.3"})
    rt.add_turn(id, make_user_turn("x"));
  REQUIRE(rt.count_threads() == 5u);
  REQUIRE(*rt.list_threads()
          == std::vector<std::string>{"a", "b", "c:1", "d-2", "e.3"});
}

// -- the critical invariant under concurrency ---------------------------------

TEST_CASE("threads store: under concurrent writers and readers no reader "
          "ever sees a thread's turn count go down, and every thread ends "
          "with exactly the turns written, in order") {
  for (size_t clients : {1, 2, 4, 8, 16}) {
    DYNAMIC_SECTION(clients << " writers + " << clients << " readers") {
      constexpr size_t conversations = 8;
      constexpr size_t per_writer = 240;
      test::test_store store;
      runtime rt{test::on_test_store(runtime_options{}, store)};
      auto id_of = [](size_t c) { return "conv-" + std::to_string(c); };
      std::atomic<size_t> writers_done{0};
      std::atomic<size_t> errors{0};
      std::atomic<size_t> decreases{0};
      std::atomic<size_t> reads{0};
      std::vector<std::thread> pool;
      for (size_t w = 0; w < clients; ++w)
        pool.emplace_back([&, w] {
          // The readers are reading before the first write: on a loaded
          // machine a late reader would otherwise see only the end.
          while (reads.load() < clients)
            std::this_thread::yield();
          for (size_t i = 0; i < per_writer; ++i) {
            auto c = (i + w) % conversations;
            auto content = "w" + std::to_string(w) + ":" + std::to_string(i);
            auto t = i % 2 == 0 ? make_user_turn(content)
                                : make_assistant_turn(content);
            if (!rt.add_turn(id_of(c), std::move(t)))
              ++errors;
          }
          ++writers_done;
        });
      for (size_t r = 0; r < clients; ++r)
        pool.emplace_back([&, r] {
          std::mt19937 gen{static_cast<unsigned>(r)};
          std::vector<uint64_t> seen(conversations, 0);
          auto check = [&](size_t c, uint64_t count, uint64_t epoch) {
            if (epoch != 0 || count < seen[c])
              ++decreases;
            seen[c] = std::max(seen[c], count);
            ++reads;
          };
          while (writers_done < clients) {
            auto c = gen() % conversations;
            if (gen() % 2 == 0) {
              auto w = rt.read_history(id_of(c), 2);
              if (!w) {
                ++errors;
                continue;
              }
              check(c, w->total_turns, w->epoch);
            } else {
              auto s = rt.snapshot(id_of(c));
              if (!s) // not created yet: only allowed while count is 0
                continue;
              check(c, s->turns.size(), s->epoch);
            }
          }
        });
      for (auto& t : pool)
        t.join();
      REQUIRE(errors == 0);
      REQUIRE(decreases == 0);
      REQUIRE(reads > 0);
      size_t total = 0;
      for (size_t c = 0; c < conversations; ++c) {
        auto snap = rt.snapshot(id_of(c));
        REQUIRE(snap);
        total += snap->turns.size();
        // Each writer's turns appear in the order it wrote them.
        std::map<size_t, long> last;
        for (auto& t : snap->turns) {
          auto colon = t.content.find(':');
          auto w = std::stoul(t.content.substr(1, colon - 1));
          long i = std::stol(t.content.substr(colon + 1));
          auto it = last.find(w);
          REQUIRE((it == last.end() || it->second < i));
          last[w] = i;
        }
      }
      REQUIRE(total == clients * per_writer);
      // And exactly the turns written: every (writer, index) once.
      std::set<std::string> all;
      for (size_t c = 0; c < conversations; ++c) {
        auto snap = rt.snapshot(id_of(c));
        for (auto& t : snap->turns)
          all.insert(t.content);
      }
      REQUIRE(all.size() == clients * per_writer);
    }
  }
}

TEST_CASE("threads store: concurrent get_or_create of one new ID creates one "
          "thread that receives every turn") {
  for (size_t clients : {2, 4, 8, 16}) {
    DYNAMIC_SECTION(clients << " clients") {
      test::test_store store;
      runtime rt{test::on_test_store(runtime_options{}, store)};
      std::vector<std::thread> pool;
      std::atomic<size_t> errors{0};
      for (size_t c = 0; c < clients; ++c)
        pool.emplace_back([&] {
          for (int i = 0; i < 50; ++i)
            if (!rt.add_turn("fresh", make_user_turn("x")))
              ++errors;
        });
      for (auto& t : pool)
        t.join();
      REQUIRE(errors == 0);
      REQUIRE(rt.count_threads() == 1u);
      REQUIRE(rt.snapshot("fresh")->turns.size() == clients * 50);
    }
  }
}

TEST_CASE("facade: a blocking call waits at most its timeout, then reports "
          "a timeout and the runtime goes on answering") {
  runtime_options opts;
  opts.conversation.memory = false;
  opts.conversation.queue_timeout = std::chrono::milliseconds{300};
  test::test_store store;
  runtime rt{test::on_test_store(opts, store)};
  REQUIRE(rt.add_turn("held", make_user_turn("first")));
  // Hold the thread with an exchange lease: the next add_turn queues (D9).
  caf::scoped_actor self{rt.system()};
  thread_actor handle;
  self->request(rt.thread_registry(), std::chrono::seconds(5),
                caf::get_atom::value, std::string{"held"})
    .receive([&](thread_ref& ref) { handle = ref.handle; },
             [](caf::error&) {});
  REQUIRE(handle);
  uint64_t lease = 0;
  self->request(handle, std::chrono::seconds(5), exchange_begin_atom::value,
                conflict_policy::queue)
    .receive([&](uint64_t l) { lease = l; }, [](caf::error&) {});
  REQUIRE(lease != 0);
  auto start = std::chrono::steady_clock::now();
  auto queued = rt.add_turn("held", make_user_turn("second"));
  auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(queued);
  CHECK(classify(queued.error()) == errc::timeout);
  CHECK(waited >= std::chrono::milliseconds{300});
  CHECK(waited < std::chrono::seconds{3});
  // Other threads are served meanwhile, and the held one after release.
  CHECK(rt.add_turn("free", make_user_turn("x")) == uint64_t{1});
  self->request(handle, std::chrono::seconds(5), exchange_end_atom::value,
                lease)
    .receive([](uint64_t) {}, [](caf::error&) {});
  auto h = rt.history("held", 10);
  REQUIRE(h);
  CHECK(h->front().content == "first");
}
