# FindPCRE2: locates PCRE2's 8-bit library as Debian's libpcre2-dev ships it
# (the tokenizer's split patterns: Unicode classes, lookahead, JIT).
#
# Defines the imported target PCRE2::8 and the variables PCRE2_FOUND,
# PCRE2_VERSION and PCRE2_INCLUDE_DIR.

find_path(PCRE2_INCLUDE_DIR NAMES pcre2.h)
find_library(PCRE2_8_LIBRARY NAMES pcre2-8)

if(PCRE2_INCLUDE_DIR AND EXISTS "${PCRE2_INCLUDE_DIR}/pcre2.h")
  file(STRINGS "${PCRE2_INCLUDE_DIR}/pcre2.h" _pcre2_major
       REGEX "^#define PCRE2_MAJOR +[0-9]+")
  file(STRINGS "${PCRE2_INCLUDE_DIR}/pcre2.h" _pcre2_minor
       REGEX "^#define PCRE2_MINOR +[0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _pcre2_major "${_pcre2_major}")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _pcre2_minor "${_pcre2_minor}")
  set(PCRE2_VERSION "${_pcre2_major}.${_pcre2_minor}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(PCRE2
  REQUIRED_VARS PCRE2_8_LIBRARY PCRE2_INCLUDE_DIR
  VERSION_VAR PCRE2_VERSION)

if(PCRE2_FOUND AND NOT TARGET PCRE2::8)
  add_library(PCRE2::8 UNKNOWN IMPORTED)
  set_target_properties(PCRE2::8 PROPERTIES
    IMPORTED_LOCATION "${PCRE2_8_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${PCRE2_INCLUDE_DIR}")
endif()
