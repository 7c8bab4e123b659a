#!/usr/bin/env bash
# The seed's task directories claimed the seed's way (seed 003: mv-based,
# PID marker in the file name), as the baseline for `spindle task next`.
# The seed gives the layout, the rule (deepest available leaves first,
# highest sequence within depth; a task with children waits for them) and
# `mv` as the claim, but no claim script; this is the straightforward one:
#
#   1. glob every task directory of every agent (bash builtins, no ls/find);
#   2. a task in to_execute is executable when no child (ID with it as
#      parent) is outside completed/;
#   3. sort the executable ones: depth DESC, own sequence DESC, ID DESC
#      (the last tie-break by string, where spindle compares by value);
#   4. mv to_execute/ID in_progress/ID; the first mv that succeeds is the
#      claim (a lost race moves on); rename ID.md to ID.$$.md.
#
# Usage: seed_task_next.sh ROOT AGENT [COUNT]
#   claims up to COUNT tasks (default 1), one full scan per claim, printing
#   each claimed ID; exits 3 when nothing is executable.
set -u
AI_ROOT="$1"
AGENT="$2"
count="${3:-1}"
tasks="$AI_ROOT/ai_comms/$AGENT/tasks"

# Hybrid base36 ordinal of a 4-character orchestration ID (D2): 0000-9999,
# A000-Z999, AA00-ZZ99, AAA0-ZZZ9, AAAA-ZZZZ.
ordinal() {
  local v="$1" letters digits t i c n=0 base=10000
  letters="${v%%[0-9]*}"
  digits="${v:${#letters}}"
  t=${#letters}
  if [[ $t -eq 0 ]]; then
    echo $((10#$digits))
    return
  fi
  # tier t starts at 10^4 + sum over k = 1..t-1 of 26^k * 10^(4-k)
  for ((i = 1; i < t; i++)); do
    base=$((base + 26 ** i * 10 ** (4 - i)))
  done
  for ((i = 0; i < t; i++)); do
    c="${letters:$i:1}"
    n=$((n * 26 + $(printf '%d' "'$c") - 65))
  done
  [[ -n "$digits" ]] && n=$((n * 10 ** (4 - t) + 10#$digits))
  echo $((base + n))
}

claim_one() {
  local -A blocked=()
  local dir state id parent
  for dir in "$AI_ROOT"/ai_comms/*/tasks/*/*/; do
    dir="${dir%/}"
    id="${dir##*/}"
    state="${dir%/*}"
    state="${state##*/}"
    [[ "$state" == completed ]] && continue
    if [[ "$id" == *.* ]]; then
      parent="${id%.*}"
    elif [[ "$id" == *_t* ]]; then
      parent="${id%_t*}"
    else
      continue
    fi
    blocked["$parent"]=1
  done
  local lines="" depth seq rest dots
  for dir in "$tasks"/to_execute/*/; do
    [[ -d "$dir" ]] || continue
    dir="${dir%/}"
    id="${dir##*/}"
    [[ -n "${blocked[$id]:-}" ]] && continue
    if [[ "$id" == *_t* ]]; then
      rest="${id#*_t}"
      dots="${rest//[^.]/}"
      depth=$((1 + ${#dots}))
      seq="${rest##*.}"
    else
      depth=0
      seq=$(ordinal "$id")
    fi
    lines+="$depth $seq $id"$'\n'
  done
  [[ -z "$lines" ]] && return 3
  local candidate
  while read -r depth seq candidate; do
    [[ -z "$candidate" ]] && continue
    mkdir -p "$tasks/in_progress"
    if mv -T "$tasks/to_execute/$candidate" "$tasks/in_progress/$candidate" \
      2>/dev/null; then
      mv "$tasks/in_progress/$candidate/$candidate.md" \
        "$tasks/in_progress/$candidate/$candidate.$$.md" 2>/dev/null
      echo "$candidate"
      return 0
    fi
  done < <(printf '%s' "$lines" | sort -k1,1nr -k2,2nr -k3,3r)
  return 3
}

for ((n = 0; n < count; n++)); do
  claim_one || exit 3
done
