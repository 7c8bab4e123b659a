// The byte-pair encoder (docs/tokens.md, "How counting works"): tiktoken's
// algorithm. The text is split into pieces by the encoding's pattern
// (PCRE2, JIT-compiled); a piece that is itself a token is one lookup,
// any other is merged from its bytes, always the adjacent pair of lowest
// rank first (the leftmost on a tie), until no pair is a token.

#include "spindle/runtime/tokenizer.hpp"

#include <array>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <queue>
#include <stdexcept>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <spdlog/spdlog.h>
#include <zlib.h>

#include "rank_data.hpp"
#include "unicode_16.hpp"
#include "core/logging.hpp"

namespace spindle::tokens {

namespace {

using rank = uint32_t;
constexpr rank no_rank = std::numeric_limits<rank>::max();

// tiktoken's split patterns, with two changes that keep their meaning:
// Rust's `\s` is Unicode's White_Space, which PCRE2's `\s` is not (it
// lacks U+0085), so White_Space is spelled out: U+0009..U+000D, U+0085
// and the separators \p{Z}; and each letter, mark and number class also
// holds the code points Unicode 15 and 16 added (unicode_16.hpp).
#define SPINDLE_WS "\\t-\\r\\x{85}\\p{Z}"
#define SPINDLE_L                                                          \
  "\\p{L}" SPINDLE_U16_LU SPINDLE_U16_LL SPINDLE_U16_LM SPINDLE_U16_LO
#define SPINDLE_N "\\p{N}" SPINDLE_U16_N
#define SPINDLE_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
// o200k_base's upper- and lower-case word classes.
#define SPINDLE_UPPER                                                      \
  "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" SPINDLE_U16_LU SPINDLE_U16_LM      \
    SPINDLE_U16_LO SPINDLE_U16_M "]"
#define SPINDLE_LOWER                                                      \
  "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" SPINDLE_U16_LL SPINDLE_U16_LM              \
    SPINDLE_U16_LO SPINDLE_U16_M "]"

// o200k_base (tiktoken: `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*
// [\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?
// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve
// |'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)
// |\s+`).
constexpr const char* o200k_pattern
  = "[^\\r\\n" SPINDLE_L SPINDLE_N "]?" SPINDLE_UPPER "*" SPINDLE_LOWER
    "+" SPINDLE_CONTRACTIONS "?"
    "|[^\\r\\n" SPINDLE_L SPINDLE_N "]?" SPINDLE_UPPER "+" SPINDLE_LOWER
    "*" SPINDLE_CONTRACTIONS "?"
    "|[" SPINDLE_N "]{1,3}"
    "| ?[^" SPINDLE_WS SPINDLE_L SPINDLE_N "]+[\\r\\n/]*"
    "|[" SPINDLE_WS "]*[\\r\\n]+"
    "|[" SPINDLE_WS "]+(?![^" SPINDLE_WS "])"
    "|[" SPINDLE_WS "]+";

// cl100k_base (tiktoken: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?
// \p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`).
constexpr const char* cl100k_pattern
  = SPINDLE_CONTRACTIONS
    "|[^\\r\\n" SPINDLE_L SPINDLE_N "]?[" SPINDLE_L "]+"
    "|[" SPINDLE_N "]{1,3}"
    "| ?[^" SPINDLE_WS SPINDLE_L SPINDLE_N "]+[\\r\\n]*"
    "|[" SPINDLE_WS "]*[\\r\\n]+"
    "|[" SPINDLE_WS "]+(?![^" SPINDLE_WS "])"
    "|[" SPINDLE_WS "]+";

#undef SPINDLE_WS
#undef SPINDLE_L
#undef SPINDLE_N
#undef SPINDLE_CONTRACTIONS
#undef SPINDLE_UPPER
#undef SPINDLE_LOWER

// How a pattern treats the words its ASCII fast path reads (ascii_piece).
enum class word_rule {
  // o200k_base: upper-case letters then lower-case ones form a word
  // ("HTTPServer"), a contraction ('s, 'LL) ends it.
  cased_with_contraction,
  // cl100k_base: any letters form a word; contractions are pieces of
  // their own, tried first.
  letters,
};

struct spec {
  const char* name;
  const char* pattern;
  word_rule words;
};
constexpr std::array<spec, 2> specs{
  {{"o200k_base", o200k_pattern, word_rule::cased_with_contraction},
   {"cl100k_base", cl100k_pattern, word_rule::letters}}};

inline bool is_upper(unsigned char c) noexcept {
  return c >= 'A' && c <= 'Z';
}
inline bool is_lower(unsigned char c) noexcept {
  return c >= 'a' && c <= 'z';
}
inline bool is_letter(unsigned char c) noexcept {
  return is_upper(c) || is_lower(c);
}
inline bool is_digit(unsigned char c) noexcept {
  return c >= '0' && c <= '9';
}

// The piece the split pattern matches at `i`, found without the regex for
// the common shapes of ASCII text: a word with an optional leading space
// or punctuation character, and digit runs. 0 when the piece has another
// shape or touches a non-ASCII character whose class would decide it (the
// regex decides then). The tests compare both paths with the reference.
size_t ascii_piece(const unsigned char* p, size_t n, size_t i,
                   word_rule words) noexcept {
  auto at = [&](size_t k) -> int { // -1 past the end
    return k < n ? p[k] : -1;
  };
  auto ascii_or_end = [&](size_t k) { return k >= n || p[k] < 0x80; };
  int c = p[i];
  if (is_digit(c)) { // \p{N}{1,3}
    size_t k = i + 1;
    while (k < n && k < i + 3 && is_digit(p[k]))
      ++k;
    return k < i + 3 && !ascii_or_end(k) ? 0 : k - i;
  }
  size_t start = i;
  if (!is_letter(c)) {
    // A leading character: not a newline, letter or digit; cl100k tries a
    // contraction at an apostrophe first.
    if (c >= 0x80 || c == '\r' || c == '\n'
        || (c == '\'' && words == word_rule::letters))
      return 0;
    int next = at(i + 1);
    if (next < 0 || !is_letter(next))
      return 0;
    ++i;
  }
  size_t k = i;
  if (words == word_rule::letters) {
    while (k < n && is_letter(p[k]))
      ++k;
    return ascii_or_end(k) ? k - start : 0;
  }
  while (k < n && is_upper(p[k]))
    ++k;
  while (k < n && is_lower(p[k]))
    ++k;
  if (!ascii_or_end(k))
    return 0;
  if (at(k) == '\'') { // (?i:'s|'t|'re|'ve|'m|'ll|'d)?
    int a = at(k + 1);
    int b = at(k + 2);
    if ((a >= 0x80) || (a >= 0 && b >= 0x80))
      return 0;
    a = a | 0x20;
    b = b < 0 ? b : b | 0x20;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
      k += 2;
    else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e')
             || (a == 'l' && b == 'l'))
      k += 3;
  }
  return k - start;
}

inline uint64_t hash_bytes(const unsigned char* p, size_t n) noexcept {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 29);
}

// Token bytes -> rank: an open-addressed table over one arena of all the
// tokens' bytes, plus direct tables for the one- and two-byte tokens the
// merge loop asks about most.
class rank_table {
public:
  void load(std::string_view packed, std::string_view name) {
    if (packed.size() < 4)
      throw std::runtime_error(std::string{name} + ": no rank data");
    uint32_t size = 0;
    std::memcpy(&size, packed.data(), 4);
    std::string payload(size, '\0');
    uLongf out_len = size;
    auto rc = uncompress(reinterpret_cast<Bytef*>(payload.data()), &out_len,
                         reinterpret_cast<const Bytef*>(packed.data() + 4),
                         static_cast<uLong>(packed.size() - 4));
    if (rc != Z_OK || out_len != size || size < 9
        || payload.compare(0, 5, "SPTK\x01") != 0)
      throw std::runtime_error(std::string{name} + ": corrupt rank data");
    uint32_t n = 0;
    std::memcpy(&n, payload.data() + 5, 4);
    offsets_.reserve(n + 1);
    bytes_.reserve(size);
    size_t at = 9;
    for (uint32_t i = 0; i < n; ++i) {
      if (at >= payload.size())
        throw std::runtime_error(std::string{name} + ": truncated ranks");
      auto len = static_cast<unsigned char>(payload[at++]);
      if (len == 0 || at + len > payload.size())
        throw std::runtime_error(std::string{name} + ": truncated ranks");
      offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
      bytes_.append(payload, at, len);
      at += len;
    }
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
    size_t slots = 1;
    while (slots < 2 * size_t{n})
      slots <<= 1;
    mask_ = slots - 1;
    slots_.assign(slots, no_rank);
    single_.fill(no_rank);
    pair_.assign(65536, no_rank);
    for (rank r = 0; r < n; ++r) {
      auto t = token(r);
      auto* p = reinterpret_cast<const unsigned char*>(t.data());
      if (t.size() == 1)
        single_[p[0]] = r;
      else if (t.size() == 2)
        pair_[p[0] << 8 | p[1]] = r;
      auto i = hash_bytes(p, t.size()) & mask_;
      while (slots_[i] != no_rank)
        i = (i + 1) & mask_;
      slots_[i] = r;
    }
    for (int b = 0; b < 256; ++b)
      if (single_[b] == no_rank)
        throw std::runtime_error(std::string{name} + ": byte without a rank");
  }

  size_t size() const noexcept {
    return offsets_.size() - 1;
  }

  std::string_view token(rank r) const noexcept {
    return {bytes_.data() + offsets_[r], offsets_[r + 1] - offsets_[r]};
  }

  rank byte(unsigned char b) const noexcept {
    return single_[b];
  }

  rank find(const unsigned char* p, size_t n) const noexcept {
    if (n == 1)
      return single_[p[0]];
    if (n == 2)
      return pair_[p[0] << 8 | p[1]];
    auto i = hash_bytes(p, n) & mask_;
    for (;;) {
      auto r = slots_[i];
      if (r == no_rank)
        return no_rank;
      if (offsets_[r + 1] - offsets_[r] == n
          && std::memcmp(bytes_.data() + offsets_[r], p, n) == 0)
        return r;
      i = (i + 1) & mask_;
    }
  }

private:
  std::string bytes_;
  std::vector<uint32_t> offsets_;
  std::vector<rank> slots_;
  size_t mask_ = 0;
  std::array<rank, 256> single_{};
  std::vector<rank> pair_;
};

// Pieces up to this many bytes merge with tiktoken's own loop (a scan for
// the lowest pair per merge, quadratic but fastest for short pieces);
// longer ones with a heap, which makes the same choices in n log n.
constexpr size_t short_piece = 64;

// tiktoken's `_byte_pair_merge`, emitting each final part's rank; parts
// are linked in place instead of removed from a vector.
template <class Sink>
void merge_short(const rank_table& ranks, const unsigned char* p, size_t n,
                 Sink&& emit) {
  struct part {
    uint8_t next;  // index of the next part; n past the last
    rank pair;     // rank of this part joined with the next, or no_rank
    rank self;     // rank of this part's bytes
  };
  std::array<part, short_piece + 1> parts;
  for (size_t i = 0; i < n; ++i)
    parts[i] = {static_cast<uint8_t>(i + 1),
                i + 1 < n ? ranks.find(p + i, 2) : no_rank, ranks.byte(p[i])};
  parts[n] = {static_cast<uint8_t>(n), no_rank, no_rank};
  size_t prev_of_best = n;
  for (;;) {
    rank best = no_rank;
    size_t at = n;
    size_t before = n;
    for (size_t i = 0, prev = n; i < n; prev = i, i = parts[i].next)
      if (parts[i].pair < best) {
        best = parts[i].pair;
        at = i;
        before = prev;
      }
    if (best == no_rank)
      break;
    prev_of_best = before;
    // Join at and its next: at now ends where the next one ended.
    parts[at].self = best;
    parts[at].next = parts[parts[at].next].next;
    auto span = [&](size_t i) {
      auto j = parts[i].next;
      return j < n ? ranks.find(p + i, parts[j].next - i) : no_rank;
    };
    parts[at].pair = span(at);
    if (prev_of_best != n)
      parts[prev_of_best].pair = span(prev_of_best);
  }
  for (size_t i = 0; i < n; i = parts[i].next)
    emit(parts[i].self);
}

// The same merges for a long piece: parts in a linked list, candidate
// pairs in a min-heap by (rank, start), stale candidates skipped.
template <class Sink>
void merge_long(const rank_table& ranks, const unsigned char* p, size_t n,
                Sink&& emit) {
  std::vector<uint32_t> next(n), prev(n);
  std::vector<rank> self(n), pair(n);
  std::vector<bool> alive(n, true);
  using candidate = std::pair<rank, uint32_t>;
  std::priority_queue<candidate, std::vector<candidate>,
                      std::greater<candidate>>
    heap;
  auto end = static_cast<uint32_t>(n);
  for (uint32_t i = 0; i < end; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? end : i - 1;
    self[i] = ranks.byte(p[i]);
    pair[i] = i + 1 < end ? ranks.find(p + i, 2) : no_rank;
    if (pair[i] != no_rank)
      heap.push({pair[i], i});
  }
  // The rank of part i joined with its next part.
  auto joined = [&](uint32_t i) {
    auto j = next[i];
    if (j == end)
      return no_rank;
    auto stop = next[j];
    return ranks.find(p + i, stop - i);
  };
  while (!heap.empty()) {
    auto [r, i] = heap.top();
    heap.pop();
    if (!alive[i] || pair[i] != r)
      continue;
    auto j = next[i];
    self[i] = r;
    alive[j] = false;
    next[i] = next[j];
    if (next[i] != end)
      prev[next[i]] = i;
    pair[i] = joined(i);
    if (pair[i] != no_rank)
      heap.push({pair[i], i});
    if (prev[i] != end) {
      auto k = prev[i];
      pair[k] = joined(k);
      if (pair[k] != no_rank)
        heap.push({pair[k], k});
    }
  }
  for (uint32_t i = 0; i != end; i = next[i])
    emit(self[i]);
}

// UTF-8 as a WHATWG decoder reads it: each maximal invalid subpart becomes
// U+FFFD. Returns the length of the valid sequence at `p`, or 0.
size_t utf8_sequence(const unsigned char* p, size_t left,
                     size_t& invalid) noexcept {
  auto b = p[0];
  if (b < 0x80)
    return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xbf;
  if (b >= 0xc2 && b <= 0xdf) {
    need = 1;
  } else if (b >= 0xe0 && b <= 0xef) {
    need = 2;
    if (b == 0xe0)
      lo = 0xa0;
    else if (b == 0xed)
      hi = 0x9f;
  } else if (b >= 0xf0 && b <= 0xf4) {
    need = 3;
    if (b == 0xf0)
      lo = 0x90;
    else if (b == 0xf4)
      hi = 0x8f;
  } else {
    invalid = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= left || p[k] < lo || p[k] > hi) {
      invalid = k;
      return 0;
    }
    lo = 0x80;
    hi = 0xbf;
  }
  return need + 1;
}

// `text` itself when it is valid UTF-8, else a repaired copy in `scratch`.
std::string_view valid_utf8(std::string_view text, std::string& scratch) {
  auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  size_t i = 0;
  // ASCII runs first, eight bytes at a time.
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t v;
      std::memcpy(&v, p + i, 8);
      if ((v & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    size_t invalid = 0;
    auto len = utf8_sequence(p + i, n - i, invalid);
    if (len == 0)
      break;
    i += len;
  }
  if (i == n)
    return text;
  scratch.assign(text.data(), i);
  while (i < n) {
    size_t invalid = 0;
    auto len = utf8_sequence(p + i, n - i, invalid);
    if (len == 0) {
      scratch += "\xef\xbf\xbd";
      i += invalid;
    } else {
      scratch.append(text.data() + i, len);
      i += len;
    }
  }
  return scratch;
}

// The split pattern, compiled once; each thread matches with its own
// match data and JIT stack.
class splitter {
public:
  splitter(const char* pattern, word_rule words) : words_(words) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern),
                          PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                          &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error("tokenizer pattern: "
                               + std::string{reinterpret_cast<char*>(msg)});
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~splitter() {
    pcre2_code_free(code_);
  }
  splitter(const splitter&) = delete;
  splitter& operator=(const splitter&) = delete;

  // Calls `piece(begin, size)` for each match of valid UTF-8 `text`.
  template <class F>
  void split(std::string_view text, F&& piece) const {
    auto& t = per_thread();
    auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      if (auto n = ascii_piece(subject, text.size(), pos, words_)) {
        piece(text.data() + pos, n);
        pos += n;
        continue;
      }
      int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, 0,
                                      t.data, t.context)
                    : pcre2_match(code_, subject, text.size(), pos,
                                  PCRE2_NO_UTF_CHECK, t.data, t.context);
      if (rc == PCRE2_ERROR_NOMATCH)
        break;
      if (rc < 0)
        throw std::runtime_error("tokenizer: pattern match failed ("
                                 + std::to_string(rc) + ")");
      auto* ov = pcre2_get_ovector_pointer(t.data);
      if (ov[1] <= ov[0]) { // no pattern here matches empty; be safe
        pos = ov[0] + 1;
        while (pos < text.size() && (subject[pos] & 0xc0) == 0x80)
          ++pos;
        continue;
      }
      piece(text.data() + ov[0], ov[1] - ov[0]);
      pos = ov[1];
    }
  }

private:
  struct thread_state {
    thread_state() {
      context = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(context, nullptr, stack);
      // Room for the whole pattern's groups (it has none that capture).
      data = pcre2_match_data_create(4, nullptr);
    }
    ~thread_state() {
      pcre2_match_data_free(data);
      pcre2_jit_stack_free(stack);
      pcre2_match_context_free(context);
    }
    pcre2_match_context* context;
    pcre2_jit_stack* stack;
    pcre2_match_data* data;
  };

  static thread_state& per_thread() {
    thread_local thread_state state;
    return state;
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
  word_rule words_;
};

} // namespace

struct encoding::impl {
  std::string name;
  rank_table ranks;
  std::unique_ptr<splitter> split;
  double load_seconds = 0;

  template <class Sink>
  void run(std::string_view text, Sink&& emit) const {
    std::string scratch;
    auto valid = valid_utf8(text, scratch);
    split->split(valid, [&](const char* begin, size_t size) {
      auto* p = reinterpret_cast<const unsigned char*>(begin);
      auto whole = ranks.find(p, size);
      if (whole != no_rank)
        emit(whole);
      else if (size <= short_piece)
        merge_short(ranks, p, size, emit);
      else
        merge_long(ranks, p, size, emit);
    });
  }
};

encoding::encoding(std::unique_ptr<impl> self) : impl_(std::move(self)) {
}

encoding::~encoding() = default;

const encoding* encoding::find(std::string_view name) {
  static std::array<std::once_flag, specs.size()> once;
  static std::array<std::unique_ptr<encoding>, specs.size()> loaded;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (name != specs[i].name)
      continue;
    std::call_once(once[i], [i] {
      auto start = std::chrono::steady_clock::now();
      auto self = std::make_unique<impl>();
      self->name = specs[i].name;
      self->ranks.load(detail::packed_ranks(self->name), self->name);
      self->split = std::make_unique<splitter>(specs[i].pattern,
                                                specs[i].words);
      self->load_seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count();
      spdlog::debug(log_fields(
        "tokenizer_loaded",
        {{"encoding", self->name},
         {"tokens", self->ranks.size()},
         {"load_ms", static_cast<int64_t>(self->load_seconds * 1000 + 0.5)}}));
      loaded[i] = std::make_unique<encoding>(std::move(self));
    });
    return loaded[i].get();
  }
  return nullptr;
}

std::string_view encoding::name() const noexcept {
  return impl_->name;
}

std::vector<uint32_t> encoding::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 4 + 4);
  encode(text, out);
  return out;
}

void encoding::encode(std::string_view text,
                      std::vector<uint32_t>& out) const {
  impl_->run(text, [&out](rank r) { out.push_back(r); });
}

size_t encoding::count(std::string_view text) const {
  size_t n = 0;
  impl_->run(text, [&n](rank) { ++n; });
  return n;
}

std::string encoding::decode(const std::vector<uint32_t>& tokens) const {
  std::string out;
  for (auto t : tokens) {
    if (t >= impl_->ranks.size())
      throw std::out_of_range("token " + std::to_string(t)
                              + " is not in " + impl_->name);
    out += impl_->ranks.token(t);
  }
  return out;
}

size_t encoding::vocabulary_size() const noexcept {
  return impl_->ranks.size();
}

double encoding::load_seconds() const noexcept {
  return impl_->load_seconds;
}

const std::vector<std::string>& encoding_names() {
  static const std::vector<std::string> names{specs[0].name, specs[1].name};
  return names;
}

} // namespace spindle::tokens
