// Threads as resources: metadata, details, a walk over every thread that
// lists each exactly once while others write, and deletion, in memory and
// on a store (runtime level); the HTTP routes' answers and refusals.

#include <atomic>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

runtime_options durable(const test::test_store& dir) {
  runtime_options opts;
  dir.apply(opts.storage);
  opts.storage.sync = sync_mode::normal;
  // Threads go in and out of memory while they are written and listed.
  activation_options a;
  a.max_resident = 64;
  opts.conversation.registry.activation = a;
  opts.context.activation = a;
  opts.conversation.memory = true;
  return opts;
}

std::vector<std::string> ids_of(const thread_page& page) {
  std::vector<std::string> out;
  for (auto& t : page.threads)
    out.push_back(t.thread_id);
  return out;
}

// Walks every page; returns the IDs in listing order.
std::vector<std::string> walk(runtime& rt, thread_list_request lr,
                              std::function<void()> between = nullptr) {
  std::vector<std::string> out;
  for (;;) {
    auto page = rt.list_threads(lr);
    REQUIRE(page);
    for (auto& t : page->threads)
      out.push_back(t.thread_id);
    if (!page->more)
      return out;
    REQUIRE(!page->threads.empty());
    lr.snapshot = page->snapshot;
    lr.after_version = page->last_version;
    lr.after_id = page->threads.back().thread_id;
    if (between)
      between();
  }
}

// 16 writers append turns, change metadata and create threads while a walk
// (and a filtered walk) runs: every thread that existed before is listed
// exactly once, no thread twice, filters exact.
void walk_under_writers(runtime& rt) {
  constexpr int initial = 300;
  std::vector<std::string> ids;
  std::map<std::string, std::string> team;
  for (int i = 0; i < initial; ++i) {
    auto t = std::to_string(i % 4);
    auto made = rt.create_thread({{"team", t}});
    REQUIRE(made);
    ids.push_back(made->thread_id);
    team[made->thread_id] = t;
    if (i % 2 == 0)
      REQUIRE(rt.add_turn(made->thread_id, make_user_turn("hello")));
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 16; ++w)
    writers.emplace_back([&, w] {
      std::mt19937 rng{static_cast<unsigned>(w)};
      for (uint64_t n = 0; !stop; ++n) {
        auto& id = ids[rng() % ids.size()];
        bool ok = true;
        if (n % 10 == 3)
          ok = static_cast<bool>(rt.update_thread_metadata(
            id, {{{"n", std::to_string(n)}}, {}}));
        else if (n % 25 == 7)
          ok = static_cast<bool>(rt.create_thread({{"team", "2"}}));
        else
          ok = static_cast<bool>(rt.add_turn(id, make_user_turn("more")));
        if (!ok)
          ++failures;
        ++writes;
      }
    });
  auto pause = [] { std::this_thread::sleep_for(2ms); };
  while (writes < 200)
    std::this_thread::sleep_for(1ms);
  auto before = writes.load();
  thread_list_request all;
  all.limit = 7;
  auto listed = walk(rt, all, pause);
  thread_list_request twos;
  twos.limit = 5;
  twos.filters = {{"team", "2"}};
  auto listed_twos = walk(rt, twos, pause);
  auto during = writes.load() - before;
  stop = true;
  for (auto& t : writers)
    t.join();
  CHECK(failures == 0);
  // The walks overlapped the writes.
  CHECK(during >= 100);
  std::map<std::string, int> seen;
  for (auto& id : listed)
    ++seen[id];
  for (auto& [id, n] : seen)
    CHECK(n == 1);
  for (auto& id : ids)
    CHECK(seen[id] == 1);
  std::map<std::string, int> seen_twos;
  for (auto& id : listed_twos)
    ++seen_twos[id];
  for (auto& [id, n] : seen_twos) {
    CHECK(n == 1);
    auto info = rt.thread_details(id);
    REQUIRE(info);
    CHECK(info->metadata.at("team") == "2");
  }
  for (auto& id : ids)
    if (team[id] == "2")
      CHECK(seen_twos[id] == 1);
}

} // namespace

TEST_CASE("thread resources: a walk lists every thread exactly once while "
          "16 writers change them - in memory") {
  runtime rt;
  walk_under_writers(rt);
}

TEST_CASE("thread resources: a walk lists every thread exactly once while "
          "16 writers change them - on a store with threads passivated") {
  test::test_store dir;
  runtime rt{durable(dir)};
  walk_under_writers(rt);
}

TEST_CASE("thread resources: threads are listed newest change first with "
          "their turn counts and metadata - in memory and on a store") {
  test::test_store dir;
  for (bool stored : {false, true}) {
    INFO("stored " << stored);
    runtime rt{stored ? durable(dir) : runtime_options{}};
    auto a = rt.create_thread({{"name", "a"}});
    auto b = rt.create_thread({});
    auto c = rt.create_thread({{"name", "c"}});
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(c);
    CHECK(a->turns == 0);
    CHECK(a->metadata == thread_metadata{{"name", "a"}});
    CHECK(a->created_ms <= a->updated_ms());
    REQUIRE(rt.add_turn(a->thread_id, make_user_turn("q")));
    REQUIRE(rt.add_turn(a->thread_id, make_assistant_turn("r")));
    thread_list_request lr;
    auto page = rt.list_threads(lr);
    REQUIRE(page);
    CHECK(ids_of(*page)
          == std::vector<std::string>{a->thread_id, c->thread_id,
                                      b->thread_id});
    CHECK(page->threads[0].turns == 2);
    CHECK_FALSE(page->more);
    auto patched = rt.update_thread_metadata(
      b->thread_id, {{{"name", "b"}, {"tag", "x"}}, {}});
    REQUIRE(patched);
    CHECK(patched->metadata == thread_metadata{{"name", "b"}, {"tag", "x"}});
    CHECK(patched->updated_ms() >= a->updated_ms());
    // A merge: set one key, remove another, leave the rest.
    patched = rt.update_thread_metadata(b->thread_id,
                                        {{{"tag", "y"}}, {"name", "zz"}});
    REQUIRE(patched);
    CHECK(patched->metadata == thread_metadata{{"tag", "y"}});
    REQUIRE(rt.clear_thread(a->thread_id));
    page = rt.list_threads(lr);
    REQUIRE(page);
    CHECK(ids_of(*page)
          == std::vector<std::string>{a->thread_id, b->thread_id,
                                      c->thread_id});
    CHECK(page->threads[0].turns == 0);
    // Pages of one.
    lr.limit = 1;
    lr.filters = {{"name", "c"}};
    page = rt.list_threads(lr);
    REQUIRE(page);
    CHECK(ids_of(*page) == std::vector<std::string>{c->thread_id});
    CHECK_FALSE(page->more);
    // Too many keys: refused, nothing changed.
    thread_metadata_patch many;
    for (int i = 0; i < 17; ++i)
      many.set["k" + std::to_string(i)] = "v";
    auto refused = rt.update_thread_metadata(b->thread_id, many);
    REQUIRE_FALSE(refused);
    CHECK(classify(refused.error()) == errc::too_large);
    auto unchanged = rt.thread_details(b->thread_id);
    REQUIRE(unchanged);
    CHECK(unchanged->metadata == patched->metadata);
    CHECK(unchanged->version == patched->version);
    auto missing = rt.thread_details("no-such-thread");
    REQUIRE_FALSE(missing);
    CHECK(classify(missing.error()) == errc::not_found);
    // Clean up for the stored round's fresh view.
    for (auto& id : {a->thread_id, b->thread_id, c->thread_id})
      REQUIRE(rt.delete_thread(id));
  }
}

TEST_CASE("thread resources: metadata turn counts and a walk's cursor "
          "survive a restart") {
  test::test_store dir;
  std::vector<std::string> first;
  thread_list_request lr;
  lr.limit = 4;
  std::set<std::string> all;
  {
    runtime rt{durable(dir)};
    for (int i = 0; i < 10; ++i) {
      auto t = rt.create_thread({{"i", std::to_string(i)}});
      REQUIRE(t);
      all.insert(t->thread_id);
      for (int k = 0; k <= i % 3; ++k)
        REQUIRE(rt.add_turn(t->thread_id, make_user_turn("x")));
    }
    auto page = rt.list_threads(lr);
    REQUIRE(page);
    REQUIRE(page->more);
    first = ids_of(*page);
    lr.snapshot = page->snapshot;
    lr.after_version = page->last_version;
    lr.after_id = first.back();
    // Changed after the snapshot: a listed and an unlisted thread.
    REQUIRE(rt.add_turn(first.front(), make_user_turn("later")));
    auto unlisted = *std::find_if(all.begin(), all.end(), [&](auto& id) {
      return std::find(first.begin(), first.end(), id) == first.end();
    });
    REQUIRE(rt.update_thread_metadata(unlisted, {{{"late", "yes"}}, {}}));
  }
  runtime rt{durable(dir)};
  auto rest = walk(rt, lr);
  std::multiset<std::string> seen(first.begin(), first.end());
  seen.insert(rest.begin(), rest.end());
  CHECK(seen.size() == all.size());
  CHECK(std::set<std::string>(seen.begin(), seen.end()) == all);
  auto fresh = walk(rt, thread_list_request{});
  REQUIRE(fresh.size() == all.size());
  auto info = rt.thread_details(fresh.front());
  REQUIRE(info);
  CHECK((fresh.front() == first.front() || info->metadata.count("late") == 1));
  for (auto& id : all) {
    auto t = rt.thread_details(id);
    REQUIRE(t);
    auto i = std::stoi(t->metadata.at("i"));
    CHECK(t->turns == static_cast<uint64_t>(i % 3 + 1)
                        + (id == first.front() ? 1u : 0u));
  }
}

TEST_CASE("thread resources: deleting a thread removes its turns items "
          "window and anonymous memories for good and frees its ID") {
  test::test_store dir;
  {
    runtime rt{durable(dir)};
    auto sent = rt.send_message("doomed", "remember the blue door", "",
                                conflict_policy::queue, 12);
    REQUIRE(sent);
    REQUIRE(rt.send_message("kept", "remember the red door", "",
                            conflict_policy::queue, 12));
    REQUIRE(rt.add_context("doomed", context_type::text, "an item"));
    auto before = rt.list_memories(memory_list_request{"", "doomed", 10, 0});
    REQUIRE(before);
    REQUIRE(!before->entries.empty());
    auto gone = rt.delete_thread("doomed");
    REQUIRE(gone);
    CHECK(gone->turns == 2);
    CHECK(gone->context_items == 1);
    CHECK(gone->memories == before->entries.size());
    auto again = rt.delete_thread("doomed");
    REQUIRE_FALSE(again);
    CHECK(classify(again.error()) == errc::not_found);
  }
  runtime rt{durable(dir)};
  CHECK_FALSE(rt.thread_details("doomed"));
  auto h = rt.read_history("doomed");
  REQUIRE(h);
  CHECK_FALSE(h->found);
  auto items = rt.context_items("doomed");
  CHECK((!items || items->empty()));
  auto mem = rt.list_memories(memory_list_request{"", "doomed", 10, 0});
  REQUIRE(mem);
  CHECK(mem->entries.empty());
  auto kept = rt.thread_details("kept");
  REQUIRE(kept);
  CHECK(kept->turns == 2);
  auto listed = walk(rt, thread_list_request{});
  CHECK(listed == std::vector<std::string>{"kept"});
  // The ID is free: a message to it starts a new, empty thread.
  auto reborn = rt.send_message("doomed", "hello again", "",
                                conflict_policy::queue, 12);
  REQUIRE(reborn);
  CHECK(reborn->created);
  CHECK(reborn->history_turns == 0);
  CHECK(reborn->turns == 2);
}

TEST_CASE("thread resources: deleting a thread fails the writes queued "
          "behind its running exchange and later requests find no thread") {
  runtime rt;
  REQUIRE(rt.add_turn("busy", make_user_turn("q")));
  auto ref = rt.call<thread_ref>(rt.thread_registry(), 5s,
                                 caf::get_atom::value, std::string{"busy"});
  REQUIRE(ref);
  // This test holds the thread as an exchange would.
  caf::scoped_actor self{rt.system()};
  uint64_t lease = 0;
  self->request(ref->handle, 5s, exchange_begin_atom::value,
                conflict_policy::queue)
    .receive([&](uint64_t l) { lease = l; },
             [&](caf::error& err) { FAIL(caf::to_string(err)); });
  REQUIRE(lease != 0);
  std::atomic<int> queued_result{-1};
  std::thread queued{[&] {
    auto r = rt.add_turn("busy", make_user_turn("queued"));
    queued_result = r ? 1 : (classify(r.error()) == errc::not_found
                               ? 0
                               : 2);
  }};
  std::this_thread::sleep_for(100ms);
  auto deleted = std::async(std::launch::async,
                            [&] { return rt.delete_thread("busy"); });
  std::this_thread::sleep_for(100ms);
  CHECK(deleted.wait_for(0ms) == std::future_status::timeout);
  self->request(ref->handle, 5s, exchange_end_atom::value, lease)
    .receive([](uint64_t) {}, [&](caf::error& err) {
      FAIL(caf::to_string(err));
    });
  auto gone = deleted.get();
  REQUIRE(gone);
  CHECK(gone->turns == 1);
  queued.join();
  CHECK(queued_result == 0);
  CHECK_FALSE(rt.thread_details("busy"));
  auto h = rt.read_history("busy");
  REQUIRE(h);
  CHECK_FALSE(h->found);
}

// -- HTTP ------------------------------------------------------------------------

namespace {

json body_of(const httplib::Result& r) {
  REQUIRE(r);
  return r->body.empty() ? json{} : json::parse(r->body);
}

} // namespace

TEST_CASE("thread resources: the HTTP routes answer in their documented "
          "shapes and walk pages with next_cursor") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto made = cli.Post("/v1/threads", R"({"metadata":{"project":"apollo"}})",
                       "application/json");
  REQUIRE(made);
  CHECK(made->status == 201);
  auto t = body_of(made);
  CHECK(t["object"] == "thread");
  CHECK(t["metadata"] == json{{"project", "apollo"}});
  CHECK(t["turns"] == 0);
  auto id = t["thread_id"].get<std::string>();
  auto empty = cli.Post("/v1/threads", "", "application/json");
  REQUIRE(empty);
  CHECK(empty->status == 201);
  CHECK(body_of(empty)["metadata"] == json::object());
  auto sent = cli.Post("/v1/threads/" + id + "/messages",
                       R"({"content":"hi"})", "application/json");
  REQUIRE(sent);
  REQUIRE(sent->status == 200);
  auto got = body_of(cli.Get("/v1/threads/" + id));
  CHECK(got["turns"] == 2);
  CHECK(got["updated_at"].get<int64_t>() >= got["created_at"].get<int64_t>());
  auto patched = cli.Patch("/v1/threads/" + id,
                           R"({"metadata":{"project":null,"stage":"2"}})",
                           "application/json");
  REQUIRE(patched);
  CHECK(patched->status == 200);
  CHECK(body_of(patched)["metadata"] == json{{"stage", "2"}});
  for (int i = 0; i < 5; ++i)
    REQUIRE(cli.Post("/v1/threads", "", "application/json"));
  std::vector<std::string> walked;
  std::string path = "/v1/threads?limit=3";
  for (int pages = 0;; ++pages) {
    REQUIRE(pages < 10);
    auto page = body_of(cli.Get(path));
    CHECK(page["object"] == "list");
    for (auto& x : page["data"])
      walked.push_back(x["thread_id"]);
    if (!page["has_more"].get<bool>()) {
      CHECK(page["next_cursor"].is_null());
      break;
    }
    path = "/v1/threads?limit=3&cursor="
           + page["next_cursor"].get<std::string>();
  }
  CHECK(walked.size() == 7);
  CHECK(std::set<std::string>(walked.begin(), walked.end()).size() == 7);
  auto filtered = body_of(cli.Get("/v1/threads?metadata.stage=2"));
  REQUIRE(filtered["data"].size() == 1);
  CHECK(filtered["data"][0]["thread_id"] == id);
  auto recent = body_of(cli.Get("/v1/threads?updated_after="
                                + std::to_string(
                                  got["updated_at"].get<int64_t>())));
  CHECK(recent["data"].size() >= 1);
  auto gone = cli.Delete("/v1/threads/" + id);
  REQUIRE(gone);
  CHECK(gone->status == 204);
  CHECK(gone->body.empty());
  CHECK(cli.Get("/v1/threads/" + id)->status == 404);
  CHECK(cli.Get("/v1/threads/" + id + "/history")->status == 404);
}

TEST_CASE("thread resources: bad cursors limits metadata and hostile keys "
          "get a clear 4xx and change nothing") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto t = body_of(cli.Post("/v1/threads", R"({"metadata":{"a":"1"}})",
                            "application/json"));
  auto id = t["thread_id"].get<std::string>();
  for (int i = 0; i < 3; ++i)
    REQUIRE(cli.Post("/v1/threads", "", "application/json"));
  auto page = body_of(cli.Get("/v1/threads?limit=1"));
  auto cursor = page["next_cursor"].get<std::string>();
  auto edited = cursor;
  edited[0] = edited[0] == '1' ? '2' : '1';
  struct bad {
    std::string path;
    int status;
    std::string code;
  };
  std::vector<bad> lists{
    {"/v1/threads?cursor=abc", 400, "invalid_argument"},
    {"/v1/threads?cursor=" + edited, 400, "invalid_argument"},
    {"/v1/threads?cursor=" + cursor.substr(0, cursor.size() - 3), 400,
     "invalid_argument"},
    {"/v1/threads?cursor=1.2.3.4.x%00y", 400, "invalid_argument"},
    {"/v1/threads?limit=0", 400, "invalid_argument"},
    {"/v1/threads?limit=1001", 400, "invalid_argument"},
    {"/v1/threads?limit=ten", 400, "invalid_argument"},
    {"/v1/threads?updated_after=-5", 400, "invalid_argument"},
    {"/v1/threads?updated_after=9223372036854775807", 400,
     "invalid_argument"},
    {"/v1/threads?colour=red", 400, "unknown_field"},
    {"/v1/threads?metadata.a%22b=1", 400, "invalid_argument"},
    {"/v1/threads?metadata.=1", 400, "invalid_argument"},
    {"/v1/threads?metadata.a=1&metadata.a=2", 400, "invalid_argument"},
    {"/v1/threads/no-such-thread", 404, "not_found"},
    {"/v1/threads/bad%20id", 400, "invalid_id"},
  };
  for (auto& b : lists) {
    INFO(b.path);
    auto r = cli.Get(b.path);
    REQUIRE(r);
    CHECK(r->status == b.status);
    CHECK(body_of(r)["error"]["code"] == b.code);
  }
  // The cursor as issued still works after all that.
  auto next = cli.Get("/v1/threads?limit=1&cursor=" + cursor);
  REQUIRE(next);
  CHECK(next->status == 200);
  std::string long_value(513, 'v');
  std::string many = "{";
  for (int i = 0; i < 17; ++i)
    many += std::string{i ? "," : ""} + "\"k" + std::to_string(i) + "\":\"v\"";
  many += "}";
  std::vector<std::pair<std::string, int>> patches{
    {R"({"metadata":{"a":5}})", 400},
    {R"({"metadata":["a"]})", 400},
    {R"({"metadata":{"a b":"x"}})", 400},
    {R"({"metadata":{"":"x"}})", 400},
    {"{\"metadata\":{\"" + std::string(65, 'k') + "\":\"x\"}}", 400},
    {"{\"metadata\":{\"a\":\"" + long_value + "\"}}", 413},
    {"{\"metadata\":" + many + "}", 413},
    {R"({"metadata":{"x":"1"},"extra":1})", 400},
    {R"({})", 400},
    {R"(not json)", 400},
  };
  for (auto& [body, status] : patches) {
    INFO(body.substr(0, 80));
    auto r = cli.Patch("/v1/threads/" + id, body, "application/json");
    REQUIRE(r);
    CHECK(r->status == status);
    CHECK(body_of(r)["error"].contains("code"));
    auto after = body_of(cli.Get("/v1/threads/" + id));
    CHECK(after["metadata"] == json{{"a", "1"}});
    CHECK(after["updated_at"] == t["updated_at"]);
  }
  CHECK(cli.Post("/v1/threads", "{\"metadata\":" + many + "}",
                 "application/json")
          ->status
        == 413);
  CHECK(cli.Post("/v1/threads", R"({"metadata":{"a":null}})",
                 "application/json")
          ->status
        == 400);
  CHECK(cli.Patch("/v1/threads/no-such-thread", R"({"metadata":{}})",
                  "application/json")
          ->status
        == 404);
  CHECK(cli.Delete("/v1/threads/no-such-thread")->status == 404);
  CHECK(cli.Delete("/v1/threads/new")->status == 400);
  // Four threads, as before.
  auto all = body_of(cli.Get("/v1/threads?limit=100"));
  CHECK(all["data"].size() == 4);
}

// -- copies ------------------------------------------------------------------------

namespace {

std::vector<std::string> contents(runtime& rt, const std::string& id) {
  auto snap = rt.snapshot(id);
  REQUIRE(snap);
  std::vector<std::string> out;
  for (auto& t : snap->turns)
    out.push_back(std::string{to_string(t.role)} + ":" + t.content);
  return out;
}

} // namespace

TEST_CASE("thread resources: a copy at turn N holds the first N turns and "
          "the metadata and the original is unchanged across a restart") {
  test::test_store dir;
  std::vector<std::string> original;
  std::string at4, whole, empty;
  {
    runtime rt{durable(dir)};
    auto t = rt.create_thread({{"owner", "alice"}});
    REQUIRE(t);
    for (int i = 0; i < 3; ++i)
      REQUIRE(rt.send_message(t->thread_id, "question " + std::to_string(i),
                              "", conflict_policy::queue, 12));
    original = contents(rt, t->thread_id);
    REQUIRE(original.size() == 6);
    auto c4 = rt.copy_thread(t->thread_id, 4);
    REQUIRE(c4);
    CHECK(c4->thread_id != t->thread_id);
    CHECK(c4->turns == 4);
    CHECK(c4->metadata == thread_metadata{{"owner", "alice"}});
    CHECK(contents(rt, c4->thread_id)
          == std::vector<std::string>(original.begin(), original.begin() + 4));
    auto all = rt.copy_thread(t->thread_id);
    REQUIRE(all);
    CHECK(contents(rt, all->thread_id) == original);
    auto none = rt.copy_thread(t->thread_id, 0);
    REQUIRE(none);
    CHECK(none->turns == 0);
    // Edit and continue: the copy goes its own way.
    REQUIRE(rt.send_message(c4->thread_id, "a different question", "",
                            conflict_policy::queue, 12));
    CHECK(contents(rt, c4->thread_id).size() == 6);
    CHECK(contents(rt, t->thread_id) == original);
    auto past = rt.copy_thread(t->thread_id, 7);
    REQUIRE_FALSE(past);
    CHECK(classify(past.error()) == errc::invalid_argument);
    auto missing = rt.copy_thread("no-such-thread", 1);
    REQUIRE_FALSE(missing);
    CHECK(classify(missing.error()) == errc::not_found);
    auto listed = walk(rt, thread_list_request{});
    CHECK(listed.size() == 4); // the original and three copies
    at4 = c4->thread_id;
    whole = all->thread_id;
    empty = none->thread_id;
    REQUIRE(rt.thread_details(t->thread_id));
  }
  runtime rt{durable(dir)};
  auto c4 = contents(rt, at4);
  REQUIRE(c4.size() == 6);
  CHECK(std::vector<std::string>(c4.begin(), c4.begin() + 4)
        == std::vector<std::string>(original.begin(), original.begin() + 4));
  CHECK(c4[4] == "user:a different question");
  CHECK(contents(rt, whole) == original);
  auto e = rt.thread_details(empty);
  REQUIRE(e);
  CHECK(e->turns == 0);
  CHECK(e->metadata == thread_metadata{{"owner", "alice"}});
}

TEST_CASE("thread resources: copies made while the thread is written are "
          "each a prefix of its turns") {
  runtime rt;
  const std::string source = "copied-while-written";
  REQUIRE(rt.add_turn(source, make_user_turn("first")));
  constexpr int writes = 200, copiers = 8, copies_each = 25;
  std::atomic<bool> writing{true};
  // Catch's assertions are not thread-safe: the workers count failures,
  // the main thread asserts.
  std::atomic<int> failed{0};
  std::thread writer([&] {
    for (int i = 0; i < writes; ++i)
      if (!rt.add_turn(source, make_user_turn("turn " + std::to_string(i))))
        ++failed;
    writing = false;
  });
  std::vector<std::future<std::vector<std::string>>> made;
  for (int c = 0; c < copiers; ++c)
    made.push_back(std::async(std::launch::async, [&] {
      std::vector<std::string> ids;
      for (int i = 0; i < copies_each; ++i) {
        if (auto copy = rt.copy_thread(source))
          ids.push_back(copy->thread_id);
        else
          ++failed;
      }
      return ids;
    }));
  writer.join();
  for (auto& f : made)
    f.wait();
  REQUIRE(failed == 0);
  auto final_turns = contents(rt, source);
  REQUIRE(final_turns.size() == writes + 1);
  std::set<std::string> distinct;
  for (auto& f : made)
    for (auto& id : f.get()) {
      distinct.insert(id);
      auto got = contents(rt, id);
      REQUIRE(got.size() <= final_turns.size());
      CHECK(got.size() >= 1);
      CHECK(std::equal(got.begin(), got.end(), final_turns.begin()));
    }
  CHECK(distinct.size() == copiers * copies_each);
  CHECK(contents(rt, source) == final_turns);
}

TEST_CASE("thread resources: POST copy answers 201 with the copy and bad "
          "input gets a clear 4xx that creates nothing") {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto t = body_of(cli.Post("/v1/threads", R"({"metadata":{"team":"blue"}})",
                            "application/json"));
  auto id = t["thread_id"].get<std::string>();
  for (auto q : {"one", "two"})
    REQUIRE(cli.Post("/v1/threads/" + id + "/messages",
                     json{{"content", q}}.dump(), "application/json")
              ->status
            == 200);
  auto copied = cli.Post("/v1/threads/" + id + "/copy", R"({"at_turn":2})",
                         "application/json");
  REQUIRE(copied);
  CHECK(copied->status == 201);
  auto c = body_of(copied);
  CHECK(c["object"] == "thread");
  CHECK(c["copied_from"] == id);
  CHECK(c["turns"] == 2);
  CHECK(c["metadata"] == json{{"team", "blue"}});
  auto history = body_of(cli.Get("/v1/threads/" + c["thread_id"].get<std::string>()
                                 + "/history"));
  REQUIRE(history["turns"].size() == 2);
  CHECK(history["turns"][0]["content"] == "one");
  auto all = body_of(cli.Post("/v1/threads/" + id + "/copy", "",
                              "application/json"));
  CHECK(all["turns"] == 4);
  auto count = [&] {
    return body_of(cli.Get("/v1/threads?limit=100"))["data"].size();
  };
  auto before = count();
  struct bad {
    std::string path, body;
    int status;
    std::string code;
  };
  for (auto& b : std::vector<bad>{
         {"/v1/threads/" + id + "/copy", R"({"at_turn":-1})", 400, "malformed"},
         {"/v1/threads/" + id + "/copy", R"({"at_turn":"2"})", 400, "malformed"},
         {"/v1/threads/" + id + "/copy", R"({"at_turn":1.5})", 400, "malformed"},
         {"/v1/threads/" + id + "/copy", R"({"at":1})", 400, "unknown_field"},
         {"/v1/threads/" + id + "/copy", R"([1])", 400, "malformed"},
         {"/v1/threads/" + id + "/copy", R"({"at_turn":5})", 400,
          "invalid_argument"},
         {"/v1/threads/no-such-thread/copy", "{}", 404, "not_found"},
         {"/v1/threads/a%20b/copy", "{}", 400, "invalid_id"}}) {
    auto r = cli.Post(b.path, b.body, "application/json");
    REQUIRE(r);
    INFO(b.path << " " << b.body << " -> " << r->body);
    CHECK(r->status == b.status);
    CHECK(body_of(r)["error"]["code"] == b.code);
  }
  CHECK(count() == before);
  CHECK(body_of(cli.Get("/v1/threads/" + id))["turns"] == 4);
}
