# Phases with their wall times, for the README's two commands (sourced, not run).
#   phase NAME COMMAND [ARG...]   runs COMMAND as the next phase, after a header line naming it;
#                                 when it fails, prints the table so far and exits with its status
#   phase_table                   prints each phase's time and the total
# A phase's command (a function or a script) runs in a subshell with `set -euo pipefail`: its first
# failing command ends the phase, and a `cd` or a variable it sets does not outlive it.

phase_names=()
phase_seconds=()
phase_started_at=$SECONDS

phase_table() {
  local failed=${1:-}
  echo
  printf 'xgrad: %-58s %8s\n' "phase" "time"
  local i
  for i in "${!phase_names[@]}"; do
    printf 'xgrad: %-58s %5d:%02d\n' "${phase_names[$i]}" $((phase_seconds[i] / 60)) $((phase_seconds[i] % 60))
  done
  if [ -n "$failed" ]; then
    printf 'xgrad: %-58s %8s\n' "$failed" "FAILED"
  fi
  local total=$((SECONDS - phase_started_at))
  printf 'xgrad: %-58s %5d:%02d\n' "total" $((total / 60)) $((total % 60))
}

phase() {
  local name=$1
  shift
  echo
  echo "xgrad: == ${name} =="
  local start=$SECONDS status=0
  set +e
  (
    set -euo pipefail
    "$@"
  )
  status=$?
  set -e
  if [ "$status" -ne 0 ]; then
    echo "xgrad: phase '${name}' failed (exit ${status})" >&2
    phase_table "$name"
    exit "$status"
  fi
  phase_names+=("$name")
  phase_seconds+=($((SECONDS - start)))
}
