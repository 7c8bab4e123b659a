// spindle_populate: fills a data directory with conversation turns and
// long-term memory entries, so that a server can be measured on a store
// that is not empty (bench/bench_http.py --full-store).
//
//   spindle_populate --data DIR [--turns 1000000] [--memories 100000]
//                    [--threads 10000] [--bench-threads 64] [--seed 1]
//
// Turns go to --threads threads, the same number each, user and assistant
// in turn; the first --bench-threads of them are named bench-0, bench-1, ...
// (the threads the HTTP benchmark posts to), the rest pop-K. Memory entries
// are scoped to the bench threads (tag thread:bench-K, spread evenly), where
// the benchmark's retrievals look. Texts are sentences of 6 to 60 words drawn
// with a Zipf law from a vocabulary of common English words and 30,000
// generated ones, so that term frequencies look like a real corpus's: a few
// words everywhere, most words rare. The store is written through the
// runtime (the same state store, memory writer and index as a server), with
// --sync normal to save time; the server then opens it as usual.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "spindle/messages/error.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using clk = std::chrono::steady_clock;

namespace {

const char* common_words[] = {
  "the", "a", "to", "and", "of", "in", "is", "it", "you", "that", "for",
  "on", "with", "can", "how", "what", "my", "this", "be", "are", "do",
  "i", "me", "your", "at", "by", "from", "or", "an", "as", "have", "was",
  "about", "which", "when", "there", "if", "will", "would", "should",
  "help", "please", "thanks", "time", "day", "week", "trip", "plan",
  "email", "write", "explain", "difference", "between", "short", "list",
  "code", "python", "git", "commit", "database", "query", "index", "server",
  "error", "file", "report", "meeting", "thursday", "monday", "friday",
  "recipe", "sourdough", "starter", "bread", "coffee", "breakfast", "cat",
  "rain", "haiku", "poem", "french", "translate", "summary", "sentences",
  "revenue", "costs", "support", "ticket", "system", "migration", "tier",
  "interview", "backend", "role", "questions", "prepare", "evenings",
  "landlord", "heating", "broken", "lisbon", "london", "auckland", "zone",
  "hours", "july", "may", "degrees", "celsius", "fahrenheit", "cup",
  "tablespoons", "planets", "sun", "fact", "mutex", "semaphore", "loop",
  "elements", "bakery", "names", "ideas", "files", "deal", "tomorrow",
  "politely", "changes", "working", "tree", "undo", "last", "keep",
  "healthier", "oatmeal", "granola", "smells", "dead", "three", "five",
  "two", "first", "new", "old", "good", "best", "more", "most", "some",
  "all", "any", "other", "same", "because", "after", "before", "again"};

// Pronounceable made-up words: rare terms, as names, jargon and typos are.
std::vector<std::string> make_vocabulary(size_t generated, std::mt19937_64& rng) {
  static const char* onsets[] = {"b", "c", "d", "f", "g", "h", "j", "k",
                                 "l", "m", "n", "p", "r", "s", "t", "v",
                                 "w", "z", "br", "cl", "dr", "st", "tr",
                                 "sh", "ch", "gr", "pl", "sk"};
  static const char* vowels[] = {"a", "e", "i", "o", "u", "ai", "ea",
                                 "ou", "io", "y"};
  static const char* codas[] = {"", "n", "r", "s", "t", "l", "m", "x",
                                "nd", "st", "rk", "ng"};
  std::vector<std::string> out(std::begin(common_words),
                               std::end(common_words));
  std::uniform_int_distribution<size_t> syl(2, 4);
  for (size_t i = 0; i < generated; ++i) {
    std::string w;
    for (size_t s = syl(rng); s > 0; --s) {
      w += onsets[rng() % std::size(onsets)];
      w += vowels[rng() % std::size(vowels)];
      w += codas[rng() % std::size(codas)];
    }
    out.push_back(std::move(w));
  }
  return out;
}

// Draws ranks 0..n-1 with probability proportional to 1 / (rank + 1).
class zipf {
public:
  explicit zipf(size_t n) : cdf_(n) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i)
      cdf_[i] = (sum += 1.0 / static_cast<double>(i + 1));
    for (auto& c : cdf_)
      c /= sum;
  }
  template <class Rng>
  size_t operator()(Rng& rng) const {
    double u = std::uniform_real_distribution<double>{0, 1}(rng);
    auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
    return std::min<size_t>(it - cdf_.begin(), cdf_.size() - 1);
  }

private:
  std::vector<double> cdf_;
};

struct text_maker {
  std::vector<std::string> words;
  zipf ranks;
  text_maker(std::vector<std::string> w)
    : words(std::move(w)), ranks(words.size()) {
  }
  template <class Rng>
  std::string sentence(Rng& rng, size_t min_words, size_t max_words) const {
    std::uniform_int_distribution<size_t> len(min_words, max_words);
    std::string out;
    for (size_t n = len(rng); n > 0; --n) {
      if (!out.empty())
        out += ' ';
      out += words[ranks(rng)];
    }
    out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    out += '.';
    return out;
  }
};

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fills a spindle data directory with turns and memories."};
  std::string data;
  uint64_t turns = 1000000, memories = 100000, threads = 10000,
           bench_threads = 64, seed = 1;
  app.add_option("--data", data, "Data directory (created)")->required();
  app.add_option("--turns", turns, "Turns in all");
  app.add_option("--memories", memories, "Memory entries in all");
  app.add_option("--threads", threads, "Threads the turns go to");
  app.add_option("--bench-threads", bench_threads,
                 "Threads named bench-K (the rest pop-K); memories go to them");
  app.add_option("--seed", seed, "Random seed");
  CLI11_PARSE(app, argc, argv);
  if (threads == 0 || bench_threads == 0 || bench_threads > threads) {
    std::cerr << "spindle_populate: need 0 < --bench-threads <= --threads\n";
    return 2;
  }

  runtime_options opts;
  opts.storage.data_dir = data;
  opts.storage.sync = sync_mode::normal;
  auto started = runtime::start(opts);
  if (!started) {
    std::cerr << "spindle_populate: " << describe(started.error()) << "\n";
    return 1;
  }
  auto& rt = **started;
  std::mt19937_64 rng{seed};
  const text_maker texts{make_vocabulary(30000, rng)};
  auto name = [&](uint64_t i) {
    return (i < bench_threads ? "bench-" : "pop-") + std::to_string(i);
  };

  // Turns: round r appends turn r of every thread, all of a round in
  // flight at once; a round ends before the next starts, so each thread's
  // turns alternate user, assistant in order.
  auto t0 = clk::now();
  uint64_t per_thread = turns / threads;
  std::atomic<uint64_t> failed{0};
  for (uint64_t r = 0; r < per_thread; ++r) {
    std::mutex mx;
    std::condition_variable cv;
    uint64_t pending = threads;
    for (uint64_t i = 0; i < threads; ++i) {
      turn t;
      t.role = r % 2 == 0 ? turn_role::user : turn_role::assistant;
      t.content = r % 2 == 0 ? texts.sentence(rng, 6, 30)
                             : texts.sentence(rng, 12, 60);
      rt.add_turn_async(name(i), std::move(t),
                        [&](caf::expected<uint64_t> res) {
                          if (!res && failed++ == 0)
                            std::cerr << "spindle_populate: add_turn: "
                                      << describe(res.error()) << "\n";
                          std::lock_guard<std::mutex> guard{mx};
                          if (--pending == 0)
                            cv.notify_one();
                        });
    }
    std::unique_lock<std::mutex> lock{mx};
    cv.wait(lock, [&] { return pending == 0; });
    if ((r + 1) % 10 == 0)
      std::cerr << "turns: " << (r + 1) * threads << "\n";
  }
  auto t1 = clk::now();

  // Memories: from 8 threads at once, each its share of the entries.
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 8; ++w)
    writers.emplace_back([&, w] {
      std::mt19937_64 local{seed * 7919 + static_cast<uint64_t>(w)};
      for (uint64_t k; (k = next++) < memories;) {
        auto thread = "bench-" + std::to_string(k % bench_threads);
        auto content = "User: " + texts.sentence(local, 6, 30)
                       + "\nAssistant: " + texts.sentence(local, 12, 60);
        auto id = rt.store_memory(content, {"thread:" + thread});
        if (!id && failed++ == 0)
          std::cerr << "spindle_populate: store_memory: "
                    << describe(id.error()) << "\n";
      }
    });
  for (auto& w : writers)
    w.join();
  auto t2 = clk::now();
  rt.stop();
  auto secs = [](clk::duration d) {
    return std::chrono::duration<double>(d).count();
  };
  std::cout << "{\"turns\": " << per_thread * threads
            << ", \"threads\": " << threads << ", \"memories\": " << memories
            << ", \"turn_seconds\": " << secs(t1 - t0)
            << ", \"memory_seconds\": " << secs(t2 - t1)
            << ", \"failed\": " << failed.load() << "}" << std::endl;
  return failed == 0 ? 0 : 1;
}
