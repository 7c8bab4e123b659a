#!/usr/bin/env bash
# The seed's rename-as-lock claim protocol (seed 003, claim_next_id), as a
# baseline and as a neighbour for spindle's own claims. Faithful to the seed
# except for its racy re-initialisation ("[[ ! -f file ]] && echo 0000 >
# file"), which D3 measured losing IDs: the counter must already exist.
#
# Usage: seed_claim.sh ROOT PREFIX COUNT   prints COUNT IDs, one per line.
set -u
AI_ROOT="$1"
prefix="${2:-global}"
count="${3:-1}"

repeat() { # repeat CHAR N
  local out="" i
  for ((i = 0; i < $2; i++)); do out+="$1"; done
  printf '%s' "$out"
}

increment_hybrid_base36() {
  local v="$1" letters digits n i
  letters="${v%%[0-9]*}"
  digits="${v:${#letters}}"
  local t=${#letters}
  if [[ -n "$digits" && $((10#$digits)) -lt $((10 ** (4 - t) - 1)) ]]; then
    printf '%s%0*d\n' "$letters" $((4 - t)) $((10#$digits + 1))
    return
  fi
  # digits roll over: bump the letters, or move to the next tier
  if [[ $t -eq 0 ]]; then echo "A000"; return; fi
  local alphabet=ABCDEFGHIJKLMNOPQRSTUVWXYZ out="" carry=1 c idx
  for ((i = t - 1; i >= 0; i--)); do
    c="${letters:$i:1}"
    idx=$(( $(expr index "$alphabet" "$c") - 1 + carry ))
    if [[ $idx -ge 26 ]]; then idx=0; carry=1; else carry=0; fi
    out="${alphabet:$idx:1}$out"
  done
  if [[ $carry -eq 1 ]]; then
    if [[ $t -eq 4 ]]; then echo "exhausted" >&2; return 1; fi
    printf '%s%s\n' "$(repeat A $((t + 1)))" "$(repeat 0 $((3 - t)))"
    return
  fi
  printf '%s%s\n' "$out" "$(repeat 0 $((4 - t)))"
}

claim_next_id() {
  local prefix="${1:-global}"
  local counter_dir="$AI_ROOT/ai_comms/counters"
  local counter_file="$counter_dir/${prefix}.NextId"
  local claim_file="${counter_file}.claimed.$$"

  # Atomic claim: mv succeeds for exactly one process
  while ! mv "$counter_file" "$claim_file" 2>/dev/null; do
    sleep 0.05  # Brief wait, retry
  done

  # We own it - read, increment, release
  local current=$(cat "$claim_file")
  [[ "$current" == "0000" ]] && current="0001"
  local next=$(increment_hybrid_base36 "$current")
  echo "$next" > "$counter_file"    # Release with new value
  rm -f "$claim_file"               # Cleanup claim marker
  echo "$current"
}

for ((n = 0; n < count; n++)); do
  claim_next_id "$prefix"
done
