// The rank files, assembled into the library with .incbin: no generated
// source of megabytes to compile, and nothing to find at run time.
// SPINDLE_TOKENIZER_DATA is the absolute path of data/ (CMakeLists.txt,
// which also makes this object depend on the files).

#include "rank_data.hpp"

#ifndef SPINDLE_TOKENIZER_DATA
#error "SPINDLE_TOKENIZER_DATA must name runtime/llm/tokenizer/data"
#endif

#define SPINDLE_EMBED(symbol, file)                                        \
  __asm__(".section .rodata\n"                                             \
          ".balign 16\n"                                                   \
          ".globl " #symbol "_begin\n"                                     \
          ".hidden " #symbol "_begin\n" #symbol "_begin:\n"                \
          ".incbin \"" SPINDLE_TOKENIZER_DATA "/" file "\"\n"              \
          ".globl " #symbol "_end\n"                                       \
          ".hidden " #symbol "_end\n" #symbol "_end:\n"                    \
          ".previous\n")

SPINDLE_EMBED(spindle_ranks_o200k_base, "o200k_base.ranks.z");
SPINDLE_EMBED(spindle_ranks_cl100k_base, "cl100k_base.ranks.z");

#define SPINDLE_EMBEDDED extern __attribute__((visibility("hidden"))) const char
extern "C" {
SPINDLE_EMBEDDED spindle_ranks_o200k_base_begin[];
SPINDLE_EMBEDDED spindle_ranks_o200k_base_end[];
SPINDLE_EMBEDDED spindle_ranks_cl100k_base_begin[];
SPINDLE_EMBEDDED spindle_ranks_cl100k_base_end[];
}

namespace spindle::tokens::detail {

std::string_view packed_ranks(std::string_view encoding) noexcept {
  auto view = [](const char* begin, const char* end) {
    return std::string_view{begin, static_cast<size_t>(end - begin)};
  };
  if (encoding == "o200k_base")
    return view(spindle_ranks_o200k_base_begin, spindle_ranks_o200k_base_end);
  if (encoding == "cl100k_base")
    return view(spindle_ranks_cl100k_base_begin,
                spindle_ranks_cl100k_base_end);
  return {};
}

} // namespace spindle::tokens::detail
