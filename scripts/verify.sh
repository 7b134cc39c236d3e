#!/usr/bin/env bash
# Model-check the payment protocol: docs/protocol/idempay.pml (the terminal, the SDK and the
# server's key protocol) and docs/protocol/acquirer.pml (the create across the acquirer
# boundary: one 0200, the reversal-advice queue, contract §3.8) -- what they model, their
# bounds and their correspondence to the code: docs/protocol/README.md.
#
# Every property must hold within its bounds (a full state-space search: 0 errors, search
# complete), and every mutant of the model must yield a counterexample trail, replayed by
# spin, for the property its bug breaks. Prints one summary table; exits non-zero on any
# unexpected result.
#
#   scripts/verify.sh                        everything (~5 min of CPU, user+sys; 6-10 min of wall time on 2 cores at load 5-9)
#   VERIFY_ONLY="S1 M2" scripts/verify.sh    a subset, by check id
#   VERIFY_KEEP=1 scripts/verify.sh          keep the work dir (pan output, trails, replays)
#   VERIFY_JOBS=N                            parallel searches (default: cores, at most 4)
#   VERIFY_PAN_CACHE=DIR                     where compiled pans are kept (default
#                                            ~/.cache/idempay-verify; empty: compile every one)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS="$ROOT/docs/protocol"
CORES="$(nproc 2>/dev/null || echo 2)"
JOBS="${VERIFY_JOBS:-$(( CORES < 4 ? CORES : 4 ))}"
ONLY="${VERIFY_ONLY:-}"

# ---------------------------------------------------------------- tools
ensure_spin() {
  command -v spin >/dev/null 2>&1 && return
  echo "verify: spin not found; installing it with apt-get" >&2
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "verify: no apt-get here; install SPIN (https://spinroot.com) and retry" >&2
    exit 2
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -qq spin >/dev/null 2>&1 \
    || { $sudo apt-get update -qq >/dev/null 2>&1 && $sudo apt-get install -y -qq spin >/dev/null; }
  command -v spin >/dev/null 2>&1 || { echo "verify: could not install spin" >&2; exit 2; }
}
ensure_spin
command -v gcc >/dev/null 2>&1 || { echo "verify: gcc is required" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/idempay-verify.XXXXXX")"
# Compiled pans, kept between runs outside the repository (VERIFY_PAN_CACHE= : none); one
# not used for 30 days goes.
PAN_CACHE="${VERIFY_PAN_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/idempay-verify}"
if [ -n "$PAN_CACHE" ]; then
  if mkdir -p "$PAN_CACHE" 2>/dev/null; then
    find "$PAN_CACHE" -name 'pan-*' -mtime +30 -delete 2>/dev/null || true
  else
    PAN_CACHE=""
  fi
fi
cleanup() {
  local pids
  pids="$(jobs -pr)"
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
  if [ "${VERIFY_KEEP:-0}" = "1" ]; then
    echo "verify: work dir kept at $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

# ---------------------------------------------------------------- builds
# The fault budgets are read from the environment when pan starts (PML_*, configure() in the
# model), so one compiled pan serves every bound of a kind of search; compiling pan.c costs
# more than most searches. Mutants are compiled with their bounds as -D values instead, the
# defaults that a `spin -t` replay of their trail (which runs no C code) also uses.
b() {  # b NET CRASH T_CRASH PAUSE ACQ: the bounds as -D defaults
  echo "-DNET_FAULTS=$1 -DCRASHES=$2 -DT_CRASHES=$3 -DPAUSES=$4 -DACQ_FAULTS=$5"
}
ZERO="$(b 0 0 0 0 0)"   # shared builds: no faults unless the environment grants them
# The optimisation level follows the CPU a build's searches take at -O2 (S), since a compile
# costs about 7 s at -O2, 4.7 s at -Og and 1.1 s at -O0 while a search takes about 1.1x as
# long at -Og and 1.8x at -O0: -O2 from ~20 s of search, -Og from ~5 s, -O0 below. Safety
# builds store states uncompressed (-DNOCOMP: 10-40 % less CPU for ~40 % more memory; pan
# refuses it with -a, so not in liveness builds). None of this changes what is searched.
SAFE_CC="-O2 -DSAFETY -DNOCLAIM -DNOCOMP -DMEMLIM=8192"   # assertions + invalid end states
MID_CC="-Og -DSAFETY -DNOCLAIM -DNOCOMP -DMEMLIM=8192"    # ~5-20 s of search
FAST_CC="-O0 -DSAFETY -DNOCLAIM -DNOCOMP -DMEMLIM=8192"   # mutants, small searches
LIVE_CC="-O2 -DNFAIR=3 -DMEMLIM=8192"                     # acceptance cycles, weak fairness
LIVE_MID_CC="-Og -DNFAIR=3 -DMEMLIM=8192"
LIVE_FAST_CC="-O0 -DNFAIR=3 -DMEMLIM=8192"
only() {  # only P: the monitor asserts property P and no other (a mutant's target)
  local p out=""
  for p in A B C E F G H I J K; do
    [ "$p" = "${1^^}" ] || out="$out -DCHK_$p=0"
  done
  echo "$out"
}
MUT="$(b 1 1 0 1 1)"   # the safety mutants' bounds (= S3's)

# build | spin -D | cc flags | model (default idempay.pml)
BUILDS=(
  "safe|-DMONITOR $ZERO|$SAFE_CC"
  "safe-down|-DMONITOR -DACQUIRER_DOWN $ZERO|$FAST_CC"
  "live|-DFAIR $ZERO|$LIVE_CC"
  "live-down|-DFAIR -DACQUIRER_DOWN $ZERO|$LIVE_FAST_CC"
  "m1|-DMONITOR $(only e) -DMUTANT_NO_LEASE_TOKEN $MUT|$FAST_CC"
  "m2|-DMONITOR $(only c) -DMUTANT_404_GIVES_UP $MUT|$FAST_CC"
  "m3|-DMONITOR $(only b) -DMUTANT_CHECK_THEN_INSERT -DNO_EXPIRY $(b 2 0 0 1 1)|$FAST_CC"
  "m7|-DMONITOR $(only b) -DMUTANT_CHECK_THEN_INSERT $MUT|$FAST_CC"
  "m4|-DMONITOR $(only a) -DMUTANT_REDRIVE $MUT|$FAST_CC"
  "m5|-DFAIR -DMUTANT_NO_RECOVER $(b 1 0 1 0 0)|$LIVE_FAST_CC"
  "m6|-DMONITOR $(only f) -DMUTANT_FENCE_WITHOUT_ADVICE $MUT|$FAST_CC"
  "m17|-DMONITOR $(only a) -DMUTANT_RELEASE_IN_DOUBT $MUT|$FAST_CC"
  # the later-attempt rejection (in the shared builds, PML_REJECTS), the
  # retention purge with the server's clock, a second driver on the journal
  "ret|-DMONITOR -DRETENTION $ZERO|$SAFE_CC"
  "ret-beyond|-DMONITOR $(only i) -DRETENTION -DSKEW_BEYOND $ZERO|$FAST_CC"  # small: -O0 pays
  "two|-DMONITOR -DTWO_DRIVERS $ZERO|$FAST_CC"
  "m8|-DMONITOR $(only g) -DMUTANT_REJECT_IS_OUTCOME -DREJECTS=1 $(b 1 0 0 0 0)|$FAST_CC"
  "m9|-DMONITOR $(only h) -DMUTANT_RECOVER_RESENDS $(b 1 0 1 0 0)|$FAST_CC"
  "m10|-DMONITOR $(only i) -DRETENTION -DMUTANT_PURGE_AT_RETENTION $(b 1 0 0 0 0)|$FAST_CC"
  "m11|-DMONITOR $(only i) -DRETENTION -DSKEW_BEYOND -DMUTANT_NO_FUTURE_REFUSAL $(b 1 0 0 0 0)|$FAST_CC"
  "m12|-DMONITOR $(only j) -DTWO_DRIVERS -DMUTANT_PER_INSTANCE_DRIVER $(b 1 0 1 0 0)|$FAST_CC"
  # limits of the fixed protocol, kept as checks so that they stay documented and true
  "x1|-DMONITOR $(only i) -DRETENTION -DSKEW_BEYOND $(b 2 0 0 0 0)|$MID_CC"  # 5 M states
  "x2|-DMONITOR $(only g) -DRETENTION -DSKEW_BEYOND $(b 1 0 0 0 0)|$FAST_CC"
  # store and forward (a sale accepted offline, forwarded as an advice)
  "off|-DMONITOR -DOFFLINE $ZERO|$MID_CC"
  "off-ret|-DMONITOR -DOFFLINE -DRETENTION $ZERO|$MID_CC"
  "live-off|-DFAIR -DOFFLINE $ZERO|$LIVE_MID_CC"
  "m13|-DMONITOR $(only k) -DOFFLINE -DMUTANT_OFFLINE_AFTER_SEND $(b 1 0 0 0 0)|$FAST_CC"
  "m14|-DMONITOR $(only k) -DOFFLINE -DMUTANT_RECOVER_FENCES_STORED $(b 1 0 1 0 0)|$FAST_CC"
  # the acquirer boundary (acquirer.pml): bounds "NET CRASH - PAUSE -" (the T_CRASH and
  # ISSUER fields are not used there), NK keys; aborts and reversals in every build
  "acq|-DMONITOR -DABORTS -DREVERSAL $ZERO|$FAST_CC|acquirer.pml"
  "acq2|-DMONITOR -DABORTS -DREVERSAL -DNK=2 $ZERO|$SAFE_CC|acquirer.pml"
  "acq-live|-DFAIR -DABORTS -DREVERSAL $ZERO|$LIVE_FAST_CC|acquirer.pml"
  "acq2-live|-DFAIR -DABORTS -DNK=2 $ZERO|$LIVE_CC|acquirer.pml"
  "m15|-DMONITOR -DCHK_M=0 -DABORTS -DREVERSAL -DMUTANT_RESEND_0200 $(b 1 1 0 1 0)|$FAST_CC|acquirer.pml"
  "m16|-DMONITOR -DCHK_L=0 -DM_AT_END -DABORTS -DREVERSAL -DMUTANT_SETTLE_THEN_QUEUE $(b 1 1 0 1 0)|$FAST_CC|acquirer.pml"
)

# ---------------------------------------------------------------- the checks
# Bounds (docs/protocol/README.md, "Bounds"): how many faults of each kind the world may
# inject in one run, "NET CRASH T_CRASH PAUSE ACQ [REJECT]" -- network (drop, duplicate,
# reorder, early timeout, connect error), server crash, terminal crash, lease-holder stall,
# acquirer-link fault (a 0200 never sent, lost on its way, its answer lost or late), and
# (optional, default 0) create attempts rejected before processing (408/401/413/proxy
# 4xx). "-": the build's own -D bounds.
SAFE="a b c e f"
SAFE_PAN="-m20000 -w25"
SMALL_PAN="-m20000 -w20"   # mutants whose counterexample comes within ~0.1 M states: a 256 MB
                           # table costs more to map than their search (any -w is exhaustive)
LIVE_PAN="-m20000 -a -f -N d"
# id | property | variant | bounds (label) | expect | build | bounds | pan flags
CHECKS=(
  "S1|$SAFE|as is|all x1 but network|holds|safe|0 1 1 1 1|$SAFE_PAN"
  "S2|$SAFE|as is|all x1 but server crash|holds|safe|1 0 1 1 1|$SAFE_PAN"
  "S3|$SAFE|as is|all x1 but terminal crash|holds|safe|1 1 0 1 1|$SAFE_PAN"
  "S4|$SAFE|as is|all x1 but stall|holds|safe|1 1 1 0 1|$SAFE_PAN"
  "S5|$SAFE|as is|all x1 but acquirer fault|holds|safe|1 1 1 1 0|$SAFE_PAN"
  "S6|$SAFE|as is|net x2, stall, acquirer fault|holds|safe|2 0 0 1 1|$SAFE_PAN"
  "S7|$SAFE|ACQUIRER_DOWN|net, crash, stall|holds|safe-down|1 1 0 1 0|$SAFE_PAN"
  "L1|d|as is|net, terminal crash|holds|live|1 0 1 0 0|$LIVE_PAN"
  "L2|d|as is|net, server crash|holds|live|1 1 0 0 0|$LIVE_PAN"
  "L3|d|as is|net, stall|holds|live|1 0 0 1 0|$LIVE_PAN"
  "L4|d|as is|net, acquirer fault|holds|live|1 0 0 0 1|$LIVE_PAN"
  "L5|d|as is|server crash, terminal crash|holds|live|0 1 1 0 0|$LIVE_PAN"
  "L6|d|as is|crash, stall, acquirer fault|holds|live|0 1 0 1 1|$LIVE_PAN"
  "L7|d|as is|terminal crash, stall, acq. fault|holds|live|0 0 1 1 1|$LIVE_PAN"
  "L8|d|ACQUIRER_DOWN|crash, stall|holds|live-down|0 1 0 1 0|$LIVE_PAN"
  "M1|e|MUTANT_NO_LEASE_TOKEN|= S3|counterexample:e|m1|-|$SMALL_PAN"
  "M2|c|MUTANT_404_GIVES_UP|= S3|counterexample:c|m2|-|-m20000 -w25"
  "M3|b|MUTANT_CHECK_THEN_INSERT|= S6; abort (no expiry)|counterexample:b|m3|-|-m20000 -w25"
  "M4|a|MUTANT_REDRIVE|= S3|counterexample:a|m4|-|$SMALL_PAN"
  "M5|d|MUTANT_NO_RECOVER|= L1|counterexample:d|m5|-|$LIVE_PAN"
  "M6|f|MUTANT_FENCE_WITHOUT_ADVICE|= S3|counterexample:f|m6|-|$SMALL_PAN"
  "M7|b|MUTANT_CHECK_THEN_INSERT|= S3; expiry|counterexample:b|m7|-|-m20000 -w25"
  "M17|a|MUTANT_RELEASE_IN_DOUBT|= S3|counterexample:a|m17|-|$SMALL_PAN"
  "S8|$SAFE g h|REJECTS|net, crash, t-crash, reject|holds|safe|1 1 1 0 0 1|$SAFE_PAN"
  "L9|d|REJECTS|net, terminal crash, reject|holds|live|1 0 1 0 0 1|$LIVE_PAN"
  "R1|$SAFE g h i|RETENTION|net x2|holds|ret|2 0 0 0 0|$SAFE_PAN"
  "R2|$SAFE g h i|RETENTION|net, terminal crash|holds|ret|1 0 1 0 0|$SAFE_PAN"
  "R3|i|RETENTION SKEW_BEYOND|net|holds|ret-beyond|1 0 0 0 0|$SAFE_PAN"
  "T1|$SAFE g h j|TWO_DRIVERS|net, terminal crash, j-stall|holds|two|1 0 1 0 0|$SAFE_PAN"
  "M8|g|MUTANT_REJECT_IS_OUTCOME|net, reject|counterexample:g|m8|-|$SMALL_PAN"
  "M9|h|MUTANT_RECOVER_RESENDS|net, terminal crash|counterexample:h|m9|-|$SMALL_PAN"
  "M10|i|MUTANT_PURGE_AT_RETENTION|= R3 but skew <= tol|counterexample:i|m10|-|-m20000 -w25"
  "M11|i|MUTANT_NO_FUTURE_REFUSAL|= R3|counterexample:i|m11|-|-m20000 -w25"
  "M12|j|MUTANT_PER_INSTANCE_DRIVER|= T1|counterexample:j|m12|-|$SMALL_PAN"
  "X1|i|RETENTION SKEW_BEYOND (fix)|net x2|counterexample:i|x1|-|-m20000 -w25"
  "X2|g|RETENTION SKEW_BEYOND (fix)|net|counterexample:g|x2|-|-m20000 -w25"
  "O1|$SAFE g h k|OFFLINE|net x2, terminal crash|holds|off|2 0 1 0 0|$SAFE_PAN"
  "O2|$SAFE g h k|OFFLINE|net x2, stall|holds|off|2 0 0 1 0|$SAFE_PAN"
  "O3|$SAFE g h k|OFFLINE|net x2, server crash|holds|off|2 1 0 0 0|$SAFE_PAN"
  "O4|$SAFE g h i k|OFFLINE RETENTION|net x2|holds|off-ret|2 0 0 0 0|$SAFE_PAN"
  "O5|$SAFE g h k|OFFLINE|net, crash, terminal crash|holds|off|1 1 1 0 0|$SAFE_PAN"
  "O6|$SAFE g h k|OFFLINE|net, crash, acquirer fault|holds|off|1 1 0 0 1|$SAFE_PAN"
  "L10|d|OFFLINE|net, terminal crash|holds|live-off|1 0 1 0 0|$LIVE_PAN"
  "L11|d|OFFLINE|net, acquirer fault|holds|live-off|1 0 0 0 1|$LIVE_PAN"
  "M13|k|MUTANT_OFFLINE_AFTER_SEND|net|counterexample:k|m13|-|$SMALL_PAN"
  "M14|k|MUTANT_RECOVER_FENCES_STORED|net, terminal crash|counterexample:k|m14|-|$SMALL_PAN"
  # the acquirer boundary (acquirer.pml; NET: a lost message, a duplicated advice or
  # acknowledgement, a 0200 that never left)
  "A1|l m|acquirer, 1 key|net x3, crash x3, stall x2|holds|acq|3 3 0 2 0|$SAFE_PAN"
  "A2|l m|acquirer, 2 keys|net, crash|holds|acq2|1 1 0 0 0|$SAFE_PAN"
  "A3|l m|acquirer, 2 keys|net, stall|holds|acq2|1 0 0 1 0|$SAFE_PAN"
  "A4|n|acquirer, 1 key|net x2, crash x2, stall|holds|acq-live|2 2 0 1 0|-m50000 -a -N n"
  "A5|n|acquirer, 2 keys (no reversal)|net, crash|holds|acq2-live|1 1 0 0 0|-m50000 -a -N n"
  "M15|l|MUTANT_RESEND_0200|net, crash, stall|counterexample:l|m15|-|$SMALL_PAN"
  "M16|m|MUTANT_SETTLE_THEN_QUEUE|net, crash, stall; m at end|counterexample:m|m16|-|$SMALL_PAN"
)

# Which property pan's first error report states (the macros P_A … P_N, as pan prints them).
property_of() {  # property_of VIOLATION MODEL
  if [ "$2" = acquirer.pml ]; then
    case "$1" in
      "") echo none ;;
      *"acceptance cycle"*) echo n ;;
      *"assertion violated"*"a_recv"*) echo l ;;
      *"assertion violated"*"a_auth"*) echo m ;;
      *"invalid end state"*) echo deadlock ;;
      *) echo "model-assert" ;;
    esac
    return
  fi
  case "$1" in
    "") echo none ;;
    *"acceptance cycle"*) echo d ;;
    *"invalid end state"*) echo deadlock ;;
    *"assertion violated"*"stored_aborts"*) echo k ;;
    *"assertion violated"*"reported2"*) echo j ;;
    *"assertion violated"*"reported==9"*"k_state==1"*) echo g ;;
    *"assertion violated"*"unsent_at_boot"*) echo h ;;
    *"assertion violated"*"purged"*) echo i ;;
    *"assertion violated"*"a_sent<=1"*) echo a ;;
    *"assertion violated"*"stale_commits==0"*) echo e ;;
    *"assertion violated"*"a_auth"*"adv"*) echo f ;;
    *"assertion violated"*"reported"*) echo c ;;
    *"assertion violated"*"t_count>0"*"k_state==3"*) echo b ;;
    *) echo "model-assert" ;;
  esac
}

field_of() {  # field_of N "a|b|c": the Nth field (1-based) of a table row
  local IFS='|' parts
  read -r -a parts <<<"$2"
  echo "${parts[$(( $1 - 1 ))]:-}"
}
build_spec() {
  local spec
  for spec in "${BUILDS[@]}"; do
    [ "${spec%%|*}" = "$1" ] && { echo "$spec"; return; }
  done
}
check_spec() {
  local spec
  for spec in "${CHECKS[@]}"; do
    [ "${spec%%|*}" = "$1" ] && { echo "$spec"; return; }
  done
}
selected() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

model_of() {  # model_of BUILD: the model file the build checks
  local m
  m="$(field_of 4 "$(build_spec "$1")")"
  echo "${m:-idempay.pml}"
}

build() {  # build NAME: spin -a and gcc into $WORK/build-NAME; writes its status file
  local name="$1" spec dir model
  spec="$(build_spec "$name")"
  model="$(model_of "$name")"
  dir="$WORK/build-$name"
  mkdir -p "$dir"
  cp "$MODELS/$model" "$dir/$model"
  (
    cd "$dir"
    # shellcheck disable=SC2086
    if ! spin $(field_of 2 "$spec") -a "$model" >spin.out 2>&1; then
      echo spin-error >status; exit 0
    fi
    # The compiled pan is kept by what it is built from (spin's C, the flags, the compiler):
    # the same model and build compile to the same program, so a later run copies it
    # instead of compiling again. Every search still runs.
    local cflags key cached
    cflags="$(field_of 3 "$spec")"
    key="$(cat pan.[bchmpt] | { cat; echo "$cflags"; gcc --version | head -n1; } | sha256sum | cut -c1-32)"
    cached="$PAN_CACHE/pan-$key"
    if [ -n "$PAN_CACHE" ] && [ -x "$cached" ] && cp "$cached" pan 2>/dev/null; then
      touch "$cached"
      echo cached >cache; echo ok >status; exit 0
    fi
    # shellcheck disable=SC2086
    if ! gcc $cflags -w -o pan pan.c >gcc.out 2>&1; then
      echo gcc-error >status; exit 0
    fi
    if [ -n "$PAN_CACHE" ]; then  # whole or not at all: a copy renamed into place
      cp pan "$cached.$$" 2>/dev/null && mv -f "$cached.$$" "$cached" 2>/dev/null || rm -f "$cached.$$"
    fi
    echo compiled >cache; echo ok >status
  )
}

run_check() {  # run_check ID BUILD BOUNDS PAN_FLAGS
  local id="$1" name="$2" bounds="$3" pan_flags="$4"
  local dir="$WORK/$id" res="$WORK/$id/result" bdir="$WORK/build-$name" model
  model="$(model_of "$name")"
  mkdir -p "$dir"
  (
    cd "$dir"
    if [ "$(cat "$bdir/status" 2>/dev/null)" != "ok" ]; then
      echo "status=$(cat "$bdir/status" 2>/dev/null || echo build-missing)" >"$res"; exit 0
    fi
    cp "$bdir/$model" .
    local envs=()
    if [ "$bounds" != "-" ]; then
      local n c t p i r
      read -r n c t p i r <<<"$bounds"
      envs=(PML_NET_FAULTS="$n" PML_CRASHES="$c" PML_T_CRASHES="$t" PML_PAUSES="$p"
            PML_ACQ_FAULTS="$i" PML_REJECTS="${r:-0}")
    fi
    local start end
    start="$(date +%s.%N)"
    # shellcheck disable=SC2086
    env "${envs[@]}" "$bdir/pan" $pan_flags >pan.out 2>&1 || true
    end="$(date +%s.%N)"
    local errors states depth elapsed complete violation replay
    errors="$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.out | tail -n1)"
    states="$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' pan.out | tail -n1)"
    depth="$(sed -n 's/.*depth reached \([0-9]*\),.*/\1/p' pan.out | tail -n1)"
    elapsed="$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')"
    complete=yes
    if grep -q -e "Search not completed" -e "max search depth too small" \
         -e "reached -DMEMLIM bound" -e "out of memory" pan.out; then
      complete=no
    fi
    if ! grep -q "^Full statespace search" pan.out || [ -z "$errors" ]; then
      complete=no                  # bitstate/hash-compact, or pan did not finish
    fi
    # pan's error reports look like "pan:1: assertion violated …" (the header's
    # "invalid end states +" line is not one)
    violation="$(grep -m1 -E '^pan:[0-9]+: ' pan.out || true)"
    # a counterexample must replay: spin follows the trail to the violation
    replay=no
    if [ -f "$model.trail" ]; then
      # shellcheck disable=SC2086
      spin $(field_of 2 "$(build_spec "$name")") -t "$model" >replay.out 2>&1 || true
      if grep -q -e "assertion violated" -e "START OF CYCLE" replay.out; then
        replay=yes
      fi
    fi
    {
      echo "status=ran"
      echo "errors=${errors:-?}"
      echo "states=${states:-?}"
      echo "depth=${depth:-?}"
      echo "elapsed=${elapsed}"
      echo "complete=${complete}"
      echo "trail=$replay"
      echo "violated=$(property_of "$violation" "$model")"
    } >"$res"
  )
}

# Builds first (the shared ones are the slow ones), then the longest searches first, so
# that the parallel slots stay busy to the end.
BUILD_ORDER=(safe live safe-down live-down ret two off off-ret live-off acq2 acq2-live acq
             acq-live ret-beyond m1 m2 m3 m4 m5 m6 m7 m17 m8 m9 m10 m11 m12 m13 m14 m15 m16 x1 x2)
LAUNCH_ORDER=(S5 A5 L7 S8 A3 S2 S4 S6 S3 R1 R2 T1 S1 S7 A2 L6 L2 L3 L9 L10 L11 O4 O2 O5 O3 O1 O6 L8 L4
              L5 L1 R3 A1 A4 M1 M2 M3 M4 M5 M6 M7 M17 M8 M9 M10 M11 M12 M13 M14 M15 M16 X1 X2)
t0="$(date +%s)"
needed=" "
for id in "${LAUNCH_ORDER[@]}"; do
  selected "$id" && needed+="$(field_of 6 "$(check_spec "$id")") "
done
for name in "${BUILD_ORDER[@]}"; do
  [[ "$needed" == *" $name "* ]] || continue
  while [ "$(jobs -pr | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  build "$name" &
done
wait || true
for id in "${LAUNCH_ORDER[@]}"; do
  selected "$id" || continue
  spec="$(check_spec "$id")"
  while [ "$(jobs -pr | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  run_check "$id" "$(field_of 6 "$spec")" "$(field_of 7 "$spec")" "$(field_of 8 "$spec")" &
done
wait || true
t1="$(date +%s)"

# ---------------------------------------------------------------- the summary
field() { sed -n "s/^$1=//p" "$2" 2>/dev/null | head -n1; }

cached="$(cat "$WORK"/build-*/cache 2>/dev/null | grep -c '^cached$' || true)"
builds="$(ls -d "$WORK"/build-* 2>/dev/null | wc -l)"
printf '\nSPIN model check of docs/protocol/idempay.pml and acquirer.pml (%s; %s parallel jobs, %ss; %s of %s pans compiled, %s from %s)\n\n' \
  "$(spin -V 2>/dev/null | head -n1)" "$JOBS" "$(( t1 - t0 ))" "$(( builds - cached ))" "$builds" \
  "$cached" "${PAN_CACHE:-no cache}"
fmt='%-3s %-14s %-25s %-34s %-17s %-17s %10s %6s %7s %-8s %s\n'
# shellcheck disable=SC2059
printf "$fmt" id property variant bounds expected outcome states depth time complete verdict
printf '%s\n' "$(printf '%.0s-' {1..150})"
failures=0
for spec in "${CHECKS[@]}"; do
  IFS='|' read -r id prop variant bounds expect _build _bounds _pan <<<"$spec"
  selected "$id" || continue
  res="$WORK/$id/result"
  status="$(field status "$res")"
  errors="$(field errors "$res")"
  complete="$(field complete "$res")"
  violated="$(field violated "$res")"
  outcome="?"
  verdict="UNEXPECTED"
  if [ "$status" != "ran" ]; then
    outcome="${status:-not run}"
  elif [ "$expect" = "holds" ]; then
    if [ "$errors" = "0" ] && [ "$complete" = "yes" ]; then
      outcome="holds"; verdict="ok"
    elif [ "$errors" = "0" ]; then
      outcome="incomplete"
    else
      outcome="violated:$violated"
    fi
  else
    wanted="${expect#counterexample:}"
    if [ "$errors" != "0" ] && [ "$errors" != "?" ] && [ "$(field trail "$res")" = "yes" ]; then
      outcome="counterexample:$violated"
      if [ "$violated" = "$wanted" ]; then verdict="ok"; fi
    else
      outcome="no counterexample"
    fi
  fi
  [ "$verdict" = "ok" ] || failures=$(( failures + 1 ))
  # shellcheck disable=SC2059
  printf "$fmt" "$id" "$prop" "$variant" "$bounds" "$expect" "$outcome" \
    "$(field states "$res")" "$(field depth "$res")" "$(field elapsed "$res")s" \
    "$( [ "$expect" = "holds" ] && echo "${complete:--}" || echo "-" )" "$verdict"
done
cat <<'LEGEND'

a: at most one 0200 per key leaves idempay          b: never both a transaction and a tombstone
c: what the terminal reports matches the ledger    d: the journal entry ends definitive and the key
e: a stale worker (lease lost) never commits          leaves processing (weak fairness)
f: once the key is settled, the acquirer's approval not undone by a queued reversal advice
   stands iff the key has an approved transaction (the advice's delivery: l, m, n)
g: a payment reported rejected was never processed (a later attempt's 408/401/413)
h: recover() never sells: a sale whose terminal died before sending it is never charged
i: a fenced key is never processed later, even after the purge of its tombstone (RETENTION)
j: every driver of the key (the terminal, a second Client on its journal) reports the ledger
k: store and forward stays exactly once: a sale accepted offline is never aborted by its
   terminal nor fenced as expired, and its forward records what the ledger says (OFFLINE)
l: the acquirer receives at most one 0200 per key (acquirer.pml; §3.8)
m: once a key is settled and its advice acknowledged, the acquirer's approval net of
   reversals stands iff idempay holds the key's approved transaction (§3.8; M16: at the end)
n: every key leaves processing and every advice is acknowledged (acquirer.pml, liveness)
X1, X2: limits of the fix, expected to fail: a terminal clock ahead beyond the tolerance
(docs/protocol/README.md, "Retention and clock skew").
Safety searches (S*, R*, T1, O*, A1-A3, M1-M4, M6-M17, X*) also fail on a deadlock (invalid end state)
and on the model's own assertions. time: the search alone (pan); the total includes compiling.

LEGEND
if [ "$failures" -ne 0 ]; then
  echo "verify: $failures unexpected result(s)" >&2
  if [ "${VERIFY_KEEP:-0}" != "1" ]; then
    echo "verify: rerun with VERIFY_KEEP=1 to keep pan's output and the trails" >&2
  fi
  exit 1
fi
echo "verify: all properties hold within their bounds; every mutant has a counterexample"
