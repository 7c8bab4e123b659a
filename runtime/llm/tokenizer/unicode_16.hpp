#pragma once

// The letters, marks and numbers the reference's split patterns know and
// PCRE2 10.42 does not. The reference (tiktoken through Rust's regex
// crate) classifies by Unicode 16.0; Debian's PCRE2 10.42 by Unicode 14.0,
// to which these code points were unassigned. Each macro is the inside of
// a character class, by General_Category: LU, LL, LM, LO (letters), M
// (marks: Mn, Mc, Me), N (numbers: Nd, Nl, No); no Lt or White_Space
// character was added.
//
// Derived by probing: every code point, in letter, digit, space and
// punctuation contexts, encoded by the reference and by this tokenizer
// (tests/tiktoken/probe.mjs; docs/tokens.md, "Unicode versions"); the code
// points that differed are all here, grouped by their category in Node's
// Unicode tables. The test "tokens: every code point in context ..." pins
// that nothing else differs.

#define SPINDLE_U16_LU \
  "\\x{1C89}\\x{A7CB}-\\x{A7CC}\\x{A7DA}\\x{A7DC}" \
  "\\x{10D50}-\\x{10D65}"
#define SPINDLE_U16_LL \
  "\\x{1C8A}\\x{A7CD}\\x{A7DB}\\x{10D70}-\\x{10D85}" \
  "\\x{1DF25}-\\x{1DF2A}"
#define SPINDLE_U16_LM \
  "\\x{10D4E}\\x{10D6F}\\x{16D40}-\\x{16D42}\\x{16D6B}-\\x{16D6C}" \
  "\\x{1E030}-\\x{1E06D}\\x{1E4EB}"
#define SPINDLE_U16_LO \
  "\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D4D}\\x{10D4F}" \
  "\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}" \
  "\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}" \
  "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}" \
  "\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}" \
  "\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D43}-\\x{16D6A}" \
  "\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1E4D0}-\\x{1E4EA}" \
  "\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}" \
  "\\x{31350}-\\x{323AF}"
#define SPINDLE_U16_M \
  "\\x{897}\\x{CF3}\\x{ECE}\\x{10D69}-\\x{10D6D}" \
  "\\x{10EFC}-\\x{10EFF}\\x{11241}\\x{113B8}-\\x{113C0}\\x{113C2}" \
  "\\x{113C5}\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D0}\\x{113D2}" \
  "\\x{113E1}-\\x{113E2}\\x{11F00}-\\x{11F01}\\x{11F03}" \
  "\\x{11F34}-\\x{11F3A}\\x{11F3E}-\\x{11F42}\\x{11F5A}\\x{13440}" \
  "\\x{13447}-\\x{13455}\\x{1611E}-\\x{1612F}\\x{1E08F}" \
  "\\x{1E4EC}-\\x{1E4EF}\\x{1E5EE}-\\x{1E5EF}"
#define SPINDLE_U16_N \
  "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}" \
  "\\x{11F50}-\\x{11F59}\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}" \
  "\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}" \
  "\\x{1E5F1}-\\x{1E5FA}"
