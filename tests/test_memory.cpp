// Long-term memory (D8): container tags, scoping (no request ever sees
// another user's memory), bm25 ranking, and the snippet rules (at most
// max_chars, best-ranked entries first, cut at sentence or entry
// boundaries, never a raw dump).

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>
#include <sqlite3.h>

#include "spindle/runtime/runtime.hpp"
#include "support.hpp"

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

TEST_CASE("memory match expression: topic words only, quoted, OR-ed") {
  REQUIRE(memory_match_expression("Who are HIS children?") == "\"children\"");
  REQUIRE(memory_match_expression("the the THE") == "");
  REQUIRE(memory_match_expression("Trump's kids, kids \"quoted\"")
          == "\"trump\" OR \"kids\" OR \"quoted\"");
  REQUIRE(memory_match_expression("café crème") == "\"café\" OR \"crème\"");
  std::string many;
  for (int i = 0; i < 100; ++i)
    many += "w" + std::to_string(i) + " ";
  auto expr = memory_match_expression(many);
  REQUIRE(std::count(expr.begin(), expr.end(), '"') == 64); // 32 words
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
  runtime rt;
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
  runtime rt;
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
  runtime rt;
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

TEST_CASE("memory: no request ever sees another user's memory (many users, "
          "many threads, randomized queries, concurrent clients)") {
  constexpr int users = 8, threads = 12, entries = 400;
  const std::vector<std::string> topics{
    "rivers", "mountains", "children", "taxes",  "music",
    "python", "garden",    "trains",   "coffee", "weather"};
  runtime rt;
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
  test::temp_dir dir;
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  {
    runtime rt{opts};
    REQUIRE(rt.store_memory("The deploy key lives in the vault.",
                            memory_tags("ops", "t")));
    REQUIRE(rt.next_context_id()); // the counters share the file
  }
  runtime rt{opts};
  auto s = rt.retrieve_memory("ops", "t2", "where is the deploy key");
  REQUIRE(s);
  REQUIRE_THAT(s->text, Catch::Contains("vault"));
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((dir.path() / "spindle.db").c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version;", -1, &stmt, nullptr);
  REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
  REQUIRE(sqlite3_column_int(stmt, 0) == database::schema_version);
  REQUIRE(database::schema_version >= 2);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_CASE("memory: the user and thread columns, not the index's scope "
          "token, decide what a request sees") {
  test::temp_dir dir;
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  {
    runtime rt{opts};
    REQUIRE(rt.store_memory("Alice keeps bees.", memory_tags("alice", "t")));
  }
  // Simulate a hash collision: a row of mallory's carrying alice's token.
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((dir.path() / "spindle.db").c_str(), &db) == SQLITE_OK);
  auto sql = "INSERT INTO memories(user_id, thread_id, scope, content, "
             "created_ms) VALUES('mallory', 't', '"
             + memory_scope_token("alice", "t")
             + "', 'Mallory keeps bees too.', 1);";
  REQUIRE(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr)
          == SQLITE_OK);
  sqlite3_close(db);
  runtime rt{opts};
  auto s = rt.retrieve_memory("alice", "t", "who keeps bees");
  REQUIRE(s);
  REQUIRE_THAT(s->text, Catch::Contains("Alice"));
  REQUIRE_THAT(s->text, !Catch::Contains("Mallory"));
  REQUIRE(memory_scope_token("alice", "t") == memory_scope_token("alice", "x"));
  REQUIRE(memory_scope_token("", "t") != memory_scope_token("", "x"));
  REQUIRE(memory_scope_token("t", "") != memory_scope_token("", "t"));
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
