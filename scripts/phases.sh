# Phases with their wall and CPU times, for the README's two commands (sourced, not run).
#   phase NAME COMMAND [ARG...]   runs COMMAND as the next phase, after a header line naming it;
#                                 when it fails, prints the table so far and exits with its status
#   phase_beside NAME LOG PROGRAM [ARG...]
#                                 starts PROGRAM as a phase that runs beside the next ones, at
#                                 nice 10 in a session of its own, its output in the file LOG
#   phase_join                    waits for it; when it failed, prints its log's end and the table
#                                 and exits with its status. Its row gives its own time (from its
#                                 start) and CPU, which overlap the rows of the phases it ran beside
#   phase_table                   prints each phase's time, its CPU time (user + system, every
#                                 process it ran) and the totals
# A phase's command (a function or a script) runs in a subshell with `set -euo pipefail`: its first
# failing command ends the phase, and a `cd` or a variable it sets does not outlive it.

phase_names=()
phase_seconds=()
phase_cpu=()

# User + system CPU seconds of this shell's waited-for children (fields cutime and cstime of
# /proc/PID/stat, in clock ticks).
children_cpu_seconds() {
  local -a stat
  read -r -a stat < /proc/$$/stat
  echo $(((stat[15] + stat[16]) / $(getconf CLK_TCK)))
}
phase_started_at=$SECONDS
phase_cpu_at_start=$(children_cpu_seconds)

phase_table() {
  local failed=${1:-}
  echo
  printf 'xgrad: %-58s %8s %8s\n' "phase" "time" "CPU"
  local i
  for i in "${!phase_names[@]}"; do
    printf 'xgrad: %-58s %5d:%02d %5d:%02d\n' "${phase_names[$i]}" $((phase_seconds[i] / 60)) \
      $((phase_seconds[i] % 60)) $((phase_cpu[i] / 60)) $((phase_cpu[i] % 60))
  done
  if [ -n "$failed" ]; then
    printf 'xgrad: %-58s %8s\n' "$failed" "FAILED"
  fi
  local total=$((SECONDS - phase_started_at)) cpu=$(($(children_cpu_seconds) - phase_cpu_at_start))
  printf 'xgrad: %-58s %5d:%02d %5d:%02d\n' "total" $((total / 60)) $((total % 60)) $((cpu / 60)) $((cpu % 60))
}

beside_name=""
beside_pid=""
beside_log=""
beside_start=0

# A phase started by phase_beside does not outlive the script: its process group is ended on exit.
end_beside() {
  if [ -n "$beside_pid" ]; then
    kill -- "-$beside_pid" 2> /dev/null || true
  fi
}
trap end_beside EXIT

phase_beside() {
  beside_name=$1
  beside_log=$2
  shift 2
  echo
  echo "xgrad: == ${beside_name} (beside the next phases; its output in ${beside_log}) =="
  beside_start=$SECONDS
  # setsid: a process group of its own, so that end_beside reaches the compilers it starts. Its
  # session is an autogroup of its own too, which the kernel weighs about equally with the script's
  # whatever the nice.
  setsid nice -n 10 "$@" > "$beside_log" 2>&1 &
  beside_pid=$!
}

# Nothing else is reaped while it waits, so the children's CPU it adds is the phase's own.
phase_join() {
  echo
  echo "xgrad: == waiting for: ${beside_name} =="
  local start_cpu status=0
  start_cpu=$(children_cpu_seconds)
  wait "$beside_pid" || status=$?
  beside_pid=""
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$beside_log" >&2
    echo "xgrad: phase '${beside_name}' failed (exit ${status}); its output is in ${beside_log}" >&2
    phase_table "$beside_name"
    exit "$status"
  fi
  tail -n 1 "$beside_log"
  phase_names+=("$beside_name")
  phase_seconds+=($((SECONDS - beside_start)))
  phase_cpu+=($(($(children_cpu_seconds) - start_cpu)))
}

phase() {
  local name=$1
  shift
  echo
  echo "xgrad: == ${name} =="
  local start=$SECONDS start_cpu status=0
  start_cpu=$(children_cpu_seconds)
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
  phase_cpu+=($(($(children_cpu_seconds) - start_cpu)))
}
