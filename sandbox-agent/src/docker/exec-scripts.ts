// The shell scripts every docker exec runs through: the wrapper that bounds a command and
// cleans up after it, and the host's kill for a command past its timeout or aborted.

// Kills every process of session $p except $me, with shell builtins only (no fork), so it
// works when a fork bomb holds every pid. A /proc/<pid>/stat line is "pid (comm) state ppid
// pgrp session ..."; comm may hold spaces and parentheses, hence the strip to the last ") ".
// Pids rise until they wrap, so a process of the session has a pid above the session's
// leader: the first sweep reads only those (each read of a stat file costs a system call per
// byte in ash and dash, and busybox's timeout leaves a watcher behind for up to a second per
// exec), unless the namespace's last pid (/proc/loadavg's last field) shows the pids wrapped since. A process that dodges it
// is no worse than one that left the session with setsid: both die when the workspace is
// released. A command that left nothing behind costs one sweep. One that did may be a fork bomb, which
// refills every pid a kill frees with processes that live only long enough to fork, so a sweep
// sees few of them: then everything this user runs in the workspace is stopped at once (kill
// -1, one system call; a stopped process cannot fork), sweeps stop what they find until three in
// a row find nothing of the session alive (at most 2,000), and the session is killed and the
// rest continued.
const SESSION_PIDS = [
  "  for d in /proc/[0-9]*; do",
  '    [ "${d#/proc/}" -gt "$lo" ] && [ "${d#/proc/}" != "$me" ] || continue',
  '    read -r l 2>/dev/null <"$d/stat" || { u=$((u+1)); continue; }',
  "    set -- ${l##*) }",
  '    [ "$4" = "$p" ] || continue',
];
const KILL_SESSION = [
  "s=0; u=0; x=",
  "read -r _ _ _ _ x 2>/dev/null </proc/loadavg",
  'if [ "${x:-0}" -ge "$p" ] 2>/dev/null; then lo=$((p-1)); else lo=0; fi',
  ...SESSION_PIDS,
  '    s=$((s+1)); kill -KILL "${d#/proc/}" 2>/dev/null',
  "  done",
  'if [ $((s+u)) -gt 0 ]; then',
  "  kill -STOP -1 2>/dev/null",
  "  c=0; i=0; lo=0",
  '  while [ "$c" -lt 3 ] && [ "$i" -lt 2000 ]; do',
  "    n=0; u=0; i=$((i+1))",
  ...SESSION_PIDS.map((line) => `  ${line}`),
  '      case "$1" in Z|T|t) ;; *) n=$((n+1)); kill -STOP "${d#/proc/}" 2>/dev/null ;; esac',
  "    done",
  '    if [ $((n+u)) -eq 0 ]; then c=$((c+1)); else c=0; kill -STOP -1 2>/dev/null; fi',
  "  done",
  ...SESSION_PIDS.map((line) => `  ${line}`),
  '      kill -KILL "${d#/proc/}" 2>/dev/null',
  "    done",
  "  kill -CONT -1 2>/dev/null",
  "fi",
].join("\n");

// The exec's command: $0 = a marker unique to the exec, $1 = seconds for the in-container
// timeout, then argv. The shell is the exec's session leader (runc makes every exec one); it
// runs the command under the image's `timeout -s KILL` (whose watcher is forked up front, so
// it fires even when a fork bomb holds every pid) and, when the command ends, by itself or by
// that timeout, kills what the command left behind in its session.
export const WRAPPER = [
  "s=$1; shift",
  'if command -v timeout >/dev/null 2>&1; then timeout -s KILL "$s" "$@"; else "$@"; fi',
  "r=$?",
  "p=$$; me=$$",
  KILL_SESSION,
  "exit $r",
].join("\n");

// The host's kill for a command past its timeout or aborted: $0 = the exec's marker. Finds the
// wrapper by the marker in its command line (read drops the NULs), then kills its process
// group and its whole session (GNU timeout moves the command into a group of its own).
export const KILLER = [
  "m=$0; me=$$; p=",
  "for d in /proc/[0-9]*; do",
  '  [ "${d#/proc/}" = "$me" ] && continue',
  // cmdline holds the wrapper script's newlines: join every line.
  '  l=; while IFS= read -r x || [ -n "$x" ]; do l="$l$x"; x=; done 2>/dev/null <"$d/cmdline"',
  '  case "$l" in *"$m"*) p=${d#/proc/}; break ;; esac',
  "done",
  '[ -n "$p" ] || exit 3',
  'kill -KILL -"$p" 2>/dev/null',
  KILL_SESSION,
  "exit 0",
].join("\n");
