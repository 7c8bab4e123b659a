# Sourced by the Node.js tests' run.sh: checks that Debian's node and npm
# are there, and installs the pinned packages (package.json and
# package-lock.json beside the test) into a scratch directory of the build
# tree once, again only when the lockfile changed.
# usage: npm_scratch SOURCE_DIR SCRATCH_DIR
npm_scratch() {
  local here=$1 scratch=$2 tool
  for tool in node npm; do
    if ! command -v "$tool" >/dev/null; then
      echo "run.sh: $tool is missing: run .ci/install-deps (Debian's nodejs and npm)" >&2
      exit 1
    fi
  done
  mkdir -p "$scratch"
  cp "$here/package.json" "$here/package-lock.json" "$scratch/"
  if ! cmp -s "$here/package-lock.json" "$scratch/node_modules/.spindle-lock" 2>/dev/null; then
    (cd "$scratch" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$here/package-lock.json" "$scratch/node_modules/.spindle-lock"
  fi
}
