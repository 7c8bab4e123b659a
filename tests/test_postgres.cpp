// PostgreSQL as the store (docs/storage.md, "Backends"): what only this
// backend has. Its schema is migrated once however many nodes start at
// once; a newer schema is refused and left as it is; a bad or unreachable
// URL stops `spindle serve` with exit code 2 and never shows the password;
// hostile values are stored as they came; a pipelined transaction (the
// state store's batches) reports each statement's changes and keeps
// nothing when one fails; a database restart fails the writes it catches
// with a clear error, none hangs, and spindle writes again as soon as the
// database is back, having lost nothing it acknowledged. Runs only on the PostgreSQL run (tests/CMakeLists.txt).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/messages/error.hpp"
#include "storage/database.hpp"
#include "storage/postgres/postgres.hpp"
#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

runtime_options on(const test::test_store& store) {
  runtime_options opts;
  store.apply(opts.storage);
  opts.conversation.memory = false;
  return opts;
}

// The cluster of a test of its own (.ci/postgres), stopped and removed
// with it.
class private_cluster {
public:
  private_cluster() {
    auto r = test::run({script(), "start", dir_.str() + "/pg"});
    if (r.exit_code != 0)
      throw std::runtime_error("cannot start a cluster: " + r.err);
    url_ = test::lines(r.out).at(0);
  }
  ~private_cluster() {
    test::run({script(), "stop", dir_.str() + "/pg"});
  }
  const std::string& url() const noexcept {
    return url_;
  }
  /// Restarts the server as a crash would (`-m immediate`), down for a
  /// second: long enough that writes are sure to find it down.
  bool restart_immediately() {
    return test::run({script(), "restart", dir_.str() + "/pg", "immediate",
                      "1"})
             .exit_code
           == 0;
  }

private:
  static std::string script() {
    return std::string{SPINDLE_SOURCE_DIR} + "/.ci/postgres";
  }
  test::temp_dir dir_;
  std::string url_;
};

// What writers racing a database restart saw (restart_drill).
struct drill_result {
  /// Per client, what the store acknowledged, in order.
  std::vector<std::vector<std::string>> acknowledged;
  /// Failures that said the database was unavailable, and the others.
  uint64_t unavailable = 0;
  std::vector<std::string> unclear;
  /// The longest call, when the restart began, when the database was
  /// back, the last failure (ms since the drill started).
  int64_t longest_ms = 0, restart_at_ms = 0, back_at_ms = 0,
          last_failure_ms = 0;
};

// `clients` threads write "c<client>-<i>" through `write(client, text)`,
// which answers nullopt when the write was acknowledged, else whether
// the failure was a clear "unavailable" (true) and what it said; after
// 1.5 s PostgreSQL restarts as by a crash, and the writers go on for 6 s
// after it is back.
template <class Write>
drill_result restart_drill(private_cluster& cluster, size_t clients,
                           Write write) {
  drill_result out;
  out.acknowledged.resize(clients);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> longest_ms{0}, last_failure_ms{0};
  std::atomic<uint64_t> unavailable{0};
  std::mutex mx;
  auto started = std::chrono::steady_clock::now();
  auto now_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now() - started)
      .count();
  };
  std::vector<std::thread> writers;
  for (size_t c = 0; c < clients; ++c)
    writers.emplace_back([&, c] {
      for (size_t i = 0; !stop; ++i) {
        auto text = "c" + std::to_string(c) + "-" + std::to_string(i);
        auto t0 = now_ms();
        std::optional<std::pair<bool, std::string>> failure = write(c, text);
        auto took = now_ms() - t0;
        int64_t seen = longest_ms;
        while (took > seen && !longest_ms.compare_exchange_weak(seen, took)) {
        }
        if (!failure) {
          out.acknowledged[c].push_back(text);
          continue;
        }
        last_failure_ms = now_ms();
        if (failure->first) {
          ++unavailable;
        } else {
          std::lock_guard<std::mutex> guard{mx};
          out.unclear.push_back(failure->second);
        }
        std::this_thread::sleep_for(20ms);
      }
    });
  std::this_thread::sleep_for(1500ms);
  out.restart_at_ms = now_ms();
  bool restarted = cluster.restart_immediately();
  out.back_at_ms = now_ms();
  std::this_thread::sleep_for(6s);
  stop = true;
  for (auto& t : writers)
    t.join();
  if (!restarted)
    out.unclear.push_back("the cluster did not restart");
  out.unavailable = unavailable;
  out.longest_ms = longest_ms;
  out.last_failure_ms = last_failure_ms;
  return out;
}

// The checks every restart drill passes: the restart was seen, as clear
// failures only, no call waited 10 s, and writing resumed within 5 s of
// the database coming back. A restart that cuts a COMMIT's answer is
// seen as a wait instead of failures: the store looks the transaction up
// until the database answers (up to 2 s), the writes queued behind it
// wait too, and all of them succeed if it committed and the database is
// back by then; so the restart was seen when a write failed as
// unavailable or a call waited through at least half the outage.
void check_drill(const drill_result& d) {
  INFO("restart at " << d.restart_at_ms << " ms, back at " << d.back_at_ms
                     << " ms; longest call " << d.longest_ms
                     << " ms; last failure " << d.last_failure_ms << " ms; "
                     << d.unavailable << " unavailable; first unclear: "
                     << (d.unclear.empty() ? std::string{}
                                           : d.unclear.front()));
  CHECK((d.unavailable > 0
         || d.longest_ms >= (d.back_at_ms - d.restart_at_ms) / 2));
  CHECK(d.unclear.empty());
  CHECK(d.longest_ms < 10000);
  CHECK(d.last_failure_ms - d.back_at_ms < 5000);
}

// Whether `acked` appear in `stored` in order (others may be between).
bool in_order(const std::vector<std::string>& acked,
              const std::vector<std::string>& stored) {
  size_t at = 0;
  for (auto& x : stored)
    if (at < acked.size() && x == acked[at])
      ++at;
  return at == acked.size();
}

} // namespace

TEST_CASE("postgres: nodes starting at once on an empty database migrate "
          "it exactly once") {
  test::test_store store;
  REQUIRE(store.on_postgres());
  const int nodes = 8;
  std::atomic<int> opened{0};
  std::vector<std::string> errors;
  std::mutex mx;
  test::barrier start{nodes};
  std::vector<std::thread> threads;
  for (int i = 0; i < nodes; ++i)
    threads.emplace_back([&] {
      start.arrive_and_wait();
      auto conn = open_postgres(store.url());
      if (conn) {
        ++opened;
      } else {
        std::lock_guard<std::mutex> guard{mx};
        errors.push_back(describe(conn.error()));
      }
    });
  for (auto& t : threads)
    t.join();
  INFO((errors.empty() ? std::string{} : errors.front()));
  CHECK(opened == nodes);
  CHECK(store.query("SELECT count(*) FROM spindle_schema;") == "1");
  CHECK(store.query("SELECT version FROM spindle_schema;")
        == std::to_string(database::schema_version));
  auto version = postgres_schema_version(store.url());
  REQUIRE(version);
  CHECK(*version == database::schema_version);
}

TEST_CASE("postgres: a database of a newer schema is refused at start and "
          "left untouched") {
  test::test_store store;
  {
    runtime rt{on(store)};
    REQUIRE(rt.add_turn("kept", make_user_turn("before")));
  }
  store.exec("UPDATE spindle_schema SET version = 99;");
  auto rt = runtime::start(on(store));
  REQUIRE_FALSE(rt);
  CHECK(classify(rt.error()) == errc::storage_failure);
  CHECK(describe(rt.error()).find("newer") != std::string::npos);
  CHECK(store.query("SELECT version FROM spindle_schema;") == "99");
  CHECK(store.query("SELECT count(*) FROM turns;")
          + store.query("SELECT count(*) FROM turn_journal;")
        != "00");
  CHECK(store.query("SELECT content FROM turn_journal UNION ALL "
                    "SELECT content FROM turns;")
        == "before");
}

TEST_CASE("postgres: spindle serve with a bad or unreachable --store exits "
          "2 with a clear error that never shows the password") {
  test::test_store store;
  auto serve = [](const std::string& url) {
    return test::run({"timeout", "30", test::spindle_binary(), "serve",
                      "--port", "0", "--data", ":memory:", "--store", url});
  };
  SECTION("nothing listens there") {
    auto r = serve("postgres://alice:Sw0rdf1sh@127.0.0.1:1/spindle");
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--store") != std::string::npos);
    CHECK(r.err.find("127.0.0.1") != std::string::npos);
    CHECK(r.err.find("Sw0rdf1sh") == std::string::npos);
    CHECK(r.out.find("Sw0rdf1sh") == std::string::npos);
  }
  SECTION("a database that does not exist") {
    auto url = store.url();
    auto bad = url.substr(0, url.rfind('/') + 1) + "no_such_database";
    // postgres://postgres@... -> postgres://postgres:Sw0rdf1sh@...
    bad.insert(bad.find('@'), ":Sw0rdf1sh");
    auto r = serve(bad);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("no_such_database") != std::string::npos);
    CHECK(r.err.find("Sw0rdf1sh") == std::string::npos);
  }
  SECTION("not a PostgreSQL URL") {
    auto r = serve("mysql://bob:Sw0rdf1sh@127.0.0.1/db");
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("not a PostgreSQL URL") != std::string::npos);
    CHECK(r.err.find("Sw0rdf1sh") == std::string::npos);
  }
  SECTION("a malformed URL") {
    auto r = serve("postgres://carol:Sw0rdf1sh@127.0.0.1:notaport/db");
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("Sw0rdf1sh") == std::string::npos);
  }
  SECTION("the same through SPINDLE_STORE") {
    auto r = test::run({"timeout", "30", test::spindle_binary(), "serve",
                        "--port", "0", "--data", ":memory:"},
                       {}, {{"SPINDLE_STORE",
                             "postgres://dave:Sw0rdf1sh@127.0.0.1:1/x"}});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("Sw0rdf1sh") == std::string::npos);
  }
}

TEST_CASE("postgres: hostile values are stored exactly as they came, and a "
          "NUL character or bytes that are not UTF-8 are a clear error "
          "that changes nothing") {
  test::test_store store;
  const std::vector<std::string> hostile{
    "'); DROP TABLE turns; --",
    "\" OR 1=1 --",
    "$1 $$ ?1 ? \\x00 \\\\",
    "emoji \xF0\x9F\xA7\xB5 and accents: d\xC3\xA9j\xC3\xA0 vu",
    std::string(1 << 20, 'm'),
  };
  {
    runtime rt{on(store)};
    for (auto& text : hostile)
      REQUIRE(rt.add_turn("hostile", make_user_turn(text)));
    // Values PostgreSQL's text cannot hold are the caller's error, clear
    // and stored nowhere.
    auto nul = rt.add_turn("hostile", make_user_turn(std::string{"a\0b", 3}));
    REQUIRE_FALSE(nul);
    CHECK(classify(nul.error()) == errc::invalid_argument);
    CHECK(describe(nul.error()).find("NUL") != std::string::npos);
    auto bytes = rt.add_turn("hostile", make_user_turn("caf\xE9 \xFF\xFE"));
    REQUIRE_FALSE(bytes);
    CHECK(classify(bytes.error()) == errc::invalid_argument);
    CHECK(describe(bytes.error()).find("UTF8") != std::string::npos);
    // The thread goes on; nothing was half stored.
    REQUIRE(rt.add_turn("hostile", make_user_turn("after")));
  }
  runtime rt{on(store)};
  auto h = rt.history("hostile", 100);
  REQUIRE(h);
  REQUIRE(h->size() == hostile.size() + 1);
  for (size_t i = 0; i < hostile.size(); ++i)
    CHECK(h->at(i).content == hostile[i]);
  CHECK(h->back().content == "after");
  CHECK(store.query("SELECT count(*) FROM threads;") == "1");
}

TEST_CASE("postgres: a database restart fails the writes it catches with "
          "a clear error, none hangs, writes succeed again soon after, and "
          "every acknowledged turn is kept") {
  private_cluster cluster;
  runtime_options opts;
  opts.storage.store = cluster.url();
  opts.conversation.memory = false;
  auto rt = std::make_unique<runtime>(opts);
  const size_t clients = 16;
  auto d = restart_drill(
    cluster, clients,
    [&](size_t c, const std::string& text)
      -> std::optional<std::pair<bool, std::string>> {
      auto r = rt->add_turn("restart-" + std::to_string(c),
                            make_user_turn(text));
      if (r)
        return std::nullopt;
      return std::make_pair(classify(r.error())
                              == errc::storage_unavailable,
                            describe(r.error()));
    });
  check_drill(d);
  // Every acknowledged turn is there, in order, after a restart of spindle;
  // a turn whose commit's answer was lost and looked up is acknowledged
  // only if it committed, so nothing else is.
  rt.reset();
  runtime again{opts};
  for (size_t c = 0; c < clients; ++c) {
    auto h = again.history("restart-" + std::to_string(c), 1000000);
    REQUIRE(h);
    std::vector<std::string> stored;
    for (auto& t : *h)
      stored.push_back(t.content);
    CHECK(stored == d.acknowledged[c]);
  }
}

TEST_CASE("postgres: a pipelined transaction reports what each statement "
          "changed, a failing statement fails its sync and the rollback "
          "keeps nothing, and the connection goes on") {
  test::test_store store;
  auto conn = open_postgres(store.url());
  REQUIRE(conn);
  auto& db = **conn;
  REQUIRE(db.pipelines());
  REQUIRE_FALSE(db.exec("CREATE TABLE pipe (k BIGINT PRIMARY KEY, v TEXT);"));
  auto upsert = db.prepare("INSERT INTO pipe(k, v) VALUES(?1, ?2) "
                           "ON CONFLICT (k) DO NOTHING;");
  auto insert = db.prepare("INSERT INTO pipe(k, v) VALUES(?1, ?2);");
  auto update = db.prepare("UPDATE pipe SET v = ?2 WHERE k >= ?1;");
  REQUIRE(upsert);
  REQUIRE(insert);
  REQUIRE(update);
  auto send = [](sql_query& q, int64_t k, const std::string& v) {
    q.bind(1, sql_value::of(k));
    q.bind(2, sql_value::of(v));
    return q.send();
  };
  auto count = [&] { return store.query("SELECT count(*) FROM pipe;"); };

  // 600 rows over three syncs, then a row that is there already.
  REQUIRE_FALSE(db.begin_pipelined());
  std::vector<int64_t> changes;
  for (int64_t k = 0; k < 601; ++k) {
    REQUIRE_FALSE(send(**upsert, k % 600, "v"));
    if (k % 256 == 255 || k == 600) {
      auto done = db.sync();
      REQUIRE_FALSE(done.error);
      changes.insert(changes.end(), done.changes.begin(), done.changes.end());
    }
  }
  REQUIRE(changes.size() == 601);
  CHECK(std::count(changes.begin(), changes.end(), 1) == 600);
  CHECK(changes.back() == 0);
  REQUIRE_FALSE(db.commit());
  CHECK(count() == "600");

  // A sync that went through, then one whose third statement fails: the
  // statements after it, a first use of `update` among them, do not run,
  // and the rollback undoes the sync before too.
  REQUIRE_FALSE(db.begin_pipelined());
  REQUIRE_FALSE(send(**upsert, 1000, "new"));
  REQUIRE_FALSE(db.sync().error);
  REQUIRE_FALSE(send(**insert, 1001, "new"));
  REQUIRE_FALSE(send(**insert, 1002, "new"));
  REQUIRE_FALSE(send(**insert, 5, "duplicate"));
  REQUIRE_FALSE(send(**update, 0, "changed"));
  auto failed = db.sync();
  REQUIRE(failed.error);
  CHECK(classify(failed.error) == errc::storage_failure);
  CHECK(describe(failed.error).find("duplicate key") != std::string::npos);
  CHECK(failed.changes == std::vector<int64_t>{1, 1});
  db.rollback();
  CHECK(count() == "600");
  CHECK(store.query("SELECT count(*) FROM pipe WHERE v <> 'v';") == "0");

  // A value PostgreSQL cannot hold is refused before anything is queued.
  REQUIRE_FALSE(db.begin_pipelined());
  REQUIRE_FALSE(send(**insert, 2000, "kept"));
  auto nul = send(**insert, 2001, std::string{"a\0b", 3});
  REQUIRE(nul);
  CHECK(classify(nul) == errc::invalid_argument);
  auto rest = db.sync();
  REQUIRE_FALSE(rest.error);
  CHECK(rest.changes == std::vector<int64_t>{1});
  // The connection goes on: `update`, prepared in the pipeline that
  // failed, is prepared again.
  REQUIRE_FALSE(send(**update, 599, "changed"));
  auto last = db.sync();
  REQUIRE_FALSE(last.error);
  CHECK(last.changes == std::vector<int64_t>{2});
  REQUIRE_FALSE(db.commit());
  CHECK(count() == "601");
  CHECK(store.query("SELECT string_agg(k::text, ' ' ORDER BY k) FROM pipe "
                    "WHERE v = 'changed';")
        == "599 2000");
  // And plain statements and transactions run as before.
  REQUIRE_FALSE(db.begin());
  (*insert)->bind(1, sql_value::of(int64_t{3000}));
  (*insert)->bind(2, sql_value::of(std::string{"plain"}));
  REQUIRE_FALSE((*insert)->run());
  REQUIRE_FALSE(db.commit());
  CHECK(count() == "602");
}

TEST_CASE("postgres: a store's URL is shown with its password hidden") {
  CHECK(redact_url("postgres://ann:p@ss:w0rd@db.example:5432/spindle")
        == "postgres://ann:***@db.example:5432/spindle");
  CHECK(redact_url("postgresql://db/spindle?user=ann&password=hunter2&"
                   "sslmode=require")
        == "postgresql://db/spindle?user=ann&password=***&sslmode=require");
  CHECK(redact_url("postgres://ann@db/spindle") == "postgres://ann@db/spindle");
  CHECK(is_postgres_url("postgres://db/x"));
  CHECK(is_postgres_url("postgresql://db/x"));
  CHECK_FALSE(is_postgres_url("mysql://db/x"));
  CHECK_FALSE(is_postgres_url("./spindle-data"));
}

TEST_CASE("postgres: while PostgreSQL restarts spindle serve answers 503 "
          "storage_unavailable, never hangs, and serves again once it is "
          "back, every acknowledged message kept") {
  private_cluster cluster;
  test::temp_dir data;
  test::server_process srv{{"--data", data.str(), "--store", cluster.url()}};
  const size_t clients = 16;
  auto d = restart_drill(
    cluster, clients,
    [&](size_t c, const std::string& text)
      -> std::optional<std::pair<bool, std::string>> {
      // One connection per call: the drill's threads share nothing.
      httplib::Client cli{"127.0.0.1", srv.port()};
      cli.set_read_timeout(30, 0);
      auto r = cli.Post("/v1/threads/http-restart-" + std::to_string(c)
                          + "/messages",
                        nlohmann::json{{"content", text}}.dump(),
                        "application/json");
      if (r && r->status == 200)
        return std::nullopt;
      if (!r)
        return std::make_pair(false, std::string{"no answer"});
      auto body = nlohmann::json::parse(r->body, nullptr, false);
      return std::make_pair(r->status == 503 && body.is_object()
                              && body["error"]["code"]
                                   == "storage_unavailable",
                            std::to_string(r->status) + " " + r->body);
    });
  check_drill(d);
  // Every acknowledged message is stored, in order. A message may also be
  // stored whose reply failed after its user turn committed: the
  // acknowledged ones are a subsequence of the stored ones.
  httplib::Client cli{"127.0.0.1", srv.port()};
  for (size_t c = 0; c < clients; ++c) {
    auto h = cli.Get("/v1/threads/http-restart-" + std::to_string(c)
                     + "/history?max_turns=100000");
    REQUIRE(h);
    REQUIRE(h->status == 200);
    std::vector<std::string> users;
    auto history = nlohmann::json::parse(h->body);
    for (auto& t : history["turns"])
      if (t["role"] == "user")
        users.push_back(t["content"].get<std::string>());
    INFO("client " << c << ": " << d.acknowledged[c].size()
                   << " acknowledged, " << users.size() << " stored");
    CHECK(in_order(d.acknowledged[c], users));
  }
}

TEST_CASE("postgres: over HTTP a NUL character is 400 invalid_argument, "
          "nothing of it is stored and the thread goes on") {
  test::test_store store;
  test::server_process srv{store.serve_flags()};
  httplib::Client cli{"127.0.0.1", srv.port()};
  auto post = [&](const std::string& content) {
    return cli.Post("/v1/threads/nul/messages",
                    nlohmann::json{{"content", content}}.dump(),
                    "application/json");
  };
  auto bad = post(std::string{"a\0b", 3});
  REQUIRE(bad);
  CHECK(bad->status == 400);
  auto body = nlohmann::json::parse(bad->body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body["error"]["code"] == "invalid_argument");
  auto good = post("fine");
  REQUIRE(good);
  CHECK(good->status == 200);
  auto h = cli.Get("/v1/threads/nul/history");
  REQUIRE(h);
  REQUIRE(h->status == 200);
  auto history = nlohmann::json::parse(h->body);
  REQUIRE(history["turns"].size() == 2);
  CHECK(history["turns"][0]["content"] == "fine");
}
