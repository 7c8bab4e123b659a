// The per-thread context managers and their directory, through the runtime
// facade: the seed's window examples, concurrent writers, token budgets,
// explicit IDs (D4), eviction reports (D5) and the errors a caller can
// cause.

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using json = nlohmann::json;

namespace {

context_add_result add(runtime& rt, const std::string& thread,
                       std::string content = "x",
                       context_type type = context_type::code,
                       json metadata = nullptr) {
  auto result = rt.add_context(thread, type, std::move(content),
                               std::move(metadata));
  INFO((result ? "" : describe(result.error())));
  REQUIRE(result);
  return *result;
}

std::vector<std::string> ids_of(const std::vector<context_item>& items) {
  std::vector<std::string> out;
  for (auto& x : items)
    out.push_back(x.id());
  return out;
}

std::vector<context_item> items(runtime& rt, const std::string& thread,
                                uint64_t limit = runtime::all_items) {
  auto result = rt.context_items(thread, limit);
  REQUIRE(result);
  return *result;
}

context_stats stats(runtime& rt, const std::string& thread) {
  auto result = rt.get_context_stats(thread);
  REQUIRE(result);
  return *result;
}

context_directory_stats directory_stats(runtime& rt) {
  auto result = rt.call<context_directory_stats>(rt.context_directory(),
                                                 std::chrono::seconds(5),
                                                 ctx_stats_atom::value);
  REQUIRE(result);
  return *result;
}

context_item explicit_item(const std::string& id, std::string content = "r") {
  auto made = context_item::make(id, context_type::text, std::move(content),
                                 nullptr, 3900000000);
  REQUIRE(made);
  return *made;
}

} // namespace

TEST_CASE("context manager: 50 items evict nothing, the 51st evicts the "
          "first") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  std::vector<std::string> added;
  for (int i = 1; i <= 50; ++i) {
    auto result = add(rt, "t1", "item " + std::to_string(i));
    CHECK(result.evicted.empty());
    added.push_back(result.item.id());
  }
  CHECK(ids_of(items(rt, "t1")) == added);
  auto last = add(rt, "t1", "item 51");
  CHECK(last.evicted == std::vector<std::string>{added.front()});
  auto now = items(rt, "t1");
  REQUIRE(now.size() == 50);
  CHECK(now.front().id() == added[1]);
  CHECK(now.back().id() == last.item.id());
  CHECK(now.back().content() == "item 51");
  auto st = stats(rt, "t1");
  CHECK(st.capacity == 50);
  CHECK(st.size == 50);
  CHECK(st.added == 51);
  CHECK(st.evicted == 1);
}

TEST_CASE("context manager: capacity 100 holds 100") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  auto configured = rt.configure_context("big", {100, 0});
  REQUIRE(configured);
  CHECK(configured->ids.empty());
  for (int i = 0; i < 100; ++i)
    CHECK(add(rt, "big").evicted.empty());
  CHECK(items(rt, "big").size() == 100);
  CHECK(add(rt, "big").evicted.size() == 1);
  CHECK(items(rt, "big").size() == 100);
}

TEST_CASE("context manager: the default capacity comes from the runtime "
          "options, capacity 0 or negative is refused everywhere") {
  runtime_options opts;
  opts.context.window.capacity = 3;
  test::test_store store;
  runtime rt{test::on_test_store(opts, store)};
  for (int i = 0; i < 3; ++i)
    CHECK(add(rt, "small").evicted.empty());
  CHECK(add(rt, "small").evicted.size() == 1);
  for (int64_t capacity : {0, -1}) {
    auto refused = rt.configure_context("small", {capacity, 0});
    REQUIRE_FALSE(refused);
    CHECK(classify(refused.error()) == errc::invalid_argument);
    CHECK_THAT(describe(refused.error()),
               Catch::Contains("capacity must be at least 1"));
    auto direct = rt.call<context_manager_actor>(
      rt.context_directory(), std::chrono::seconds(5), ctx_open_atom::value,
      std::string{"fresh"}, window_options{capacity, 0});
    REQUIRE_FALSE(direct);
    CHECK(classify(direct.error()) == errc::invalid_argument);
    auto manager = rt.context_manager_of("small", false);
    REQUIRE(manager);
    auto put = rt.call<context_evicted>(*manager, std::chrono::seconds(5),
                                        caf::put_atom::value,
                                        window_options{capacity, 0});
    REQUIRE_FALSE(put);
    CHECK(classify(put.error()) == errc::invalid_argument);
  }
  CHECK(stats(rt, "small").capacity == 3);
  CHECK(items(rt, "small").size() == 3);
  CHECK_FALSE(rt.context_manager_of("fresh", false));
  for (int64_t capacity : {0, -5}) {
    runtime_options bad;
    bad.context.window.capacity = capacity;
    auto started = runtime::start(bad);
    REQUIRE_FALSE(started);
    CHECK(classify(started.error()) == errc::invalid_argument);
  }
}

TEST_CASE("context manager: concurrent writers never overfill the window, "
          "IDs increase oldest to newest, every eviction is reported once") {
  for (size_t writers : {1, 2, 4, 8}) {
    DYNAMIC_SECTION(writers << " writers") {
      constexpr int64_t capacity = 40;
      constexpr size_t per_writer = 250;
      test::test_store store;
      runtime rt{test::on_test_store(runtime_options{}, store)};
      REQUIRE(rt.configure_context("shared", {capacity, 0}));
      std::vector<std::vector<context_add_result>> results(writers);
      std::atomic<bool> done{false};
      std::atomic<size_t> failures{0};
      std::vector<std::string> reader_problems;
      std::thread reader([&] {
        // Every snapshot taken while the writers run obeys the invariants.
        while (!done) {
          auto snapshot = rt.context_items("shared");
          if (!snapshot) {
            reader_problems.push_back(describe(snapshot.error()));
            return;
          }
          if (snapshot->size() > static_cast<size_t>(capacity))
            reader_problems.push_back("window above capacity");
          for (size_t i = 1; i < snapshot->size(); ++i)
            if ((*snapshot)[i - 1].sequence() >= (*snapshot)[i].sequence())
              reader_problems.push_back("IDs not increasing");
        }
      });
      std::vector<std::thread> threads;
      for (size_t w = 0; w < writers; ++w)
        threads.emplace_back([&, w] {
          for (size_t i = 0; i < per_writer; ++i) {
            auto result = rt.add_context("shared", context_type::text,
                                         "w" + std::to_string(w) + " #"
                                           + std::to_string(i));
            if (!result) {
              ++failures;
              continue;
            }
            results[w].push_back(std::move(*result));
          }
        });
      for (auto& t : threads)
        t.join();
      done = true;
      reader.join();
      REQUIRE(failures == 0);
      CHECK(reader_problems.empty());
      std::set<std::string> added;
      std::vector<std::string> evicted;
      for (auto& per : results) {
        uint64_t previous = 0;
        for (auto& r : per) {
          REQUIRE(r.item.sequence() > previous); // each writer's IDs increase
          previous = r.item.sequence();
          REQUIRE(added.insert(r.item.id()).second);
          evicted.insert(evicted.end(), r.evicted.begin(), r.evicted.end());
        }
      }
      REQUIRE(added.size() == writers * per_writer);
      auto window = items(rt, "shared");
      REQUIRE(window.size()
              == std::min<size_t>(capacity, writers * per_writer));
      for (size_t i = 1; i < window.size(); ++i)
        REQUIRE(window[i - 1].sequence() < window[i].sequence());
      // evicted + window == added, and no ID twice.
      std::multiset<std::string> seen(evicted.begin(), evicted.end());
      for (auto& x : window)
        seen.insert(x.id());
      REQUIRE(seen.size() == added.size());
      REQUIRE(std::set<std::string>(seen.begin(), seen.end()) == added);
      auto st = stats(rt, "shared");
      CHECK(st.evicted == evicted.size());
      CHECK(st.added == added.size());
      CHECK(directory_stats(rt).live_ids == window.size());
    }
  }
}

TEST_CASE("context manager: concurrent writers on separate threads keep "
          "separate windows with runtime-unique IDs") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  constexpr size_t writers = 8, per_writer = 60;
  std::vector<std::vector<std::string>> ids(writers);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < writers; ++w)
    threads.emplace_back([&, w] {
      auto thread = "thread-" + std::to_string(w);
      for (size_t i = 0; i < per_writer; ++i) {
        auto result = rt.add_context(thread, context_type::code, "x");
        if (result)
          ids[w].push_back(result->item.id());
      }
    });
  for (auto& t : threads)
    t.join();
  std::set<std::string> all;
  for (size_t w = 0; w < writers; ++w) {
    REQUIRE(ids[w].size() == per_writer);
    all.insert(ids[w].begin(), ids[w].end());
    auto window = items(rt, "thread-" + std::to_string(w));
    REQUIRE(window.size() == 50);
    CHECK(window.back().id() == ids[w].back());
  }
  CHECK(all.size() == writers * per_writer);
  auto dir = directory_stats(rt);
  CHECK(dir.managers == writers);
  CHECK(dir.live_ids == writers * 50);
}

TEST_CASE("context manager: the token budget evicts oldest first, an "
          "oversize item is refused and the window is unchanged") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  REQUIRE(rt.configure_context("tok", {50, 10}));
  auto a = add(rt, "tok", std::string(16, 'a')); // 4 tokens
  auto b = add(rt, "tok", std::string(16, 'b')); // 8
  CHECK(b.evicted.empty());
  auto c = add(rt, "tok", std::string(12, 'c')); // 11 > 10: evicts a
  CHECK(c.evicted == std::vector<std::string>{a.item.id()});
  auto before = items(rt, "tok");
  auto before_stats = stats(rt, "tok");
  CHECK(before_stats.tokens == 7);
  auto refused = rt.add_context("tok", context_type::text,
                                std::string(41, 'x')); // 11 tokens
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == errc::capacity_exceeded);
  CHECK_THAT(describe(refused.error()),
             Catch::Contains("more than the whole token_budget of 10"));
  CHECK(items(rt, "tok") == before);
  auto after_stats = stats(rt, "tok");
  CHECK(after_stats.tokens == before_stats.tokens);
  CHECK(after_stats.added == before_stats.added);
  CHECK(after_stats.evicted == before_stats.evicted);
  // Restores obey the budget too.
  auto restore = rt.restore_context("tok", explicit_item("ctx-900000",
                                                         std::string(44, 'y')));
  REQUIRE_FALSE(restore);
  CHECK(classify(restore.error()) == errc::capacity_exceeded);
  CHECK(items(rt, "tok") == before);
  // A lower budget evicts until the window fits.
  auto shrunk = rt.configure_context("tok", {50, 3});
  REQUIRE(shrunk);
  CHECK(shrunk->ids == std::vector<std::string>{b.item.id()});
  CHECK(ids_of(items(rt, "tok")) == std::vector<std::string>{c.item.id()});
}

TEST_CASE("context manager: items(limit) gives the newest, oldest first, and "
          "get, remove and clear work by ID") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i)
    ids.push_back(add(rt, "ops", "n" + std::to_string(i)).item.id());
  CHECK(ids_of(items(rt, "ops", 2)) == std::vector<std::string>{ids[4], ids[5]});
  CHECK(items(rt, "ops", 0).empty());
  CHECK(items(rt, "ops", 100).size() == 6);
  auto got = rt.get_context_item("ops", ids[2]);
  REQUIRE(got);
  CHECK(got->content() == "n2");
  auto removed = rt.remove_context_item("ops", ids[2]);
  REQUIRE(removed);
  CHECK(removed->id() == ids[2]);
  for (auto* what : {"get", "remove"}) {
    auto again = std::string{what} == "get"
                   ? rt.get_context_item("ops", ids[2])
                   : rt.remove_context_item("ops", ids[2]);
    REQUIRE_FALSE(again);
    CHECK(classify(again.error()) == errc::not_found);
    CHECK_THAT(describe(again.error()), Catch::Contains(ids[2]));
  }
  auto bogus = rt.get_context_item("ops", "../etc/passwd");
  REQUIRE_FALSE(bogus);
  CHECK(classify(bogus.error()) == errc::not_found);
  CHECK(items(rt, "ops").size() == 5);
  auto cleared = rt.clear_context("ops");
  REQUIRE(cleared);
  CHECK(*cleared == 5);
  CHECK(items(rt, "ops").empty());
  auto st = stats(rt, "ops");
  CHECK(st.added == 6);
  CHECK(st.removed == 1);
  CHECK(st.cleared == 5);
  CHECK(st.evicted == 0);
  CHECK(directory_stats(rt).live_ids == 0);
}

TEST_CASE("context manager: render gives the window as markdown, oldest "
          "first") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  add(rt, "md", "Remember: the cache is per thread.", context_type::text);
  add(rt, "md", "CL-USER> (+ 1 2)\n3", context_type::repl_history,
      {{"package", "agent-q"}});
  add(rt, "md", "The function FOO is undefined.", context_type::error,
      {{"filename", "src/agent.lisp"}, {"start_line", 42}});
  add(rt, "md", "", context_type::custom);
  add(rt, "md", "int main() { return 0; }", context_type::code,
      {{"filename", "src/main.cpp"}, {"start_line", 3}, {"end_line", 3}});
  auto text = rt.render_context("md");
  REQUIRE(text);
  CHECK(*text == render_markdown(items(rt, "md")));
  CHECK(text->rfind("### Text\n", 0) == 0);
  auto last = rt.render_context("md", 1);
  REQUIRE(last);
  CHECK(*last == "### Code\n#### src/main.cpp:3-3\n```cpp\n"
                 "int main() { return 0; }\n```\n");
}

TEST_CASE("context manager: an explicit ID advances the counter past it "
          "(D4)") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  auto first = add(rt, "a");
  CHECK(first.item.id() == "ctx-1");
  auto restored = rt.restore_context("a", explicit_item("ctx-1000"));
  REQUIRE(restored);
  CHECK(restored->item.id() == "ctx-1000");
  CHECK(restored->item.timestamp() == 3900000000);
  auto next = add(rt, "a");
  CHECK(next.item.sequence() > 1000);
  auto id = rt.next_context_id();
  REQUIRE(id);
  CHECK(*parse_context_id(*id) > next.item.sequence());
  // A restore below the counter does not move it back.
  REQUIRE(rt.restore_context("b", explicit_item("ctx-500")));
  CHECK(add(rt, "b").item.sequence() > *parse_context_id(*id));
}

TEST_CASE("context manager: a duplicate explicit ID is refused in any "
          "window, a removed or evicted ID may come back (D4)") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  auto live = add(rt, "one");
  REQUIRE(rt.restore_context("one", explicit_item("ctx-77")));
  for (auto* thread : {"one", "two"}) {
    for (auto& id : {live.item.id(), std::string{"ctx-77"}}) {
      INFO(thread << " " << id);
      auto dup = rt.restore_context(thread, explicit_item(id));
      REQUIRE_FALSE(dup);
      CHECK(classify(dup.error()) == errc::already_exists);
      CHECK_THAT(describe(dup.error()), Catch::Contains(id));
    }
  }
  CHECK(items(rt, "one").size() == 2);
  CHECK(items(rt, "two").empty());
  REQUIRE(rt.remove_context_item("one", "ctx-77"));
  auto back = rt.restore_context("two", explicit_item("ctx-77"));
  REQUIRE(back);
  CHECK(back->item.id() == "ctx-77");
  // Evicted IDs leave the index as well.
  REQUIRE(rt.configure_context("one", {1, 0}));
  CHECK(ids_of(items(rt, "one")) == std::vector<std::string>{live.item.id()});
  auto evicting = add(rt, "one");
  CHECK(evicting.evicted == std::vector<std::string>{live.item.id()});
  CHECK(rt.restore_context("two", explicit_item(live.item.id())));
}

TEST_CASE("context manager: racing restores of one explicit ID: exactly one "
          "wins") {
  for (size_t racers : {2, 4, 8}) {
    DYNAMIC_SECTION(racers << " racers") {
      test::test_store store;
      runtime rt{test::on_test_store(runtime_options{}, store)};
      for (int round = 0; round < 10; ++round) {
        auto id = "ctx-" + std::to_string(5000 + round);
        std::atomic<int> won{0}, refused{0}, other{0};
        std::vector<std::thread> threads;
        for (size_t r = 0; r < racers; ++r)
          threads.emplace_back([&, r] {
            auto result = rt.restore_context("race-" + std::to_string(r),
                                             explicit_item(id));
            if (result)
              ++won;
            else if (classify(result.error()) == errc::already_exists)
              ++refused;
            else
              ++other;
          });
        for (auto& t : threads)
          t.join();
        REQUIRE(won == 1);
        REQUIRE(refused == static_cast<int>(racers) - 1);
        REQUIRE(other == 0);
      }
      // Allocations racing restores never duplicate a live ID either.
      std::set<std::string> live;
      for (size_t r = 0; r < racers; ++r)
        for (auto& x : items(rt, "race-" + std::to_string(r)))
          REQUIRE(live.insert(x.id()).second);
      CHECK(live.size() == 10);
    }
  }
}

TEST_CASE("context manager: restores racing allocations never produce a "
          "duplicate live ID") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  REQUIRE(rt.configure_context("alloc", {1000, 0}));
  REQUIRE(rt.configure_context("restore", {1000, 0}));
  std::atomic<bool> stop{false};
  std::atomic<size_t> failed{0};
  std::thread allocator([&] {
    while (!stop)
      if (!rt.add_context("alloc", context_type::text, "a"))
        ++failed;
  });
  // Restore IDs just ahead of the counter, so allocations reach them.
  size_t restored = 0, refused = 0;
  for (int i = 0; i < 200; ++i) {
    auto next = rt.call<uint64_t>(rt.id_allocator(), std::chrono::seconds(5),
                                  peek_atom::value, std::string{"ctx"});
    REQUIRE(next);
    auto result = rt.restore_context(
      "restore", explicit_item("ctx-" + std::to_string(*next + 1)));
    if (result)
      ++restored;
    else if (classify(result.error()) == errc::already_exists)
      ++refused;
    else
      FAIL(describe(result.error()));
  }
  stop = true;
  allocator.join();
  CHECK(failed == 0);
  CHECK(restored + refused == 200);
  std::set<std::string> live;
  for (auto* thread : {"alloc", "restore"})
    for (auto& x : items(rt, thread))
      REQUIRE(live.insert(x.id()).second);
  CHECK(live.size() == items(rt, "alloc").size() + restored);
}

TEST_CASE("context manager: bad input is refused with the field named and "
          "nothing changes") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  add(rt, "in");
  auto before = items(rt, "in");
  auto bad_meta = rt.add_context("in", context_type::code, "x",
                                 {{"start_line", 0}});
  REQUIRE_FALSE(bad_meta);
  CHECK(classify(bad_meta.error()) == errc::invalid_argument);
  CHECK_THAT(describe(bad_meta.error()), Catch::Contains("metadata.start_line"));
  auto not_object = rt.add_context("in", context_type::code, "x", json{1, 2});
  REQUIRE_FALSE(not_object);
  CHECK(classify(not_object.error()) == errc::malformed);
  auto bad_utf8 = rt.add_context("in", context_type::code, "\xC0\xAF");
  REQUIRE_FALSE(bad_utf8);
  CHECK(classify(bad_utf8.error()) == errc::malformed);
  // A hand-built draft or item is checked by the manager itself.
  auto manager = rt.context_manager_of("in", false);
  REQUIRE(manager);
  auto draft = rt.call<context_add_result>(
    *manager, std::chrono::seconds(5), caf::add_atom::value,
    context_draft{context_type::code, "x", "{\"end_line\": \"3\"}"});
  REQUIRE_FALSE(draft);
  CHECK(classify(draft.error()) == errc::malformed);
  auto broken = rt.call<context_add_result>(
    *manager, std::chrono::seconds(5), caf::add_atom::value,
    context_draft{context_type::code, "x", "{not json"});
  REQUIRE_FALSE(broken);
  CHECK(classify(broken.error()) == errc::malformed);
  auto empty = rt.restore_context("in", context_item{});
  REQUIRE_FALSE(empty);
  CHECK(classify(empty.error()) == errc::invalid_id);
  CHECK(items(rt, "in") == before);
}

TEST_CASE("context directory: thread IDs are validated and reads never create "
          "a window") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  for (const std::string& bad :
       std::vector<std::string>{"", "..", ".", "../x", "a/b", "sp ace",
                                std::string(129, 'a')}) {
    INFO("'" << bad << "'");
    auto added = rt.add_context(bad, context_type::code, "x");
    REQUIRE_FALSE(added);
    CHECK(classify(added.error()) == errc::invalid_id);
    auto read = rt.context_items(bad);
    REQUIRE_FALSE(read);
    CHECK(classify(read.error()) == errc::invalid_id);
  }
  // Reads of a thread without a window answer as for an empty one.
  CHECK(items(rt, "ghost").empty());
  auto text = rt.render_context("ghost");
  REQUIRE(text);
  CHECK(text->empty());
  auto st = stats(rt, "ghost");
  CHECK(st.size == 0);
  CHECK(st.capacity == 50);
  auto cleared = rt.clear_context("ghost");
  REQUIRE(cleared);
  CHECK(*cleared == 0);
  auto got = rt.get_context_item("ghost", "ctx-1");
  REQUIRE_FALSE(got);
  CHECK(classify(got.error()) == errc::not_found);
  auto manager = rt.context_manager_of("ghost", false);
  REQUIRE_FALSE(manager);
  CHECK(classify(manager.error()) == errc::not_found);
  CHECK(directory_stats(rt).managers == 0);
  // get_or_create creates once; get then finds the same manager.
  auto created = rt.context_manager_of("ghost", true);
  REQUIRE(created);
  auto found = rt.context_manager_of("ghost", false);
  REQUIRE(found);
  CHECK(*found == *created);
  auto again = rt.context_manager_of("ghost", true);
  REQUIRE(again);
  CHECK(*again == *created);
  CHECK(directory_stats(rt).managers == 1);
}

TEST_CASE("context manager: asynchronous calls deliver once with the same "
          "results as blocking ones") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  auto draft = make_context_draft(context_type::code, "(+ 1 2)",
                                  {{"filename", "a.lisp"}});
  REQUIRE(draft);
  std::promise<caf::expected<context_add_result>> added;
  rt.add_context_async("async", *draft, [&](auto result) {
    added.set_value(std::move(result));
  });
  auto result = added.get_future().get();
  REQUIRE(result);
  std::promise<caf::expected<std::vector<context_item>>> listed;
  rt.context_items_async("async", runtime::all_items, [&](auto r) {
    listed.set_value(std::move(r));
  });
  auto list = listed.get_future().get();
  REQUIRE(list);
  REQUIRE(list->size() == 1);
  CHECK(list->front() == result->item);
  std::promise<caf::expected<std::string>> rendered;
  rt.render_context_async("async", 1, [&](auto r) {
    rendered.set_value(std::move(r));
  });
  auto text = rendered.get_future().get();
  REQUIRE(text);
  CHECK(*text == render_markdown(result->item));
  std::promise<caf::expected<context_item>> got;
  rt.get_context_item_async("async", result->item.id(), [&](auto r) {
    got.set_value(std::move(r));
  });
  auto fetched = got.get_future().get();
  REQUIRE(fetched);
  CHECK(*fetched == result->item);
  std::promise<caf::expected<context_item>> missing;
  rt.get_context_item_async("nobody", "ctx-1", [&](auto r) {
    missing.set_value(std::move(r));
  });
  auto m = missing.get_future().get();
  REQUIRE_FALSE(m);
  CHECK(classify(m.error()) == errc::not_found);
  std::promise<caf::expected<context_item>> removed;
  rt.remove_context_item_async("async", result->item.id(), [&](auto r) {
    removed.set_value(std::move(r));
  });
  CHECK(removed.get_future().get());
  std::promise<caf::expected<uint64_t>> cleared;
  rt.clear_context_async("async", [&](auto r) {
    cleared.set_value(std::move(r));
  });
  auto count = cleared.get_future().get();
  REQUIRE(count);
  CHECK(*count == 0);
}

TEST_CASE("context manager: evictions are logged") {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  auto logger = spdlog::default_logger();
  auto old_level = logger->level();
  logger->sinks().push_back(sink);
  logger->set_level(spdlog::level::debug);
  {
    test::test_store store;
    runtime rt{test::on_test_store(runtime_options{}, store)};
    REQUIRE(rt.configure_context("logged", {2, 0}));
    auto a = add(rt, "logged");
    add(rt, "logged");
    auto c = add(rt, "logged");
    REQUIRE(c.evicted == std::vector<std::string>{a.item.id()});
    auto lines = sink->last_formatted();
    auto hit = std::find_if(lines.begin(), lines.end(), [&](auto& line) {
      return line.find("context 'logged': evicted " + a.item.id())
             != std::string::npos;
    });
    CHECK(hit != lines.end());
  }
  logger->set_level(old_level);
  logger->sinks().pop_back();
}

TEST_CASE("context manager: after stop, calls fail with unavailable") {
  test::test_store store;
  runtime rt{test::on_test_store(runtime_options{}, store)};
  add(rt, "s");
  rt.stop();
  auto after = rt.add_context("s", context_type::code, "x");
  REQUIRE_FALSE(after);
  CHECK(classify(after.error()) == errc::unavailable);
  auto read = rt.context_items("s");
  REQUIRE_FALSE(read);
  CHECK(classify(read.error()) == errc::unavailable);
}
