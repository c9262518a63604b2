"""The shell scripts the Docker sandbox runs inside its container (with ``bash -c``).

They are sent with every exec instead of being baked into the image, so an image built
by an older harness still works with a newer one. Each runs as the unprivileged user and
never reads anything the worker did not pass it.

Layout inside the container (the home folder is the session's second volume):

* ``/workspace``: the agent's files (the workspace volume);
* ``STATE/shell/{cwd,env}``: the bash tool's working directory and exported variables,
  carried from one command to the next as in a terminal;
* ``STATE/jobs/<id>/``: one detached job: ``command``, ``supervisor`` (pid),
  ``pid`` (the job's pid and process group), ``stdout``, ``stderr``, ``exit``;
* ``STATE/snapshot``: the digest of the World snapshot the workspace last matched.
"""

from __future__ import annotations

WORKSPACE = "/workspace"
HOME = "/home/agent"
STATE = f"{HOME}/.durable-harness"
JOBS = f"{STATE}/jobs"
SHELL_STATE = f"{STATE}/shell"
MARK = f"{STATE}/snapshot"

# Exit codes the file scripts use to say what went wrong.
NOT_FOUND, OUTSIDE, NOT_A_FILE, BROKEN = 2, 3, 4, 125

_CHECK_PATH = f"""
p=$(realpath -m -- "$1") || exit {BROKEN}
case $p in {WORKSPACE}|{WORKSPACE}/*) ;; *) exit {OUTSIDE} ;; esac
"""

# $1 an absolute path under /workspace, /home/agent or /tmp (a CLI's session record).
# Reads print the file, or exit NOT_FOUND; writes take the content on stdin.
_CHECK_ANY = f"""
p=$(realpath -m -- "$1") || exit {BROKEN}
case $p in {WORKSPACE}/*|{HOME}/*|/tmp/*) ;; *) exit {OUTSIDE} ;; esac
"""
READ_ANY = _CHECK_ANY + f'[ -f "$p" ] || exit {NOT_FOUND}\nexec cat -- "$p"\n'
WRITE_ANY = _CHECK_ANY + 'mkdir -p -- "${p%/*}" && exec cat > "$p"\n'

READ = (
    _CHECK_PATH
    + f"""
[ -e "$p" ] || exit {NOT_FOUND}
[ -f "$p" ] || exit {NOT_A_FILE}
exec cat -- "$p"
"""
)

WRITE = (
    _CHECK_PATH
    + f"""
[ -d "$p" ] && exit {NOT_A_FILE}
mkdir -p -- "${{p%/*}}" && exec cat > "$p"
"""
)

# What a command leaves running outside its process group: a `setsid` or `set -m` child,
# a daemon. __dh_snap notes every process of the container (pid and start time) and the
# leader of every session but the caller's before the command; __dh_reap, after it, kills
# every process that is not one of those and is not a member of a session whose leader
# is one of those (other detached jobs' children) or a `docker exec` (its parent is pid
# 0: the harness's own concurrent commands; nothing in the container can make one), nor
# a `docker exec` still entering the container (its own parent is pid 0). A
# member counts only if it started after its leader (a session id is a pid, and pids are
# reused: a session from before a leader's pid was taken again is not that leader's).
# The caller's own session is not spared. Builtins only (a fork may fail at the pid
# limit); repeated while it finds something, for a child forked while it ran. $$ is the
# caller (never killed).
_REAP = """
__dh_stat() {
  local l
  read -r l < "/proc/$1/stat" 2>/dev/null || return 1
  set -- ${l##*) }
  __st_state=$1 __st_ppid=$2 __st_sid=$4 __st_start=${20}
}
declare -A __dh_old=() __dh_lead=()
__dh_snap() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    __dh_stat "$p" || continue
    __dh_old[$p]=$__st_start
    [ "$p" = "$__st_sid" ] && [ "$p" != "$$" ] && __dh_lead[$p]=$__st_start
  done
}
__dh_spared() {  # $1 a session id, $2 the start time of a member that is not old
  [ "$1" = "$$" ] && return 1
  __dh_stat "$1" || { [ -n "${__dh_lead[$1]}" ]; return; }  # an old leader died since
  [ "$2" -ge "$__st_start" ] || return 1
  [ "$__st_ppid" = 0 ] || [ "${__dh_lead[$1]}" = "$__st_start" ]
}
__dh_reap() {
  local p sid start n=0 hit=1
  while [ "$hit" = 1 ] && [ "$n" -lt 20 ]; do
    hit=0 n=$((n + 1))
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [ "$p" = "$$" ] && continue
      __dh_stat "$p" || continue
      [ "$__st_state" = Z ] && continue  # dead already, its parent not yet told
      # A `docker exec` entering: runc's init is its parent's child outside the container
      # (ppid 0) and not yet a session leader (its session is outside too: sid 0) until
      # just before it runs the command; killed then, the harness's exec fails ("error
      # executing setns process"). Nothing started inside the container has ppid 0.
      [ "$__st_ppid" = 0 ] && continue
      sid=$__st_sid start=$__st_start
      [ "${__dh_old[$p]}" = "$start" ] && continue
      __dh_spared "$sid" "$start" && continue
      kill -KILL "$p" 2>/dev/null && hit=1
    done
  done
}
"""

# Run as `bash -c 'eval "$__DH_OUTER"' dh-bash TIMEOUT TOKEN` with this script in
# __DH_OUTER and INNER in __DH_INNER (environment, not arguments, so that `ps` in the
# sandbox shows short lines); the command text on stdin.
# The command runs under coreutils `timeout` in its own process group; when it ends (or
# times out) everything left in that group is killed, so background jobs and fork bombs
# do not outlive it; then whatever it started outside that group (setsid, daemons) is
# killed too (_REAP). Only builtins run after the command: with the pid limit reached a
# fork would fail. The last stderr line reports how often the pid limit was hit and how
# many processes the OOM killer took during the command (cgroup v1 or v2 counters).
BASH_COMMAND = 'eval "$__DH_OUTER"'
BASH = (
    _REAP
    + f"""
unset __DH_OUTER
__dh_snap
__s={SHELL_STATE}
mkdir -p "$__s" || exit {BROKEN}
__f="$__s/command.$$"
cat > "$__f" || exit {BROKEN}
__count() {{
  local k v n=0
  if [ -r "$2" ]; then while read -r k v; do [ "$k" = "$3" ] && n=$v; done < "$2"; fi
  printf -v "$1" '%s' "$n"
}}
__P=/sys/fs/cgroup/pids/pids.events; [ -r "$__P" ] || __P=/sys/fs/cgroup/pids.events
__M=/sys/fs/cgroup/memory/memory.oom_control; [ -r "$__M" ] || __M=/sys/fs/cgroup/memory.events
__count __p0 "$__P" max; __count __m0 "$__M" oom_kill
# SIGTERM (STOP_COMMANDS: a dead worker's command) ends the command as a timeout would.
__pid= __term=
trap '__term=1; [ -n "$__pid" ] && kill -KILL -- "-$__pid" 2>/dev/null' TERM
timeout -k 2 "$1" bash -c 'eval "$__DH_INNER"' dh-shell "$__f" "$__s" < /dev/null &
__pid=$!
[ -n "$__term" ] && kill -KILL -- "-$__pid" 2>/dev/null
wait "$__pid"; __status=$?
# One group kill reaches every member (a fork racing it is restarted and killed too);
# it is repeated while the group still answers, with builtins only.
__n=0
while kill -KILL -- "-$__pid" 2>/dev/null && [ "$__n" -lt 50 ]; do __n=$((__n + 1)); done
__dh_reap
rm -f -- "$__f" 2>/dev/null
__count __p1 "$__P" max; __count __m1 "$__M" oom_kill
printf '\\n%s %s %s\\n' "$2" "$((__p1 - __p0))" "$((__m1 - __m0))" >&2
exit "$__status"
"""
)

# $1 seconds to wait. Stops every bash-tool command still running (BASH; one whose worker
# died runs on: its `docker exec` does not end with the client) and waits until each has
# ended, so that what it started is reaped before anything else starts: a command reaps,
# when it ends, every process started during its life outside the harness's own execs,
# and a CLI's launch started meanwhile would go with it. Each command's wrapper is found
# by its command file (command.<its pid>) and its command line, and gets SIGTERM: its trap
# kills the command's group, then it reaps as at any end. Prints how many were stopped.
STOP_COMMANDS = (
    _REAP
    + f"""
pids= n=0
for f in {SHELL_STATE}/command.*; do
  p=${{f##*.}}
  case $p in ''|*[!0-9]*) continue ;; esac
  [ "$p" = "$$" ] && continue
  tr '\\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF 'eval "$__DH_OUTER"' || continue
  kill -TERM "$p" 2>/dev/null && pids="$pids $p" n=$((n + 1))
done
i=0
while [ "$i" -lt $(($1 * 10)) ]; do
  left=
  for p in $pids; do __dh_stat "$p" && [ "$__st_state" != Z ] && left=1; done
  [ -z "$left" ] && break
  sleep 0.1
  i=$((i + 1))
done
echo "$n"
"""
)

# $1 the command file, $2 the shell state folder. Restores cwd and exported variables,
# runs the command, saves them again (also after `exit N`, through the EXIT trap).
INNER = f"""
unset __DH_INNER
__s=$2
cd -- "$(cat "$__s/cwd" 2>/dev/null)" 2>/dev/null || cd {WORKSPACE}
if [ -r "$__s/env" ]; then . "$__s/env" 2>/dev/null; fi
__dh_save() {{
  {{ pwd > "$__s/cwd.new" && mv -f "$__s/cwd.new" "$__s/cwd"; }} 2>/dev/null
  {{ export -p > "$__s/env.new" && mv -f "$__s/env.new" "$__s/env"; }} 2>/dev/null
}}
trap __dh_save EXIT
eval "$(cat "$1")"
"""

# The listing time (seconds since the epoch, with nanoseconds), the bash tool's cwd, then
# one record per entry of the workspace (nothing is followed; `.git` is listed like the
# rest), each field NUL-terminated:
#   f <size> <mtime> <ctime> <mode, octal>  then <relative path>   a regular file
#   l                                        then <path> <target>   a symbolic link
#   d                                        then <path>            an empty directory
LIST = f"""
printf '%s\\0' "$(date +%s.%N)"
printf '%s\\0' "$(cat {SHELL_STATE}/cwd 2>/dev/null || echo {WORKSPACE})"
exec find {WORKSPACE} -xdev -mindepth 1 \\( -type f -printf 'f %s %T@ %C@ %m\\0%P\\0' \\) \\
  -o \\( -type l -printf 'l\\0%P\\0%l\\0' \\) -o \\( -type d -empty -printf 'd\\0%P\\0' \\)
"""

# The files named on stdin (NUL-separated, relative) as a tar stream on stdout; a file
# with several names (a hard link) is stored whole under each, as the listing has it.
EXPORT = f"exec tar -C {WORKSPACE} --null --no-recursion --hard-dereference -T - -cf -"

# $1 the shell cwd to set. Empties the workspace, then unpacks the tar stream on stdin
# (files with their modes, links as links, empty directories; GNU tar makes a link only
# after every file is written, so no member is written through one).
IMPORT = f"""
find {WORKSPACE} -mindepth 1 -delete || exit {BROKEN}
tar -C {WORKSPACE} --no-same-owner -xf - || exit {BROKEN}
mkdir -p -- "$1" {SHELL_STATE} && printf '%s\\n' "$1" > {SHELL_STATE}/cwd
rm -f {SHELL_STATE}/env
"""

# $1 the digest, or "" to forget the mark.
SET_MARK = f"""
mkdir -p {STATE} || exit {BROKEN}
if [ -z "$1" ]; then rm -f {MARK}; exit 0; fi
printf '%s' "$1" > {MARK}.new && mv -f {MARK}.new {MARK}
"""
GET_MARK = f"cat {MARK} 2>/dev/null; exit 0"

# $1 job id, $2 workdir, $3 timeout (0: none), $4 the SUPERVISOR script, $5 1 to kill
# everything the job started when it ends (see SUPERVISOR); command on stdin.
# mkdir is the atomic claim: of two workers starting the same job, one starts it and
# the other learns it exists. Prints "started" or "existing".
JOB_START = f"""
mkdir -p {JOBS} || exit {BROKEN}
d={JOBS}/$1
mkdir -- "$d" 2>/dev/null || {{ echo existing; exit 0; }}
cat > "$d/command" || exit {BROKEN}
setsid -f bash -c "$4" "dh-job:$1" "$d" "$2" "$3" "$5" < /dev/null > /dev/null 2>&1
for _ in $(seq 100); do [ -s "$d/pid" ] && break; sleep 0.05; done
echo started
"""

# Runs detached in its own session: the job in a further session of its own (its pid is
# its process group, so kill_job reaches all of it and not the supervisor), then records
# the exit status atomically and kills whatever the job left running in its group; a
# contained job ($4 = 1: a CLI's launch) also everything started during its life outside
# the harness's own execs (_REAP): the daemons its shell tools started, other detached
# jobs started meanwhile included.
SUPERVISOR = (
    _REAP
    + """
d=$1 contain=$4
# First of all: JOB_STATUS calls a job whose supervisor is not written 10 s after its
# start "lost" (and a snapshot of a loaded container's processes has taken that long).
printf '%s\\n' "$$" > "$d/supervisor"
[ "$contain" = 1 ] && __dh_snap
cd -- "$2" 2>/dev/null || cd /workspace
if [ "$3" != 0 ]; then set -- timeout -k 5 "$3" bash "$d/command"; else set -- bash "$d/command"; fi
setsid "$@" < /dev/null > "$d/stdout" 2> "$d/stderr" &
j=$!
printf '%s\\n' "$j" > "$d/pid"
wait "$j"; st=$?
kill -KILL -- "-$j" 2>/dev/null
[ "$contain" = 1 ] && __dh_reap
printf '%s\\n' "$st" > "$d/exit.new" && mv -f "$d/exit.new" "$d/exit"
"""
)

# $1 job id. Prints "<state> <exit code or -> <stdout bytes> <stderr bytes>", state one of
# missing, starting, running, exited, lost (no exit status and no live supervisor: the
# container stopped under it).
JOB_STATUS = f"""
d={JOBS}/$1
[ -d "$d" ] || {{ echo missing - 0 0; exit 0; }}
o=$(stat -c %s "$d/stdout" 2>/dev/null || echo 0)
e=$(stat -c %s "$d/stderr" 2>/dev/null || echo 0)
if [ -r "$d/exit" ]; then echo "exited $(cat "$d/exit") $o $e"; exit 0; fi
s=$(cat "$d/supervisor" 2>/dev/null)
if [ -z "$s" ]; then
  age=$(( $(date +%s) - $(stat -c %Y "$d") ))
  if [ "$age" -lt 10 ]; then echo "starting - $o $e"; else echo "lost - $o $e"; fi
  exit 0
fi
# The pid must still be this job's supervisor (pids restart after a container restart).
if tr '\\0' '\\n' < "/proc/$s/cmdline" 2>/dev/null | grep -qxF "dh-job:$1"; then
  echo "running - $o $e"
else
  echo "lost - $o $e"
fi
"""

# $1 job id, $2 stdout|stderr, $3 byte offset, $4 "follow" to follow until the job ends
# (tail --pid stops after the supervisor, which writes the exit status last, is gone).
JOB_OUTPUT = f"""
d={JOBS}/$1
f="$d/$2"
s=$(cat "$d/supervisor" 2>/dev/null)
if [ "$4" = follow ] && [ ! -r "$d/exit" ] && [ -n "$s" ] &&
  tr '\\0' '\\n' < "/proc/$s/cmdline" 2>/dev/null | grep -qxF "dh-job:$1"; then
  exec tail -c +$(($3 + 1)) -F -s 0.2 --pid="$s" -- "$f" 2>/dev/null
fi
[ -r "$f" ] && exec tail -c +$(($3 + 1)) -- "$f"
exit 0
"""

# $1 job id, $2 signal name.
JOB_KILL = f"""
p=$(cat {JOBS}/$1/pid 2>/dev/null) || exit 0
kill -s "$2" -- "-$p" 2>/dev/null; exit 0
"""

JOB_LIST = f"ls -1 {JOBS} 2>/dev/null; exit 0"


# Everything in the container but its init (pid 1), its main command (the oldest child of
# pid 1: nothing the agent starts can be older) and the caller: before and after a setup
# phase (adapters/cli/setup.py), so no process of the agent's lives beside the setup's
# network, and nothing of the setup's outlives it. Repeated while it finds something.
KILL_ALL = (
    _REAP
    + """
main= best=
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  __dh_stat "$p" || continue
  [ "$__st_ppid" = 1 ] || continue
  if [ -z "$best" ] || [ "$__st_start" -lt "$best" ]; then best=$__st_start main=$p; fi
done
n=0 hit=1
while [ "$hit" = 1 ] && [ "$n" -lt 20 ]; do
  hit=0 n=$((n + 1))
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    case $p in 1|"$$"|"$main") continue ;; esac
    __dh_stat "$p" || continue
    [ "$__st_state" = Z ] && continue
    kill -KILL "$p" 2>/dev/null && hit=1
  done
done
"""
)
