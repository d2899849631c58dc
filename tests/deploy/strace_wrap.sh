#!/bin/sh
# The harness's wrapper for syscall_filter.sh: runs the daemon under `strace -f`, and passes the
# SIGTERM the harness sends on to the daemon (strace would take it itself), so that the daemon
# drains and exits as the tests expect.
#   strace_wrap.sh TRACE DAEMON ARGS...   (the trace goes to TRACE.<this shell's pid>)
trace=$1.$$
shift
strace -f -qq -o "$trace" "$@" &
tracer=$!
forward() {
  for pid in $(ps -o pid= --ppid "$tracer"); do kill -TERM "$pid"; done
}
trap forward TERM INT
wait "$tracer"
status=$?
# wait returns early when the trap ran: wait again for the daemon's own exit status
while kill -0 "$tracer" 2>/dev/null; do
  wait "$tracer"
  status=$?
done
exit $status
