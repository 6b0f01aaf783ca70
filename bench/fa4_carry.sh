#!/usr/bin/env bash
# Upstream FA4 on the GPU box next to fa4_aot, within the device tool's 64 MiB per call.
# ../shared/bench/prepare_fa4_wheels.sh lays out .fa4A (58 MB) and .fa4B (44 MB); the working
# tree travels with every call too, and with artifacts/ (PTX 43 MB, cubins + manifest 19 MB)
# neither call fits. The PTX and (for call 1) the cubins are not needed there, and committed
# artifacts come back from git, so:
#
#   bash bench/fa4_carry.sh call1     # artifacts/ emptied; then the device call
#                                     #   carry [".fa4A"], command: mkdir -p /root/stash && cp .fa4A/* /root/stash/
#   bash bench/fa4_carry.sh call2     # artifacts/ back without its PTX; then, back to back,
#                                     #   carry [".fa4B"], command: source .fa4B/install_fa4.sh && python3 bench/bench_fwd.py ...
#   bash bench/fa4_carry.sh restore   # artifacts/ as committed again
#
# Refuses to start while artifacts/ has uncommitted changes (a build not yet committed would
# be lost). Prints the size that would travel (tracked and untracked-not-ignored files).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
travel() {
  git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1
}
case "${1:-}" in
  call1)
    if [ -n "$(git status --porcelain -- artifacts)" ]; then
      echo "fa4_carry: artifacts/ has uncommitted changes; commit them first" >&2; exit 1
    fi
    git ls-files -z -- artifacts | xargs -0 rm -f ;;
  call2)
    git checkout -- artifacts
    git ls-files -z -- 'artifacts/*.ptx' | xargs -0 rm -f ;;
  restore)
    git checkout -- artifacts ;;
  *)
    echo "usage: bash bench/fa4_carry.sh call1|call2|restore" >&2; exit 2 ;;
esac
echo "fa4_carry $1: the tree that travels is $(( $(travel) / 1048576 )) MiB (+ the carried folder)"
