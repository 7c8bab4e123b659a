#pragma once

// The rank tables embedded in the library (rank_data.cpp): each is the
// committed file runtime/llm/tokenizer/data/<encoding>.ranks.z, byte for
// byte (format: tests/tiktoken/make_ranks.mjs, docs/tokens.md).

#include <string_view>

namespace spindle::tokens::detail {

/// The packed rank file of `encoding` (o200k_base, cl100k_base); empty for
/// another name.
std::string_view packed_ranks(std::string_view encoding) noexcept;

} // namespace spindle::tokens::detail
