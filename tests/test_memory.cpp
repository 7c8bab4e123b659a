// Long-term memory (D8): container tags, scoping (no request ever sees
// another user's memory), bm25 ranking, and the snippet rules (at most
// max_chars, best-ranked entries first, cut at sentence or entry
// boundaries, never a raw dump). On SQLite, and again on PostgreSQL
// (tests/CMakeLists.txt: those tagged [sqlite] reach into SQLite's files
// and run on SQLite only).

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <caf/all.hpp>
#include <catch2/catch.hpp>
#include <sqlite3.h>

#include "spindle/runtime/actor_pool.hpp"
#include "spindle/runtime/config.hpp"
#include "spindle/runtime/memory.hpp"
#include "storage/postgres/postgres.hpp"
#include "spindle/runtime/runtime.hpp"
#include "storage/sql_connection.hpp"
#include "support.hpp"
#include "storage/state_store.hpp"
#include "memory/memory_index.hpp"

using namespace spindle;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line))
    out.push_back(line);
  return out;
}

// A runtime whose memory keeps what it stores: in the data directory of
// `dir` (memory.db), or on the PostgreSQL run in its database.
runtime_options durable_memory(const test::test_store& dir,
                               size_t readers = 0) {
  runtime_options opts;
  dir.apply(opts.storage);
  opts.storage.sync = sync_mode::normal;
  opts.conversation.memory_serving.readers = readers;
  return opts;
}

// A runtime for the tests of memory's rules: in memory on SQLite's run
// (one actor serves stores and retrievals), in the database of `dir` on
// PostgreSQL's.
runtime_options memory_of(const test::test_store& dir) {
  runtime_options opts;
  if (dir.on_postgres())
    dir.apply(opts.storage);
  return opts;
}

} // namespace

// -- pure rules ---------------------------------------------------------------

TEST_CASE("memory snippet: best-ranked entries first, one bullet line each, "
          "whitespace normalised, duplicates dropped") {
  auto s = build_memory_snippet({"First  fact.\n Second line.", "Other fact.",
                                 "First fact. Second line.", "   "},
                                2000);
  REQUIRE(s.text == "- First fact. Second line.\n- Other fact.");
  REQUIRE(s.entries == 2);
  REQUIRE(s.matched == 4);
}

TEST_CASE("memory snippet: never exceeds max_chars - a long entry is cut at "
          "its last sentence end that fits, else skipped") {
  std::string long_entry = "Alpha one. Beta two! Gamma three? Delta four";
  SECTION("cut at a sentence end") {
    auto s = build_memory_snippet({long_entry}, 2 + 21);
    REQUIRE(s.text == "- Alpha one. Beta two!");
  }
  SECTION("no sentence fits: skipped, a later shorter entry still fits") {
    auto s = build_memory_snippet({"Averyveryverylongsentencewithoutend",
                                   "Short."},
                                  12);
    REQUIRE(s.text == "- Short.");
    REQUIRE(s.entries == 1);
  }
  SECTION("every budget, many entries") {
    std::vector<std::string> entries;
    std::mt19937 gen{7};
    for (int i = 0; i < 40; ++i) {
      std::string e;
      for (int k = 0; k < 1 + static_cast<int>(gen() % 6); ++k)
        e += "Sentence " + std::to_string(i) + "." + std::to_string(k) + ". ";
      entries.push_back(e);
    }
    for (size_t budget = 0; budget <= 2000; budget += 7) {
      auto s = build_memory_snippet(entries, budget);
      REQUIRE(s.text.size() <= budget);
      for (auto& line : lines_of(s.text)) {
        REQUIRE_THAT(line, Catch::StartsWith("- Sentence"));
        REQUIRE(line.back() == '.'); // whole sentences only
      }
    }
  }
}

TEST_CASE("memory query terms: topic words only, lowercased, deduplicated, "
          "at most 32") {
  using terms = std::vector<std::string>;
  REQUIRE(memory_query_terms("Who are HIS children?") == terms{"children"});
  REQUIRE(memory_query_terms("the the THE").empty());
  REQUIRE(memory_query_terms("Trump's kids, kids \"quoted\"")
          == terms{"trump", "kids", "quoted"});
  REQUIRE(memory_query_terms("café crème") == terms{"café", "crème"});
  std::string many;
  for (int i = 0; i < 100; ++i)
    many += "w" + std::to_string(i) + " ";
  auto got = memory_query_terms(many);
  REQUIRE(got.size() == max_memory_query_terms);
  REQUIRE(got.back() == "w31");
  // Entries are indexed by the same words, repeats kept.
  REQUIRE(memory_words("Rivers, rivers and the sea.")
          == terms{"rivers", "rivers", "sea"});
  // A long word is cut to 64 bytes, never inside a UTF-8 sequence.
  auto long_word = std::string(63, 'a') + "é";
  REQUIRE(memory_words(long_word) == terms{std::string(63, 'a')});
  REQUIRE(memory_words(std::string(80, 'b'))
          == terms{std::string(max_memory_word, 'b')});
}

TEST_CASE("memory shortest cut: up to the first sentence end, else the "
          "whole entry, whitespace normalised") {
  REQUIRE(memory_shortest_cut("One.  Two.") == 4);
  REQUIRE(memory_shortest_cut("  no end at all  ") == 13);
  REQUIRE(memory_shortest_cut("v1.2 is out! Yes.") == 12);
  REQUIRE(memory_shortest_cut(" \n ") == 0);
  // An entry can be in a snippet exactly when its shortest cut fits.
  for (size_t budget = 0; budget < 40; ++budget) {
    for (std::string e : {"Alpha beta. Gamma delta epsilon.", "no end here",
                          "Short! And a longer second sentence."}) {
      memory_snippet_builder b{budget + 2}; // the bullet takes 2
      REQUIRE(b.room() == budget);
      b.add(e);
      auto s = std::move(b).finish(1);
      CAPTURE(budget, e);
      REQUIRE((s.entries == 1)
              == (budget > 0 && memory_shortest_cut(e) <= budget));
    }
  }
}

TEST_CASE("memory tags: one form for storing and retrieving") {
  REQUIRE(memory_tags("u1", "t1") == std::vector<std::string>{"user:u1",
                                                              "thread:t1"});
  REQUIRE(memory_tags("", "t1") == std::vector<std::string>{"thread:t1"});
  auto scope = parse_memory_tags({"thread:t1", "user:alice@example.com"});
  REQUIRE(scope);
  REQUIRE(scope->user_id == "alice@example.com");
  REQUIRE(scope->thread_id == "t1");
  for (auto bad : std::vector<std::vector<std::string>>{
         {},
         {"team:x"},
         {"user:a", "user:b"},
         {"thread:a", "thread:b"},
         {"user:../x"},
         {"thread:a b"},
         {"user:"}}) {
    REQUIRE_FALSE(parse_memory_tags(bad));
  }
}

// -- the memory actor ---------------------------------------------------------

TEST_CASE("memory: retrieval ranks by relevance to the current message") {
  test::test_store dir;
  runtime rt{memory_of(dir)};
  REQUIRE(rt.store_memory("The user likes hiking in the Alps.",
                          memory_tags("u", "t1")));
  REQUIRE(rt.store_memory("Donald Trump has five children: Donald Jr., "
                          "Ivanka, Eric, Tiffany and Barron.",
                          memory_tags("u", "t1")));
  REQUIRE(rt.store_memory("The children's books are on the shelf.",
                          memory_tags("u", "t2")));
  auto s = rt.retrieve_memory("u", "t3", "Trump children names");
  REQUIRE(s);
  auto lines = lines_of(s->text);
  REQUIRE(lines.size() == 2);
  REQUIRE_THAT(lines[0], Catch::Contains("Trump has five children"));
  REQUIRE_THAT(lines[1], Catch::Contains("books"));
  REQUIRE(s->matched == 2);
  // Nothing matches: no snippet, not a dump of everything.
  auto none = rt.retrieve_memory("u", "t1", "quantum chromodynamics");
  REQUIRE(none->text.empty());
}

TEST_CASE("memory: the snippet never exceeds max_chars and max_chars above "
          "2000 is refused") {
  test::test_store dir;
  runtime rt{memory_of(dir)};
  for (int i = 0; i < 60; ++i)
    REQUIRE(rt.store_memory("Fact number " + std::to_string(i)
                              + " about rivers. Rivers flow to the sea. "
                                "Some rivers are long.",
                            memory_tags("u", "t")));
  for (uint64_t max : {0, 1, 10, 50, 200, 999, 2000}) {
    auto s = rt.retrieve_memory("u", "t", "rivers", max);
    REQUIRE(s);
    REQUIRE(s->text.size() <= max);
  }
  auto full = rt.retrieve_memory("u", "t", "rivers");
  REQUIRE(full->text.size() > 1500);
  REQUIRE(full->text.size() <= 2000);
  auto big = rt.retrieve_memory("u", "t", "rivers", 2001);
  REQUIRE_FALSE(big);
  REQUIRE(classify(big.error()) == errc::invalid_argument);
  REQUIRE_THAT(describe(big.error()), Catch::Contains("max_chars"));
}

TEST_CASE("memory: bad entries are refused naming the problem and nothing "
          "is stored") {
  test::test_store dir;
  runtime rt{memory_of(dir)};
  auto expect = [&](const std::string& content,
                    std::vector<std::string> tags, errc code,
                    const std::string& word) {
    auto r = rt.store_memory(content, std::move(tags));
    REQUIRE_FALSE(r);
    REQUIRE(classify(r.error()) == code);
    REQUIRE_THAT(describe(r.error()), Catch::Contains(word));
  };
  expect("", {"user:u"}, errc::invalid_argument, "content");
  expect("secret plan", {}, errc::invalid_argument, "tags");
  expect("secret plan", {"org:acme"}, errc::invalid_argument, "org:acme");
  expect("secret plan", {"user:a", "user:b"}, errc::invalid_argument, "user");
  expect("secret plan", {"user:../etc"}, errc::invalid_id, "user_id");
  expect("secret plan", {"thread:.."}, errc::invalid_id, "thread_id");
  expect(std::string(max_memory_content + 1, 'x'), {"user:u"},
         errc::too_large, "content");
  REQUIRE(rt.retrieve_memory("u", "t", "secret plan")->text.empty());
  REQUIRE(rt.retrieve_memory("", "t", "secret plan")->text.empty());
}

TEST_CASE("memory: content is stored exactly as it came, never spliced into "
          "SQL - on PostgreSQL a NUL character or bytes that are not UTF-8 "
          "are refused naming the problem, and nothing is stored") {
  test::test_store dir;
  runtime rt{durable_memory(dir, 1)};
  const std::vector<std::string> hostile{
    "Robert'); DROP TABLE memories; -- keeps bees.",
    "Quotes \" ' and $1 ?1 :name keep bees.", "Ünïcödé bees 🐝 hum."};
  for (auto& content : hostile)
    REQUIRE(rt.store_memory(content, memory_tags("h", "")));
  auto listed = rt.list_memories({"h", "", 100, 0});
  REQUIRE(listed);
  REQUIRE(listed->entries.size() == 3);
  CHECK(listed->entries[0].content == hostile[2]);
  CHECK(listed->entries[1].content == hostile[1]);
  CHECK(listed->entries[2].content == hostile[0]);
  CHECK(rt.retrieve_memory("h", "t", "bees")->matched == 3);
  const std::string nul = std::string{"Null"} + '\0' + "byte bees.";
  const std::string latin1 = "Caf\xe9 bees.";
  auto with_nul = rt.store_memory(nul, memory_tags("h", ""));
  auto not_utf8 = rt.store_memory(latin1, memory_tags("h", ""));
  if (dir.on_postgres()) {
    REQUIRE_FALSE(with_nul);
    CHECK(classify(with_nul.error()) == errc::invalid_argument);
    CHECK_THAT(describe(with_nul.error()), Catch::Contains("NUL"));
    REQUIRE_FALSE(not_utf8);
    CHECK(classify(not_utf8.error()) == errc::invalid_argument);
    CHECK_THAT(describe(not_utf8.error()), Catch::Contains("UTF-8"));
    CHECK(rt.list_memories({"h", "", 100, 0})->entries.size() == 3);
    // A query in such bytes is no error: those words match nothing.
    auto q = rt.retrieve_memory("h", "t", "caf\xe9 bees");
    REQUIRE(q);
    CHECK(q->matched == 3);
  } else {
    REQUIRE(with_nul);
    REQUIRE(not_utf8);
    auto all = rt.list_memories({"h", "", 100, 0});
    REQUIRE(all);
    REQUIRE(all->entries.size() == 5);
    CHECK(all->entries[0].content == latin1);
    CHECK(all->entries[1].content == nul);
  }
  // Memory goes on.
  REQUIRE(rt.store_memory("After them, more bees.", memory_tags("h", "")));
  CHECK(rt.retrieve_memory("h", "t", "more bees")->text.find("After them")
        != std::string::npos);
}

TEST_CASE("memory: no request ever sees another user's memory (many users, "
          "many threads, randomized queries, concurrent clients)") {
  constexpr int users = 8, threads = 12, entries = 400;
  const std::vector<std::string> topics{
    "rivers", "mountains", "children", "taxes",  "music",
    "python", "garden",    "trains",   "coffee", "weather"};
  test::test_store dir;
  runtime rt{memory_of(dir)};
  // owner[i]: "u{n}" or "anon{thread}"; every entry starts with its owner.
  struct entry {
    std::string owner;
    std::string thread;
    std::set<std::string> words;
  };
  std::vector<entry> stored;
  std::mt19937 gen{2024};
  for (int i = 0; i < entries; ++i) {
    auto t = "th" + std::to_string(gen() % threads);
    bool anonymous = gen() % 4 == 0;
    auto u = anonymous ? std::string{} : "u" + std::to_string(gen() % users);
    entry e{anonymous ? "anon-" + t : u, t, {}};
    std::string content = "Owner " + e.owner + ".";
    for (int k = 0; k < 3; ++k) {
      auto& w = topics[gen() % topics.size()];
      e.words.insert(w);
      content += " Note about " + w + ".";
    }
    REQUIRE(rt.store_memory(content, memory_tags(u, t)));
    stored.push_back(std::move(e));
  }
  for (size_t clients : {1, 2, 4, 8}) {
    DYNAMIC_SECTION(clients << " concurrent clients") {
      std::atomic<int> violations{0}, errors{0}, recall_misses{0};
      std::atomic<int> nonempty{0};
      std::vector<std::thread> pool;
      for (size_t c = 0; c < clients; ++c)
        pool.emplace_back([&, c] {
          std::mt19937 g{static_cast<unsigned>(c * 7919 + clients)};
          for (int q = 0; q < 150; ++q) {
            auto t = "th" + std::to_string(g() % threads);
            bool anonymous = g() % 3 == 0;
            auto u = anonymous ? std::string{}
                               : "u" + std::to_string(g() % users);
            auto w1 = topics[g() % topics.size()];
            auto w2 = topics[g() % topics.size()];
            auto s = rt.retrieve_memory(u, t, "what about " + w1 + " and "
                                                + w2 + "?");
            if (!s) {
              ++errors;
              continue;
            }
            auto expected_owner = anonymous ? "anon-" + t : u;
            for (auto& line : lines_of(s->text))
              if (line.rfind("- Owner " + expected_owner + ".", 0) != 0)
                ++violations;
            // Everything in scope that mentions a word was matched.
            uint64_t in_scope = 0;
            for (auto& e : stored)
              if (e.owner == expected_owner
                  && (e.words.count(w1) || e.words.count(w2)))
                ++in_scope;
            if (s->matched != std::min<uint64_t>(in_scope, 64))
              ++recall_misses;
            if (!s->text.empty())
              ++nonempty;
          }
        });
      for (auto& t : pool)
        t.join();
      REQUIRE(errors == 0);
      REQUIRE(violations == 0);
      REQUIRE(recall_misses == 0);
      REQUIRE(nonempty > 0);
    }
  }
}

TEST_CASE("memory: entries survive a restart of a durable runtime") {
  test::test_store dir;
  runtime_options opts;
  dir.apply(opts.storage);
  {
    runtime rt{opts};
    REQUIRE(rt.store_memory("The deploy key lives in the vault.",
                            memory_tags("ops", "t")));
    REQUIRE(rt.next_context_id()); // the counters share the store
  }
  runtime rt{opts};
  auto s = rt.retrieve_memory("ops", "t2", "where is the deploy key");
  REQUIRE(s);
  REQUIRE_THAT(s->text, Catch::Contains("vault"));
  REQUIRE(database::schema_version >= 2);
  if (dir.on_postgres()) {
    CHECK(dir.query("SELECT version FROM spindle_schema;")
          == std::to_string(database::schema_version));
    // Memory is in the database, not in a file beside it.
    CHECK(dir.query("SELECT count(*) FROM memories;") == "1");
    CHECK_FALSE(std::filesystem::exists(dir.path() / "memory.db"));
    return;
  }
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((dir.path() / "spindle.db").c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version;", -1, &stmt, nullptr);
  REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
  REQUIRE(sqlite3_column_int(stmt, 0) == database::schema_version);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_CASE("memory: the user and thread columns, not the index, decide what "
          "a request sees") {
  test::test_store dir;
  auto opts = durable_memory(dir);
  {
    runtime rt{opts};
    REQUIRE(rt.store_memory("Alice keeps bees.", memory_tags("alice", "t")));
    REQUIRE(rt.store_memory("The bees swarm in May.",
                            memory_tags("alice", "t")));
    REQUIRE(rt.store_memory("Bees in the garden.", memory_tags("", "t")));
  }
  // The index files two entries under alice's scope and one under thread
  // t's anonymous scope; now the columns of one say it is mallory's, and
  // of another that it is in thread u.
  REQUIRE_FALSE(dir.memory_connection()->exec(
    "UPDATE memories SET user_id = 'mallory' WHERE content LIKE '%swarm%';"
    "UPDATE memories SET thread_id = 'u' WHERE content LIKE '%garden%';"));
  runtime rt{opts};
  auto s = rt.retrieve_memory("alice", "t", "where do the bees swarm");
  REQUIRE(s);
  REQUIRE(s->text == "- Alice keeps bees.");
  REQUIRE(s->matched == 1);
  auto anonymous = rt.retrieve_memory("", "t", "bees in the garden");
  REQUIRE(anonymous);
  REQUIRE(anonymous->text.empty());
  REQUIRE(anonymous->matched == 0);
}

TEST_CASE("memory: switched off, prompts are built without it and the "
          "memory calls say so") {
  runtime_options opts;
  opts.conversation.memory = false;
  runtime rt{opts};
  REQUIRE_FALSE(rt.memory());
  auto stored = rt.store_memory("x", memory_tags("u", "t"));
  REQUIRE_FALSE(stored);
  REQUIRE(classify(stored.error()) == errc::unavailable);
  auto r = rt.send_message("t", "hello", "u");
  REQUIRE(r);
  REQUIRE_THAT(r->reply, Catch::Contains("long-term memory no"));
}

// -- bounded retrieval, readers ----------------------------------------------

namespace {

// A word of a small skewed vocabulary: a few words in many entries, most
// in few.
std::string vocabulary_word(std::mt19937& gen) {
  auto u = std::uniform_real_distribution<double>{0, 1}(gen);
  return "word" + std::to_string(static_cast<int>(u * u * 400));
}

struct owner_of {
  std::string user;   // empty: anonymous
  std::string thread; // the entry's thread; the scope of anonymous ones
  std::string name() const {
    return user.empty() ? "anon-" + thread : user;
  }
};

// Seeds `dir`'s database with `n` entries through the memory writer: six
// users (each writing in several threads) and ten threads' anonymous
// entries, each entry starting with "Owner {owner}." and then words of
// the vocabulary.
void seed_owned(const test::test_store& dir, size_t n) {
  auto db = dir.memory_connection();
  auto writer = memory_writer::open(*db);
  REQUIRE(writer);
  std::mt19937 gen{42};
  std::vector<memory_entry> batch;
  for (size_t i = 0; i < n; ++i) {
    auto thread = "th" + std::to_string(gen() % 10);
    owner_of o{gen() % 10 < 7 ? "u" + std::to_string(gen() % 6) : "", thread};
    std::string content = "Owner " + o.name() + ".";
    for (int k = 0; k < 4 + static_cast<int>(gen() % 5); ++k)
      content += " " + vocabulary_word(gen);
    batch.push_back({content + ".", {o.user, o.thread}});
    if (batch.size() == 10000 || i + 1 == n) {
      REQUIRE((*writer)->store_all(batch));
      batch.clear();
    }
  }
}

} // namespace

TEST_CASE("memory: with 100k entries over many users' and threads' scopes, "
          "concurrent retrievals return only the requester's entries") {
  test::test_store dir;
  seed_owned(dir, 100000);
  // More readers than cores: retrievals run on several connections at
  // once.
  runtime rt{durable_memory(dir, 4)};
  constexpr size_t clients = 8, per_client = 300;
  std::atomic<size_t> violations{0}, errors{0}, nonempty{0}, lines{0};
  std::vector<std::thread> pool;
  for (size_t c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      std::mt19937 gen{static_cast<unsigned>(c + 1)};
      for (size_t q = 0; q < per_client; ++q) {
        owner_of o{gen() % 3 == 0 ? "" : "u" + std::to_string(gen() % 7),
                   "th" + std::to_string(gen() % 11)};
        auto query = "what about " + vocabulary_word(gen) + " and "
                     + vocabulary_word(gen) + "?";
        auto s = rt.retrieve_memory(o.user, o.thread, query);
        if (!s) {
          ++errors;
          continue;
        }
        if (!s->text.empty())
          ++nonempty;
        for (auto& line : lines_of(s->text)) {
          ++lines;
          if (line.rfind("- Owner " + o.name() + ".", 0) != 0)
            ++violations;
        }
        if (s->matched > memory_max_ranked)
          ++violations;
      }
    });
  for (auto& t : pool)
    t.join();
  CHECK(errors == 0);
  CHECK(violations == 0);
  // u6 and th10 own nothing; every other scope holds thousands of entries,
  // so nearly every one of their retrievals finds some.
  CHECK(nonempty > clients * per_client / 2);
  CHECK(lines > clients * per_client * 5);
}

TEST_CASE("memory: a retrieval considers the 64 newest entries holding each "
          "term: a recent relevant entry is found among many, a rare term "
          "finds an old entry, an old entry with only common words is not") {
  auto store_notes = [](runtime& rt, int from, int to) {
    for (int i = from; i < to; ++i)
      REQUIRE(rt.store_memory("Note " + std::to_string(1000 + i)
                                + ": the mill.",
                              memory_tags("u", "t")));
  };
  auto shows_old = [](const memory_snippet& s) {
    return s.text.find("Old note") != std::string::npos;
  };
  test::test_store dir;
  runtime rt{memory_of(dir)};
  REQUIRE(memory_recent_per_term == 64);
  REQUIRE(rt.store_memory("Old note: the mill by the river.",
                          memory_tags("u", "t")));
  // 63 newer entries with "mill": the old one is the 64th newest.
  store_notes(rt, 0, 63);
  auto mill = rt.retrieve_memory("u", "t", "the mill");
  REQUIRE(mill);
  CHECK(shows_old(*mill));
  CHECK(mill->matched == 64);
  // One more: it is the 65th, out of every list but that of "river".
  store_notes(rt, 63, 64);
  mill = rt.retrieve_memory("u", "t", "the mill");
  REQUIRE(mill);
  CHECK_FALSE(shows_old(*mill));
  CHECK(mill->matched == 64);
  store_notes(rt, 64, 2000);
  mill = rt.retrieve_memory("u", "t", "the mill");
  REQUIRE(mill);
  // The newest first (equal scores: the newest wins), the old one absent.
  CHECK_THAT(mill->text, Catch::StartsWith("- Note 2999: the mill."));
  CHECK_FALSE(shows_old(*mill));
  // A rare term finds it, however old, and it ranks first.
  auto river = rt.retrieve_memory("u", "t", "the river");
  REQUIRE(river);
  CHECK(river->text == "- Old note: the mill by the river.");
  auto both = rt.retrieve_memory("u", "t", "mill and river");
  REQUIRE(both);
  CHECK_THAT(both->text, Catch::StartsWith("- Old note: the mill by the "
                                           "river.\n- Note 2999"));
}

TEST_CASE("memory: a snippet of many short entries lists them best first, "
          "among equal scores the newest first, past the first two dozen "
          "too") {
  test::test_store dir;
  runtime rt{memory_of(dir)};
  // Alternately an entry with the term twice (scores higher) and once.
  auto note = [](int i) {
    return "Note " + std::to_string(1000 + i)
           + (i % 2 == 0 ? ": mill mill." : ": mill.");
  };
  for (int i = 0; i < 80; ++i)
    REQUIRE(rt.store_memory(note(i), memory_tags("u", "t")));
  auto got = rt.retrieve_memory("u", "t", "the mill");
  REQUIRE(got);
  // The 64 newest hold the term (16..79): the twice-holding ones newest
  // first, then the others newest first, every one shown.
  std::string expected;
  for (int i = 78; i >= 16; i -= 2)
    expected += "- " + note(i) + "\n";
  for (int i = 79; i >= 17; i -= 2)
    expected += "- " + note(i) + (i == 17 ? "" : "\n");
  CHECK(got->matched == 64);
  CHECK(lines_of(got->text).size() == 64);
  CHECK(got->text == expected);
}

TEST_CASE("memory: what a retrieval reads is bounded by constants, not by "
          "the number of stored entries, and what a reader keeps changes "
          "no answer") {
  test::test_store dir;
  seed_owned(dir, 100000);
  auto db = dir.memory_connection();
  // Nothing kept between retrievals: each reads all it uses.
  auto reader = memory_reader::open(*db, nullptr, 0);
  REQUIRE(reader);
  // Keeping what it read changes a reader's cost, never its answers.
  auto keeping = memory_reader::open(*db, std::make_shared<memory_changes>());
  REQUIRE(keeping);
  std::mt19937 gen{9};
  uint64_t most_postings = 0;
  for (int q = 0; q < 200; ++q) {
    std::string query;
    auto words = 1 + gen() % 40;
    for (size_t k = 0; k < words; ++k)
      query += vocabulary_word(gen) + " ";
    memory_query request{"u" + std::to_string(gen() % 6), "th1", query};
    auto s = (*reader)->retrieve(request);
    REQUIRE(s);
    // Before it read them, the keeping reader cannot answer from what it
    // keeps; once it has, it answers the same without a statement.
    if (q == 0)
      CHECK_FALSE((*keeping)->retrieve_kept(request).has_value());
    for (int twice = 0; twice < 2; ++twice) {
      auto kept = (*keeping)->retrieve(request);
      REQUIRE(kept);
      CHECK(kept->text == s->text);
      CHECK(kept->matched == s->matched);
    }
    auto from_kept = (*keeping)->retrieve_kept(request);
    REQUIRE(from_kept.has_value());
    REQUIRE(*from_kept);
    CHECK((*from_kept)->text == s->text);
    CHECK((*from_kept)->matched == s->matched);
    CHECK((*from_kept)->ids == s->ids);
    CHECK((*keeping)->last_cost().statements == 0);
    auto& cost = (*reader)->last_cost();
    CAPTURE(query);
    CHECK(cost.lists_read <= max_memory_query_terms);
    CHECK(cost.terms <= cost.lists_read);
    CHECK(cost.postings <= cost.terms * memory_recent_per_term);
    CHECK(cost.candidates <= cost.postings);
    CHECK(cost.contents <= memory_max_ranked);
    CHECK(cost.statements <= 1 + cost.lists_read + cost.contents);
    CHECK(s->matched <= memory_max_ranked);
    most_postings = std::max(most_postings, cost.postings);
    // A reader that keeps nothing always has to read.
    CHECK_FALSE((*reader)->retrieve_kept(request).has_value());
  }
  // The common words' lists are full: the bound is reached, not avoided.
  CHECK(most_postings >= 10 * memory_recent_per_term);
}

TEST_CASE("memory: a retrieval right after an acknowledged store sees it, "
          "whichever reader serves it, while other clients store and "
          "retrieve") {
  test::test_store dir;
  runtime rt{durable_memory(dir, 3)};
  constexpr size_t clients = 6, rounds = 60;
  std::atomic<size_t> misses{0}, errors{0};
  // Rounds in step: a client's store and its retrieval overlap the other
  // clients' stores and retrievals of the same round, and a client
  // descheduled between the two cannot be overtaken by the other client of
  // its user storing round after round (forty newer "garden" entries of
  // equal rank would fill the snippet and push its entry out).
  test::barrier round_start{clients};
  std::vector<std::thread> pool;
  for (size_t c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      // Two clients per user: each sees the other's entries appear.
      auto user = "u" + std::to_string(c % 3);
      for (size_t r = 0; r < rounds; ++r) {
        round_start.arrive_and_wait();
        auto marker = "marker" + std::to_string(c) + "x" + std::to_string(r);
        if (!rt.store_memory("Client " + std::to_string(c) + " noted "
                               + marker + " about the garden.",
                             memory_tags(user, "t" + std::to_string(r % 4)))) {
          ++errors;
          continue;
        }
        // The readers have kept this user's counts and the "garden" list
        // from earlier rounds; the store must be visible all the same (it
        // is among the two newest "garden" entries of the user: only the
        // other client of the user can have stored since, once).
        auto s = rt.retrieve_memory(user, "t", "the garden");
        if (!s)
          ++errors;
        else if (s->text.find(marker) == std::string::npos)
          ++misses;
      }
    });
  for (auto& t : pool)
    t.join();
  CHECK(errors == 0);
  CHECK(misses == 0);
}

namespace {

// The single number `sql` answers on the database file at `path`, read
// beside the runtime.
int64_t count_in(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr)
          == SQLITE_OK);
  REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
  auto n = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return n;
}

} // namespace

TEST_CASE("memory: a database of schema version 4 is upgraded, and its "
          "entries move to memory.db, are indexed and retrieved within "
          "their scopes",
          "[sqlite]") {
  test::test_store dir;
  auto path = database_path(durable_memory(dir).storage);
  {
    auto db = database::open(path, sync_mode::normal, 4);
    REQUIRE(db);
    REQUIRE((*db)->user_version() == 4);
    // Rows as version 4 wrote them: with a scope token, into FTS5.
    REQUIRE_FALSE((*db)->exec(
      "INSERT INTO memories(user_id, thread_id, scope, content, created_ms) "
      "VALUES ('alice', 't1', 'su1', 'Alice keeps bees in Lyon.', 1),"
      "       ('bob', '', 'su2', 'Bob keeps bees in Oslo.', 2),"
      "       ('', 't1', 'sa3', 'Someone keeps bees in Porto.', 3);"));
  }
  runtime rt{durable_memory(dir)};
  auto alice = rt.retrieve_memory("alice", "t9", "who keeps bees");
  REQUIRE(alice);
  CHECK(alice->text == "- Alice keeps bees in Lyon.");
  auto anonymous = rt.retrieve_memory("", "t1", "bees");
  REQUIRE(anonymous);
  CHECK(anonymous->text == "- Someone keeps bees in Porto.");
  // New entries go on from there.
  REQUIRE(rt.store_memory("Alice sold the bees.", memory_tags("alice", "")));
  alice = rt.retrieve_memory("alice", "t9", "bees");
  REQUIRE(alice);
  CHECK(lines_of(alice->text).size() == 2);
  auto memory_db = memory_database_path(durable_memory(dir).storage);
  CHECK(count_in(path, "PRAGMA user_version;") == database::schema_version);
  CHECK(count_in(path, "SELECT count(*) FROM sqlite_master "
                       "WHERE name LIKE 'memories_fts%';")
        == 0);
  // The entries moved to memory.db, where the index holds them and the
  // new one.
  CHECK(count_in(memory_db, "SELECT count(*) FROM memories;") == 4);
  CHECK(count_in(memory_db, "SELECT indexed_through FROM memory_index_state;")
        == 4);
}

TEST_CASE("memory: entries an earlier build kept in spindle.db move to "
          "memory.db once, and the state store's file keeps the rest",
          "[sqlite]") {
  test::test_store dir;
  auto storage = durable_memory(dir).storage;
  {
    // As the previous build left it: schema 5, memories in spindle.db.
    auto db = database::open(database_path(storage), sync_mode::normal);
    REQUIRE(db);
    auto writer = memory_writer::open(**db);
    REQUIRE(writer);
    for (int i = 0; i < 50; ++i)
      REQUIRE((*writer)->store("Entry " + std::to_string(i)
                                 + " mentions the lighthouse.",
                               memory_tags(i % 2 == 0 ? "ann" : "", "t1")));
  }
  for (int start = 0; start < 3; ++start) {
    runtime rt{durable_memory(dir)};
    auto ann = rt.retrieve_memory("ann", "t9", "the lighthouse");
    REQUIRE(ann);
    CHECK(ann->text.find("Entry 48 mentions") != std::string::npos);
    CHECK(ann->text.find("Entry 49") == std::string::npos); // D8
    auto anonymous = rt.retrieve_memory("", "t1", "lighthouse");
    REQUIRE(anonymous);
    CHECK(anonymous->text.find("Entry 49 mentions") != std::string::npos);
    REQUIRE(rt.store_memory("Ann painted the lighthouse "
                              + std::to_string(start) + ".",
                            memory_tags("ann", "")));
  }
  // Moved once (50), then one new entry per start; none written to
  // spindle.db since.
  auto memory_db = memory_database_path(storage);
  CHECK(count_in(memory_db, "SELECT count(*) FROM memories;") == 53);
  CHECK(count_in(memory_db, "SELECT count(DISTINCT content) FROM memories;")
        == 53);
  CHECK(count_in(database_path(storage), "SELECT count(*) FROM memories;")
        == 50);
}

TEST_CASE("memory: stores from many threads at once are committed together "
          "and each answered with its own ID, and all are retrievable") {
  test::test_store dir;
  runtime rt{durable_memory(dir, 2)};
  constexpr size_t clients = 16, each = 100;
  std::vector<std::vector<int64_t>> ids(clients);
  std::atomic<size_t> errors{0};
  std::vector<std::thread> pool;
  for (size_t c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      for (size_t i = 0; i < each; ++i) {
        auto id = rt.store_memory("Client" + std::to_string(c) + " item"
                                    + std::to_string(i) + " about kites.",
                                  memory_tags("u" + std::to_string(c), ""));
        if (id)
          ids[c].push_back(*id);
        else
          ++errors;
      }
    });
  for (auto& t : pool)
    t.join();
  REQUIRE(errors == 0);
  std::set<int64_t> all;
  for (auto& mine : ids) {
    // A client's stores are answered in order.
    CHECK(std::is_sorted(mine.begin(), mine.end()));
    all.insert(mine.begin(), mine.end());
  }
  CHECK(all.size() == clients * each);
  for (size_t c = 0; c < clients; ++c) {
    auto s = rt.retrieve_memory("u" + std::to_string(c), "t",
                                "item" + std::to_string(each - 1) + " kites");
    REQUIRE(s);
    CHECK(s->text.find("Client" + std::to_string(c) + " item"
                       + std::to_string(each - 1) + " ")
          != std::string::npos);
    // D8: never another client's entry.
    for (size_t other = 0; other < clients; ++other)
      if (other != c)
        CHECK(s->text.find("Client" + std::to_string(other) + " ")
              == std::string::npos);
  }
}

TEST_CASE("memory: deleting a user's entries removes them from retrieval "
          "and listing for good - other scopes keep theirs - IDs are never "
          "used again") {
  test::test_store dir;
  int64_t highest = 0;
  {
    runtime rt{durable_memory(dir, 2)};
    for (int i = 0; i < 5; ++i)
      REQUIRE(rt.store_memory("Ada grows tomatoes, note " + std::to_string(i)
                                + ".",
                              memory_tags("ada", "t1")));
    REQUIRE(rt.store_memory("Bob grows tomatoes too.",
                            memory_tags("bob", "")));
    REQUIRE(rt.store_memory("Someone grows tomatoes.", memory_tags("", "t1")));
    // The readers keep what they read: warm them.
    for (int i = 0; i < 4; ++i)
      REQUIRE(rt.retrieve_memory("ada", "t1", "tomatoes")->matched == 5);
    auto gone = rt.delete_memories("ada", "");
    REQUIRE(gone);
    CHECK(*gone == 5);
    for (int i = 0; i < 4; ++i) {
      auto s = rt.retrieve_memory("ada", "t1", "tomatoes");
      REQUIRE(s);
      CHECK(s->matched == 0);
      CHECK(s->text.empty());
    }
    auto listed = rt.list_memories({"ada", "", 100, 0});
    REQUIRE(listed);
    CHECK(listed->entries.empty());
    CHECK(rt.retrieve_memory("bob", "t9", "tomatoes")->matched == 1);
    CHECK(rt.retrieve_memory("", "t1", "tomatoes")->matched == 1);
    // The anonymous entries of a thread go by the thread.
    auto anonymous = rt.delete_memories("", "t1");
    REQUIRE(anonymous);
    CHECK(*anonymous == 1);
    CHECK(rt.retrieve_memory("", "t1", "tomatoes")->matched == 0);
    CHECK(rt.retrieve_memory("bob", "t9", "tomatoes")->matched == 1);
    auto bob = rt.list_memories({"bob", "", 100, 0});
    REQUIRE(bob);
    REQUIRE(bob->entries.size() == 1);
    highest = bob->entries[0].id;
    // Deleting the newest entry does not make its ID free.
    REQUIRE(rt.delete_memory(highest));
    auto again = rt.store_memory("Bob sold the tomatoes.",
                                 memory_tags("bob", ""));
    REQUIRE(again);
    CHECK(*again > highest);
    highest = *again;
  }
  // Gone after a restart too.
  runtime rt{durable_memory(dir, 2)};
  CHECK(rt.retrieve_memory("ada", "t1", "tomatoes")->matched == 0);
  CHECK(rt.list_memories({"ada", "", 100, 0})->entries.empty());
  auto bob = rt.list_memories({"bob", "", 100, 0});
  REQUIRE(bob);
  REQUIRE(bob->entries.size() == 1);
  CHECK(bob->entries[0].content == "Bob sold the tomatoes.");
  auto next = rt.store_memory("Bob bought seeds.", memory_tags("bob", ""));
  REQUIRE(next);
  CHECK(*next > highest);
}

TEST_CASE("memory: deleting one entry takes it out of retrieval and of its "
          "term lists - a store after it is seen and the deleted one never "
          "again") {
  test::test_store dir;
  runtime rt{durable_memory(dir, 2)};
  std::vector<int64_t> ids;
  for (auto* text : {"Cats like fish.", "Cats like naps.", "Cats like boxes."})
    ids.push_back(*rt.store_memory(text, memory_tags("cy", "")));
  for (int i = 0; i < 4; ++i)
    REQUIRE(rt.retrieve_memory("cy", "t", "cats")->matched == 3);
  auto gone = rt.delete_memory(ids[1]);
  REQUIRE(gone);
  CHECK(*gone);
  for (int i = 0; i < 4; ++i) {
    auto s = rt.retrieve_memory("cy", "t", "cats naps");
    REQUIRE(s);
    CHECK(s->matched == 2);
    CHECK(s->text.find("naps") == std::string::npos);
  }
  // The scope's count comes back to 3 with a new entry: the readers must
  // not take their lists for current (they held the deleted entry).
  REQUIRE(rt.store_memory("Cats like yarn.", memory_tags("cy", "")));
  for (int i = 0; i < 4; ++i) {
    auto s = rt.retrieve_memory("cy", "t", "cats");
    REQUIRE(s);
    CHECK(s->matched == 3);
    CHECK(s->text.find("yarn") != std::string::npos);
    CHECK(s->text.find("naps") == std::string::npos);
  }
  // A deletion and a store with no retrieval between them: the count is
  // where it was when the readers read their lists, the lists are not.
  REQUIRE(*rt.delete_memory(ids[2]));
  REQUIRE(rt.store_memory("Cats like milk.", memory_tags("cy", "")));
  for (int i = 0; i < 4; ++i) {
    auto s = rt.retrieve_memory("cy", "t", "cats");
    REQUIRE(s);
    CHECK(s->matched == 3);
    CHECK(s->text.find("milk") != std::string::npos);
    CHECK(s->text.find("boxes") == std::string::npos);
  }
  REQUIRE(*rt.delete_memory(ids[0]));
  REQUIRE(rt.store_memory("Cats like fish.", memory_tags("cy", "")));
  auto listed = rt.list_memories({"cy", "", 100, 0});
  REQUIRE(listed);
  REQUIRE(listed->entries.size() == 3);
  CHECK(listed->entries[0].content == "Cats like fish."); // newest first
  CHECK(listed->entries[1].content == "Cats like milk.");
  CHECK(listed->entries[2].content == "Cats like yarn.");
  // Twice, or an unknown ID: nothing to delete.
  CHECK_FALSE(*rt.delete_memory(ids[1]));
  CHECK_FALSE(*rt.delete_memory(999999));
  // Bad requests change nothing.
  CHECK_FALSE(rt.delete_memories("", ""));
  CHECK_FALSE(rt.delete_memories("../x", ""));
  CHECK_FALSE(rt.list_memories({"cy", "t", 100, 0}));
  CHECK_FALSE(rt.list_memories({"cy", "", 0, 0}));
  CHECK(rt.list_memories({"cy", "", 100, 0})->entries.size() == 3);
}

TEST_CASE("memory: listing walks a scope newest first in pages - every "
          "entry exactly once") {
  test::test_store dir;
  runtime rt{memory_of(dir)}; // SQLite: in memory, one actor serves all
  for (int i = 0; i < 25; ++i)
    REQUIRE(rt.store_memory("Entry " + std::to_string(i) + " of the walk.",
                            memory_tags("walker", "t" + std::to_string(i % 3))));
  std::vector<int64_t> seen;
  memory_list_request req{"walker", "", 7, 0};
  for (int pages = 0; pages < 10; ++pages) {
    auto page = rt.list_memories(req);
    REQUIRE(page);
    CHECK(page->entries.size() <= 7);
    for (auto& e : page->entries)
      seen.push_back(e.id);
    if (page->next_before == 0)
      break;
    req.before = page->next_before;
  }
  REQUIRE(seen.size() == 25);
  CHECK(std::is_sorted(seen.rbegin(), seen.rend()));
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}

TEST_CASE("memory: after an acknowledged deletion no retrieval shows the "
          "entry - whichever reader serves it - while other clients store "
          "delete and retrieve") {
  test::test_store dir;
  runtime rt{durable_memory(dir, 3)};
  constexpr size_t clients = 6, rounds = 40;
  std::atomic<size_t> unseen{0}, ghosts{0}, errors{0};
  std::vector<std::thread> pool;
  for (size_t c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      // A user of its own: no other client's entries outrank its own.
      auto user = "d" + std::to_string(c);
      for (size_t r = 0; r < rounds; ++r) {
        auto marker = "mark" + std::to_string(c) + "x" + std::to_string(r);
        auto id = rt.store_memory("Client " + std::to_string(c) + " keeps "
                                    + marker + " in the shed.",
                                  memory_tags(user, ""));
        if (!id) {
          ++errors;
          continue;
        }
        auto before = rt.retrieve_memory(user, "t", "the shed");
        if (!before || before->text.find(marker) == std::string::npos)
          ++unseen;
        // Every other round deletes the one entry, else the whole user.
        bool deleted = false;
        if (r % 2 == 0) {
          auto one = rt.delete_memory(*id);
          deleted = one && *one;
        } else {
          auto all = rt.delete_memories(user, "");
          deleted = all && *all == 1;
        }
        if (!deleted) {
          ++errors;
          continue;
        }
        auto after = rt.retrieve_memory(user, "t", "the shed " + marker);
        if (!after)
          ++errors;
        else if (after->text.find(marker) != std::string::npos)
          ++ghosts;
      }
    });
  for (auto& t : pool)
    t.join();
  CHECK(errors == 0);
  CHECK(unseen == 0);
  CHECK(ghosts == 0);
}

namespace {

template <class Result, class... Ts>
caf::expected<Result> call_memory(caf::actor_system& sys,
                                  const memory_actor& memory, Ts&&... xs) {
  caf::scoped_actor self{sys};
  caf::expected<Result> out = caf::make_error(caf::sec::request_timeout);
  self->request(memory, std::chrono::seconds(10), std::forward<Ts>(xs)...)
    .receive([&](Result& r) { out = std::move(r); },
             [&](caf::error& err) { out = std::move(err); });
  return out;
}

} // namespace

TEST_CASE("memory: a retrieval on the caller's thread answers from what a "
          "reader keeps, as the reader would, and leaves to the actors what "
          "changed since") {
  test::test_store dir;
  spindle::config cfg;
  caf::actor_system sys{cfg};
  memory_options serving;
  serving.readers = 2;
  auto mem = spawn_memory(sys, durable_memory(dir).storage, serving);
  REQUIRE(mem);
  REQUIRE(mem->kept);
  auto ask = [&](const memory_query& q) {
    return call_memory<memory_snippet>(sys, mem->actor, caf::get_atom::value,
                                       memory_atom::value, q);
  };
  auto store = [&](const std::string& content, const std::string& user) {
    return call_memory<int64_t>(sys, mem->actor, caf::put_atom::value,
                                memory_atom::value, content,
                                memory_tags(user, "t1"));
  };
  for (int i = 0; i < 50; ++i)
    REQUIRE(store("Entry " + std::to_string(i) + " about the orchard.", "u1"));
  memory_query q{"u1", "t1", "the orchard"};
  // Nothing kept yet: the caller is sent to the actors.
  CHECK_FALSE(mem->kept(q).has_value());
  auto asked = ask(q);
  REQUIRE(asked);
  REQUIRE_FALSE(asked->text.empty());
  // Each reader the actors route to keeps it; one that does answers the
  // same.
  for (int i = 0; i < 4; ++i)
    REQUIRE(ask(q));
  auto kept = mem->kept(q);
  REQUIRE(kept.has_value());
  REQUIRE(*kept);
  CHECK((*kept)->text == asked->text);
  CHECK((*kept)->ids == asked->ids);
  CHECK((*kept)->tokens == asked->tokens);
  // A store into the scope, once acknowledged, sends the next retrieval
  // back to the actors, which show it.
  auto fresh = store("Entry fresh about the orchard gate.", "u1");
  REQUIRE(fresh);
  CHECK_FALSE(mem->kept(q).has_value());
  auto after = ask(q);
  REQUIRE(after);
  CHECK(std::find(after->ids.begin(), after->ids.end(), *fresh)
        != after->ids.end());
  // A store into another user's scope leaves this one's kept answer.
  for (int i = 0; i < 4; ++i)
    REQUIRE(ask(q));
  REQUIRE(store("Entry of another user about the orchard.", "u2"));
  auto still = mem->kept(q);
  REQUIRE(still.has_value());
  REQUIRE(*still);
  CHECK((*still)->ids == after->ids);
  // A bad query is refused on the spot, as the actors refuse it.
  auto bad = mem->kept(memory_query{"u 1", "t1", "the orchard"});
  REQUIRE(bad.has_value());
  CHECK_FALSE(*bad);
  stop_actor_pool(sys, caf::actor_cast<caf::actor>(mem->actor));
}

TEST_CASE("memory: builds that retrieve on their own threads see every "
          "acknowledged store and never an acknowledged deletion or another "
          "user's entry, while clients store, delete and build at once") {
  test::test_store dir;
  runtime rt{durable_memory(dir, 2)};
  constexpr size_t clients = 6, rounds = 30;
  std::atomic<size_t> unseen{0}, ghosts{0}, strangers{0}, errors{0},
    builds{0};
  std::vector<std::thread> pool;
  for (size_t c = 0; c < clients; ++c)
    pool.emplace_back([&, c] {
      auto user = "b" + std::to_string(c);
      auto thread = "bt" + std::to_string(c);
      auto build = [&](const std::string& message)
        -> caf::expected<built_context> {
        ++builds;
        return rt.build_context(thread, user, message);
      };
      // Entries that stay, so that the readers keep this user's lists.
      for (int i = 0; i < 5; ++i)
        if (!rt.store_memory("Client " + std::to_string(c)
                               + " waters the barn plants, note "
                               + std::to_string(i) + ".",
                             memory_tags(user, "")))
          ++errors;
      for (size_t r = 0; r < rounds; ++r) {
        // Kept by now: several builds of one message between the changes.
        for (int again = 0; again < 3; ++again) {
          auto b = build("the barn plants");
          if (!b)
            ++errors;
          else if (b->memory_snippet.find("Client " + std::to_string(c))
                     == std::string::npos)
            ++unseen;
          else
            for (size_t other = 0; other < clients; ++other)
              if (other != c
                  && b->memory_snippet.find(
                       "Client " + std::to_string(other) + " ")
                       != std::string::npos)
                ++strangers;
        }
        auto marker = "tag" + std::to_string(c) + "x" + std::to_string(r);
        auto id = rt.store_memory("Client " + std::to_string(c) + " put "
                                    + marker + " in the barn plants.",
                                  memory_tags(user, ""));
        if (!id) {
          ++errors;
          continue;
        }
        auto seen = build("the barn plants " + marker);
        if (!seen || seen->memory_snippet.find(marker) == std::string::npos)
          ++unseen;
        auto again = build("the barn plants " + marker);
        if (!again || again->memory_snippet.find(marker) == std::string::npos)
          ++unseen;
        auto gone = rt.delete_memory(*id);
        if (!gone || *gone != 1) {
          ++errors;
          continue;
        }
        auto after = build("the barn plants " + marker);
        if (!after)
          ++errors;
        else if (after->memory_snippet.find(marker) != std::string::npos)
          ++ghosts;
      }
    });
  for (auto& t : pool)
    t.join();
  CHECK(errors == 0);
  CHECK(unseen == 0);
  CHECK(ghosts == 0);
  CHECK(strangers == 0);
  CHECK(builds == clients * rounds * 6);
}
